//! # sluice-core
//!
//! The algorithm core of sluice: exact rate-limiting algorithms as pure steps, with no clock,
//! no I/O and no allocation beyond the sliding log. The same code decides in a Rust service,
//! in the `sluice` gateway and, compiled to WebAssembly, in a browser Service Worker.
//!
//! - [`Quota`]: capacity (burst) and [`Rate`], parsed from what users write (`"5/s"`,
//!   `"10 per 90s"`), validated so that no bad quota can exist.
//! - [`Algorithm`]: `check(&mut state, now_ns, cost) -> Decision`, implemented by
//!   [`TokenBucket`], [`Gcra`], [`LeakyBucket`], [`SlidingLog`], [`SlidingWindow`] and
//!   [`FixedWindow`], and by [`AnyAlgorithm`] to choose by name.
//! - [`Decision`]: allowed, limit, remaining, `retry_after`, `reset_after`.
//! - [`Snapshot`]: save and restore across restarts, counting the time in between;
//!   [`SavedState::convert`] carries a state over to a changed quota without a key gaining tokens.
//! - [`queue::WaitQueue`]: the waiting policy (FIFO, priorities, fair flows, depth, maximum
//!   wait) as a clock-free state machine that tokio, the browser and the simulator all drive.
//! - [`driven::Limiter`]: a bucket with its wait queue in front, driven by calls that carry the
//!   time: what the WebAssembly builds for the Service Worker and the npm package expose.
//!
//! ```
//! use sluice_core::{Algorithm, Quota, TokenBucket};
//!
//! let bucket = TokenBucket::new(Quota::parse(10, "5/s")?);
//! let mut state = bucket.initial_state();
//! let mut now = 0u64; // nanoseconds, from any monotonic clock
//! for _ in 0..10 {
//!     assert!(bucket.check(&mut state, now, 1)?.allowed); // the burst
//! }
//! let denied = bucket.check(&mut state, now, 1)?;
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_after_ns, 200_000_000); // one token every 200 ms
//! now += denied.retry_after_ns;
//! assert!(bucket.check(&mut state, now, 1)?.allowed);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![no_std]
#![forbid(unsafe_code)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

pub mod algorithm;
mod any;
mod convert;
mod decision;
mod divisor;
pub mod driven;
mod error;
pub mod queue;
mod quota;
mod snapshot;

pub use algorithm::{
    Advance, Algorithm, FixedWindow, FixedWindowState, Gcra, Kind, LeakyBucket, LeakyBucketState,
    SavedState, SlidingLog, SlidingLogState, SlidingWindow, SlidingWindowState, TokenBucket,
    TokenBucketState, UnknownKind, MAX_TIME_NS,
};
pub use any::{AnyAlgorithm, AnyState};
pub use decision::Decision;
pub use error::{CheckError, QuotaError, SnapshotError};
pub use quota::{format_duration_ns, Quota, Rate, MAX_SPAN_NS, NANOS_PER_SEC};
pub use snapshot::{Snapshot, FORMAT_VERSION};
