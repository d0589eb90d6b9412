//! [`Limiter`]: one bucket and its fair wait queue, driven from outside: the caller passes the
//! time to every call and polls when [`Limiter::poll`] says to. What a host without tokio
//! runs (the browser's Service Worker and the npm package, both through WebAssembly): the
//! queue decides who goes next and when to wake, the host keeps only its callbacks and one
//! timer.
//!
//! For a host that persists the bucket, [`Limiter::snapshot`] and [`Limiter::restore`] carry
//! it across restarts, and [`Limiter::reserve`], [`Limiter::written`] and
//! [`Limiter::covered`] keep the stored record at least as empty as the live bucket, so that
//! a restart never grants a token twice.

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;

use crate::queue::{Offer, Outcome, Owned, Priority, QueueConfig, Rejection, Ticket, WaitQueue};
use crate::{
    Algorithm, AnyAlgorithm, AnyState, Kind, Quota, Rate, SavedState, Snapshot, SnapshotError,
    FORMAT_VERSION,
};

/// Why a request was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No token and no queue for it (the queue depth is zero, or the caller allowed no wait and
    /// the wait is not zero).
    Limited,
    /// The queue is at its depth.
    QueueFull,
    /// The predicted wait exceeds the maximum wait.
    Timeout,
    /// The cost exceeds the capacity.
    TooCostly,
    /// The queue was closed.
    Closed,
}

/// What [`Limiter::offer`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted at once; the cost is consumed.
    Admitted {
        /// Whole tokens left.
        remaining: u64,
        /// The capacity.
        limit: u64,
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
    /// The queue was closed.
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
    /// Nanoseconds until the bucket is full and idle again.
    pub reset_after_ns: u64,
    /// Nanoseconds until one token is available (0: now).
    pub next_token_ns: u64,
}

/// The limiter state cannot be replaced while requests wait: their predicted times were made
/// against the old one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// Why [`Limiter::restore`] refused a snapshot. Either way the caller should fall back to
/// [`Limiter::exhaust`], never to a full bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreError {
    /// Requests are waiting.
    Busy,
    /// The snapshot cannot be used.
    Snapshot(SnapshotError),
}

impl core::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RestoreError::Busy => f.write_str("cannot restore while requests wait"),
            RestoreError::Snapshot(e) => e.fmt(f),
        }
    }
}

/// One limiter: an algorithm, its state, and a fair wait queue in front of it.
///
/// Time is whatever monotonic count of nanoseconds the caller supplies; a time earlier than
/// one already seen counts as that one (a browser worker's clock restarts at zero with the
/// worker, and snapshots carry the wall-clock time for the gap).
///
/// # Examples
///
/// ```
/// use sluice_core::queue::{Priority, QueueConfig};
/// use sluice_core::{Kind, Quota};
/// use sluice_core::driven::{Delivery, Limiter, Verdict};
///
/// let queue = QueueConfig { depth: 10, max_wait_ns: 5_000_000_000 };
/// let mut limiter = Limiter::new(Kind::TokenBucket, Quota::parse(1, "1/s").unwrap(), queue);
/// assert!(matches!(limiter.offer(0, 1, 7, Priority::Normal, None), Verdict::Admitted { .. }));
/// let Verdict::Queued { ticket, wait_ns } = limiter.offer(0, 1, 7, Priority::Normal, None) else {
///     panic!("expected to wait");
/// };
/// assert_eq!(wait_ns, 1_000_000_000);
/// assert_eq!(limiter.poll(0), Some(1_000_000_000)); // wake up then
/// assert_eq!(limiter.poll(1_000_000_000), None);
/// assert_eq!(limiter.outcomes()[0].ticket, ticket);
/// assert_eq!(limiter.outcomes()[0].delivery, Delivery::Admitted);
/// ```
#[derive(Debug)]
pub struct Limiter {
    algorithm: AnyAlgorithm,
    state: AnyState,
    queue: WaitQueue<AnyState>,
    /// Live tickets by id: the ABI names a ticket by its id alone.
    tickets: BTreeMap<u64, Ticket>,
    /// The latest time seen.
    now: u64,
    outcomes: Vec<Delivered>,
    /// The bucket as the stored record holds it (`None`: no record known to this instance).
    stored: Option<AnyState>,
    /// Buckets of records being written, oldest first (see [`Limiter::reserve`]).
    writing: VecDeque<AnyState>,
}

// Every function here is `#[inline]` so that it is compiled, with the generic wait queue it
// drives, in the crate that calls it and under that crate's profile: the Service Worker's
// module is optimised for size, the npm package's for speed (Cargo.toml).
impl Limiter {
    /// A full bucket with an empty queue.
    #[inline]
    pub fn new(kind: Kind, quota: Quota, queue: QueueConfig) -> Limiter {
        let algorithm = AnyAlgorithm::new(kind, quota);
        Limiter {
            state: algorithm.initial_state(),
            algorithm,
            queue: WaitQueue::new(queue),
            tickets: BTreeMap::new(),
            now: 0,
            outcomes: Vec::new(),
            stored: None,
            writing: VecDeque::new(),
        }
    }

    /// The algorithm.
    #[inline]
    pub fn kind(&self) -> Kind {
        self.algorithm.which()
    }

    /// Capacity and rate.
    #[inline]
    pub fn quota(&self) -> Quota {
        self.algorithm.quota()
    }

    /// Depth and maximum wait.
    #[inline]
    pub fn queue_config(&self) -> QueueConfig {
        self.queue.config()
    }

    /// Requests waiting now.
    #[inline]
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    #[inline]
    fn tick(&mut self, now: u64) -> u64 {
        self.now = self.now.max(now);
        self.now
    }

    /// Offers a request of `cost` from `flow` (a tab, say; flows take turns in the queue) at
    /// `priority`.
    ///
    /// `max_wait_ns` overrides the queue's maximum wait for this request; `Some(0)` means "never
    /// queue": admitted at once or [`Reason::Limited`] (used for large request bodies).
    #[inline]
    pub fn offer(
        &mut self,
        now: u64,
        cost: u64,
        flow: u64,
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
            flow,
            max_wait,
        );
        match offer {
            Offer::Admitted(d) => Verdict::Admitted {
                remaining: d.remaining,
                limit: d.limit,
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
                    // A request that may not wait at all was not turned away by the queue's
                    // maximum wait but by the limit itself.
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
    #[inline]
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
    #[inline]
    pub fn outcomes(&self) -> &[Delivered] {
        &self.outcomes
    }

    /// Withdraws a waiting request; it spent nothing. Returns whether it was still waiting.
    #[inline]
    pub fn cancel(&mut self, ticket: u64) -> bool {
        match self.tickets.remove(&ticket) {
            Some(t) => self.queue.cancel(t),
            None => false,
        }
    }

    /// Turns every waiter away ([`Delivery::Closed`], in [`Limiter::outcomes`]) and refuses
    /// new offers.
    #[inline]
    pub fn close(&mut self) {
        self.outcomes.clear();
        let outcomes = &mut self.outcomes;
        self.queue
            .close(|ticket, outcome| outcomes.push(deliver(ticket, outcome)));
        self.tickets.clear();
    }

    /// The bucket as of `now`, without changing it.
    #[inline]
    pub fn status(&self, now: u64) -> Status {
        let now = self.now.max(now);
        let mut probe = self.state.clone();
        let query = self.algorithm.check(&mut probe, now, 0);
        let one = self.algorithm.check(&mut probe, now, 1);
        let (remaining, reset_after_ns) = query.map_or((0, 0), |d| (d.remaining, d.reset_after_ns));
        Status {
            remaining,
            limit: self.quota().capacity(),
            queued: self.queue.len() as u64,
            reset_after_ns,
            next_token_ns: one.map_or(0, |d| d.retry_after_ns),
        }
    }

    /// The bucket as a snapshot at monotonic `now`, stamped with wall-clock `unix_ms`.
    #[inline]
    pub fn snapshot(&self, now: u64, unix_ms: u64) -> Snapshot {
        Snapshot::take(&self.algorithm, &self.state, self.now.max(now), unix_ms)
    }

    /// Replaces the bucket with `snapshot`, counting the wall-clock time since it was taken.
    ///
    /// A snapshot taken under another algorithm, capacity or rate (the configuration changed
    /// between two runs) is first converted by sluice-core's rule
    /// ([`SavedState::convert`](crate::SavedState::convert)), as of the moment it was
    /// taken: what was left becomes at most the new capacity, debt is kept in the new rate's
    /// time, so a tightened limit never grants a burst; the time since then refills at the new
    /// rate.
    ///
    /// # Errors
    ///
    /// [`RestoreError::Busy`] while requests wait, and [`RestoreError::Snapshot`] for a snapshot
    /// of another format, with an impossible quota or impossible values. The bucket is
    /// unchanged then.
    #[inline]
    pub fn restore(
        &mut self,
        snapshot: &Snapshot,
        now: u64,
        unix_ms: u64,
    ) -> Result<(), RestoreError> {
        if !self.queue.is_empty() {
            return Err(RestoreError::Busy);
        }
        let converted = self.convert(snapshot).map_err(RestoreError::Snapshot)?;
        let now = self.tick(now);
        self.state = converted
            .restore(&self.algorithm, now, unix_ms)
            .map_err(RestoreError::Snapshot)?;
        self.stored = Some(self.state.clone());
        self.writing.clear();
        Ok(())
    }

    /// `snapshot` as this limiter's algorithm and quota would have saved it at the same moment.
    #[inline]
    fn convert(&self, snapshot: &Snapshot) -> Result<Snapshot, SnapshotError> {
        let quota = self.quota();
        if snapshot.algorithm == self.kind()
            && snapshot.capacity == quota.capacity()
            && snapshot.interval_ns == quota.interval_ns()
        {
            return Ok(snapshot.clone());
        }
        if snapshot.version != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion {
                found: snapshot.version,
                supported: FORMAT_VERSION,
            });
        }
        let corrupt = |field, value| SnapshotError::Corrupt { field, value };
        let rate = Rate::from_interval_ns(snapshot.interval_ns)
            .map_err(|_| corrupt("interval_ns", snapshot.interval_ns))?;
        let from_quota = Quota::new(snapshot.capacity, rate)
            .map_err(|_| corrupt("capacity", snapshot.capacity))?;
        let from = AnyAlgorithm::new(snapshot.algorithm, from_quota);
        Ok(Snapshot {
            algorithm: self.kind(),
            capacity: quota.capacity(),
            interval_ns: quota.interval_ns(),
            state: self.algorithm.convert_saved(&from, &snapshot.state)?,
            ..snapshot.clone()
        })
    }

    /// Empties the bucket as of `now`: what a restarted host assumes when it cannot trust or
    /// find its stored state. It refills at the configured rate.
    ///
    /// # Errors
    ///
    /// [`Busy`] while requests wait.
    #[inline]
    pub fn exhaust(&mut self, now: u64) -> Result<(), Busy> {
        if !self.queue.is_empty() {
            return Err(Busy);
        }
        let now = self.tick(now);
        self.state = self.algorithm.exhausted_state(now);
        self.stored = None;
        self.writing.clear();
        Ok(())
    }

    /// The bucket for a record to write now: this one with the next `block` admissions (at
    /// most what is left now) already spent. Until that record is written, and as long as
    /// [`Limiter::covered`] says so afterwards, the stored record is at least as empty as the
    /// live bucket: a host that stops and restores from it cannot grant a token twice.
    ///
    /// Call [`Limiter::written`] once the record is stored (or could not be), in the order of
    /// the calls to this.
    #[inline]
    pub fn reserve(&mut self, now: u64, unix_ms: u64, block: u64) -> Snapshot {
        let now = self.tick(now);
        let mut ahead = self.state.clone();
        let left = self
            .algorithm
            .check(&mut self.state.clone(), now, 0)
            .map_or(0, |d| d.remaining);
        let spend = block.min(left);
        if spend > 0 {
            let _ = self.algorithm.check(&mut ahead, now, spend);
        }
        let snapshot = Snapshot::take(&self.algorithm, &ahead, now, unix_ms);
        self.writing.push_back(ahead);
        snapshot
    }

    /// The oldest record of [`Limiter::reserve`] is stored (`ok`) or was not.
    #[inline]
    pub fn written(&mut self, ok: bool) {
        if let Some(state) = self.writing.pop_front() {
            if ok {
                self.stored = Some(state);
            }
        }
    }

    /// Whether the stored record, and every record being written, is at least as empty as the
    /// live bucket at `now` with `more` further admissions: with `more` 0, whether the
    /// admissions so far may go without a write.
    #[inline]
    pub fn covered(&mut self, now: u64, more: u64) -> bool {
        let now = self.tick(now);
        let Some(stored) = &self.stored else {
            return false;
        };
        let mut live = self.state.clone();
        if more > 0
            && !self
                .algorithm
                .check(&mut live, now, more)
                .is_ok_and(|d| d.allowed)
        {
            return false;
        }
        let live = self.algorithm.save(&live, now);
        core::iter::once(stored)
            .chain(self.writing.iter())
            .all(|s| at_least_as_empty(&self.algorithm.save(s, now), &live))
    }
}

/// Whether `a` admits, now and at any later time, no more than `b` (both saved at the same
/// moment by the same algorithm). Conservative: `false` when in doubt (a write then follows).
#[inline]
fn at_least_as_empty(a: &SavedState, b: &SavedState) -> bool {
    match (a, b) {
        (SavedState::Debt { debt_ns: a }, SavedState::Debt { debt_ns: b }) => a >= b,
        (
            SavedState::Window {
                ends_in_ns: ea,
                count: a,
            },
            SavedState::Window {
                ends_in_ns: eb,
                count: b,
            },
        ) => ea == eb && a >= b,
        (
            SavedState::Sliding {
                ends_in_ns: ea,
                previous: pa,
                current: ca,
            },
            SavedState::Sliding {
                ends_in_ns: eb,
                previous: pb,
                current: cb,
            },
        ) => ea == eb && pa >= pb && ca >= cb,
        (SavedState::Log { entries: a }, SavedState::Log { entries: b }) => {
            // For every moment, `a` holds at least as much cost still in use as `b`.
            let in_use_after = |entries: &[(u64, u64)], t: u64| -> u128 {
                entries
                    .iter()
                    .filter(|&&(ends, _)| ends >= t)
                    .map(|&(_, cost)| u128::from(cost))
                    .sum()
            };
            b.iter()
                .all(|&(t, _)| in_use_after(a, t) >= in_use_after(b, t))
        }
        _ => false,
    }
}

#[inline]
fn deliver(ticket: Ticket, outcome: Outcome) -> Delivered {
    let delivery = match outcome {
        Outcome::Admitted(_) => Delivery::Admitted,
        Outcome::TimedOut { retry_after_ns } => Delivery::TimedOut { retry_after_ns },
        Outcome::Closed => Delivery::Closed,
    };
    Delivered {
        ticket: ticket.id(),
        delivery,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;

    fn limiter(capacity: u64, rate: &str, depth: usize, max_wait_ms: u64) -> Limiter {
        Limiter::new(
            Kind::TokenBucket,
            Quota::parse(capacity, rate).unwrap(),
            QueueConfig {
                depth,
                max_wait_ns: max_wait_ms * MS,
            },
        )
    }

    /// Polls at every wake time until nothing waits or `end`; returns `(time, outcome)`.
    fn drain(l: &mut Limiter, mut now: u64, end: u64) -> Vec<(u64, Delivered)> {
        let mut out = vec![];
        while let Some(wake) = l.poll(now) {
            out.extend(l.outcomes().iter().map(|d| (now, *d)));
            if wake > end {
                return out;
            }
            now = wake;
        }
        out.extend(l.outcomes().iter().map(|d| (now, *d)));
        out
    }

    #[test]
    fn burst_then_queue_then_refuse() {
        let mut l = limiter(10, "1/s", 100, 10_000);
        for _ in 0..10 {
            assert!(matches!(
                l.offer(0, 1, 1, Priority::Normal, None),
                Verdict::Admitted { .. }
            ));
        }
        let mut waits = vec![];
        for _ in 0..10 {
            match l.offer(0, 1, 1, Priority::Normal, None) {
                Verdict::Queued { wait_ns, .. } => waits.push(wait_ns / S),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(waits, (1..=10).collect::<Vec<_>>());
        // The eleventh waiter would wait 11 s > 10 s: refused at the door with the exact wait.
        assert_eq!(
            l.offer(0, 1, 1, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::Timeout,
                retry_after_ns: 11 * S
            }
        );
        let out = drain(&mut l, 0, 60 * S);
        assert_eq!(out.len(), 10);
        assert!(out.iter().all(|(_, d)| d.delivery == Delivery::Admitted));
        let times: Vec<u64> = out.iter().map(|(t, _)| t / S).collect();
        assert_eq!(times, (1..=10).collect::<Vec<_>>());
    }

    #[test]
    fn queue_full_carries_the_predicted_wait() {
        let mut l = limiter(1, "2/s", 2, 5_000);
        l.offer(0, 1, 0, Priority::Normal, None);
        l.offer(0, 1, 0, Priority::Normal, None);
        l.offer(0, 1, 0, Priority::Normal, None);
        assert_eq!(
            l.offer(0, 1, 0, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::QueueFull,
                retry_after_ns: 3 * S / 2
            }
        );
    }

    #[test]
    fn no_wait_allowed_means_limited_not_timeout() {
        let mut l = limiter(1, "1/s", 10, 5_000);
        assert!(matches!(
            l.offer(0, 1, 0, Priority::Normal, Some(0)),
            Verdict::Admitted { .. }
        ));
        assert_eq!(
            l.offer(0, 1, 0, Priority::Normal, Some(0)),
            Verdict::Rejected {
                reason: Reason::Limited,
                retry_after_ns: S
            }
        );
        assert_eq!(l.queued(), 0);
    }

    #[test]
    fn a_quiet_tab_is_served_within_a_turn() {
        let mut l = limiter(1, "10/s", 1000, 100_000);
        for _ in 0..51 {
            l.offer(0, 1, 1, Priority::Normal, None);
        }
        let Verdict::Queued { ticket, wait_ns } = l.offer(0, 1, 2, Priority::Normal, None) else {
            panic!()
        };
        assert_eq!(wait_ns, 2 * S / 10);
        let out = drain(&mut l, 0, 100 * S);
        let (at, _) = out.iter().find(|(_, d)| d.ticket == ticket).unwrap();
        assert_eq!(*at, 2 * S / 10);
    }

    #[test]
    fn cancel_and_close() {
        let mut l = limiter(1, "1/s", 10, 10_000);
        l.offer(0, 1, 0, Priority::Normal, None);
        let Verdict::Queued { ticket: a, .. } = l.offer(0, 1, 0, Priority::Normal, None) else {
            panic!()
        };
        let Verdict::Queued { ticket: b, .. } = l.offer(0, 1, 0, Priority::Normal, None) else {
            panic!()
        };
        assert!(l.cancel(a));
        assert!(!l.cancel(a));
        assert!(!l.cancel(12345));
        assert_eq!(l.queued(), 1);
        l.close();
        assert_eq!(
            l.outcomes(),
            &[Delivered {
                ticket: b,
                delivery: Delivery::Closed
            }]
        );
        assert!(!l.cancel(b));
        assert!(matches!(
            l.offer(5 * S, 1, 0, Priority::Normal, None),
            Verdict::Rejected {
                reason: Reason::Closed,
                ..
            }
        ));
    }

    #[test]
    fn time_never_goes_back() {
        let mut l = limiter(1, "1/s", 10, 10_000);
        l.offer(5 * S, 1, 0, Priority::Normal, None);
        // An earlier time is taken as the latest one seen: no token appears.
        assert!(matches!(
            l.offer(0, 1, 0, Priority::Normal, Some(0)),
            Verdict::Rejected { retry_after_ns, .. } if retry_after_ns == S
        ));
    }

    #[test]
    fn restart_keeps_the_bucket_empty() {
        let mut l = limiter(10, "1/s", 0, 0);
        for _ in 0..10 {
            l.offer(0, 1, 0, Priority::Normal, None);
        }
        let snap = l.snapshot(0, 1_000_000);
        // A new worker: its clock restarts at 0, 500 ms of wall-clock time later.
        let mut fresh = limiter(10, "1/s", 0, 0);
        assert_eq!(fresh.status(0).remaining, 10);
        fresh.restore(&snap, 0, 1_000_500).unwrap();
        let st = fresh.status(0);
        assert_eq!(st.remaining, 0);
        assert_eq!(st.next_token_ns, S / 2);
        assert_eq!(st.reset_after_ns, 9 * S + S / 2);
        // 3 s later, 3 tokens (plus the half already paid), never the burst.
        fresh.restore(&snap, 0, 1_003_000).unwrap();
        assert_eq!(fresh.status(0).remaining, 3);
    }

    #[test]
    fn restore_is_refused_while_waiting_and_for_other_algorithms() {
        let mut l = limiter(1, "1/s", 10, 10_000);
        l.offer(0, 1, 0, Priority::Normal, None);
        let snap = l.snapshot(0, 0);
        l.offer(0, 1, 0, Priority::Normal, None);
        assert_eq!(l.restore(&snap, 0, 0), Err(RestoreError::Busy));
        assert_eq!(l.exhaust(0), Err(Busy));
        // Another algorithm: converted, the empty bucket stays empty.
        let mut other = Limiter::new(
            Kind::SlidingLog,
            Quota::parse(1, "1/s").unwrap(),
            QueueConfig::NONE,
        );
        other.restore(&snap, 0, 0).unwrap();
        assert_eq!(other.status(0).remaining, 0);
    }

    /// A bucket of `capacity` at `rate` with `left` tokens, snapshotted at wall-clock 0.
    fn snapshot_with(capacity: u64, rate: &str, left: u64) -> Snapshot {
        let mut l = limiter(capacity, rate, 0, 0);
        for _ in 0..capacity - left {
            assert!(matches!(
                l.offer(0, 1, 0, Priority::Normal, None),
                Verdict::Admitted { .. }
            ));
        }
        l.snapshot(0, 0)
    }

    #[test]
    fn a_tightened_config_never_grants_a_burst() {
        // 2 of 10 left at 1/s; the new worker limits 10 per hour.
        let snap = snapshot_with(10, "1/s", 2);
        let mut l = limiter(10, "1/h", 0, 0);
        l.restore(&snap, 0, 0).unwrap();
        assert_eq!(
            l.status(0).remaining,
            2,
            "not the 9.99 of a debt capped at the window"
        );
        // The time since the snapshot refills at the new rate.
        l.restore(&snap, 0, 10_000).unwrap();
        assert_eq!(l.status(0).remaining, 2);
        l.restore(&snap, 0, 3_600_000).unwrap();
        assert_eq!(l.status(0).remaining, 3);
        // A smaller capacity: min(left, new capacity).
        let snap = snapshot_with(10, "1/s", 8);
        let mut small = limiter(5, "1/s", 0, 0);
        small.restore(&snap, 0, 0).unwrap();
        assert_eq!(small.status(0).remaining, 5);
        let mut smaller_and_slower = limiter(5, "1/min", 0, 0);
        smaller_and_slower
            .restore(&snapshot_with(10, "1/s", 3), 0, 0)
            .unwrap();
        assert_eq!(smaller_and_slower.status(0).remaining, 3);
        assert_eq!(smaller_and_slower.status(59 * S).remaining, 3);
        assert_eq!(smaller_and_slower.status(60 * S).remaining, 4);
    }

    #[test]
    fn a_loosened_config_applies_without_a_reset() {
        let snap = snapshot_with(10, "1/h", 2);
        let mut l = limiter(20, "1/s", 0, 0);
        l.restore(&snap, 0, 0).unwrap();
        assert_eq!(l.status(0).remaining, 2, "no reset to a full bucket");
        l.restore(&snap, 0, 3_000).unwrap();
        assert_eq!(l.status(0).remaining, 5, "refills at the new rate");
        assert_eq!(l.status(100 * S).remaining, 20, "towards the new capacity");
    }

    #[test]
    fn the_stored_record_stays_at_least_as_empty_as_the_live_bucket() {
        for kind in Kind::ALL {
            let mut l = Limiter::new(kind, Quota::parse(10, "1/s").unwrap(), QueueConfig::NONE);
            assert!(!l.covered(0, 0), "{kind}: no record known yet");
            // A record with the next 3 admissions spent.
            let snap = l.reserve(0, 0, 3);
            assert!(!l.covered(0, 0), "{kind}: not written yet");
            assert!(!l.covered(0, 3), "{kind}");
            l.written(true);
            assert!(l.covered(0, 3), "{kind}: 3 more are inside the block");
            assert!(!l.covered(0, 4), "{kind}: 4 are not");
            let mut restored = Limiter::new(kind, l.quota(), QueueConfig::NONE);
            restored.restore(&snap, 0, 0).unwrap();
            assert_eq!(restored.status(0).remaining, 7, "{kind}");
            for i in 0..3 {
                assert!(matches!(
                    l.offer(0, 1, 0, Priority::Normal, None),
                    Verdict::Admitted { .. }
                ));
                assert!(l.covered(0, 0), "{kind}: admission {i} is inside the block");
            }
            l.offer(0, 1, 0, Priority::Normal, None);
            assert!(!l.covered(0, 0), "{kind}: the fourth is beyond it");
            // A failed write covers nothing.
            l.reserve(0, 0, 3);
            l.written(false);
            assert!(!l.covered(0, 0), "{kind}");
            // The block is at most what is left.
            let snap = l.reserve(0, 0, 100);
            l.written(true);
            restored.restore(&snap, 0, 0).unwrap();
            assert_eq!(restored.status(0).remaining, 0, "{kind}");
            for _ in 0..6 {
                l.offer(0, 1, 0, Priority::Normal, None);
            }
            assert!(l.covered(0, 0), "{kind}");
        }
    }

    #[test]
    fn a_full_bucket_does_not_make_the_record_cover_more() {
        // 10 tokens, 5 reserved; 5 s later the live bucket is capped at 10 while the record has
        // refilled to 10 as well: the block is spent by then.
        let mut l = limiter(10, "1/s", 0, 0);
        l.reserve(0, 0, 5);
        l.written(true);
        assert!(matches!(
            l.offer(5 * S, 1, 0, Priority::Normal, None),
            Verdict::Admitted { .. }
        ));
        assert!(!l.covered(5 * S, 0));
    }

    #[test]
    fn a_snapshot_with_an_impossible_quota_is_refused() {
        let mut snap = snapshot_with(10, "1/s", 2);
        snap.capacity = 0;
        let mut l = limiter(10, "1/h", 0, 0);
        assert!(matches!(
            l.restore(&snap, 0, 0),
            Err(RestoreError::Snapshot(SnapshotError::Corrupt { .. }))
        ));
        assert_eq!(l.status(0).remaining, 10, "unchanged");
    }

    #[test]
    fn exhausted_refills() {
        let mut l = limiter(10, "1/s", 0, 0);
        l.exhaust(7 * S).unwrap();
        assert_eq!(l.status(7 * S).remaining, 0);
        assert_eq!(l.status(9 * S).remaining, 2);
        assert_eq!(l.status(100 * S).remaining, 10);
    }

    #[test]
    fn every_algorithm_offers_and_snapshots() {
        for kind in Kind::ALL {
            let mut l = Limiter::new(
                kind,
                Quota::parse(2, "1/s").unwrap(),
                QueueConfig {
                    depth: 4,
                    max_wait_ns: 60 * S,
                },
            );
            let verdicts: Vec<_> = (0..4)
                .map(|_| l.offer(0, 1, 0, Priority::Normal, None))
                .collect();
            assert!(
                matches!(verdicts[1], Verdict::Admitted { .. }),
                "{kind}: {verdicts:?}"
            );
            assert!(
                matches!(verdicts[3], Verdict::Queued { .. }),
                "{kind}: {verdicts:?}"
            );
            let out = drain(&mut l, 0, 600 * S);
            assert_eq!(out.len(), 2, "{kind}");
            let snap = l.snapshot(600 * S, 0);
            let mut again = Limiter::new(kind, l.quota(), l.queue_config());
            again.restore(&snap, 0, 0).unwrap();
        }
    }
}
