//! The [`Acquire`] future: waiting in the queue, and giving the place back when dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sluice_core::queue::{Offer, Outcome, Priority, Rejection, Ticket};
use sluice_core::Decision;

use crate::cell::{Access, LocalAlgorithm, StateCell};
use crate::clock::Clock;
use crate::error::Error;
use crate::limiter::builder::duration_ns;
use crate::limiter::driver::{self, Claim};
use crate::limiter::handle::{capacity_error, dur, Limiter, CLOSED};

/// How one `acquire` waits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Served before lower priorities (which may then wait until their deadline).
    pub priority: Priority,
    /// Requests of different flows take turns; of one flow, first come first served.
    pub flow: u64,
    /// Overrides the limiter's maximum wait for this request.
    pub max_wait: Option<Duration>,
}

enum State {
    Start,
    Queued { ticket: Ticket, since: u64 },
    Finished,
}

/// Waits for admission. Returned by [`Limiter::acquire`].
///
/// # Cancel safety
///
/// Dropping it gives its place (or, if it was admitted unseen, its tokens) back.
#[must_use = "futures do nothing unless awaited"]
pub struct Acquire<'a, A: LocalAlgorithm, C: Clock, X: StateCell<A>> {
    limiter: &'a Limiter<A, C, X>,
    cost: u64,
    options: AcquireOptions,
    state: State,
}

impl<'a, A: LocalAlgorithm, C: Clock, X: StateCell<A>> Acquire<'a, A, C, X> {
    pub(crate) fn new(limiter: &'a Limiter<A, C, X>, cost: u64, options: AcquireOptions) -> Self {
        Acquire {
            limiter,
            cost,
            options,
            state: State::Start,
        }
    }

    fn start(&mut self, cx: &mut Context<'_>) -> Poll<Result<Decision, Error>> {
        let s = &*self.limiter.shared;
        let now = s.clock.now_ns();
        let waiting = s.waiting.load(Ordering::Acquire);
        if waiting & CLOSED != 0 {
            s.metrics.closed.increment(1);
            return Poll::Ready(Err(Error::Closed));
        }
        if waiting == 0 {
            match s.cell.check(&s.algorithm, now, self.cost) {
                Ok(decision) if decision.allowed => {
                    s.metrics.admitted.increment(1);
                    return Poll::Ready(Ok(decision));
                }
                Ok(_) => {}
                Err(e) => return Poll::Ready(Err(capacity_error(e))),
            }
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            s.metrics.denied(&Error::NoRuntime);
            return Poll::Ready(Err(Error::NoRuntime));
        };
        let max_wait = self.options.max_wait.map_or(u64::MAX, duration_ns);
        let mut inner = s.inner.lock();
        let max_wait = max_wait.min(inner.queue.config().max_wait_ns);
        let offer = inner.queue.offer_with_max_wait(
            &s.algorithm,
            &mut Access(&*s.cell),
            now,
            self.cost,
            self.options.priority,
            self.options.flow,
            max_wait,
        );
        match offer {
            Offer::Admitted(decision) => {
                drop(inner);
                s.metrics.admitted.increment(1);
                Poll::Ready(Ok(decision))
            }
            Offer::Rejected(rejection) => {
                drop(inner);
                let error = match rejection {
                    Rejection::Limited { decision } => Error::Limited {
                        retry_after: dur(decision.retry_after_ns),
                        decision,
                    },
                    Rejection::QueueFull { retry_after_ns } => Error::QueueFull {
                        retry_after: dur(retry_after_ns),
                    },
                    Rejection::Timeout { retry_after_ns } => Error::Timeout {
                        retry_after: dur(retry_after_ns),
                    },
                    Rejection::InsufficientCapacity { cost, capacity } => {
                        Error::InsufficientCapacity { cost, capacity }
                    }
                    Rejection::Closed => Error::Closed,
                };
                s.metrics.denied(&error);
                Poll::Ready(Err(error))
            }
            Offer::Queued { ticket, wait_ns } => {
                if let Some(slot) = inner.queue.payload_mut(ticket) {
                    *slot = Some(cx.waker().clone());
                }
                let len = inner.queue.len();
                s.publish_waiting(len);
                let wake = now.saturating_add(wait_ns);
                let claim = if !inner.driver {
                    inner.driver = true;
                    inner.scheduled = wake;
                    Some(Claim::new(Arc::clone(&self.limiter.shared)))
                } else {
                    if wake < inner.scheduled {
                        inner.scheduled = wake;
                        s.notify.notify_one();
                    }
                    None
                };
                drop(inner);
                s.metrics.queued.set(len as f64);
                self.state = State::Queued { ticket, since: now };
                match claim {
                    Some(claim) => self.start_driver(Some(runtime), claim, ticket),
                    None => Poll::Pending,
                }
            }
        }
    }

    /// Spawns the driver that `claim` stands for on `runtime` (called without the queue's lock:
    /// a runtime that refuses the task drops the claim, which takes the lock). On a runtime
    /// that cannot run it (none, no time driver, shutting down), withdraws `ticket` and fails
    /// with [`Error::NoRuntime`] at once rather than wait for a driver that never comes.
    fn start_driver(
        &mut self,
        runtime: Option<tokio::runtime::Handle>,
        claim: Claim<A, C, X>,
        ticket: Ticket,
    ) -> Poll<Result<Decision, Error>> {
        match runtime {
            Some(runtime) if driver::timers_enabled() => {
                runtime.spawn(driver::drive(claim));
            }
            // Gives the claim back, waking the others to start a driver where they are.
            _ => drop(claim),
        }
        let s = &*self.limiter.shared;
        let mut inner = s.inner.lock();
        if inner.driver || !inner.queue.cancel(ticket) {
            // Driven (or already decided: the next poll reads the outcome).
            return Poll::Pending;
        }
        let len = inner.queue.len();
        s.publish_waiting(len);
        drop(inner);
        s.metrics.queued.set(len as f64);
        s.notify.notify_one();
        self.state = State::Finished;
        Poll::Ready(Err(Error::NoRuntime))
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Future for Acquire<'_, A, C, X> {
    type Output = Result<Decision, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match this.state {
            State::Start => {
                let poll = this.start(cx);
                if poll.is_ready() {
                    this.state = State::Finished;
                }
                poll
            }
            State::Queued { ticket, since } => {
                let s = &*this.limiter.shared;
                let mut inner = s.inner.lock();
                if let Some(finished) = inner.done.remove(&ticket.id()) {
                    drop(inner);
                    this.state = State::Finished;
                    let result = match finished.outcome {
                        Outcome::Admitted(decision) => {
                            s.metrics.admitted.increment(1);
                            s.metrics
                                .queue_wait
                                .record(dur(finished.at.saturating_sub(since)).as_secs_f64());
                            Ok(decision)
                        }
                        Outcome::TimedOut { retry_after_ns } => Err(Error::Timeout {
                            retry_after: dur(retry_after_ns),
                        }),
                        Outcome::Closed => Err(Error::Closed),
                    };
                    if let Err(e) = &result {
                        s.metrics.denied(e);
                    }
                    return Poll::Ready(result);
                }
                match inner.queue.payload_mut(ticket) {
                    Some(slot) => {
                        if !slot.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                            *slot = Some(cx.waker().clone());
                        }
                        if inner.driver {
                            return Poll::Pending;
                        }
                        // The driver went down with its runtime: start the next one here.
                        inner.driver = true;
                        inner.scheduled = 0;
                        let claim = Claim::new(Arc::clone(&this.limiter.shared));
                        drop(inner);
                        let runtime = tokio::runtime::Handle::try_current().ok();
                        this.start_driver(runtime, claim, ticket)
                    }
                    None => {
                        // Neither waiting nor decided: only a close races here.
                        this.state = State::Finished;
                        Poll::Ready(Err(Error::Closed))
                    }
                }
            }
            State::Finished => Poll::Ready(Err(Error::Closed)),
        }
    }
}

impl<A: LocalAlgorithm, C: Clock, X: StateCell<A>> Drop for Acquire<'_, A, C, X> {
    fn drop(&mut self) {
        let State::Queued { ticket, .. } = self.state else {
            return;
        };
        let s = &*self.limiter.shared;
        let mut inner = s.inner.lock();
        if inner.queue.cancel(ticket) {
            let len = inner.queue.len();
            s.publish_waiting(len);
            drop(inner);
            s.metrics.queued.set(len as f64);
            // The head may have changed: let the driver look again.
            s.notify.notify_one();
        } else if let Some(finished) = inner.done.remove(&ticket.id()) {
            drop(inner);
            if let Outcome::Admitted(_) = finished.outcome {
                // Admitted but never seen: give the tokens back to whoever waits next.
                s.cell
                    .refund(&s.algorithm, finished.at, s.clock.now_ns(), self.cost);
                s.notify.notify_one();
            }
        }
    }
}
