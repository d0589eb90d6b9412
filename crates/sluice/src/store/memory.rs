//! The in-process store: a [`Keyed`] table.

use std::time::Duration;

use sluice_core::{AnyAlgorithm, Decision, Quota};

use crate::error::Error;
use crate::keyed::{queue_limits, Keyed};
use crate::limiter::AcquireOptions;
use crate::store::Store;

/// Keyed limits held in this process's memory. Clones share the table.
///
/// # Examples
///
/// ```
/// use sluice::store::{MemoryStore, Store};
/// use sluice_core::{AnyAlgorithm, Kind, Quota};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MemoryStore::new(AnyAlgorithm::new(Kind::Gcra, Quota::parse(1, "1/s")?), 1000, 0, std::time::Duration::ZERO);
/// assert!(store.check("10.0.0.1", 1).await.is_ok());
/// assert!(store.check("10.0.0.1", 1).await.is_err());
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    keyed: Keyed<String, AnyAlgorithm>,
}

impl MemoryStore {
    /// A table for at most `max_keys` keys, each with a queue of `queue_depth` waiters waiting
    /// at most `max_wait` (a depth of zero: no queue).
    pub fn new(
        algorithm: AnyAlgorithm,
        max_keys: usize,
        queue_depth: usize,
        max_wait: Duration,
    ) -> MemoryStore {
        MemoryStore {
            keyed: Keyed::builder(algorithm)
                .max_keys(max_keys)
                .queue(queue_depth, max_wait)
                .build(),
        }
    }

    /// A store over an existing table.
    pub fn from_keyed(keyed: Keyed<String, AnyAlgorithm>) -> MemoryStore {
        MemoryStore { keyed }
    }

    /// The table.
    pub fn keyed(&self) -> &Keyed<String, AnyAlgorithm> {
        &self.keyed
    }

    /// Changes the algorithm (its quota, or another algorithm), the key cap and the queue in
    /// place ([`Keyed::reconfigure`]): every key is converted under its shard's lock so that
    /// none gains tokens, and requests waiting stay queued and are admitted under the new
    /// quota. A queue depth of zero: no queue from now on (requests already waiting stay).
    /// Returns the keys converted.
    pub fn reconfigure(
        &self,
        algorithm: AnyAlgorithm,
        max_keys: usize,
        queue_depth: usize,
        max_wait: Duration,
    ) -> usize {
        let converted =
            self.keyed
                .reconfigure(algorithm, max_keys, queue_limits(queue_depth, max_wait));
        crate::store::own_quota::follow_kind(&self.keyed);
        converted
    }

    /// Gives `key` a quota of its own (`None`: the table's again), converting its state in
    /// place so that it gains no tokens ([`Keyed::set_override`]). Kept across
    /// [`MemoryStore::reconfigure`], not across a restart. Returns the key's previous quota.
    pub fn set_override(&self, key: &str, quota: Option<Quota>) -> Option<Quota> {
        crate::store::own_quota::set(&self.keyed, key, quota)
    }

    /// Every key with a quota of its own, sorted by key.
    pub fn overrides(&self) -> Vec<(String, Quota)> {
        crate::store::own_quota::list(&self.keyed)
    }

    /// The same check, without the future (the memory store never waits to check).
    ///
    /// # Errors
    ///
    /// As [`Store::check`].
    pub fn check_now(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.keyed.try_acquire(key, cost)
    }
}

impl Store for MemoryStore {
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.keyed.try_acquire(key, cost)
    }

    async fn acquire(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<Decision, Error> {
        self.keyed.acquire(key, cost, options).await
    }

    async fn peek(&self, key: &str) -> Result<Decision, Error> {
        Ok(self.keyed.peek(key))
    }

    async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        self.keyed.refund(key, cost, ago);
    }

    async fn charge(&self, key: &str, cost: u64, max_debt: u64) -> u64 {
        self.keyed.charge(key, cost, max_debt)
    }

    fn hottest(&self, n: usize) -> Vec<(String, Decision)> {
        self.keyed.hottest(n)
    }
}
