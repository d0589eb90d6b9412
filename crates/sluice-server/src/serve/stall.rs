//! The send stall clock of each HTTP/2 stream.
//!
//! [`EdgeIo`](super::conn::EdgeIo) times stalled socket writes. An HTTP/2 stream can stall
//! without any write blocking: a client that grants no flow-control window (an initial
//! window of 0, or no `WINDOW_UPDATE`) leaves hyper holding the stream's next chunk, waiting
//! for capacity that never comes, while the connection's socket stays writable. The stream
//! would keep its route's concurrency permits and its upstream connection for as long as the
//! client keeps the connection.
//!
//! hyper polls a response body for its next chunk only once it has sent the previous one. So
//! the body ([`SendClock`], in [`Ending`](super::conn::Ending)) knows when a chunk is in
//! hyper's hands and unsent, and the task that sends the stream (`Watched`, spawned by
//! [`EdgeExecutor`]) times that: a chunk unsent for `send_timeout` ends the task, and h2
//! resets the stream (`RST_STREAM(CANCEL)`); the body, its permits and its upstream connection
//! are dropped with it. A body waiting on its upstream is not a stall.
//!
//! hyper makes each stream's task right after calling the service for it, on the same
//! thread, with no other service call in between: the service leaves the stream's clock in
//! `NEXT` and the executor takes it from there.
//!
//! Both orders (the service call before the stream's task; the body polled for a chunk before
//! the wait for window to send it) are how hyper 1.12 works, not what its API promises: the
//! workspace requires hyper 1.12 or later (`Cargo.toml`, `[workspace.dependencies]`), and the
//! tripwire for an upgrade that changes either is
//! `tests/attacks.rs::a_stream_without_flow_control_window_is_reset_after_send_timeout`. With
//! the service called after the task is spawned, the task would find no clock in `NEXT` and
//! go untimed; with the body polled only once window is granted, a stream given none would
//! never have a chunk unsent. Either way that test's zero-window stream is never reset. The HTTP/2 flood tests
//! (`tests/h2_floods.rs`) pin down the rest of what the listener takes from hyper and h2.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Where a stream's response body stands, as hyper pulls it.
///
/// One counter, written by the body only: odd while a chunk it returned has not been followed
/// by the next poll (hyper holds the chunk, unsent), even otherwise.
#[derive(Debug, Default)]
pub struct SendClock {
    seq: AtomicU32,
}

impl SendClock {
    /// The body is polled: whatever it returned before has been sent.
    #[inline]
    pub fn polled(&self) {
        let seq = self.seq.load(Ordering::Relaxed);
        if seq & 1 == 1 {
            self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        }
    }

    /// The body returned a chunk: it is unsent until the next poll.
    #[inline]
    pub fn handed(&self) {
        // hyper polls again before it takes another chunk: `seq` is even here, and odd after.
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq | 1, Ordering::Relaxed);
    }

    fn unsent(&self) -> Option<u32> {
        let seq = self.seq.load(Ordering::Relaxed);
        (seq & 1 == 1).then_some(seq)
    }
}

thread_local! {
    /// The clock of the stream whose service was called last on this thread, with its
    /// `send_timeout`, until the executor takes it for that stream's task.
    static NEXT: Cell<Option<(Arc<SendClock>, Duration)>> = const { Cell::new(None) };
}

/// A new HTTP/2 stream's clock, to be timed by the task hyper spawns for it next.
pub fn clock_for_next_stream(send_timeout: Duration) -> Arc<SendClock> {
    let clock = Arc::new(SendClock::default());
    NEXT.with(|next| next.set(Some((Arc::clone(&clock), send_timeout))));
    clock
}

/// The executor of the main listener's connections: spawns on the worker's runtime, and
/// times a stream's task with its [`SendClock`].
#[derive(Debug, Clone, Copy, Default)]
pub struct EdgeExecutor;

impl<F> hyper::rt::Executor<F> for EdgeExecutor
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, fut: F) {
        match NEXT.with(Cell::take) {
            Some((clock, send)) => {
                tokio::spawn(Watched {
                    fut,
                    clock,
                    send,
                    armed: None,
                    timer: None,
                });
            }
            None => {
                tokio::spawn(fut);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// A stream's task, ended when a chunk of its response stays unsent for `send`.
    struct Watched<F> {
        #[pin]
        fut: F,
        clock: Arc<SendClock>,
        send: Duration,
        // The unsent chunk the timer is set for.
        armed: Option<u32>,
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<F: Future> Future for Watched<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.project();
        if let Poll::Ready(out) = me.fut.poll(cx) {
            return Poll::Ready(Some(out));
        }
        let Some(seq) = me.clock.unsent() else {
            *me.armed = None;
            return Poll::Pending;
        };
        if *me.armed != Some(seq) {
            *me.armed = Some(seq);
            let deadline = Instant::now() + *me.send;
            match me.timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => *me.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let fired = me
            .timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready());
        if fired {
            super::conn::timed_out("stream_send");
            // Dropping the task drops the stream's handle: h2 resets it.
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}
