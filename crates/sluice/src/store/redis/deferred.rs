//! Settlements of Redis's own admissions that came due while Redis did not answer: kept, up to
//! a bound, and sent once it answers again, so that a pause, a restart or a failover neither
//! forgives a debt nor keeps a refund. Only settlements that were never sent are kept: one
//! whose reply was lost may have been applied, and is never sent again (it is counted as
//! unsettled instead, as one beyond the bound is).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// What is owed to one key.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Change {
    /// Give back `cost`, admitted at `admitted`.
    Refund {
        cost: u64,
        admitted: tokio::time::Instant,
    },
    /// Take `cost`, into debt down to `max_debt` tokens beyond empty.
    Charge { cost: u64, max_debt: u64 },
}

impl Change {
    /// The tokens it moves.
    pub(crate) fn cost(&self) -> u64 {
        match *self {
            Change::Refund { cost, .. } | Change::Charge { cost, .. } => cost,
        }
    }
}

/// The settlements waiting for Redis.
#[derive(Debug)]
pub(crate) struct Deferred {
    pending: Mutex<Vec<(String, Change)>>,
    /// Whether `pending` may hold any: read on every decision, so a plain flag.
    waiting: AtomicBool,
    /// Whether a task is sending them once Redis answers.
    flushing: AtomicBool,
    bound: usize,
}

impl Deferred {
    /// At most `bound` kept.
    pub(crate) fn new(bound: usize) -> Deferred {
        Deferred {
            pending: Mutex::new(Vec::new()),
            waiting: AtomicBool::new(false),
            flushing: AtomicBool::new(false),
            bound,
        }
    }

    /// Keeps `change` for `key`; `false` when the bound is reached (nothing kept).
    pub(crate) fn keep(&self, key: &str, change: Change) -> bool {
        let mut pending = self.pending.lock();
        if pending.len() >= self.bound {
            return false;
        }
        pending.push((key.to_owned(), change));
        self.waiting.store(true, Ordering::Release);
        true
    }

    /// Whether any may be waiting.
    ///
    /// # Memory ordering
    ///
    /// Acquire pairs with `keep`'s Release: a caller that sees the flag sees the entry.
    pub(crate) fn any(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }

    /// Claims the flushing task's place: `true` when no task held it.
    pub(crate) fn start_flusher(&self) -> bool {
        !self.flushing.swap(true, Ordering::AcqRel)
    }

    /// Gives the flushing task's place up.
    pub(crate) fn stop_flusher(&self) {
        self.flushing.store(false, Ordering::Release);
    }

    /// Takes every one kept, oldest first.
    pub(crate) fn take(&self) -> Vec<(String, Change)> {
        let mut pending = self.pending.lock();
        self.waiting.store(false, Ordering::Release);
        std::mem::take(&mut *pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_up_to_the_bound_and_taken_in_order() {
        let deferred = Deferred::new(2);
        assert!(!deferred.any());
        let charge = Change::Charge {
            cost: 5,
            max_debt: u64::MAX,
        };
        assert!(deferred.keep("a", charge));
        assert!(deferred.keep("b", charge));
        assert!(!deferred.keep("c", charge), "beyond the bound");
        assert!(deferred.any());
        let taken: Vec<String> = deferred.take().into_iter().map(|(k, _)| k).collect();
        assert_eq!(taken, ["a", "b"]);
        assert!(!deferred.any());
        assert_eq!(charge.cost(), 5);
    }
}
