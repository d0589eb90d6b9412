//! One limit per key (user, IP, API token), with a hard cap on keys and idle eviction.
//!
//! Keys live in a sharded hash table of plain algorithm states (8 bytes a key for GCRA, plus
//! the key), sized up front for the cap, hashed with aHash under a random key of its own
//! so that clients cannot choose keys that collide. A key whose bucket is full again carries
//! no information, so idle keys are dropped first when room is needed. Only when none is idle
//! is a busy key dropped, the one closest to idle, and a small record keeps the key and when
//! it would have been idle: it comes back no fuller than it left. A key with waiters is never
//! dropped.
//!
//! Waiting is per key: a key that must queue gets a [`Limiter`](crate::Limiter) of its own over
//! the same table entry for as long as anyone waits on it.
//!
//! # One owner
//!
//! The table owns every key's state, the records of evicted keys and the floor (a bound on
//! every key it does not hold, after a crash). [`Keyed::reconfigure`] changes the quota, the
//! key cap and the queue in place: each shard's states, records and floor are converted under
//! that shard's lock, so that no key gains tokens, and the queues of waiting keys stay where
//! they are and plan with the new quota. No second table ever admits beside the first.

mod builder;
mod cell;
mod follow;
mod map;
mod overrides;
mod reconfigure;
mod room;
mod saved;
mod shard;
mod waiting;

pub(crate) use builder::queue_limits;
pub use builder::KeyedBuilder;
pub use map::{Key, Keyed};
pub use saved::Saved;
