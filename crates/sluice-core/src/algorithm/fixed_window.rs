//! The fixed window counter: at most N per window, windows back to back.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{charge_within, clamp_time, ensure_cost, Algorithm, SavedState};
use crate::decision::Decision;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// Fixed window: counts cost per window of W = capacity × interval and resets at its end.
///
/// Guarantee: at most N = capacity per window. Two windows meet at a boundary, so a window of
/// length W that straddles it can see up to 2N (N at the end of one, N at the start of the next).
/// Windows are aligned to the caller's time origin until a restore, which keeps the old phase.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, FixedWindow, Quota};
///
/// let fw = FixedWindow::new(Quota::parse(2, "2/s").unwrap()); // 2 per 1 s window
/// let mut s = fw.initial_state();
/// assert!(fw.check(&mut s, 100, 1).unwrap().allowed);
/// assert!(fw.check(&mut s, 200, 1).unwrap().allowed);
/// let d = fw.check(&mut s, 300, 1).unwrap();
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after_ns, 1_000_000_000 - 300);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    quota: Quota,
    window: u64,
}

/// A fixed window's memory of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FixedWindowState {
    /// When the current window ends (0: no window yet).
    pub window_end_ns: u64,
    /// Cost admitted in the current window.
    pub count: u64,
}

impl FixedWindow {
    /// A fixed window for `quota`.
    pub const fn new(quota: Quota) -> FixedWindow {
        FixedWindow {
            quota,
            window: quota.window_ns(),
        }
    }

    /// Moves the state to the window holding `now`; a backward clock stays in the current one.
    #[inline]
    fn roll(&self, state: &mut FixedWindowState, now: u64) {
        if now >= state.window_end_ns {
            let skipped = (now - state.window_end_ns) / self.window;
            state.window_end_ns = state
                .window_end_ns
                .saturating_add((skipped + 1).saturating_mul(self.window));
            state.count = 0;
        }
    }
}

impl Algorithm for FixedWindow {
    type State = FixedWindowState;

    fn kind(&self) -> Kind {
        Kind::FixedWindow
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn initial_state(&self) -> FixedWindowState {
        FixedWindowState::default()
    }

    fn exhausted_state(&self, now: u64) -> FixedWindowState {
        FixedWindowState {
            window_end_ns: clamp_time(now).saturating_add(self.window),
            count: self.quota.capacity(),
        }
    }

    fn check(
        &self,
        state: &mut FixedWindowState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        ensure_cost(&self.quota, cost)?;
        let now = clamp_time(now);
        self.roll(state, now);
        let limit = self.quota.capacity();
        let left = state.window_end_ns.saturating_sub(now);
        let used = state.count.min(limit);
        if used + cost <= limit {
            state.count = used + cost;
            Ok(Decision {
                allowed: true,
                limit,
                remaining: limit - state.count,
                retry_after_ns: 0,
                reset_after_ns: if state.count == 0 { 0 } else { left },
            })
        } else {
            Ok(Decision {
                allowed: false,
                limit,
                remaining: limit - used,
                retry_after_ns: left,
                reset_after_ns: left,
            })
        }
    }

    fn refund(&self, state: &mut FixedWindowState, admitted_at: u64, now: u64, cost: u64) {
        let (admitted_at, now) = (clamp_time(admitted_at), clamp_time(now));
        self.roll(state, now);
        // Only a consumption of the current window is still counted anywhere.
        if admitted_at.saturating_add(self.window) >= state.window_end_ns
            && admitted_at < state.window_end_ns
        {
            state.count = state.count.saturating_sub(cost);
        }
    }

    fn charge(&self, state: &mut FixedWindowState, now: u64, cost: u64, _max_debt: u64) -> u64 {
        charge_within(self, state, now, cost)
    }

    fn idle_at(&self, state: &FixedWindowState) -> u64 {
        if state.count == 0 {
            0
        } else {
            state.window_end_ns
        }
    }

    fn save(&self, state: &FixedWindowState, now: u64) -> SavedState {
        let now = clamp_time(now);
        let mut state = *state;
        self.roll(&mut state, now);
        SavedState::Window {
            ends_in_ns: (state.window_end_ns - now.min(state.window_end_ns)).min(self.window),
            count: state.count,
        }
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<FixedWindowState, SnapshotError> {
        let SavedState::Window { ends_in_ns, count } = saved else {
            return Err(SnapshotError::AlgorithmMismatch {
                found: saved.form(),
                expected: "fixed_window",
            });
        };
        if *count > crate::quota::MAX_SPAN_NS {
            return Err(SnapshotError::Corrupt {
                field: "count",
                value: *count,
            });
        }
        if *ends_in_ns > crate::quota::MAX_SPAN_NS {
            return Err(SnapshotError::Corrupt {
                field: "ends_in_ns",
                value: *ends_in_ns,
            });
        }
        let now = clamp_time(now);
        let ends_in = (*ends_in_ns).min(self.window);
        if elapsed_ns < ends_in {
            Ok(FixedWindowState {
                window_end_ns: now.saturating_add(ends_in - elapsed_ns),
                count: (*count).min(self.quota.capacity()),
            })
        } else {
            // The saved window is over; keep the phase of the windows after it.
            let into_next = (elapsed_ns - ends_in) % self.window;
            Ok(FixedWindowState {
                window_end_ns: now.saturating_add(self.window - into_next),
                count: 0,
            })
        }
    }
}
