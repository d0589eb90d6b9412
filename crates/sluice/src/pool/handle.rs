//! [`Pool`] and its permits.

use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit, TryAcquireError};

use crate::error::Error;
use crate::metrics::PoolMetrics;

/// A pool size of zero was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a pool needs at least one slot, got 0")]
pub struct PoolError;

/// At most N tasks in flight; the rest wait in a FIFO queue of bounded depth and wait.
///
/// Built on tokio's fair [`Semaphore`]; clones share the slots.
///
/// # Examples
///
/// ```
/// use sluice::Pool;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = Pool::with_size(5)?;
/// let results = futures_util::future::join_all((0..10).map(|i| {
///     let pool = pool.clone();
///     async move { pool.run(async move { i * 2 }).await }
/// }))
/// .await;
/// assert_eq!(results.into_iter().map(Result::unwrap).sum::<i32>(), 90);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    size: AtomicUsize,
    semaphore: Semaphore,
    /// Slots a shrink took away while they were in use: each is taken off the next slot
    /// given back (or handed out) instead of going to a caller, so that the pool never runs
    /// more than its new size once the surplus has finished.
    owed: AtomicUsize,
    /// Held by a resize.
    resizing: parking_lot::Mutex<()>,
    depth: AtomicUsize,
    /// The longest wait, in nanoseconds; `u64::MAX`: none.
    max_wait_ns: AtomicU64,
    waiting: AtomicUsize,
    /// Exponentially weighted mean task time in nanoseconds, for `retry_after` hints.
    mean_task_ns: AtomicU64,
    metrics: PoolMetrics,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size())
            .field("in_flight", &self.in_flight())
            .field("waiting", &self.waiting())
            .finish()
    }
}

/// A slot in the pool; dropping it frees the slot.
pub struct PoolPermit {
    /// The pool; its semaphore's slot is held by this permit (forgotten at acquire, added back
    /// on drop), so one reference count is all a permit costs.
    inner: Arc<Inner>,
}

impl std::fmt::Debug for PoolPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolPermit").finish_non_exhaustive()
    }
}

impl Drop for PoolPermit {
    fn drop(&mut self) {
        let inner = &*self.inner;
        let owed = inner.owed.load(Ordering::Acquire);
        if owed == 0 || !inner.absorb_one() {
            inner.semaphore.add_permits(1);
        }
        inner
            .metrics
            .in_flight
            .set(inner.in_flight_owing(owed) as f64);
    }
}

impl Inner {
    /// Pays one slot of the debt a shrink left, if any: the caller's slot leaves the pool.
    fn absorb_one(&self) -> bool {
        self.owed.load(Ordering::Acquire) > 0
            && self
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| o.checked_sub(1))
                .is_ok()
    }

    fn in_flight(&self) -> usize {
        self.in_flight_owing(self.owed.load(Ordering::Acquire))
    }

    /// In flight, with the debt read already (the gauge's figure; exact when no resize runs
    /// meanwhile).
    fn in_flight_owing(&self, owed: usize) -> usize {
        (self.size.load(Ordering::Relaxed) + owed)
            .saturating_sub(self.semaphore.available_permits())
    }

    fn max_wait(&self) -> Option<Duration> {
        match self.max_wait_ns.load(Ordering::Relaxed) {
            u64::MAX => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }
}

fn wait_ns(max_wait: Option<Duration>) -> u64 {
    max_wait.map_or(u64::MAX, |d| {
        u64::try_from(d.as_nanos()).unwrap_or(u64::MAX - 1)
    })
}

impl Pool {
    /// A pool of `size` slots with an unbounded queue and no maximum wait.
    pub fn new(size: NonZeroUsize) -> Pool {
        Pool::build(size.get(), usize::MAX, None, "default")
    }

    /// A pool of `size` slots.
    ///
    /// # Errors
    ///
    /// [`PoolError`] for a size of zero.
    pub fn with_size(size: usize) -> Result<Pool, PoolError> {
        NonZeroUsize::new(size).map(Pool::new).ok_or(PoolError)
    }

    /// A pool of `size` slots, at most `depth` waiters, each waiting at most `max_wait`, whose
    /// metrics carry the label `pool = name`.
    pub fn bounded(size: NonZeroUsize, depth: usize, max_wait: Duration, name: &str) -> Pool {
        Pool::build(size.get(), depth, Some(max_wait), name)
    }

    fn build(size: usize, depth: usize, max_wait: Option<Duration>, name: &str) -> Pool {
        let size = size.min(Semaphore::MAX_PERMITS);
        Pool {
            inner: Arc::new(Inner {
                size: AtomicUsize::new(size),
                semaphore: Semaphore::new(size),
                owed: AtomicUsize::new(0),
                resizing: parking_lot::Mutex::new(()),
                depth: AtomicUsize::new(depth),
                max_wait_ns: AtomicU64::new(wait_ns(max_wait)),
                waiting: AtomicUsize::new(0),
                mean_task_ns: AtomicU64::new(0),
                metrics: PoolMetrics::new(name),
            }),
        }
    }

    /// The number of slots.
    pub fn size(&self) -> usize {
        self.inner.size.load(Ordering::Acquire)
    }

    /// Tasks holding a slot now.
    pub fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }

    /// Changes the number of slots in place, for every clone and every caller waiting. A
    /// larger pool lets waiters in at once. A smaller one takes free slots away now and the
    /// others as the tasks holding them finish: tasks in flight are never cut short, and no
    /// new one starts until fewer than `size` run.
    pub fn resize(&self, size: NonZeroUsize) {
        let inner = &*self.inner;
        let _one = inner.resizing.lock();
        let new = size.get().min(Semaphore::MAX_PERMITS);
        let old = inner.size.swap(new, Ordering::AcqRel);
        if new > old {
            let grow = new - old;
            // Debt first: slots owed need not be given back to be added again.
            let owed = inner
                .owed
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |o| {
                    Some(o.saturating_sub(grow))
                })
                .unwrap_or(0);
            inner.semaphore.add_permits(grow - owed.min(grow));
        } else if new < old {
            inner.owed.fetch_add(old - new, Ordering::AcqRel);
            // The free slots leave now; the rest as they are given back.
            while inner.owed.load(Ordering::Acquire) > 0 {
                let Ok(free) = inner.semaphore.try_acquire() else {
                    break;
                };
                free.forget();
                if !inner.absorb_one() {
                    inner.semaphore.add_permits(1);
                    break;
                }
            }
        }
        inner.metrics.in_flight.set(inner.in_flight() as f64);
    }

    /// Changes the queue in place: at most `depth` waiters (those already waiting stay), each
    /// waiting at most `max_wait` (from the next wait on).
    pub fn set_queue(&self, depth: usize, max_wait: Duration) {
        self.inner.depth.store(depth, Ordering::Relaxed);
        self.inner
            .max_wait_ns
            .store(wait_ns(Some(max_wait)), Ordering::Relaxed);
    }

    /// Callers waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.inner.waiting.load(Ordering::Acquire)
    }

    /// Takes a slot if one is free and nobody waits; never waits.
    ///
    /// # Errors
    ///
    /// [`Error::QueueFull`] when no slot is free, [`Error::Closed`] after [`Pool::close`].
    pub fn try_acquire(&self) -> Result<PoolPermit, Error> {
        loop {
            match self.inner.semaphore.try_acquire() {
                Ok(permit) => match self.permit(permit) {
                    Some(permit) => return Ok(permit),
                    None => continue,
                },
                Err(TryAcquireError::NoPermits) => {
                    return Err(Error::QueueFull {
                        retry_after: self.retry_hint(),
                    })
                }
                Err(TryAcquireError::Closed) => return Err(Error::Closed),
            }
        }
    }

    /// Waits for a slot.
    ///
    /// # Errors
    ///
    /// [`Error::QueueFull`] at once when `depth` callers already wait, [`Error::Timeout`] when
    /// the maximum wait passes, [`Error::Closed`] after [`Pool::close`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the queue; tokio's semaphore hands a slot it had just been
    /// given to the next waiter.
    pub async fn acquire(&self) -> Result<PoolPermit, Error> {
        let inner = &*self.inner;
        if let Ok(permit) = inner.semaphore.try_acquire() {
            if let Some(permit) = self.permit(permit) {
                return Ok(permit);
            }
        }
        let waiting = inner.waiting.fetch_add(1, Ordering::AcqRel);
        let _leave = Leave(&inner.waiting);
        if waiting >= inner.depth.load(Ordering::Relaxed) {
            inner.metrics.queue_full.increment(1);
            return Err(Error::QueueFull {
                retry_after: self.retry_hint(),
            });
        }
        // Raised while this caller waits, lowered however the wait ends (a slot, a timeout,
        // a close or a dropped future), so the gauge is the number waiting.
        inner.metrics.queued.increment(1);
        let _queued = Lower(&inner.metrics.queued);
        let started = tokio::time::Instant::now();
        let deadline = inner.max_wait().map(|w| started + w);
        loop {
            let acquire = inner.semaphore.acquire();
            let result = match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, acquire).await {
                    Ok(r) => r,
                    Err(_) => {
                        inner.metrics.timeout.increment(1);
                        return Err(Error::Timeout {
                            retry_after: self.retry_hint(),
                        });
                    }
                },
                None => acquire.await,
            };
            let Ok(permit) = result else {
                return Err(Error::Closed);
            };
            // A slot a shrink claimed goes, and the wait goes on.
            if let Some(permit) = self.permit(permit) {
                inner
                    .metrics
                    .queue_wait
                    .record(started.elapsed().as_secs_f64());
                return Ok(permit);
            }
        }
    }

    /// Runs `task` in a slot and returns its output. The slot is freed when the task ends,
    /// panics (the panic then continues to unwind) or is dropped.
    ///
    /// # Errors
    ///
    /// As [`Pool::acquire`]; the task is not run then.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the task and frees its slot.
    pub async fn run<F: Future>(&self, task: F) -> Result<F::Output, Error> {
        let permit = self.acquire().await?;
        let started = tokio::time::Instant::now();
        let output = task.await;
        self.record_task_time(started.elapsed());
        drop(permit);
        Ok(output)
    }

    /// Refuses new callers and wakes the waiting ones with [`Error::Closed`]. Tasks in flight
    /// finish normally.
    pub fn close(&self) {
        self.inner.semaphore.close();
    }

    /// The caller's slot, or `None` when a shrink claims it.
    fn permit(&self, permit: SemaphorePermit<'_>) -> Option<PoolPermit> {
        permit.forget();
        let inner = &self.inner;
        let owed = inner.owed.load(Ordering::Acquire);
        if owed != 0 && inner.absorb_one() {
            return None;
        }
        inner.metrics.admitted.increment(1);
        inner
            .metrics
            .in_flight
            .set(inner.in_flight_owing(owed) as f64);
        Some(PoolPermit {
            inner: Arc::clone(inner),
        })
    }

    fn record_task_time(&self, took: Duration) {
        let took = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let _ =
            self.inner
                .mean_task_ns
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |mean| {
                    Some(if mean == 0 {
                        took
                    } else {
                        mean - mean / 8 + took / 8
                    })
                });
    }

    /// A guess at the wait for a slot: the waiters ahead, shared among the slots, times the
    /// mean task time. What [`Pool::try_acquire`] tells a caller it refuses.
    pub fn retry_hint(&self) -> Duration {
        let mean = self.inner.mean_task_ns.load(Ordering::Relaxed);
        let rounds = (self.waiting() / self.size().max(1)) as u64 + 1;
        Duration::from_nanos(mean.saturating_mul(rounds))
    }
}

/// Lowers a gauge by one when dropped.
struct Lower<'a>(&'a metrics::Gauge);

impl Drop for Lower<'_> {
    fn drop(&mut self) {
        self.0.decrement(1);
    }
}

struct Leave<'a>(&'a AtomicUsize);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
