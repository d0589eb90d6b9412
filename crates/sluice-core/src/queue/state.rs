//! Where the limiter state lives ([`StateAccess`]): the queue checks it and copies it through
//! this trait, and never holds it.
//!
//! Knows nothing of waiters, their order or their deadlines.

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;

/// Where the limiter state lives: in the caller's hands, or in a shared cell (an atomic) that
/// other, non-queued callers may also update.
pub trait StateAccess<A: Algorithm> {
    /// Runs one check on the live state.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::check`].
    fn check(&mut self, algorithm: &A, now: u64, cost: u64) -> Result<Decision, CheckError>;

    /// A copy of the live state, for predictions.
    fn load(&self) -> A::State;
}

/// [`StateAccess`] over a state the caller owns outright.
#[derive(Debug)]
pub struct Owned<'a, S>(pub &'a mut S);

impl<A, S> StateAccess<A> for Owned<'_, S>
where
    A: Algorithm<State = S>,
    S: Clone + core::fmt::Debug + PartialEq,
{
    fn check(&mut self, algorithm: &A, now: u64, cost: u64) -> Result<Decision, CheckError> {
        algorithm.check(self.0, now, cost)
    }

    fn load(&self) -> S {
        self.0.clone()
    }
}
