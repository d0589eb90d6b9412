//! [`Bank`]: limiters by handle, each one bucket and its wait queue, driven by the caller's
//! clock. Safe Rust; the `extern "C"` layer only converts numbers.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use sluice_core::queue::{
    Offer, Outcome, Owned, Priority, QueueConfig, Rejection, Ticket, WaitQueue,
};
use sluice_core::{Algorithm, AnyAlgorithm, AnyState, Kind, Quota};

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No token now, and the request may not wait (no queue, or a maximum wait of zero).
    Limited,
    /// The queue is at its depth.
    QueueFull,
    /// The predicted wait exceeds the maximum wait.
    Timeout,
    /// The cost exceeds the capacity: no wait could ever admit it.
    TooCostly,
    /// The limiter was closed.
    Closed,
}

/// What [`Limiter::offer`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted at once; the cost is consumed.
    Admitted {
        /// Whole tokens left.
        remaining: u64,
    },
    /// Waiting: a later [`Limiter::poll`] delivers the outcome for `ticket`.
    Queued {
        /// The claim, for [`Limiter::cancel`] and to match outcomes.
        ticket: u64,
        /// Predicted nanoseconds until admission.
        wait_ns: u64,
    },
    /// Turned away.
    Rejected {
        /// Why.
        reason: Reason,
        /// Predicted nanoseconds until the same cost could be admitted (0 when unknown).
        retry_after_ns: u64,
    },
}

/// What became of a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Admitted; its cost is consumed.
    Admitted,
    /// Its deadline passed first.
    TimedOut {
        /// Predicted nanoseconds it would still have had to wait.
        retry_after_ns: u64,
    },
    /// The limiter was closed.
    Closed,
}

/// One outcome of [`Limiter::poll`] or [`Limiter::close`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    /// The ticket [`Limiter::offer`] handed out.
    pub ticket: u64,
    /// What became of it.
    pub delivery: Delivery,
}

/// The bucket as of a moment, without changing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// Whole tokens available now.
    pub remaining: u64,
    /// The capacity.
    pub limit: u64,
    /// Requests waiting.
    pub queued: u64,
    /// Nanoseconds until the bucket is full again (0: full, it remembers nothing).
    pub reset_after_ns: u64,
}

/// One limiter: an algorithm, its state, and a fair wait queue in front of it.
///
/// Time is the caller's monotonic count of nanoseconds; a time earlier than one already seen
/// counts as that one.
#[derive(Debug)]
pub struct Limiter {
    algorithm: AnyAlgorithm,
    state: AnyState,
    queue: WaitQueue<AnyState>,
    /// Live tickets by id: the ABI names a ticket by its id alone.
    tickets: BTreeMap<u64, Ticket>,
    now: u64,
    outcomes: Vec<Delivered>,
}

impl Limiter {
    /// A full bucket with an empty queue.
    pub fn new(kind: Kind, quota: Quota, queue: QueueConfig) -> Limiter {
        let algorithm = AnyAlgorithm::new(kind, quota);
        Limiter {
            state: algorithm.initial_state(),
            algorithm,
            queue: WaitQueue::new(queue),
            tickets: BTreeMap::new(),
            now: 0,
            outcomes: Vec::new(),
        }
    }

    /// Capacity and rate.
    pub fn quota(&self) -> Quota {
        self.algorithm.quota()
    }

    fn tick(&mut self, now: u64) -> u64 {
        self.now = self.now.max(now);
        self.now
    }

    /// Offers a request of `cost` at `priority`. `max_wait_ns` overrides the queue's maximum
    /// wait for this request; `Some(0)` means "never queue": admitted at once or
    /// [`Reason::Limited`].
    pub fn offer(
        &mut self,
        now: u64,
        cost: u64,
        priority: Priority,
        max_wait_ns: Option<u64>,
    ) -> Verdict {
        let now = self.tick(now);
        let max_wait = max_wait_ns.unwrap_or(self.queue.config().max_wait_ns);
        let offer = self.queue.offer_with_max_wait(
            &self.algorithm,
            &mut Owned(&mut self.state),
            now,
            cost,
            priority,
            0,
            max_wait,
        );
        match offer {
            Offer::Admitted(d) => Verdict::Admitted {
                remaining: d.remaining,
            },
            Offer::Queued { ticket, wait_ns } => {
                self.tickets.insert(ticket.id(), ticket);
                Verdict::Queued {
                    ticket: ticket.id(),
                    wait_ns,
                }
            }
            Offer::Rejected(r) => {
                let retry_after_ns = r.retry_after_ns().unwrap_or(0);
                let reason = match r {
                    Rejection::Limited { .. } => Reason::Limited,
                    Rejection::QueueFull { .. } => Reason::QueueFull,
                    // A request that may not wait at all was turned away by the limit itself.
                    Rejection::Timeout { .. } if max_wait == 0 => Reason::Limited,
                    Rejection::Timeout { .. } => Reason::Timeout,
                    Rejection::InsufficientCapacity { .. } => Reason::TooCostly,
                    Rejection::Closed => Reason::Closed,
                };
                Verdict::Rejected {
                    reason,
                    retry_after_ns,
                }
            }
        }
    }

    /// Admits the waiters whose turn has come and times out the late ones, as of `now`; the
    /// outcomes are then in [`Limiter::outcomes`]. Returns when to poll next (`None`: nobody
    /// waits).
    pub fn poll(&mut self, now: u64) -> Option<u64> {
        let now = self.tick(now);
        self.outcomes.clear();
        let (outcomes, tickets) = (&mut self.outcomes, &mut self.tickets);
        self.queue.poll(
            &self.algorithm,
            &mut Owned(&mut self.state),
            now,
            |ticket, outcome| {
                tickets.remove(&ticket.id());
                outcomes.push(deliver(ticket, outcome));
            },
        )
    }

    /// The outcomes of the last [`Limiter::poll`] or [`Limiter::close`].
    pub fn outcomes(&self) -> &[Delivered] {
        &self.outcomes
    }

    /// Withdraws a waiting request; it spent nothing. Returns whether it was still waiting.
    pub fn cancel(&mut self, ticket: u64) -> bool {
        match self.tickets.remove(&ticket) {
            Some(t) => self.queue.cancel(t),
            None => false,
        }
    }

    /// Turns every waiter away ([`Delivery::Closed`], in [`Limiter::outcomes`]) and refuses
    /// new offers.
    pub fn close(&mut self) {
        self.outcomes.clear();
        let outcomes = &mut self.outcomes;
        self.queue
            .close(|ticket, outcome| outcomes.push(deliver(ticket, outcome)));
        self.tickets.clear();
    }

    /// The bucket as of `now`, without changing it.
    pub fn status(&self, now: u64) -> Status {
        let now = self.now.max(now);
        let mut probe = self.state.clone();
        let query = self.algorithm.check(&mut probe, now, 0);
        let (remaining, reset_after_ns) = query.map_or((0, 0), |d| (d.remaining, d.reset_after_ns));
        Status {
            remaining,
            limit: self.quota().capacity(),
            queued: self.queue.len() as u64,
            reset_after_ns,
        }
    }
}

fn deliver(ticket: Ticket, outcome: Outcome) -> Delivered {
    Delivered {
        ticket: ticket.id(),
        delivery: match outcome {
            Outcome::Admitted(_) => Delivery::Admitted,
            Outcome::TimedOut { retry_after_ns } => Delivery::TimedOut { retry_after_ns },
            Outcome::Closed => Delivery::Closed,
        },
    }
}

/// Limiters by handle. A dropped handle's slot is reused by the next [`Bank::create`].
#[derive(Debug, Default)]
pub struct Bank {
    slots: Vec<Option<Limiter>>,
    free: Vec<u32>,
}

impl Bank {
    /// Adds a limiter and returns its handle.
    pub fn create(&mut self, kind: Kind, quota: Quota, queue: QueueConfig) -> u32 {
        let limiter = Limiter::new(kind, quota, queue);
        match self.free.pop() {
            Some(h) => {
                self.slots[h as usize] = Some(limiter);
                h
            }
            None => {
                self.slots.push(Some(limiter));
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// The limiter of `handle`, if it exists.
    pub fn get_mut(&mut self, handle: u32) -> Option<&mut Limiter> {
        self.slots.get_mut(handle as usize)?.as_mut()
    }

    /// Removes the limiter of `handle`; its waiters are forgotten. Returns whether it existed.
    pub fn drop_limiter(&mut self, handle: u32) -> bool {
        match self.slots.get_mut(handle as usize) {
            Some(slot @ Some(_)) => {
                *slot = None;
                self.free.push(handle);
                true
            }
            _ => false,
        }
    }

    /// Limiters alive.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no limiter is alive.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn queue(depth: usize, max_wait_ns: u64) -> QueueConfig {
        QueueConfig { depth, max_wait_ns }
    }

    #[test]
    fn handles_are_reused_and_independent() {
        let mut bank = Bank::default();
        let q = Quota::parse(2, "1/s").unwrap();
        let a = bank.create(Kind::Gcra, q, QueueConfig::NONE);
        let b = bank.create(Kind::Gcra, q, QueueConfig::NONE);
        assert_ne!(a, b);
        for _ in 0..2 {
            assert!(matches!(
                bank.get_mut(a).unwrap().offer(0, 1, Priority::Normal, None),
                Verdict::Admitted { .. }
            ));
        }
        assert_eq!(
            bank.get_mut(a).unwrap().offer(0, 1, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::Limited,
                retry_after_ns: SEC
            }
        );
        assert!(matches!(
            bank.get_mut(b).unwrap().offer(0, 1, Priority::Normal, None),
            Verdict::Admitted { remaining: 1 }
        ));
        assert!(bank.drop_limiter(a));
        assert!(!bank.drop_limiter(a));
        assert!(bank.get_mut(a).is_none());
        assert_eq!(bank.create(Kind::Gcra, q, QueueConfig::NONE), a);
        assert_eq!(bank.len(), 2);
    }

    #[test]
    fn cancel_spends_nothing_and_timeouts_are_reported() {
        let mut l = Limiter::new(
            Kind::TokenBucket,
            Quota::parse(1, "1/s").unwrap(),
            queue(2, 3 * SEC),
        );
        assert!(matches!(
            l.offer(0, 1, Priority::Normal, None),
            Verdict::Admitted { remaining: 0 }
        ));
        let Verdict::Queued { ticket, .. } = l.offer(0, 1, Priority::Normal, None) else {
            panic!("queued")
        };
        assert!(l.cancel(ticket));
        assert!(!l.cancel(ticket));
        // The cancelled waiter took nothing: one token at 1 s, as if it never came.
        assert_eq!(
            l.offer(0, 1, Priority::Normal, Some(0)),
            Verdict::Rejected {
                reason: Reason::Limited,
                retry_after_ns: SEC
            }
        );
        assert_eq!(l.status(SEC).remaining, 1);
        // A waiter that cannot be admitted before its deadline is refused at the door.
        assert_eq!(
            l.offer(0, 1, Priority::Normal, Some(SEC / 2)),
            Verdict::Rejected {
                reason: Reason::Timeout,
                retry_after_ns: SEC
            }
        );
        let Verdict::Queued { ticket, wait_ns } = l.offer(0, 1, Priority::Normal, None) else {
            panic!("queued")
        };
        assert_eq!(wait_ns, SEC);
        assert_eq!(l.poll(SEC / 2), Some(SEC));
        assert!(l.outcomes().is_empty());
        assert_eq!(l.poll(SEC), None);
        assert_eq!(
            l.outcomes(),
            &[Delivered {
                ticket,
                delivery: Delivery::Admitted
            }]
        );
        assert_eq!(l.status(SEC).queued, 0);
        l.close();
        assert_eq!(
            l.offer(10 * SEC, 1, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::Closed,
                retry_after_ns: 0
            }
        );
    }

    #[test]
    fn status_tells_a_full_bucket() {
        let mut l = Limiter::new(
            Kind::SlidingWindow,
            Quota::parse(10, "10/s").unwrap(),
            QueueConfig::NONE,
        );
        assert_eq!(l.status(0).reset_after_ns, 0);
        assert!(matches!(
            l.offer(0, 3, Priority::Normal, None),
            Verdict::Admitted { remaining: 7 }
        ));
        let st = l.status(0);
        assert_eq!((st.remaining, st.limit, st.queued), (7, 10, 0));
        assert!(st.reset_after_ns > 0);
        assert_eq!(l.status(10 * SEC).reset_after_ns, 0);
    }
}
