//! How the byte path writes: the heads of the answers it passes on or makes itself, and the
//! bodies it relays, in the framing hyper's server would give them.

use std::io;
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::FutureExt as _;
use http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, DATE};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};

use super::{read_at_most, read_more, Finish, FLUSH_AT, X_REQUEST_ID};
use crate::body::UpstreamStalled;
use crate::cost::meter::Meter;
use crate::headers;
use crate::proxy::{is_hop_by_hop_bytes, RawConn};
use crate::wire::{self, Chunks, Framing, Step};

/// The fields the gateway writes into an upstream answer's head, replacing the upstream's own
/// of the same names.
pub(super) struct Own<'a> {
    /// `RateLimit-Policy`.
    pub(super) policy: Option<&'a HeaderValue>,
    /// `RateLimit`.
    pub(super) ratelimit: Option<HeaderValue>,
    /// `X-Request-Id`.
    pub(super) request_id: Option<&'a HeaderValue>,
}

/// Writes the fields of an upstream answer as hyper's client and the gateway would leave
/// them: names in lowercase, without the hop-by-hop fields, one `Content-Length` for several
/// equal ones and none beside a transfer coding (RFC 9112 §6.3), the upstream's fields of the
/// names in `own` replaced by the gateway's. Returns whether the answer has a `Date`.
pub(super) fn write_answer_fields(
    out: &mut Vec<u8>,
    head: &[u8],
    answer: &wire::ResponseHead,
    own: &Own<'_>,
) -> bool {
    let named =
        |field: &wire::Field, name: &[u8]| head[field.name.clone()].eq_ignore_ascii_case(name);
    let listed: smallvec::SmallVec<[&[u8]; 2]> = answer
        .fields
        .iter()
        .filter(|f| named(f, b"connection"))
        .map(|f| &head[f.value.clone()])
        .collect();
    let mut length = false;
    let mut dated = false;
    for field in &answer.fields {
        let name = &head[field.name.clone()];
        if is_hop_by_hop_bytes(name, &listed)
            || (own.policy.is_some() && named(field, b"ratelimit-policy"))
            || (own.ratelimit.is_some() && named(field, b"ratelimit"))
            || (own.request_id.is_some() && named(field, b"x-request-id"))
        {
            continue;
        }
        if named(field, b"content-length") {
            let chunked = matches!(answer.framing, Framing::Chunked | Framing::UntilClose);
            if chunked || length {
                continue;
            }
            length = true;
        }
        dated |= named(field, b"date");
        out.extend(name.iter().map(u8::to_ascii_lowercase));
        out.extend_from_slice(b": ");
        out.extend_from_slice(&head[field.value.clone()]);
        out.extend_from_slice(b"\r\n");
    }
    let lines = [
        (&headers::RATELIMIT_POLICY, own.policy),
        (&headers::RATELIMIT, own.ratelimit.as_ref()),
        (&X_REQUEST_ID, own.request_id),
    ];
    for (name, value) in lines {
        if let Some(value) = value {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    dated
}

/// The reason phrase of the status line at the start of `head`, as the upstream wrote it.
pub(super) fn reason(head: &[u8]) -> &[u8] {
    let line = memchr::memchr(b'\n', head).map_or(head, |end| &head[..end]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // `HTTP/1.x NNN`, then a space and the phrase.
    line.get(13..).unwrap_or_default()
}

/// Appends `name: value` lines.
pub(super) fn write_fields(out: &mut Vec<u8>, fields: &HeaderMap) {
    for (name, value) in fields {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Ends a response head: `Date` when the answer has none (`dated`; as hyper's server adds
/// it), `Connection: close` when the connection closes after it (`close`).
pub(super) fn end_head(out: &mut Vec<u8>, dated: bool, close: bool) {
    if !dated {
        out.extend_from_slice(b"date: ");
        date::write(out);
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Whether `Connection` has the token `close`.
pub(super) fn says_close(fields: &HeaderMap) -> bool {
    fields.get_all(CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

/// Writes an answer the gateway made itself, with its length (and without its body when it
/// answers `HEAD`). Returns its status, whether the connection closes after it, and whether
/// it was written (when it was not, the connection must close with nothing more written).
pub(super) async fn write_answer<C: AsyncWrite + Unpin>(
    io: &mut C,
    out: &mut Vec<u8>,
    response: Response<Full<Bytes>>,
    head_request: bool,
    finish: &Finish<'_>,
) -> (StatusCode, bool, io::Result<()>) {
    let (mut parts, mut body) = response.into_parts();
    if let Some(id) = finish.request_id {
        parts.headers.insert(X_REQUEST_ID.clone(), id.clone());
    }
    // A whole body: its one frame is ready at once.
    let body = match body.frame().now_or_never() {
        Some(Some(Ok(frame))) => frame.into_data().unwrap_or_default(),
        _ => Bytes::new(),
    };
    let says_close = says_close(&parts.headers);
    let close = says_close || (finish.closing)();
    out.clear();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(parts.status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(parts.status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    parts.headers.remove(CONTENT_LENGTH);
    write_fields(out, &parts.headers);
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(itoa::Buffer::new().format(body.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    end_head(out, parts.headers.contains_key(DATE), close && !says_close);
    if !head_request {
        out.extend_from_slice(&body);
    }
    let written = io.write_all(out).await;
    (parts.status, close, written)
}

/// Passes the upstream's body on after the head already in `out`, in the framing hyper's
/// server would give it, waiting at most `gap` for each read of it. Returns whether the
/// upstream connection may serve another request.
///
/// # Errors
///
/// The client's connection failed, or the upstream's body was cut short or stalled for `gap`
/// ([`UpstreamStalled`] inside a [`io::ErrorKind::TimedOut`]): the client cannot tell
/// otherwise, its connection must close.
///
/// A `meter` (a settled cost) reads the body's content as it passes, and its trailers, which
/// are not passed on.
///
/// While it waits for the upstream, the client's connection is read as while the request
/// waited (pipelined bytes kept in `client.1`, up to `client.2`): a client that closes it ends
/// the relay at once, so that the upstream exchange is dropped and a settled cost is settled
/// with what the client was sent, as hyper's path does.
pub(super) async fn relay<C: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut RawConn,
    framing: Framing,
    gap: Option<Duration>,
    client: (&mut C, &mut BytesMut, usize),
    out: &mut Vec<u8>,
    mut meter: Option<&mut Meter>,
) -> io::Result<bool> {
    let (io, buf, max_ahead) = client;
    let mut client = (&mut *io, buf, max_ahead);
    let cut = || {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the upstream's body was cut short",
        )
    };
    match framing {
        Framing::Empty => {}
        Framing::Length(mut left) => loop {
            let n = conn
                .buf
                .len()
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            if let Some(meter) = meter.as_deref_mut() {
                meter.observe_data(&conn.buf[..n]);
            }
            out.extend_from_slice(&conn.buf[..n]);
            conn.buf.advance(n);
            left -= n as u64;
            if left == 0 {
                break;
            }
            if out.len() >= FLUSH_AT || conn.buf.is_empty() {
                client.0.write_all(out).await?;
                out.clear();
            }
            if read_upstream(conn, gap, &mut client).await? == 0 {
                return Err(cut());
            }
        },
        Framing::Chunked => {
            let mut chunks = Chunks::Size;
            let mut hex = [0u8; 16];
            loop {
                let before = chunks;
                match chunks.advance(&conn.buf) {
                    Step::Take(n) => {
                        match (before, chunks) {
                            // A size line, written again without its extensions.
                            (Chunks::Size, Chunks::Data(size)) => {
                                out.extend_from_slice(hex_size(size, &mut hex));
                                out.extend_from_slice(b"\r\n");
                            }
                            (Chunks::Size, _) => out.extend_from_slice(b"0\r\n"),
                            // The trailers hyper would not pass on: the blank line only.
                            (Chunks::Trailers, _) => {
                                if let Some(meter) = meter.as_deref_mut() {
                                    meter.observe_trailers(trailer_fields(&conn.buf[..n]));
                                }
                                out.extend_from_slice(b"\r\n")
                            }
                            (Chunks::Data(_), _) => {
                                if let Some(meter) = meter.as_deref_mut() {
                                    meter.observe_data(&conn.buf[..n]);
                                }
                                out.extend_from_slice(&conn.buf[..n])
                            }
                            _ => out.extend_from_slice(&conn.buf[..n]),
                        }
                        conn.buf.advance(n);
                        if chunks == Chunks::Done {
                            break;
                        }
                    }
                    Step::More => {
                        if out.len() >= FLUSH_AT || !out.is_empty() && conn.buf.is_empty() {
                            client.0.write_all(out).await?;
                            out.clear();
                        }
                        if read_upstream(conn, gap, &mut client).await? == 0 {
                            return Err(cut());
                        }
                    }
                    Step::Broken => return Err(cut()),
                }
            }
        }
        Framing::UntilClose => {
            let mut hex = [0u8; 16];
            loop {
                if !conn.buf.is_empty() {
                    if let Some(meter) = meter.as_deref_mut() {
                        meter.observe_data(&conn.buf);
                    }
                    out.extend_from_slice(hex_size(conn.buf.len() as u64, &mut hex));
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(&conn.buf);
                    out.extend_from_slice(b"\r\n");
                    conn.buf.clear();
                }
                client.0.write_all(out).await?;
                out.clear();
                if read_upstream(conn, gap, &mut client).await? == 0 {
                    break;
                }
            }
            out.extend_from_slice(b"0\r\n\r\n");
            client.0.write_all(out).await?;
            out.clear();
            return Ok(false);
        }
    }
    client.0.write_all(out).await?;
    out.clear();
    Ok(true)
}

/// The fields of a chunked body's trailer section (`Chunks` read it whole); fields `http`
/// does not take are left out.
fn trailer_fields(section: &[u8]) -> HeaderMap {
    let mut fields = [httparse::EMPTY_HEADER; wire::MAX_HEADERS];
    let mut map = HeaderMap::new();
    if let Ok(httparse::Status::Complete((_, fields))) =
        httparse::parse_headers(section, &mut fields)
    {
        for field in fields {
            if let (Ok(name), Ok(value)) = (
                http::HeaderName::from_bytes(field.name.as_bytes()),
                HeaderValue::from_bytes(field.value),
            ) {
                map.append(name, value);
            }
        }
    }
    map
}

/// The fields of an upstream answer's head, as a map (for a settled cost's meter).
pub(super) fn answer_fields(head: &[u8], answer: &wire::ResponseHead) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(answer.fields.len());
    for field in &answer.fields {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(&head[field.name.clone()]),
            HeaderValue::from_bytes(&head[field.value.clone()]),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// [`read_body`], reading the client's connection meanwhile: an error if the client closes it
/// (or it fails) first.
async fn read_upstream<C: AsyncRead + Unpin>(
    conn: &mut RawConn,
    gap: Option<Duration>,
    client: &mut (&mut C, &mut BytesMut, usize),
) -> io::Result<usize> {
    loop {
        let room = client.2.saturating_sub(client.1.len());
        tokio::select! {
            biased;
            read = read_body(conn, gap) => return read,
            read = read_at_most(&mut *client.0, client.1, room), if room > 0 => match read {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the client closed the connection mid-answer",
                    ))
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            },
        }
    }
}

/// Reads more of the upstream's body into `conn.buf`, waiting at most `gap`.
async fn read_body(conn: &mut RawConn, gap: Option<Duration>) -> io::Result<usize> {
    let read = read_more(&mut conn.stream, &mut conn.buf);
    match gap {
        None => read.await,
        Some(gap) => tokio::time::timeout(gap, read).await.unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                UpstreamStalled(gap),
            ))
        }),
    }
}

/// `n` in lowercase hex digits.
pub(super) fn hex_size(mut n: u64, buf: &mut [u8; 16]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The `Date` value, formatted once a second per thread.
mod date {
    use std::cell::RefCell;
    use std::time::{SystemTime, UNIX_EPOCH};

    thread_local! {
        static NOW: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
    }

    /// Appends the current date in the IMF-fixdate form.
    pub(super) fn write(out: &mut Vec<u8>) {
        let now = SystemTime::now();
        let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        NOW.with(|cell| {
            let mut cached = cell.borrow_mut();
            if cached.0 != secs {
                *cached = (secs, httpdate::fmt_http_date(now));
            }
            out.extend_from_slice(cached.1.as_bytes());
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_in_hex() {
        let mut buf = [0u8; 16];
        assert_eq!(hex_size(0, &mut buf), b"0");
        assert_eq!(hex_size(255, &mut buf), b"ff");
        assert_eq!(hex_size(4096, &mut buf), b"1000");
        assert_eq!(hex_size(u64::MAX, &mut buf), b"ffffffffffffffff");
    }

    #[test]
    fn reasons_as_written() {
        assert_eq!(reason(b"HTTP/1.1 200 OK\r\nx: y\r\n\r\n"), b"OK");
        assert_eq!(reason(b"HTTP/1.1 200 Fine by me\r\n\r\n"), b"Fine by me");
        assert_eq!(reason(b"HTTP/1.1 204\r\n\r\n"), b"");
        assert_eq!(reason(b"HTTP/1.1 204 \r\n\r\n"), b"");
    }

    #[test]
    fn the_date_is_an_imf_fixdate() {
        let mut out = Vec::new();
        date::write(&mut out);
        assert_eq!(out.len(), 29, "{:?}", String::from_utf8_lossy(&out));
        assert!(out.ends_with(b" GMT"));
    }
}
