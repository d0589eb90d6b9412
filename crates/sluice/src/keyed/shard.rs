//! One shard of a [`Keyed`](crate::Keyed) table: its states under one lock, with the
//! algorithm they are held under, the records of busy keys evicted for room and the floor
//! after a crash; and how many shards a table gets.

use std::sync::Arc;

use hashbrown::HashTable;

use crate::cell::LocalAlgorithm;

/// A shard on its own cache line, so two cores updating neighbouring shards do not collide.
#[repr(align(64))]
pub(crate) struct Padded<T>(pub(crate) T);

/// In this order (`repr(C)`): the lock, the table and the algorithm's pointer share the first
/// cache line a check touches.
#[repr(C)]
pub(crate) struct Shard<K, A: LocalAlgorithm> {
    pub(crate) table: HashTable<(K, A::State)>,
    /// The algorithm every state of this shard is held under, read under the shard's lock, so
    /// that [`Keyed::reconfigure`] changes it together with the states. Shared by the shards
    /// (one allocation that every check reads, so it stays in cache), swapped in each.
    pub(crate) algorithm: Arc<A>,
    /// No key of `table` goes idle before this time: a lower bound of their
    /// [`idle_at`](sluice_core::Algorithm::idle_at), lowered whenever a state may have moved
    /// closer to idle (an insert, a refund, a store) and recomputed by a sweep. A check never
    /// makes a busy state idle, so checks leave it alone. While it is in the future there is
    /// no idle key to find, and no sweep is needed.
    pub(super) next_idle: u64,
    /// The hashes of the keys that have a queue now, each with the number of such keys (two
    /// keys may share a hash). Their entries are never evicted: the queue's waiters count on
    /// the state they wait for.
    pub(super) pinned: Vec<(u64, u32)>,
    /// The busy keys evicted for room, until they would have gone idle: see [`Evicted`].
    pub(super) evicted: Box<[Evicted<K>]>,
    /// Every key absent from this shard starts no fuller than the emptiest state that is idle
    /// at this time (0: no floor). Set after a crash ([`Keyed::set_floor`]) and by records
    /// merged under a flood of evictions that [`Keyed::import_saved`] brings back.
    pub(super) floor: u64,
    /// Keys with an algorithm of their own ([`Keyed::set_override`]): their states are held
    /// under it, not under `algorithm`. Usually empty, and then never looked up.
    pub(crate) overrides: HashTable<(K, A)>,
}

/// The algorithm `key` (of `hash`) is held under when it has one of its own in `overrides`.
#[inline]
pub(crate) fn override_in<'o, K, A, Q>(
    overrides: &'o HashTable<(K, A)>,
    hash: u64,
    key: &Q,
) -> Option<&'o A>
where
    K: std::borrow::Borrow<Q>,
    Q: Eq + ?Sized,
{
    if overrides.is_empty() {
        return None;
    }
    overrides
        .find(hash, |(k, _)| k.borrow() == key)
        .map(|(_, a)| a)
}

/// The record of a busy key evicted for room: the key, its hash and when its state would have
/// been idle. A key absent from the table with a live record comes back as the emptiest state
/// that is idle at that time, so an evicted key never comes back fuller than it left.
///
/// Records live in buckets of [`WAYS`] by their hash. A record expires when its time
/// passes. When a bucket is full of live records, a new one is merged into the one that ends
/// first, which then stands for every key of the bucket ([`SHARED`], without a key): no
/// evicted key is forgotten, and under a flood of evictions new keys of that bucket may start
/// emptier than a fresh key would (they are limited until the merged time), never fuller.
///
/// The key is kept so that the record survives what changes the hashes: a restart (a new
/// random hasher) exports and imports it by key.
#[derive(Debug, Clone)]
pub(super) struct Evicted<K> {
    pub(super) key: Option<K>,
    pub(super) hash: u64,
    pub(super) until: u64,
}

impl<K> Evicted<K> {
    pub(super) const fn empty() -> Self {
        Evicted {
            key: None,
            hash: 0,
            until: 0,
        }
    }
}

/// Records per bucket of [`Evicted`].
pub(super) const WAYS: usize = 4;

/// The hash of a merged [`Evicted`] record, which applies to every key of its bucket.
const SHARED: u64 = u64::MAX;

impl<K, A: LocalAlgorithm> Shard<K, A> {
    pub(super) fn is_pinned(&self, hash: u64) -> bool {
        self.pinned.iter().any(|&(h, _)| h == hash)
    }

    fn evicted_bucket(&mut self, hash: u64) -> &mut [Evicted<K>] {
        let buckets = self.evicted.len() / WAYS;
        let b = hash as usize & (buckets - 1);
        &mut self.evicted[b * WAYS..(b + 1) * WAYS]
    }

    /// When the key of `hash`, absent from the table, would be idle: as evicted, or under the
    /// floor; 0 if neither applies any more.
    pub(super) fn absent_until(&mut self, hash: u64, now: u64) -> u64 {
        let floor = if self.floor > now { self.floor } else { 0 };
        self.evicted_bucket(hash)
            .iter()
            .filter(|r| (r.hash == hash || r.hash == SHARED) && r.until > now)
            .map(|r| r.until)
            .max()
            .unwrap_or(0)
            .max(floor)
    }

    pub(super) fn record_eviction(&mut self, key: K, hash: u64, until: u64, now: u64) {
        let bucket = self.evicted_bucket(hash);
        if let Some(r) = bucket.iter_mut().find(|r| r.hash == hash && r.until > now) {
            r.until = r.until.max(until);
        } else if let Some(r) = bucket.iter_mut().find(|r| r.until <= now) {
            *r = Evicted {
                key: Some(key),
                hash,
                until,
            };
        } else if let Some(r) = bucket.iter_mut().min_by_key(|r| r.until) {
            *r = Evicted {
                key: None,
                hash: SHARED,
                until: r.until.max(until),
            };
        }
    }

    pub(super) fn pin(&mut self, hash: u64) {
        match self.pinned.iter_mut().find(|(h, _)| *h == hash) {
            Some((_, n)) => *n += 1,
            None => self.pinned.push((hash, 1)),
        }
    }

    pub(super) fn unpin(&mut self, hash: u64) {
        if let Some(i) = self.pinned.iter().position(|&(h, _)| h == hash) {
            self.pinned[i].1 -= 1;
            if self.pinned[i].1 == 0 {
                self.pinned.swap_remove(i);
            }
        }
    }
}

/// The emptiest state of `algorithm` that is idle at `until`: everything spent as late as
/// still leaves it idle then. For the buckets (GCRA, token, leaky) this is exactly a state
/// that was idle at `until`, whose refill is linear; for the windows it counts the full
/// capacity until then, never less than such a state had.
///
/// The moment of that spending may lie before the clock's origin (a table opened moments
/// ago, bounded by a crash a while back): the state is then the spent one restored with the
/// time since.
pub(super) fn spent_until<A: LocalAlgorithm>(algorithm: &A, until: u64, now: u64) -> A::State {
    let span = algorithm
        .idle_at(&algorithm.exhausted_state(now))
        .saturating_sub(now);
    if until >= span {
        return algorithm.exhausted_state(until - span);
    }
    let spent = algorithm.save(&algorithm.exhausted_state(0), 0);
    let since = now.saturating_add(span - until);
    algorithm
        .restore(&spent, now, since)
        .unwrap_or_else(|_| algorithm.exhausted_state(now))
}

/// When the state that `until` stands for under `from` (see [`spent_until`]) is idle once
/// converted to `to` at `now`.
pub(super) fn convert_until<A: LocalAlgorithm>(to: &A, from: &A, until: u64, now: u64) -> u64 {
    if until <= now {
        return 0;
    }
    to.idle_at(&to.convert(from, &spent_until(from, until, now), now))
}

/// Chooses the shard count that wastes the least table space when `max_keys` keys are held,
/// mirroring hashbrown's sizing (buckets = next power of two of capacity × 8/7).
pub(super) fn plan_shards(max_keys: usize, min_shards: usize) -> (usize, usize) {
    fn buckets(capacity: usize) -> usize {
        if capacity < 8 {
            if capacity < 4 {
                4
            } else {
                8
            }
        } else {
            (capacity.saturating_mul(8) / 7).next_power_of_two()
        }
    }
    // Small caps get few shards, so that each holds enough keys to even out.
    let min_shards = min_shards.min((max_keys / 64).max(1));
    let max_shards = (min_shards * 8).max(64).min(max_keys.max(1));
    let mut best = (min_shards, usize::MAX);
    for shards in min_shards..=max_shards {
        let per_shard = max_keys.div_ceil(shards);
        // Room for an unlucky shard: four standard deviations of a uniform hash.
        let margin = 4 * (per_shard as f64).sqrt() as usize + 8;
        let total = buckets(per_shard + margin).saturating_mul(shards);
        if total < best.1 {
            best = (shards, total);
        }
    }
    let shards = best.0;
    (shards, per_shard_capacity(max_keys, shards))
}

/// The entries one of `shards` shards holds for its share of `max_keys`, with room for an
/// unlucky shard (four standard deviations of a uniform hash).
pub(super) fn per_shard_capacity(max_keys: usize, shards: usize) -> usize {
    let per_shard = max_keys.div_ceil(shards);
    per_shard + 4 * (per_shard as f64).sqrt() as usize + 8
}
