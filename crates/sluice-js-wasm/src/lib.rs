//! # sluice-js-wasm
//!
//! sluice-core compiled to WebAssembly for the npm package `sluice-limits`
//! (`packages/sluice-js`): the same exact algorithms and wait queue as the Rust crates, driven
//! from JavaScript with integer nanoseconds.
//!
//! Unlike `sluice-wasm` (one limiter per Service Worker, milliseconds as `f64`), one instance
//! holds any number of limiters in a [`Bank`], addressed by a small integer handle, and every
//! time crosses the boundary as an `i64` count of nanoseconds (a JavaScript `BigInt`), so no
//! float ever accumulates time. Each limiter is sluice-core's
//! [`driven::Limiter`](sluice_core::driven::Limiter), the one the Service Worker's module
//! runs too, with a single flow. The `extern "C"` layer (`ffi`, wasm32 only) converts numbers;
//! everything it calls is safe Rust, tested natively.
//!
//! ```
//! use sluice_core::queue::{Priority, QueueConfig};
//! use sluice_core::{Kind, Quota};
//! use sluice_js_wasm::{Bank, Delivery, Verdict};
//!
//! let mut bank = Bank::default();
//! let queue = QueueConfig { depth: 10, max_wait_ns: 5_000_000_000 };
//! let h = bank.create(Kind::TokenBucket, Quota::parse(1, "1/s").unwrap(), queue);
//! let l = bank.get_mut(h).unwrap();
//! assert!(matches!(l.offer(0, 1, 0, Priority::Normal, None), Verdict::Admitted { .. }));
//! let Verdict::Queued { ticket, wait_ns } = l.offer(0, 1, 0, Priority::Normal, None) else {
//!     panic!("expected to wait");
//! };
//! assert_eq!(wait_ns, 1_000_000_000);
//! assert_eq!(l.poll(0), Some(1_000_000_000));
//! assert_eq!(l.poll(1_000_000_000), None);
//! assert_eq!(l.outcomes()[0].ticket, ticket);
//! assert_eq!(l.outcomes()[0].delivery, Delivery::Admitted);
//! ```
#![no_std]

extern crate alloc;
#[cfg(not(target_arch = "wasm32"))]
extern crate std;

mod bank;
mod key_hash;

#[cfg(target_arch = "wasm32")]
pub mod ffi;

pub use bank::Bank;
pub use key_hash::key_hash;
pub use sluice_core::driven::{Delivered, Delivery, Limiter, Reason, Status, Verdict};
