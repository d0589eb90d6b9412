//! Where a policy's buckets live: one enum over the stores, because
//! [`Store`] returns `impl Future` and cannot be a trait object.

use sluice::store::{MemoryStore, Store};
use sluice::{AcquireOptions, Error};
use sluice_core::Decision;

/// A policy's store. Clones share the state.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// In this process's memory (`backend = "memory"`).
    Memory(MemoryStore),
}

impl Backend {
    /// The configuration name of the store kind: `memory`, `file` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
        }
    }
}

impl From<MemoryStore> for Backend {
    fn from(store: MemoryStore) -> Backend {
        Backend::Memory(store)
    }
}

impl Store for Backend {
    #[inline]
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        match self {
            Backend::Memory(s) => s.check_now(key, cost),
        }
    }

    async fn acquire(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<Decision, Error> {
        match self {
            Backend::Memory(s) => s.acquire(key, cost, options).await,
        }
    }

    async fn peek(&self, key: &str) -> Result<Decision, Error> {
        match self {
            Backend::Memory(s) => s.peek(key).await,
        }
    }

    fn hottest(&self, n: usize) -> Vec<(String, Decision)> {
        match self {
            Backend::Memory(s) => s.hottest(n),
        }
    }
}
