//! What a breaker's caller can get back: a rejection, or the call's own error.

use std::time::Duration;

/// The breaker rejected the call without running it.
///
/// `retry_after` is when to come back: the rest of the open wait, or, when half-open with every
/// probe taken, the whole open wait (an upper bound: the probes may close the breaker sooner).
/// It is meant to feed a `Retry-After` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker is open; retry after {retry_after:?}")]
pub struct Open {
    /// How long until the breaker may admit a call again.
    pub retry_after: Duration,
}

/// The error of [`CircuitBreaker::call`](super::CircuitBreaker::call): a rejection, or the
/// call's own error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BreakerError<E> {
    /// The breaker rejected the call without running it.
    #[error("circuit breaker is open; retry after {retry_after:?}")]
    Open {
        /// How long until the breaker may admit a call again (see [`Open`]).
        retry_after: Duration,
    },
    /// The call ran and failed with this error.
    #[error(transparent)]
    Inner(E),
}

impl<E> BreakerError<E> {
    /// The call's own error, if it ran.
    pub fn into_inner(self) -> Option<E> {
        match self {
            BreakerError::Inner(error) => Some(error),
            BreakerError::Open { .. } => None,
        }
    }

    /// Whether the breaker rejected the call.
    pub fn is_open(&self) -> bool {
        matches!(self, BreakerError::Open { .. })
    }
}

impl<E> From<Open> for BreakerError<E> {
    fn from(open: Open) -> BreakerError<E> {
        BreakerError::Open {
            retry_after: open.retry_after,
        }
    }
}
