//! The outcome of one check: admitted or not, and what the caller should be told.

/// What a limiter decided for one request.
///
/// A denial is an outcome, not a failure: it carries [`Decision::retry_after_ns`], the exact
/// time after which the same cost would be admitted if nothing else consumed tokens meanwhile.
/// That figure feeds `Retry-After` and the wait queue's timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    /// Whether the request was admitted (and its cost consumed).
    pub allowed: bool,
    /// The capacity: the most this limiter admits at once.
    pub limit: u64,
    /// Whole tokens left after this decision.
    pub remaining: u64,
    /// Nanoseconds until this cost would be admitted; zero when `allowed`.
    pub retry_after_ns: u64,
    /// Nanoseconds until the limiter is back to its full, idle state.
    pub reset_after_ns: u64,
}

impl Decision {
    /// `retry_after` in whole seconds, rounded up, as `Retry-After` wants it.
    pub const fn retry_after_secs_ceil(&self) -> u64 {
        self.retry_after_ns.div_ceil(crate::quota::NANOS_PER_SEC)
    }

    /// `reset_after` in whole seconds, rounded up.
    pub const fn reset_after_secs_ceil(&self) -> u64 {
        self.reset_after_ns.div_ceil(crate::quota::NANOS_PER_SEC)
    }

    /// `retry_after` in whole milliseconds, rounded up.
    pub const fn retry_after_ms_ceil(&self) -> u64 {
        self.retry_after_ns.div_ceil(1_000_000)
    }

    /// `reset_after` in whole milliseconds, rounded up.
    pub const fn reset_after_ms_ceil(&self) -> u64 {
        self.reset_after_ns.div_ceil(1_000_000)
    }
}
