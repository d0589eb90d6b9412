//! The leaky bucket as a meter: water drains at a constant rate, each request pours its cost in.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{
    clamp_time, ensure_cost, restore_debt, Algorithm, SavedState, MAX_DEBT_NS,
};
use crate::decision::Decision;
use crate::divisor::Divisor;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// The leaky bucket as a meter, the semantics of nginx `limit_req ... nodelay`.
///
/// The bucket holds up to `capacity` requests' worth of water and leaks one request's worth per
/// interval. A request is admitted if its cost fits on top of the current level. As a meter
/// this is the mirror image of the token bucket (level = capacity − tokens), so it admits the
/// same requests; it is offered under its own name because that is how nginx users think of it.
/// nginx's `rate=r burst=b` corresponds to `capacity = b + 1`, since nginx does not count the
/// request being decided against the burst. The *queue* form of the leaky bucket (requests
/// released at a constant pace) is the waiting [`Limiter`](https://docs.rs/sluice) in the
/// `sluice` crate over any of these meters.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, LeakyBucket, Quota};
///
/// let leaky = LeakyBucket::new(Quota::parse(3, "1/s").unwrap());
/// let mut state = leaky.initial_state();
/// for _ in 0..3 {
///     assert!(leaky.check(&mut state, 0, 1).unwrap().allowed);
/// }
/// assert!(!leaky.check(&mut state, 0, 1).unwrap().allowed);
/// assert!(leaky.check(&mut state, 1_000_000_000, 1).unwrap().allowed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakyBucket {
    quota: Quota,
    interval: u64,
    tau: u64,
    /// Divides by `interval` for `remaining`.
    per_token: Divisor,
}

/// A leaky bucket's memory of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeakyBucketState {
    /// Water in the bucket, in nanoseconds of draining (requests × interval).
    pub water_ns: u64,
    /// The time of the last check.
    pub last_ns: u64,
}

impl LeakyBucket {
    /// A leaky bucket for `quota`.
    pub const fn new(quota: Quota) -> LeakyBucket {
        LeakyBucket {
            quota,
            interval: quota.interval_ns(),
            per_token: Divisor::new(quota.interval_ns()),
            tau: quota.window_ns(),
        }
    }

    /// How far `now` is behind the last check: a key whose bucket was restored or
    /// remembered as spent at a later time (an evicted key in debt) keeps its last check in
    /// the future, and what it owes counts from there.
    #[inline]
    fn behind(state: &LeakyBucketState, now: u64) -> u64 {
        state.last_ns.saturating_sub(clamp_time(now))
    }

    #[inline]
    fn drain(&self, state: &LeakyBucketState, now: u64) -> (u64, u64) {
        let now = clamp_time(now).max(state.last_ns);
        (state.water_ns.saturating_sub(now - state.last_ns), now)
    }
}

impl Algorithm for LeakyBucket {
    type State = LeakyBucketState;

    fn kind(&self) -> Kind {
        Kind::LeakyBucket
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn initial_state(&self) -> LeakyBucketState {
        LeakyBucketState::default()
    }

    fn exhausted_state(&self, now: u64) -> LeakyBucketState {
        LeakyBucketState {
            water_ns: self.tau,
            last_ns: clamp_time(now),
        }
    }

    #[inline]
    fn check(
        &self,
        state: &mut LeakyBucketState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        ensure_cost(&self.quota, cost)?;
        let behind = Self::behind(state, now);
        let (water, now) = self.drain(state, now);
        let pour = cost * self.interval;
        let limit = self.quota.capacity();
        let filled = water.saturating_add(pour);
        let decision = if filled <= self.tau {
            state.water_ns = filled;
            Decision {
                allowed: true,
                limit,
                remaining: self.per_token.div(self.tau - filled),
                retry_after_ns: 0,
                reset_after_ns: behind.saturating_add(filled),
            }
        } else {
            state.water_ns = water;
            Decision {
                allowed: false,
                limit,
                // Water beyond this bucket (a state held under a larger quota, as a key's
                // own, read by its queue's plan under the table's) leaves nothing.
                remaining: self.per_token.div(self.tau.saturating_sub(water)),
                retry_after_ns: behind.saturating_add(filled - self.tau),
                reset_after_ns: behind.saturating_add(water),
            }
        };
        state.last_ns = now;
        Ok(decision)
    }

    fn refund(&self, state: &mut LeakyBucketState, _admitted_at: u64, now: u64, cost: u64) {
        let (water, now) = self.drain(state, now);
        let give_back = cost.min(self.quota.capacity()) * self.interval;
        state.water_ns = water.saturating_sub(give_back);
        state.last_ns = now;
    }

    fn charge(&self, state: &mut LeakyBucketState, now: u64, cost: u64, max_debt: u64) -> u64 {
        let (water, now) = self.drain(state, now);
        // Water beyond the bucket is the debt: the refill drains it before anything fits.
        let most = self
            .tau
            .saturating_add(max_debt.saturating_mul(self.interval))
            .min(MAX_DEBT_NS);
        let taken = cost.min(most.saturating_sub(water) / self.interval);
        state.water_ns = water + taken * self.interval;
        state.last_ns = now;
        cost - taken
    }

    fn idle_at(&self, state: &LeakyBucketState) -> u64 {
        if state.water_ns == 0 {
            0
        } else {
            state.last_ns.saturating_add(state.water_ns)
        }
    }

    fn save(&self, state: &LeakyBucketState, now: u64) -> SavedState {
        let behind = Self::behind(state, now);
        let (water, _) = self.drain(state, now);
        SavedState::Debt {
            debt_ns: water.saturating_add(behind).min(MAX_DEBT_NS),
        }
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<LeakyBucketState, SnapshotError> {
        let water = restore_debt(saved, "leaky_bucket", elapsed_ns)?;
        Ok(LeakyBucketState {
            water_ns: water,
            last_ns: clamp_time(now),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_fuller_than_the_bucket_is_refused_with_nothing_left() {
        // Held under 3 tokens at 1/s, read under 2 at 1/s: 3 s of water in a 2 s bucket.
        let leaky = LeakyBucket::new(Quota::parse(2, "1/s").unwrap());
        let mut state = LeakyBucketState {
            water_ns: 3_000_000_000,
            last_ns: 0,
        };
        let d = leaky.check(&mut state, 0, 0).unwrap();
        assert!(!d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(d.retry_after_ns, 1_000_000_000);
    }
}
