//! A rate limiter that can wait: `try_acquire` never waits, `acquire` waits its turn.
//!
//! The waiting is the core's [`WaitQueue`](sluice_core::queue::WaitQueue) policy (FIFO, no
//! barging, priorities, fair flows, depth, maximum wait) driven by one tokio task per limiter
//! that sleeps until the head of the queue can be admitted or a deadline passes: one timer,
//! however many waiters.

mod acquire;
mod builder;
mod driver;
mod handle;

pub use acquire::{Acquire, AcquireOptions};
pub(crate) use builder::duration_ns as builder_duration_ns;
pub use builder::Builder;
pub(crate) use handle::capacity_error;
pub use handle::Limiter;
