//! [`CircuitBreaker`]: the public handle over the shared state.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use super::config::{BreakerBuilder, InvalidBreakerConfig};
use super::error::{BreakerError, Open};
use super::machine::BreakerState;
use super::permit::BreakerPermit;
use super::shared::Shared;
use super::window::WindowStats;

/// A circuit breaker: stops calling a service that is failing or slow, and probes it before
/// trusting it again.
///
/// - **Closed**: calls go through and are recorded in a window (the last N calls, or the calls
///   of the last T). Once the window holds at least `min_calls` calls and the failure rate or
///   the slow-call rate reaches its threshold, the breaker opens.
/// - **Open**: calls are rejected with [`Open`], which carries `retry_after`, for `open_for`.
/// - **Half-open**: at most `half_open_probes` probe calls are admitted. When that many have
///   succeeded the breaker closes, with an empty window; the first probe that fails or is slow
///   opens it again.
///
/// Time is `tokio::time::Instant`, so `tokio::time::pause()` and `advance()` drive it in tests.
/// Clones share one breaker; the state sits under a `parking_lot` mutex held only for a few
/// arithmetic steps.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::breaker::{BreakerError, BreakerState, CircuitBreaker};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let breaker = CircuitBreaker::builder()
///     .count_window(4)
///     .min_calls(4)
///     .failure_rate(0.5)
///     .open_for(Duration::from_secs(5))
///     .build()?;
///
/// for _ in 0..2 {
///     let _ = breaker.call(async { Ok::<_, &str>("fine") }).await;
///     let _ = breaker.call(async { Err::<&str, _>("boom") }).await;
/// }
/// assert_eq!(breaker.state(), BreakerState::Open); // 2 failures of 4 calls
///
/// let rejected = breaker.call(async { Ok::<_, &str>("not run") }).await;
/// assert_eq!(rejected, Err(BreakerError::Open { retry_after: Duration::from_secs(5) }));
///
/// tokio::time::advance(Duration::from_secs(5)).await;
/// assert_eq!(breaker.state(), BreakerState::HalfOpen);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

// === impl BreakerBuilder ===

impl BreakerBuilder {
    /// Checks the settings and builds the breaker, closed.
    ///
    /// # Errors
    ///
    /// [`InvalidBreakerConfig`] naming the first bad setting: an empty window, a rate outside
    /// `(0, 1]`, a zero or unreachable minimum number of calls, or zero probes.
    pub fn build(self) -> Result<CircuitBreaker, InvalidBreakerConfig> {
        let config = self.validate()?;
        Ok(CircuitBreaker {
            shared: Arc::new(Shared::new(config)),
        })
    }
}

// === impl CircuitBreaker ===

impl CircuitBreaker {
    /// Starts building a breaker; see [`BreakerBuilder`] for the settings and their defaults.
    pub fn builder() -> BreakerBuilder {
        BreakerBuilder::new()
    }

    /// Admits a call now, or rejects it; never waits.
    ///
    /// # Errors
    ///
    /// [`Open`], with how long to wait, when the breaker is open, or half-open with every probe
    /// taken.
    pub fn try_acquire(&self) -> Result<BreakerPermit, Open> {
        let ticket = self.shared.try_acquire()?;
        Ok(BreakerPermit::new(self.shared.clone(), ticket))
    }

    /// Runs `call` if the breaker admits it, recording an `Err` as a failure and an `Ok` as a
    /// success (slow if it took at least the slow-call threshold).
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice::breaker::CircuitBreaker;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let breaker = CircuitBreaker::builder().build()?;
    /// let answer = breaker.call(async { Ok::<_, std::io::Error>(42) }).await?;
    /// assert_eq!(answer, 42);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`BreakerError::Open`] when the breaker rejected the call (it was not polled), or
    /// [`BreakerError::Inner`] with the call's own error.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `call` and records nothing: the call counts as
    /// cancelled, not failed, and a half-open probe slot it held is freed (see
    /// [`BreakerPermit`]). To count a timeout as a failure, time the call out inside:
    /// `breaker.call(async { tokio::time::timeout(limit, request).await? })`.
    pub async fn call<F, T, E>(&self, call: F) -> Result<T, BreakerError<E>>
    where
        F: Future<Output = Result<T, E>>,
    {
        self.call_classified(call, Result::is_err).await
    }

    /// As [`call`](Self::call), with `is_failure` deciding which results are failures: an `Err`
    /// that is the caller's fault (a 404) need not count, and an `Ok` carrying a 503 may.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice::breaker::{BreakerState, CircuitBreaker};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let breaker = CircuitBreaker::builder().count_window(1).min_calls(1).build()?;
    /// let server_error = |status: &Result<u16, std::io::Error>| matches!(status, Ok(500..) | Err(_));
    /// let status = breaker.call_classified(async { Ok(404) }, server_error).await?;
    /// assert_eq!((status, breaker.state()), (404, BreakerState::Closed));
    /// let status = breaker.call_classified(async { Ok(503) }, server_error).await?;
    /// assert_eq!((status, breaker.state()), (503, BreakerState::Open));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`call`](Self::call): the result's `Err` is returned as [`BreakerError::Inner`]
    /// whether or not it counted as a failure.
    ///
    /// # Cancel safety
    ///
    /// As [`call`](Self::call).
    pub async fn call_classified<F, T, E, C>(
        &self,
        call: F,
        is_failure: C,
    ) -> Result<T, BreakerError<E>>
    where
        F: Future<Output = Result<T, E>>,
        C: FnOnce(&Result<T, E>) -> bool,
    {
        let permit = self.try_acquire()?;
        let result = call.await;
        permit.record(is_failure(&result));
        result.map_err(BreakerError::Inner)
    }

    /// The state a call arriving now would meet (an open breaker whose wait is over is
    /// half-open).
    pub fn state(&self) -> BreakerState {
        self.shared.state()
    }

    /// The counts of the current window (emptied on every change of state).
    pub fn stats(&self) -> WindowStats {
        self.shared.stats()
    }

    /// The name given to the builder, the `breaker` label of the metrics.
    pub fn name(&self) -> &str {
        self.shared.name()
    }
}

impl fmt::Debug for CircuitBreaker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CircuitBreaker")
            .field("name", &self.name())
            .field("state", &self.state())
            .field("stats", &self.stats())
            .finish()
    }
}
