//! Per-key FIFO queues of this process, for `acquire` over a remote store.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;
use parking_lot::Mutex;

type Hasher = foldhash::fast::RandomState;

/// The waiters of one key: a fair (FIFO) lock whose holder is the head of the queue.
#[derive(Debug, Default)]
pub(crate) struct KeyQueue {
    pub(crate) turn: tokio::sync::Mutex<()>,
    waiting: AtomicUsize,
}

/// The queues of the keys that have waiters now.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    map: Mutex<HashMap<String, Arc<KeyQueue>, Hasher>>,
}

/// A place in a key's queue; leaving (drop) gives it back and forgets an empty queue.
pub(crate) struct Place<'a> {
    queues: &'a Queues,
    key: &'a str,
    pub(crate) queue: Arc<KeyQueue>,
}

impl Queues {
    /// Whether `key` has waiters in this process (newcomers then queue behind them).
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        let map = self.map.lock();
        !map.is_empty() && map.contains_key(key)
    }

    /// Joins `key`'s queue, unless `depth` waiters are there already.
    pub(crate) fn join<'a>(&'a self, key: &'a str, depth: usize) -> Option<Place<'a>> {
        let mut map = self.map.lock();
        let queue = map.entry_ref(key).or_default().clone();
        if queue.waiting.load(Ordering::Relaxed) >= depth {
            if queue.waiting.load(Ordering::Relaxed) == 0 {
                map.remove(key);
            }
            return None;
        }
        queue.waiting.fetch_add(1, Ordering::Relaxed);
        Some(Place {
            queues: self,
            key,
            queue,
        })
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut map = self.queues.map.lock();
        if self.queue.waiting.fetch_sub(1, Ordering::Relaxed) == 1 {
            map.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_is_honoured_and_empty_queues_are_forgotten() {
        let queues = Queues::default();
        let a = queues.join("k", 2).unwrap();
        let b = queues.join("k", 2).unwrap();
        assert!(queues.join("k", 2).is_none());
        assert!(queues.has_waiters("k"));
        drop(a);
        let c = queues.join("k", 2).unwrap();
        drop((b, c));
        assert!(!queues.has_waiters("k"));
        assert!(queues.join("z", 0).is_none());
        assert!(!queues.has_waiters("z"));
    }
}
