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
pub use builder::Builder;
pub use handle::Limiter;
