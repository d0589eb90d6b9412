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
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};

use super::stall::SendClock;

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

/// Where the connection's requests stand, shared by the socket wrapper, the service and the
/// connection's task.
#[derive(Debug)]
pub struct Exchange {
    /// Requests in flight and done, and tunnels held: the connection is busy while this
    /// differs from `ended`.
    started: AtomicU32,
    /// Requests whose head was complete (the service was called).
    requests: AtomicU32,
    /// Requests cancelled by the client before their response: their handler was dropped
    /// (an HTTP/2 stream reset, or the connection gone).
    cancelled: AtomicU32,
    /// After this many requests the connection is closed gracefully.
    max_requests: u32,
    /// Set once when the connection is to close gracefully; [`Exchange::drained`] wakes.
    draining: AtomicBool,
    drain: Notify,
    /// Requests whose response body has been dropped (sent, or abandoned).
    ended: AtomicU32,
    /// When the last request ended, in nanoseconds since `origin`: the keep-alive clock
    /// starts there.
    ended_at: AtomicU64,
    origin: Instant,
    /// The connection was upgraded (a `101` was sent): it is a tunnel now, whose idle limit
    /// the tunnel keeps (`sluice_http::tunnel`), so the read clocks stop.
    tunnel: AtomicBool,
    /// HTTP/2: bytes read while idle are not the start of a request head.
    multiplexed: AtomicBool,
    /// Bytes of a request head (or of a TLS handshake, or an HTTP/2 preface) have been read
    /// and the head is not complete yet: the connection is not idle.
    mid_head: AtomicBool,
}

impl Default for Exchange {
    fn default() -> Self {
        Exchange::new(u32::MAX)
    }
}

/// A connection is closed gracefully once it has had at least this many cancelled requests
/// and they are more than half of its requests: a client that opens streams only to reset
/// them (Rapid Reset, however paced) makes the gateway work for nothing.
const CANCELLED_AT_LEAST: u32 = 64;

impl Exchange {
    /// A connection that may send `max_requests` requests.
    pub fn new(max_requests: u32) -> Exchange {
        Exchange {
            started: AtomicU32::new(0),
            requests: AtomicU32::new(0),
            cancelled: AtomicU32::new(0),
            max_requests,
            draining: AtomicBool::new(false),
            drain: Notify::new(),
            ended: AtomicU32::new(0),
            ended_at: AtomicU64::new(0),
            origin: Instant::now(),
            tunnel: AtomicBool::new(false),
            multiplexed: AtomicBool::new(false),
            mid_head: AtomicBool::new(false),
        }
    }

    /// A request's head is complete: the connection is busy until the returned [`Ongoing`]
    /// is dropped (with the response body, or with the handler if no response comes). The
    /// request that spends `max_requests` starts the connection's graceful close.
    #[must_use = "the request is over when the guard is dropped"]
    pub fn start(self: &Arc<Self>) -> Ongoing {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.mid_head.store(false, Ordering::Relaxed);
        let n = self
            .requests
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_add(1);
        if n == self.max_requests {
            self.close_gracefully("max_requests");
        }
        Ongoing {
            exchange: Arc::clone(self),
            answered: false,
        }
    }

    /// The connection stays busy until the returned guard is dropped (a tunnel that may open
    /// on an HTTP/2 stream), without counting a request.
    #[must_use = "the connection is busy until the guard is dropped"]
    pub fn hold(self: &Arc<Self>) -> Ongoing {
        self.started.fetch_add(1, Ordering::Relaxed);
        Ongoing {
            exchange: Arc::clone(self),
            answered: true,
        }
    }

    /// Asks the connection's task to close the connection gracefully (HTTP/1.1: after the
    /// response in flight; HTTP/2: `GOAWAY`, then the streams open finish), once.
    fn close_gracefully(&self, reason: &'static str) {
        if !self.draining.swap(true, Ordering::Relaxed) {
            metrics::counter!("sluice_connections_closed_early_total", "reason" => reason)
                .increment(1);
            self.drain.notify_one();
        }
    }

    /// When the connection went idle, if it may be reclaimed for a new one: no request in
    /// flight or under way (a head begun), no tunnel, not closing already.
    pub(crate) fn idle_since_if_reclaimable(&self) -> Option<Instant> {
        let idle = !self.busy()
            && !self.mid_head.load(Ordering::Relaxed)
            && !self.tunnel.load(Ordering::Relaxed)
            && !self.draining.load(Ordering::Relaxed);
        idle.then(|| self.idle_since())
    }

    /// Asks the idle connection to close gracefully, giving its place to a new one.
    pub(crate) fn reclaim(&self) {
        self.close_gracefully("reclaimed");
    }

    /// Whether the connection is to close gracefully (after the response in flight).
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Resolves when the connection is to close gracefully.
    pub async fn drained(&self) {
        self.drain.notified().await;
    }

    /// A request ended without a response: the client cancelled it.
    fn cancelled(&self) {
        let cancelled = self.cancelled.fetch_add(1, Ordering::Relaxed) + 1;
        if cancelled >= CANCELLED_AT_LEAST
            && u64::from(cancelled) * 2 > u64::from(self.requests.load(Ordering::Relaxed))
        {
            self.close_gracefully("cancelled");
        }
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

    fn end(&self) {
        let since = Instant::now().saturating_duration_since(self.origin);
        let nanos = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
        self.ended_at.store(nanos, Ordering::Relaxed);
        // Release: whoever sees the count sees the time.
        self.ended.fetch_add(1, Ordering::Release);
    }

    fn busy(&self) -> bool {
        self.started.load(Ordering::Relaxed) != self.ended.load(Ordering::Acquire)
    }

    /// When the connection went idle: the end of its last request.
    fn idle_since(&self) -> Instant {
        self.origin + Duration::from_nanos(self.ended_at.load(Ordering::Relaxed))
    }
}

/// What the read clock is timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A request head (from the accept, or from its first byte), entered when `ended`
    /// requests had ended.
    Head(u32),
    /// Between requests, since the response that ended as `ended` was counted.
    Idle(u32),
    /// A request in flight: the body has its own timeout, the response is being made.
    Busy,
}

/// The client socket, with the connection's timeouts.
///
/// No task wake-up is spent per request. While a request is in flight, a read that waits
/// sets the read timer to `keep_alive_timeout` from then (re-set whenever it fires while
/// the request lasts): when the request ends, that deadline is never later than the
/// keep-alive deadline, so the timer wakes the connection in time, and the read then
/// waits on to the exact deadline, `keep_alive_timeout` after the request's end.
pub struct EdgeIo<S = TcpStream> {
    stream: S,
    exchange: Arc<Exchange>,
    timeouts: Timeouts,
    phase: Phase,
    /// The read timer is set for the current phase.
    read_armed: bool,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_armed: bool,
    write_timer: Option<Pin<Box<Sleep>>>,
}

impl<S> EdgeIo<S> {
    /// Wraps `stream`; `exchange` is shared with the connection's service.
    pub fn new(stream: S, exchange: Arc<Exchange>, timeouts: Timeouts) -> EdgeIo<S> {
        EdgeIo {
            stream,
            exchange,
            timeouts,
            phase: Phase::Head(0),
            read_armed: false,
            read_timer: None,
            write_armed: false,
            write_timer: None,
        }
    }

    /// The phase now, from what the service reported.
    fn current_phase(&mut self) -> Phase {
        if self.exchange.busy() {
            if self.phase != Phase::Busy {
                self.phase = Phase::Busy;
                self.read_armed = false;
            }
        } else {
            let ended = self.exchange.ended.load(Ordering::Acquire);
            match self.phase {
                // A timer set while the request was in flight is due no later than the
                // keep-alive deadline: it stays, and the read waits on when it fires.
                Phase::Busy => self.phase = Phase::Idle(ended),
                // A request began and ended between two reads: idle again, from its end.
                Phase::Idle(seen) | Phase::Head(seen) if seen != ended => {
                    self.phase = Phase::Idle(ended);
                    self.read_armed = false;
                }
                Phase::Idle(_) | Phase::Head(_) => {}
            }
        }
        self.phase
    }

    fn set_read_timer(&mut self, deadline: Instant) {
        match &mut self.read_timer {
            Some(timer) => timer.as_mut().reset(deadline),
            None => self.read_timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
    }

    /// A read must wait: whether its deadline has passed (setting the timer for the phase
    /// the first time).
    fn read_expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.exchange.tunnel.load(Ordering::Relaxed) {
            return false;
        }
        let phase = self.current_phase();
        if !self.read_armed {
            self.read_armed = true;
            let deadline = match phase {
                Phase::Head(_) => Instant::now() + self.timeouts.header,
                Phase::Idle(_) => self.exchange.idle_since() + self.timeouts.keep_alive,
                Phase::Busy => Instant::now() + self.timeouts.keep_alive,
            };
            self.set_read_timer(deadline);
        }
        loop {
            let fired = self
                .read_timer
                .as_mut()
                .is_some_and(|t| t.as_mut().poll(cx).is_ready());
            if !fired {
                return false;
            }
            match self.current_phase() {
                Phase::Head(_) => return true,
                Phase::Busy => {
                    // A long request: look again a keep-alive later.
                    let next = Instant::now() + self.timeouts.keep_alive;
                    self.set_read_timer(next);
                }
                Phase::Idle(_) => {
                    let deadline = self.exchange.idle_since() + self.timeouts.keep_alive;
                    if Instant::now() >= deadline {
                        return true;
                    }
                    self.set_read_timer(deadline);
                }
            }
        }
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

/// Counts a connection closed by one of its timeouts (`header_read`, `keep_alive`, `send`),
/// or an HTTP/2 stream reset by its send stall clock (`stream_send`).
pub(crate) fn timed_out(which: &'static str) {
    metrics::counter!("sluice_connection_timeouts_total", "timeout" => which).increment(1);
}

/// Gives the connection metrics their help text.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sluice_connections_closed_early_total",
        metrics::Unit::Count,
        "Client connections of the main listener closed gracefully before the client was done, by `reason`: `max_requests` (server.max_requests_per_connection requests sent), `cancelled` (more than half of at least 64 requests cancelled by the client before their response: Rapid Reset) or `reclaimed` (idle, its place given to a new connection while server.max_connections were open)."
    );
    metrics::describe_counter!(
        "sluice_connection_timeouts_total",
        metrics::Unit::Count,
        "Client connections of the main listener closed by a timeout, by `timeout`: `header_read` (a request head too slow), `keep_alive` (idle between requests), `send` (the client did not read its response for send_timeout), `stream_send` (an HTTP/2 stream reset: the client granted no flow-control window for its response for send_timeout)."
    );
}

impl<S: AsyncRead + Unpin> AsyncRead for EdgeIo<S> {
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
                    let multiplexed = this.exchange.multiplexed.load(Ordering::Relaxed);
                    if !multiplexed && !this.exchange.busy() {
                        this.exchange.mid_head.store(true, Ordering::Relaxed);
                    }
                    if let Phase::Idle(ended) = this.current_phase() {
                        // The first bytes of the next request: its head is timed from here.
                        // HTTP/2 reads frames between requests too: the idle clock runs on
                        // until a stream opens (the service marks the connection busy).
                        if !multiplexed {
                            this.phase = Phase::Head(ended);
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

impl<S: AsyncWrite + Unpin> AsyncWrite for EdgeIo<S> {
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

/// One request of a connection, from its head to the end of its response: dropping it ends
/// the request, whatever ended it. It goes into the response body ([`Ending`]); a request
/// that never produces one (the client reset its HTTP/2 stream, and the handler was dropped)
/// ends with the handler that held it. Counting starts and ends instead would leave a
/// cancelled request started for ever, and the connection busy: never idle, never closed.
#[derive(Debug)]
pub struct Ongoing {
    exchange: Arc<Exchange>,
    /// A response was made for it (or it is no request): its end is no cancellation.
    answered: bool,
}

impl Ongoing {
    /// A response was written for the request: its end is no cancellation.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// The connection switches protocols after this request's response: no more request
    /// heads ([`Exchange::tunnel`]).
    pub fn tunnel(&self) {
        self.exchange.tunnel();
    }
}

impl Drop for Ongoing {
    fn drop(&mut self) {
        if !self.answered {
            self.exchange.cancelled();
        }
        self.exchange.end();
    }
}

/// A response body that carries its request's [`Ongoing`]: when it is dropped (sent, or
/// abandoned), the request is over, and the connection idle until the next one. On an
/// HTTP/2 stream it also tells the stream's [`SendClock`] when a chunk it returned is sent.
pub struct Ending<B> {
    body: B,
    _request: Ongoing,
    clock: Option<Arc<SendClock>>,
}

impl<B> Ending<B> {
    /// `body`, ending `request` when dropped; `clock` is the stream's send stall clock.
    pub fn new(body: B, mut request: Ongoing, clock: Option<Arc<SendClock>>) -> Ending<B> {
        request.answered = true;
        Ending {
            body,
            _request: request,
            clock,
        }
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
        let this = self.get_mut();
        let Some(clock) = &this.clock else {
            return Pin::new(&mut this.body).poll_frame(cx);
        };
        clock.polled();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            clock.handed();
        }
        polled
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

#[cfg(test)]
mod clock_tests {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        header: Duration::from_secs(1),
        keep_alive: Duration::from_secs(3),
        send: Duration::from_secs(60),
    };

    /// A connection served as the gateway serves its own: the service marks each request's
    /// start, its response body its end. Each response takes `think` to begin.
    fn serve(think: Duration) -> DuplexStream {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let exchange = Arc::new(Exchange::default());
        let io = EdgeIo::new(server, Arc::clone(&exchange), TIMEOUTS);
        let service = service_fn(move |_req| {
            let request = exchange.start();
            async move {
                tokio::time::sleep(think).await;
                let body = Ending::new(Full::new(Bytes::from_static(b"ok")), request, None);
                Ok::<_, Infallible>(hyper::Response::new(body))
            }
        });
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .keep_alive(true)
                .serve_connection(TokioIo::new(io), service)
                .await;
        });
        client
    }

    /// Reads one whole response (ending in the 2-byte body) or the close.
    async fn response(client: &mut DuplexStream) -> String {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.ends_with(b"ok") {
            let n = client.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&got).into_owned()
    }

    /// How long until the server closes the connection, from now.
    async fn closed_after(client: &mut DuplexStream) -> Duration {
        let from = Instant::now();
        let mut buf = [0u8; 64];
        assert_eq!(
            client.read(&mut buf).await.unwrap(),
            0,
            "a close, not bytes"
        );
        from.elapsed()
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";

    fn near(got: Duration, want: Duration) -> bool {
        got.abs_diff(want) <= Duration::from_millis(5)
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_clock_starts_when_a_response_ends() {
        let mut client = serve(Duration::ZERO);
        for round in 0..3 {
            // Idle for less than the keep-alive (but more than the header timeout) between
            // requests; the first comes at once (its head is timed from the accept).
            if round > 0 {
                tokio::time::sleep(Duration::from_millis(2500)).await;
            }
            client.write_all(GET).await.unwrap();
            assert!(response(&mut client).await.starts_with("HTTP/1.1 200"));
        }
        let idle = closed_after(&mut client).await;
        assert!(
            near(idle, TIMEOUTS.keep_alive),
            "closed after {idle:?} idle"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_longer_than_the_keep_alive_keeps_its_connection() {
        let mut client = serve(Duration::from_secs(10));
        client.write_all(GET).await.unwrap();
        let from = Instant::now();
        let answer = response(&mut client).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(near(from.elapsed(), Duration::from_secs(10)));
        let idle = closed_after(&mut client).await;
        assert!(
            near(idle, TIMEOUTS.keep_alive),
            "closed after {idle:?} idle"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_is_timed_from_its_first_byte_and_the_first_from_the_accept() {
        let mut client = serve(Duration::ZERO);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let slow = closed_after(&mut client).await;
        assert!(near(slow, TIMEOUTS.header), "closed after {slow:?}");

        let mut client = serve(Duration::ZERO);
        client.write_all(GET).await.unwrap();
        assert!(response(&mut client).await.starts_with("HTTP/1.1 200"));
        // Idle for 2 s (within the keep-alive), then a head that stalls: the header
        // timeout runs from its first byte.
        tokio::time::sleep(Duration::from_secs(2)).await;
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let slow = closed_after(&mut client).await;
        assert!(near(slow, TIMEOUTS.header), "closed after {slow:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn pipelined_requests_are_each_timed_from_their_own_end() {
        let mut client = serve(Duration::from_secs(2));
        let two = [GET, GET].concat();
        client.write_all(&two).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while got.windows(2).filter(|w| w == b"ok").count() < 2 {
            let n = client.read(&mut buf).await.unwrap();
            assert_ne!(
                n,
                0,
                "closed before both answers: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        let idle = closed_after(&mut client).await;
        assert!(
            near(idle, TIMEOUTS.keep_alive),
            "closed after {idle:?} idle"
        );
    }
}
