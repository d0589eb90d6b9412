//! The upstream client: HTTP/1.1 connections kept in a small pool per [`Proxy`].
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
use http::header::HOST;
use http::uri::Authority;
use http::{HeaderValue, Request, Response, Uri, Version};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::{BodyError, RequestBody};
use crate::proxy::forward::{append_forwarded_for, remove_hop_by_hop};
use crate::route::Route;

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
}

impl ProxyError {
    /// Whether the connection itself failed (refused, unreachable).
    pub fn is_connect(&self) -> bool {
        matches!(self, ProxyError::Connect(_))
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

struct Pool<B> {
    /// Idle connections by upstream, each with when it went idle, the oldest first; few
    /// upstreams, so a list.
    idle: Mutex<Vec<(Authority, Vec<Idle<B>>)>>,
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
        f.debug_struct("Proxy").field("idle", &idle).finish()
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

/// A pooled connection lent to one request; back to the pool when dropped.
pub struct Lease<B> {
    sender: Option<SendRequest<B>>,
    authority: Authority,
    pool: Weak<Pool<B>>,
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
        match idle.iter_mut().find(|(a, _)| same(a, &self.authority)) {
            Some((_, list)) if list.len() < MAX_IDLE_PER_UPSTREAM => list.push((sender, now)),
            Some(_) => {}
            None => idle.push((self.authority.clone(), vec![(sender, now)])),
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
    /// many stay pooled. Call it now and then (the gateway: every second per worker).
    pub fn close_idle(&self) -> usize {
        let oldest = Instant::now().checked_sub(self.pool.idle_timeout());
        let mut idle = self.pool.idle.lock();
        let mut kept = 0;
        for (_, list) in idle.iter_mut() {
            list.retain(|(sender, since)| {
                !sender.is_closed() && oldest.is_none_or(|o| *since >= o)
            });
            kept += list.len();
        }
        kept
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
    ) -> Result<(Response<Incoming>, Lease<B>), ProxyError> {
        let (mut parts, body) = request.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        append_forwarded_for(&mut parts.headers, peer);
        let upstream = route.upstream();
        let authority = upstream.authority();
        if !parts.headers.contains_key(HOST) {
            if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(HOST, host);
            }
        }
        // Origin form on the wire: `GET /path?query HTTP/1.1`.
        parts.uri = Uri::from(upstream.path_for(parts.uri.path_and_query()));
        parts.version = Version::HTTP_11;
        let timeout = route.timeout();
        let exchange = async {
            let mut request = Request::from_parts(parts, body);
            // A pooled connection the upstream closed meanwhile hands the request back
            // unsent: then try a fresh one.
            loop {
                let (mut sender, reused) = match self.checkout(authority) {
                    Some(sender) => (sender, true),
                    None => (self.connect(authority).await?, false),
                };
                match sender.try_send_request(request).await {
                    Ok(response) => return Ok((response, self.lease(sender, authority))),
                    Err(mut e) => match e.take_message() {
                        Some(unsent) if reused => request = unsent,
                        _ => return Err(ProxyError::Upstream(e.into_error())),
                    },
                }
            }
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok((mut response, lease))) => {
                remove_hop_by_hop(response.headers_mut());
                Ok((response, lease))
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ProxyError::Timeout(timeout)),
        }
    }

    fn lease(&self, sender: SendRequest<B>, authority: &Authority) -> Lease<B> {
        Lease {
            sender: Some(sender),
            authority: authority.clone(),
            pool: Arc::downgrade(&self.pool),
        }
    }

    /// An idle connection to `authority` that is ready now and has not been idle for longer
    /// than the idle timeout, if any (the most recently used first).
    fn checkout(&self, authority: &Authority) -> Option<SendRequest<B>> {
        let mut idle = self.pool.idle.lock();
        let (_, list) = idle.iter_mut().find(|(a, _)| same(a, authority))?;
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

    async fn connect(&self, authority: &Authority) -> Result<SendRequest<B>, ProxyError> {
        let port = authority.port_u16().unwrap_or(80);
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let connecting = TcpStream::connect((host, port));
        let limit = Duration::from_millis(self.pool.connect_ms.load(Ordering::Relaxed));
        let stream = match tokio::time::timeout(limit, connecting).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(ProxyError::Connect(e)),
            Err(_) => return Err(ProxyError::ConnectTimeout(limit)),
        };
        let _ = stream.set_nodelay(true);
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
