//! Upgraded connections (WebSocket over HTTP/1.1, or over an HTTP/2 stream opened with an
//! extended `CONNECT`, RFC 8441): once the route's policies admitted the
//! upgrade request and the upstream answered `101 Switching Protocols`, the bytes of both
//! sides are copied both ways ([`tokio::io::copy_bidirectional`]) on a task of their own,
//! which holds the request's concurrency permits for as long as the tunnel is open (so a
//! route's `concurrency` bounds its open sockets) and counts the tunnel in
//! `sluice_tunnels_open`.
//!
//! A tunnel ends when either side closes (the end is passed on to the other, which closes
//! in turn) or fails, or after `idle` without a byte either way.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use sluice::PoolPermit;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Something the server wants kept while a tunnel it handed over is open (such as the mark
/// that keeps an HTTP/2 connection busy while one of its streams is a tunnel): put in the
/// request's extensions, it is dropped when the tunnel closes, or with the request when no
/// tunnel opens (shared by its clones, it goes when the last one does).
#[derive(Clone)]
pub struct Hold {
    _value: Arc<dyn Send + Sync>,
}

impl Hold {
    /// Holds `value` until the tunnel closes.
    pub fn new(value: impl Send + Sync + 'static) -> Hold {
        Hold {
            _value: Arc::new(value),
        }
    }
}

impl std::fmt::Debug for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hold")
    }
}

/// Runs the tunnel between the client's upgrade and the upstream's until either side closes
/// or `idle` passes without a byte either way (`None`: no idle limit). `open` counts it
/// while it runs; `permits` (and `hold`) are given back when it ends.
///
/// # Cancel safety
///
/// Dropping the future closes both sides.
pub async fn run(
    client: OnUpgrade,
    upstream: OnUpgrade,
    permits: Vec<PoolPermit>,
    idle: Option<Duration>,
    open: metrics::Gauge,
    hold: Option<Hold>,
) {
    let _permits = permits;
    let _hold = hold;
    let _open = Open::new(open);
    let (client, upstream) = match tokio::try_join!(client, upstream) {
        Ok(both) => both,
        Err(e) => {
            tracing::debug!(error = %e, "upgrade failed");
            return;
        }
    };
    let started = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut client = Active {
        io: TokioIo::new(client),
        started,
        last: Arc::clone(&last),
    };
    let mut upstream = TokioIo::new(upstream);
    let copy = tokio::io::copy_bidirectional(&mut client, &mut upstream);
    let Some(idle) = idle else {
        if let Err(e) = copy.await {
            tracing::debug!(error = %e, "tunnel ended with an error");
        }
        return;
    };
    let watch = async {
        loop {
            let deadline = started + Duration::from_millis(last.load(Ordering::Relaxed)) + idle;
            if deadline <= Instant::now() {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    };
    tokio::select! {
        copied = copy => {
            if let Err(e) = copied {
                tracing::debug!(error = %e, "tunnel ended with an error");
            }
        }
        () = watch => tracing::debug!(?idle, "tunnel closed: idle"),
    }
}

/// One open tunnel in the gauge.
struct Open(metrics::Gauge);

impl Open {
    fn new(gauge: metrics::Gauge) -> Open {
        gauge.increment(1.0);
        Open(gauge)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

pin_project_lite::pin_project! {
    /// The client's side of a tunnel, noting when bytes last moved either way (in ms since
    /// `started`): every byte of the tunnel passes through it, read or written.
    struct Active<T> {
        #[pin]
        io: T,
        started: Instant,
        last: Arc<AtomicU64>,
    }
}

impl<T> Active<T> {
    fn moved(started: Instant, last: &AtomicU64) {
        let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Memory ordering: a timestamp read by the same task; no other data depends on it.
        last.store(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead> AsyncRead for Active<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.io.poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            Self::moved(*this.started, this.last);
        }
        polled
    }
}

impl<T: AsyncWrite> AsyncWrite for Active<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.project();
        let polled = this.io.poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            Self::moved(*this.started, this.last);
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().io.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test(start_paused = true)]
    async fn activity_is_noted_on_reads_and_writes() {
        let (a, mut b) = tokio::io::duplex(64);
        let started = Instant::now();
        let last = Arc::new(AtomicU64::new(0));
        let mut active = Active {
            io: a,
            started,
            last: Arc::clone(&last),
        };
        tokio::time::advance(Duration::from_millis(1500)).await;
        active.write_all(b"hi").await.unwrap();
        assert_eq!(last.load(Ordering::Relaxed), 1500);
        tokio::time::advance(Duration::from_millis(500)).await;
        b.write_all(b"yo").await.unwrap();
        let mut buf = [0; 2];
        active.read_exact(&mut buf).await.unwrap();
        assert_eq!(last.load(Ordering::Relaxed), 2000);
    }
}
