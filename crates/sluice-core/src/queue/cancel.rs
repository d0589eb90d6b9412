//! Leaving early: [`WaitQueue::cancel`] withdraws a waiter whose caller went away, and
//! [`WaitQueue::close`] turns every waiter away and refuses newcomers.
//!
//! Removes waiters only: admits no one and consumes nothing. A cancelled waiter's place is
//! free at once, and the predictions of those behind it are made afresh.

use crate::queue::{Outcome, Ticket, WaitQueue};

impl<S: Clone, P: Default> WaitQueue<S, P> {
    /// Withdraws a waiting request (its caller went away). Returns whether it was still
    /// waiting; if not, it was already admitted, timed out or closed.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        let removed = self.remove(ticket).is_some();
        if removed {
            self.tail = None;
        }
        removed
    }

    /// Turns every waiter away with [`Outcome::Closed`] and refuses new offers.
    pub fn close<F: FnMut(Ticket, Outcome)>(&mut self, mut emit: F) {
        self.close_with(|t, o, _| emit(t, o));
    }

    /// [`WaitQueue::close`], handing each waiter's payload back.
    pub fn close_with<F: FnMut(Ticket, Outcome, P)>(&mut self, mut emit: F) {
        self.closed = true;
        for level in &mut self.levels {
            for (id, waiter) in core::mem::take(&mut level.waiters) {
                emit(
                    Ticket {
                        id,
                        flow: waiter.flow,
                    },
                    Outcome::Closed,
                    waiter.payload,
                );
            }
            level.flows.clear();
            level.turns.clear();
        }
        self.deadlines.clear();
        self.len = 0;
        self.tail = None;
    }
}

#[cfg(test)]
mod tests {
    use crate::queue::test_support::{cfg, run_until, S};
    use crate::queue::{Offer, Outcome, Owned, Priority, Rejection, WaitQueue};
    use crate::{Algorithm, Gcra, Quota};
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn cancel_frees_the_place() {
        let alg = Gcra::new(Quota::parse(1, "1/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(3, 100));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let mut ts = vec![];
        for _ in 0..3 {
            if let Offer::Queued { ticket, .. } =
                q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0)
            {
                ts.push(ticket);
            }
        }
        assert_eq!(q.len(), 3);
        assert!(q.cancel(ts[0]));
        assert!(!q.cancel(ts[0]));
        assert_eq!(q.len(), 2);
        // The place is free and the next newcomer is predicted one second earlier.
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
            Offer::Queued { wait_ns, .. } if wait_ns == 3 * S
        ));
        let out = run_until(&mut q, &alg, &mut st, 0, 100 * S);
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, vec![S, 2 * S, 3 * S]);
    }

    #[test]
    fn close_turns_everyone_away() {
        let alg = Gcra::new(Quota::parse(1, "1/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 100));
        for _ in 0..4 {
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        }
        let mut closed = 0;
        q.close(|_, o| {
            assert_eq!(o, Outcome::Closed);
            closed += 1
        });
        assert_eq!(closed, 3);
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
            Offer::Rejected(Rejection::Closed)
        ));
    }
}
