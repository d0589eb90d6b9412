//! The gateway handler: route, admit, forward, and label the response.
//!
//! One file, past 700 lines: `decide` (the one decision both paths share) and `handle_as`
//! (hyper's forwarding around it) read as one sequence; the gateway's own answers are in
//! `answer.rs`, the byte path's forwarding in `h1/`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    HeaderValue, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE, SEC_WEBSOCKET_ACCEPT,
    SEC_WEBSOCKET_EXTENSIONS, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_VERSION,
    TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::Full;

mod answer;

pub(crate) use answer::{answered, failure};
use answer::{refusal, too_large};

use crate::admit::{admit_as, Admission, Ask, Reason};
use crate::body::{Body, BodyError, ReadTimeout, RequestBody};
use crate::client_ip::{TrustedProxies, FORWARDED};
use crate::cost::meter::{Meter, RequestBytes};
use crate::cost::settle::{settle_all, Observed};
use crate::grpc;
use crate::headers;
use crate::path::canonical_uri;
use crate::protocol::{Connect, Protocol};
use crate::proxy::{self, Proxy, ProxyError};
use crate::route::{Lookup, Route, RouteTable};
use crate::tunnel;
use crate::websocket;

/// What happened to a request, for the access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// Admitted (or unlimited) and answered by the upstream.
    Admitted,
    /// Answered by the upstream, though `policy`, in shadow mode, would have denied it for
    /// `reason` (the first such policy).
    ShadowDenied {
        /// The policy's name.
        policy: &'a str,
        /// Why it would have denied.
        reason: Reason,
    },
    /// Denied by `policy` for `reason`.
    Denied {
        /// The policy's name.
        policy: &'a str,
        /// Why.
        reason: Reason,
    },
    /// No route matched (404).
    NoRoute,
    /// A route matched the path but not the method (405).
    MethodNotAllowed,
    /// Admitted, but the upstream refused or failed (502).
    UpstreamRefused,
    /// Admitted, but the upstream did not answer in time (504).
    UpstreamTimeout,
    /// Admitted, but no upstream connection to spare: the process's budget, or the client
    /// connection's share of it, is in use (503).
    UpstreamBusy,
    /// Some upstreams would read the path as another one (400; see [`crate::path`]).
    AmbiguousPath,
    /// More than one `Host` field (400; RFC 9112 §3.2): which host is meant is not sure.
    AmbiguousHost,
    /// The request body is larger than the route's `max_body` (413).
    BodyTooLarge,
    /// The request body stalled for longer than `client_body_timeout` (408).
    BodyTimeout,
    /// The client's request body failed before it was forwarded (400).
    BodyFailed,
}

impl Outcome<'_> {
    /// Whether the response is the upstream's (admitted, or admitted though a shadow policy
    /// would have denied it) rather than one the gateway wrote itself.
    pub fn is_upstream_answer(&self) -> bool {
        matches!(self, Outcome::Admitted | Outcome::ShadowDenied { .. })
    }
}

impl fmt::Display for Outcome<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Admitted => f.write_str("admitted"),
            Outcome::ShadowDenied { .. } => f.write_str("shadow-denied"),
            Outcome::Denied { reason, .. } => write!(f, "denied:{reason}"),
            Outcome::NoRoute => f.write_str("no_route"),
            Outcome::MethodNotAllowed => f.write_str("method_not_allowed"),
            Outcome::UpstreamRefused => f.write_str("upstream_refused"),
            Outcome::UpstreamTimeout => f.write_str("upstream_timeout"),
            Outcome::UpstreamBusy => f.write_str("upstream_busy"),
            Outcome::AmbiguousPath => f.write_str("ambiguous_path"),
            Outcome::AmbiguousHost => f.write_str("ambiguous_host"),
            Outcome::BodyTooLarge => f.write_str("body_too_large"),
            Outcome::BodyTimeout => f.write_str("body_timeout"),
            Outcome::BodyFailed => f.write_str("body_failed"),
        }
    }
}

/// A handled request: the response and what happened.
#[derive(Debug)]
pub struct Handled<'a, B = hyper::body::Incoming> {
    /// The response.
    pub response: Response<Body<RequestBody<B>>>,
    /// The route that matched.
    pub route: Option<&'a Route>,
    /// The client address the policies saw.
    pub client_ip: IpAddr,
    /// What happened.
    pub outcome: Outcome<'a>,
}

/// Routes and policies as one request handler, forwarding through a [`Proxy`] given per
/// call (so that each worker thread can keep its own connection pool, and the pools outlive
/// reloads).
#[derive(Debug, Clone)]
pub struct Gateway {
    routes: RouteTable,
    /// Every route's requests may take the byte path ([`Route::takes_bytes`]): then a
    /// request needs no route lookup to know it (its decision does one).
    pub(crate) all_take_bytes: bool,
    /// Some route has a policy whose reservation is read from the request body.
    pub(crate) reads_body: bool,
    pub(crate) trusted: TrustedProxies,
    pub(crate) body_timeout: Option<Duration>,
    upstream_read: Option<Duration>,
    tunnel_idle: Option<Duration>,
}

/// How much of a request body is read before the request is forwarded (and takes an
/// upstream connection): a body that ends within it is checked whole (size, gaps) before the
/// upstream sees a byte, and one that stalls within it holds no upstream connection.
pub const READ_AHEAD: u64 = 64 * 1024;

/// The longest upstream answer to an HTTP/2 stream (by its declared length) read whole
/// before it is sent, as nginx's `proxy_buffers` hold one: its upstream connection is free
/// again while the client takes it. A longer answer, or one of unknown length, streams.
pub const READ_SMALL_ANSWER: u64 = 64 * 1024;

impl Gateway {
    /// A gateway over `routes`, believing `X-Forwarded-For` from `trusted`, with no limit on
    /// the gaps in a request body or in an upstream's answer body.
    pub fn new(routes: RouteTable, trusted: TrustedProxies) -> Gateway {
        Gateway {
            all_take_bytes: routes.routes().iter().all(|r| r.takes_bytes()),
            reads_body: routes.routes().iter().any(|r| reserves_from_body(r)),
            routes,
            trusted,
            body_timeout: None,
            upstream_read: None,
            tunnel_idle: None,
        }
    }

    /// The longest gap between two reads of a request body; then 408.
    pub fn client_body_timeout(mut self, timeout: Duration) -> Gateway {
        self.body_timeout = Some(timeout);
        self
    }

    /// The longest gap between two reads of an upstream's answer body (nginx's
    /// `proxy_read_timeout`); then the answer, already begun, fails, and the client connection
    /// closes (an HTTP/2 stream is reset).
    pub fn upstream_read_timeout(mut self, timeout: Duration) -> Gateway {
        self.upstream_read = Some(timeout);
        self
    }

    /// The longest gap between two reads of an upstream's answer body, if any.
    pub(crate) fn upstream_read(&self) -> Option<Duration> {
        self.upstream_read
    }

    /// How long an upgraded connection (a WebSocket tunnel) may pass no byte either way
    /// before it is closed (unset: no limit).
    pub fn tunnel_idle_timeout(mut self, timeout: Duration) -> Gateway {
        self.tunnel_idle = Some(timeout);
        self
    }

    /// The routes.
    pub fn routes(&self) -> &RouteTable {
        &self.routes
    }

    /// The trusted proxies.
    pub fn trusted_proxies(&self) -> &TrustedProxies {
        &self.trusted
    }

    /// Handles one request from `peer`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves any queue and drops the upstream request.
    pub async fn handle<B>(
        &self,
        proxy: &Proxy<RequestBody<B>>,
        request: Request<B>,
        peer: SocketAddr,
    ) -> Handled<'_, B>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // Decided once: the metrics' label, and whether refusals are gRPC statuses.
        let protocol = Protocol::of(&request);
        if protocol != Protocol::Grpc {
            return self.handle_as(proxy, request, peer, protocol).await;
        }
        // A gRPC-Web client reads the gateway's Trailers-Only answer in its own content
        // type family (`application/grpc-web…`, `application/grpc-web-text…`).
        let web = request
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|ct| grpc::web_content_type(ct.as_bytes()));
        let mut handled = self.handle_as(proxy, request, peer, protocol).await;
        if let Some(web) = web {
            // The gateway's own answers only: the upstream's keep its headers.
            if !handled.outcome.is_upstream_answer() {
                handled.response.headers_mut().insert(CONTENT_TYPE, web);
            }
        }
        handled
    }

    /// [`Gateway::handle`] for a request of `protocol`.
    async fn handle_as<B>(
        &self,
        proxy: &Proxy<RequestBody<B>>,
        request: Request<B>,
        peer: SocketAddr,
        protocol: Protocol,
    ) -> Handled<'_, B>
    where
        B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let multiplexed = request.version() == Version::HTTP_2;
        // The body's limit is the route's, set once the route is known.
        let mut request = request.map(|body| RequestBody::new(body, u64::MAX, self.body_timeout));
        // A reservation computed from the body: read it whole (within the route's max_body,
        // timed between reads) before any policy decides.
        let mut whole = None;
        if self.reads_body && protocol != Protocol::Grpc && protocol != Protocol::Ws {
            // A declared length above the limit is refused by `decide` without reading.
            let route = self
                .route_reading_body(&request)
                .filter(|r| declared_length(request.headers()).is_none_or(|n| n <= r.body_limit()));
            if let Some(route) = route {
                let limit = route.body_limit();
                request.body_mut().set_limit(limit);
                if let Err(e) = request.body_mut().read_ahead(limit.saturating_add(1)).await {
                    let e = match BodyError::find(&*e) {
                        Some(cut) => ProxyError::Body(cut),
                        None => ProxyError::Client(e),
                    };
                    let (response, outcome) = failure(route, protocol, &e);
                    return Handled {
                        response: response.map(Body::from),
                        route: Some(route),
                        client_ip: self.trusted.client_ip(peer.ip(), request.headers()),
                        outcome,
                    };
                }
                whole = request.body().read_whole();
            }
        }
        let admitted = match self
            .decide(&mut request, peer, protocol, whole.as_deref())
            .await
        {
            Decided::Answer(answer) => {
                return Handled {
                    response: answer.response.map(Body::from),
                    route: answer.route,
                    client_ip: answer.client_ip,
                    outcome: answer.outcome,
                }
            }
            Decided::Forward(admitted) => admitted,
        };
        let Admitted {
            route,
            client_ip,
            admission,
            policy_header,
        } = admitted;
        let mut owed = admission.owed;
        // A body whose length is a policy's cost, counted as it goes upstream.
        let request_bytes = owed
            .iter()
            .any(|o| o.counts_request_body)
            .then(RequestBytes::default);
        let max_body = route.body_limit();
        let forwarded = if protocol == Protocol::Ws {
            // A tunnel has no end to settle at: its estimates stand.
            settle_all(std::mem::take(&mut owed), &Observed::default());
            self.upgrade(proxy, request, route, peer, admission.permits)
                .await
        } else {
            request.body_mut().set_limit(max_body);
            let mut request = request.map(|body| match &request_bytes {
                Some(counter) => body.counted(Arc::clone(counter)),
                None => body,
            });
            let body = request.body_mut();
            // A gRPC call's request body is a stream of messages whose sender may wait for
            // answers before it sends more (client and bidirectional streaming): it goes
            // upstream as it comes, still cut at max_body and timed between reads.
            let checked = if protocol != Protocol::Grpc && !http_body::Body::is_end_stream(body) {
                // Up to READ_AHEAD of any body is read before the request takes an upstream
                // connection, as nginx reads a body before it connects: a small body is
                // checked whole (size, gaps) before the upstream sees a byte, and a body that
                // does not come holds no upstream connection while it stalls (it is answered
                // 408 at client_body_timeout without reaching one).
                body.read_ahead(READ_AHEAD.min(max_body.saturating_add(1)))
                    .await
                    .err()
            } else {
                None
            };
            match checked {
                None => proxy
                    .forward(request, route, peer.ip())
                    .await
                    .map(|(response, lease)| {
                        let meter = if owed.is_empty() {
                            None
                        } else {
                            let owed = std::mem::take(&mut owed);
                            Meter::start(owed, response.headers(), request_bytes.clone())
                        };
                        let read = self
                            .upstream_read
                            .map(|gap| ReadTimeout::new(route, protocol, gap));
                        response.map(|body| {
                            Body::upstream(body, admission.permits, lease)
                                .metered(meter)
                                .read_timeout(read)
                        })
                    }),
                Some(e) => Err(match BodyError::find(&*e) {
                    Some(cut) => ProxyError::Body(cut),
                    None => ProxyError::Client(e),
                }),
            }
        };
        if !owed.is_empty() {
            // No upstream answer to read: the estimates stand (a body's length, as far as it
            // was read, is still known).
            let request_bytes = request_bytes.map_or(0, |n| n.load(Ordering::Relaxed));
            settle_all(
                owed,
                &Observed {
                    request_bytes,
                    ..Observed::default()
                },
            );
        }
        // A small answer to an HTTP/2 stream is read whole before it is sent, freeing its
        // upstream connection from a client slow to take it: a stream's flow-control window
        // holds the answer in the gateway, where over HTTP/1.1 the socket's send buffer takes
        // a small one at once. (A gRPC answer streams with its trailers, a tunnel has none.)
        let forwarded = match forwarded {
            Ok(response)
                if multiplexed && protocol != Protocol::Grpc && protocol != Protocol::Ws =>
            {
                let (head, body) = response.into_parts();
                Ok(Response::from_parts(
                    head,
                    body.read_small(READ_SMALL_ANSWER).await,
                ))
            }
            other => other,
        };
        let (mut response, outcome) = match forwarded {
            Ok(response) => {
                let outcome =
                    answered(route, &admission.shadow_denied, response.status(), protocol);
                (response, outcome)
            }
            Err(e) => {
                let (response, outcome) = failure(route, protocol, &e);
                (response.map(Body::from), outcome)
            }
        };
        headers::insert(
            response.headers_mut(),
            policy_header.as_ref(),
            route.policy_list(),
            &admission.verdicts,
        );
        Handled {
            response,
            route: Some(route),
            client_ip,
            outcome,
        }
    }

    /// Everything before forwarding: the method (an extended `CONNECT` becomes the
    /// WebSocket's `GET`), the canonical path, the route, the declared body size, and the
    /// route's policies. `request` leaves with its canonical URI and, unless its peer is a
    /// trusted proxy, without `Forwarded`.
    /// `body`: the whole request body, when it was read for a reservation computed from it.
    pub(crate) async fn decide<B>(
        &self,
        request: &mut Request<B>,
        peer: SocketAddr,
        protocol: Protocol,
        body: Option<&[u8]>,
    ) -> Decided<'_> {
        let client_ip = self.trusted.client_ip(peer.ip(), request.headers());
        let answer = |response, route, outcome| {
            Decided::Answer(Answer {
                response,
                route,
                client_ip,
                outcome,
            })
        };
        if request.method() == Method::CONNECT {
            // The gateway is no forward proxy: it tunnels WebSocket only (RFC 8441), which it
            // routes and forwards as the HTTP/1.1 upgrade's GET.
            let (status, detail) = match Connect::of(request) {
                Connect::WebSocket => {
                    *request.method_mut() = Method::GET;
                    (StatusCode::OK, "")
                }
                Connect::OtherProtocol => (
                    StatusCode::NOT_IMPLEMENTED,
                    "extended CONNECT is supported for the websocket protocol only",
                ),
                Connect::Plain => (
                    StatusCode::METHOD_NOT_ALLOWED,
                    "CONNECT is not allowed: this is a reverse proxy",
                ),
            };
            if status != StatusCode::OK {
                return answer(
                    refusal(protocol, status, detail),
                    None,
                    Outcome::MethodNotAllowed,
                );
            }
        }
        if ambiguous_host(request.headers()) {
            return answer(
                refusal(
                    protocol,
                    StatusCode::BAD_REQUEST,
                    "the request has more than one Host field",
                ),
                None,
                Outcome::AmbiguousHost,
            );
        }
        // Routed by, and forwarded with, the canonical path: `/free/../api/x` is `/api/x`.
        match canonical_uri(request.uri()) {
            Ok(None) => {}
            Ok(Some(uri)) => *request.uri_mut() = uri,
            Err(e) => {
                return answer(
                    refusal(protocol, StatusCode::BAD_REQUEST, &e.to_string()),
                    None,
                    Outcome::AmbiguousPath,
                )
            }
        }
        let route: &Route = match self.routes.find(request.method(), request.uri().path()) {
            Lookup::Found(route) => route,
            Lookup::NotFound => {
                return answer(
                    refusal(
                        protocol,
                        StatusCode::NOT_FOUND,
                        "no route matches this path",
                    ),
                    None,
                    Outcome::NoRoute,
                )
            }
            Lookup::MethodNotAllowed => {
                return answer(
                    refusal(
                        protocol,
                        StatusCode::METHOD_NOT_ALLOWED,
                        "no route for this path allows this method",
                    ),
                    None,
                    Outcome::MethodNotAllowed,
                )
            }
        };
        let max_body = route.body_limit();
        if declared_length(request.headers()).is_some_and(|len| len > max_body) {
            route.metrics.body_too_large[protocol as usize].increment(1);
            return answer(
                too_large(protocol, max_body),
                Some(route),
                Outcome::BodyTooLarge,
            );
        }
        let ask = Ask {
            headers: request.headers(),
            uri: request.uri(),
            client_ip: Some(client_ip),
            cost: 1,
            may_wait: body_may_wait(request.headers(), route.max_queued_body()),
            from_trusted_proxy: self.trusted.contains(peer.ip()),
            body,
        };
        // A policy with plans or per-key quotas shows the quota that decides this request.
        let policy_header = headers::policy_header_for(route.policy_list(), &ask)
            .or_else(|| route.policy_header().cloned());
        let admission = match admit_as(route.policy_list(), &ask, protocol).await {
            Ok(admission) => admission,
            Err(denial) => {
                let policies = route.policy_list();
                let outcome = Outcome::Denied {
                    policy: denial.policy(policies).name(),
                    reason: denial.reason,
                };
                let response = if protocol == Protocol::Grpc {
                    grpc::denied(&denial, policies, policy_header.as_ref())
                } else {
                    headers::denied(&denial, policies, policy_header.as_ref())
                };
                return answer(response, Some(route), outcome);
            }
        };
        if !self.trusted.contains(peer.ip()) {
            // Only a trusted proxy's `Forwarded` is passed on: a client's could make the
            // upstream believe any address.
            request.headers_mut().remove(&FORWARDED);
        }
        Decided::Forward(Admitted {
            route,
            client_ip,
            admission,
            policy_header,
        })
    }
}

/// Whether a policy of `route` reads its reservation from the request body.
fn reserves_from_body(route: &Route) -> bool {
    route
        .policy_list()
        .iter()
        .any(|p| p.cost().is_some_and(|c| c.from_body.is_some()))
}

impl Gateway {
    /// The route of `request` (by its canonical path) if one of its policies reads its
    /// reservation from the body. A path that does not canonicalise is refused by
    /// [`Gateway::decide`] without reading anything.
    pub(crate) fn route_reading_body<B>(&self, request: &Request<B>) -> Option<&Route> {
        let uri = canonical_uri(request.uri()).ok()?;
        let path = uri.as_ref().unwrap_or(request.uri()).path();
        match self.routes.find(request.method(), path) {
            Lookup::Found(route) if reserves_from_body(route) => Some(route),
            _ => None,
        }
    }
}

/// What [`Gateway::decide`] made of a request.
// Decided once per request and taken apart at once.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Decided<'a> {
    /// The gateway answers it itself (no route, denied, ...).
    Answer(Answer<'a>),
    /// Every policy admitted it: forward it.
    Forward(Admitted<'a>),
}

/// An answer the gateway writes itself.
pub(crate) struct Answer<'a> {
    pub(crate) response: Response<Full<Bytes>>,
    pub(crate) route: Option<&'a Route>,
    pub(crate) client_ip: IpAddr,
    pub(crate) outcome: Outcome<'a>,
}

/// A request every policy of its route admitted.
pub(crate) struct Admitted<'a> {
    pub(crate) route: &'a Route,
    pub(crate) client_ip: IpAddr,
    pub(crate) admission: Admission,
    /// The `RateLimit-Policy` value of the answer.
    pub(crate) policy_header: Option<HeaderValue>,
}

impl Gateway {
    /// Forwards an admitted upgrade request; on the upstream's `101`, starts the tunnel
    /// between the two upgraded connections ([`crate::tunnel`]), which holds `permits` until
    /// it closes, and answers the client's upgrade with the `101`. Any other answer is passed
    /// on as a plain response.
    ///
    /// An HTTP/2 extended `CONNECT` (RFC 8441, routed as a `GET`) is sent to the upstream as
    /// an HTTP/1.1 upgrade with a key of the gateway's, whose `Sec-WebSocket-Accept` is
    /// checked (a wrong one is a 502); the stream is answered `200` with the upstream's
    /// `Sec-WebSocket-Protocol` and `Sec-WebSocket-Extensions`, and becomes the client's side
    /// of the tunnel.
    async fn upgrade<B, X>(
        &self,
        proxy: &Proxy<X>,
        request: Request<B>,
        route: &Route,
        peer: SocketAddr,
        permits: Vec<sluice::PoolPermit>,
    ) -> Result<Response<Body<X>>, ProxyError>
    where
        X: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
        X::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let (mut parts, _body) = request.into_parts();
        let client = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        let hold = parts.extensions.remove::<tunnel::Hold>();
        let key = (parts.version == Version::HTTP_2).then(|| {
            let key = websocket::new_key();
            let h = &mut parts.headers;
            h.insert(UPGRADE, HeaderValue::from_static("websocket"));
            h.insert(CONNECTION, HeaderValue::from_static("upgrade"));
            h.insert(SEC_WEBSOCKET_KEY, key.clone());
            h.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
            parts.extensions.remove::<hyper::ext::Protocol>();
            key
        });
        let mut response =
            proxy::forward_upgrade(parts, route, peer.ip(), proxy.connect_timeout()).await?;
        match client {
            Some(client) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                if let Some(key) = &key {
                    let expected = websocket::accept(key.as_bytes());
                    if response
                        .headers()
                        .get(SEC_WEBSOCKET_ACCEPT)
                        .map(|v| v.as_bytes())
                        != Some(expected.as_bytes())
                    {
                        return Err(ProxyError::Connect(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            "the upstream's Sec-WebSocket-Accept does not answer its key",
                        )));
                    }
                }
                let upstream = hyper::upgrade::on(&mut response);
                tokio::spawn(tunnel::run(
                    client,
                    upstream,
                    permits,
                    self.tunnel_idle,
                    route.metrics.tunnels.clone(),
                    hold,
                ));
                if key.is_none() {
                    return Ok(response.map(|_| Body::empty()));
                }
                let mut ok = Response::new(Body::empty());
                for name in [SEC_WEBSOCKET_PROTOCOL, SEC_WEBSOCKET_EXTENSIONS] {
                    for value in response.headers().get_all(&name) {
                        ok.headers_mut().append(name.clone(), value.clone());
                    }
                }
                Ok(ok)
            }
            _ => {
                let read = self
                    .upstream_read
                    .map(|gap| ReadTimeout::new(route, Protocol::Ws, gap));
                Ok(response.map(|body| Body::upstream(body, permits, None).read_timeout(read)))
            }
        }
    }
}

/// Whether a request has more than one `Host` field: a server must refuse it (400, RFC 9112
/// §3.2), as nginx and HAProxy do; an upstream could read either.
pub fn ambiguous_host(headers: &HeaderMap) -> bool {
    let mut hosts = headers.get_all(http::header::HOST).iter();
    hosts.next().is_some() && hosts.next().is_some()
}

/// The body length a request's `Content-Length` declares (hyper has refused a malformed one;
/// an unreadable value declares none). A request declaring more than its route's
/// [`Route::body_limit`] is answered 413 before any policy is asked.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Whether a request with these headers may wait in a queue: a body of known length up to
/// `max` (a route's [`Route::max_queued_body`]), or none at all.
pub fn body_may_wait(headers: &HeaderMap, max: u64) -> bool {
    if headers.contains_key(TRANSFER_ENCODING) {
        return false;
    }
    match headers.get(CONTENT_LENGTH) {
        None => true,
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .is_some_and(|len| len <= max),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_that_may_wait() {
        let mut h = HeaderMap::new();
        assert!(body_may_wait(&h, 0));
        h.insert(CONTENT_LENGTH, "65536".parse().unwrap());
        assert!(body_may_wait(&h, 65536));
        assert!(!body_may_wait(&h, 65535));
        h.insert(CONTENT_LENGTH, "junk".parse().unwrap());
        assert!(!body_may_wait(&h, 65536));
        let mut h = HeaderMap::new();
        h.insert(TRANSFER_ENCODING, "chunked".parse().unwrap());
        assert!(!body_may_wait(&h, u64::MAX));
    }
}
