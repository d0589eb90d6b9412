//! Keys with a quota of their own: [`Keyed::set_override`] holds one key under another
//! algorithm than the table's, converting its state in place under its shard's lock as a
//! reconfiguration converts every key, so that no key gains tokens when its quota is set,
//! changed or removed.
//!
//! The override is the table's, kept beside the key's state in its shard: it outlives the
//! key's state (an idle key dropped comes back under its own quota), survives
//! [`Keyed::reconfigure`] (which leaves such keys as they are) and is saved with the table
//! ([`Keyed::export`]). Requests waiting in the key's queue stay there and are admitted under
//! the new quota; their predicted waits are planned with the table's algorithm.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::Ordering;

use crate::cell::LocalAlgorithm;
use crate::clock::Clock;
use crate::keyed::map::{Key, Keyed};
use crate::keyed::shard::override_in;

impl<K, A: LocalAlgorithm, C: Clock + Clone> Keyed<K, A, C>
where
    K: Key,
{
    /// Holds `key` under `algorithm` from now on (`None`: under the table's again), converting
    /// its state from the algorithm it was held under ([`LocalAlgorithm::convert`]: what it
    /// has left becomes at most `min(left, new capacity)`, time owed stays owed). Returns the
    /// key's previous override.
    pub fn set_override(&self, key: K, algorithm: Option<A>) -> Option<A> {
        let s = &*self.shared;
        // One change at a time, and none while an export reads the table.
        let _one = s.reconfiguring.lock();
        let hash = s.hasher.hash_one(&key);
        let now = s.clock.now_ns();
        let mut guard = s.shard_of(hash).lock();
        let shard = &mut *guard;
        let previous = override_in(&shard.overrides, hash, &key).cloned();
        let from = previous
            .clone()
            .unwrap_or_else(|| (*shard.algorithm).clone());
        let to = algorithm
            .clone()
            .unwrap_or_else(|| (*shard.algorithm).clone());
        match shard.table.find_mut(hash, |(k, _)| *k == key) {
            Some((_, state)) => {
                // A key full again is as a key never seen: full under the new quota.
                *state = if from.idle_at(state) <= now {
                    to.initial_state()
                } else {
                    to.convert(&from, state, now)
                };
                shard.next_idle = shard.next_idle.min(to.idle_at(state));
            }
            None => {
                // Absent: full, or limited by a record or the floor (then converted).
                let fresh = s.fresh_state_for(shard, hash, now, Some(&from));
                if from.idle_at(&fresh) > now {
                    let state = to.convert(&from, &fresh, now);
                    if to.idle_at(&state) > now {
                        s.make_room(shard, hash, now);
                        s.insert(shard, hash, key.clone(), state);
                    }
                }
            }
        }
        let hasher = &s.hasher;
        match (
            shard.overrides.find_entry(hash, |(k, _)| *k == key),
            algorithm,
        ) {
            (Ok(entry), Some(a)) => entry.into_mut().1 = a,
            (Ok(entry), None) => {
                entry.remove();
                s.overridden.fetch_sub(1, Ordering::Relaxed);
            }
            (Err(_), Some(a)) => {
                shard
                    .overrides
                    .insert_unique(hash, (key, a), |(k, _)| hasher.hash_one(k));
                s.overridden.fetch_add(1, Ordering::Relaxed);
            }
            (Err(_), None) => {}
        }
        previous
    }

    /// `key`'s own algorithm, if it has one.
    pub fn override_of<Q>(&self, key: &Q) -> Option<A>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let s = &*self.shared;
        if s.overridden.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let hash = s.hasher.hash_one(key);
        let shard = s.shard_of(hash).lock();
        override_in(&shard.overrides, hash, key).cloned()
    }

    /// Every key with an algorithm of its own.
    pub fn overrides(&self) -> Vec<(K, A)> {
        let s = &*self.shared;
        if s.overridden.load(Ordering::Relaxed) == 0 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for shard in s.shards.iter() {
            let shard = shard.0.lock();
            out.extend(shard.overrides.iter().cloned());
        }
        out
    }

    /// Whether any key has an algorithm of its own (one atomic load).
    pub fn has_overrides(&self) -> bool {
        self.shared.overridden.load(Ordering::Relaxed) > 0
    }
}
