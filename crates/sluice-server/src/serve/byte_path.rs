//! The main listener's HTTP/1.1 byte path (`server.byte_path`, on by default).
//!
//! A connection starts here. Each request head is read with `sluice_http::wire`; a plain
//! HTTP/1.1 request without a body, or with a `Content-Length`, or with one
//! `Transfer-Encoding: chunked` (past [`h1::MAX_BODY`] either body is streamed; a chunked body
//! is waited for [`CHUNKS_WAIT`] here, then read on once admitted), whose route allows it ([`Gateway::takes_bytes`]) is
//! handled by [`Gateway::serve_bytes`], with the same request id, access log line and
//! connection accounting ([`Exchange`]) as a request hyper serves. The first request that is
//! anything else (a chunked body on a route reserving from the body that is not all here, another
//! transfer coding, HTTP/1.0, an upgrade, `Expect`, a head `wire` does not call plain,
//! the HTTP/2 preface, a browser path, a route to an `https://` or `h2c://` upstream, any
//! request while `[telemetry]` traces) ends the loop: hyper serves the rest
//! of the connection, reading first the bytes read here ([`Prefixed`]).
//!
//! The connection's timeouts are the socket's ([`EdgeIo`](super::conn::EdgeIo)) whichever
//! serves it. A shutdown or `max_requests_per_connection` closes the connection as hyper
//! would: at once when it is idle, after the answer in flight (which says
//! `Connection: close`) otherwise.
//!
//! [`Gateway::takes_bytes`]: sluice_http::Gateway::takes_bytes
//! [`Gateway::serve_bytes`]: sluice_http::Gateway::serve_bytes

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf as _, Bytes, BytesMut};
use sluice_http::h1::{self, Client, Finish};
use sluice_http::protocol::Protocol;
use sluice_http::proxy::Proxy;
use sluice_http::wire::{self, Framing};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::watch;

use crate::runtime::state::Shared;
use crate::serve::conn::Exchange;
use crate::serve::gateway::{access_log, identify};

/// Gives the byte path's metrics their help text.
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sluice_byte_path_requests_total",
        metrics::Unit::Count,
        "HTTP/1.1 requests of the main listener forwarded or answered on the byte path (server.byte_path)."
    );
    metrics::describe_counter!(
        "sluice_byte_path_handovers_total",
        metrics::Unit::Count,
        "Client connections the byte path handed to hyper, by `reason`: `head` (a head not read as plain: broken chunks, a chunked body not all here on a route that reserves from the body, another transfer coding, HTTP/1.0, Upgrade, Expect, the HTTP/2 preface, a malformed head), `route` (a route to an https:// or h2c:// upstream), `other` (a browser path, gRPC-Web, [telemetry] tracing)."
    );
}

/// Counts a connection handed to hyper.
fn handed_over(reason: &'static str) {
    metrics::counter!("sluice_byte_path_handovers_total", "reason" => reason).increment(1);
}

/// How a connection left the byte path.
pub(super) enum Left {
    /// It is over: closed by either side, by a timeout, or by a shutdown.
    Closed,
    /// hyper serves the rest.
    Handover {
        /// What was read from the connection and not used.
        read: BytesMut,
        /// No request was served yet: the connection is at its start, where the HTTP/2
        /// preface may open it (RFC 9113 §3.4); later, it is a request HTTP/1.1 refuses.
        fresh: bool,
    },
}

/// The client's connection and where it stands, for [`serve`].
pub(super) struct Connection<'a> {
    pub(super) peer: SocketAddr,
    pub(super) shared: &'static Shared,
    pub(super) proxy: &'static Proxy,
    pub(super) exchange: &'a Arc<Exchange>,
    pub(super) stop: &'a mut watch::Receiver<bool>,
    /// `server.max_header_bytes` when the connection was accepted.
    pub(super) max_head: usize,
}

/// Serves the connection's requests as long as they are plain ones.
pub(super) async fn serve<C>(io: &mut C, conn: Connection<'_>) -> Left
where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let Connection {
        peer,
        shared,
        proxy,
        exchange,
        stop,
        max_head,
    } = conn;
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    let mut spare = http::HeaderMap::new();
    let requests = metrics::counter!("sluice_byte_path_requests_total");
    let mut fresh = true;
    loop {
        let mut pieces: Option<Pieces> = None;
        let (head, chunked) = loop {
            if !buf.is_empty() {
                match wire::Request::parse(&buf, max_head) {
                    wire::Request::Plain(head)
                        if !head.http10
                            && match head.framing {
                                Framing::Empty => true,
                                Framing::Length(_) => true,
                                // Taken when it comes whole within `CHUNKS_WAIT` of its
                                // head (see `Pieces`).
                                Framing::Chunked => true,
                                Framing::UntilClose => false,
                            } =>
                    {
                        if head.framing != Framing::Chunked {
                            break (head, Body::Plain);
                        }
                        // Read once here, whole: a chunked body is forwarded with a length.
                        match wire::dechunk(&buf[head.len..], h1::MAX_BODY as usize) {
                            wire::Dechunked::Whole {
                                data,
                                len,
                                trailers,
                            } => {
                                let data = Bytes::from(data);
                                break (
                                    head,
                                    Body::Whole(h1::Chunked { data, trailers }, len as u64),
                                );
                            }
                            wire::Dechunked::Partial
                                if buf.len() - head.len < h1::MAX_BODY as usize =>
                            {
                                let pieces = pieces.get_or_insert_with(Pieces::start);
                                match pieces.more(io, &mut buf).await {
                                    More::Came => continue,
                                    // Read on once admitted, and streamed if it goes on.
                                    More::Waited => break (head, Body::Chunks),
                                    More::Closed => {
                                        handed_over("head");
                                        return Left::Handover { read: buf, fresh };
                                    }
                                }
                            }
                            wire::Dechunked::Partial => break (head, Body::Chunks),
                            wire::Dechunked::Broken => {
                                handed_over("head");
                                return Left::Handover { read: buf, fresh };
                            }
                        }
                    }
                    wire::Request::Partial => {}
                    _ => {
                        handed_over("head");
                        return Left::Handover { read: buf, fresh };
                    }
                }
            } else if *stop.borrow() || exchange.is_draining() {
                return Left::Closed;
            }
            buf.reserve(8 * 1024);
            let idle = buf.is_empty();
            let read = tokio::select! {
                biased;
                read = io.read_buf(&mut buf) => read,
                // An idle connection closes at once; a head under way is read to its end.
                _ = stop.wait_for(|s| *s), if idle => return Left::Closed,
                // Its place given to a new connection (`capacity`), or closing for its own reasons.
                _ = exchange.drained(), if idle => return Left::Closed,
            };
            match read {
                Ok(0) | Err(_) => return Left::Closed,
                Ok(_) => {}
            }
        };
        let bytes = buf.split_to(head.len).freeze();
        let Some(mut request) = h1::request(&bytes, &head, std::mem::take(&mut spare)) else {
            handed_over("head");
            return handover(&bytes, buf, fresh);
        };
        let runtime = shared.current();
        let browser = runtime
            .browser
            .as_ref()
            .is_some_and(|b| b.owns(request.uri().path()));
        if browser || shared.spans.is_some() || Protocol::of(&request) != Protocol::Http1 {
            handed_over("other");
            return handover(&bytes, buf, fresh);
        }
        if !runtime.gateway.takes_bytes(&request) {
            handed_over("route");
            return handover(&bytes, buf, fresh);
        }
        if matches!(chunked, Body::Chunks) && runtime.gateway.reads_body_of(&request) {
            // A reservation read from a body that is not all here: hyper's path reads it.
            handed_over("head");
            return handover(&bytes, buf, fresh);
        }
        let mut ongoing = exchange.start();
        requests.increment(1);
        fresh = false;
        let ids = runtime.config.server.request_id;
        let log = tracing::enabled!(target: "sluice::access", tracing::Level::INFO);
        let started = Instant::now();
        let (id, logged) = identify(shared, &mut request, ids, log);
        let keep_alive = head.keep_alive;
        let stopping: &watch::Receiver<bool> = stop;
        let closing = || !keep_alive || *stopping.borrow() || exchange.is_draining();
        let client = Client {
            io: &mut *io,
            buf: &mut buf,
            out: &mut out,
            spare: &mut spare,
            body: match (head.framing, &chunked) {
                (Framing::Length(n), _) => n,
                (_, Body::Whole(_, raw)) => *raw,
                _ => 0,
            },
            chunks: matches!(chunked, Body::Chunks),
            chunked: match chunked {
                Body::Whole(body, _) => Some(body),
                _ => None,
            },
            max_ahead: max_head,
        };
        let finish = Finish {
            request_id: if ids { id.as_ref() } else { None },
            closing: &closing,
        };
        let answered = runtime
            .gateway
            .serve_bytes(proxy, request, peer, client, finish)
            .await;
        let Ok(served) = answered else {
            // The client went away while its request waited: no answer, and no line (as on
            // hyper's path, whose service is dropped then).
            return Left::Closed;
        };
        ongoing.answered();
        if let Some((method, path, trace)) = logged {
            access_log(
                id.as_ref(),
                served.client_ip,
                &method,
                &path,
                served.route,
                served.status,
                &served.outcome,
                trace.as_ref(),
                served.answered.saturating_duration_since(started),
            );
        }
        drop(ongoing);
        if served.failed.is_some() {
            // The answer was cut short (or the client's connection failed): nothing more can
            // be sent.
            return Left::Closed;
        }
        if served.close {
            let _ = io.shutdown().await;
            return Left::Closed;
        }
    }
}

/// How long the rest of a chunked body is waited for once its head is read: a client that
/// writes its chunks as they come (a JSON encoder, a `fetch` with a stream body) sends a small
/// body in a few pieces within a few milliseconds, and it is then decided on whole (a
/// reservation from the body reads it). A body still unfinished then, or after
/// [`CHUNKS_PIECES`] reads, is read on once admitted, and streamed past 64 KiB.
const CHUNKS_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The most reads a chunked body is waited for on the byte path: each one decodes the body
/// read so far again, so that a client sending a byte at a time costs hyper's path, not a
/// decode per byte.
const CHUNKS_PIECES: u8 = 16;

/// A request's body as the head loop leaves it.
enum Body {
    /// None, or a length (read by `serve_bytes`).
    Plain,
    /// Chunked, read whole: its content, and the length of its chunks in the buffer.
    Whole(h1::Chunked, u64),
    /// Chunked, not all here: read on once admitted, streamed past 64 KiB.
    Chunks,
}

/// What came of a wait for more of a chunked body.
enum More {
    /// Bytes.
    Came,
    /// Nothing within the wait, or after [`CHUNKS_PIECES`] reads.
    Waited,
    /// The client closed the connection or it failed.
    Closed,
}

/// The wait for the rest of a chunked request body (see [`CHUNKS_WAIT`]).
struct Pieces {
    until: tokio::time::Instant,
    reads: u8,
}

impl Pieces {
    fn start() -> Pieces {
        Pieces {
            until: tokio::time::Instant::now() + CHUNKS_WAIT,
            reads: 0,
        }
    }

    /// Reads more of the body into `buf`, within the wait and the count. After a close or
    /// an error hyper serves the request from what was read (answering a body cut short as
    /// it does).
    async fn more<C: AsyncRead + Unpin>(&mut self, io: &mut C, buf: &mut BytesMut) -> More {
        if self.reads >= CHUNKS_PIECES {
            return More::Waited;
        }
        self.reads += 1;
        buf.reserve(8 * 1024);
        match tokio::time::timeout_at(self.until, io.read_buf(buf)).await {
            Ok(Ok(n)) if n > 0 => More::Came,
            Ok(_) => More::Closed,
            Err(_) => More::Waited,
        }
    }
}

/// Gives hyper the connection from the request whose head is `head`, with what was read after
/// it (`fresh`: no request was served before).
fn handover(head: &Bytes, rest: BytesMut, fresh: bool) -> Left {
    let mut read = BytesMut::with_capacity(head.len() + rest.len());
    read.extend_from_slice(head);
    read.extend_from_slice(&rest);
    Left::Handover { read, fresh }
}

/// A connection whose first bytes were already read: they are read again first.
pub(super) struct Prefixed<T> {
    read: BytesMut,
    io: T,
}

impl<T> Prefixed<T> {
    /// `io`, read from `read` first.
    pub(super) fn new(read: BytesMut, io: T) -> Prefixed<T> {
        Prefixed { read, io }
    }
}

/// The HTTP/2 connection preface (RFC 9113 §3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

impl<T: AsyncRead + Unpin> Prefixed<T> {
    /// Whether the connection opens with the HTTP/2 preface (prior knowledge), reading as
    /// much of it as that takes; what is read is read again first. Call it before any read.
    /// A connection that ends, or fails, first does not.
    pub(super) async fn opens_with_preface(&mut self) -> bool {
        loop {
            let n = self.read.len().min(PREFACE.len());
            if self.read[..n] != PREFACE[..n] {
                return false;
            }
            if n == PREFACE.len() {
                return true;
            }
            match self.io.read_buf(&mut self.read).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Prefixed<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read.is_empty() {
            return Pin::new(&mut this.io).poll_read(cx, buf);
        }
        let n = buf.remaining().min(this.read.len());
        buf.put_slice(&this.read[..n]);
        this.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Prefixed<T> {
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

    #[tokio::test]
    async fn the_preface_is_told_apart_and_read_again() {
        for (chunks, h2) in [
            (&[&PREFACE[..3], &PREFACE[3..10], &PREFACE[10..]][..], true),
            (&[b"PRI * HTTP/1.1\r\n\r\n".as_slice()][..], false),
            (&[b"GET / HTTP/1.1\r\n\r\n".as_slice()][..], false),
            (&[b"PRI".as_slice()][..], false),
        ] {
            let (mut tx, rx) = tokio::io::duplex(64);
            for chunk in chunks {
                tx.write_all(chunk).await.unwrap();
            }
            drop(tx);
            let mut io = Prefixed::new(BytesMut::new(), rx);
            assert_eq!(io.opens_with_preface().await, h2, "{chunks:?}");
            let mut all = Vec::new();
            io.read_to_end(&mut all).await.unwrap();
            assert_eq!(all, chunks.concat());
        }
    }

    #[tokio::test]
    async fn what_was_read_is_read_again_first() {
        let (mut tx, rx) = tokio::io::duplex(64);
        tx.write_all(b" world").await.unwrap();
        drop(tx);
        let mut io = Prefixed::new(BytesMut::from(&b"hello"[..]), rx);
        let mut all = String::new();
        io.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "hello world");
    }
}
