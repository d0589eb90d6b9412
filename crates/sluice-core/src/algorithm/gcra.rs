//! GCRA, the generic cell rate algorithm: the token bucket with one `u64` of state.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{clamp_time, ensure_cost, restore_debt, Algorithm, SavedState};
use crate::decision::Decision;
use crate::divisor::Divisor;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// The generic cell rate algorithm.
///
/// The state is the theoretical arrival time (TAT): the moment the bucket would be full again.
/// A request of cost `c` at `now` is admitted when `max(TAT, now) + c·T - now <= capacity·T`,
/// where T is the interval between tokens. Its admissions are exactly those of
/// [`crate::TokenBucket`] on a clock that does not go backwards.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, Gcra, Quota};
///
/// let gcra = Gcra::new(Quota::parse(2, "1/s").unwrap());
/// let mut tat = gcra.initial_state();
/// assert!(gcra.check(&mut tat, 0, 1).unwrap().allowed);
/// assert!(gcra.check(&mut tat, 0, 1).unwrap().allowed);
/// let denied = gcra.check(&mut tat, 0, 1).unwrap();
/// assert!(!denied.allowed);
/// assert_eq!(denied.retry_after_ns, 1_000_000_000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    quota: Quota,
    interval: u64,
    tau: u64,
    /// Divides by `interval` for `remaining`.
    per_token: Divisor,
}

impl Gcra {
    /// GCRA for `quota`.
    pub const fn new(quota: Quota) -> Gcra {
        Gcra {
            quota,
            interval: quota.interval_ns(),
            per_token: Divisor::new(quota.interval_ns()),
            tau: quota.window_ns(),
        }
    }

    /// The step on a bare `u64`, for callers that keep the TAT in an atomic.
    ///
    /// Returns the decision and the new TAT, which the caller stores only if it differs.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::check`].
    #[inline]
    pub fn step(&self, tat: u64, now: u64, cost: u64) -> Result<(Decision, u64), CheckError> {
        ensure_cost(&self.quota, cost)?;
        let now = clamp_time(now);
        let base = if tat > now { tat } else { now };
        // cost ≤ capacity and capacity·T ≤ 2^62, so this product cannot overflow; a stored TAT
        // is at most MAX_TIME_NS + tau, so the sum cannot either. (It must not saturate: a
        // saturated TAT stops counting debt and admits everything.)
        let new_tat = base.saturating_add(cost * self.interval);
        let ahead = new_tat - now;
        if ahead <= self.tau {
            let decision = Decision {
                allowed: true,
                limit: self.quota.capacity(),
                remaining: self.per_token.div(self.tau - ahead),
                retry_after_ns: 0,
                reset_after_ns: ahead,
            };
            Ok((decision, new_tat))
        } else {
            let debt = base - now;
            let decision = Decision {
                allowed: false,
                limit: self.quota.capacity(),
                remaining: self.per_token.div(self.tau.saturating_sub(debt)),
                retry_after_ns: ahead - self.tau,
                reset_after_ns: debt,
            };
            Ok((decision, tat))
        }
    }
}

impl Algorithm for Gcra {
    type State = u64;

    fn kind(&self) -> Kind {
        Kind::Gcra
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn initial_state(&self) -> u64 {
        0
    }

    fn exhausted_state(&self, now: u64) -> u64 {
        clamp_time(now).saturating_add(self.tau)
    }

    #[inline]
    fn check(&self, state: &mut u64, now: u64, cost: u64) -> Result<Decision, CheckError> {
        let (decision, tat) = self.step(*state, now, cost)?;
        *state = tat;
        Ok(decision)
    }

    fn refund(&self, state: &mut u64, _admitted_at: u64, now: u64, cost: u64) {
        let give_back = cost.min(self.quota.capacity()) * self.interval;
        *state = state
            .saturating_sub(give_back)
            .max(clamp_time(now).min(*state));
    }

    fn idle_at(&self, state: &u64) -> u64 {
        *state
    }

    fn save(&self, state: &u64, now: u64) -> SavedState {
        SavedState::Debt {
            debt_ns: state.saturating_sub(clamp_time(now)).min(self.tau),
        }
    }

    fn restore(&self, saved: &SavedState, now: u64, elapsed_ns: u64) -> Result<u64, SnapshotError> {
        let debt = restore_debt(&self.quota, saved, "gcra", elapsed_ns)?;
        Ok(if debt == 0 {
            0
        } else {
            clamp_time(now).saturating_add(debt)
        })
    }
}
