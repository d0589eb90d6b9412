//! Stores: where keyed limit state lives. In memory (the default), in a local file that
//! survives restarts, or in Redis when many servers share one limit.
//!
//! Every store answers the same two questions for one key: [`Store::check`] (one atomic
//! check-and-update, never waits) and [`Store::acquire`] (waits in that key's queue).

#[cfg(feature = "file")]
pub mod file;
mod memory;
mod own_quota;
#[cfg(feature = "redis")]
pub mod redis;

#[cfg(feature = "file")]
pub use file::{FileStore, FileStoreError, FileStoreOptions};
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::{LeaseConfig, LeaseSize, OnError, RedisConfig, RedisStore, RedisStoreError};

use std::future::Future;
use std::time::Duration;

use sluice_core::Decision;

use crate::error::Error;
use crate::limiter::AcquireOptions;

/// Where an admission was granted, so that what changes it afterwards (a refund, a settled
/// charge) lands in the same state and nowhere else: a cost taken in Redis is never given
/// back to a local store that never took it, and the other way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Origin {
    /// The store itself: memory, file, or Redis (a slice of a leased key included).
    #[default]
    Store,
    /// The local store that answers while Redis does not (`OnError::Local`).
    Fallback,
    /// No store: admitted by the failure policy alone (`OnError::Allow`). Nothing took a
    /// token, so nothing is settled.
    Nowhere,
}

/// One atomic check-and-update of one key, wherever the state lives.
pub trait Store: Send + Sync + 'static {
    /// Takes `cost` for `key` now if the limit allows; never waits.
    ///
    /// # Errors
    ///
    /// [`Error::Limited`] when denied, [`Error::InsufficientCapacity`] for a cost above the
    /// capacity, [`Error::Unavailable`] when a remote store cannot answer and its policy denies.
    fn check(&self, key: &str, cost: u64) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Waits in `key`'s queue until `cost` is admitted.
    ///
    /// # Errors
    ///
    /// As [`Store::check`], plus [`Error::QueueFull`] and [`Error::Timeout`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back its place in the queue.
    fn acquire(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Gives back `cost` that [`Store::check`] or [`Store::acquire`] took for `key` `ago`
    /// (now minus the admission), for a request that will never run: another limit refused
    /// it. A refund undoes that admission and never adds capacity beyond it. Best effort: a
    /// remote store that does not answer keeps the tokens, erring on the side of the limit.
    fn refund(&self, key: &str, cost: u64, ago: Duration) -> impl Future<Output = ()> + Send;

    /// Takes `cost` for `key` now without asking: for a cost learnt after the request ran
    /// (see [`sluice_core::Algorithm::charge`]). A bucket takes all of it, going up to
    /// `max_debt` tokens beyond empty (`u64::MAX`: no cap), and the key's next requests wait
    /// for the refill that pays the debt; a window takes what it has left. Returns the part
    /// that was not taken and was forgiven (0 when all was). Best effort: a remote store that
    /// does not answer charges nothing, and the whole cost is reported forgiven.
    fn charge(&self, key: &str, cost: u64, max_debt: u64) -> impl Future<Output = u64> + Send;

    /// The limit of `key` now, consuming nothing.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when a remote store cannot answer.
    fn peek(&self, key: &str) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// [`Store::check`], also saying where the admission was granted (see [`Origin`]): a
    /// store that always decides itself answers [`Origin::Store`].
    ///
    /// # Errors
    ///
    /// As [`Store::check`].
    fn check_granted(
        &self,
        key: &str,
        cost: u64,
    ) -> impl Future<Output = Result<(Decision, Origin), Error>> + Send {
        async move { Ok((self.check(key, cost).await?, Origin::Store)) }
    }

    /// [`Store::acquire`], also saying where the admission was granted (see [`Origin`]).
    ///
    /// # Errors
    ///
    /// As [`Store::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`Store::acquire`].
    fn acquire_granted(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> impl Future<Output = Result<(Decision, Origin), Error>> + Send {
        async move { Ok((self.acquire(key, cost, options).await?, Origin::Store)) }
    }

    /// [`Store::refund`] of an admission granted at `origin`: given back there, or nowhere
    /// when that state cannot be reached now (counted by the stores that have more than one).
    fn refund_to(
        &self,
        origin: Origin,
        key: &str,
        cost: u64,
        ago: Duration,
    ) -> impl Future<Output = ()> + Send {
        async move {
            if origin == Origin::Store {
                self.refund(key, cost, ago).await;
            }
        }
    }

    /// [`Store::charge`] of an admission granted at `origin`: taken there, or nowhere (and
    /// reported forgiven) when that state cannot be reached now.
    fn charge_to(
        &self,
        origin: Origin,
        key: &str,
        cost: u64,
        max_debt: u64,
    ) -> impl Future<Output = u64> + Send {
        async move {
            if origin == Origin::Store {
                self.charge(key, cost, max_debt).await
            } else {
                cost
            }
        }
    }

    /// Up to `n` keys with the fewest tokens left, as far as this process can see.
    fn hottest(&self, n: usize) -> Vec<(String, Decision)>;
}
