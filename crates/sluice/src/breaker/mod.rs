//! A circuit breaker: closed, open and half-open over a window of failures and slow calls.
//!
//! [`CircuitBreaker`] judges the last N calls ([`count_window`](BreakerBuilder::count_window))
//! or the calls of the last T ([`time_window`](BreakerBuilder::time_window)). Once the window
//! holds at least [`min_calls`](BreakerBuilder::min_calls) calls and the failure rate, or the
//! share of calls slower than a threshold, reaches its limit, the breaker opens: calls are
//! rejected with [`Open`] and a `retry_after` for the [wait](BreakerBuilder::open_for). Then
//! it turns half-open and admits a bounded number of probes: all succeeding closes it, one
//! failing opens it again.
//!
//! [`CircuitBreaker::call`] wraps a future; [`CircuitBreaker::try_acquire`] hands out a
//! [`BreakerPermit`] to record by hand. A permit dropped without a record is a cancelled call,
//! which counts neither as a failure nor as a success.
//!
//! Time is `tokio::time::Instant`: `tokio::time::pause()` and `advance()` drive the breaker in
//! tests.
//!
//! # Metrics
//!
//! Registered once per breaker (install the recorder before building it), labelled `breaker`
//! with its [name](BreakerBuilder::name):
//!
//! | name | kind | labels |
//! |------|------|--------|
//! | `sluice_breaker_state` | gauge | `breaker`; 0 closed, 1 half-open, 2 open |
//! | `sluice_breaker_transitions_total` | counter | `breaker`, `from`, `to` (`closed`, `open`, `half_open`) |
//! | `sluice_breaker_rejections_total` | counter | `breaker` |
//! | `sluice_breaker_calls_total` | counter | `breaker`, `outcome` (`success`, `failure`, `cancelled`) |
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use sluice::breaker::{BreakerState, CircuitBreaker};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let breaker = CircuitBreaker::builder()
//!     .name("search")
//!     .time_window(Duration::from_secs(10))
//!     .min_calls(5)
//!     .failure_rate(0.5)
//!     .slow_calls(Duration::from_millis(500), 0.5)
//!     .open_for(Duration::from_secs(1))
//!     .half_open_probes(1)
//!     .build()?;
//!
//! for _ in 0..5 {
//!     // Each call takes 600 ms: slow, though it succeeds.
//!     let _ = breaker
//!         .call(async {
//!             tokio::time::sleep(Duration::from_millis(600)).await;
//!             Ok::<_, ()>(())
//!         })
//!         .await;
//! }
//! assert_eq!(breaker.state(), BreakerState::Open);
//!
//! tokio::time::advance(Duration::from_secs(1)).await;
//! let probe = breaker.try_acquire()?;
//! probe.record_success();
//! assert_eq!(breaker.state(), BreakerState::Closed);
//! # Ok(())
//! # }
//! ```

mod circuit;
mod config;
mod error;
mod machine;
mod metrics;
mod permit;
mod shared;
mod window;

pub use circuit::CircuitBreaker;
pub use config::{BreakerBuilder, InvalidBreakerConfig};
pub use error::{BreakerError, Open};
pub use machine::BreakerState;
pub use permit::BreakerPermit;
pub use window::WindowStats;
