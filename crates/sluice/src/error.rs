//! The errors of waiting for capacity, named for what happened.

use std::time::Duration;

use sluice_core::Decision;

/// Why a request was not admitted.
///
/// A denial is an outcome, not a failure: every variant that can be retried carries the
/// `retry_after` to put in `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `try_acquire` found no capacity (or waiters ahead of it).
    #[error("rate limited; retry after {retry_after:?}")]
    Limited {
        /// Time until this cost would be admitted.
        retry_after: Duration,
        /// The limiter's decision.
        decision: Decision,
    },
    /// The wait queue is at its depth limit.
    #[error("wait queue full; retry after {retry_after:?}")]
    QueueFull {
        /// Predicted time until this cost could be admitted.
        retry_after: Duration,
    },
    /// The wait would exceed (or did exceed) the maximum wait.
    #[error("maximum wait exceeded; retry after {retry_after:?}")]
    Timeout {
        /// Predicted time it would still have had to wait.
        retry_after: Duration,
    },
    /// The cost can never be admitted: it exceeds the capacity.
    #[error("cost {cost} exceeds the capacity {capacity}")]
    InsufficientCapacity {
        /// The cost asked for.
        cost: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The limiter or pool was closed.
    #[error("closed")]
    Closed,
    /// The shared store (Redis) did not answer in time and the policy says deny.
    #[error("limit store unavailable; retry after {retry_after:?}")]
    Unavailable {
        /// When to try again.
        retry_after: Duration,
    },
    /// `acquire` was polled outside a tokio runtime, which it needs for its timer.
    #[error("acquire needs a tokio runtime with time enabled")]
    NoRuntime,
}

impl Error {
    /// The wait to advertise, for the variants that have one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Limited { retry_after, .. }
            | Error::QueueFull { retry_after }
            | Error::Timeout { retry_after }
            | Error::Unavailable { retry_after } => Some(*retry_after),
            Error::InsufficientCapacity { .. } | Error::Closed | Error::NoRuntime => None,
        }
    }

    /// A short machine-readable reason: `limit`, `queue_full`, `timeout`, `capacity`,
    /// `unavailable`, `closed`, `no_runtime`.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Limited { .. } => "limit",
            Error::QueueFull { .. } => "queue_full",
            Error::Timeout { .. } => "timeout",
            Error::InsufficientCapacity { .. } => "capacity",
            Error::Unavailable { .. } => "unavailable",
            Error::Closed => "closed",
            Error::NoRuntime => "no_runtime",
        }
    }
}
