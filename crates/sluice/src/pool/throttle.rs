//! A pool and a limiter in one call: at most N in flight and at most a rate of starts.

use std::future::Future;

use crate::cell::{LocalAlgorithm, StateCell};
use crate::clock::Clock;
use crate::error::Error;
use crate::limiter::Limiter;
use crate::pool::handle::Pool;

/// At most `pool.size()` tasks in flight, started no faster than `limiter` allows.
///
/// The slot is taken first and the rate token second, while holding the slot: taking the
/// token first would let tokens pile up while the pool is busy, and the tasks would then start
/// in a burst above the rate when slots free up.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::{Limiter, Pool, Throttle};
/// use sluice_core::{Quota, TokenBucket};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // At most 5 in flight, at most 20 per minute.
/// let throttle = Throttle::new(
///     Pool::with_size(5)?,
///     Limiter::new(TokenBucket::new(Quota::parse(20, "20/min")?)),
/// );
/// let answer = throttle.run(1, async { 42 }).await?;
/// assert_eq!(answer, 42);
/// # Ok(())
/// # }
/// ```
pub struct Throttle<A: LocalAlgorithm, C: Clock, X: StateCell<A> = <A as LocalAlgorithm>::Cell> {
    pool: Pool,
    limiter: Limiter<A, C, X>,
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Clone for Throttle<A, C, X> {
    fn clone(&self) -> Self {
        Throttle {
            pool: self.pool.clone(),
            limiter: self.limiter.clone(),
        }
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> std::fmt::Debug for Throttle<A, C, X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Throttle")
            .field("pool", &self.pool)
            .field("limiter", &self.limiter)
            .finish()
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Throttle<A, C, X> {
    /// Both limits.
    pub fn new(pool: Pool, limiter: Limiter<A, C, X>) -> Self {
        Throttle { pool, limiter }
    }

    /// Waits for a slot, then for `cost` tokens, then runs `task`.
    ///
    /// # Errors
    ///
    /// Any error of [`Pool::acquire`] or [`Limiter::acquire`]; the task is not run then.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back the slot and the queue place (or tokens) it held.
    pub async fn run<F: Future>(&self, cost: u64, task: F) -> Result<F::Output, Error> {
        let _slot = self.pool.acquire().await?;
        self.limiter.acquire(cost).await?;
        Ok(task.await)
    }

    /// The pool.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The limiter.
    pub fn limiter(&self) -> &Limiter<A, C, X> {
        &self.limiter
    }
}
