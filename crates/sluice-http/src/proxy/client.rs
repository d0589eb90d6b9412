//! The upstream client: HTTP/1.1 connections (over TCP, or TLS for `https://`) kept in a
//! small pool per [`Proxy`], and one multiplexed HTTP/2 connection per `h2c://` upstream.
//!
//! A `Proxy` is meant to be owned by one worker thread (the gateway gives each worker its
//! own), so its pool's lock is never contended, and each connection's task runs on the
//! thread that uses it. A connection is taken from the pool for one request and goes back
//! when that request's response body is dropped (fully read, or abandoned: hyper then
//! closes it, and the pool drops it when it next looks).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::header::{CONTENT_LENGTH, HOST, TE, TRANSFER_ENCODING};
use http::uri::Authority;
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::client::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use tokio::sync::OwnedSemaphorePermit;

use crate::body::{BodyError, RequestBody};
use crate::proxy::budget::{self, Budgeted, Socket, UpstreamShare};
use crate::proxy::forward::{append_forwarded_for, remove_hop_by_hop};
use crate::proxy::raw::{RawConn, RawPool};
use crate::route::{Protocol, Route, Upstream};

/// How long connecting to an upstream may take, unless set otherwise (nginx's
/// `proxy_connect_timeout`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a pooled connection may stay idle, unless set otherwise.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The most idle connections kept per upstream.
const MAX_IDLE_PER_UPSTREAM: usize = 1024;

/// Why a request could not be forwarded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The upstream could not be connected to (502).
    #[error("cannot connect to the upstream: {0}")]
    Connect(#[source] std::io::Error),
    /// The upstream failed before a complete response head (502).
    #[error("upstream failed: {0}")]
    Upstream(#[source] hyper::Error),
    /// No response head within the route's timeout (504).
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    /// No connection to the upstream within the connect timeout (504).
    #[error("cannot connect to the upstream within {0:?}")]
    ConnectTimeout(Duration),
    /// The request body was cut short: too large (413) or stalled (408).
    #[error("{0}")]
    Body(#[source] BodyError),
    /// The client's request body failed (the client went away or broke its framing).
    #[error("the request body failed: {0}")]
    Client(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The TLS handshake with an `https://` upstream failed, e.g. its certificate is not
    /// trusted (502).
    #[error("TLS with the upstream failed: {0}")]
    Tls(#[source] std::io::Error),
    /// No upstream connection to spare: the process's budget is spent, or the client
    /// connection's shares stayed taken for the connect timeout (503).
    #[error("no upstream connection to spare: {0}")]
    Budget(String),
    /// The upstream connection failed, or the upstream answered what is no HTTP/1.1
    /// response, before a complete response head (502; the byte path's
    /// [`ProxyError::Upstream`]).
    #[error("upstream failed: {0}")]
    Io(#[source] std::io::Error),
}

impl ProxyError {
    /// Whether the connection itself failed (refused, unreachable).
    pub fn is_connect(&self) -> bool {
        matches!(self, ProxyError::Connect(_))
    }

    /// Whether the TLS handshake with the upstream failed (a certificate it could not
    /// verify, a protocol it does not speak).
    pub fn is_tls(&self) -> bool {
        matches!(self, ProxyError::Tls(_))
    }

    /// Whether the client's request body failed (the client closed its side mid-body, or
    /// broke its framing): an error of the client's, not the upstream's. hyper's client
    /// reports it as an error of the body it was sending, caused by the incoming body's.
    pub fn is_client_body(&self) -> bool {
        match self {
            ProxyError::Client(_) => true,
            ProxyError::Upstream(e) => {
                e.is_user()
                    && std::error::Error::source(e)
                        .is_some_and(|cause| cause.downcast_ref::<hyper::Error>().is_some())
            }
            _ => false,
        }
    }

    /// Why the request body was cut short, when that is what failed the request.
    pub fn body_error(&self) -> Option<BodyError> {
        match self {
            ProxyError::Body(cut) => Some(*cut),
            ProxyError::Upstream(e) => BodyError::find(e),
            _ => None,
        }
    }
}

/// Forwards requests to upstreams over pooled HTTP/1.1 connections. Clones share the pool.
pub struct Proxy<B = RequestBody<Incoming>> {
    pool: Arc<Pool<B>>,
}

/// A pooled connection and when it went idle.
type Idle<B> = (SendRequest<B>, Instant);

/// Which connections a pooled one may stand in for: the same authority, over plain TCP
/// (`0`) or over TLS with the same client config ([`Upstream::pool_id`]).
type Key = (Authority, usize);

struct Pool<B> {
    /// Idle HTTP/1.1 connections by upstream, each with when it went idle, the oldest
    /// first; few upstreams, so a list.
    idle: Mutex<Vec<(Key, Vec<Idle<B>>)>>,
    /// The HTTP/2 connection of each `h2c://` upstream, shared by its requests.
    multiplexed: Mutex<Vec<(Authority, http2::SendRequest<B>)>>,
    /// Idle connections of the byte path ([`crate::h1`]), watched for a close.
    raw: Arc<RawPool>,
    /// Timeouts in milliseconds, changed by [`Proxy::set_timeouts`] without a lock.
    connect_ms: AtomicU64,
    idle_ms: AtomicU64,
}

impl<B> Pool<B> {
    fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_ms.load(Ordering::Relaxed))
    }
}

impl<B> std::fmt::Debug for Proxy<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let idle: usize = self.pool.idle.lock().iter().map(|(_, v)| v.len()).sum();
        let raw = self.pool.raw.len();
        f.debug_struct("Proxy")
            .field("idle", &idle)
            .field("raw", &raw)
            .finish()
    }
}

impl<B> Clone for Proxy<B> {
    fn clone(&self) -> Self {
        Proxy {
            pool: Arc::clone(&self.pool),
        }
    }
}

impl<B> Default for Proxy<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn default() -> Self {
        Proxy::new()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether two upstream authorities are the same text. Both sides come from parsed
/// upstream URLs, so the bytes compare; `Authority`'s own `==` folds case byte by byte.
fn same(a: &Authority, b: &Authority) -> bool {
    a.as_str() == b.as_str()
}

/// Whether two pool keys are the same: the transport first (one word), then the text.
fn same_key(a: &Key, authority: &Authority, tls: usize) -> bool {
    a.1 == tls && same(&a.0, authority)
}

/// A pooled connection lent to one request; back to the pool when dropped.
pub struct Lease<B> {
    sender: Option<SendRequest<B>>,
    authority: Authority,
    tls: usize,
    pool: Weak<Pool<B>>,
    /// The client connection's share the request holds, if it carried an [`UpstreamShare`].
    _share: Option<OwnedSemaphorePermit>,
}

impl<B> std::fmt::Debug for Lease<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("upstream", &self.authority)
            .finish_non_exhaustive()
    }
}

impl<B> Drop for Lease<B> {
    fn drop(&mut self) {
        let (Some(sender), Some(pool)) = (self.sender.take(), self.pool.upgrade()) else {
            return;
        };
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut idle = pool.idle.lock();
        match idle
            .iter_mut()
            .find(|(k, _)| same_key(k, &self.authority, self.tls))
        {
            Some((_, list)) if list.len() < MAX_IDLE_PER_UPSTREAM => list.push((sender, now)),
            Some(_) => {}
            None => idle.push(((self.authority.clone(), self.tls), vec![(sender, now)])),
        }
    }
}

impl<B> Proxy<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A proxy with an empty pool.
    pub fn new() -> Proxy<B> {
        Proxy {
            pool: Arc::new(Pool {
                idle: Mutex::new(Vec::new()),
                multiplexed: Mutex::new(Vec::new()),
                raw: RawPool::new(),
                connect_ms: AtomicU64::new(millis(DEFAULT_CONNECT_TIMEOUT)),
                idle_ms: AtomicU64::new(millis(DEFAULT_IDLE_TIMEOUT)),
            }),
        }
    }

    /// How long connecting may take (then [`ProxyError::ConnectTimeout`]), and how long a
    /// connection may stay idle in the pool (then it is no longer used, and
    /// [`Proxy::close_idle`] closes it). Applies from the next request on.
    pub fn set_timeouts(&self, connect: Duration, idle: Duration) {
        self.pool
            .connect_ms
            .store(millis(connect), Ordering::Relaxed);
        self.pool.idle_ms.store(millis(idle), Ordering::Relaxed);
    }

    /// How long connecting to an upstream may take.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.pool.connect_ms.load(Ordering::Relaxed))
    }

    /// Closes the pooled connections idle for longer than the idle timeout, and returns how
    /// many stay pooled. Call it now and then (the gateway: every second per worker). A
    /// connection the upstream closes leaves the pool by itself.
    pub fn close_idle(&self) -> usize {
        let oldest = Instant::now().checked_sub(self.pool.idle_timeout());
        let mut kept = 0;
        for (_, list) in self.pool.idle.lock().iter_mut() {
            list.retain(|(sender, since)| {
                !sender.is_closed() && oldest.is_none_or(|o| *since >= o)
            });
            kept += list.len();
        }
        kept + self.pool.raw.close_idle(oldest)
    }

    /// Forwards `request` from `peer` to `route`'s upstream and returns its response head,
    /// with the body streaming, and the connection's lease: keep it until the body is done.
    ///
    /// # Errors
    ///
    /// [`ProxyError::Connect`] or [`ProxyError::Upstream`] (502), [`ProxyError::Timeout`]
    /// (504).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the upstream request (and closes its connection, if it was
    /// mid-flight).
    pub async fn forward(
        &self,
        request: Request<B>,
        route: &Route,
        peer: IpAddr,
    ) -> Result<(Response<Incoming>, Option<Lease<B>>), ProxyError> {
        let upstream = route.upstream();
        if upstream.protocol() == Protocol::H2c {
            // Boxed: the HTTP/2 exchange's future stays out of every HTTP/1.1 request's.
            return Box::pin(self.forward_h2(request, route, peer)).await;
        }
        let (mut parts, body) = request.into_parts();
        // A policy that settles on a trailer needs the upstream to send it: a chunked
        // HTTP/1.1 answer carries trailers only to a client that said `TE: trailers`.
        h1_upstream_headers(&mut parts.headers, &parts.uri, route, peer);
        let authority = upstream.authority();
        // Origin form on the wire: `GET /path?query HTTP/1.1`.
        parts.uri = Uri::from(upstream.path_for(parts.uri.path_and_query()));
        parts.version = Version::HTTP_11;
        let timeout = route.timeout();
        let tls = upstream.pool_id();
        let share = parts.extensions.remove::<UpstreamShare>();
        let exchange = async {
            // Waits in turn behind the client connection's other requests, if it is shared.
            let share = match share {
                Some(share) => Some(share.take(self.connect_timeout()).await?),
                None => None,
            };
            let mut request = Request::from_parts(parts, body);
            // A pooled connection the upstream closed meanwhile hands the request back
            // unsent: then try a fresh one.
            loop {
                let (mut sender, reused) = match self.checkout(authority, tls) {
                    Some(sender) => (sender, true),
                    // Boxed: the cold path's future stays out of every request's.
                    None => (Box::pin(self.connect(upstream)).await?, false),
                };
                match sender.try_send_request(request).await {
                    Ok(response) => {
                        return Ok((response, Some(self.lease(sender, authority, tls, share))))
                    }
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if reused => request = unsent,
                        _ => return Err(ProxyError::Upstream(e.into_error())),
                    },
                }
            }
        };
        within(timeout, exchange).await
    }

    fn lease(
        &self,
        sender: SendRequest<B>,
        authority: &Authority,
        tls: usize,
        share: Option<OwnedSemaphorePermit>,
    ) -> Lease<B> {
        Lease {
            sender: Some(sender),
            authority: authority.clone(),
            tls,
            pool: Arc::downgrade(&self.pool),
            _share: share,
        }
    }

    /// A socket of the process's budget; when it is spent, closes this proxy's oldest idle
    /// connection to make room, and with none to close refuses.
    fn budget_socket(&self) -> Result<Socket, ProxyError> {
        if let Some(socket) = Socket::take() {
            return Ok(socket);
        }
        // Each list is oldest first.
        let closed = {
            let mut idle = self.pool.idle.lock();
            let oldest = idle
                .iter_mut()
                .filter(|(_, list)| !list.is_empty())
                .min_by_key(|(_, list)| list[0].1);
            oldest.map(|(_, list)| list.remove(0))
        };
        if closed.is_some() {
            return Ok(Socket::instead_of_closing());
        }
        if let Some(conn) = self.pool.raw.take_oldest() {
            // Its socket of the budget goes back as it closes, here: take one in its place.
            drop(conn);
            if let Some(socket) = Socket::take() {
                return Ok(socket);
            }
        }
        budget::refused("total");
        Err(ProxyError::Budget(
            "the gateway holds as many upstream connections as it may (server.max_upstream_connections)".to_owned(),
        ))
    }

    /// [`Proxy::forward`] to an `h2c://` upstream: HTTP/2 with prior knowledge over the
    /// upstream's one connection of this proxy (made at the first request, made again once
    /// it closes). The response body streams, trailers included.
    async fn forward_h2(
        &self,
        request: Request<B>,
        route: &Route,
        peer: IpAddr,
    ) -> Result<(Response<Incoming>, Option<Lease<B>>), ProxyError> {
        let upstream = route.upstream();
        let (mut parts, body) = request.into_parts();
        // `TE: trailers` is the one `TE` HTTP/2 allows, and gRPC servers require it.
        let trailers = parts.headers.get_all(TE).iter().any(|v| {
            v.to_str().is_ok_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
            })
        });
        remove_hop_by_hop(&mut parts.headers);
        if trailers {
            parts
                .headers
                .insert(TE, HeaderValue::from_static("trailers"));
        }
        append_forwarded_for(&mut parts.headers, peer);
        // `:authority` carries the client's host (as `Host` does for HTTP/1.1 upstreams, and
        // chosen the same way); HTTP/2 has no `Host` of its own.
        let named = host_of(&parts.uri, &parts.headers, upstream);
        let host = named.or(parts.headers.remove(HOST));
        let authority = host
            .as_ref()
            .and_then(|h| Authority::try_from(h.as_bytes()).ok())
            .unwrap_or_else(|| upstream.authority().clone());
        let mut uri = http::uri::Parts::default();
        uri.scheme = Some(upstream.scheme());
        uri.authority = Some(authority);
        uri.path_and_query = Some(upstream.path_for(parts.uri.path_and_query()));
        parts.uri = Uri::from_parts(uri)
            .map_err(|e| ProxyError::Client(format!("cannot make the upstream URI: {e}").into()))?;
        parts.version = Version::HTTP_2;
        let timeout = route.timeout();
        let exchange = async {
            let mut request = Request::from_parts(parts, body);
            loop {
                let (mut sender, reused) = match self.multiplexed(upstream.authority()) {
                    Some(sender) => (sender, true),
                    None => (Box::pin(self.connect_h2(upstream)).await?, false),
                };
                match sender.try_send_request(request).await {
                    Ok(response) => return Ok((response, None)),
                    Err(mut e) => match e.take_message() {
                        // The connection closed under it: a new one, once.
                        Some(unsent) if reused => {
                            self.forget_h2(upstream.authority());
                            request = unsent;
                        }
                        _ => return Err(ProxyError::Upstream(e.into_error())),
                    },
                }
            }
        };
        within(timeout, exchange).await
    }

    /// The open HTTP/2 connection to `authority`, if any.
    fn multiplexed(&self, authority: &Authority) -> Option<http2::SendRequest<B>> {
        let mut list = self.pool.multiplexed.lock();
        let at = list.iter().position(|(a, _)| same(a, authority))?;
        if list[at].1.is_closed() {
            list.swap_remove(at);
            return None;
        }
        Some(list[at].1.clone())
    }

    fn forget_h2(&self, authority: &Authority) {
        self.pool
            .multiplexed
            .lock()
            .retain(|(a, s)| !same(a, authority) && !s.is_closed());
    }

    /// A new HTTP/2 connection to `upstream`, kept for the next requests.
    async fn connect_h2(&self, upstream: &Upstream) -> Result<http2::SendRequest<B>, ProxyError> {
        let stream = self.connect_tcp(upstream).await?;
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            // A dead upstream (no FIN) is noticed rather than holding its streams forever.
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(20))
            .keep_alive_while_idle(false);
        let (sender, connection) = builder
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ProxyError::Upstream)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
            }
        });
        let mut list = self.pool.multiplexed.lock();
        list.retain(|(a, s)| !same(a, upstream.authority()) && !s.is_closed());
        list.push((upstream.authority().clone(), sender.clone()));
        Ok(sender)
    }

    /// An idle connection to `authority` that is ready now and has not been idle for longer
    /// than the idle timeout, if any (the most recently used first).
    fn checkout(&self, authority: &Authority, tls: usize) -> Option<SendRequest<B>> {
        let mut idle = self.pool.idle.lock();
        let (_, list) = idle.iter_mut().find(|(k, _)| same_key(k, authority, tls))?;
        let mut busy = Vec::new();
        let mut found = None;
        let mut oldest = None;
        while let Some((mut sender, since)) = list.pop() {
            if sender.is_closed() {
                continue;
            }
            // The clock is read only when there is a connection to judge.
            let oldest =
                *oldest.get_or_insert_with(|| Instant::now().checked_sub(self.pool.idle_timeout()));
            if oldest.is_some_and(|o| since < o) {
                // Idle too long: the upstream (or a firewall) may have dropped it silently.
                continue;
            }
            match sender.ready().now_or_never() {
                Some(Ok(())) => {
                    found = Some(sender);
                    break;
                }
                Some(Err(_)) => continue,
                // Still finishing its last exchange: keep it for later.
                None => busy.push((sender, since)),
            }
        }
        list.extend(busy);
        found
    }

    /// A TCP connection to `upstream`, within the connect timeout, and its socket of the
    /// budget: keep it as long as the connection.
    async fn connect_tcp(&self, upstream: &Upstream) -> Result<Budgeted<TcpStream>, ProxyError> {
        let socket = self.budget_socket()?;
        let host = upstream
            .authority()
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let connecting = TcpStream::connect((host, upstream.port()));
        let limit = Duration::from_millis(self.pool.connect_ms.load(Ordering::Relaxed));
        let stream = match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(ProxyError::Connect(e)),
            Err(_) => return Err(ProxyError::ConnectTimeout(limit)),
        };
        let _ = stream.set_nodelay(true);
        Ok(Budgeted::new(stream, socket))
    }

    /// A new HTTP/1.1 connection to `upstream`: over TCP, or TLS for `https://` (the TLS
    /// handshake within the connect timeout too).
    async fn connect(&self, upstream: &Upstream) -> Result<SendRequest<B>, ProxyError> {
        let stream = self.connect_tcp(upstream).await?;
        let Some(tls) = upstream.tls() else {
            return self.handshake(stream).await;
        };
        let host = upstream
            .authority()
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
            ProxyError::Tls(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        })?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
        let limit = Duration::from_millis(self.pool.connect_ms.load(Ordering::Relaxed));
        let stream = match tokio::time::timeout(limit, connector.connect(name, stream)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(ProxyError::Tls(e)),
            Err(_) => return Err(ProxyError::ConnectTimeout(limit)),
        };
        self.handshake(stream).await
    }

    async fn handshake<T>(&self, stream: T) -> Result<SendRequest<B>, ProxyError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let (sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ProxyError::Upstream)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

impl<B> Proxy<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// An idle byte-path connection to `authority` that has not been idle for longer than
    /// the idle timeout, if any (the most recently used first).
    pub(crate) fn checkout_raw(&self, authority: &Authority) -> Option<RawConn> {
        self.pool.raw.checkout(authority, self.pool.idle_timeout())
    }

    /// Pools a byte-path connection whose last exchange ended cleanly.
    pub(crate) fn checkin_raw(&self, authority: &Authority, conn: RawConn) {
        self.pool.raw.checkin(authority, conn);
    }

    /// A new byte-path connection to an `http://` upstream.
    pub(crate) async fn connect_raw(&self, upstream: &Upstream) -> Result<RawConn, ProxyError> {
        Ok(RawConn::new(self.connect_tcp(upstream).await?))
    }
}

/// The headers of a request going to an HTTP/1.1 upstream: without the hop-by-hop ones, with
/// `TE: trailers` when a policy of the route settles on a trailer, the peer at the end of
/// `X-Forwarded-For`, and the `Host` of [`host_of`].
pub(crate) fn h1_upstream_headers(
    headers: &mut http::HeaderMap,
    uri: &Uri,
    route: &Route,
    peer: IpAddr,
) {
    remove_hop_by_hop(headers);
    if route.reads_trailers() {
        headers.insert(TE, HeaderValue::from_static("trailers"));
    }
    append_forwarded_for(headers, peer);
    if let Some(host) = host_of(uri, headers, route.upstream()) {
        headers.insert(HOST, host);
    }
}

/// The host a request names, when it is not its `Host` field as it came: the URI's authority
/// first (an absolute-form target, whose host replaces the client's `Host`, RFC 9112 §3.2.2;
/// an HTTP/2 client's `:authority`, RFC 9113 §8.3.1), else the `Host` field, else the
/// upstream's authority. `None`: the `Host` field stands.
fn host_of(uri: &Uri, headers: &http::HeaderMap, upstream: &Upstream) -> Option<HeaderValue> {
    let authority = match uri.authority() {
        Some(a) => a,
        None if headers.contains_key(HOST) => return None,
        None => upstream.authority(),
    };
    HeaderValue::from_str(authority.as_str()).ok()
}

/// The upstream's answer to `exchange` if it came within `timeout`, without its hop-by-hop
/// headers, and of the gateway's own HTTP version: an intermediary sends its own (RFC 9110
/// §6.2), as the byte path does, not an HTTP/1.0 upstream's.
async fn within<B>(
    timeout: Duration,
    exchange: impl std::future::Future<
        Output = Result<(Response<Incoming>, Option<Lease<B>>), ProxyError>,
    >,
) -> Result<(Response<Incoming>, Option<Lease<B>>), ProxyError> {
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok((mut response, lease))) => {
            if response.version() == Version::HTTP_10 {
                *response.version_mut() = Version::HTTP_11;
            }
            let headers = response.headers_mut();
            // A length beside a transfer coding is stale (RFC 9112 §6.3): hyper reads the
            // body by the coding, and the answer goes on without the length (kept, it would
            // promise the client a body of another size).
            if headers.contains_key(TRANSFER_ENCODING) {
                headers.remove(CONTENT_LENGTH);
            }
            remove_hop_by_hop(headers);
            Ok((response, lease))
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ProxyError::Timeout(timeout)),
    }
}
