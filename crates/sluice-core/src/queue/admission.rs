//! The door: [`WaitQueue::offer`] admits a request at once when nobody it would overtake waits
//! and the limit allows; otherwise it queues it, or turns it away (closed, above capacity,
//! queue full, a predicted wait beyond its maximum) with the wait to advertise.
//!
//! Decides at the door only: admitting waiters and enforcing their deadlines is `poll`'s.

use core::cmp::Reverse;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;
use crate::queue::{Offer, Priority, Rejection, StateAccess, WaitQueue};

impl<S: Clone, P: Default> WaitQueue<S, P> {
    /// Offers a request of `cost` at `now`, with the queue's own maximum wait.
    ///
    /// See [`WaitQueue::offer_with_max_wait`].
    pub fn offer<A, C>(
        &mut self,
        algorithm: &A,
        cell: &mut C,
        now: u64,
        cost: u64,
        priority: Priority,
        flow: u64,
    ) -> Offer
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        let max_wait = self.config.max_wait_ns;
        self.offer_with_max_wait(algorithm, cell, now, cost, priority, flow, max_wait)
    }

    /// Offers a request: admits it at once when nobody it would overtake is waiting and the
    /// limit allows; otherwise queues it, or turns it away when the queue is full or the
    /// predicted wait exceeds `max_wait_ns`.
    #[allow(clippy::too_many_arguments)]
    pub fn offer_with_max_wait<A, C>(
        &mut self,
        algorithm: &A,
        cell: &mut C,
        now: u64,
        cost: u64,
        priority: Priority,
        flow: u64,
        max_wait_ns: u64,
    ) -> Offer
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        if self.closed {
            return Offer::Rejected(Rejection::Closed);
        }
        let capacity = algorithm.quota().capacity();
        if cost > capacity {
            return Offer::Rejected(Rejection::InsufficientCapacity { cost, capacity });
        }
        if !self.blocks(priority) {
            match cell.check(algorithm, now, cost) {
                Ok(decision) if decision.allowed => {
                    if self.len > 0 {
                        // Tokens went ahead of lower priorities: their schedule moved.
                        self.tail = None;
                    }
                    return Offer::Admitted(decision);
                }
                Ok(decision) => {
                    if self.config.depth == 0 {
                        return Offer::Rejected(Rejection::Limited { decision });
                    }
                }
                Err(CheckError::InsufficientCapacity { cost, capacity }) => {
                    return Offer::Rejected(Rejection::InsufficientCapacity { cost, capacity })
                }
                Err(CheckError::StateMismatch) => return Offer::Rejected(Rejection::Closed),
            }
        }
        if self.config.depth == 0 {
            let retry_after_ns = self.peek_wait(algorithm, cell, now, cost, priority, flow);
            let decision = Decision {
                allowed: false,
                limit: capacity,
                remaining: 0,
                retry_after_ns,
                reset_after_ns: retry_after_ns,
            };
            return Offer::Rejected(Rejection::Limited { decision });
        }
        if self.len >= self.config.depth {
            let retry_after_ns = self.peek_wait(algorithm, cell, now, cost, priority, flow);
            return Offer::Rejected(Rejection::QueueFull { retry_after_ns });
        }
        let ticket = self.insert(now, cost, priority, flow, u64::MAX);
        let admit_at = self.predict(algorithm, cell, now, ticket, true);
        let wait_ns = admit_at - now;
        if wait_ns > max_wait_ns {
            self.remove(ticket);
            self.tail = None;
            return Offer::Rejected(Rejection::Timeout {
                retry_after_ns: wait_ns,
            });
        }
        let deadline = now.saturating_add(max_wait_ns);
        if let Some(w) = self.levels[priority.index()].waiters.get_mut(&ticket.id) {
            w.deadline = deadline;
            w.predicted = admit_at;
        }
        self.deadlines.push(Reverse((deadline, ticket.id)));
        Offer::Queued { ticket, wait_ns }
    }

    /// Whether a newcomer at `priority` would have to queue behind someone.
    fn blocks(&self, priority: Priority) -> bool {
        self.levels[..=priority.index()]
            .iter()
            .any(|l| !l.waiters.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use crate::queue::test_support::{cfg, tiny, S};
    use crate::queue::{Offer, Owned, Priority, QueueConfig, Rejection, WaitQueue};
    use crate::{Algorithm, Gcra, Quota};

    #[test]
    fn no_barging_and_queue_full_and_timeout_at_the_door() {
        let alg = Gcra::new(Quota::parse(1, "1/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(2, 3));
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
            Offer::Admitted(_)
        ));
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
            Offer::Queued { wait_ns, .. } if wait_ns == S
        ));
        // At t = 1 s a token exists, but the waiter has not been polled yet: no barging.
        let o = q.offer(&alg, &mut Owned(&mut st), S, 1, Priority::Normal, 0);
        assert!(
            matches!(o, Offer::Queued { wait_ns, .. } if wait_ns == S),
            "{o:?}"
        );
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), S, 1, Priority::Normal, 0),
            Offer::Rejected(Rejection::QueueFull { retry_after_ns }) if retry_after_ns == 2 * S
        ));
        let mut q2: WaitQueue<u64> = WaitQueue::new(cfg(10, 3));
        let mut st2 = alg.initial_state();
        for i in 0..4 {
            q2.offer(&alg, &mut Owned(&mut st2), 0, 1, Priority::Normal, 0);
            assert_eq!(q2.len(), i);
        }
        // The fifth would wait 4 s > 3 s: refused at once, with the exact wait.
        assert!(matches!(
            q2.offer(&alg, &mut Owned(&mut st2), 0, 1, Priority::Normal, 0),
            Offer::Rejected(Rejection::Timeout { retry_after_ns }) if retry_after_ns == 4 * S
        ));
        assert_eq!(q2.len(), 3);
    }

    #[test]
    fn no_queue_means_deny_at_once() {
        let alg = Gcra::new(Quota::parse(1, "1/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(QueueConfig::NONE);
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
            Offer::Rejected(Rejection::Limited { decision }) if decision.retry_after_ns == S
        ));
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 2, Priority::Normal, 0),
            Offer::Rejected(Rejection::InsufficientCapacity {
                cost: 2,
                capacity: 1
            })
        ));
    }

    #[test]
    fn an_admission_at_the_door_ahead_of_waiters_moves_their_predictions() {
        // A normal-priority waiter is due at 10; a high-priority request takes a token at the
        // door at 10 (nobody of its priority waits). A low-priority newcomer then waits behind
        // both: until 30, not 20.
        let alg = tiny(3);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1, 10));
        q.offer(&alg, &mut Owned(&mut st), 0, 2, Priority::High, 0);
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 10, 2, Priority::Normal, 0),
            Offer::Queued { wait_ns: 10, .. }
        ));
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 10, 1, Priority::High, 0),
            Offer::Admitted(_)
        ));
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 10, 1, Priority::Low, 0),
            Offer::Rejected(Rejection::QueueFull { retry_after_ns: 30 })
        ));
    }
}
