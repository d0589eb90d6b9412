//! The sliding window counter: two fixed windows blended by time, O(1) memory, approximate.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{charge_within, clamp_time, ensure_cost, Algorithm, SavedState};
use crate::decision::Decision;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// Sliding window counter (the Cloudflare/nginx-plus approximation).
///
/// It keeps the counts of the current and the previous fixed window and estimates the count of
/// the sliding window `(now − W, now]` as `previous × (time left in current window) / W +
/// current`, admitting a request while the estimate plus its cost stays within N.
///
/// # Worst-case bound
///
/// The estimate assumes the previous window's admissions were spread evenly. When they were all
/// at its very end, a sliding window that ends at time x into the current window holds them all,
/// while the estimate counted only `previous × (W − x)/W` of them. The current window can then
/// admit up to `N − previous × (W − x)/W` by x, so any window of length W holds at most
/// `N + previous × x/W < 2N`. Every *aligned* window holds at most N, as with the fixed window.
/// With evenly spread traffic the estimate is close, which is why it is popular.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, Quota, SlidingWindow};
///
/// let sw = SlidingWindow::new(Quota::parse(4, "4/s").unwrap()); // 4 per second
/// let mut s = sw.initial_state();
/// for _ in 0..4 {
///     assert!(sw.check(&mut s, 0, 1).unwrap().allowed);
/// }
/// // Half-way through the next window, half of the previous 4 still count.
/// assert_eq!(sw.check(&mut s, 1_500_000_000, 0).unwrap().remaining, 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    quota: Quota,
    window: u64,
}

/// A sliding window counter's memory of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SlidingWindowState {
    /// When the current window ends (0: no window yet).
    pub window_end_ns: u64,
    /// Cost admitted in the previous window.
    pub previous: u64,
    /// Cost admitted in the current window.
    pub current: u64,
}

impl SlidingWindow {
    /// A sliding window counter for `quota`.
    pub const fn new(quota: Quota) -> SlidingWindow {
        SlidingWindow {
            quota,
            window: quota.window_ns(),
        }
    }

    #[inline]
    fn roll(&self, state: &mut SlidingWindowState, now: u64) {
        if now >= state.window_end_ns {
            let skipped = (now - state.window_end_ns) / self.window;
            state.previous = if skipped == 0 { state.current } else { 0 };
            state.current = 0;
            state.window_end_ns = state
                .window_end_ns
                .saturating_add((skipped + 1).saturating_mul(self.window));
        }
    }

    /// `estimate × W` for the state (already rolled) at the moment `left` ns before its end.
    #[inline]
    fn weighted(&self, state: &SlidingWindowState, left: u64, extra: u64) -> u128 {
        u128::from(state.previous) * u128::from(left)
            + (u128::from(state.current) + u128::from(extra)) * u128::from(self.window)
    }

    fn remaining(&self, state: &SlidingWindowState, left: u64) -> u64 {
        let full = u128::from(self.quota.capacity()) * u128::from(self.window);
        let used = self.weighted(state, left, 0);
        // Whole tokens left: floor((N·W − used) / W).
        (full.saturating_sub(used) / u128::from(self.window)) as u64
    }

    /// Nanoseconds from `now` until `cost` fits, for a state that does not admit it now.
    fn wait(&self, state: &SlidingWindowState, left: u64, cost: u64) -> u64 {
        let n = self.quota.capacity();
        let w = u128::from(self.window);
        if state.current + cost <= n {
            // Within this window: need previous × (left − d) ≤ (N − current − cost) × W.
            // Denied now means previous > 0.
            let slack = u128::from(n - state.current - cost) * w;
            let allowed_left = (slack / u128::from(state.previous.max(1))).min(u128::from(left));
            left - allowed_left as u64
        } else {
            // In the next window the current count becomes the previous one:
            // need current × left' ≤ (N − cost) × W, with left' counting down from W.
            let slack = u128::from(n - cost) * w;
            let allowed_left = (slack / u128::from(state.current.max(1))).min(w) as u64;
            left + (self.window - allowed_left)
        }
    }
}

impl Algorithm for SlidingWindow {
    type State = SlidingWindowState;

    fn kind(&self) -> Kind {
        Kind::SlidingWindow
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn initial_state(&self) -> SlidingWindowState {
        SlidingWindowState::default()
    }

    fn exhausted_state(&self, now: u64) -> SlidingWindowState {
        SlidingWindowState {
            window_end_ns: clamp_time(now).saturating_add(self.window),
            previous: self.quota.capacity(),
            current: 0,
        }
    }

    fn check(
        &self,
        state: &mut SlidingWindowState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        ensure_cost(&self.quota, cost)?;
        let now = clamp_time(now);
        self.roll(state, now);
        let n = self.quota.capacity();
        state.previous = state.previous.min(n);
        state.current = state.current.min(n);
        // A backward clock can leave more than W before the end; count it as W.
        let left = state.window_end_ns.saturating_sub(now).min(self.window);
        let full = u128::from(n) * u128::from(self.window);
        let reset_after = |s: &SlidingWindowState| {
            if s.current > 0 {
                left + self.window
            } else if s.previous > 0 {
                left
            } else {
                0
            }
        };
        if self.weighted(state, left, cost) <= full {
            state.current += cost;
            Ok(Decision {
                allowed: true,
                limit: n,
                remaining: self.remaining(state, left),
                retry_after_ns: 0,
                reset_after_ns: reset_after(state),
            })
        } else {
            Ok(Decision {
                allowed: false,
                limit: n,
                remaining: self.remaining(state, left),
                retry_after_ns: self.wait(state, left, cost),
                reset_after_ns: reset_after(state),
            })
        }
    }

    fn refund(&self, state: &mut SlidingWindowState, admitted_at: u64, now: u64, cost: u64) {
        let (admitted_at, now) = (clamp_time(admitted_at), clamp_time(now));
        self.roll(state, now);
        let start = state.window_end_ns.saturating_sub(self.window);
        if admitted_at >= start && admitted_at < state.window_end_ns {
            state.current = state.current.saturating_sub(cost);
        } else if admitted_at >= start.saturating_sub(self.window) && admitted_at < start {
            state.previous = state.previous.saturating_sub(cost);
        }
    }

    fn charge(&self, state: &mut SlidingWindowState, now: u64, cost: u64, _max_debt: u64) -> u64 {
        charge_within(self, state, now, cost)
    }

    fn idle_at(&self, state: &SlidingWindowState) -> u64 {
        if state.current > 0 {
            state.window_end_ns.saturating_add(self.window)
        } else if state.previous > 0 {
            state.window_end_ns
        } else {
            0
        }
    }

    fn save(&self, state: &SlidingWindowState, now: u64) -> SavedState {
        let now = clamp_time(now);
        let mut state = *state;
        self.roll(&mut state, now);
        SavedState::Sliding {
            ends_in_ns: state.window_end_ns.saturating_sub(now).min(self.window),
            previous: state.previous,
            current: state.current,
        }
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<SlidingWindowState, SnapshotError> {
        let SavedState::Sliding {
            ends_in_ns,
            previous,
            current,
        } = saved
        else {
            return Err(SnapshotError::AlgorithmMismatch {
                found: saved.form(),
                expected: "sliding_window",
            });
        };
        for (field, value) in [
            ("ends_in_ns", *ends_in_ns),
            ("previous", *previous),
            ("current", *current),
        ] {
            if value > crate::quota::MAX_SPAN_NS {
                return Err(SnapshotError::Corrupt { field, value });
            }
        }
        let n = self.quota.capacity();
        let now = clamp_time(now);
        let ends_in = (*ends_in_ns).min(self.window);
        let (previous, current) = ((*previous).min(n), (*current).min(n));
        let state = if elapsed_ns < ends_in {
            SlidingWindowState {
                window_end_ns: now.saturating_add(ends_in - elapsed_ns),
                previous,
                current,
            }
        } else {
            let past_end = elapsed_ns - ends_in;
            let skipped = past_end / self.window;
            SlidingWindowState {
                window_end_ns: now.saturating_add(self.window - past_end % self.window),
                previous: if skipped == 0 { current } else { 0 },
                current: 0,
            }
        };
        Ok(state)
    }
}
