//! The HTTP/1.1 byte path: a plain request without a body, read by [`wire`], decided by the
//! same [`Gateway`] code as every other request, and forwarded over a pooled upstream
//! connection as bytes, with its answer passed back as bytes.
//!
//! What it saves is hyper's machinery on both sides (a connection task per upstream
//! connection, the channel to it, a typed message encoded twice), not any of the gateway's
//! work: the request is still an [`http::Request`] (its field values share the bytes read),
//! routed by its canonical path, admitted by the route's policies, and its headers edited
//! by the functions the hyper path uses ([`crate::proxy::remove_hop_by_hop`],
//! [`crate::proxy::append_forwarded_for`], [`headers::insert`]). The upstream's head is
//! read by [`wire`] with hyper's client rules, edited the same way, and written with the
//! framing hyper's server would give it: a length as it came, a chunked body re-framed
//! (chunk extensions and trailers dropped, as hyper's decoder and encoder drop them), a body
//! read to the close sent chunked.
//!
//! The server decides which requests take this path ([`Gateway::takes_bytes`]): routes to
//! `http://` upstreams without a settled cost; the rest of a connection goes to hyper from
//! the first request that does not.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};

use bytes::{Buf as _, Bytes, BytesMut};
use futures_util::FutureExt as _;
use http::header::{HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, DATE};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt as _, Full};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

use crate::cost::settle::{settle_all, Observed};
use crate::gateway::{answered, failure, Admitted, Decided, Gateway, Outcome};
use crate::headers;
use crate::path::canonical_uri;
use crate::protocol::Protocol;
use crate::proxy::{h1_upstream_headers, is_hop_by_hop_bytes, Proxy, ProxyError, RawConn};
use crate::route::{Lookup, Route, Upstream};
use crate::wire::{self, Chunks, Framing, Step};

/// `X-Request-Id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// hyper's client default for a response head.
const MAX_RESPONSE_HEAD: usize = 400 * 1024;

/// How much room a read asks for.
const READ: usize = 8 * 1024;

/// Response bytes gathered before they are written to the client.
const FLUSH_AT: usize = 16 * 1024;

/// The request of a plain head. `bytes` is the head, whole and frozen: the target and the
/// field values share it. Its fields go into `headers` (emptied first): a map kept from the
/// connection's last request ([`Client::spare`]) has room for them already. `None` for what
/// `http` does not take (hyper answers it 400).
pub fn request(
    bytes: &Bytes,
    head: &wire::RequestHead,
    mut headers: HeaderMap,
) -> Option<Request<()>> {
    let method = Method::from_bytes(&bytes[head.method.clone()]).ok()?;
    let uri = Uri::from_maybe_shared(bytes.slice(head.target.clone())).ok()?;
    headers.clear();
    headers.reserve(head.fields.len());
    for field in &head.fields {
        let name = HeaderName::from_bytes(&bytes[field.name.clone()]).ok()?;
        let value = HeaderValue::from_maybe_shared(bytes.slice(field.value.clone())).ok()?;
        headers.append(name, value);
    }
    let mut request = Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Some(request)
}

/// What the byte path did with a request.
#[derive(Debug)]
pub struct Served<'a> {
    /// The status the client was sent.
    pub status: StatusCode,
    /// The route that matched.
    pub route: Option<&'a Route>,
    /// The client address the policies saw.
    pub client_ip: IpAddr,
    /// What happened.
    pub outcome: Outcome<'a>,
    /// The connection closes now: the answer said `Connection: close`.
    pub close: bool,
}

/// The client's side of a request on the byte path.
pub struct Client<'c, C> {
    /// The connection.
    pub io: &'c mut C,
    /// What was read from it past the request's head (the next request's bytes).
    pub buf: &'c mut BytesMut,
    /// Room for what is written, kept from one request to the next.
    pub out: &'c mut Vec<u8>,
    /// The request's header map, emptied, for the connection's next request.
    pub spare: &'c mut HeaderMap,
}

/// How the server finishes each answer.
pub struct Finish<'f> {
    /// The answer's `X-Request-Id`, if the server echoes one.
    pub request_id: Option<&'f HeaderValue>,
    /// Whether the connection closes after this answer, asked as its head is written (a
    /// shutdown may have begun while the request waited).
    pub closing: &'f (dyn Fn() -> bool + Sync),
}

impl Route {
    /// Whether the byte path forwards this route's requests: an `http://` upstream, and no
    /// policy settling a cost (which reads the answer's body as it passes).
    pub fn takes_bytes(&self) -> bool {
        self.upstream().protocol() == crate::route::Protocol::Http1
            && self.policy_list().iter().all(|p| p.cost().is_none())
    }
}

impl Gateway {
    /// Whether the byte path takes `request`: its route's requests go as bytes
    /// ([`Route::takes_bytes`]), or the gateway answers it without an upstream (no route, a
    /// method the route does not allow, an ambiguous path).
    pub fn takes_bytes(&self, request: &Request<()>) -> bool {
        let canonical;
        let path = match canonical_uri(request.uri()) {
            Ok(None) => request.uri().path(),
            Ok(Some(uri)) => {
                canonical = uri;
                canonical.path()
            }
            Err(_) => return true,
        };
        match self.routes().find(request.method(), path) {
            Lookup::Found(route) => route.takes_bytes(),
            Lookup::NotFound | Lookup::MethodNotAllowed => true,
        }
    }

    /// Handles `request` from `peer` (one [`Gateway::takes_bytes`] took, without a body) and
    /// writes its answer to the client.
    ///
    /// While the request waits (in a queue, for the upstream's answer), the client's
    /// connection is read: bytes are kept in `client.buf`, and a client that closes it
    /// cancels the request (it leaves its queue, the upstream exchange is dropped).
    ///
    /// # Errors
    ///
    /// The client's connection failed or closed, or the upstream's answer was cut short
    /// after its head was passed on: the connection must close, with no more written.
    pub async fn serve_bytes<B, C>(
        &self,
        proxy: &Proxy<B>,
        mut request: Request<()>,
        peer: SocketAddr,
        client: Client<'_, C>,
        finish: Finish<'_>,
    ) -> io::Result<Served<'_>>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        C: AsyncRead + AsyncWrite + Unpin,
    {
        let Client {
            io,
            buf,
            out,
            spare,
        } = client;
        let head_request = request.method() == Method::HEAD;
        let decided = watching(io, buf, self.decide(&mut request, peer, Protocol::Http1))
            .await
            .ok_or_else(gone)?;
        let admitted = match decided {
            Decided::Answer(answer) => {
                *spare = emptied(request.into_parts().0.headers);
                let (status, close) =
                    write_answer(io, out, answer.response, head_request, &finish).await?;
                return Ok(Served {
                    status,
                    route: answer.route,
                    client_ip: answer.client_ip,
                    outcome: answer.outcome,
                    close,
                });
            }
            Decided::Forward(admitted) => admitted,
        };
        let Admitted {
            route,
            client_ip,
            mut admission,
            policy_header,
        } = admitted;
        if !admission.owed.is_empty() {
            // No route with a settled cost takes this path; should one, its estimate stands.
            settle_all(std::mem::take(&mut admission.owed), &Observed::default());
        }
        let idempotent = matches!(
            *request.method(),
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        );
        let (parts, ()) = request.into_parts();
        let mut fields = parts.headers;
        h1_upstream_headers(&mut fields, &parts.uri, route, peer.ip());
        let upstream = route.upstream();
        out.clear();
        out.extend_from_slice(parts.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(
            upstream
                .path_for(parts.uri.path_and_query())
                .as_str()
                .as_bytes(),
        );
        out.extend_from_slice(b" HTTP/1.1\r\n");
        write_fields(out, &fields);
        out.extend_from_slice(b"\r\n");
        *spare = emptied(fields);
        let timeout = route.timeout();
        let exchange = tokio::time::timeout(
            timeout,
            exchange(proxy, upstream, out, idempotent, head_request),
        );
        let sent = watching(io, buf, exchange).await.ok_or_else(gone)?;
        let (mut conn, answer) = match sent {
            Ok(Ok(answer)) => answer,
            failed => {
                let e = match failed {
                    Ok(Err(e)) => e,
                    _ => ProxyError::Timeout(timeout),
                };
                let answer = (client_ip, &admission, policy_header);
                return refused(io, out, route, answer, e, head_request, &finish).await;
            }
        };
        let head = conn.buf.split_to(answer.len).freeze();
        let status = StatusCode::from_u16(answer.status).map_err(io::Error::other)?;
        let outcome = answered(route, &admission.shadow_denied, status, Protocol::Http1);
        let close = (finish.closing)();
        out.clear();
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(itoa::Buffer::new().format(answer.status).as_bytes());
        out.push(b' ');
        out.extend_from_slice(reason(&head));
        out.extend_from_slice(b"\r\n");
        let own = Own {
            policy: policy_header.as_ref(),
            ratelimit: headers::ratelimit_header(route.policy_list(), &admission.verdicts),
            request_id: finish.request_id,
        };
        let dated = write_answer_fields(out, &head, &answer, &own);
        if matches!(answer.framing, Framing::Chunked | Framing::UntilClose) {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        end_head(out, dated, close);
        drop(head);
        let reusable = relay(&mut conn, answer.framing, io, out).await?;
        // The concurrency slots are held until the answer is through, as on the hyper path.
        drop(admission);
        if reusable && answer.keep_alive && conn.buf.is_empty() {
            proxy.checkin_raw(upstream.authority(), conn);
        }
        Ok(Served {
            status,
            route: Some(route),
            client_ip,
            outcome,
            close,
        })
    }
}

/// `map` without its entries, its room kept.
fn emptied(mut map: HeaderMap) -> HeaderMap {
    map.clear();
    map
}

/// The client closed its connection while its request waited.
fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "the client closed the connection",
    )
}

/// The gateway's answer to an admitted request it could not forward (the client's address,
/// the admission and the `RateLimit-Policy` value in `admitted`).
async fn refused<'a, C: AsyncWrite + Unpin>(
    io: &mut C,
    out: &mut Vec<u8>,
    route: &'a Route,
    admitted: (IpAddr, &crate::Admission, Option<HeaderValue>),
    e: ProxyError,
    head_request: bool,
    finish: &Finish<'_>,
) -> io::Result<Served<'a>> {
    let (client_ip, admission, policy_header) = admitted;
    let (mut response, outcome) = failure(route, Protocol::Http1, &e);
    headers::insert(
        response.headers_mut(),
        policy_header.as_ref(),
        route.policy_list(),
        &admission.verdicts,
    );
    let (status, close) = write_answer(io, out, response, head_request, finish).await?;
    Ok(Served {
        status,
        route: Some(route),
        client_ip,
        outcome,
        close,
    })
}

/// Runs `fut` while reading the client's connection: `None` if the client closes it (or
/// it fails) first. What the client sends meanwhile (a pipelined request) is kept in `buf`,
/// up to a head's worth.
async fn watching<C, F>(io: &mut C, buf: &mut BytesMut, fut: F) -> Option<F::Output>
where
    C: AsyncRead + Unpin,
    F: Future,
{
    let mut fut = std::pin::pin!(fut);
    loop {
        let room = buf.len() < MAX_RESPONSE_HEAD;
        tokio::select! {
            biased;
            done = &mut fut => return Some(done),
            read = read_more(io, buf), if room => match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            },
        }
    }
}

/// Reads what is there into `buf`, making room for [`READ`] bytes when less than a quarter
/// of that is left: while the head read before shares `buf`'s allocation, asking for more
/// room than is left would copy `buf` into a new one.
async fn read_more<R: AsyncRead + Unpin>(from: &mut R, buf: &mut BytesMut) -> io::Result<usize> {
    if buf.capacity() - buf.len() < READ / 4 {
        buf.reserve(READ);
    }
    from.read_buf(buf).await
}

/// Sends `request` (a whole head: no body) over a pooled connection to `upstream`, or a new
/// one, and reads the final answer's head. A pooled connection the upstream closed meanwhile
/// gets the request again on another: when it fails before any byte of an answer and the
/// method is idempotent, or, for the other methods, when it is seen closed before the send.
async fn exchange<B>(
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
    'connections: loop {
        let (mut conn, reused) = match proxy.checkout_raw(upstream.authority()) {
            Some(conn) => (conn, true),
            // Boxed: the cold path's future stays out of every request's.
            None => (Box::pin(proxy.connect_raw(upstream)).await?, false),
        };
        if reused && !idempotent && !still_open(&conn) {
            continue;
        }
        if let Err(e) = conn.stream.write_all(request).await {
            if reused {
                continue;
            }
            return Err(ProxyError::Io(e));
        }
        loop {
            match wire::Response::parse(&conn.buf, head_request, MAX_RESPONSE_HEAD) {
                wire::Response::Final(head) => return Ok((conn, head)),
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
                Ok(0) | Err(_) if reused && nothing && idempotent => continue 'connections,
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
}

/// Whether a pooled connection is still open as far as can be seen without waiting: no
/// close (nor stray bytes) has arrived on it.
fn still_open(conn: &RawConn) -> bool {
    let mut probe = [0u8; 1];
    matches!(
        conn.stream.get_ref().try_read(&mut probe),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock
    )
}

/// The fields the gateway writes into an upstream answer's head, replacing the upstream's own
/// of the same names.
struct Own<'a> {
    /// `RateLimit-Policy`.
    policy: Option<&'a HeaderValue>,
    /// `RateLimit`.
    ratelimit: Option<HeaderValue>,
    /// `X-Request-Id`.
    request_id: Option<&'a HeaderValue>,
}

/// Writes the fields of an upstream answer as hyper's client and the gateway would leave
/// them: names in lowercase, without the hop-by-hop fields, one `Content-Length` for several
/// equal ones and none beside a transfer coding (RFC 9112 §6.3), the upstream's fields of the
/// names in `own` replaced by the gateway's. Returns whether the answer has a `Date`.
fn write_answer_fields(
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
fn reason(head: &[u8]) -> &[u8] {
    let line = memchr::memchr(b'\n', head).map_or(head, |end| &head[..end]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // `HTTP/1.x NNN`, then a space and the phrase.
    line.get(13..).unwrap_or_default()
}

/// Appends `name: value` lines.
fn write_fields(out: &mut Vec<u8>, fields: &HeaderMap) {
    for (name, value) in fields {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
}

/// Ends a response head: `Date` when the answer has none (`dated`; as hyper's server adds
/// it), `Connection: close` when the connection closes after it (`close`).
fn end_head(out: &mut Vec<u8>, dated: bool, close: bool) {
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
fn says_close(fields: &HeaderMap) -> bool {
    fields.get_all(CONNECTION).iter().any(|v| {
        v.as_bytes()
            .split(|&b| b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"))
    })
}

/// Writes an answer the gateway made itself, with its length (and without its body when it
/// answers `HEAD`). Returns its status, and whether the connection closes after it.
async fn write_answer<C: AsyncWrite + Unpin>(
    io: &mut C,
    out: &mut Vec<u8>,
    response: Response<Full<Bytes>>,
    head_request: bool,
    finish: &Finish<'_>,
) -> io::Result<(StatusCode, bool)> {
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
    io.write_all(out).await?;
    Ok((parts.status, close))
}

/// Passes the upstream's body on after the head already in `out`, in the framing hyper's
/// server would give it. Returns whether the upstream connection may serve another request.
///
/// # Errors
///
/// The client's connection failed, or the upstream's body was cut short (the client cannot
/// tell otherwise: its connection must close).
async fn relay<C: AsyncWrite + Unpin>(
    conn: &mut RawConn,
    framing: Framing,
    io: &mut C,
    out: &mut Vec<u8>,
) -> io::Result<bool> {
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
            out.extend_from_slice(&conn.buf[..n]);
            conn.buf.advance(n);
            left -= n as u64;
            if left == 0 {
                break;
            }
            if out.len() >= FLUSH_AT || conn.buf.is_empty() {
                io.write_all(out).await?;
                out.clear();
            }
            if read_more(&mut conn.stream, &mut conn.buf).await? == 0 {
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
                            (Chunks::Trailers, _) => out.extend_from_slice(b"\r\n"),
                            _ => out.extend_from_slice(&conn.buf[..n]),
                        }
                        conn.buf.advance(n);
                        if chunks == Chunks::Done {
                            break;
                        }
                    }
                    Step::More => {
                        if out.len() >= FLUSH_AT || !out.is_empty() && conn.buf.is_empty() {
                            io.write_all(out).await?;
                            out.clear();
                        }
                        if read_more(&mut conn.stream, &mut conn.buf).await? == 0 {
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
                    out.extend_from_slice(hex_size(conn.buf.len() as u64, &mut hex));
                    out.extend_from_slice(b"\r\n");
                    out.extend_from_slice(&conn.buf);
                    out.extend_from_slice(b"\r\n");
                    conn.buf.clear();
                }
                io.write_all(out).await?;
                out.clear();
                if read_more(&mut conn.stream, &mut conn.buf).await? == 0 {
                    break;
                }
            }
            out.extend_from_slice(b"0\r\n\r\n");
            io.write_all(out).await?;
            out.clear();
            return Ok(false);
        }
    }
    io.write_all(out).await?;
    out.clear();
    Ok(true)
}

/// `n` in lowercase hex digits.
fn hex_size(mut n: u64, buf: &mut [u8; 16]) -> &[u8] {
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
    fn a_head_becomes_a_request_sharing_its_bytes() {
        let text =
            Bytes::from_static(b"GET /a?b=1 HTTP/1.1\r\nHost: x\r\nX-Many: 1\r\nx-many: 2\r\n\r\n");
        let wire::Request::Plain(head) = wire::Request::parse(&text, 1024) else {
            panic!("plain");
        };
        let request = request(&text, &head, HeaderMap::new()).unwrap();
        assert_eq!(request.method(), Method::GET);
        assert_eq!(request.uri(), "/a?b=1");
        assert_eq!(request.headers()["host"], "x");
        assert_eq!(request.headers().get_all("x-many").iter().count(), 2);
    }

    #[test]
    fn the_date_is_an_imf_fixdate() {
        let mut out = Vec::new();
        date::write(&mut out);
        assert_eq!(out.len(), 29, "{:?}", String::from_utf8_lossy(&out));
        assert!(out.ends_with(b" GMT"));
    }
}
