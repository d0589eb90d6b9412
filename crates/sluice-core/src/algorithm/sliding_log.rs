//! The sliding window log: exact, at most N in any window W, one entry per admission.

use alloc::collections::VecDeque;

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{charge_within, clamp_time, ensure_cost, Algorithm, SavedState};
use crate::decision::Decision;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// Sliding window log: remembers every admission of the last window.
///
/// A request is admitted when the cost admitted in `(now − W, now]` plus its own stays within
/// N. This is exact for any window, at the price of memory proportional to the admissions in
/// one window (entries at the same instant are merged). It handles the window boundary,
/// weighted costs and the exact wait.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, Quota, SlidingLog};
///
/// let log = SlidingLog::new(Quota::parse(2, "2/s").unwrap()); // 2 per second
/// let mut s = log.initial_state();
/// assert!(log.check(&mut s, 0, 1).unwrap().allowed);
/// assert!(log.check(&mut s, 400_000_000, 1).unwrap().allowed);
/// let d = log.check(&mut s, 900_000_000, 1).unwrap();
/// assert!(!d.allowed);
/// assert_eq!(d.retry_after_ns, 100_000_000); // the first admission leaves the window at 1 s
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingLog {
    quota: Quota,
    window: u64,
}

/// A sliding log's memory of one key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlidingLogState {
    /// `(time it leaves the window, cost)`, oldest first.
    entries: VecDeque<(u64, u64)>,
    /// Sum of the costs in `entries`.
    total: u64,
    /// The latest time seen, so a backward clock cannot expire entries early.
    last_ns: u64,
}

impl SlidingLogState {
    /// Number of log entries held (memory use is proportional to it).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the log is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

impl SlidingLog {
    /// A sliding log for `quota`.
    pub const fn new(quota: Quota) -> SlidingLog {
        SlidingLog {
            quota,
            window: quota.window_ns(),
        }
    }

    #[inline]
    fn expire(&self, state: &mut SlidingLogState, now: u64) -> u64 {
        let now = clamp_time(now).max(state.last_ns);
        state.last_ns = now;
        while let Some(&(leaves, cost)) = state.entries.front() {
            if leaves > now {
                break;
            }
            state.entries.pop_front();
            state.total -= cost;
        }
        now
    }
}

impl Algorithm for SlidingLog {
    type State = SlidingLogState;

    fn kind(&self) -> Kind {
        Kind::SlidingLog
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn initial_state(&self) -> SlidingLogState {
        SlidingLogState::default()
    }

    fn exhausted_state(&self, now: u64) -> SlidingLogState {
        let now = clamp_time(now);
        let mut entries = VecDeque::new();
        entries.push_back((now.saturating_add(self.window), self.quota.capacity()));
        SlidingLogState {
            entries,
            total: self.quota.capacity(),
            last_ns: now,
        }
    }

    fn check(
        &self,
        state: &mut SlidingLogState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        ensure_cost(&self.quota, cost)?;
        let now = self.expire(state, now);
        let n = self.quota.capacity();
        if state.total + cost <= n {
            if cost > 0 {
                let leaves = now.saturating_add(self.window);
                match state.entries.back_mut() {
                    Some(back) if back.0 == leaves => back.1 += cost,
                    _ => state.entries.push_back((leaves, cost)),
                }
                state.total += cost;
            }
            let reset = state.entries.back().map_or(0, |&(leaves, _)| leaves - now);
            Ok(Decision {
                allowed: true,
                limit: n,
                remaining: n - state.total,
                retry_after_ns: 0,
                reset_after_ns: reset,
            })
        } else {
            let mut to_free = state.total + cost - n;
            let mut wait = 0;
            for &(leaves, entry_cost) in &state.entries {
                wait = leaves - now;
                if entry_cost >= to_free {
                    break;
                }
                to_free -= entry_cost;
            }
            let reset = state.entries.back().map_or(0, |&(leaves, _)| leaves - now);
            Ok(Decision {
                allowed: false,
                limit: n,
                remaining: n - state.total,
                retry_after_ns: wait,
                reset_after_ns: reset,
            })
        }
    }

    /// Takes `cost` off the newest entries admitted at or before `admitted_at`, then, if those
    /// hold less, off the oldest entries after it.
    ///
    /// Callers measure the age of an admission with their own clock (the public `refund`
    /// takes `ago`, not the limiter's nanosecond), so `admitted_at` is an estimate and need
    /// not match any entry. Forgetting an admission older than the refunded one never
    /// lets more through later: every future window that holds the older one holds the
    /// refunded one too. So an `ago` measured from before the admission (a stopwatch
    /// started earlier) is always safe; one measured from after it errs only by the
    /// admissions made in between. An admission that already left the window is not counted
    /// anywhere and gives nothing back.
    fn refund(&self, state: &mut SlidingLogState, admitted_at: u64, now: u64, cost: u64) {
        let now = self.expire(state, now);
        let leaves = clamp_time(admitted_at).saturating_add(self.window);
        if leaves <= now {
            return;
        }
        let split = state.entries.partition_point(|&(l, _)| l <= leaves);
        let mut owed = cost;
        let order = (0..split).rev().chain(split..state.entries.len());
        for i in order {
            if owed == 0 {
                break;
            }
            let entry = &mut state.entries[i];
            let taken = entry.1.min(owed);
            entry.1 -= taken;
            owed -= taken;
            state.total -= taken;
        }
        state.entries.retain(|&(_, c)| c > 0);
    }

    fn charge(&self, state: &mut SlidingLogState, now: u64, cost: u64, _max_debt: u64) -> u64 {
        charge_within(self, state, now, cost)
    }

    fn idle_at(&self, state: &SlidingLogState) -> u64 {
        state.entries.back().map_or(0, |&(leaves, _)| leaves)
    }

    fn save(&self, state: &SlidingLogState, now: u64) -> SavedState {
        let now = clamp_time(now).max(state.last_ns);
        let entries = state
            .entries
            .iter()
            .filter(|&&(leaves, _)| leaves > now)
            .map(|&(leaves, cost)| ((leaves - now).min(self.window), cost))
            .collect();
        SavedState::Log { entries }
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<SlidingLogState, SnapshotError> {
        let SavedState::Log { entries } = saved else {
            return Err(SnapshotError::AlgorithmMismatch {
                found: saved.form(),
                expected: "sliding_log",
            });
        };
        let n = self.quota.capacity();
        let now = clamp_time(now);
        let mut state = SlidingLogState {
            last_ns: now,
            ..SlidingLogState::default()
        };
        let mut previous = 0;
        let mut total: u64 = 0;
        for &(leaves_in, cost) in entries {
            if leaves_in < previous {
                return Err(SnapshotError::Corrupt {
                    field: "entries (not oldest first)",
                    value: leaves_in,
                });
            }
            if cost == 0 || cost > crate::quota::MAX_SPAN_NS {
                return Err(SnapshotError::Corrupt {
                    field: "entries.cost",
                    value: cost,
                });
            }
            previous = leaves_in;
            total = total.saturating_add(cost);
            if total > crate::quota::MAX_SPAN_NS {
                return Err(SnapshotError::Corrupt {
                    field: "entries (total cost)",
                    value: total,
                });
            }
            let leaves_in = leaves_in.min(self.window);
            if leaves_in > elapsed_ns {
                state
                    .entries
                    .push_back((now.saturating_add(leaves_in - elapsed_ns), cost));
                state.total += cost;
            }
        }
        // A quota lowered since the snapshot: keep only the newest N units, never more.
        while state.total > n {
            let excess = state.total - n;
            let Some(front) = state.entries.front_mut() else {
                break;
            };
            if front.1 > excess {
                front.1 -= excess;
                state.total -= excess;
            } else {
                state.total -= front.1;
                state.entries.pop_front();
            }
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::Rate;

    /// Admissions of one unit each at the given times, at most 10 in any 100 ns.
    fn log_with(times: &[u64]) -> (SlidingLog, SlidingLogState) {
        let log = SlidingLog::new(Quota::new(10, Rate::from_interval_ns(10).unwrap()).unwrap());
        let mut s = log.initial_state();
        for &t in times {
            assert!(log.check(&mut s, t, 1).unwrap().allowed);
        }
        (log, s)
    }

    fn admitted(s: &SlidingLogState, log: &SlidingLog) -> alloc::vec::Vec<u64> {
        s.entries.iter().map(|&(l, _)| l - log.window).collect()
    }

    #[test]
    fn a_refund_takes_the_newest_admission_at_or_before_the_estimate() {
        let (log, mut s) = log_with(&[0, 10, 20]);
        // The caller's estimate falls between two admissions: the older one goes.
        log.refund(&mut s, 12, 30, 1);
        assert_eq!(admitted(&s, &log), [0, 20]);
        assert_eq!(s.total, 2);
        // Exactly at an admission: that one.
        log.refund(&mut s, 20, 30, 1);
        assert_eq!(admitted(&s, &log), [0]);
    }

    #[test]
    fn an_estimate_before_every_admission_takes_the_oldest() {
        let (log, mut s) = log_with(&[5, 10, 20]);
        log.refund(&mut s, 1, 30, 2);
        assert_eq!(admitted(&s, &log), [20]);
    }

    #[test]
    fn a_refund_spans_entries_and_never_gives_back_more_than_counted() {
        let (log, mut s) = log_with(&[0, 10, 20]);
        log.refund(&mut s, 10, 30, 2);
        assert_eq!(admitted(&s, &log), [20]);
        log.refund(&mut s, 10, 30, 5);
        assert!(s.entries.is_empty());
        assert_eq!(s.total, 0);
    }

    #[test]
    fn an_admission_out_of_the_window_gives_nothing_back() {
        let (log, mut s) = log_with(&[0, 150]);
        // Admitted at 0: it left the window at 100.
        log.refund(&mut s, 0, 160, 1);
        assert_eq!(admitted(&s, &log), [150]);
    }
}
