//! Keys with a quota of their own on Redis: one hash per policy, `PREFIX:overrides` (field:
//! the key as stored, value: `<capacity>:<interval_ns>`), so that every gateway on the same
//! Redis and prefix shares them and they outlive every gateway.
//!
//! # Seen within a second, not read per decision
//!
//! The decision path does not read the hash: it passes the key's quota to the script as its
//! stamp, from a copy of the hash that each store reads again every [`REFRESH`] (one `HGETALL`
//! per policy per second, whatever the traffic). Reading it in the decision's script instead
//! would make each script touch a second key, which a Redis Cluster refuses unless both share
//! a slot, and a hash per key tag would no longer list the overrides in one read. So a
//! gateway sees an override another gateway set (or removed) within [`REFRESH`] plus a round
//! trip; the gateway that set it sees it at once.
//!
//! # No key gains tokens
//!
//! The key's value is the same Redis key under every quota, stamped with the quota that wrote
//! it, and every script converts a value of another stamp to its own when it reads it (see
//! `lua/stamp.lua`): tokens left after = min(tokens left before, new capacity), debt kept in
//! the new rate's time. Setting or removing an override converts the key at once (a
//! `peek` under the new quota, which writes the converted value). A gateway that has not yet
//! seen the change reads the key under the old quota and converts it back, which can only
//! lose tokens: two quotas alternating on a key never give it more than either allows.
//!
//! On a leased policy a key with a quota of its own takes its slices on that quota, and gives
//! them back under its stamp (`leased.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::RwLock;
use sluice_core::{Algorithm, AnyAlgorithm, Quota, Rate};

use crate::error::Error;
use crate::store::redis::script::Program;
use crate::store::redis::store::{Inner, RedisStore};

/// How often each store reads the overrides again.
pub const REFRESH: Duration = Duration::from_secs(1);

/// This gateway's copy of the overrides: each key's quota and the program that runs it.
#[derive(Debug, Default)]
pub(crate) struct Overrides {
    map: RwLock<HashMap<String, (Quota, Arc<Program>)>>,
}

impl Overrides {
    /// The program of `key`'s own quota, if it has one (the map is empty for most policies:
    /// one read lock, no lookup).
    pub(crate) fn program(&self, key: &str) -> Option<Arc<Program>> {
        let map = self.map.read();
        if map.is_empty() {
            return None;
        }
        map.get(key).map(|(_, p)| Arc::clone(p))
    }

    fn replace(&self, quotas: HashMap<String, Quota>, algorithm: AnyAlgorithm) {
        let mut map = self.map.write();
        let kept: HashMap<String, (Quota, Arc<Program>)> = quotas
            .into_iter()
            .filter_map(|(key, quota)| {
                let program = match map.get(&key) {
                    Some((q, p)) if *q == quota && p.algorithm().kind() == algorithm.kind() => {
                        Arc::clone(p)
                    }
                    _ => Arc::new(Program::new(&AnyAlgorithm::new(algorithm.kind(), quota)).ok()?),
                };
                Some((key, (quota, program)))
            })
            .collect();
        *map = kept;
    }
}

/// `capacity:interval_ns`, as the hash holds a quota.
fn encode(quota: Quota) -> String {
    format!("{}:{}", quota.capacity(), quota.interval_ns())
}

fn decode(text: &str) -> Option<Quota> {
    let (n, i) = text.split_once(':')?;
    let rate = Rate::from_interval_ns(i.parse().ok()?).ok()?;
    Quota::new(n.parse().ok()?, rate).ok()
}

impl Inner {
    fn overrides_key(&self) -> String {
        format!("{}:overrides", self.config.prefix)
    }

    /// Reads the hash and replaces this store's copy.
    pub(crate) async fn refresh_overrides(&self) -> Result<HashMap<String, Quota>, Error> {
        let unavailable = Error::Unavailable {
            retry_after: self.config.retry_interval,
        };
        let conn = self.health.conn.get().ok_or(unavailable)?;
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(self.overrides_key());
        let reply = tokio::time::timeout(self.config.timeout, conn.query(&cmd))
            .await
            .map_err(|_| unavailable)?
            .map_err(|_| unavailable)?;
        let quotas = parse_hash(&reply);
        self.overrides
            .replace(quotas.clone(), self.settings().program.algorithm());
        Ok(quotas)
    }
}

fn parse_hash(reply: &redis::Value) -> HashMap<String, Quota> {
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let mut out = HashMap::new();
    match reply {
        redis::Value::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, v] = pair {
                    if let (Some(k), Some(q)) = (text(k), text(v).as_deref().and_then(decode)) {
                        out.insert(k, q);
                    }
                }
            }
        }
        redis::Value::Map(items) => {
            for (k, v) in items {
                if let (Some(k), Some(q)) = (text(k), text(v).as_deref().and_then(decode)) {
                    out.insert(k, q);
                }
            }
        }
        _ => {}
    }
    out
}

impl RedisStore {
    /// Whether the scripts can run `quota` under this store's algorithm, as a key's own.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`](crate::store::RedisStoreError::Unsupported) for a
    /// window or capacity the scripts cannot compute exactly.
    pub fn supports_quota(&self, quota: Quota) -> Result<(), crate::store::RedisStoreError> {
        Program::new(&AnyAlgorithm::new(self.algorithm().kind(), quota)).map(drop)
    }

    /// Sets `key`'s own quota (`None`: removes it) in Redis, for every gateway on this Redis
    /// and prefix, and converts the key's value to it at once (see the module docs: no key
    /// gains tokens). The local store of `on_error = local` takes it too. Returns the key's
    /// previous quota.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis does not answer (nothing changed then, or, if the
    /// answer was lost, the change may have been made: ask [`RedisStore::overrides`]).
    pub async fn set_override(
        &self,
        key: &str,
        quota: Option<Quota>,
    ) -> Result<Option<Quota>, Error> {
        let inner = &*self.inner;
        let unavailable = Error::Unavailable {
            retry_after: inner.config.retry_interval,
        };
        let previous = inner.refresh_overrides().await?.get(key).copied();
        let conn = inner.health.conn.get().ok_or(unavailable)?;
        let mut cmd = match quota {
            Some(q) => {
                let mut c = redis::cmd("HSET");
                c.arg(inner.overrides_key()).arg(key).arg(encode(q));
                c
            }
            None => {
                let mut c = redis::cmd("HDEL");
                c.arg(inner.overrides_key()).arg(key);
                c
            }
        };
        tokio::time::timeout(inner.config.timeout, conn.query(&cmd))
            .await
            .map_err(|_| unavailable)?
            .map_err(|_| unavailable)?;
        cmd.clear();
        inner.refresh_overrides().await?;
        if let crate::store::redis::store::Fallback::Local(local) = &inner.settings().fallback {
            let algorithm = self.algorithm();
            local.keyed().set_override(
                key.to_owned(),
                quota.map(|q| AnyAlgorithm::new(algorithm.kind(), q)),
            );
        }
        // The denials remembered were answered under the old quota.
        inner.denials.clear();
        // Converted now, under the new quota, by the script (a peek writes a converted value).
        let _ = inner.check(key, 0).await;
        Ok(previous)
    }

    /// Every key with a quota of its own, as Redis holds them now.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] when Redis does not answer.
    pub async fn overrides(&self) -> Result<Vec<(String, Quota)>, Error> {
        let mut all: Vec<(String, Quota)> =
            self.inner.refresh_overrides().await?.into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }

    /// `key`'s own quota as this gateway last read it (at most [`REFRESH`] ago).
    pub fn override_of(&self, key: &str) -> Option<Quota> {
        let map = self.inner.overrides.map.read();
        map.get(key).map(|(q, _)| *q)
    }

    /// Whether this gateway knows of any key with a quota of its own.
    pub fn has_overrides(&self) -> bool {
        !self.inner.overrides.map.read().is_empty()
    }

    /// Reads the overrides every [`REFRESH`] while the store lives.
    pub(crate) fn watch_overrides(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        runtime.spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                if inner.health.is_up() {
                    let _ = inner.refresh_overrides().await;
                }
                drop(inner);
                tokio::time::sleep(REFRESH).await;
            }
        });
    }
}
