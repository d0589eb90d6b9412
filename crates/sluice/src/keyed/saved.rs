//! What a [`Keyed`] table must not forget across a restart: its keys, the records of busy
//! keys evicted for room and the floor, saved relative to one moment under one algorithm, and
//! taken back converted to the algorithm in force. The [`FileStore`](crate::store::FileStore)
//! writes and reads it.

use sluice_core::{SavedState, SnapshotError};

use crate::cell::LocalAlgorithm;
use crate::clock::Clock;
use crate::keyed::map::{Key, Keyed};
use crate::keyed::shard::{override_in, spent_until};

/// Everything a table must not forget across a restart, as of one moment and under one
/// algorithm: what [`Keyed::export`] gives and [`Keyed::import_saved`] takes back. Every time
/// in it is relative to that moment.
#[derive(Debug, Clone)]
pub struct Saved<K, A> {
    /// The algorithm, with the quota, that every state here was held under.
    pub algorithm: A,
    /// Every key that is not idle.
    pub keys: Vec<(K, SavedState)>,
    /// Busy keys evicted for room: each comes back no fuller than this state.
    pub evicted: Vec<(K, SavedState)>,
    /// A bound on every key the table does not hold: such a key starts no fuller than this
    /// (after a crash, or when the records of evicted keys overflowed and were merged).
    pub floor: Option<SavedState>,
    /// Keys with an algorithm of their own ([`Keyed::set_override`]), each with its state
    /// under that algorithm when it is not idle.
    pub overrides: Vec<(K, A, Option<SavedState>)>,
}

impl<K, A: LocalAlgorithm, C: Clock + Clone> Keyed<K, A, C>
where
    K: Key,
{
    /// Everything that is not idle, saved relative to now under the algorithm in force: the
    /// keys, the records of busy keys evicted for room, and the floor. What a snapshot holds
    /// (the [`FileStore`](crate::store::FileStore) writes it); [`Keyed::import_saved`] takes it
    /// back, converting it if the quota changed meanwhile.
    pub fn export(&self) -> Saved<K, A> {
        let s = &*self.shared;
        let _one = s.reconfiguring.lock();
        let now = s.clock.now_ns();
        let algorithm = self.algorithm();
        let mut saved = Saved {
            algorithm: algorithm.clone(),
            keys: Vec::new(),
            evicted: Vec::new(),
            floor: None,
            overrides: Vec::new(),
        };
        let mut floor = 0;
        for shard in s.shards.iter() {
            let shard = shard.0.lock();
            let alg = &*shard.algorithm;
            for (k, state) in shard.table.iter() {
                if !shard.overrides.is_empty() {
                    if let Some(own) = override_in(&shard.overrides, s.hasher.hash_one(k), k) {
                        if own.idle_at(state) > now {
                            saved.overrides.push((
                                k.clone(),
                                own.clone(),
                                Some(own.save(state, now)),
                            ));
                        }
                        continue;
                    }
                }
                if alg.idle_at(state) > now {
                    saved.keys.push((k.clone(), alg.save(state, now)));
                }
            }
            for (k, own) in shard.overrides.iter() {
                if !saved.overrides.iter().any(|(o, _, _)| o == k) {
                    saved.overrides.push((k.clone(), own.clone(), None));
                }
            }
            for r in shard.evicted.iter().filter(|r| r.until > now) {
                match &r.key {
                    Some(k) => saved
                        .evicted
                        .push((k.clone(), alg.save(&spent_until(alg, r.until, now), now))),
                    // A merged record stands for keys it no longer names: after a restart,
                    // with other hashes, it can only bound every key.
                    None => floor = floor.max(r.until),
                }
            }
            floor = floor.max(shard.floor);
        }
        if floor > now {
            saved.floor = Some(algorithm.save(&spent_until(&algorithm, floor, now), now));
        }
        saved
    }

    /// Takes back what [`Keyed::export`] saved, `elapsed_ns` later (a restart), converted from
    /// the algorithm it was saved under to the one in force: each key is set to its state
    /// (replacing what the table holds), each evicted key's record is kept again, and the floor
    /// is raised to the saved one. Returns the keys set.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::restore`](sluice_core::Algorithm::restore), naming nothing: the first
    /// state that cannot be read stops the import (what came before it stays).
    pub fn import_saved(
        &self,
        saved: &Saved<K, A>,
        elapsed_ns: u64,
    ) -> Result<usize, SnapshotError> {
        let s = &*self.shared;
        // Keys with an algorithm of their own: the algorithm first, then the state under it.
        let mut set = 0;
        for (key, own, state) in &saved.overrides {
            self.set_override(key.clone(), Some(own.clone()));
            if let Some(state) = state {
                let now = s.clock.now_ns();
                let held = own.restore(state, now, elapsed_ns)?;
                let hash = s.hasher.hash_one(key);
                let mut shard = s.shard_of(hash).lock();
                if s.put(&mut shard, hash, key.clone(), held, now, true) {
                    set += 1;
                }
            }
        }
        let _one = s.reconfiguring.lock();
        let now = s.clock.now_ns();
        let from = &saved.algorithm;
        let read = |state: &SavedState, to: &A| -> Result<A::State, SnapshotError> {
            let held = from.restore(state, now, elapsed_ns)?;
            Ok(to.convert(from, &held, now))
        };
        for (key, state) in &saved.keys {
            let hash = s.hasher.hash_one(key);
            let mut shard = s.shard_of(hash).lock();
            let state = read(state, &shard.algorithm)?;
            if s.put(&mut shard, hash, key.clone(), state, now, true) {
                set += 1;
            }
        }
        for (key, state) in &saved.evicted {
            let hash = s.hasher.hash_one(key);
            let mut shard = s.shard_of(hash).lock();
            let state = read(state, &shard.algorithm)?;
            let until = shard.algorithm.idle_at(&state);
            if until > now && shard.table.find(hash, |(k, _)| k == key).is_none() {
                shard.record_eviction(key.clone(), hash, until, now);
            }
        }
        if let Some(floor) = &saved.floor {
            for shard in s.shards.iter() {
                let mut shard = shard.0.lock();
                let state = read(floor, &shard.algorithm)?;
                let until = shard.algorithm.idle_at(&state);
                shard.floor = shard.floor.max(until);
            }
        }
        Ok(set)
    }

    /// Sets `key` to the state `saved` restores to, `elapsed_ns` after it was saved. With
    /// `replace` false, a key already in the table keeps its state. A restored state that is
    /// idle is not inserted.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::restore`](sluice_core::Algorithm::restore); the table is then unchanged.
    pub fn import(
        &self,
        key: K,
        saved: &SavedState,
        elapsed_ns: u64,
        replace: bool,
    ) -> Result<(), SnapshotError> {
        let s = &*self.shared;
        let now = s.clock.now_ns();
        let hash = s.hasher.hash_one(&key);
        let mut shard = s.shard_of(hash).lock();
        let state = shard.algorithm.restore(saved, now, elapsed_ns)?;
        s.put(&mut shard, hash, key, state, now, replace);
        Ok(())
    }

    /// Every key, held or not, is from now on no fuller than everything spent `spent_ago_ns`
    /// ago: the rule after a crash, when the lost consumption may have been any key's. A held
    /// key that was emptier keeps its state; a floor already higher stays.
    pub fn set_floor(&self, spent_ago_ns: u64) {
        let s = &*self.shared;
        let now = s.clock.now_ns();
        for shard in s.shards.iter() {
            let mut guard = shard.0.lock();
            let shard = &mut *guard;
            let span = shard
                .algorithm
                .idle_at(&shard.algorithm.exhausted_state(now))
                .saturating_sub(now);
            if span <= spent_ago_ns {
                continue;
            }
            let until = now + (span - spent_ago_ns);
            shard.floor = shard.floor.max(until);
            let spent = spent_until(&*shard.algorithm, until, now);
            let overrides = &shard.overrides;
            for (k, state) in shard.table.iter_mut() {
                match override_in(overrides, s.hasher.hash_one(&*k), &*k) {
                    // Under its own algorithm: everything it admits spent `spent_ago_ns` ago.
                    Some(own) => {
                        let own_until = own
                            .idle_at(&own.exhausted_state(now))
                            .saturating_sub(spent_ago_ns);
                        if own.idle_at(state) < own_until {
                            *state = spent_until(own, own_until, now);
                        }
                    }
                    None => {
                        if shard.algorithm.idle_at(state) < until {
                            *state = spent.clone();
                        }
                    }
                }
            }
        }
    }
}
