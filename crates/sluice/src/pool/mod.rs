//! The promise pool, done right: at most N tasks in flight, a bounded wait, slots that come
//! back when a task finishes, panics or is cancelled.
//!
//! [`Throttle`] layers a pool and a [`Limiter`](crate::Limiter) in one call: at most N in
//! flight *and* at most a rate of starts.

mod handle;
mod stream;
mod throttle;

pub use handle::{Pool, PoolError, PoolPermit};
pub use throttle::Throttle;
