//! The local cache of denials: "cost c for this key is refused until T" stays true until T.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::HashMap;
use parking_lot::Mutex;
use sluice_core::Decision;

type Hasher = foldhash::fast::RandomState;

const SHARDS: usize = 32;

/// A denial as Redis gave it, kept until it expires.
#[derive(Debug, Clone, Copy)]
struct Denial {
    /// The smallest cost it holds for.
    cost: u64,
    /// When the request was sent (this process's clock).
    sent_ns: u64,
    /// `sent_ns + retry_after`: until then, Redis refuses `cost` or more.
    until_ns: u64,
    decision: Decision,
}

/// Denials by key, bounded, sharded so that callers on many cores rarely meet.
#[derive(Debug)]
pub(crate) struct DenialCache {
    hasher: Hasher,
    shards: Box<[Mutex<HashMap<String, Denial, Hasher>>]>,
    /// The bound of each shard (changed by `reset`).
    per_shard: AtomicUsize,
}

fn per_shard(max_keys: usize) -> usize {
    max_keys.div_ceil(SHARDS).max(1)
}

impl DenialCache {
    pub(crate) fn new(max_keys: usize) -> DenialCache {
        let hasher = Hasher::default();
        DenialCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::with_hasher(hasher)))
                .collect(),
            hasher,
            per_shard: AtomicUsize::new(per_shard(max_keys)),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Denial, Hasher>> {
        let h = self.hasher.hash_one(key);
        &self.shards[(h >> 59) as usize % SHARDS]
    }

    /// The denial of `cost` for `key` at `now`, if one is known: its `retry_after` counts down
    /// to the time Redis gave, its `reset_after` likewise.
    pub(crate) fn get(&self, key: &str, cost: u64, now: u64) -> Option<Decision> {
        let shard = self.shard(key).lock();
        let d = shard.get(key)?;
        if now >= d.until_ns || cost < d.cost {
            return None;
        }
        let passed = now.saturating_sub(d.sent_ns);
        let mut decision = d.decision;
        decision.retry_after_ns = d.until_ns - now;
        decision.reset_after_ns = decision.reset_after_ns.saturating_sub(passed);
        Some(decision)
    }

    /// Remembers that Redis refused `cost` for `key`, asked at `sent_ns`.
    pub(crate) fn insert(&self, key: &str, cost: u64, sent_ns: u64, decision: Decision) {
        if cost == 0 || decision.allowed || decision.retry_after_ns == 0 {
            return;
        }
        let denial = Denial {
            cost,
            sent_ns,
            until_ns: sent_ns.saturating_add(decision.retry_after_ns),
            decision,
        };
        let mut shard = self.shard(key).lock();
        if let Some(slot) = shard.get_mut(key) {
            *slot = denial;
            return;
        }
        let bound = self.per_shard.load(Ordering::Relaxed);
        if shard.len() >= bound {
            shard.retain(|_, d| d.until_ns > sent_ns);
            if shard.len() >= bound {
                return;
            }
        }
        shard.insert(key.to_owned(), denial);
    }

    /// Forgets every denial (they were answered under state that has since been rewritten).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }

    /// Forgets every denial and bounds the cache to `max_keys` from now on.
    pub(crate) fn reset(&self, max_keys: usize) {
        self.per_shard.store(per_shard(max_keys), Ordering::Relaxed);
        self.clear();
    }

    /// Keys denied now, with their decisions as of `now`.
    pub(crate) fn denied(&self, now: u64) -> Vec<(String, Decision)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock();
            for (k, d) in shard.iter() {
                if d.until_ns > now {
                    let mut decision = d.decision;
                    decision.retry_after_ns = d.until_ns - now;
                    decision.reset_after_ns = decision
                        .reset_after_ns
                        .saturating_sub(now.saturating_sub(d.sent_ns));
                    out.push((k.clone(), decision));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(retry: u64) -> Decision {
        Decision {
            allowed: false,
            limit: 10,
            remaining: 0,
            retry_after_ns: retry,
            reset_after_ns: 5 * retry,
        }
    }

    #[test]
    fn answers_until_the_time_redis_gave_and_only_for_as_much() {
        let cache = DenialCache::new(100);
        cache.insert("k", 2, 1_000, denied(500));
        assert_eq!(cache.get("k", 2, 1_200).unwrap().retry_after_ns, 300);
        assert_eq!(cache.get("k", 3, 1_499).unwrap().retry_after_ns, 1);
        assert!(cache.get("k", 1, 1_200).is_none(), "a smaller cost may fit");
        assert!(cache.get("k", 2, 1_500).is_none(), "expired");
        assert!(cache.get("other", 2, 1_200).is_none());
    }

    #[test]
    fn stays_within_its_bound() {
        let cache = DenialCache::new(SHARDS);
        for i in 0..10 * SHARDS {
            cache.insert(&format!("k{i}"), 1, 0, denied(1_000));
        }
        assert!(cache.denied(0).len() <= SHARDS);
        // Expired entries make room.
        for i in 0..10 * SHARDS {
            cache.insert(&format!("n{i}"), 1, 2_000, denied(1_000));
        }
        assert!(cache.denied(2_000).iter().any(|(k, _)| k.starts_with('n')));
    }
}
