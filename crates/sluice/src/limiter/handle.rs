//! The [`Limiter`] handle and its non-waiting operations.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;
use sluice_core::queue::{Outcome, Priority, QueueConfig, WaitQueue};
use sluice_core::{Algorithm, CheckError, Decision, Snapshot, SnapshotError, MAX_TIME_NS};

use crate::cell::{Access, LocalAlgorithm, StateCell};
use crate::clock::{Clock, TokioClock};
use crate::error::Error;
use crate::limiter::acquire::{Acquire, AcquireOptions};
use crate::limiter::builder::Builder;
use crate::metrics::LimiterMetrics;

/// A rate limiter over any [`sluice_core`] algorithm, with a wait queue.
///
/// Clones share one state. See the [module docs](crate::limiter).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::Limiter;
/// use sluice_core::{Gcra, Quota};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Limiter::builder(Gcra::new(Quota::parse(2, "10/s")?))
///     .queue(100, Duration::from_secs(5))
///     .build();
/// limiter.try_acquire(2)?; // the burst
/// assert!(limiter.try_acquire(1).is_err()); // no waiting here
/// let started = tokio::time::Instant::now();
/// limiter.acquire(1).await?; // waits its turn: 100 ms
/// assert_eq!(started.elapsed(), Duration::from_millis(100));
/// # Ok(())
/// # }
/// ```
pub struct Limiter<
    A: LocalAlgorithm,
    C: Clock = TokioClock,
    X: StateCell<A> = <A as LocalAlgorithm>::Cell,
> {
    pub(crate) shared: Arc<Shared<A, C, X>>,
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Clone for Limiter<A, C, X> {
    fn clone(&self) -> Self {
        Limiter {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> std::fmt::Debug for Limiter<A, C, X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("name", &self.shared.name)
            .field("algorithm", &self.shared.algorithm.name())
            .field("quota", &self.shared.algorithm.quota())
            .field("queued", &self.queued())
            .finish()
    }
}

pub(crate) struct Shared<A: LocalAlgorithm, C, X> {
    pub(crate) name: String,
    pub(crate) algorithm: A,
    pub(crate) clock: C,
    pub(crate) cell: crate::cell::CachePadded<X>,
    /// Live waiters, with [`CLOSED`] set once closed: one load tells `try_acquire` whether
    /// it may skip the queue lock. Written only under `inner`'s lock.
    pub(crate) waiting: AtomicUsize,
    pub(crate) closed: AtomicBool,
    pub(crate) inner: Mutex<Inner<A::State>>,
    /// Wakes the driver early: a new head, a cancellation, a refund, a close.
    pub(crate) notify: tokio::sync::Notify,
    pub(crate) metrics: LimiterMetrics,
}

pub(crate) struct Inner<S> {
    pub(crate) queue: WaitQueue<S, Option<Waker>>,
    /// Outcomes decided by the driver, not yet seen by their futures.
    pub(crate) done: HashMap<u64, Finished, foldhash::fast::RandomState>,
    /// Whether a driver holds the claim to poll the queue (see `driver::Claim`).
    pub(crate) driver: bool,
    /// When the driver will poll next (`u64::MAX`: not scheduled).
    pub(crate) scheduled: u64,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Finished {
    pub(crate) outcome: Outcome,
    /// When it was decided (for refunds).
    pub(crate) at: u64,
}

/// The bit of [`Shared::waiting`] that says the limiter is closed.
pub(crate) const CLOSED: usize = 1 << (usize::BITS - 1);

impl<A: LocalAlgorithm, C, X> Shared<A, C, X> {
    /// Publishes the queue length (call with `inner` locked).
    pub(crate) fn publish_waiting(&self, len: usize) {
        let closed = if self.closed.load(Ordering::Relaxed) {
            CLOSED
        } else {
            0
        };
        self.waiting.store(len | closed, Ordering::Release);
    }
}

pub(crate) fn dur(ns: u64) -> Duration {
    Duration::from_nanos(ns)
}

impl<A: LocalAlgorithm> Limiter<A, TokioClock> {
    /// A limiter with an unbounded queue and no maximum wait, on tokio's clock.
    pub fn new(algorithm: A) -> Limiter<A, TokioClock> {
        Builder::new(algorithm).build()
    }

    /// Starts configuring a limiter.
    pub fn builder(algorithm: A) -> Builder<A, TokioClock> {
        Builder::new(algorithm)
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Limiter<A, C, X> {
    /// Takes `cost` now if the limit allows and nobody is waiting; never waits.
    ///
    /// # Errors
    ///
    /// [`Error::Limited`] with the wait until it would be admitted (counting the waiters
    /// ahead), [`Error::InsufficientCapacity`] when the cost exceeds the capacity,
    /// [`Error::Closed`] after [`Limiter::close`].
    #[inline]
    pub fn try_acquire(&self, cost: u64) -> Result<Decision, Error> {
        let s = &*self.shared;
        let now = s.clock.now_ns();
        // A time past MAX_TIME_NS (which the algorithms clamp) goes the slow way too, so that
        // the clamp is not on the path from the clock read to the compare-and-swap.
        if s.waiting.load(Ordering::Acquire) == 0 && now <= MAX_TIME_NS {
            return self.check_unqueued(now, cost);
        }
        self.try_acquire_slow(now, cost)
    }

    /// One check on the state, for when nobody waits.
    #[inline]
    fn check_unqueued(&self, now: u64, cost: u64) -> Result<Decision, Error> {
        let s = &*self.shared;
        match s.cell.check(&s.algorithm, now, cost) {
            Ok(decision) if decision.allowed => {
                s.metrics.admitted.increment(1);
                Ok(decision)
            }
            Ok(decision) => {
                s.metrics.limited.increment(1);
                Err(Error::Limited {
                    retry_after: dur(decision.retry_after_ns),
                    decision,
                })
            }
            Err(e) => Err(capacity_error(e)),
        }
    }

    #[cold]
    fn try_acquire_slow(&self, now: u64, cost: u64) -> Result<Decision, Error> {
        let s = &*self.shared;
        if s.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let mut inner = s.inner.lock();
        if inner.queue.is_empty() {
            drop(inner);
            return self.check_unqueued(now, cost);
        }
        let capacity = s.algorithm.quota().capacity();
        if cost > capacity {
            return Err(Error::InsufficientCapacity { cost, capacity });
        }
        let wait = inner.queue.peek_wait(
            &s.algorithm,
            &Access(&*s.cell),
            now,
            cost,
            Priority::Normal,
            0,
        );
        let mut decision = s.cell.load_decision(&s.algorithm, now);
        decision.allowed = false;
        decision.retry_after_ns = wait.max(1);
        s.metrics.limited.increment(1);
        Err(Error::Limited {
            retry_after: dur(decision.retry_after_ns),
            decision,
        })
    }

    /// Waits in the queue until `cost` is admitted, at normal priority.
    ///
    /// # Errors
    ///
    /// [`Error::QueueFull`] at once when the queue is at its depth, [`Error::Timeout`] at once
    /// when the predicted wait exceeds the maximum wait (with that prediction as
    /// `retry_after`) or at the deadline, [`Error::InsufficientCapacity`] at once,
    /// [`Error::Closed`] when the limiter is closed meanwhile. [`Error::NoRuntime`] at once
    /// when it has to wait outside a tokio runtime or on one without its time driver (tokio's
    /// own panic message, caught, names the fix: `enable_time`). A limiter outlives the
    /// runtime its waiters ran on: when that runtime shuts down, the next waiter starts the
    /// queue's timer on its own runtime.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before it completes frees its place in the queue. If the limiter
    /// had just admitted it and the future never saw that, the tokens are given back. Either
    /// way nothing is lost and nothing leaks.
    pub fn acquire(&self, cost: u64) -> Acquire<'_, A, C, X> {
        Acquire::new(self, cost, AcquireOptions::default())
    }

    /// [`Limiter::acquire`] with a priority, a flow (for fairness) or a shorter maximum wait.
    ///
    /// # Errors
    ///
    /// As [`Limiter::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`Limiter::acquire`].
    pub fn acquire_with(&self, cost: u64, options: AcquireOptions) -> Acquire<'_, A, C, X> {
        Acquire::new(self, cost, options)
    }

    /// Wakes every waiter with [`Error::Closed`]; later calls fail with it too.
    pub fn close(&self) {
        let s = &*self.shared;
        s.closed.store(true, Ordering::Release);
        let mut wakers = Vec::new();
        {
            let mut inner = s.inner.lock();
            let now = s.clock.now_ns();
            let Inner { queue, done, .. } = &mut *inner;
            queue.close_with(|ticket, outcome, waker| {
                done.insert(ticket.id(), Finished { outcome, at: now });
                wakers.extend(waker);
            });
            s.waiting.store(CLOSED, Ordering::Release);
        }
        s.metrics.queued.set(0.0);
        s.notify.notify_one();
        wakers.into_iter().for_each(Waker::wake);
    }

    /// Whether [`Limiter::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.shared.waiting.load(Ordering::Acquire) & !CLOSED
    }

    /// The queue limits.
    pub fn queue_config(&self) -> QueueConfig {
        self.shared.inner.lock().queue.config()
    }

    /// The algorithm.
    pub fn algorithm(&self) -> &A {
        &self.shared.algorithm
    }

    /// The limit as of now, consuming nothing (`remaining`, `reset_after`).
    pub fn peek(&self) -> Decision {
        let s = &*self.shared;
        s.cell.load_decision(&s.algorithm, s.clock.now_ns())
    }

    /// Saves the state, stamped with wall-clock `unix_ms`.
    pub fn snapshot(&self, unix_ms: u64) -> Snapshot {
        let s = &*self.shared;
        Snapshot::take(&s.algorithm, &s.cell.load(), s.clock.now_ns(), unix_ms)
    }

    /// Replaces the state with one restored from `snapshot` at wall-clock `unix_ms`.
    ///
    /// # Errors
    ///
    /// As [`Snapshot::restore`]; the state is then left as it was.
    pub fn restore(&self, snapshot: &Snapshot, unix_ms: u64) -> Result<(), SnapshotError> {
        let s = &*self.shared;
        let state = snapshot.restore(&s.algorithm, s.clock.now_ns(), unix_ms)?;
        s.cell.store(state);
        Ok(())
    }

    /// Replaces the state with the worst case: everything spent just now.
    pub fn exhaust(&self) {
        let s = &*self.shared;
        s.cell.store(s.algorithm.exhausted_state(s.clock.now_ns()));
    }

    /// The clock's time now, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        self.shared.clock.now_ns()
    }
}

pub(crate) fn capacity_error(e: CheckError) -> Error {
    match e {
        CheckError::InsufficientCapacity { cost, capacity } => {
            Error::InsufficientCapacity { cost, capacity }
        }
        _ => Error::Closed,
    }
}

/// A query of the live state without consuming.
pub(crate) trait LoadDecision<A: Algorithm> {
    fn load_decision(&self, algorithm: &A, now: u64) -> Decision;
}

impl<A: Algorithm, T: StateCell<A>> LoadDecision<A> for T {
    fn load_decision(&self, algorithm: &A, now: u64) -> Decision {
        let mut state = self.load();
        algorithm.check(&mut state, now, 0).unwrap_or(Decision {
            allowed: false,
            limit: algorithm.quota().capacity(),
            remaining: 0,
            retry_after_ns: 0,
            reset_after_ns: 0,
        })
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Limiter<A, C, X> {
    /// Gives back `cost` admitted `ago` (now minus its admission) that will never be used: a
    /// request this limiter admitted and another limit then refused. A refund undoes that
    /// admission and never adds capacity beyond it; the queue's head is looked at again.
    pub fn refund(&self, cost: u64, ago: Duration) {
        let s = &*self.shared;
        let now = s.clock.now_ns();
        let admitted_at = now.saturating_sub(crate::limiter::builder::duration_ns(ago));
        s.cell.refund(&s.algorithm, admitted_at, now, cost);
        if s.waiting.load(Ordering::Acquire) & !CLOSED != 0 {
            s.notify.notify_one();
        }
    }
}
