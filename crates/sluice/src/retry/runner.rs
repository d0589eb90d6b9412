//! The [`Retry`] combinator: runs an async operation until it succeeds, fails for good, or the
//! backoff, the time or the budget runs out.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use tokio::time::Instant;

use super::backoff::Backoff;
use super::budget::RetryBudget;
use super::classify::{Classify, Outcome, RetryErrors};
use super::metrics::RetryMetrics;
use super::report::{RetryReport, Stop};

/// The `retry` label of a `Retry` that was not named.
const DEFAULT_NAME: &str = "default";

/// Retries an async operation with [`Backoff`], honouring server-given waits, within an
/// optional [`RetryBudget`].
///
/// A [`Classify`] decides what each result means: [`RetryErrors`] (the default) retries every
/// `Err`. When the classifier gives a `Retry-After` wait, the retry waits
/// `max(retry_after, jittered backoff)`: at least as long as the server asked (the polite
/// choice), and never less than the backoff would have waited. If that wait would end past the
/// backoff's elapsed-time limit, the retry is not made and the last result is returned.
///
/// Waits use `tokio::time::sleep`, so `tokio::time::pause()` drives them in tests.
///
/// # Metrics
///
/// `sluice_retries_total{retry, outcome}`, `sluice_retry_runs_total{retry, outcome}` and
/// `sluice_retry_delay_seconds{retry}`, through the `metrics` facade (see the
/// [module docs](super)). The `retry` label is the [name](Retry::with_name), `default` until one
/// is given. The handles are registered on the first run (clones share them): install the
/// recorder before that.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::retry::{Backoff, Retry};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let retry = Retry::new(Backoff::new(Duration::from_millis(10), Duration::from_secs(1)));
/// let value = retry
///     .run(|attempt| async move {
///         if attempt < 3 { Err("not yet") } else { Ok(attempt) }
///     })
///     .await;
/// assert_eq!(value, Ok(3));
/// # }
/// ```
pub struct Retry<C = RetryErrors> {
    backoff: Backoff,
    classify: C,
    budget: Option<RetryBudget>,
    rng: RngSource,
    metrics: Arc<LazyMetrics>,
}

/// The metric handles, registered on first use so that a `Retry` renamed before use, or
/// never used, adds no series.
#[derive(Debug)]
struct LazyMetrics {
    name: String,
    handles: OnceLock<RetryMetrics>,
}

/// Where the jitter comes from.
#[derive(Clone)]
enum RngSource {
    /// `rand::rng()`, the thread-local generator.
    Thread,
    /// One generator shared by all clones, for reproducible schedules.
    Shared(Arc<Mutex<dyn RngCore + Send>>),
}

// === impl LazyMetrics ===

impl LazyMetrics {
    fn new(name: &str) -> LazyMetrics {
        LazyMetrics {
            name: name.to_owned(),
            handles: OnceLock::new(),
        }
    }

    fn get(&self) -> &RetryMetrics {
        self.handles.get_or_init(|| RetryMetrics::new(&self.name))
    }
}

// === impl Retry ===

impl Retry<RetryErrors> {
    /// Retries every `Err` according to `backoff`, with thread-local randomness and no budget.
    pub fn new(backoff: Backoff) -> Retry<RetryErrors> {
        Retry {
            backoff,
            classify: RetryErrors,
            budget: None,
            rng: RngSource::Thread,
            metrics: Arc::new(LazyMetrics::new(DEFAULT_NAME)),
        }
    }
}

impl<C> Retry<C> {
    /// Uses `classify` to decide what each result means.
    pub fn with_classifier<C2>(self, classify: C2) -> Retry<C2> {
        Retry {
            backoff: self.backoff,
            classify,
            budget: self.budget,
            rng: self.rng,
            metrics: self.metrics,
        }
    }

    /// Spends retries from `budget`. Each run deposits once; each retry withdraws one, and a
    /// run whose withdrawal fails stops with [`Stop::BudgetExhausted`].
    #[must_use]
    pub fn with_budget(mut self, budget: RetryBudget) -> Retry<C> {
        self.budget = Some(budget);
        self
    }

    /// Draws jitter from `rng`, shared (under a lock) by all clones of this `Retry`.
    #[must_use]
    pub fn with_rng<R: RngCore + Send + 'static>(mut self, rng: R) -> Retry<C> {
        self.rng = RngSource::Shared(Arc::new(Mutex::new(rng)));
        self
    }

    /// Draws jitter from a [`StdRng`] seeded with `seed`: the same seed, the same schedule (for
    /// one `rand` version). For tests and simulations.
    #[must_use]
    pub fn with_seed(self, seed: u64) -> Retry<C> {
        self.with_rng(StdRng::seed_from_u64(seed))
    }

    /// Names this `Retry` in the metrics' `retry` label.
    #[must_use]
    pub fn with_name(mut self, name: &str) -> Retry<C> {
        self.metrics = Arc::new(LazyMetrics::new(name));
        self
    }

    /// The backoff policy.
    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    /// The budget, if any.
    pub fn budget(&self) -> Option<&RetryBudget> {
        self.budget.as_ref()
    }

    /// Runs `attempt` (called with the attempt number, starting at 1) until the classifier says
    /// success or failure, or the attempts, the time or the budget run out. Returns the last
    /// result.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use sluice::retry::{Backoff, Outcome, Retry};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let retry = Retry::new(Backoff::default()).with_classifier(|r: &Result<u16, ()>| match r {
    ///     Ok(503) => Outcome::retry_after(Duration::from_secs(2)),
    ///     Ok(_) => Outcome::Success,
    ///     Err(()) => Outcome::Fail,
    /// });
    /// let start = tokio::time::Instant::now();
    /// let status = retry
    ///     .run(|attempt| async move { if attempt == 1 { Ok(503) } else { Ok(200) } })
    ///     .await;
    /// assert_eq!(status, Ok(200));
    /// assert!(start.elapsed() >= Duration::from_secs(2)); // the server's wait was honoured
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// The last attempt's `Err`, unchanged, when the run stopped on one: not retryable, or no
    /// retry left. A retryable `Ok` (say a 503) that could not be retried is returned as `Ok`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops the attempt in flight or the sleep in progress, and
    /// makes no further attempt. Nothing is left locked. A budget withdrawal made for a retry
    /// whose sleep was cancelled is not refunded, so cancelling costs budget and never adds
    /// retries.
    pub async fn run<F, Fut, T, E>(&self, attempt: F) -> Result<T, E>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
    {
        self.run_with_report(attempt).await.result
    }

    /// As [`run`](Retry::run), and also tells how many attempts ran and why the run stopped.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::num::NonZeroU32;
    /// use std::time::Duration;
    /// use sluice::retry::{Backoff, Retry, Stop};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// let backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1))
    ///     .with_max_attempts(NonZeroU32::new(4).unwrap());
    /// let report = Retry::new(backoff)
    ///     .run_with_report(|_| async { Err::<(), _>("down") })
    ///     .await;
    /// assert_eq!(report.attempts, 4);
    /// assert_eq!(report.stop, Stop::AttemptsExhausted);
    /// assert_eq!(report.result, Err("down"));
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// None of its own: the report carries the last attempt's result, `Err` or not.
    ///
    /// # Cancel safety
    ///
    /// As [`run`](Retry::run).
    pub async fn run_with_report<F, Fut, T, E>(&self, mut attempt: F) -> RetryReport<T, E>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        C: Classify<T, E>,
    {
        let start = Instant::now();
        // A limit too far away to represent is no limit.
        let deadline = self
            .backoff
            .max_elapsed()
            .and_then(|limit| start.checked_add(limit));
        if let Some(budget) = &self.budget {
            budget.deposit();
        }
        let max_attempts = self.backoff.max_attempts().get();
        let mut number = 1u32;
        loop {
            let result = attempt(number).await;
            let after = match self.classify.classify(&result) {
                Outcome::Success => return self.finish(result, number, Stop::Success),
                Outcome::Fail => return self.finish(result, number, Stop::NotRetryable),
                Outcome::Retry { after } => after,
            };
            if number >= max_attempts {
                return self.give_up(result, number, Stop::AttemptsExhausted);
            }
            let jittered = self.draw(number - 1);
            let delay = after.map_or(jittered, |after| after.max(jittered));
            if let Some(deadline) = deadline {
                let now = Instant::now();
                let ends_by = |wait: Duration| now.checked_add(wait).is_some_and(|t| t <= deadline);
                if !ends_by(delay) {
                    let stop = match after {
                        Some(after) if !ends_by(after) => Stop::RetryAfterBeyondDeadline,
                        _ => Stop::DeadlineExceeded,
                    };
                    return self.give_up(result, number, stop);
                }
            }
            if let Some(budget) = &self.budget {
                if !budget.try_withdraw() {
                    return self.give_up(result, number, Stop::BudgetExhausted);
                }
            }
            self.metrics.get().retried(delay);
            drop(result);
            tokio::time::sleep(delay).await;
            number += 1;
        }
    }

    /// The jittered delay before retry `retry` (0-based).
    fn draw(&self, retry: u32) -> Duration {
        match &self.rng {
            RngSource::Thread => self.backoff.delay(retry, &mut rand::rng()),
            RngSource::Shared(rng) => self.backoff.delay(retry, &mut *rng.lock()),
        }
    }

    fn give_up<T, E>(&self, result: Result<T, E>, attempts: u32, stop: Stop) -> RetryReport<T, E> {
        self.metrics.get().declined(stop);
        self.finish(result, attempts, stop)
    }

    fn finish<T, E>(&self, result: Result<T, E>, attempts: u32, stop: Stop) -> RetryReport<T, E> {
        self.metrics.get().finished(stop);
        RetryReport {
            result,
            attempts,
            stop,
        }
    }
}

impl<C: Clone> Clone for Retry<C> {
    fn clone(&self) -> Self {
        Retry {
            backoff: self.backoff,
            classify: self.classify.clone(),
            budget: self.budget.clone(),
            rng: self.rng.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

impl<C> fmt::Debug for Retry<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("backoff", &self.backoff)
            .field("budget", &self.budget)
            .field(
                "rng",
                &match self.rng {
                    RngSource::Thread => "thread",
                    RngSource::Shared(_) => "shared",
                },
            )
            .finish_non_exhaustive()
    }
}
