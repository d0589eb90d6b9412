//! The byte path's side of an upstream exchange: a request sent over a pooled connection (or
//! a new one), its body with it or streamed after it, and the final answer's head read.

use std::io;

use bytes::{Buf as _, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWriteExt as _};

use super::{read_more, read_within, BodyRead, MAX_RESPONSE_HEAD};
use crate::proxy::{Proxy, ProxyError, RawConn};
use crate::route::Upstream;
use crate::wire;

/// The most of a streamed body read from the client before it is written upstream.
const STREAM_READ: usize = 64 * 1024;

/// Sends `request` (a head, and the whole body if it has one) over a pooled connection to
/// `upstream`, or a new one, and reads the final answer's head. A pooled connection the
/// upstream closed meanwhile gets the request again on another: when it fails before any
/// byte of an answer and the method is idempotent, or, for the other methods, when it is seen
/// closed before the send.
pub(super) async fn exchange<B>(
    proxy: &Proxy<B>,
    upstream: &Upstream,
    request: &[u8],
    idempotent: bool,
    head_request: bool,
) -> Result<(RawConn, wire::ResponseHead), ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        let Some((mut conn, reused)) = send(proxy, upstream, request, idempotent).await? else {
            continue;
        };
        match answer_head(&mut conn, head_request, reused && idempotent).await? {
            Some(head) => return Ok((conn, head)),
            None => continue,
        }
    }
}

/// Sends `request` (the head and the part of the body read so far, `client.1` empty after
/// it), then the body's `rest` bytes as they come from the client, each read within
/// `body_timeout`. The connection is taken first, as for [`exchange`] (a pooled one seen
/// closed, or failing the first write, is replaced: nothing was read from the client
/// since); once the rest has begun, nothing is sent again. A client that stops sending
/// fails it with [`BodyRead::error`] (400, 408).
pub(super) async fn send_streamed<B, C>(
    proxy: &Proxy<B>,
    upstream: &Upstream,
    request: &[u8],
    client: (&mut C, &mut BytesMut),
    rest: u64,
    body_timeout: Option<std::time::Duration>,
) -> Result<RawConn, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    C: AsyncRead + Unpin,
{
    let mut conn = loop {
        if let Some((conn, _)) = send(proxy, upstream, request, false).await? {
            break conn;
        }
    };
    let (io, buf) = client;
    debug_assert!(buf.is_empty(), "the part of the body read is in `request`");
    let mut left = rest;
    while left > 0 {
        // Room for a whole read is kept from one to the next, as `buf` is emptied after each.
        let want = (left as usize).min(STREAM_READ);
        left -= read_within(io, buf, want, body_timeout)
            .await
            .map_err(BodyRead::error)? as u64;
        conn.stream.write_all(buf).await.map_err(ProxyError::Io)?;
        buf.clear();
    }
    Ok(conn)
}

/// Takes a connection and writes `request` on it: the connection and whether it was pooled,
/// or `None` when a pooled one was closed (seen before the send for a method that is not
/// `idempotent`, or failing the write): another is to be tried.
async fn send<B>(
    proxy: &Proxy<B>,
    upstream: &Upstream,
    request: &[u8],
    idempotent: bool,
) -> Result<Option<(RawConn, bool)>, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (mut conn, reused) = match proxy.checkout_raw(upstream.authority()) {
        Some(conn) => (conn, true),
        // Boxed: the cold path's future stays out of every request's.
        None => (Box::pin(proxy.connect_raw(upstream)).await?, false),
    };
    if reused && !idempotent && !conn.still_open() {
        return Ok(None);
    }
    match conn.stream.write_all(request).await {
        Ok(()) => Ok(Some((conn, reused))),
        Err(_) if reused => Ok(None),
        Err(e) => Err(ProxyError::Io(e)),
    }
}

/// Reads the final answer's head from `conn` (informational answers skipped). `None`: the
/// connection closed or failed before any byte of an answer and the request may be sent
/// again (`may_resend`: a pooled connection, an idempotent method).
pub(super) async fn answer_head(
    conn: &mut RawConn,
    head_request: bool,
    may_resend: bool,
) -> Result<Option<wire::ResponseHead>, ProxyError> {
    loop {
        match wire::Response::parse(&conn.buf, head_request, MAX_RESPONSE_HEAD) {
            wire::Response::Final(head) => return Ok(Some(head)),
            wire::Response::Informational(len) => {
                conn.buf.advance(len);
                continue;
            }
            wire::Response::Refused => {
                return Err(ProxyError::Io(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the upstream's answer is no HTTP/1.1 response",
                )))
            }
            wire::Response::Partial => {}
        }
        let read = read_more(&mut conn.stream, &mut conn.buf).await;
        let nothing = conn.buf.is_empty();
        match read {
            Ok(0) | Err(_) if may_resend && nothing => return Ok(None),
            Ok(0) => {
                return Err(ProxyError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the upstream closed the connection before its answer",
                )))
            }
            Err(e) => return Err(ProxyError::Io(e)),
            Ok(_) => {}
        }
    }
}

/// Sends `head` (a request head saying `Transfer-Encoding: chunked`), then the chunked body at
/// the start of `client.1` and what follows it on the connection, framed again as hyper's
/// client frames a body it streams: each chunk with its size alone (extensions dropped), the
/// last one, and no trailers. Each read waits `body_timeout` at most; more than `limit` bytes
/// of content fail it with 413, broken chunks or a client that stops sending with 400 or
/// 408. What follows the body (a pipelined request) stays in `client.1`. Returns the
/// connection and the content's length.
pub(super) async fn send_chunked<B, C>(
    proxy: &Proxy<B>,
    upstream: &Upstream,
    head: &[u8],
    client: (&mut C, &mut BytesMut),
    limit: u64,
    body_timeout: Option<std::time::Duration>,
) -> Result<(RawConn, u64), ProxyError>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    C: AsyncRead + Unpin,
{
    use crate::body::BodyError;
    use crate::wire::{Chunks, Step};

    let mut conn = loop {
        if let Some((conn, _)) = send(proxy, upstream, head, false).await? {
            break conn;
        }
    };
    let (io, buf) = client;
    let mut out = Vec::with_capacity(STREAM_READ);
    let mut chunks = Chunks::Size;
    let mut hex = [0u8; 16];
    let mut content = 0u64;
    loop {
        let before = chunks;
        match chunks.advance(&buf[..]) {
            Step::Take(n) => {
                match (before, chunks) {
                    (Chunks::Size, Chunks::Data(size)) => {
                        content += size;
                        if content > limit {
                            return Err(ProxyError::Body(BodyError::TooLarge(limit)));
                        }
                        out.extend_from_slice(super::write::hex_size(size, &mut hex));
                        out.extend_from_slice(b"\r\n");
                    }
                    (Chunks::Size, _) => out.extend_from_slice(b"0\r\n"),
                    // The trailers hyper's client would not send: the blank line only.
                    (Chunks::Trailers, _) => out.extend_from_slice(b"\r\n"),
                    _ => out.extend_from_slice(&buf[..n]),
                }
                buf.advance(n);
                if chunks == Chunks::Done {
                    break;
                }
            }
            Step::More => {
                if out.len() >= STREAM_READ || (!out.is_empty() && buf.is_empty()) {
                    conn.stream.write_all(&out).await.map_err(ProxyError::Io)?;
                    out.clear();
                }
                read_within(io, buf, STREAM_READ, body_timeout)
                    .await
                    .map_err(BodyRead::error)?;
            }
            Step::Broken => {
                return Err(ProxyError::Client(
                    "the request's chunked body is malformed".into(),
                ))
            }
        }
    }
    conn.stream.write_all(&out).await.map_err(ProxyError::Io)?;
    Ok((conn, content))
}
