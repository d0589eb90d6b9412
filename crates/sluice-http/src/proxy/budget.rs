//! The upstream connection budget: how many upstream sockets the process may hold, and how
//! many requests of one client connection may hold one at a time.
//!
//! Descriptors are the process's: a flood of HTTP/2 streams, each forwarded to an HTTP/1.1
//! upstream on a socket of its own, would otherwise open sockets until `accept` fails with
//! "Too many open files" and every client suffers. With a budget the gateway answers `503`
//! with `Retry-After` first, naming the setting.
//!
//! - **Total** ([`set_upstream_budget`]): every upstream socket (pooled, in use, tunnels,
//!   HTTP/2 upstream connections) holds one [`Socket`] until it closes. When none is left, an
//!   idle pooled connection of the worker asking is closed to make room; with none to close,
//!   the request is refused.
//! - **Per client connection** ([`UpstreamShare`]): the requests of one multiplexed client
//!   connection (HTTP/2) wait in turn for one of its shares before they take an upstream
//!   socket, so that one client cannot take the whole budget; a request that waits longer
//!   than the connect timeout is refused.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::proxy::ProxyError;

/// Upstream sockets open now, in the whole process.
static OPEN: AtomicUsize = AtomicUsize::new(0);
/// The most upstream sockets the process may hold.
static MAX: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Sets the most upstream sockets the process may hold at once (no limit until it is
/// set). Sockets open beyond a lowered budget stay open; new ones wait for room.
pub fn set_upstream_budget(max: usize) {
    MAX.store(max, Ordering::Relaxed);
}

/// Upstream sockets open now.
pub fn upstream_open() -> usize {
    OPEN.load(Ordering::Relaxed)
}

/// One upstream socket of the budget, given back when dropped.
#[derive(Debug)]
pub(crate) struct Socket(());

impl Socket {
    /// A socket of the budget, if one is left.
    pub(crate) fn take() -> Option<Socket> {
        let max = MAX.load(Ordering::Relaxed);
        OPEN.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |open| {
            (open < max).then_some(open + 1)
        })
        .ok()
        .map(|_| Socket(()))
    }

    /// A socket in place of one being closed (an idle pooled connection just dropped, whose
    /// task gives its own back as it ends): over the budget for that moment.
    pub(crate) fn instead_of_closing() -> Socket {
        OPEN.fetch_add(1, Ordering::Relaxed);
        Socket(())
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        OPEN.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An upstream socket with its place in the budget, given back when the socket closes
/// (whoever owns it then: a pooled connection's task, a tunnel).
#[derive(Debug)]
pub(crate) struct Budgeted<S> {
    stream: S,
    _socket: Socket,
}

impl<S> Budgeted<S> {
    pub(crate) fn new(stream: S, socket: Socket) -> Budgeted<S> {
        Budgeted {
            stream,
            _socket: socket,
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.stream
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Budgeted<S> {
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Budgeted<S> {
    #[inline]
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    #[inline]
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// The shares of one client connection: at most this many of its requests hold an upstream
/// socket at once. Put it in the request's extensions; clones share the count.
#[derive(Debug, Clone)]
pub struct UpstreamShare {
    shares: Arc<Semaphore>,
    size: usize,
}

impl UpstreamShare {
    /// `size` shares (at least one).
    pub fn new(size: usize) -> UpstreamShare {
        let size = size.clamp(1, Semaphore::MAX_PERMITS);
        UpstreamShare {
            shares: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// One share, waiting in turn for at most `wait`.
    pub(crate) async fn take(&self, wait: Duration) -> Result<OwnedSemaphorePermit, ProxyError> {
        if let Ok(share) = Arc::clone(&self.shares).try_acquire_owned() {
            return Ok(share);
        }
        match tokio::time::timeout(wait, Arc::clone(&self.shares).acquire_owned()).await {
            Ok(Ok(share)) => Ok(share),
            _ => {
                refused("connection");
                Err(ProxyError::Budget(format!(
                    "this client connection already has {} requests on upstream connections (server.max_upstream_per_connection)",
                    self.size
                )))
            }
        }
    }
}

/// Counts a request refused for want of an upstream socket, by `scope`.
pub(crate) fn refused(scope: &'static str) {
    metrics::counter!("sluice_upstream_budget_refused_total", "scope" => scope).increment(1);
}

/// Gives the budget's metrics their help text.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sluice_upstream_budget_refused_total",
        metrics::Unit::Count,
        "Requests answered 503 for want of an upstream connection, by `scope`: `total` (server.max_upstream_connections sockets open) or `connection` (the client connection's server.max_upstream_per_connection in use for longer than the connect timeout)."
    );
    metrics::describe_gauge!(
        "sluice_upstream_connections_open",
        metrics::Unit::Count,
        "Upstream sockets open now (pooled, in use, tunnels), across every worker."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shares_are_taken_in_turn_and_refused_after_the_wait() {
        let share = UpstreamShare::new(2);
        let a = share.take(Duration::from_secs(1)).await.unwrap();
        let _b = share.take(Duration::from_secs(1)).await.unwrap();
        let waiting = tokio::spawn({
            let share = share.clone();
            async move { share.take(Duration::from_secs(1)).await.map(drop) }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(a);
        assert!(waiting.await.unwrap().is_ok());
        let e = share.take(Duration::from_secs(1)).await;
        let _c = e.unwrap();
        let e = share.take(Duration::from_secs(1)).await.unwrap_err();
        assert!(
            e.to_string().contains("server.max_upstream_per_connection"),
            "{e}"
        );
    }
}
