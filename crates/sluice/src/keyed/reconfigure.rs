//! Changing a [`Keyed`] table's algorithm, key cap and queue in place: the one owner of its
//! keys' state converts them under each shard's lock.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::MutexGuard;
use sluice_core::queue::QueueConfig;

use crate::cell::LocalAlgorithm;
use crate::clock::Clock;
use crate::keyed::map::{Key, Keyed};
use crate::keyed::shard::{convert_until, per_shard_capacity};
use crate::keyed::waiting::{WaitLimiter, Waiters};

impl<K, A: LocalAlgorithm, C: Clock + Clone> Keyed<K, A, C>
where
    K: Key,
{
    /// Changes the algorithm (its quota, or another algorithm), the cap on keys and the queue
    /// limits in place, for every clone of this table and every request waiting in it.
    ///
    /// Each shard is converted under its own lock: every state, every record of an evicted
    /// key and the floor go from what they were under the old algorithm to the new one so
    /// that no key gains tokens ([`LocalAlgorithm::convert`]: what a key has left becomes at
    /// most `min(left, new capacity)`). Waiting requests stay in their queues, with their
    /// deadlines, and are admitted under the new quota from then on; a lower cap on keys
    /// evicts the surplus as new keys come. Returns the keys converted.
    pub fn reconfigure(&self, algorithm: A, max_keys: usize, queue: QueueConfig) -> usize {
        let s = &*self.shared;
        let _one = s.reconfiguring.lock();
        // No queue is created meanwhile, and every existing one is held still, so that no
        // queue plans with one algorithm and admits with the other.
        let waiters: Vec<MutexGuard<'_, Waiters<K, A, C>>> =
            s.waiters.iter().map(|w| w.0.lock()).collect();
        let limiters: Vec<WaitLimiter<K, A, C>> = waiters
            .iter()
            .flat_map(|w| w.values().map(|e| e.limiter.clone()))
            .collect();
        let mut inners: Vec<_> = limiters.iter().map(|l| l.shared.inner.lock()).collect();
        let mut current = s.current.write();
        let now = s.clock.now_ns();
        let max_keys = max_keys.max(1);
        let mut converted = 0;
        let shared_algorithm = Arc::new(algorithm.clone());
        for shard in s.shards.iter() {
            let mut guard = shard.0.lock();
            let shard = &mut *guard;
            let old = std::mem::replace(&mut shard.algorithm, Arc::clone(&shared_algorithm));
            let mut next_idle = u64::MAX;
            let overrides = &shard.overrides;
            for (k, state) in shard.table.iter_mut() {
                // A key with a quota of its own keeps it (its owner converts it to another
                // algorithm: `MemoryStore::reconfigure`).
                if !overrides.is_empty()
                    && crate::keyed::shard::override_in(overrides, s.hasher.hash_one(&*k), &*k)
                        .is_some()
                {
                    next_idle = 0;
                    continue;
                }
                *state = algorithm.convert(&old, state, now);
                next_idle = next_idle.min(algorithm.idle_at(state));
                converted += 1;
            }
            shard.next_idle = next_idle;
            for r in shard.evicted.iter_mut() {
                r.until = if r.until > now {
                    convert_until(&algorithm, &*old, r.until, now)
                } else {
                    0
                };
            }
            shard.floor = convert_until(&algorithm, &*old, shard.floor, now);
        }
        *current = algorithm;
        drop(current);
        s.max_keys.store(max_keys, Ordering::Relaxed);
        s.shard_capacity.store(
            per_shard_capacity(max_keys, s.shards.len()).saturating_mul(2),
            Ordering::Relaxed,
        );
        *s.queue.lock() = queue;
        for inner in &mut inners {
            inner.queue.set_config(queue);
        }
        drop(inners);
        drop(waiters);
        // Each queue's driver plans again with the new quota.
        for limiter in &limiters {
            limiter.shared.notify.notify_one();
        }
        converted
    }
}
