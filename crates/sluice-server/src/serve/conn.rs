//! One client connection of the main listener: the socket wrapped so that it enforces the
//! connection's timeouts, which hyper's own timer cannot tell apart.
//!
//! - `keep_alive_timeout`: between requests (after a response, before the first byte of the
//!   next request), the longest the connection may stay idle.
//! - `header_read_timeout`: from the first byte of a request head (or from the accept, for
//!   the first request) until the head is complete.
//! - `send_timeout`: the longest a write to the client may stall (the client does not read);
//!   then the connection is closed, which drops the response and with it the route's
//!   concurrency permits and the upstream connection.
//!
//! hyper's `header_read_timeout` timer also runs while a keep-alive connection waits for its
//! next request, so it would cap the idle time at the header timeout; it is therefore not
//! used, and [`EdgeIo`] keeps both clocks. The service tells it where a request starts (its
//! head is complete) and ends (its response body is dropped) through [`Exchange`].
//!
//! A connection upgraded to a tunnel (WebSocket) has no read clock: the tunnel closes after
//! `keep_alive_timeout` without a byte either way instead. `send_timeout` still applies to
//! its writes.
//!
//! Each timer is allocated the first time it is needed on the connection and reset after;
//! a write timer exists only on a connection whose writes have stalled.
//!
//! On an HTTP/2 connection (TLS or not, the wrapper sits under it) the same clocks run: the
//! first request (and the TLS handshake before it) within `header_read_timeout` of the
//! accept; while no stream is open, the connection is idle, and frames that open no stream
//! (pings, window updates, settings) do not make it busy nor restart a head clock: after
//! `keep_alive_timeout` with no request it is closed.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The timeouts of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From the first byte of a request head to its end.
    pub header: Duration,
    /// Idle between requests.
    pub keep_alive: Duration,
    /// The longest stalled write.
    pub send: Duration,
}

/// Where the connection's requests stand, shared by the socket wrapper and the service.
#[derive(Debug, Default)]
pub struct Exchange {
    /// Requests whose head was complete (the service was called).
    started: AtomicU32,
    /// Requests whose response body has been dropped (sent, or abandoned).
    ended: AtomicU32,
    /// The connection's task, while a read waits during a request: woken when the request
    /// ends, so that the keep-alive clock starts then (hyper may not read again by itself).
    reader: AtomicWaker,
    /// The connection was upgraded (a `101` was sent): it is a tunnel now, whose idle limit
    /// the tunnel keeps (`sluice_http::tunnel`), so the read clocks stop.
    tunnel: AtomicBool,
    /// HTTP/2: bytes read while idle are not the start of a request head.
    multiplexed: AtomicBool,
}

impl Exchange {
    /// A request's head is complete: the connection is busy until its response ends.
    pub fn start(self: &Arc<Self>) {
        self.started.fetch_add(1, Ordering::Relaxed);
    }

    /// The connection switches protocols after this response: no more request heads.
    pub fn tunnel(&self) {
        self.tunnel.store(true, Ordering::Relaxed);
    }

    /// The connection speaks HTTP/2: between requests, the frames it reads (pings, window
    /// updates) keep it idle rather than starting a request head.
    pub fn multiplexed(&self) {
        self.multiplexed.store(true, Ordering::Relaxed);
    }

    fn busy(&self) -> bool {
        self.started.load(Ordering::Relaxed) != self.ended.load(Ordering::Relaxed)
    }
}

/// What the read clock is timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A request head (from the accept, or from its first byte).
    Head,
    /// Between requests, since the response that ended as `ended` was counted.
    Idle(u32),
    /// A request in flight: the body has its own timeout, the response is being made.
    Busy,
}

/// The client socket, with the connection's timeouts.
pub struct EdgeIo {
    stream: TcpStream,
    exchange: Arc<Exchange>,
    timeouts: Timeouts,
    phase: Phase,
    /// The read timer is set for the current phase.
    read_armed: bool,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_armed: bool,
    write_timer: Option<Pin<Box<Sleep>>>,
}

impl EdgeIo {
    /// Wraps `stream`; `exchange` is shared with the connection's service.
    pub fn new(stream: TcpStream, exchange: Arc<Exchange>, timeouts: Timeouts) -> EdgeIo {
        EdgeIo {
            stream,
            exchange,
            timeouts,
            phase: Phase::Head,
            read_armed: false,
            read_timer: None,
            write_armed: false,
            write_timer: None,
        }
    }

    /// The phase now, from what the service reported.
    fn current_phase(&mut self) -> Phase {
        if self.exchange.busy() {
            self.phase = Phase::Busy;
            self.read_armed = false;
        } else if self.phase == Phase::Busy {
            self.phase = Phase::Idle(self.exchange.ended.load(Ordering::Relaxed));
            self.read_armed = false;
        }
        self.phase
    }

    /// A read must wait: whether its deadline has passed (setting the timer for the phase
    /// the first time).
    fn read_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.exchange.tunnel.load(Ordering::Relaxed) {
            return false;
        }
        let limit = match self.current_phase() {
            Phase::Busy => {
                self.exchange.reader.register(cx.waker());
                return false;
            }
            Phase::Head => self.timeouts.header,
            Phase::Idle(_) => self.timeouts.keep_alive,
        };
        if !self.read_armed {
            self.read_armed = true;
            let deadline = Instant::now() + limit;
            match &mut self.read_timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.read_timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.read_timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
    }

    /// A write must wait: whether it has stalled for `send_timeout`.
    fn write_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.write_armed {
            self.write_armed = true;
            let deadline = Instant::now() + self.timeouts.send;
            match &mut self.write_timer {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.write_timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.write_timer
            .as_mut()
            .is_some_and(|t| t.as_mut().poll(cx).is_ready())
    }

    fn wrote<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Pending => {
                if self.write_expired(cx) {
                    timed_out("send");
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "send_timeout: the client did not read",
                    )))
                } else {
                    Poll::Pending
                }
            }
            ready => {
                self.write_armed = false;
                ready
            }
        }
    }
}

/// Counts a connection closed by one of its timeouts (`header_read`, `keep_alive`, `send`).
fn timed_out(which: &'static str) {
    metrics::counter!("sluice_connection_timeouts_total", "timeout" => which).increment(1);
}

/// Gives the connection timeout metric its help text.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sluice_connection_timeouts_total",
        metrics::Unit::Count,
        "Client connections of the main listener closed by a timeout, by `timeout`: `header_read` (a request head too slow), `keep_alive` (idle between requests), `send` (the client did not read its response for send_timeout)."
    );
}

impl AsyncRead for EdgeIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Pending => {
                if this.read_expired(cx) {
                    let which = match this.phase {
                        Phase::Idle(_) => "keep_alive",
                        _ => "header_read",
                    };
                    timed_out(which);
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, which)));
                }
                Poll::Pending
            }
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    if let Phase::Idle(_) = this.current_phase() {
                        // The first bytes of the next request: its head is timed from here.
                        // HTTP/2 reads frames between requests too: the idle clock runs on
                        // until a stream opens (the service marks the connection busy).
                        if !this.exchange.multiplexed.load(Ordering::Relaxed) {
                            this.phase = Phase::Head;
                            this.read_armed = false;
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            ready => ready,
        }
    }
}

impl AsyncWrite for EdgeIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.wrote(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.wrote(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.wrote(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.wrote(cx, polled)
    }
}

/// A response body that tells the connection's [`Exchange`] when it is dropped: the
/// request is over, and the connection idle until the next one.
pub struct Ending<B> {
    body: B,
    exchange: Arc<Exchange>,
}

impl<B> Drop for Ending<B> {
    fn drop(&mut self) {
        self.exchange.ended.fetch_add(1, Ordering::Relaxed);
        self.exchange.reader.wake();
    }
}

impl<B> Ending<B> {
    /// `body`, ending the current request of `exchange` when dropped.
    pub fn new(body: B, exchange: Arc<Exchange>) -> Ending<B> {
        Ending { body, exchange }
    }
}

impl<B: hyper::body::Body<Data = Bytes> + Unpin> hyper::body::Body for Ending<B> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A connection that must speak HTTP/1.1 only (plain text with `h2c = false`, TLS without
/// ALPN `h2`), served by hyper-util's upgrade-capable builder, which looks for the HTTP/2
/// preface whatever the builder was told: a connection that opens with it (`PRI `, never the
/// start of an HTTP/1.1 request) fails its first read instead.
pub struct Http1Only<T> {
    io: T,
    /// How many bytes of `PRI ` the connection's first bytes have matched so far; `None`
    /// once they cannot be the preface.
    matched: Option<u8>,
}

impl<T> Http1Only<T> {
    /// Wraps `io`.
    pub fn new(io: T) -> Http1Only<T> {
        Http1Only {
            io,
            matched: Some(0),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Http1Only<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        const PREFACE: &[u8] = b"PRI ";
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if let (Some(matched), Poll::Ready(Ok(()))) = (this.matched, &polled) {
            let read = &buf.filled()[before..];
            let at = usize::from(matched);
            let n = read.len().min(PREFACE.len() - at);
            if read[..n] != PREFACE[at..at + n] {
                this.matched = None;
            } else if at + n == PREFACE.len() {
                // An error reports no bytes read.
                buf.set_filled(before);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "an HTTP/2 preface on a connection that speaks HTTP/1.1 only",
                )));
            } else {
                // Fewer than 4 bytes so far, all of the preface: `at + n` is below 4.
                this.matched = Some(matched + n as u8);
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Http1Only<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn first_read(chunks: &[&[u8]]) -> io::Result<Vec<u8>> {
        let (mut tx, rx) = tokio::io::duplex(1024);
        for c in chunks {
            tx.write_all(c).await.unwrap();
            tx.flush().await.unwrap();
        }
        drop(tx);
        let mut io = Http1Only::new(rx);
        let mut all = Vec::new();
        io.read_to_end(&mut all).await?;
        Ok(all)
    }

    #[tokio::test]
    async fn an_http2_preface_fails_and_http1_passes() {
        let e = first_read(&[b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"]).await;
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(
            first_read(&[b"GET / HTTP/1.1\r\n\r\n"]).await.unwrap(),
            b"GET / HTTP/1.1\r\n\r\n"
        );
        // A request that merely starts like it.
        assert_eq!(first_read(&[b"PRIX"]).await.unwrap(), b"PRIX");
        // The preface split over reads.
        let e = first_read(&[b"P", b"RI", b" * HTTP/2.0"]).await;
        assert_eq!(e.unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
