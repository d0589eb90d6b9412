//! The token bucket: starts full, refills by elapsed time, holds fractional tokens exactly.

use crate::algorithm::kind::Kind;
use crate::algorithm::step::{
    clamp_time, ensure_cost, restore_debt, select_unpredictable, Algorithm, SavedState, MAX_TIME_NS,
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

    /// The level at `now`, refilled and capped; a backward clock counts as no time passing.
    #[inline]
    fn refill(&self, state: &TokenBucketState, now: u64) -> (u64, u64) {
        let now = clamp_time(now).max(state.last_ns);
        let level = state
            .level_ns
            .saturating_add(now - state.last_ns)
            .min(self.tau);
        (level, now)
    }
}

/// `(elapsed, now)` for a time past MAX_TIME_NS or behind the last check.
#[cold]
#[inline(never)]
fn unusual_clock(now: u64, last: u64) -> (u64, u64) {
    let now = clamp_time(now);
    if now >= last {
        (now - last, now)
    } else {
        (0, last)
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
        // counts as no time passing. A cold call for those rare cases, rather than conditional
        // moves, keeps them off the path from the clock read.
        let (elapsed, now) = if last <= now && now <= MAX_TIME_NS {
            (now - last, now)
        } else {
            unusual_clock(now, last)
        };
        // Refill and cap as GCRA does them: the bucket was `owed` short of full at `last`, so
        // it is full again at `full_at = last + owed` (GCRA's TAT), and the debt left now is
        // `max(full_at, now) - now`, i.e. `owed - elapsed` or nothing. A level above the
        // capacity owes nothing. For a hand-built `last` near u64::MAX, `full_at` wraps and
        // the difference is still exact.
        let owed = self.tau.saturating_sub(state.level_ns);
        let full_at = last.wrapping_add(owed);
        let debt = select_unpredictable(owed > elapsed, full_at, now).wrapping_sub(now);
        // cost ≤ capacity, so need ≤ tau; debt ≤ owed ≤ tau.
        let need = cost * self.interval;
        let room = self.tau - need;
        let limit = self.quota.capacity();
        let decision = if debt <= room {
            let level = room - debt;
            state.level_ns = level;
            Decision {
                allowed: true,
                limit,
                remaining: self.per_token.div(level),
                retry_after_ns: 0,
                reset_after_ns: debt + need,
            }
        } else {
            let level = self.tau - debt;
            state.level_ns = level;
            Decision {
                allowed: false,
                limit,
                remaining: self.per_token.div(level),
                retry_after_ns: debt - room,
                reset_after_ns: debt,
            }
        };
        state.last_ns = now;
        Ok(decision)
    }

    fn refund(&self, state: &mut TokenBucketState, _admitted_at: u64, now: u64, cost: u64) {
        let (level, now) = self.refill(state, now);
        let give_back = cost.min(self.quota.capacity()) * self.interval;
        state.level_ns = level.saturating_add(give_back).min(self.tau);
        state.last_ns = now;
    }

    fn idle_at(&self, state: &TokenBucketState) -> u64 {
        let missing = self.tau.saturating_sub(state.level_ns);
        if missing == 0 {
            0
        } else {
            state.last_ns.saturating_add(missing)
        }
    }

    fn save(&self, state: &TokenBucketState, now: u64) -> SavedState {
        let (level, _) = self.refill(state, now);
        SavedState::Debt {
            debt_ns: self.tau - level,
        }
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<TokenBucketState, SnapshotError> {
        let debt = restore_debt(&self.quota, saved, "token_bucket", elapsed_ns)?;
        Ok(TokenBucketState {
            level_ns: self.tau - debt,
            last_ns: clamp_time(now),
        })
    }
}
