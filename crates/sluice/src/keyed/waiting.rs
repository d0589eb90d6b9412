//! The queues of waiting keys: a key that must wait gets a [`Limiter`] of its own over its
//! table entry, held by the `acquire` calls waiting on it and dropped with the last of them,
//! so that a key has one queue at a time and the map holds exactly the keys someone waits on.
//!
//! Owns the map of waiting keys and who holds each queue. Changes no key's state: it pins a
//! waiting key's entry so that it is not evicted, and the queue reads and updates the state
//! through the table ([`KeyCell`]).

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cell::LocalAlgorithm;
use crate::clock::Clock;
use crate::keyed::cell::KeyCell;
use crate::keyed::follow::Follow;
use crate::keyed::map::{Hasher, Key, Keyed, Shared};
use crate::keyed::shard::Padded;
use crate::limiter::{Builder, Limiter};

/// The limiter of a waiting key's queue.
pub(crate) type WaitLimiter<K, A, C> = Limiter<Follow<A>, C, KeyCell<K, A, C>>;

/// The limiter of one waiting key, with the number of `acquire` calls holding it.
pub(crate) struct WaitEntry<K: Key, A: LocalAlgorithm, C: Clock> {
    pub(super) limiter: WaitLimiter<K, A, C>,
    /// Tasks that took this limiter to wait on it and have not let go. Changed only under the
    /// shard's lock, and the entry is removed only when it falls to zero, so no task can
    /// hold a limiter that is no longer in the map: a key has one queue at a time.
    users: usize,
}

/// The per-key limiters of one shard's waiting keys.
pub(crate) type Waiters<K, A, C> = hashbrown::HashMap<K, WaitEntry<K, A, C>, Hasher>;

/// One shard of [`Waiters`], on its own cache line.
pub(crate) type WaitersShard<K, A, C> = Padded<Mutex<Waiters<K, A, C>>>;

impl<K, A: LocalAlgorithm, C: Clock + Clone> Keyed<K, A, C>
where
    K: Key,
{
    /// The limiter of `key`'s queue, made if the key has none, held for the caller until the
    /// returned guard is dropped.
    pub(super) fn waiting_limiter<'a, Q>(&'a self, key: &'a Q) -> Waiting<'a, K, A, C, Q>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let s = &*self.shared;
        let hash = s.hasher.hash_one(key);
        let mut waiters = s.waiters_of(hash).lock();
        if let Some(entry) = waiters.get_mut(key) {
            entry.users += 1;
            return Waiting {
                keyed: self,
                key,
                hash,
                limiter: entry.limiter.clone(),
            };
        }
        // The key's entry stays in the table while it has a queue.
        let gone = {
            let mut shard = s.shard_of(hash).lock();
            shard.pin(hash);
            shard.algorithm.exhausted_state(u64::MAX)
        };
        let owned = key.to_owned();
        let cell = KeyCell::new(Arc::downgrade(&self.shared), owned.clone(), hash, gone);
        let follow = Follow {
            current: Arc::clone(&s.current),
        };
        let limiter = Builder::new(follow)
            .clock(s.clock.clone())
            .queue_config(*s.queue.lock())
            .name(s.name.clone())
            .build_with_cell_and_metrics(cell, s.metrics.clone());
        waiters.insert(
            owned,
            WaitEntry {
                limiter: limiter.clone(),
                users: 1,
            },
        );
        s.waiting_keys.fetch_add(1, Ordering::AcqRel);
        Waiting {
            keyed: self,
            key,
            hash,
            limiter,
        }
    }
}

/// One `acquire` call's hold on its key's limiter. Dropping it lets go; the last holder
/// removes the limiter from the waiting map, so the map holds exactly the keys someone waits
/// on, whether their calls finish or are dropped.
pub(super) struct Waiting<'a, K, A, C, Q>
where
    K: Key + Borrow<Q>,
    A: LocalAlgorithm,
    C: Clock + Clone,
    Q: Hash + Eq + ?Sized,
{
    keyed: &'a Keyed<K, A, C>,
    key: &'a Q,
    hash: u64,
    pub(super) limiter: WaitLimiter<K, A, C>,
}

impl<K, A, C, Q> Drop for Waiting<'_, K, A, C, Q>
where
    K: Key + Borrow<Q>,
    A: LocalAlgorithm,
    C: Clock + Clone,
    Q: Hash + Eq + ?Sized,
{
    fn drop(&mut self) {
        let s = &*self.keyed.shared;
        let mut waiters = s.waiters_of(self.hash).lock();
        let Some(entry) = waiters.get_mut(self.key) else {
            debug_assert!(false, "a held waiting limiter left the map");
            return;
        };
        debug_assert!(Arc::ptr_eq(&entry.limiter.shared, &self.limiter.shared));
        entry.users -= 1;
        if entry.users == 0 {
            waiters.remove(self.key);
            s.waiting_keys.fetch_sub(1, Ordering::AcqRel);
            let mut shard = s.shard_of(self.hash).lock();
            shard.unpin(self.hash);
            // The sweeps skipped this key while it was pinned: it may be idle now.
            let own = crate::keyed::shard::override_in(&shard.overrides, self.hash, self.key);
            let idle_at = shard
                .table
                .find(self.hash, |(k, _)| k.borrow() == self.key)
                .map_or(u64::MAX, |(_, state)| {
                    own.unwrap_or(&*shard.algorithm).idle_at(state)
                });
            shard.next_idle = shard.next_idle.min(idle_at);
        }
    }
}

impl<K, A: LocalAlgorithm, C: Clock> Shared<K, A, C>
where
    K: Key,
{
    /// The waiting keys of the shard `hash` falls in.
    pub(super) fn waiters_of(&self, hash: u64) -> &Mutex<Waiters<K, A, C>> {
        &self.waiters[self.shard_index(hash)].0
    }

    /// The limiter of `key` while requests wait on it: then every check and refund of the key
    /// goes through its queue. One atomic load when no key has waiters.
    #[inline]
    pub(super) fn waiter<Q>(&self, key: &Q, hash: u64) -> Option<WaitLimiter<K, A, C>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.waiting_keys.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.waiters_of(hash)
            .lock()
            .get(key)
            .map(|entry| entry.limiter.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use sluice_core::{Gcra, Quota};

    use crate::keyed::map::Keyed;
    use crate::limiter::AcquireOptions;

    /// A task that has taken a key's limiter but not yet queued on it must keep that limiter
    /// the key's only one: when the last waiter before it leaves, the entry stays, and the next
    /// caller gets the same limiter (one queue per key, so FIFO holds across them).
    #[tokio::test(start_paused = true)]
    async fn a_limiter_taken_but_not_yet_queued_on_stays_the_keys_only_queue() {
        let keyed: Keyed<u64, Gcra> = Keyed::builder(Gcra::new(Quota::parse(1, "1/s").unwrap()))
            .queue(16, Duration::from_secs(60))
            .build();
        keyed.try_acquire(&7, 1).unwrap();

        // B queues on key 7 and waits for the refill.
        let b = tokio::spawn({
            let keyed = keyed.clone();
            async move { keyed.acquire(&7, 1, AcquireOptions::default()).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(keyed.waiting_keys(), 1, "B is queued");

        // A takes the key's limiter, as `acquire` does between its check and its enqueue.
        let a = keyed.waiting_limiter(&7);
        assert_eq!(a.limiter.queued(), 1, "only B is in the queue");

        // B is admitted and lets go of the key, while A holds the limiter with nothing queued.
        b.await.unwrap().unwrap();
        assert_eq!(a.limiter.queued(), 0);
        assert_eq!(
            keyed.waiting_keys(),
            1,
            "the key still has its queue, held by A"
        );

        // C arrives now: it must queue behind A on the same limiter, not on a second one.
        let c = keyed.waiting_limiter(&7);
        assert!(
            Arc::ptr_eq(&a.limiter.shared, &c.limiter.shared),
            "two limiters for one key: two queues, so FIFO breaks"
        );

        drop(a);
        assert_eq!(keyed.waiting_keys(), 1, "C still holds it");
        drop(c);
        assert_eq!(keyed.waiting_keys(), 0, "the last holder removes it");
    }
}
