//! The HTTP/1.1 byte path: a plain request (without a body, or with a `Content-Length` or a
//! chunked body: up to [`MAX_BODY`] read once admitted, the rest streamed), read by [`wire`],
//! decided by the
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
//! `http://` upstreams; the rest of a connection goes to hyper from the first request that
//! does not. A settled cost's [`Meter`] reads an answer's content and trailers as they are
//! relayed, in the same pass (nothing is copied for it), and settles when the relay ends or
//! the client leaves; a reservation computed from the body reads the body before any policy
//! decides.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, StatusCode, Uri};
use tokio::io::{AsyncRead, AsyncWrite};

mod read;
mod upstream;
mod write;

use read::{read_at_most, read_body, read_chunks, read_more, read_within, watching, BodyRead};
use write::{
    answer_fields, end_head, reason, relay, write_answer, write_answer_fields, write_fields, Own,
};

use crate::body::{BodyError, ReadTimeout, UpstreamStalled};
use crate::cost::meter::Meter;
use crate::cost::settle::{settle_all, Observed};
use crate::gateway::{answered, failure, Admitted, Decided, Gateway, Outcome};
use crate::headers;
use crate::path::canonical_uri;
use crate::protocol::Protocol;
use crate::proxy::{h1_upstream_headers, Proxy, ProxyError};
use crate::route::{Lookup, Route};
use crate::wire::{self, Framing};

/// `X-Request-Id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// hyper's client default for a response head.
const MAX_RESPONSE_HEAD: usize = 400 * 1024;

/// How much room a read asks for.
const READ: usize = 8 * 1024;

/// Response bytes gathered before they are written to the client.
const FLUSH_AT: usize = 16 * 1024;

/// The part of a request body the byte path reads before it takes an upstream connection: a
/// `Content-Length` of at most this is read whole, once admitted, and sent upstream with the
/// head, as hyper's path reads a body up to the same bound before forwarding it; the rest of
/// a longer one is streamed after it. A chunked body that ends within this is forwarded with
/// its length; a longer one is streamed chunked after this much of it.
pub const MAX_BODY: u64 = 64 * 1024;

/// The request of a plain head. `bytes` is the head, whole and frozen: the target and the
/// field values share it. Its fields go into `headers` (emptied first): a map kept from the
/// connection's last request ([`Client::spare`]) has room for them already; of several
/// `Content-Length` lines (`wire` took them only if they agree) the first, as hyper keeps it.
/// `None` for what `http` does not take (hyper answers it 400).
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
        if name == http::header::CONTENT_LENGTH && headers.contains_key(&name) {
            continue;
        }
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
    /// When the answer's head was ready to be written (for the access log's `ms`, which
    /// hyper's path takes as its service returns the head).
    pub answered: Instant,
    /// Why the answer could not be sent whole, if it could not (the client's connection
    /// failed, the upstream's body was cut short or stalled): the connection must close now,
    /// with nothing more written.
    pub failed: Option<io::Error>,
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
    /// The length of the request's body (its `Content-Length`), which follows the head: in `buf` already, or still to be read. For a chunked body, the
    /// length of its chunks, all in `buf`.
    pub body: u64,
    /// A chunked body, read whole.
    pub chunked: Option<Chunked>,
    /// A chunked body follows that was not read whole (longer than [`MAX_BODY`], or slow):
    /// once the request is admitted, it is read until [`MAX_BODY`] of it or its end, then
    /// forwarded with its length when it ended, or chunked, streamed as it comes.
    pub chunks: bool,
    /// The most bytes kept in `buf` while the request waits (`server.max_header_bytes`, the
    /// bound hyper puts on its read buffer): past it the connection is not read until the
    /// answer is through, and the kernel's buffers push back on the client.
    pub max_ahead: usize,
}

/// A chunked request body the byte path read whole. It goes upstream as hyper's path sends a
/// body it read whole: with its length; chunked again (one chunk, the trailers dropped) when
/// it had trailers; without either when it is empty.
#[derive(Debug, Clone)]
pub struct Chunked {
    /// Its content (chunk extensions and trailers dropped).
    pub data: Bytes,
    /// Whether its trailer section had fields.
    pub trailers: bool,
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
    /// Whether the byte path forwards this route's requests: an `http://` upstream. A
    /// settled cost's meter reads the answer's body as it is relayed.
    pub fn takes_bytes(&self) -> bool {
        self.upstream().protocol() == crate::route::Protocol::Http1
    }
}

impl Gateway {
    /// Whether `request`'s route reserves from the request's body, which it reads before the
    /// policies decide.
    pub fn reads_body_of(&self, request: &Request<()>) -> bool {
        self.reads_body && self.route_reading_body(request).is_some()
    }

    /// Whether the byte path takes `request`: its route's requests go as bytes
    /// ([`Route::takes_bytes`]), or the gateway answers it without an upstream (no route, a
    /// method the route does not allow, an ambiguous path).
    pub fn takes_bytes(&self, request: &Request<()>) -> bool {
        if self.all_take_bytes {
            return true;
        }
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

    /// Handles `request` from `peer` (one [`Gateway::takes_bytes`] took) and writes its
    /// answer to the client.
    ///
    /// A body (`client.body` bytes) is read once the request is admitted, each read within
    /// `client_body_timeout` (408 after it, the connection closed), and sent upstream with the
    /// head; past [`MAX_BODY`], the rest is streamed after it, as it comes (a body cut short
    /// then is answered 400 and closes the connection, the upstream's connection dropped). A request answered by the gateway itself (denied, no route, 413) leaves its body
    /// unread: skipped when it is all in `client.buf` already, and the connection kept;
    /// otherwise the answer closes the connection, as hyper's path does.
    ///
    /// While the request waits (in a queue, for the upstream's answer), the client's
    /// connection is read: bytes are kept in `client.buf`, up to `client.max_ahead`, and a
    /// client that closes it cancels the request (it leaves its queue, the upstream exchange
    /// is dropped).
    ///
    /// # Errors
    ///
    /// The client closed its connection (or it failed) while the request waited: the
    /// request ends without an answer. An answer that could not be sent whole is
    /// [`Served::failed`].
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
            body,
            chunked,
            chunks,
            max_ahead,
        } = client;
        let head_request = request.method() == Method::HEAD;
        // A chunked body is all here: taken off the connection now, forwarded with a length.
        let mut whole: Option<Bytes> = None;
        let mut body = body;
        let chunked_body = chunked.is_some();
        let mut rechunk = false;
        if let Some(Chunked { data, trailers }) = chunked {
            buf.advance(body as usize);
            body = data.len() as u64;
            rechunk = trailers && body > 0;
            whole = Some(data);
        }
        // A reservation computed from the body: read it whole (within the route's max_body)
        // before any policy decides.
        if whole.is_none() && body > 0 && self.reads_body {
            let reading = self
                .route_reading_body(&request)
                .filter(|r| body <= r.body_limit());
            if let Some(route) = reading {
                if let Err(cut) = read_body(io, buf, body, self.body_timeout).await {
                    let client_ip = self.trusted.client_ip(peer.ip(), request.headers());
                    let (response, outcome) = failure(route, Protocol::Http1, &cut.error());
                    let closing = || true;
                    let finish = Finish {
                        request_id: finish.request_id,
                        closing: &closing,
                    };
                    let answered = Instant::now();
                    let (status, close, written) =
                        write_answer(io, out, response, head_request, &finish).await;
                    return Ok(Served {
                        status,
                        route: Some(route),
                        client_ip,
                        outcome,
                        close,
                        answered,
                        failed: written.err(),
                    });
                }
                whole = Some(buf.split_to(body as usize).freeze());
            }
        }
        let seen = match &whole {
            Some(whole) => Some(&whole[..]),
            None => (body == 0).then_some(&[][..]),
        };
        let deciding = self.decide(&mut request, peer, Protocol::Http1, seen);
        let decided = watching(io, buf, max_ahead, deciding)
            .await
            .ok_or_else(gone)?;
        let admitted = match decided {
            Decided::Answer(answer) => {
                *spare = emptied(request.into_parts().0.headers);
                let left = if whole.is_some() { 0 } else { body };
                let unread = chunks || (buf.len() as u64) < left;
                if !unread {
                    buf.advance(left as usize);
                }
                let closing = || unread || (finish.closing)();
                let finish = Finish {
                    request_id: finish.request_id,
                    closing: &closing,
                };
                let answered = Instant::now();
                let (status, close, written) =
                    write_answer(io, out, answer.response, head_request, &finish).await;
                return Ok(Served {
                    status,
                    route: answer.route,
                    client_ip: answer.client_ip,
                    outcome: answer.outcome,
                    close,
                    answered,
                    failed: written.err(),
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
        let owed = std::mem::take(&mut admission.owed);
        let idempotent = matches!(
            *request.method(),
            Method::GET
                | Method::HEAD
                | Method::OPTIONS
                | Method::TRACE
                | Method::PUT
                | Method::DELETE
        );
        // A chunked body not read whole: read up to MAX_BODY of it now; one that ends within
        // that goes on as one read whole, a longer one is streamed chunked.
        let mut chunked_body = chunked_body;
        let mut stream_chunks = false;
        if chunks {
            match read_chunks(io, buf, self.body_timeout).await {
                Ok(Some((data, used, trailers))) => {
                    buf.advance(used);
                    body = data.len() as u64;
                    rechunk = trailers && body > 0;
                    whole = Some(data);
                    chunked_body = true;
                }
                Ok(None) => stream_chunks = true,
                Err(e) => {
                    *spare = emptied(request.into_parts().0.headers);
                    let closing = || true;
                    let finish = Finish {
                        request_id: finish.request_id,
                        closing: &closing,
                    };
                    settle_all(owed, &Observed::default());
                    let answer = (client_ip, &admission, policy_header);
                    return refused(io, out, route, answer, e, head_request, &finish).await;
                }
            }
        }
        let (parts, ()) = request.into_parts();
        let mut fields = parts.headers;
        if chunked_body && body > route.body_limit() {
            // A length declared up front was checked by `decide`; a chunked one is known now.
            *spare = emptied(fields);
            let closing = || true;
            let finish = Finish {
                request_id: finish.request_id,
                closing: &closing,
            };
            settle_all(owed, &Observed::default());
            let answer = (client_ip, &admission, policy_header);
            let e = ProxyError::Body(BodyError::TooLarge(route.body_limit()));
            return refused(io, out, route, answer, e, head_request, &finish).await;
        }
        h1_upstream_headers(&mut fields, &parts.uri, route, peer.ip());
        if rechunk || stream_chunks {
            fields.insert(
                http::header::TRANSFER_ENCODING,
                HeaderValue::from_static("chunked"),
            );
        } else if chunked_body && body > 0 {
            // Its transfer coding went with the hop-by-hop fields: it goes with its length.
            fields.insert(http::header::CONTENT_LENGTH, HeaderValue::from(body));
        }
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
        if let Some(whole) = whole.as_ref().filter(|_| rechunk) {
            out.extend_from_slice(format!("{:x}\r\n", whole.len()).as_bytes());
            out.extend_from_slice(whole);
            out.extend_from_slice(b"\r\n0\r\n\r\n");
        } else if let Some(whole) = &whole {
            out.extend_from_slice(whole);
        } else if body > 0 {
            // All of a body of up to MAX_BODY, the start of a longer one, read before an
            // upstream connection is taken (a client slow to send holds none).
            let ahead = body.min(MAX_BODY);
            match read_body(io, buf, ahead, self.body_timeout).await {
                Ok(()) => {
                    out.extend_from_slice(&buf[..ahead as usize]);
                    buf.advance(ahead as usize);
                }
                Err(cut) => {
                    // Part of the body is unread: the connection cannot carry another request.
                    let closing = || true;
                    let finish = Finish {
                        request_id: finish.request_id,
                        closing: &closing,
                    };
                    // Nothing reached the upstream: the estimates stand.
                    settle_all(owed, &Observed::default());
                    let answer = (client_ip, &admission, policy_header);
                    let e = cut.error();
                    return refused(io, out, route, answer, e, head_request, &finish).await;
                }
            }
        }
        // The rest of a body longer than MAX_BODY, streamed once the upstream has the start.
        let rest = if whole.is_none() {
            body.saturating_sub(MAX_BODY)
        } else {
            0
        };
        let timeout = route.timeout();
        let sent = if rest == 0 && !stream_chunks {
            let exchange = tokio::time::timeout(
                timeout,
                upstream::exchange(proxy, upstream, out, idempotent, head_request),
            );
            let sent = watching(io, buf, max_ahead, exchange)
                .await
                .ok_or_else(gone)?;
            sent.unwrap_or(Err(ProxyError::Timeout(timeout)))
        } else {
            // A streamed body: the route's timeout runs from the start of the send, as hyper's
            // client's does while it streams a body.
            let deadline = tokio::time::Instant::now() + timeout;
            let client = (&mut *io, &mut *buf);
            let sending = async {
                if stream_chunks {
                    let limit = route.body_limit();
                    upstream::send_chunked(proxy, upstream, out, client, limit, self.body_timeout)
                        .await
                } else {
                    upstream::send_streamed(proxy, upstream, out, client, rest, self.body_timeout)
                        .await
                        .map(|conn| (conn, body))
                }
            };
            match tokio::time::timeout_at(deadline, sending).await {
                Ok(Ok((mut conn, content))) => {
                    body = content;
                    let head = tokio::time::timeout_at(
                        deadline,
                        upstream::answer_head(&mut conn, head_request, false),
                    );
                    match watching(io, buf, max_ahead, head).await.ok_or_else(gone)? {
                        Ok(Ok(Some(answer))) => Ok((conn, answer)),
                        // Not asked to send it again, `answer_head` does not offer to.
                        Ok(Ok(None)) => Err(ProxyError::Io(io::ErrorKind::UnexpectedEof.into())),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(ProxyError::Timeout(timeout)),
                    }
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(ProxyError::Timeout(timeout)),
            }
        };
        let (mut conn, answer) = match sent {
            Ok(answer) => answer,
            Err(e) => {
                // No upstream answer to read: the estimates stand (the body's length, sent or
                // not, is known).
                settle_all(
                    owed,
                    &Observed {
                        request_bytes: body,
                        ..Observed::default()
                    },
                );
                let answer = (client_ip, &admission, policy_header);
                if rest > 0 || stream_chunks {
                    // Part of the body may be unread: the connection cannot carry another
                    // request.
                    let closing = || true;
                    let finish = Finish {
                        request_id: finish.request_id,
                        closing: &closing,
                    };
                    return refused(io, out, route, answer, e, head_request, &finish).await;
                }
                return refused(io, out, route, answer, e, head_request, &finish).await;
            }
        };
        let head = conn.buf.split_to(answer.len).freeze();
        let mut meter = if owed.is_empty() {
            None
        } else {
            let request_bytes = owed
                .iter()
                .any(|o| o.counts_request_body)
                .then(|| std::sync::Arc::new(std::sync::atomic::AtomicU64::new(body)));
            Meter::start(owed, &answer_fields(&head, &answer), request_bytes)
        };
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
        let answered = Instant::now();
        let relayed = relay(
            &mut conn,
            answer.framing,
            self.upstream_read(),
            (io, buf, max_ahead),
            out,
            meter.as_deref_mut(),
        )
        .await;
        // The settlement, with what the body showed (all of it, or as far as it went).
        drop(meter);
        // The concurrency slots are held until the answer is through, as on the hyper path.
        drop(admission);
        let failed = match relayed {
            Ok(reusable) => {
                if reusable && answer.keep_alive && conn.buf.is_empty() {
                    proxy.checkin_raw(upstream.authority(), conn);
                }
                None
            }
            Err(e) => {
                if let Some(UpstreamStalled(gap)) = e.get_ref().and_then(|e| e.downcast_ref()) {
                    ReadTimeout::new(route, Protocol::Http1, *gap).expired();
                }
                Some(e)
            }
        };
        Ok(Served {
            status,
            route: Some(route),
            client_ip,
            outcome,
            close,
            answered,
            failed,
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
    let answered = Instant::now();
    let (status, close, written) = write_answer(io, out, response, head_request, finish).await;
    Ok(Served {
        status,
        route: Some(route),
        client_ip,
        outcome,
        close,
        answered,
        failed: written.err(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn of_equal_lengths_the_first_is_kept() {
        let text = Bytes::from_static(
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\nX: y\r\ncontent-length: 00\r\n\r\n",
        );
        let wire::Request::Plain(head) = wire::Request::parse(&text, 1024) else {
            panic!("plain");
        };
        let request = request(&text, &head, HeaderMap::new()).unwrap();
        let lengths: Vec<_> = request.headers().get_all("content-length").iter().collect();
        assert_eq!(lengths, ["0"]);
    }
}
