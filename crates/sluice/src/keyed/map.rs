//! The sharded table of per-key states: the [`Keyed`] handle and what its clones share, the
//! way from a key to its shard, and the one check-and-update of a key.
//!
//! Owns the table's layout and its public face. Making room (sweeps, evictions) is
//! [`room`](super::room)'s, the queues of waiting keys are [`waiting`](super::waiting)'s: this
//! room asks them, and does not evict or queue by itself.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashTable;
use parking_lot::{Mutex, RwLock};
use sluice_core::queue::QueueConfig;
use sluice_core::Decision;

use crate::cell::LocalAlgorithm;
use crate::clock::{Clock, TokioClock};
use crate::error::Error;
use crate::keyed::builder::KeyedBuilder;
use crate::keyed::shard::{override_in, plan_shards, Evicted, Padded, Shard, WAYS};
use crate::keyed::waiting::WaitersShard;
use crate::limiter::AcquireOptions;
use crate::metrics::LimiterMetrics;

/// The hasher of keys: aHash, keyed with random numbers from the operating system, a new key
/// per table.
///
/// Keys come from clients (IP addresses, tokens, user names), so an attacker can choose
/// them. With a fixed or guessable hash they could pick keys that all land in one shard and
/// one probe sequence, and turn every lookup into a long scan. aHash is a keyed hash designed
/// and documented to resist exactly this (its authors treat any way to make collisions
/// without knowing the key as a flaw to fix), at the speed of the fastest unkeyed hashes.
/// foldhash, even seeded, documents that it does not resist an attacker who can observe
/// the program, and std's SipHash, the reference, costs twice the whole lookup here (its long
/// dependency chain stops the processor from overlapping the cache misses of consecutive
/// lookups).
pub(super) type Hasher = ahash::RandomState;

/// What a key needs to be: hashable, comparable, cheap enough to clone, shareable.
pub trait Key: Hash + Eq + Clone + Send + Sync + 'static {}

impl<T: Hash + Eq + Clone + Send + Sync + 'static> Key for T {}

/// One limit per key. Clones share the table.
///
/// # Examples
///
/// ```
/// use sluice::Keyed;
/// use sluice_core::{Gcra, Quota};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_user: Keyed<String, Gcra> = Keyed::builder(Gcra::new(Quota::parse(2, "1/s")?))
///     .max_keys(10_000)
///     .build();
/// assert!(per_user.try_acquire("alice", 2).is_ok());
/// assert!(per_user.try_acquire("alice", 1).is_err()); // alice is out
/// assert!(per_user.try_acquire("bob", 1).is_ok()); // bob is not
/// # Ok(())
/// # }
/// ```
pub struct Keyed<K, A: LocalAlgorithm, C: Clock + Clone = TokioClock>
where
    K: Key,
{
    pub(crate) shared: Arc<Shared<K, A, C>>,
}

impl<K, A: LocalAlgorithm, C: Clock + Clone> Clone for Keyed<K, A, C>
where
    K: Key,
{
    fn clone(&self) -> Self {
        Keyed {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<K, A: LocalAlgorithm, C: Clock + Clone> std::fmt::Debug for Keyed<K, A, C>
where
    K: Key,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let algorithm = self.algorithm();
        f.debug_struct("Keyed")
            .field("algorithm", &algorithm.name())
            .field("quota", &algorithm.quota())
            .field("keys", &self.len())
            .field("max_keys", &self.max_keys())
            .finish()
    }
}

pub(crate) struct Shared<K, A: LocalAlgorithm, C>
where
    K: Key,
    C: Clock,
{
    /// The algorithm in force: the shards hold their own copies (changed together with their
    /// states), the queues of waiting keys plan with this one.
    pub(crate) current: Arc<RwLock<A>>,
    pub(crate) clock: C,
    pub(crate) hasher: Hasher,
    #[allow(clippy::type_complexity)]
    pub(crate) shards: Box<[Padded<Mutex<Shard<K, A>>>]>,
    /// Entries one shard can hold without growing its table.
    pub(crate) shard_capacity: AtomicUsize,
    pub(crate) max_keys: AtomicUsize,
    pub(crate) keys: AtomicUsize,
    pub(crate) queue: Mutex<QueueConfig>,
    pub(crate) name: String,
    /// Keys with an algorithm of their own ([`Keyed::set_override`]).
    pub(crate) overridden: AtomicUsize,
    /// Keys with a queue of their own right now; zero skips the lookup.
    pub(crate) waiting_keys: AtomicUsize,
    /// The per-key limiters of waiting keys, sharded like `shards` so that a queued key
    /// never puts every other key's check behind one lock.
    pub(crate) waiters: Box<[WaitersShard<K, A, C>]>,
    /// Held by a reconfiguration and by an export, so that an export sees one algorithm.
    pub(crate) reconfiguring: Mutex<()>,
    pub(crate) metrics: LimiterMetrics,
    pub(crate) evicted: metrics::Counter,
}

impl<A: LocalAlgorithm> Keyed<(), A, TokioClock> {
    /// Starts configuring a keyed limiter; the key type is chosen at [`KeyedBuilder::build`].
    pub fn builder(algorithm: A) -> KeyedBuilder<A, TokioClock> {
        KeyedBuilder::new(algorithm)
    }
}

impl<K, A: LocalAlgorithm> Keyed<K, A, TokioClock>
where
    K: Key,
{
    /// A keyed limiter with the default cap (100,000 keys) and no queue.
    pub fn new(algorithm: A) -> Self {
        KeyedBuilder::new(algorithm).build()
    }
}

impl<K, A: LocalAlgorithm, C: Clock + Clone> Keyed<K, A, C>
where
    K: Key,
{
    pub(crate) fn from_builder(b: KeyedBuilder<A, C>) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let min_shards = (cores * 4).next_power_of_two();
        let (shard_count, per_shard) = plan_shards(b.max_keys, min_shards);
        // Reserve for the cap when it is reasonable; a huge cap grows on demand instead.
        let reserve = if b.max_keys <= 1 << 24 { per_shard } else { 0 };
        // Records of evicted busy keys for about an eighth of a shard's share of keys (a few
        // bytes per key of the cap, plus the keys of live records): they are all live only
        // when that many busy keys were evicted within one refill time.
        let evicted_buckets = (per_shard / 8 / WAYS).clamp(4, 1 << 14).next_power_of_two();
        let algorithm = Arc::new(b.algorithm.clone());
        let shards: Box<[_]> = (0..shard_count)
            .map(|_| {
                Padded(Mutex::new(Shard {
                    algorithm: Arc::clone(&algorithm),
                    table: HashTable::with_capacity(reserve),
                    next_idle: u64::MAX,
                    pinned: Vec::new(),
                    evicted: (0..evicted_buckets * WAYS)
                        .map(|_| Evicted::empty())
                        .collect(),
                    floor: 0,
                    overrides: HashTable::new(),
                }))
            })
            .collect();
        // A shard may hold twice its share before it must evict locally; the cap on keys as a
        // whole is `max_keys`, enforced by the shared count.
        let shard_capacity = per_shard.saturating_mul(2);
        Keyed {
            shared: Arc::new(Shared {
                metrics: LimiterMetrics::new(&b.name),
                evicted: metrics::counter!("sluice_keys_evicted_total", "limiter" => b.name.clone()),
                current: Arc::new(RwLock::new(b.algorithm)),
                clock: b.clock,
                hasher: Hasher::default(),
                shards,
                shard_capacity: AtomicUsize::new(shard_capacity),
                max_keys: AtomicUsize::new(b.max_keys),
                keys: AtomicUsize::new(0),
                queue: Mutex::new(b.queue),
                name: b.name,
                waiting_keys: AtomicUsize::new(0),
                overridden: AtomicUsize::new(0),
                waiters: (0..shard_count)
                    .map(|_| {
                        Padded(Mutex::new(hashbrown::HashMap::with_hasher(
                            Hasher::default(),
                        )))
                    })
                    .collect(),
                reconfiguring: Mutex::new(()),
            }),
        }
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.shared.keys.load(Ordering::Relaxed)
    }

    /// Keys with requests waiting in a queue of their own right now.
    pub fn waiting_keys(&self) -> usize {
        self.shared.waiting_keys.load(Ordering::Acquire)
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cap on keys.
    pub fn max_keys(&self) -> usize {
        self.shared.max_keys.load(Ordering::Relaxed)
    }

    /// The algorithm in force, with its quota.
    pub fn algorithm(&self) -> A {
        self.shared.current.read().clone()
    }

    /// The queue limits in force.
    pub fn queue_config(&self) -> QueueConfig {
        *self.shared.queue.lock()
    }

    /// The clock's time now, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.shared.clock.now_ns()
    }

    /// Takes `cost` for `key` now if its limit allows and nobody waits on it; never waits.
    ///
    /// # Errors
    ///
    /// [`Error::Limited`] with the wait, [`Error::InsufficientCapacity`] for a cost above the
    /// capacity.
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q, cost: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let s = &*self.shared;
        let hash = s.hasher.hash_one(key);
        if let Some(limiter) = s.waiter(key, hash) {
            return limiter.try_acquire(cost);
        }
        let now = s.clock.now_ns();
        let result = s.check_hashed(key, hash, now, cost);
        match &result {
            Ok(d) if d.allowed => {
                s.metrics.admitted.increment(1);
                Ok(*d)
            }
            Ok(d) => {
                s.metrics.limited.increment(1);
                Err(Error::Limited {
                    retry_after: std::time::Duration::from_nanos(d.retry_after_ns),
                    decision: *d,
                })
            }
            Err(e) => Err(*e),
        }
    }

    /// Gives back `cost` that was admitted for `key` `ago` and will never be used (see
    /// [`crate::Limiter::refund`]). A key no longer in the table was idle, full again, or was
    /// evicted busy and is only remembered as a time it is limited until: nothing is given
    /// back then.
    pub fn refund<Q>(&self, key: &Q, cost: u64, ago: std::time::Duration)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let s = &*self.shared;
        let hash = s.hasher.hash_one(key);
        if let Some(limiter) = s.waiter(key, hash) {
            limiter.refund(cost, ago);
            return;
        }
        let now = s.clock.now_ns();
        let admitted_at = now.saturating_sub(crate::limiter::builder_duration_ns(ago));
        let mut shard = s.shard_of(hash).lock();
        let shard = &mut *shard;
        let own = override_in(&shard.overrides, hash, key);
        if let Some((_, state)) = shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            let algorithm = own.unwrap_or(&*shard.algorithm);
            algorithm.refund(state, admitted_at, now, cost);
            let idle_at = algorithm.idle_at(state);
            shard.next_idle = shard.next_idle.min(idle_at);
        }
    }

    /// Takes `cost` from `key` now without asking, a bucket down to `max_debt` tokens beyond
    /// empty (see [`sluice_core::Algorithm::charge`]); returns the part forgiven. A key with
    /// waiters is charged in the same state its queue reads, so they wait for the refill that
    /// pays it.
    pub fn charge<Q>(&self, key: &Q, cost: u64, max_debt: u64) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if cost == 0 {
            return 0;
        }
        let s = &*self.shared;
        let hash = s.hasher.hash_one(key);
        let now = s.clock.now_ns();
        s.with_state(&key.to_owned(), hash, now, |algorithm, state| {
            algorithm.charge(state, now, cost, max_debt)
        })
    }

    /// The limit of `key` as of now, consuming nothing.
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let s = &*self.shared;
        let hash = s.hasher.hash_one(key);
        s.check_hashed(key, hash, s.clock.now_ns(), 0)
            .unwrap_or_else(|_| Decision {
                allowed: false,
                limit: self.algorithm().quota().capacity(),
                remaining: 0,
                retry_after_ns: 0,
                reset_after_ns: 0,
            })
    }

    /// Waits in `key`'s own queue until `cost` is admitted (see [`crate::Limiter::acquire`]).
    ///
    /// # Errors
    ///
    /// As [`crate::Limiter::acquire`]; without a queue configured, [`Error::Limited`] at once.
    ///
    /// # Cancel safety
    ///
    /// As [`crate::Limiter::acquire`]: dropping the future gives its place or tokens back, and
    /// the key's queue is dropped with its last waiter, so cancelled calls leave nothing in
    /// the table of waiting keys.
    pub async fn acquire<Q>(
        &self,
        key: &Q,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        match self.try_acquire(key, cost) {
            Ok(d) => return Ok(d),
            Err(Error::Limited { .. }) if self.shared.queue.lock().depth > 0 => {}
            Err(e) => return Err(e),
        }
        // The guard lets go of the key's limiter however this future ends: completed, or
        // dropped while queued.
        let waiting = self.waiting_limiter(key);
        waiting.limiter.acquire_with(cost, options).await
    }

    /// The hottest keys: up to `n` keys with the fewest tokens left, with their decisions.
    pub fn hottest(&self, n: usize) -> Vec<(K, Decision)> {
        let s = &*self.shared;
        let now = s.clock.now_ns();
        let mut all: Vec<(K, Decision)> = Vec::new();
        for shard in s.shards.iter() {
            let shard = shard.0.lock();
            for (k, state) in shard.table.iter() {
                let own = if shard.overrides.is_empty() {
                    None
                } else {
                    override_in(&shard.overrides, s.hasher.hash_one(k), k)
                };
                let algorithm = own.unwrap_or(&*shard.algorithm);
                if algorithm.idle_at(state) <= now {
                    continue;
                }
                let mut copy = state.clone();
                if let Ok(d) = algorithm.check(&mut copy, now, 0) {
                    all.push((k.clone(), d));
                }
            }
        }
        all.sort_by_key(|(_, d)| (d.remaining, std::cmp::Reverse(d.reset_after_ns)));
        all.truncate(n);
        all
    }

    /// Drops every key whose state is back to full. Done on demand when room is needed; call
    /// it to return memory sooner.
    pub fn sweep(&self) -> usize {
        let s = &*self.shared;
        let now = s.clock.now_ns();
        let mut removed = 0;
        for shard in s.shards.iter() {
            removed += s.sweep_shard(&mut shard.0.lock(), now);
        }
        removed
    }
}

impl<K, A: LocalAlgorithm, C: Clock> Shared<K, A, C>
where
    K: Key,
{
    #[inline]
    pub(super) fn shard_index(&self, hash: u64) -> usize {
        // Bits 24..56: hashbrown uses the low bits for the bucket and the top 7 for tags.
        let mid = (hash >> 24) & 0xFFFF_FFFF;
        ((mid * self.shards.len() as u64) >> 32) as usize
    }

    #[inline]
    pub(super) fn shard_of(&self, hash: u64) -> &Mutex<Shard<K, A>> {
        &self.shards[self.shard_index(hash)].0
    }

    /// The one check-and-update of one key.
    pub(crate) fn check_hashed<Q>(
        &self,
        key: &Q,
        hash: u64,
        now: u64,
        cost: u64,
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let mut guard = self.shard_of(hash).lock();
        let shard = &mut *guard;
        let own = override_in(&shard.overrides, hash, key);
        if let Some((_, state)) = shard.table.find_mut(hash, |(k, _)| k.borrow() == key) {
            return own
                .unwrap_or(&*shard.algorithm)
                .check(state, now, cost)
                .map_err(crate::limiter::capacity_error);
        }
        let own = own.cloned();
        let mut state = self.fresh_state_for(shard, hash, now, own.as_ref());
        let decision = own
            .as_ref()
            .unwrap_or(&*shard.algorithm)
            .check(&mut state, now, cost)
            .map_err(crate::limiter::capacity_error)?;
        if decision.allowed && cost > 0 {
            self.make_room(shard, hash, now);
            self.insert(shard, hash, key.to_owned(), state);
        }
        Ok(decision)
    }

    /// Runs `f` on the shard's algorithm and `key`'s state, inserting the state of an absent
    /// key first (see [`Shared::fresh_state_for`]).
    pub(crate) fn with_state<R>(
        &self,
        key: &K,
        hash: u64,
        now: u64,
        f: impl FnOnce(&A, &mut A::State) -> R,
    ) -> R {
        let mut shard = self.shard_of(hash).lock();
        let shard = &mut *shard;
        let own = override_in(&shard.overrides, hash, key);
        if let Some((_, state)) = shard.table.find_mut(hash, |(k, _)| k == key) {
            let algorithm = own.unwrap_or(&*shard.algorithm);
            let r = f(algorithm, state);
            // A store or a refund may have moved the state closer to idle.
            shard.next_idle = shard.next_idle.min(algorithm.idle_at(state));
            return r;
        }
        let own = own.cloned();
        // A load or a store passes no time: room is made as of the clock's time.
        let now = now.max(self.clock.now_ns());
        let state = self.fresh_state_for(shard, hash, now, own.as_ref());
        self.make_room(shard, hash, now);
        self.keys.fetch_add(1, Ordering::Relaxed);
        let entry = shard
            .table
            .insert_unique(hash, (key.clone(), state), |(k, _)| self.hasher.hash_one(k));
        let state = &mut entry.into_mut().1;
        let algorithm = own.as_ref().unwrap_or(&*shard.algorithm);
        let r = f(algorithm, state);
        let idle_at = algorithm.idle_at(state);
        shard.next_idle = shard.next_idle.min(idle_at);
        r
    }

    /// Sets `key` to `state` (with `replace` false, a key already held keeps its own). A state
    /// that is idle is not inserted. Returns whether the key now holds `state`.
    pub(super) fn put(
        &self,
        shard: &mut Shard<K, A>,
        hash: u64,
        key: K,
        state: A::State,
        now: u64,
        replace: bool,
    ) -> bool {
        let own = override_in(&shard.overrides, hash, &key);
        if let Some((_, held)) = shard.table.find_mut(hash, |(k, _)| *k == key) {
            if !replace {
                return false;
            }
            *held = state;
            let idle_at = own.unwrap_or(&*shard.algorithm).idle_at(held);
            shard.next_idle = shard.next_idle.min(idle_at);
            return true;
        }
        if own.unwrap_or(&*shard.algorithm).idle_at(&state) > now {
            self.make_room(shard, hash, now);
            self.insert(shard, hash, key, state);
            return true;
        }
        false
    }
}
