//! Who goes next inside one priority: a [`Level`]'s waiters, its flows taking turns one request
//! at a time, first come first served inside a flow.
//!
//! Owns the waiters and the turns. Knows nothing of the limiter, the time or the deadlines:
//! the rooms above decide who enters and leaves, this one keeps the order.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

#[derive(Debug, Clone)]
pub(super) struct Waiter<P> {
    pub(super) cost: u64,
    pub(super) flow: u64,
    pub(super) deadline: u64,
    /// When the queue expects to admit it, exact while the cached tail prediction stands (a
    /// replay that builds the tail records every waiter's); an admission at another time
    /// drops the tail.
    pub(super) predicted: u64,
    /// The caller's data for this waiter (a waker, a promise index...).
    pub(super) payload: P,
}

/// One flow's place in a level: its ticket ids and how many of them still wait.
#[derive(Debug)]
pub(super) struct Flow {
    /// Ticket ids in arrival order; ids no longer in `Level::waiters` are skipped.
    ids: VecDeque<u64>,
    /// How many of `ids` still wait; the flow is dropped when none does.
    live: usize,
    /// Which of the flow's stays in the turns this is (see `Level::turns`).
    stay: u64,
}

#[derive(Debug)]
pub(super) struct Level<P> {
    /// Live waiters by ticket id (ascending id = arrival order).
    pub(super) waiters: BTreeMap<u64, Waiter<P>>,
    /// The flows with live waiters.
    pub(super) flows: BTreeMap<u64, Flow>,
    /// `(flow, stay)` in the order the flows take turns. A flow leaves the turns as soon as
    /// none of its requests waits (whether served, cancelled, expired or turned away at the
    /// door) and comes back at the end with its next request; the entry of a stay that ended
    /// is skipped lazily.
    pub(super) turns: VecDeque<(u64, u64)>,
    /// The next `Flow::stay`.
    stays: u64,
}

impl<P> Default for Level<P> {
    fn default() -> Level<P> {
        Level {
            waiters: BTreeMap::new(),
            flows: BTreeMap::new(),
            turns: VecDeque::new(),
            stays: 0,
        }
    }
}

impl<P> Level<P> {
    /// Whether a turn entry belongs to a flow's current stay.
    fn current(&self, (flow, stay): (u64, u64)) -> bool {
        self.flows.get(&flow).is_some_and(|f| f.stay == stay)
    }

    /// Adds a waiter at the end of its flow; a flow that had none joins the end of the turns.
    pub(super) fn push(&mut self, id: u64, waiter: Waiter<P>) {
        let flow = waiter.flow;
        self.waiters.insert(id, waiter);
        if let Some(f) = self.flows.get_mut(&flow) {
            f.ids.push_back(id);
            f.live += 1;
            return;
        }
        let stay = self.stays;
        self.stays += 1;
        self.flows.insert(
            flow,
            Flow {
                ids: VecDeque::from([id]),
                live: 1,
                stay,
            },
        );
        self.turns.push_back((flow, stay));
    }

    /// Removes a waiter wherever it stands (cancelled, expired, turned away); its flow keeps
    /// its turn unless it has no one left. Leaves no trace of the latest arrival.
    pub(super) fn take(&mut self, id: u64) -> Option<Waiter<P>> {
        let waiter = self.waiters.remove(&id)?;
        if let Some(f) = self.flows.get_mut(&waiter.flow) {
            if f.ids.back() == Some(&id) {
                f.ids.pop_back();
            }
            f.live -= 1;
            if f.live == 0 {
                let stay = f.stay;
                self.flows.remove(&waiter.flow);
                if self.turns.back() == Some(&(waiter.flow, stay)) {
                    self.turns.pop_back();
                }
            }
        }
        Some(waiter)
    }

    /// The id at the head of this level, dropping stale ids and ended stays on the way.
    pub(super) fn head(&mut self) -> Option<u64> {
        while let Some(&(flow, stay)) = self.turns.front() {
            if let Some(f) = self.flows.get_mut(&flow).filter(|f| f.stay == stay) {
                while let Some(&id) = f.ids.front() {
                    if self.waiters.contains_key(&id) {
                        return Some(id);
                    }
                    f.ids.pop_front();
                }
            }
            self.turns.pop_front();
        }
        None
    }

    /// Removes the head (just served or timed out) and passes the turn to the next flow.
    pub(super) fn pop_head(&mut self, id: u64) -> Option<Waiter<P>> {
        let waiter = self.waiters.remove(&id)?;
        let turn = self.turns.pop_front();
        if let Some(f) = self.flows.get_mut(&waiter.flow) {
            if f.ids.front() == Some(&id) {
                f.ids.pop_front();
            }
            f.live -= 1;
            if f.live == 0 {
                self.flows.remove(&waiter.flow);
            } else if let Some(turn) = turn {
                self.turns.push_back(turn);
            }
        }
        Some(waiter)
    }

    /// Live waiters in service order (round robin across flows).
    pub(super) fn service_order(&self, out: &mut Vec<u64>) {
        self.service_order_while(|id| {
            out.push(id);
            true
        });
    }

    /// Hands live waiters to `each` in service order until it returns false; returns
    /// whether it did.
    pub(super) fn service_order_while(&self, mut each: impl FnMut(u64) -> bool) -> bool {
        let mut cursors: Vec<(&Flow, usize)> = self
            .turns
            .iter()
            .filter(|&&turn| self.current(turn))
            .filter_map(|(flow, _)| self.flows.get(flow).map(|f| (f, 0)))
            .collect();
        let mut remaining = self.waiters.len();
        while remaining > 0 && !cursors.is_empty() {
            let mut next = Vec::with_capacity(cursors.len());
            for (f, mut at) in cursors {
                while at < f.ids.len() && !self.waiters.contains_key(&f.ids[at]) {
                    at += 1;
                }
                if at < f.ids.len() {
                    if !each(f.ids[at]) {
                        return true;
                    }
                    remaining -= 1;
                    next.push((f, at + 1));
                }
            }
            cursors = next;
        }
        false
    }

    /// Drops stale ids and ended stays once they outweigh the live entries.
    pub(super) fn compact(&mut self) {
        let queued: usize = self.flows.values().map(|f| f.ids.len()).sum();
        if queued > 2 * self.waiters.len() + 64 {
            for f in self.flows.values_mut() {
                f.ids.retain(|id| self.waiters.contains_key(id));
            }
        }
        if self.turns.len() > 2 * self.flows.len() + 64 {
            let flows = &self.flows;
            self.turns
                .retain(|(flow, stay)| flows.get(flow).is_some_and(|f| f.stay == *stay));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::queue::test_support::{cfg, run_until, tiny, S};
    use crate::queue::{Offer, Owned, Priority, Rejection, Ticket, WaitQueue};
    use crate::{Algorithm, Quota, TokenBucket};
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn flows_take_turns() {
        let alg = TokenBucket::new(Quota::parse(1, "10/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1000, 100));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 1);
        for _ in 0..50 {
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 1);
        }
        let Offer::Queued {
            ticket: quiet,
            wait_ns,
        } = q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 2)
        else {
            panic!()
        };
        // The busy flow's head goes first, then the quiet flow's turn.
        assert_eq!(wait_ns, 2 * S / 10);
        let out = run_until(&mut q, &alg, &mut st, 0, 100 * S);
        let pos = out.iter().position(|(_, t, _)| *t == quiet).unwrap();
        assert_eq!(pos, 1);
        assert_eq!(out[pos].0, 2 * S / 10);
    }

    #[test]
    fn a_flow_whose_requests_left_rejoins_the_turns_at_the_end() {
        // Capacity 1, spent: flow 1 waits (turn at 10), then flow 2 (at 20). Flow 1's request
        // is cancelled: flow 2 goes first, and flow 1's next request comes after it.
        let alg = tiny(1);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 10));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let Offer::Queued { ticket: first, .. } =
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 1)
        else {
            panic!()
        };
        let Offer::Queued { ticket: other, .. } =
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 2)
        else {
            panic!()
        };
        assert!(q.cancel(first));
        let Offer::Queued {
            ticket: again,
            wait_ns,
        } = q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 1)
        else {
            panic!()
        };
        assert_eq!(wait_ns, 20);
        let out = run_until(&mut q, &alg, &mut st, 0, 100);
        let got: Vec<(u64, Ticket)> = out.iter().map(|&(at, t, _)| (at, t)).collect();
        assert_eq!(got, vec![(10, other), (20, again)]);

        // The same for a request turned away at the door (its wait exceeded its maximum).
        let alg = tiny(2);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1, 0));
        q.offer(&alg, &mut Owned(&mut st), 0, 2, Priority::High, 0);
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 2, Priority::Normal, 1),
            Offer::Rejected(Rejection::Timeout { .. })
        ));
        assert!(matches!(
            q.offer_with_max_wait(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 2, 10),
            Offer::Queued { wait_ns: 10, .. }
        ));
        // Flow 1's next request would wait behind flow 2's: 20 ns, not 10.
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 1),
            Offer::Rejected(Rejection::QueueFull { retry_after_ns: 20 })
        ));
    }
}
