//! The cell of a waiting key: its state stays in the table, the queue borrows it.

use std::sync::Weak;

use sluice_core::{CheckError, Decision};

use crate::cell::{LocalAlgorithm, StateCell};
use crate::clock::Clock;
use crate::keyed::follow::Follow;
use crate::keyed::map::{Key, Shared};

/// A [`StateCell`] that reads and updates one key's entry of a [`crate::Keyed`] table.
///
/// It decides with the table's algorithm, taken under the same shard lock as the state, not
/// with the one its queue passes in: the two always agree, even while the table is being
/// reconfigured, so a key's state is only ever read under the quota it is held in.
pub struct KeyCell<K: Key, A: LocalAlgorithm, C: Clock> {
    shared: Weak<Shared<K, A, C>>,
    key: K,
    hash: u64,
    /// What `load` answers once the table is gone: nothing left to admit.
    gone: A::State,
}

impl<K: Key, A: LocalAlgorithm, C: Clock> KeyCell<K, A, C> {
    pub(crate) fn new(shared: Weak<Shared<K, A, C>>, key: K, hash: u64, gone: A::State) -> Self {
        KeyCell {
            shared,
            key,
            hash,
            gone,
        }
    }
}

impl<K, A: LocalAlgorithm, C: Clock> StateCell<Follow<A>> for KeyCell<K, A, C>
where
    K: Key,
{
    fn check(&self, _: &Follow<A>, now: u64, cost: u64) -> Result<Decision, CheckError> {
        match self.shared.upgrade() {
            Some(shared) => shared.with_state(&self.key, self.hash, now, |algorithm, s| {
                algorithm.check(s, now, cost)
            }),
            None => Err(CheckError::StateMismatch),
        }
    }

    fn load(&self) -> A::State {
        match self.shared.upgrade() {
            Some(shared) => shared.with_state(&self.key, self.hash, 0, |_, s| s.clone()),
            None => self.gone.clone(),
        }
    }

    fn store(&self, state: A::State) {
        if let Some(shared) = self.shared.upgrade() {
            shared.with_state(&self.key, self.hash, 0, |_, s| *s = state);
        }
    }

    fn refund(&self, _: &Follow<A>, admitted_at: u64, now: u64, cost: u64) {
        if let Some(shared) = self.shared.upgrade() {
            shared.with_state(&self.key, self.hash, now, |algorithm, s| {
                algorithm.refund(s, admitted_at, now, cost)
            });
        }
    }
}
