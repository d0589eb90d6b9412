//! The algorithm a waiting key's queue plans with: the table's own, whatever it is now.
//!
//! A key's queue predicts waits and deadlines with an algorithm; its admissions go through the
//! table's entry ([`KeyCell`](crate::keyed::cell::KeyCell)), which decides with the table's
//! algorithm under the shard's lock. When the table is reconfigured (a new quota), the queue
//! must plan with the new one too: it holds this handle on the table's current algorithm
//! instead of a copy.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use sluice_core::{Algorithm, CheckError, Decision, Kind, Quota, SavedState, SnapshotError};

use crate::cell::{LocalAlgorithm, MutexCell};

/// The table's current algorithm, shared with the queues of its waiting keys.
///
/// Each call reads it under a short read lock, never held across another lock.
pub(crate) struct Follow<A> {
    pub(crate) current: Arc<RwLock<A>>,
}

impl<A> Clone for Follow<A> {
    fn clone(&self) -> Self {
        Follow {
            current: Arc::clone(&self.current),
        }
    }
}

impl<A: Algorithm> Algorithm for Follow<A> {
    type State = A::State;

    fn kind(&self) -> Kind {
        self.current.read().kind()
    }

    fn quota(&self) -> Quota {
        self.current.read().quota()
    }

    fn initial_state(&self) -> A::State {
        self.current.read().initial_state()
    }

    fn exhausted_state(&self, now: u64) -> A::State {
        self.current.read().exhausted_state(now)
    }

    fn check(&self, state: &mut A::State, now: u64, cost: u64) -> Result<Decision, CheckError> {
        self.current.read().check(state, now, cost)
    }

    fn refund(&self, state: &mut A::State, admitted_at: u64, now: u64, cost: u64) {
        self.current.read().refund(state, admitted_at, now, cost);
    }

    fn charge(&self, state: &mut A::State, now: u64, cost: u64, max_debt: u64) -> u64 {
        self.current.read().charge(state, now, cost, max_debt)
    }

    fn idle_at(&self, state: &A::State) -> u64 {
        self.current.read().idle_at(state)
    }

    fn save(&self, state: &A::State, now: u64) -> SavedState {
        self.current.read().save(state, now)
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<A::State, SnapshotError> {
        self.current.read().restore(saved, now, elapsed_ns)
    }
}

impl<A: LocalAlgorithm> LocalAlgorithm for Follow<A> {
    type Cell = MutexCell<A::State>;

    fn cell(&self, state: A::State) -> MutexCell<A::State> {
        MutexCell(Mutex::new(state))
    }
}
