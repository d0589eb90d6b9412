//! # sluice
//!
//! Async traffic control for tokio, over the exact algorithms of [`sluice_core`].
//!
//! - [`Limiter`]: a rate limiter with `try_acquire` (never waits) and `acquire` (waits in a
//!   fair, bounded FIFO queue with a maximum wait and priorities).
//! - [`Pool`]: at most N tasks in flight (the promise pool), with the same queue bound.
//! - [`Keyed`]: one limit per key (user, IP), with a hard cap on keys and idle eviction.
//! - [`retry`]: exponential backoff with full jitter, honouring `Retry-After`, with a budget.
//! - [`breaker`]: a circuit breaker over failures and slow calls.
//! - `jobs` (feature `redis`): durable jobs on Redis Streams under the same limits, shared by
//!   Rust and Node workers.
#![forbid(unsafe_code)]

pub mod breaker;
pub mod cell;
pub mod clock;
mod error;
#[cfg(feature = "redis")]
pub mod jobs;
pub mod keyed;
pub mod limiter;
mod metrics;
pub mod pool;
pub mod retry;
pub mod store;

#[cfg(feature = "quanta")]
pub use clock::QuantaClock;
pub use clock::{Clock, ManualClock, TokioClock};
pub use error::Error;
pub use keyed::{Keyed, KeyedBuilder};
pub use limiter::{Acquire, AcquireOptions, Limiter};
pub use metrics::describe as describe_metrics;
pub use pool::{Pool, PoolError, PoolPermit, Throttle};
pub use sluice_core::queue::Priority;
