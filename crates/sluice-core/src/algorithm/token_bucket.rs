//! The token bucket: starts full, refills by elapsed time, holds fractional tokens exactly.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{
    charge_tat, clamp_time, ensure_cost, restore_debt, select_unpredictable, Algorithm, SavedState,
    MAX_DEBT_NS, MAX_TIME_NS,
};
use crate::decision::Decision;
use crate::divisor::Divisor;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// The classic token bucket, done with integers.
///
/// The level is kept in nanoseconds of refill (one token = one interval), which makes
/// fractional tokens exact: after 1.5 intervals an empty bucket holds exactly 1.5 tokens. No
/// timer is involved; the refill is computed from the time since the last check.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, Quota, TokenBucket};
///
/// // 5 messages in a burst, 10 per minute on average.
/// let bucket = TokenBucket::new(Quota::parse(5, "10/min").unwrap());
/// let mut state = bucket.initial_state();
/// for _ in 0..5 {
///     assert!(bucket.check(&mut state, 0, 1).unwrap().allowed);
/// }
/// let denied = bucket.check(&mut state, 500_000_000, 1).unwrap();
/// assert!(!denied.allowed);
/// assert_eq!(denied.retry_after_ns, 5_500_000_000); // a token every 6 s
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBucket {
    quota: Quota,
    interval: u64,
    tau: u64,
    /// Divides by `interval` for `remaining`.
    per_token: Divisor,
}

/// A token bucket's memory of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenBucketState {
    /// Tokens held, in nanoseconds of refill (tokens × interval).
    pub level_ns: u64,
    /// The time of the last check.
    pub last_ns: u64,
}

impl TokenBucket {
    /// A token bucket for `quota`.
    pub const fn new(quota: Quota) -> TokenBucket {
        TokenBucket {
            quota,
            interval: quota.interval_ns(),
            per_token: Divisor::new(quota.interval_ns()),
            tau: quota.window_ns(),
        }
    }

    /// The time the bucket is full again (GCRA's TAT): `last + (tau − level)`. A level at or
    /// above the capacity is full at `last`.
    #[inline]
    fn full_at(&self, state: &TokenBucketState) -> u64 {
        state
            .last_ns
            .saturating_add(self.tau.saturating_sub(state.level_ns))
    }

    /// The state that is full again at `full_at`, as of `now` (clamped). A bucket owing more
    /// than its capacity (a debt, see [`Algorithm::charge`]) is empty until `full_at − tau`:
    /// its `last_ns` is then in the future, and no refill counts before it.
    #[inline]
    fn state_full_at(&self, full_at: u64, now: u64) -> TokenBucketState {
        let ahead = full_at.saturating_sub(now);
        if ahead <= self.tau {
            TokenBucketState {
                level_ns: self.tau - ahead,
                last_ns: now,
            }
        } else {
            TokenBucketState {
                level_ns: 0,
                last_ns: full_at - self.tau,
            }
        }
    }

    /// The check for a time past [`MAX_TIME_NS`] (the clock stops there) or behind the last
    /// check. Behind the last check no time passes, as for a clock that went backwards; a key
    /// in debt keeps its last check in the future, so its waits count from there (`behind`),
    /// and it refuses even a query (cost 0) until the debt is paid, as GCRA does.
    #[cold]
    #[inline(never)]
    fn check_unusual(&self, state: &mut TokenBucketState, now: u64, cost: u64) -> Decision {
        let now = clamp_time(now);
        let last = state.last_ns;
        if now >= last {
            self.take::<true>(state, now - last, now, 0, cost)
        } else {
            self.take::<true>(state, 0, last, last - now, cost)
        }
    }

    /// The check once the time is known: `elapsed` since the last check, as of `now` (the last
    /// check itself when the clock is `behind` it). With `BEHIND` false (the hot path) `behind`
    /// is 0 and its terms fold away.
    #[inline(always)]
    fn take<const BEHIND: bool>(
        &self,
        state: &mut TokenBucketState,
        elapsed: u64,
        now: u64,
        behind: u64,
        cost: u64,
    ) -> Decision {
        // Refill and cap as GCRA does them: the bucket was `owed` short of full at `last`, so
        // it is full again at `full_at = last + owed` (GCRA's TAT), and the debt left now is
        // `max(full_at, now) - now`, i.e. `owed - elapsed` or nothing. A level above the
        // capacity owes nothing. For a hand-built `last` near u64::MAX, `full_at` wraps and
        // the difference is still exact.
        let owed = self.tau.saturating_sub(state.level_ns);
        let full_at = state.last_ns.wrapping_add(owed);
        let debt = select_unpredictable(owed > elapsed, full_at, now).wrapping_sub(now);
        // cost ≤ capacity, so need ≤ tau; debt ≤ owed ≤ tau.
        let need = cost * self.interval;
        let room = self.tau - need;
        let limit = self.quota.capacity();
        let behind = if BEHIND { behind } else { 0 };
        // In debt (what is owed before the last check and after it exceeds the window), even a
        // query is refused.
        let refused_query = BEHIND && cost == 0 && behind.saturating_add(debt) > self.tau;
        let decision = if debt <= room && !refused_query {
            let level = room - debt;
            state.level_ns = level;
            Decision {
                allowed: true,
                limit,
                remaining: self.per_token.div(level),
                retry_after_ns: 0,
                reset_after_ns: behind.saturating_add(debt + need),
            }
        } else {
            let level = self.tau - debt;
            state.level_ns = level;
            Decision {
                allowed: false,
                limit,
                remaining: self.per_token.div(level),
                retry_after_ns: behind.saturating_add(debt) - room,
                reset_after_ns: behind.saturating_add(debt),
            }
        };
        state.last_ns = now;
        decision
    }
}

impl Algorithm for TokenBucket {
    type State = TokenBucketState;

    fn kind(&self) -> Kind {
        Kind::TokenBucket
    }

    fn quota(&self) -> Quota {
        self.quota
    }

    fn initial_state(&self) -> TokenBucketState {
        TokenBucketState {
            level_ns: self.tau,
            last_ns: 0,
        }
    }

    fn exhausted_state(&self, now: u64) -> TokenBucketState {
        TokenBucketState {
            level_ns: 0,
            last_ns: clamp_time(now),
        }
    }

    #[inline]
    fn check(
        &self,
        state: &mut TokenBucketState,
        now: u64,
        cost: u64,
    ) -> Result<Decision, CheckError> {
        ensure_cost(&self.quota, cost)?;
        let last = state.last_ns;
        // The clock stops at MAX_TIME_NS (see `Algorithm`), and a clock behind the last check
        // counts as no time passing (a key in debt keeps its last check in the future, and
        // its waits count from there). A cold call for those rare cases, rather than
        // conditional moves, keeps them off the path from the clock read.
        if !(last <= now && now <= MAX_TIME_NS) {
            return Ok(self.check_unusual(state, now, cost));
        }
        Ok(self.take::<false>(state, now - last, now, 0, cost))
    }

    fn refund(&self, state: &mut TokenBucketState, _admitted_at: u64, now: u64, cost: u64) {
        let now = clamp_time(now);
        let full_at = self.full_at(state);
        let give_back = cost.min(self.quota.capacity()) * self.interval;
        // A debt shrinks first; a refund never fills the bucket beyond full.
        let full_at = full_at.saturating_sub(give_back).max(now.min(full_at));
        *state = self.state_full_at(full_at, now);
    }

    fn charge(&self, state: &mut TokenBucketState, now: u64, cost: u64, max_debt: u64) -> u64 {
        let (full_at, forgiven) = charge_tat(
            self.full_at(state),
            now,
            cost,
            self.interval,
            self.tau,
            max_debt,
        );
        *state = self.state_full_at(full_at, clamp_time(now));
        forgiven
    }

    fn idle_at(&self, state: &TokenBucketState) -> u64 {
        if state.level_ns >= self.tau {
            0
        } else {
            self.full_at(state)
        }
    }

    fn save(&self, state: &TokenBucketState, now: u64) -> SavedState {
        SavedState::Debt {
            debt_ns: self
                .full_at(state)
                .saturating_sub(clamp_time(now))
                .min(MAX_DEBT_NS),
        }
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<TokenBucketState, SnapshotError> {
        let debt = restore_debt(saved, "token_bucket", elapsed_ns)?;
        let now = clamp_time(now);
        Ok(self.state_full_at(now.saturating_add(debt), now))
    }
}
