//! Where a policy's buckets live: one enum over the stores, because
//! [`Store`] returns `impl Future` and cannot be a trait object.

use std::time::Duration;

use sluice::store::{FileStore, MemoryStore, Origin, RedisStore, Store};
use sluice::{AcquireOptions, Error};
use sluice_core::{Decision, Quota};

/// A policy's store. Clones share the state.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Backend {
    /// In this process's memory (`backend = "memory"`).
    Memory(MemoryStore),
    /// In Redis, shared by every gateway using the same Redis and prefix
    /// (`backend = "redis"`).
    Redis(RedisStore),
    /// In memory, written back to a local file and restored at start without a burst
    /// (`backend = "file"`).
    File(FileStore),
}

impl Backend {
    /// The configuration name of the store kind: `memory`, `file` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
            Backend::File(_) => "file",
        }
    }
}

impl Backend {
    /// Gives `key` (as stored) a quota of its own, `None` removing it: the store converts
    /// the key's state so that it gains no tokens, and keeps the quota with the key's state
    /// (memory: this process, across reloads; file: in the state file; Redis: in a hash every
    /// gateway on the prefix reads). Returns the key's previous quota.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis does not answer.
    pub async fn set_override(
        &self,
        key: &str,
        quota: Option<Quota>,
    ) -> Result<Option<Quota>, Error> {
        match self {
            Backend::Memory(s) => Ok(s.set_override(key, quota)),
            Backend::File(s) => Ok(s.set_override(key, quota)),
            Backend::Redis(s) => s.set_override(key, quota).await,
        }
    }

    /// Every key (as stored) with a quota of its own, sorted by key.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis does not answer.
    pub async fn overrides(&self) -> Result<Vec<(String, Quota)>, Error> {
        match self {
            Backend::Memory(s) => Ok(s.overrides()),
            Backend::File(s) => Ok(s.overrides()),
            Backend::Redis(s) => s.overrides().await,
        }
    }

    /// `key`'s own quota, if it has one (Redis: as this gateway last read it).
    pub fn override_of(&self, key: &str) -> Option<Quota> {
        use sluice_core::Algorithm as _;
        match self {
            Backend::Memory(s) => s.keyed().override_of(key).map(|a| a.quota()),
            Backend::File(s) => s.keyed().override_of(key).map(|a| a.quota()),
            Backend::Redis(s) => s.override_of(key),
        }
    }

    /// Whether any key has a quota of its own (a load, no lookup).
    pub fn has_overrides(&self) -> bool {
        match self {
            Backend::Memory(s) => s.keyed().has_overrides(),
            Backend::File(s) => s.keyed().has_overrides(),
            Backend::Redis(s) => s.has_overrides(),
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
            Backend::Redis(s) => s.check(key, cost).await,
            // Not `check_now`: after this process was stopped, the check waits for the file's
            // writer to renew its lease, and must not block the worker's thread meanwhile.
            Backend::File(s) => s.check(key, cost).await,
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
            Backend::Redis(s) => s.acquire(key, cost, options).await,
            Backend::File(s) => s.acquire(key, cost, options).await,
        }
    }

    async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        match self {
            Backend::Memory(s) => s.refund(key, cost, ago).await,
            Backend::Redis(s) => s.refund(key, cost, ago).await,
            Backend::File(s) => s.refund(key, cost, ago).await,
        }
    }

    async fn charge(&self, key: &str, cost: u64, max_debt: u64) -> u64 {
        match self {
            Backend::Memory(s) => s.charge(key, cost, max_debt).await,
            Backend::Redis(s) => s.charge(key, cost, max_debt).await,
            Backend::File(s) => s.charge(key, cost, max_debt).await,
        }
    }

    #[inline]
    async fn check_granted(&self, key: &str, cost: u64) -> Result<(Decision, Origin), Error> {
        match self {
            Backend::Memory(s) => Ok((s.check_now(key, cost)?, Origin::Store)),
            Backend::Redis(s) => s.check_granted(key, cost).await,
            Backend::File(s) => Ok((s.check_now(key, cost)?, Origin::Store)),
        }
    }

    async fn acquire_granted(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<(Decision, Origin), Error> {
        match self {
            Backend::Memory(s) => s.acquire_granted(key, cost, options).await,
            Backend::Redis(s) => s.acquire_granted(key, cost, options).await,
            Backend::File(s) => s.acquire_granted(key, cost, options).await,
        }
    }

    async fn refund_to(&self, origin: Origin, key: &str, cost: u64, ago: Duration) {
        match self {
            Backend::Memory(s) => s.refund_to(origin, key, cost, ago).await,
            Backend::Redis(s) => s.refund_to(origin, key, cost, ago).await,
            Backend::File(s) => s.refund_to(origin, key, cost, ago).await,
        }
    }

    async fn charge_to(&self, origin: Origin, key: &str, cost: u64, max_debt: u64) -> u64 {
        match self {
            Backend::Memory(s) => s.charge_to(origin, key, cost, max_debt).await,
            Backend::Redis(s) => s.charge_to(origin, key, cost, max_debt).await,
            Backend::File(s) => s.charge_to(origin, key, cost, max_debt).await,
        }
    }

    async fn peek(&self, key: &str) -> Result<Decision, Error> {
        match self {
            Backend::Memory(s) => s.peek(key).await,
            Backend::Redis(s) => s.peek(key).await,
            Backend::File(s) => s.peek(key).await,
        }
    }

    fn hottest(&self, n: usize) -> Vec<(String, Decision)> {
        match self {
            Backend::Memory(s) => s.hottest(n),
            Backend::Redis(s) => s.hottest(n),
            Backend::File(s) => s.hottest(n),
        }
    }
}

impl From<RedisStore> for Backend {
    fn from(store: RedisStore) -> Backend {
        Backend::Redis(store)
    }
}

impl From<FileStore> for Backend {
    fn from(store: FileStore) -> Backend {
        Backend::File(store)
    }
}
