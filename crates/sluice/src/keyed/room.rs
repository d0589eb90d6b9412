//! Room in the table: adding a key, making room for it when the table is full (idle keys
//! first, then the busy key nearest idle, remembered so that it comes back no fuller than it
//! left), sweeping idle keys, and the state a key that is absent comes back with.
//!
//! Owns who is let in and who is dropped. Never drops a key with waiters (the shard's pins say
//! which), and never decides a request: that is the check's, in [`map`](super::map).

use std::sync::atomic::Ordering;

use crate::cell::LocalAlgorithm;
use crate::clock::Clock;
use crate::keyed::map::{Key, Shared};
use crate::keyed::shard::{spent_until, Shard};

impl<K, A: LocalAlgorithm, C: Clock> Shared<K, A, C>
where
    K: Key,
{
    /// Adds a key known to be absent.
    pub(super) fn insert(&self, shard: &mut Shard<K, A>, hash: u64, key: K, state: A::State) {
        shard.next_idle = shard.next_idle.min(shard.algorithm.idle_at(&state));
        shard
            .table
            .insert_unique(hash, (key, state), |(k, _)| self.hasher.hash_one(k));
        self.keys.fetch_add(1, Ordering::Relaxed);
    }

    /// The state of a key absent from the table: full, unless it was evicted busy or a floor
    /// holds and it would not be idle yet; then the emptiest state that is idle when it would
    /// be ([`spent_until`]).
    /// `own` is the key's algorithm when it has one of its own (an override).
    pub(super) fn fresh_state_for(
        &self,
        shard: &mut Shard<K, A>,
        hash: u64,
        now: u64,
        own: Option<&A>,
    ) -> A::State {
        let until = shard.absent_until(hash, now);
        let algorithm = own.unwrap_or(&*shard.algorithm);
        if until <= now {
            return algorithm.initial_state();
        }
        spent_until(algorithm, until, now)
    }

    /// Drops the idle keys of `shard` that have no queue, and recomputes its `next_idle`.
    pub(super) fn sweep_shard(&self, shard: &mut Shard<K, A>, now: u64) -> usize {
        let before = shard.table.len();
        let Shard {
            algorithm,
            table,
            pinned,
            overrides,
            ..
        } = shard;
        let mut next_idle = u64::MAX;
        table.retain(|(k, state)| {
            let own = if overrides.is_empty() {
                None
            } else {
                crate::keyed::shard::override_in(overrides, self.hasher.hash_one(&*k), &*k)
            };
            let idle_at = own.unwrap_or(&**algorithm).idle_at(state);
            let keep = idle_at > now
                || (!pinned.is_empty() && {
                    let hash = self.hasher.hash_one(&*k);
                    pinned.iter().any(|&(h, _)| h == hash)
                });
            if keep && idle_at > now {
                next_idle = next_idle.min(idle_at);
            }
            keep
        });
        shard.next_idle = next_idle;
        let removed = before - shard.table.len();
        self.keys.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Frees a slot for one more key in `shard` (the one `hash` falls in, locked by the
    /// caller).
    ///
    /// Idle keys go first, from this shard or, when the cap on keys as a whole is what is
    /// reached, from any shard not locked right now: an idle key's bucket is full again, so
    /// nothing is lost by forgetting it. Only when none is idle is a busy key evicted: the
    /// one without a queue nearest to idle, which forgets the least, and its key and idle time
    /// are kept in the shard's record of evicted keys so that it comes back no fuller than it
    /// left (as nginx's `limit_req` zone evicts its least recently used entry, but without
    /// handing the evicted key a full bucket). A key with a queue is never evicted: when
    /// every key of the shard has one, the new key is let in above the cap, which is then
    /// exceeded by at most the number of keys with waiters.
    pub(super) fn make_room(&self, shard: &mut Shard<K, A>, hash: u64, now: u64) {
        let shard_capacity = self.shard_capacity.load(Ordering::Relaxed);
        let max_keys = self.max_keys.load(Ordering::Relaxed);
        let local_full = |shard: &Shard<K, A>| shard.table.len() >= shard_capacity;
        let global_full = || self.keys.load(Ordering::Relaxed) >= max_keys;
        if !local_full(shard) && !global_full() {
            return;
        }
        if shard.next_idle <= now {
            let removed = self.sweep_shard(shard, now);
            self.evicted.increment(removed as u64);
        }
        if !local_full(shard) && global_full() {
            // Idle keys of other shards, without waiting for a lock held elsewhere (waiting
            // while holding this one could deadlock).
            let start = self.shard_index(hash);
            let count = self.shards.len();
            for i in (1..count).map(|i| (start + i) % count) {
                if !global_full() {
                    break;
                }
                let Some(mut other) = self.shards[i].0.try_lock() else {
                    continue;
                };
                if other.next_idle <= now {
                    let removed = self.sweep_shard(&mut other, now);
                    self.evicted.increment(removed as u64);
                }
            }
        }
        let mut attempts = 0;
        while (local_full(shard) || global_full()) && attempts < 4 {
            attempts += 1;
            let Some((victim, victim_hash, idle_at)) = self.busy_victim(shard) else {
                break;
            };
            let Ok(entry) = shard.table.find_entry(victim_hash, |(k, _)| *k == victim) else {
                break;
            };
            entry.remove();
            self.keys.fetch_sub(1, Ordering::Relaxed);
            self.evicted.increment(1);
            shard.record_eviction(victim, victim_hash, idle_at, now);
        }
    }

    /// The key of `shard` without a queue that goes idle first, with its hash and idle time.
    fn busy_victim(&self, shard: &Shard<K, A>) -> Option<(K, u64, u64)> {
        let mut best: Option<(&K, u64)> = None;
        for (k, state) in shard.table.iter() {
            let idle_at = shard.algorithm.idle_at(state);
            if best.is_some_and(|(_, b)| idle_at >= b) {
                continue;
            }
            // Hashing is needed only for a key that would be the new best (a few per scan).
            if !shard.pinned.is_empty() && shard.is_pinned(self.hasher.hash_one(k)) {
                continue;
            }
            // A key with a quota of its own is never the victim: its state is not under the
            // table's algorithm, which the records of evicted keys are read with.
            if !shard.overrides.is_empty()
                && crate::keyed::shard::override_in(&shard.overrides, self.hasher.hash_one(k), k)
                    .is_some()
            {
                continue;
            }
            best = Some((k, idle_at));
        }
        best.map(|(k, idle_at)| (k.clone(), self.hasher.hash_one(k), idle_at))
    }
}
