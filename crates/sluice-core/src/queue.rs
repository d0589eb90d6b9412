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

use alloc::collections::{BTreeMap, BinaryHeap, VecDeque};
use alloc::vec::Vec;
use core::cmp::Reverse;

use crate::algorithm::Algorithm;
use crate::decision::Decision;
use crate::error::CheckError;

/// How urgent a waiting request is. Higher priorities are served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Served before everything else.
    High = 0,
    /// The default.
    #[default]
    Normal = 1,
    /// Served only when no higher priority waits.
    Low = 2,
}

impl Priority {
    const COUNT: usize = 3;

    const fn index(self) -> usize {
        self as usize
    }

    fn from_index(i: u64) -> Priority {
        match i {
            0 => Priority::High,
            1 => Priority::Normal,
            _ => Priority::Low,
        }
    }
}

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

/// A waiting request's claim, handed back to [`WaitQueue::cancel`] and named in outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    id: u64,
    flow: u64,
}

impl Ticket {
    /// A number unique among this queue's tickets.
    pub const fn id(&self) -> u64 {
        self.id
    }

    /// The flow the request was offered in.
    pub const fn flow(&self) -> u64 {
        self.flow
    }

    /// The priority the request was offered at.
    pub fn priority(&self) -> Priority {
        Priority::from_index(self.id & 3)
    }
}

/// Why a request was turned away at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Admission needs no wait but the limit says no, and there is no queue.
    Limited {
        /// The decision, with its `retry_after_ns`.
        decision: Decision,
    },
    /// The queue is at its depth limit.
    QueueFull {
        /// Predicted nanoseconds until this cost could be admitted.
        retry_after_ns: u64,
    },
    /// The predicted wait exceeds the maximum wait.
    Timeout {
        /// Predicted nanoseconds until this cost could be admitted.
        retry_after_ns: u64,
    },
    /// The cost exceeds the capacity; it can never be admitted.
    InsufficientCapacity {
        /// The cost asked for.
        cost: u64,
        /// The capacity.
        capacity: u64,
    },
    /// The queue was closed.
    Closed,
}

impl Rejection {
    /// The wait to advertise in `Retry-After`, if any.
    pub const fn retry_after_ns(&self) -> Option<u64> {
        match self {
            Rejection::Limited { decision } => Some(decision.retry_after_ns),
            Rejection::QueueFull { retry_after_ns } | Rejection::Timeout { retry_after_ns } => {
                Some(*retry_after_ns)
            }
            Rejection::InsufficientCapacity { .. } | Rejection::Closed => None,
        }
    }
}

/// What [`WaitQueue::offer`] did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// Admitted at once; its cost is consumed.
    Admitted(Decision),
    /// Waiting; expect an [`Outcome`] for `ticket` from a later [`WaitQueue::poll`].
    Queued {
        /// The request's claim.
        ticket: Ticket,
        /// Predicted nanoseconds until admission.
        wait_ns: u64,
    },
    /// Turned away.
    Rejected(Rejection),
}

/// What became of a waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted; its cost is consumed.
    Admitted(Decision),
    /// Its deadline passed first.
    TimedOut {
        /// Predicted nanoseconds it would still have had to wait.
        retry_after_ns: u64,
    },
    /// The queue was closed.
    Closed,
}

/// Where the limiter state lives: in the caller's hands, or in a shared cell (an atomic) that
/// other, non-queued callers may also update.
pub trait StateAccess<A: Algorithm> {
    /// Runs one check on the live state.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::check`].
    fn check(&mut self, algorithm: &A, now: u64, cost: u64) -> Result<Decision, CheckError>;

    /// A copy of the live state, for predictions.
    fn load(&self) -> A::State;
}

/// [`StateAccess`] over a state the caller owns outright.
#[derive(Debug)]
pub struct Owned<'a, S>(pub &'a mut S);

impl<A, S> StateAccess<A> for Owned<'_, S>
where
    A: Algorithm<State = S>,
    S: Clone + core::fmt::Debug + PartialEq,
{
    fn check(&mut self, algorithm: &A, now: u64, cost: u64) -> Result<Decision, CheckError> {
        algorithm.check(self.0, now, cost)
    }

    fn load(&self) -> S {
        self.0.clone()
    }
}

#[derive(Debug, Clone)]
struct Waiter<P> {
    cost: u64,
    flow: u64,
    deadline: u64,
    /// When the queue expects to admit it, exact while the cached tail prediction stands (a
    /// replay that builds the tail records every waiter's); an admission at another time
    /// drops the tail.
    predicted: u64,
    /// The caller's data for this waiter (a waker, a promise index...).
    payload: P,
}

/// One flow's place in a level: its ticket ids and how many of them still wait.
#[derive(Debug)]
struct Flow {
    /// Ticket ids in arrival order; ids no longer in `Level::waiters` are skipped.
    ids: VecDeque<u64>,
    /// How many of `ids` still wait; the flow is dropped when none does.
    live: usize,
    /// Which of the flow's stays in the turns this is (see `Level::turns`).
    stay: u64,
}

#[derive(Debug)]
struct Level<P> {
    /// Live waiters by ticket id (ascending id = arrival order).
    waiters: BTreeMap<u64, Waiter<P>>,
    /// The flows with live waiters.
    flows: BTreeMap<u64, Flow>,
    /// `(flow, stay)` in the order the flows take turns. A flow leaves the turns as soon as
    /// none of its requests waits (whether served, cancelled, expired or turned away at the
    /// door) and comes back at the end with its next request; the entry of a stay that ended
    /// is skipped lazily.
    turns: VecDeque<(u64, u64)>,
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
    fn push(&mut self, id: u64, waiter: Waiter<P>) {
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
    fn take(&mut self, id: u64) -> Option<Waiter<P>> {
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
    fn head(&mut self) -> Option<u64> {
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
    fn pop_head(&mut self, id: u64) -> Option<Waiter<P>> {
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
    fn service_order(&self, out: &mut Vec<u64>) {
        self.service_order_while(|id| {
            out.push(id);
            true
        });
    }

    /// Hands live waiters to `each` in service order until it returns false; returns
    /// whether it did.
    fn service_order_while(&self, mut each: impl FnMut(u64) -> bool) -> bool {
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
    fn compact(&mut self) {
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

/// The prediction for the request that would be served last, kept so that appending to a
/// single-flow queue costs O(1) instead of a replay.
#[derive(Debug, Clone)]
struct Tail<S> {
    state: S,
    at: u64,
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

    /// Admits the waiters whose turn has come, times out those past their deadline, and
    /// returns when to poll next (`None`: nothing waits). Each outcome is passed to `emit`.
    pub fn poll<A, C, F>(
        &mut self,
        algorithm: &A,
        cell: &mut C,
        now: u64,
        mut emit: F,
    ) -> Option<u64>
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome),
    {
        self.poll_timed(algorithm, cell, now, |t, o, _, _| emit(t, o))
    }

    /// [`WaitQueue::poll`], handing back each finished waiter's payload and the moment its
    /// outcome took effect.
    ///
    /// Every outcome takes effect at `now`, the moment the caller hands it over, and each
    /// admission is checked against what the limiter holds at `now`. A caller whose timer
    /// fired late therefore gets no more than the limiter holds then (at most its capacity);
    /// the waiters whose turns went by follow one by one at the limiter's rate. So the
    /// admissions handed over stay within capacity + rate·T in every window of length T,
    /// whatever the timer does; the price of a late timer is throughput, never the bound.
    /// The moment is what [`Algorithm::refund`] needs if the admission is handed back.
    ///
    /// Deadlines: the head is admitted whenever the limiter holds its cost at `now`, even if
    /// its deadline went by while the timer was late (a turn due at the deadline itself is
    /// not lost to a timer that fires a little after it); a waiter that cannot be admitted
    /// at `now` and whose deadline is `now` or earlier times out.
    pub fn poll_timed<A, C, F>(
        &mut self,
        algorithm: &A,
        cell: &mut C,
        now: u64,
        mut emit: F,
    ) -> Option<u64>
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome, P, u64),
    {
        let mut admit_at = None;
        while let Some((level, id)) = self.head() {
            let (cost, flow, deadline, predicted) = {
                let w = &self.levels[level].waiters[&id];
                (w.cost, w.flow, w.deadline, w.predicted)
            };
            // Late for its turn with a schedule cached: the state before, to tell whether the
            // schedule still holds after this admission.
            let before = (predicted < now && self.tail.is_some()).then(|| cell.load());
            // Checked at `now`, never at the earlier moment its turn came: a late poll finds
            // only what the limiter holds now, so it cannot release a burst.
            let outcome = match cell.check(algorithm, now, cost) {
                Ok(decision) if decision.allowed => Outcome::Admitted(decision),
                Ok(_) if now > deadline => {
                    // No token for it and its deadline went by: it waits no longer.
                    self.expire_one(algorithm, cell, now, level, id, &mut emit);
                    continue;
                }
                Ok(decision) => {
                    admit_at = Some(now.saturating_add(decision.retry_after_ns.max(1)));
                    break;
                }
                // Unreachable for costs checked at the door; never leave it stuck.
                Err(_) => Outcome::Closed,
            };
            let popped = self.levels[level].pop_head(id);
            self.len -= 1;
            // The cached schedule holds if this admission left the state its turn would have.
            let as_scheduled = predicted == now
                || before.is_some_and(|mut state| {
                    algorithm
                        .check(&mut state, predicted, cost)
                        .is_ok_and(|d| d.allowed)
                        && same_state::<A>(&state, &cell.load())
                });
            if !as_scheduled || self.len == 0 || !matches!(outcome, Outcome::Admitted(_)) {
                self.tail = None;
            }
            if let Some(w) = popped {
                emit(Ticket { id, flow }, outcome, w.payload, now);
            }
        }
        self.expire(algorithm, cell, now.saturating_add(1), &mut emit);
        self.compact();
        if self.len == 0 {
            return None;
        }
        let deadline = self.next_deadline();
        match (admit_at, deadline) {
            (Some(a), Some(d)) => Some(a.min(d)),
            (a, d) => a.or(d),
        }
    }

    /// Withdraws a waiting request (its caller went away). Returns whether it was still
    /// waiting; if not, it was already admitted, timed out or closed.
    pub fn cancel(&mut self, ticket: Ticket) -> bool {
        let removed = self.remove(ticket).is_some();
        if removed {
            self.tail = None;
        }
        removed
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

    // === internals ===

    /// Whether a newcomer at `priority` would have to queue behind someone.
    fn blocks(&self, priority: Priority) -> bool {
        self.levels[..=priority.index()]
            .iter()
            .any(|l| !l.waiters.is_empty())
    }

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

    /// Whether `ticket` will be served after every current waiter, so the cached tail applies.
    fn is_last_in_service(&self, ticket: Ticket) -> bool {
        self.would_be_last(ticket.priority(), ticket.flow)
    }

    /// Whether a request of `priority` and `flow` would be served after every current waiter.
    fn would_be_last(&self, priority: Priority, flow: u64) -> bool {
        let p = priority.index();
        let lower_empty = self.levels[p + 1..].iter().all(|l| l.waiters.is_empty());
        lower_empty && self.levels[p].flows.keys().all(|&f| f == flow)
    }

    /// Replays the queue from `now`, records every waiter's predicted admission and caches
    /// the state after everyone as the tail.
    fn schedule<A, C>(&mut self, algorithm: &A, cell: &C, now: u64)
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        let mut schedule = Vec::with_capacity(self.len);
        let (state, at) = self.replay(algorithm, cell.load(), now, |id, at| {
            schedule.push((id, at));
        });
        for (id, at) in schedule {
            let level = &mut self.levels[Priority::from_index(id & 3).index()];
            if let Some(w) = level.waiters.get_mut(&id) {
                w.predicted = at;
            }
        }
        // What a newcomer served last starts from.
        self.tail = Some(Tail { state, at });
    }

    /// Predicted admission time of the (already inserted) `ticket`. With `keep`, a replay of
    /// the queue also records every waiter's predicted admission (the ticket stays).
    fn predict<A, C>(
        &mut self,
        algorithm: &A,
        cell: &C,
        now: u64,
        ticket: Ticket,
        keep: bool,
    ) -> u64
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        let cost = self.levels[ticket.priority().index()].waiters[&ticket.id].cost;
        if self.len > 1
            && self.tail.is_some()
            && self.is_last_in_service(ticket)
            && self.on_schedule(algorithm, cell, now)
        {
            if let Some(tail) = &mut self.tail {
                let at = simulate_one(algorithm, &mut tail.state, tail.at.max(now), cost);
                tail.at = at;
                return at;
            }
        }
        if keep {
            self.schedule(algorithm, cell, now);
            return self.levels[ticket.priority().index()].waiters[&ticket.id].predicted;
        }
        let mut found = now;
        self.replay(algorithm, cell.load(), now, |id, at| {
            if id == ticket.id {
                found = at;
            }
        });
        found
    }

    /// Whether the cached tail is what a replay of the queue from `now` would give.
    ///
    /// While a tail is cached, every waiter's `predicted` is exact and they rise in service
    /// order. If the head's has not gone by, a replay from `now` gives every waiter the time
    /// it gave them (none could have gone earlier). If some are overdue (their turn came and
    /// nobody polled yet), a replay admits those at `now` or later instead: the tail still
    /// holds if that leaves the limiter in the state their turns would have, and the first
    /// waiter on schedule can still go at its time. Only the overdue ones are replayed.
    fn on_schedule<A, C>(&mut self, algorithm: &A, cell: &C, now: u64) -> bool
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        match self.head() {
            Some((level, id)) if self.levels[level].waiters[&id].predicted < now => {}
            _ => return true,
        }
        let mut overdue = Vec::new();
        let mut next = None;
        for level in &self.levels {
            let stopped = level.service_order_while(|id| {
                let w = &level.waiters[&id];
                if w.predicted < now {
                    overdue.push((w.predicted, w.cost));
                    true
                } else {
                    next = Some(w.predicted);
                    false
                }
            });
            if stopped {
                break;
            }
        }
        let Some(next) = next else {
            return false;
        };
        let mut on_time = cell.load();
        let mut late = on_time.clone();
        let mut at = now;
        for (predicted, cost) in overdue {
            if !algorithm
                .check(&mut on_time, predicted, cost)
                .is_ok_and(|d| d.allowed)
            {
                return false;
            }
            at = simulate_one(algorithm, &mut late, at, cost);
        }
        same_state::<A>(&on_time, &late) && at <= next
    }

    /// Predicted nanoseconds until a request of `cost` could be admitted, as if offered now.
    /// Zero when it would be admitted at once.
    pub fn peek_wait<A, C>(
        &mut self,
        algorithm: &A,
        cell: &C,
        now: u64,
        cost: u64,
        priority: Priority,
        flow: u64,
    ) -> u64
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
    {
        if !self.is_empty()
            && self.would_be_last(priority, flow)
            && !(self.tail.is_some() && self.on_schedule(algorithm, cell, now))
        {
            // The queue's own schedule, kept: a newcomer served last is then predicted from
            // its tail, and so are the next ones (a full queue answers every newcomer here).
            self.schedule(algorithm, cell, now);
        }
        let saved_tail = self.tail.clone();
        let ticket = self.insert(now, cost, priority, flow, u64::MAX);
        let at = self.predict(algorithm, cell, now, ticket, false);
        // The latest arrival leaves no trace when it goes.
        self.remove(ticket);
        self.tail = saved_tail;
        at - now
    }

    /// Replays every waiter in service order on `state` from `now`, telling `each` when it
    /// would be admitted; returns the state after everyone and the last admission time.
    fn replay<A>(
        &self,
        algorithm: &A,
        mut state: S,
        now: u64,
        mut each: impl FnMut(u64, u64),
    ) -> (S, u64)
    where
        A: Algorithm<State = S>,
    {
        let mut order = Vec::with_capacity(self.len);
        for level in &self.levels {
            level.service_order(&mut order);
        }
        let mut at = now;
        for id in order {
            let w = &self.levels[Priority::from_index(id & 3).index()].waiters[&id];
            at = simulate_one(algorithm, &mut state, at, w.cost);
            each(id, at);
        }
        (state, at)
    }

    /// Times out every waiter whose deadline is before `cutoff`.
    fn expire<A, C, F>(&mut self, algorithm: &A, cell: &C, cutoff: u64, emit: &mut F)
    where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome, P, u64),
    {
        let now = cutoff.saturating_sub(1);
        let mut expired = Vec::new();
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            if deadline >= cutoff {
                break;
            }
            self.deadlines.pop();
            let level = &self.levels[Priority::from_index(id & 3).index()];
            if let Some(w) = level.waiters.get(&id) {
                if w.deadline == deadline {
                    expired.push(Ticket { id, flow: w.flow });
                }
            }
        }
        if expired.is_empty() {
            return;
        }
        // Tell each how much longer it would have waited: replay the queue once.
        let mut predicted = BTreeMap::new();
        self.replay(algorithm, cell.load(), now, |id, at| {
            predicted.insert(id, at);
        });
        for ticket in expired {
            if let Some(w) = self.remove(ticket) {
                let retry_after_ns = predicted.get(&ticket.id).map_or(0, |at| at - now);
                emit(ticket, Outcome::TimedOut { retry_after_ns }, w.payload, now);
            }
        }
        self.tail = None;
    }

    /// Times out the head `id` of `level`, whose deadline has passed.
    fn expire_one<A, C, F>(
        &mut self,
        algorithm: &A,
        cell: &C,
        now: u64,
        level: usize,
        id: u64,
        emit: &mut F,
    ) where
        A: Algorithm<State = S>,
        C: StateAccess<A>,
        F: FnMut(Ticket, Outcome, P, u64),
    {
        if let Some(w) = self.levels[level].pop_head(id) {
            self.len -= 1;
            self.tail = None;
            let mut state = cell.load();
            let retry_after_ns = simulate_one(algorithm, &mut state, now, w.cost) - now;
            emit(
                Ticket { id, flow: w.flow },
                Outcome::TimedOut { retry_after_ns },
                w.payload,
                now,
            );
        }
    }

    fn next_deadline(&mut self) -> Option<u64> {
        while let Some(&Reverse((deadline, id))) = self.deadlines.peek() {
            let level = &self.levels[Priority::from_index(id & 3).index()];
            match level.waiters.get(&id) {
                Some(w) if w.deadline == deadline => return Some(deadline),
                _ => {
                    self.deadlines.pop();
                }
            }
        }
        None
    }

    /// Drops the bookkeeping of waiters that left, once it outweighs the live entries.
    fn compact(&mut self) {
        if self.deadlines.len() > 2 * self.len + 64 {
            let mut live = Vec::with_capacity(self.len);
            for level in &self.levels {
                for (&id, w) in &level.waiters {
                    live.push(Reverse((w.deadline, id)));
                }
            }
            self.deadlines = BinaryHeap::from(live);
        }
        for level in &mut self.levels {
            level.compact();
        }
    }
}

/// Whether two states of `A` are equal (`A::State: PartialEq`, which a bound on `S` alone would
/// not carry).
fn same_state<A: Algorithm>(a: &A::State, b: &A::State) -> bool {
    a == b
}

/// Advances a copy of the state to the moment `cost` is admitted at or after `at`, admits it
/// there, and returns that moment.
fn simulate_one<A: Algorithm>(algorithm: &A, state: &mut A::State, at: u64, cost: u64) -> u64 {
    let mut t = at;
    // Each algorithm's retry_after is exact, so the second check admits; the bound only
    // guards against a state shared with someone else.
    for _ in 0..8 {
        match algorithm.check(state, t, cost) {
            Ok(d) if d.allowed => return t,
            Ok(d) => t = t.saturating_add(d.retry_after_ns.max(1)),
            Err(_) => return t,
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Gcra, Quota, SlidingLog, TokenBucket};
    use alloc::vec;

    const S: u64 = 1_000_000_000;

    fn cfg(depth: usize, max_wait_s: u64) -> QueueConfig {
        QueueConfig {
            depth,
            max_wait_ns: max_wait_s * S,
        }
    }

    fn run_until<A: Algorithm>(
        q: &mut WaitQueue<A::State, ()>,
        alg: &A,
        state: &mut A::State,
        mut now: u64,
        end: u64,
    ) -> Vec<(u64, Ticket, Outcome)> {
        let mut out = Vec::new();
        while let Some(wake) = q.poll(alg, &mut Owned(state), now, |t, o| out.push((now, t, o))) {
            if wake > end {
                break;
            }
            assert!(wake > now, "wake {wake} must be after now {now}");
            now = wake;
        }
        out
    }

    #[test]
    fn fifo_and_exact_admission_times() {
        let alg = TokenBucket::new(Quota::parse(2, "2/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 10));
        let mut tickets = vec![];
        for _ in 0..6 {
            match q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0) {
                Offer::Admitted(_) => {}
                Offer::Queued { ticket, wait_ns } => tickets.push((ticket, wait_ns)),
                Offer::Rejected(r) => panic!("{r:?}"),
            }
        }
        assert_eq!(tickets.len(), 4);
        let waits: Vec<u64> = tickets.iter().map(|t| t.1).collect();
        assert_eq!(waits, vec![S / 2, S, 3 * S / 2, 2 * S]);
        let out = run_until(&mut q, &alg, &mut st, 0, 10 * S);
        let got: Vec<(u64, Ticket)> = out.iter().map(|&(at, t, _)| (at, t)).collect();
        let want: Vec<(u64, Ticket)> = tickets.iter().map(|&(t, w)| (w, t)).collect();
        assert_eq!(got, want);
    }

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
    fn deadline_enforced_when_the_schedule_slips() {
        let alg = Gcra::new(Quota::parse(1, "1/s").unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 2));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let Offer::Queued { ticket: low, .. } =
            q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Low, 0)
        else {
            panic!()
        };
        // Two high-priority arrivals push the low one past its 2 s deadline.
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        let out = run_until(&mut q, &alg, &mut st, 0, 10 * S);
        let (at, t, o) = out.iter().find(|(_, t, _)| *t == low).copied().unwrap();
        assert_eq!(t, low);
        assert_eq!(at, 2 * S);
        assert!(matches!(o, Outcome::TimedOut { retry_after_ns } if retry_after_ns == S));
        let highs: Vec<_> = out
            .iter()
            .filter(|(_, t, _)| t.priority() == Priority::High)
            .map(|x| x.0)
            .collect();
        assert_eq!(highs, vec![S, 2 * S]);
    }

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

    #[test]
    fn sliding_log_queue_is_exact() {
        let alg = SlidingLog::new(Quota::parse(3, "1/s").unwrap()); // 3 per 3 s
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 10));
        let mut waits = vec![];
        for i in 0..7u64 {
            if let Offer::Queued { wait_ns, .. } = q.offer(
                &alg,
                &mut Owned(&mut st),
                i * 100_000_000,
                1,
                Priority::Normal,
                0,
            ) {
                waits.push(i * 100_000_000 + wait_ns);
            }
        }
        assert_eq!(
            waits,
            vec![3 * S, 3 * S + 100_000_000, 3 * S + 200_000_000, 6 * S]
        );
        let out = run_until(&mut q, &alg, &mut st, 700_000_000, 100 * S);
        let times: Vec<u64> = out.iter().map(|x| x.0).collect();
        assert_eq!(times, waits);
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

    /// Panics unless every window `[times[i], times[j]]` holds at most `capacity` plus the
    /// tokens one per `interval` adds over its length.
    fn assert_within_bound(times: &[u64], capacity: u64, interval: u64) {
        for i in 0..times.len() {
            for j in i..times.len() {
                let count = (j - i + 1) as u64;
                let span = times[j] - times[i];
                assert!(
                    count <= capacity || (count - capacity) * interval <= span,
                    "{count} admissions within {span} ns: above {capacity} + rate·T ({times:?})"
                );
            }
        }
    }

    #[test]
    fn a_late_poll_admits_only_what_the_bucket_holds_at_now() {
        // One token per millisecond, capacity 1, 31 waiters behind a spent bucket: a timer
        // that fires 20 ms late finds one token, not the twenty whose turns went by.
        const MS: u64 = 1_000_000;
        let alg = Gcra::new(Quota::new(1, crate::Rate::from_interval_ns(MS).unwrap()).unwrap());
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(100, 10));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let mut tickets = Vec::new();
        for _ in 0..30 {
            if let Offer::Queued { ticket, .. } =
                q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0)
            {
                tickets.push(ticket);
            }
        }
        let mut out = Vec::new();
        let wake = q.poll_timed(&alg, &mut Owned(&mut st), 20 * MS, |t, o, _, at| {
            assert!(matches!(o, Outcome::Admitted(_)));
            out.push((at, t));
        });
        assert_eq!(out, vec![(20 * MS, tickets[0])]);
        assert_eq!(wake, Some(21 * MS));
        assert_eq!(q.len(), 29);
        // From then on one per millisecond, in arrival order, within the bound throughout.
        out.extend(
            run_until(&mut q, &alg, &mut st, 21 * MS, 100 * MS)
                .into_iter()
                .map(|(at, t, _)| (at, t)),
        );
        let times: Vec<u64> = out.iter().map(|&(at, _)| at).collect();
        assert_eq!(times, (20..50).map(|k| k * MS).collect::<Vec<_>>());
        assert_eq!(out.iter().map(|&(_, t)| t).collect::<Vec<_>>(), tickets);
        assert_within_bound(&times, 1, MS);
    }

    #[test]
    fn polls_late_by_any_amount_stay_within_capacity_plus_rate() {
        // Capacity 3, one token per 10 ms; the caller polls at its own pace, often long after
        // the wake it was asked for. Whatever the lateness, the admissions it hands over never
        // exceed capacity + rate·T in any window.
        const MS: u64 = 1_000_000;
        let alg = TokenBucket::new(
            Quota::new(3, crate::Rate::from_interval_ns(10 * MS).unwrap()).unwrap(),
        );
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1000, 100));
        let mut times = Vec::new();
        let mut now = 0;
        for step in 0..200u64 {
            for _ in 0..step % 7 {
                if let Offer::Admitted(_) = q.offer(
                    &alg,
                    &mut Owned(&mut st),
                    now,
                    1,
                    Priority::Normal,
                    step % 2,
                ) {
                    times.push(now);
                }
            }
            // The caller hands each admission over when the poll returns: at `now`.
            let wake = q.poll_timed(&alg, &mut Owned(&mut st), now, |_, o, _, at| {
                assert!(at <= now);
                if let Outcome::Admitted(_) = o {
                    times.push(now);
                }
            });
            // Late by 0 to 57 ms, in a fixed irregular pattern.
            let late = (step * 37 % 58) * MS;
            now = wake.unwrap_or(now + MS).max(now + 1) + late;
        }
        assert!(times.len() > 100, "{}", times.len());
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert_within_bound(&times, 3, 10 * MS);
    }

    fn tiny(capacity: u64) -> Gcra {
        // One token per 10 ns.
        Gcra::new(Quota::new(capacity, crate::Rate::from_interval_ns(10).unwrap()).unwrap())
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

    #[test]
    fn predictions_start_from_now_when_the_head_is_overdue() {
        // Capacity 3: a waiter of cost 3 is due at 10; nobody polls until 11. A newcomer's
        // prediction replays the queue from 11 (the waiter goes at 11, then the newcomer at
        // 21), not from the schedule made at 0.
        let alg = tiny(3);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(1, 10));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::High, 0);
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 0, 3, Priority::High, 0),
            Offer::Queued { wait_ns: 10, .. }
        ));
        assert_eq!(
            q.peek_wait(&alg, &Owned(&mut st), 11, 1, Priority::Normal, 0),
            10
        );
        assert!(matches!(
            q.offer(&alg, &mut Owned(&mut st), 11, 1, Priority::Normal, 0),
            Offer::Rejected(Rejection::QueueFull { retry_after_ns: 10 })
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

    #[test]
    fn a_late_poll_still_admits_a_head_past_its_deadline_if_the_tokens_are_there() {
        // Capacity 1, one token per 10 ns: the waiter's turn (10) is its deadline (10). A
        // poll at 12 finds the token: admitted. The next waiter (deadline 20; its turn is now
        // 22, after that late admission) gets no token at 21 and times out.
        let alg = tiny(1);
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(cfg(10, 0));
        q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0);
        let Offer::Queued { ticket: a, .. } =
            q.offer_with_max_wait(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0, 10)
        else {
            panic!()
        };
        let Offer::Queued { ticket: b, .. } =
            q.offer_with_max_wait(&alg, &mut Owned(&mut st), 5, 1, Priority::Normal, 0, 15)
        else {
            panic!()
        };
        let mut out = Vec::new();
        q.poll(&alg, &mut Owned(&mut st), 12, |t, o| out.push((t, o)));
        assert!(
            matches!(out[..], [(t, Outcome::Admitted(_))] if t == a),
            "{out:?}"
        );
        out.clear();
        q.poll(&alg, &mut Owned(&mut st), 21, |t, o| out.push((t, o)));
        assert!(
            matches!(out[..], [(t, Outcome::TimedOut { retry_after_ns: 1 })] if t == b),
            "{out:?}"
        );
    }

    /// GCRA that counts its checks, to measure the work a queue operation does.
    #[derive(Debug)]
    struct Counting {
        gcra: Gcra,
        checks: core::cell::Cell<u64>,
    }

    impl Algorithm for Counting {
        type State = u64;
        fn kind(&self) -> crate::Kind {
            self.gcra.kind()
        }
        fn quota(&self) -> Quota {
            self.gcra.quota()
        }
        fn initial_state(&self) -> u64 {
            self.gcra.initial_state()
        }
        fn exhausted_state(&self, now: u64) -> u64 {
            self.gcra.exhausted_state(now)
        }
        fn check(&self, state: &mut u64, now: u64, cost: u64) -> Result<Decision, CheckError> {
            self.checks.set(self.checks.get() + 1);
            self.gcra.check(state, now, cost)
        }
        fn refund(&self, state: &mut u64, admitted_at: u64, now: u64, cost: u64) {
            self.gcra.refund(state, admitted_at, now, cost)
        }
        fn idle_at(&self, state: &u64) -> u64 {
            self.gcra.idle_at(state)
        }
        fn save(&self, state: &u64, now: u64) -> crate::SavedState {
            self.gcra.save(state, now)
        }
        fn restore(
            &self,
            saved: &crate::SavedState,
            now: u64,
            elapsed_ns: u64,
        ) -> Result<u64, crate::SnapshotError> {
            self.gcra.restore(saved, now, elapsed_ns)
        }
    }

    #[test]
    fn a_full_queue_polled_late_answers_newcomers_without_replaying_it() {
        // Capacity 4, a token per 10 ns, 1,000 waiters in one flow: the queue is full. The
        // poller is 3 ns late for every turn (less than the bucket's slack of three tokens, so
        // each late admission leaves the state its turn would have). Around each poll, two
        // newcomers are turned away (one while the head is overdue) and one takes the place
        // the poll freed. Each answer comes from the cached tail: a few checks, not a replay
        // of 1,000 waiters.
        const N: usize = 1000;
        let alg = Counting {
            gcra: tiny(4),
            checks: core::cell::Cell::new(0),
        };
        let mut st = alg.initial_state();
        let mut q = WaitQueue::new(QueueConfig {
            depth: N,
            max_wait_ns: u64::MAX,
        });
        q.offer(&alg, &mut Owned(&mut st), 0, 4, Priority::Normal, 0);
        for _ in 0..N {
            assert!(matches!(
                q.offer(&alg, &mut Owned(&mut st), 0, 1, Priority::Normal, 0),
                Offer::Queued { .. }
            ));
        }
        let mut wake = q.poll(&alg, &mut Owned(&mut st), 0, |_, _| {}).unwrap();
        alg.checks.set(0);
        for _ in 0..N {
            for at in [wake - 1, wake + 1] {
                assert!(matches!(
                    q.offer(&alg, &mut Owned(&mut st), at, 1, Priority::Normal, 0),
                    Offer::Rejected(Rejection::QueueFull { .. })
                ));
            }
            let now = wake + 3;
            let mut admitted = 0;
            wake = q
                .poll(&alg, &mut Owned(&mut st), now, |_, o| {
                    assert!(matches!(o, Outcome::Admitted(_)));
                    admitted += 1;
                })
                .unwrap();
            assert_eq!(admitted, 1);
            assert!(matches!(
                q.offer(&alg, &mut Owned(&mut st), now, 1, Priority::Normal, 0),
                Offer::Queued { .. }
            ));
        }
        let per_step = alg.checks.get() / N as u64;
        assert!(
            per_step <= 20,
            "{per_step} checks per poll and three newcomers"
        );
    }
}
