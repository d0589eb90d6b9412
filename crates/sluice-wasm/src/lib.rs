//! # sluice-wasm
//!
//! sluice-core compiled to WebAssembly for the browser's Service Worker, so that the browser
//! and the gateway apply the very same algorithm and queue policy.
//!
//! No wasm-bindgen: the module imports nothing and exports a small `extern "C"` API of numbers
//! (`sluice_create`, `sluice_offer`, `sluice_poll`, `sluice_cancel`, `sluice_snapshot`,
//! `sluice_restore`, ...), wrapped by a few lines of JavaScript in `web/sw.js`. Results too
//! large for a return value are read from buffers in linear memory. The ABI is documented in
//! `web/README.md`.
//!
//! The exports are a thin layer over [`Limiter`] (sluice-core's
//! [`driven::Limiter`](sluice_core::driven::Limiter)), safe Rust that is tested natively: one
//! bucket of any [`Kind`](sluice_core::Kind) and a fair wait queue
//! ([`sluice_core::queue::WaitQueue`]) in front of it. The queue decides who goes next and
//! when to wake; JavaScript keeps only the promise callbacks and one timer.
//!
//! ```
//! use sluice_core::queue::{Priority, QueueConfig};
//! use sluice_core::{Kind, Quota};
//! use sluice_wasm::{record, Limiter, Verdict};
//!
//! let queue = QueueConfig { depth: 100, max_wait_ns: 10_000_000_000 };
//! let mut tab_limiter = Limiter::new(Kind::TokenBucket, Quota::parse(10, "1/s").unwrap(), queue);
//! for _ in 0..10 {
//!     assert!(matches!(tab_limiter.offer(0, 1, 1, Priority::Normal, None), Verdict::Admitted { .. }));
//! }
//! // Persisted as numbers, restored by a restarted worker whose clock starts again at 0,
//! // two seconds of wall-clock time later: two tokens, not ten.
//! let mut numbers = Vec::new();
//! record::encode(&tab_limiter.snapshot(0, 1_700_000_000_000), &mut numbers);
//! let mut restarted = Limiter::new(Kind::TokenBucket, Quota::parse(10, "1/s").unwrap(), queue);
//! restarted.restore(&record::decode(&numbers).unwrap(), 0, 1_700_000_002_000).unwrap();
//! assert_eq!(restarted.status(0).remaining, 2);
//! ```
#![no_std]

extern crate alloc;
// Natively (unit tests, docs, clippy) std supplies the allocator and panic handler; the code
// itself uses core and alloc only, as on wasm32.
#[cfg(not(target_arch = "wasm32"))]
extern crate std;

pub mod codes;
pub mod record;

#[cfg(target_arch = "wasm32")]
pub mod ffi;

pub use sluice_core::driven::{
    Busy, Delivered, Delivery, Limiter, Reason, RestoreError, Status, Verdict,
};
