//! What a retry run returns: the last result, the attempt count and why it stopped.

use std::fmt;

/// Why a [`Retry`](super::Retry) run stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Stop {
    /// The classifier said [`Outcome::Success`](super::Outcome::Success).
    Success,
    /// The classifier said [`Outcome::Fail`](super::Outcome::Fail).
    NotRetryable,
    /// The last allowed attempt failed.
    AttemptsExhausted,
    /// The next retry would have started past the elapsed-time limit.
    DeadlineExceeded,
    /// The server's `Retry-After` alone would have ended past the elapsed-time limit.
    RetryAfterBeyondDeadline,
    /// The retry budget had no retry left.
    BudgetExhausted,
}

/// The result of [`Retry::run_with_report`](super::Retry::run_with_report): the last result,
/// and how the run went.
#[derive(Debug)]
pub struct RetryReport<T, E> {
    /// The last attempt's result.
    pub result: Result<T, E>,
    /// How many attempts ran, the first one included.
    pub attempts: u32,
    /// Why the run stopped.
    pub stop: Stop,
}

// === impl Stop ===

impl Stop {
    /// Every reason, in declaration order.
    pub(crate) const ALL: [Stop; 6] = [
        Stop::Success,
        Stop::NotRetryable,
        Stop::AttemptsExhausted,
        Stop::DeadlineExceeded,
        Stop::RetryAfterBeyondDeadline,
        Stop::BudgetExhausted,
    ];

    /// The position in [`Stop::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The metrics label: `success`, `not_retryable`, `attempts_exhausted`,
    /// `deadline_exceeded`, `retry_after_beyond_deadline` or `budget_exhausted`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Stop::Success => "success",
            Stop::NotRetryable => "not_retryable",
            Stop::AttemptsExhausted => "attempts_exhausted",
            Stop::DeadlineExceeded => "deadline_exceeded",
            Stop::RetryAfterBeyondDeadline => "retry_after_beyond_deadline",
            Stop::BudgetExhausted => "budget_exhausted",
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
