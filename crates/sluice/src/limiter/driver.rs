//! The one task per limiter that sleeps until the queue's next event and then polls it.

use std::sync::Arc;
use std::task::Waker;

use crate::cell::{Access, LocalAlgorithm, StateCell};
use crate::clock::Clock;
use crate::limiter::handle::{Finished, Inner, Shared};

/// The claim to be a limiter's one driver, taken (with `Inner::driver` set) under the queue's
/// lock and moved into the driver task.
///
/// If it is dropped before the driver clears `Inner::driver` itself (the task was dropped with
/// its runtime, refused by a runtime shutting down, or it panicked), it clears the flag and
/// wakes every waiter, so that the next one polled starts a driver on its own runtime (or fails
/// with a clear error there): a dead driver never leaves a waiter hanging.
pub(crate) struct Claim<A: LocalAlgorithm, C, X> {
    shared: Arc<Shared<A, C, X>>,
    held: bool,
}

impl<A: LocalAlgorithm, C, X> Claim<A, C, X> {
    /// Takes the claim; call with the queue locked, right after setting `Inner::driver`.
    pub(crate) fn new(shared: Arc<Shared<A, C, X>>) -> Self {
        Claim { shared, held: true }
    }
}

impl<A: LocalAlgorithm, C, X> Drop for Claim<A, C, X> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let wakers: Vec<Waker> = {
            let mut inner = self.shared.inner.lock();
            inner.driver = false;
            inner.scheduled = u64::MAX;
            inner
                .queue
                .payloads_mut()
                .filter_map(Option::take)
                .collect()
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

/// Runs while anyone waits: admits heads as their time comes and times out expired waiters.
/// Exits when the queue is empty; the next waiter starts a new one.
pub(crate) async fn drive<A: LocalAlgorithm, C: Clock, X: StateCell<A>>(mut claim: Claim<A, C, X>) {
    let shared = Arc::clone(&claim.shared);
    let mut wakers: Vec<Waker> = Vec::new();
    loop {
        // Created before looking at the queue, so a notification sent meanwhile is kept.
        let notified = shared.notify.notified();
        let next = {
            let mut inner = shared.inner.lock();
            let now = shared.clock.now_ns();
            let Inner { queue, done, .. } = &mut *inner;
            let next = queue.poll_timed(
                &shared.algorithm,
                &mut Access(&*shared.cell),
                now,
                |ticket, outcome, waker, at| {
                    done.insert(ticket.id(), Finished { outcome, at });
                    wakers.extend(waker);
                },
            );
            let len = queue.len();
            shared.publish_waiting(len);
            match next {
                Some(at) => inner.scheduled = at,
                None => {
                    // Gives the claim up under the lock: the next waiter starts a new driver.
                    inner.driver = false;
                    inner.scheduled = u64::MAX;
                    claim.held = false;
                }
            }
            shared.metrics.queued.set(len as f64);
            next
        };
        wakers.drain(..).for_each(Waker::wake);
        let Some(at) = next else {
            return;
        };
        tokio::select! {
            () = tokio::time::sleep_until(shared.clock.deadline(at)) => {}
            () = notified => {}
        }
    }
}

/// Whether the current tokio runtime has its time driver, which the driver's sleep needs.
///
/// tokio has no query for it: creating a sleep panics without one, so this catches that panic
/// (the panic hook still prints tokio's message, which names the fix: `enable_time`).
pub(crate) fn timers_enabled() -> bool {
    std::panic::catch_unwind(|| drop(tokio::time::sleep(std::time::Duration::ZERO))).is_ok()
}
