//! What the queue answers: what it did with an offered request ([`Offer`]), why it turned one
//! away ([`Rejection`]) and what became of a waiter ([`Outcome`]).
//!
//! Plain values: nothing here reads or changes a queue.

use crate::decision::Decision;
use crate::queue::Ticket;

/// Why a request was turned away at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Admission needs no wait but the limit says no, and there is no queue.
    Limited {
        /// The decision, with its `retry_after_ns`.
        decision: Decision,
    },
    /// The queue is at its depth limit.
    QueueFull {
        /// Predicted nanoseconds until this cost could be admitted.
        retry_after_ns: u64,
    },
    /// The predicted wait exceeds the maximum wait.
    Timeout {
        /// Predicted nanoseconds until this cost could be admitted.
        retry_after_ns: u64,
    },
    /// The cost exceeds the capacity; it can never be admitted.
    InsufficientCapacity {
        /// The cost asked for.
        cost: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The queue was closed.
    Closed,
}

impl Rejection {
    /// The wait to advertise in `Retry-After`, if any.
    pub const fn retry_after_ns(&self) -> Option<u64> {
        match self {
            Rejection::Limited { decision } => Some(decision.retry_after_ns),
            Rejection::QueueFull { retry_after_ns } | Rejection::Timeout { retry_after_ns } => {
                Some(*retry_after_ns)
            }
            Rejection::InsufficientCapacity { .. } | Rejection::Closed => None,
        }
    }
}

/// What [`WaitQueue::offer`] did with a request.
///
/// [`WaitQueue::offer`]: super::WaitQueue::offer
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Admitted at once; its cost is consumed.
    Admitted(Decision),
    /// Waiting; expect an [`Outcome`] for `ticket` from a later [`WaitQueue::poll`].
    ///
    /// [`WaitQueue::poll`]: super::WaitQueue::poll
    Queued {
        /// The request's claim.
        ticket: Ticket,
        /// Predicted nanoseconds until admission.
        wait_ns: u64,
    },
    /// Turned away.
    Rejected(Rejection),
}

/// What became of a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; its cost is consumed.
    Admitted(Decision),
    /// Its deadline passed first.
    TimedOut {
        /// Predicted nanoseconds it would still have had to wait.
        retry_after_ns: u64,
    },
    /// The queue was closed.
    Closed,
}
