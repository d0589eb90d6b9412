//! GCRA, the generic cell rate algorithm: the token bucket with one `u64` of state.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{
    charge_tat, clamp_time, ensure_cost, restore_debt, Algorithm, SavedState,
};
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
        let advance = self.advance(tat, now, cost)?;
        Ok((self.decision(advance), advance.tat))
    }

    /// The first half of [`Gcra::step`]: the TAT after a check of `cost` at `now` against
    /// `tat` (the same `tat` when the check is denied). For a caller that swaps the TAT in
    /// with a compare-and-swap: only this needs to run between its load and its swap, and
    /// [`Gcra::decision`] gives the decision once the swap is done.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::check`].
    #[inline]
    pub fn advance(&self, tat: u64, now: u64, cost: u64) -> Result<Advance, CheckError> {
        ensure_cost(&self.quota, cost)?;
        let now = clamp_time(now);
        // cost ≤ capacity and capacity·T ≤ 2^62, so this product cannot overflow.
        let need = cost * self.interval;
        // `max(tat, now) + need`, saturating at u64::MAX. (It must not wrap: a wrapped TAT
        // stops counting debt and admits everything.) A TAT this step returned is at most
        // MAX_TIME_NS + tau, where the sum cannot overflow; only a hand-built one can come
        // within `need` of u64::MAX, and capping it there first gives the saturated sum
        // while keeping the saturation off the path from `now`, which is below the cap.
        let new_tat = tat.min(u64::MAX - need).max(now) + need;
        let ahead = new_tat - now;
        Ok(Advance {
            tat: if ahead <= self.tau { new_tat } else { tat },
            before: tat,
            now,
            ahead,
        })
    }

    /// The second half of [`Gcra::step`]: the decision of the check that gave `advance`.
    #[inline]
    pub fn decision(&self, advance: Advance) -> Decision {
        let Advance {
            before, now, ahead, ..
        } = advance;
        if ahead <= self.tau {
            Decision {
                allowed: true,
                limit: self.quota.capacity(),
                remaining: self.per_token.div(self.tau - ahead),
                retry_after_ns: 0,
                reset_after_ns: ahead,
            }
        } else {
            let debt = before.max(now) - now;
            Decision {
                allowed: false,
                limit: self.quota.capacity(),
                remaining: self.per_token.div(self.tau.saturating_sub(debt)),
                retry_after_ns: ahead - self.tau,
                reset_after_ns: debt,
            }
        }
    }
}

/// One check of [`Gcra::advance`], before its decision is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advance {
    /// The TAT after the check: the new one if admitted, else the one checked against.
    pub tat: u64,
    /// The TAT the check was made against.
    before: u64,
    /// The time of the check, clamped.
    now: u64,
    /// How far the TAT would be ahead of `now` if the check were admitted.
    ahead: u64,
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

    fn charge(&self, state: &mut u64, now: u64, cost: u64, max_debt: u64) -> u64 {
        let (tat, forgiven) = charge_tat(*state, now, cost, self.interval, self.tau, max_debt);
        *state = tat;
        forgiven
    }

    fn idle_at(&self, state: &u64) -> u64 {
        *state
    }

    fn save(&self, state: &u64, now: u64) -> SavedState {
        SavedState::Debt {
            debt_ns: state
                .saturating_sub(clamp_time(now))
                .min(crate::algorithm::step::MAX_DEBT_NS),
        }
    }

    fn restore(&self, saved: &SavedState, now: u64, elapsed_ns: u64) -> Result<u64, SnapshotError> {
        let debt = restore_debt(saved, "gcra", elapsed_ns)?;
        Ok(if debt == 0 {
            0
        } else {
            clamp_time(now).saturating_add(debt)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Gcra;
    use crate::algorithm::step::{clamp_time, MAX_TIME_NS};
    use crate::quota::{Quota, Rate, MAX_SPAN_NS};
    use crate::Decision;
    use proptest::prelude::*;

    /// The step in its textbook form: `max(tat, now)`, then a saturating add. The shipped step
    /// caps the TAT at `u64::MAX - need` before the max instead (one max and one add between
    /// the clock read and the swap); the proptest below checks that the two agree.
    fn reference(gcra: &Gcra, tat: u64, now: u64, cost: u64) -> (Decision, u64) {
        let now = clamp_time(now);
        let base = tat.max(now);
        let new_tat = base.saturating_add(cost * gcra.interval);
        let ahead = new_tat - now;
        if ahead <= gcra.tau {
            let left = gcra.tau - ahead;
            let decision = Decision {
                allowed: true,
                limit: gcra.quota.capacity(),
                remaining: left / gcra.interval,
                retry_after_ns: 0,
                reset_after_ns: ahead,
            };
            (decision, new_tat)
        } else {
            let debt = base - now;
            let decision = Decision {
                allowed: false,
                limit: gcra.quota.capacity(),
                remaining: gcra.tau.saturating_sub(debt) / gcra.interval,
                retry_after_ns: ahead - gcra.tau,
                reset_after_ns: debt,
            };
            (decision, tat)
        }
    }

    fn any_time() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<u64>(),
            (0u64..=1_000).prop_map(|d| u64::MAX - d),
            (0u64..=1_000).prop_map(|d| MAX_TIME_NS - d),
            (0u64..=1_000).prop_map(|d| MAX_TIME_NS + d),
            0u64..=1_000,
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

        /// Any TAT a caller can hand in, including ones within a window of u64::MAX.
        #[test]
        fn step_is_the_saturating_reference_on_any_tat(
            capacity in 1u64..=1_000,
            interval in prop_oneof![1u64..=1_000, Just(MAX_SPAN_NS / 1_000)],
            tat in any_time(),
            now in any_time(),
            raw_cost in any::<u64>(),
        ) {
            let gcra = Gcra::new(Quota::new(capacity, Rate::from_interval_ns(interval).unwrap()).unwrap());
            let cost = raw_cost % (capacity + 1);
            prop_assert_eq!(gcra.step(tat, now, cost).unwrap(), reference(&gcra, tat, now, cost));
        }
    }
}
