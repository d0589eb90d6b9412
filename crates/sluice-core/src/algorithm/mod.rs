//! The algorithms, each a pure step `(state, now, cost) -> Decision` over a state the caller keeps.
//!
//! | config name      | type              | state             | guarantee over any window of length T |
//! |------------------|-------------------|-------------------|----------------------------------------|
//! | `token_bucket`   | [`TokenBucket`]   | 2 × u64           | at most capacity + rate·T              |
//! | `gcra`           | [`Gcra`]          | 1 × u64           | same admissions as `token_bucket`      |
//! | `leaky_bucket`   | [`LeakyBucket`]   | 2 × u64           | at most capacity + rate·T (nginx `limit_req`) |
//! | `sliding_log`    | [`SlidingLog`]    | one entry per admission | at most N in any window W (exact) |
//! | `sliding_window` | [`SlidingWindow`] | 3 × u64           | at most N per aligned window, below 2N in any window W |
//! | `fixed_window`   | [`FixedWindow`]   | 2 × u64           | at most N per aligned window, at most 2N in any window W |
//!
//! For the window algorithms N is the capacity and W = capacity × interval.

mod fixed_window;
mod gcra;
mod kind;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
mod step;
mod token_bucket;

pub use fixed_window::{FixedWindow, FixedWindowState};
pub use gcra::{Advance, Gcra};
pub use kind::{Kind, UnknownKind};
pub use leaky_bucket::{LeakyBucket, LeakyBucketState};
pub use sliding_log::{SlidingLog, SlidingLogState};
pub use sliding_window::{SlidingWindow, SlidingWindowState};
pub use step::{Algorithm, SavedState, MAX_TIME_NS};
pub use token_bucket::{TokenBucket, TokenBucketState};
