//! `sluice simulate`: what would this policy do with this traffic?
//!
//! A policy of a gateway configuration is replayed against a trace file ([`trace`]) or a
//! synthetic pattern ([`pattern`]) on a virtual clock: no network, no sleeping, a 30-minute
//! load in milliseconds. The [`engine`] drives the very algorithm ([`sluice_core::AnyAlgorithm`])
//! and wait queue ([`sluice_core::queue::WaitQueue`]) that the gateway runs, so the admissions,
//! denials and queue waits it reports are the gateway's. [`report`] sums them up and [`svg`]
//! draws the bucket level and offered versus admitted requests.
//!
//! ```
//! use sluice_core::{queue::QueueConfig, AnyAlgorithm, Kind, Quota};
//! use sluice_server::simulate::{engine::Engine, pattern::Pattern, report::Summary};
//!
//! // capacity 10 at 5/s, no queue; 10 requests per second for 10 s.
//! let algorithm = AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(10, "5/s").unwrap());
//! let pattern = Pattern::parse("constant 10/s for 10s").unwrap();
//! let arrivals = pattern.arrivals(1).unwrap();
//! let run = Engine::new(algorithm, QueueConfig::NONE, false).run(&arrivals, pattern.duration_ns());
//! let summary = Summary::new(&run, &arrivals, pattern.duration_ns());
//! // The burst of 10, then one token every 200 ms: 10 + 5 × 9.9 s = 59.5, so 59.
//! assert_eq!((summary.offered, summary.admitted), (100, 59));
//! ```

pub mod arrival;
mod cmd;
pub mod engine;
pub mod pattern;
pub mod report;
pub mod svg;
pub mod trace;

pub use cmd::{run, Args};
