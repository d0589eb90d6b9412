//! Retrying with exponential backoff, full jitter, `Retry-After` and a retry budget.
//!
//! - [`Backoff`]: the policy. The delay before retry `n` is drawn from
//!   `[0, min(cap, base × 2^n)]` ("full jitter"), within a maximum number of attempts and a
//!   maximum elapsed time. It takes the random number generator as an argument, so a seeded one
//!   gives a schedule known in advance.
//! - [`RetryAfter`]: the HTTP `Retry-After` header, delay-seconds or HTTP-date.
//! - [`RetryBudget`]: retries as a fraction of recent requests plus a floor, so that a failing
//!   service does not see its load multiplied by retries.
//! - [`Retry`]: the combinator. `retry.run(|attempt| async { .. }).await` runs the operation
//!   until a [`Classify`] says it succeeded or failed for good, or the attempts, the time or the
//!   budget run out, and returns the last result. A server-given wait is honoured: the retry
//!   waits `max(retry_after, jittered backoff)`, and gives up if that passes the time limit.
//!
//! # Metrics
//!
//! Registered on the first run of a [`Retry`] (install the recorder before that), labelled with
//! its [name](Retry::with_name):
//!
//! | name | kind | labels |
//! |------|------|--------|
//! | `sluice_retries_total` | counter | `retry`, `outcome`: `retried`, or the [`Stop`] that prevented the retry |
//! | `sluice_retry_runs_total` | counter | `retry`, `outcome`: the [`Stop`] of the run |
//! | `sluice_retry_delay_seconds` | histogram | `retry` |
//!
//! Every wait is a `tokio::time::sleep` and every clock read a `tokio::time::Instant`, so
//! `tokio::time::pause()` makes tests exact and instant.
//!
//! ```
//! use std::num::NonZeroU32;
//! use std::time::Duration;
//! use sluice::retry::{Backoff, Retry, RetryBudget, Stop};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2))
//!     .with_max_attempts(NonZeroU32::new(5).unwrap())
//!     .with_max_elapsed(Duration::from_secs(10));
//! let budget = RetryBudget::new(Duration::from_secs(10), 5, 0.2)?;
//! let retry = Retry::new(backoff).with_budget(budget).with_name("inventory");
//!
//! let report = retry
//!     .run_with_report(|attempt| async move {
//!         if attempt < 3 { Err("connection reset") } else { Ok("stock: 7") }
//!     })
//!     .await;
//! assert_eq!(report.result, Ok("stock: 7"));
//! assert_eq!((report.attempts, report.stop), (3, Stop::Success));
//! # Ok(())
//! # }
//! ```

mod backoff;
mod budget;
mod classify;
mod metrics;
mod report;
mod retry_after;
mod runner;

pub use backoff::{Backoff, Delays, Jitter};
pub use budget::{InvalidBudget, RetryBudget};
pub use classify::{Classify, Outcome, RetryErrors};
pub use report::{RetryReport, Stop};
pub use retry_after::{InvalidRetryAfter, RetryAfter};
pub use runner::Retry;
