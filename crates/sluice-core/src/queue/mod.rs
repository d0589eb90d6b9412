//! The wait queue policy: who goes next, when to wake, who has waited too long.
//!
//! [`WaitQueue`] decides, it never waits: it has no clock, no timer and no wakers. The caller
//! (tokio in the `sluice` crate, `setTimeout` in the browser, a virtual clock in the simulator)
//! offers requests, calls [`WaitQueue::poll`] at the time it returns, and delivers the
//! [`Outcome`]s. Keeping the policy here is what makes the gateway, the Service Worker and
//! `sluice simulate` queue exactly alike.
//!
//! Order of service: strict priority ([`Priority::High`] first); inside a priority, flows (for
//! example browser tabs) take turns one request at a time, so a busy flow cannot starve a quiet
//! one; inside a flow, first come first served. A newcomer never overtakes a waiter of its own
//! priority and flow: while anyone waits, an immediate admission is refused to newcomers.
//!
//! Admission control happens at the door: a request whose predicted wait already exceeds its
//! maximum wait is refused at once with the exact predicted wait, and one that finds the queue
//! at its depth limit is refused with [`Rejection::QueueFull`]. The prediction replays the
//! queue on a copy of the limiter state, so it is exact as long as nothing else consumes the
//! same tokens; the deadline is enforced at poll time in any case.

// The rooms, in the order the policy reads: what a waiter holds and how urgent it is
// (`ticket`), what the queue answers (`outcome`), where the limiter state lives (`state`), who
// goes next inside one priority (`level`), the door (`admission`), serving and deadlines
// (`poll`), leaving early (`cancel`), and the predictions the door and the deadlines rely on
// (`predict`). `WaitQueue`'s fields are declared here and its shared bookkeeping (insert,
// remove, head) lives here; every other room is one `impl` block of it, or a type below it.

mod admission;
mod cancel;
mod level;
mod outcome;
mod poll;
mod predict;
mod state;
mod ticket;

pub use outcome::{Offer, Outcome, Rejection};
pub use state::{Owned, StateAccess};
pub use ticket::{Priority, Ticket};

use alloc::collections::BinaryHeap;
use core::cmp::Reverse;

use level::{Level, Waiter};
use predict::Tail;

/// Limits of a wait queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// The most requests that may wait at once; zero means no queue (deny at once).
    pub depth: usize,
    /// The longest a request may wait, in nanoseconds.
    pub max_wait_ns: u64,
}

impl QueueConfig {
    /// No queue: every request that cannot be admitted at once is denied.
    pub const NONE: QueueConfig = QueueConfig {
        depth: 0,
        max_wait_ns: 0,
    };
}

/// A wait queue in front of one limiter state. See the [module docs](self).
///
/// `S` is the algorithm's state (for predictions); `P` is data the caller attaches to each
/// waiter (see [`WaitQueue::payload_mut`]) and gets back with its outcome from
/// [`WaitQueue::poll_timed`].
///
/// # Examples
///
/// ```
/// use sluice_core::queue::{Offer, Outcome, Owned, Priority, QueueConfig, WaitQueue};
/// use sluice_core::{Algorithm, Quota, TokenBucket};
///
/// let bucket = TokenBucket::new(Quota::parse(1, "1/s").unwrap());
/// let mut state = bucket.initial_state();
/// let mut queue = WaitQueue::new(QueueConfig { depth: 10, max_wait_ns: 5_000_000_000 });
///
/// let first = queue.offer(&bucket, &mut Owned(&mut state), 0, 1, Priority::Normal, 0);
/// assert!(matches!(first, Offer::Admitted(_)));
/// let Offer::Queued { ticket, wait_ns } = queue.offer(&bucket, &mut Owned(&mut state), 0, 1, Priority::Normal, 0) else {
///     panic!("expected to wait");
/// };
/// assert_eq!(wait_ns, 1_000_000_000);
///
/// let mut admitted = Vec::new();
/// let wake = queue.poll(&bucket, &mut Owned(&mut state), 0, |t, o| admitted.push((t, o)));
/// assert_eq!(wake, Some(1_000_000_000)); // poll again then
/// assert!(admitted.is_empty());
/// queue.poll(&bucket, &mut Owned(&mut state), 1_000_000_000, |t, o| admitted.push((t, o)));
/// assert!(matches!(admitted[..], [(t, Outcome::Admitted(_))] if t == ticket));
/// ```
#[derive(Debug)]
pub struct WaitQueue<S, P = ()> {
    config: QueueConfig,
    levels: [Level<P>; Priority::COUNT],
    len: usize,
    next_id: u64,
    /// `(deadline, id)` of waiters; entries of waiters already gone are skipped lazily.
    deadlines: BinaryHeap<Reverse<(u64, u64)>>,
    tail: Option<Tail<S>>,
    closed: bool,
}

impl<S: Clone> WaitQueue<S, ()> {
    /// An empty queue whose waiters carry no payload.
    pub fn new(config: QueueConfig) -> WaitQueue<S, ()> {
        WaitQueue::with_payload(config)
    }
}

impl<S: Clone, P: Default> WaitQueue<S, P> {
    /// An empty queue whose waiters each carry a `P` (see [`WaitQueue::payload_mut`]).
    pub fn with_payload(config: QueueConfig) -> WaitQueue<S, P> {
        WaitQueue {
            config,
            levels: Default::default(),
            len: 0,
            next_id: 0,
            deadlines: BinaryHeap::new(),
            tail: None,
            closed: false,
        }
    }

    /// The limits.
    pub const fn config(&self) -> QueueConfig {
        self.config
    }

    /// Changes the limits; waiters already queued keep their deadlines. Call it too when the
    /// algorithm or its state changed under the queue (a new quota): the predictions it keeps
    /// are dropped, and the next poll computes them afresh.
    pub fn set_config(&mut self, config: QueueConfig) {
        self.config = config;
        self.tail = None;
    }

    /// Requests waiting now.
    pub const fn len(&self) -> usize {
        self.len
    }

    /// Whether no request waits.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether [`WaitQueue::close`] was called.
    pub const fn is_closed(&self) -> bool {
        self.closed
    }

    /// Requests waiting at `priority`.
    pub fn len_at(&self, priority: Priority) -> usize {
        self.levels[priority.index()].waiters.len()
    }

    /// The data attached to a waiting request, if it still waits.
    pub fn payload_mut(&mut self, ticket: Ticket) -> Option<&mut P> {
        self.levels[ticket.priority().index()]
            .waiters
            .get_mut(&ticket.id)
            .map(|w| &mut w.payload)
    }

    /// The data attached to every waiting request, in no particular order (for example to wake
    /// them all when whatever drove the queue went away).
    pub fn payloads_mut(&mut self) -> impl Iterator<Item = &mut P> + '_ {
        self.levels
            .iter_mut()
            .flat_map(|level| level.waiters.values_mut().map(|w| &mut w.payload))
    }

    // === the waiters' bookkeeping, shared by every room ===

    fn insert(
        &mut self,
        now: u64,
        cost: u64,
        priority: Priority,
        flow: u64,
        deadline: u64,
    ) -> Ticket {
        let id = (self.next_id << 2) | priority.index() as u64;
        self.next_id += 1;
        self.levels[priority.index()].push(
            id,
            Waiter {
                cost,
                flow,
                deadline,
                predicted: now,
                payload: P::default(),
            },
        );
        self.len += 1;
        Ticket { id, flow }
    }

    fn remove(&mut self, ticket: Ticket) -> Option<Waiter<P>> {
        let removed = self.levels[ticket.priority().index()].take(ticket.id);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    fn head(&mut self) -> Option<(usize, u64)> {
        for (i, level) in self.levels.iter_mut().enumerate() {
            if let Some(id) = level.head() {
                return Some((i, id));
            }
        }
        None
    }
}

#[cfg(test)]
mod test_support;
