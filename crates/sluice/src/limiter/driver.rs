//! The one task per limiter that sleeps until the queue's next event and then polls it.

use std::sync::Arc;
use std::task::Waker;

use crate::cell::{Access, LocalAlgorithm, StateCell};
use crate::clock::Clock;
use crate::limiter::handle::{Finished, Inner, Shared};

/// Runs while anyone waits: admits heads as their time comes and times out expired waiters.
/// Exits when the queue is empty; the next waiter starts a new one.
pub(crate) async fn drive<A: LocalAlgorithm, C: Clock, X: StateCell<A>>(
    shared: Arc<Shared<A, C, X>>,
) {
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
                    inner.driver = false;
                    inner.scheduled = u64::MAX;
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
