//! Helpers of the tests that run limiters on paused tokio time.

use std::time::Duration;

use sluice_core::{Gcra, Quota};

pub const SEC: Duration = Duration::from_secs(1);

/// A GCRA of `capacity` at `rate` (`"1/s"`).
pub fn gcra(capacity: u64, rate: &str) -> Gcra {
    Gcra::new(Quota::parse(capacity, rate).unwrap())
}

/// Lets every spawned task run until it blocks, without moving paused time.
pub async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}
