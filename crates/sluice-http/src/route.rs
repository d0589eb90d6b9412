//! The route table: the longest matching `path_prefix` wins, optionally per method, and
//! every route names an upstream and the policies that must all admit.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use http::header::HeaderValue;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Uri};

use crate::metrics::RouteMetrics;
use crate::policy::Policy;

/// The default time to wait for an upstream's response head.
pub const DEFAULT_UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a route's requests go: `http://host:port[/base]` (HTTP/1.1, pooled),
/// `https://host:port[/base]` (HTTP/1.1 over TLS, pooled) or `h2c://host:port[/base]`
/// (HTTP/2 with prior knowledge, one multiplexed connection). The request's path and query are
/// appended to the base path.
#[derive(Debug, Clone)]
pub struct Upstream {
    protocol: Protocol,
    authority: Authority,
    base: String,
    /// The TLS client config of `https://`, and a number no other config ever gets (which
    /// pooled connections it may use: those made with this very config).
    tls: Option<(Arc<rustls::ClientConfig>, usize)>,
}

/// How a route talks to its upstream, decided once when the route is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http://`: HTTP/1.1 over TCP.
    Http1,
    /// `https://`: HTTP/1.1 over TLS.
    Https,
    /// `h2c://`: HTTP/2 over TCP with prior knowledge.
    H2c,
}

impl Protocol {
    /// The URL scheme of the configuration (`http`, `https`, `h2c`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http1 => "http",
            Protocol::Https => "https",
            Protocol::H2c => "h2c",
        }
    }
}

impl PartialEq for Upstream {
    /// The same URL (the TLS config is not compared: what it trusts is the configuration's
    /// to compare, e.g. a route's `upstream_ca`).
    fn eq(&self, other: &Upstream) -> bool {
        self.protocol == other.protocol
            && self.authority == other.authority
            && self.base == other.base
    }
}

impl Eq for Upstream {}

/// An upstream URL that is not `http://`, `https://` or `h2c://` `host[:port][/path]`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid upstream `{value}`: {reason}")]
pub struct InvalidUpstream {
    value: String,
    reason: &'static str,
}

impl FromStr for Upstream {
    type Err = InvalidUpstream;

    fn from_str(text: &str) -> Result<Upstream, InvalidUpstream> {
        let fail = |reason| InvalidUpstream {
            value: text.to_owned(),
            reason,
        };
        let uri: Uri = text.parse().map_err(|_| fail("not a URL"))?;
        let protocol = match uri.scheme_str() {
            Some("http") => Protocol::Http1,
            Some("https") => Protocol::Https,
            Some("h2c") => Protocol::H2c,
            _ => return Err(fail("expected an http://, https:// or h2c:// URL")),
        };
        let authority = uri.authority().cloned().ok_or_else(|| fail("no host"))?;
        if authority.host().is_empty() {
            return Err(fail("no host"));
        }
        if authority.as_str().contains('@') {
            return Err(fail("credentials in the URL are not supported"));
        }
        if uri.query().is_some() {
            return Err(fail("a query is not allowed in an upstream URL"));
        }
        Ok(Upstream {
            protocol,
            authority,
            base: uri.path().trim_end_matches('/').to_owned(),
            tls: None,
        })
    }
}

impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}{}",
            self.protocol.as_str(),
            self.authority,
            self.base
        )
    }
}

impl Upstream {
    /// The upstream URI for a request whose path and query are `path_and_query` (the scheme
    /// on the wire: `http` for `http://` and `h2c://`, `https` for `https://`).
    pub fn uri_for(&self, path_and_query: Option<&PathAndQuery>) -> Uri {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(self.path_for(path_and_query));
        Uri::from_parts(parts).unwrap_or_default()
    }

    /// The scheme on the wire.
    pub fn scheme(&self) -> Scheme {
        match self.protocol {
            Protocol::Https => Scheme::HTTPS,
            Protocol::Http1 | Protocol::H2c => Scheme::HTTP,
        }
    }

    /// The upstream path and query (the origin form on the wire) for a request's: the
    /// request's own, shared rather than parsed again, unless the upstream URL has a base
    /// path to put in front.
    pub fn path_for(&self, path_and_query: Option<&PathAndQuery>) -> PathAndQuery {
        match path_and_query {
            Some(pq) if self.base.is_empty() => pq.clone(),
            None if self.base.is_empty() => PathAndQuery::from_static("/"),
            _ => {
                let pq = path_and_query.map_or("/", PathAndQuery::as_str);
                PathAndQuery::from_str(&format!("{}{pq}", self.base))
                    .unwrap_or_else(|_| PathAndQuery::from_static("/"))
            }
        }
    }

    /// `host:port`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The port: the URL's, or the scheme's default (80, or 443 for `https://`).
    pub fn port(&self) -> u16 {
        self.authority.port_u16().unwrap_or(match self.protocol {
            Protocol::Https => 443,
            Protocol::Http1 | Protocol::H2c => 80,
        })
    }

    /// How requests reach it.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The TLS client config of an `https://` upstream (see [`crate::proxy::client_config`]);
    /// without one, an `https://` upstream fails every request with
    /// [`ProxyError::Tls`](crate::proxy::ProxyError::Tls).
    pub fn with_tls(mut self, config: Arc<rustls::ClientConfig>) -> Upstream {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.tls = Some((config, id));
        self
    }

    /// The TLS client config, for `https://`.
    pub fn tls(&self) -> Option<&Arc<rustls::ClientConfig>> {
        self.tls.as_ref().map(|(config, _)| config)
    }

    /// Which pooled connections this upstream may use: `0` for plain TCP, else a number
    /// given to its TLS config alone (a reload that reads `upstream_ca` again gets a new
    /// one, so connections verified under the old trust are not reused).
    pub fn pool_id(&self) -> usize {
        self.tls.as_ref().map_or(0, |(_, id)| *id)
    }
}

/// One route.
#[derive(Debug)]
pub struct Route {
    path_prefix: String,
    methods: Option<Vec<Method>>,
    policies: Vec<Arc<Policy>>,
    upstream: Upstream,
    queue_max_body: u64,
    max_body: u64,
    upstream_timeout: Duration,
    policy_header: Option<HeaderValue>,
    pub(crate) metrics: RouteMetrics,
}

impl Route {
    /// A route for paths starting with `path_prefix` to `upstream`, any method, no policy,
    /// bodies up to 64 KiB may wait, no body size limit, 30 s upstream timeout.
    pub fn new(path_prefix: impl Into<String>, upstream: Upstream) -> Route {
        let path_prefix = path_prefix.into();
        Route {
            metrics: RouteMetrics::new(&path_prefix),
            path_prefix,
            methods: None,
            policies: Vec::new(),
            upstream,
            queue_max_body: 64 * 1024,
            max_body: u64::MAX,
            upstream_timeout: DEFAULT_UPSTREAM_TIMEOUT,
            policy_header: None,
        }
    }

    /// Only these methods (an empty list: any).
    pub fn methods(mut self, methods: Vec<Method>) -> Route {
        self.methods = if methods.is_empty() {
            None
        } else {
            Some(methods)
        };
        self
    }

    /// The policies that must all admit a request.
    pub fn policies(mut self, policies: Vec<Arc<Policy>>) -> Route {
        self.policy_header = crate::headers::policy_header(&policies);
        self.policies = policies;
        self
    }

    /// Request bodies larger than this (or of unknown length) never wait in a queue.
    pub fn queue_max_body(mut self, bytes: u64) -> Route {
        self.queue_max_body = bytes;
        self
    }

    /// Request bodies larger than this get 413: at once when their `Content-Length` says so,
    /// otherwise as soon as the count passes it.
    pub fn max_body(mut self, bytes: u64) -> Route {
        self.max_body = bytes;
        self
    }

    /// How long to wait for the upstream's response head before answering 504.
    pub fn upstream_timeout(mut self, timeout: Duration) -> Route {
        self.upstream_timeout = timeout;
        self
    }

    /// The prefix.
    pub fn path_prefix(&self) -> &str {
        &self.path_prefix
    }

    /// The policies.
    pub fn policy_list(&self) -> &[Arc<Policy>] {
        &self.policies
    }

    /// Whether a policy of the route settles its cost on a response trailer (the upstream is
    /// then asked for trailers with `TE: trailers`).
    pub fn reads_trailers(&self) -> bool {
        self.policies.iter().any(|p| {
            matches!(
                p.cost().and_then(|c| c.settle.as_ref()),
                Some(crate::cost::Settle::Trailer(_))
            )
        })
    }

    /// The upstream.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// The body size limit for waiting.
    pub fn max_queued_body(&self) -> u64 {
        self.queue_max_body
    }

    /// The largest request body.
    pub fn body_limit(&self) -> u64 {
        self.max_body
    }

    /// The upstream timeout.
    pub fn timeout(&self) -> Duration {
        self.upstream_timeout
    }

    /// The `RateLimit-Policy` value, rendered once.
    pub fn policy_header(&self) -> Option<&HeaderValue> {
        self.policy_header.as_ref()
    }

    fn allows(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|m| m.contains(method))
    }
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup<'a> {
    /// The route.
    Found(&'a Arc<Route>),
    /// Some route's prefix matches, but none of those allows the method.
    MethodNotAllowed,
    /// No prefix matches.
    NotFound,
}

/// The routes, longest prefix first.
#[derive(Debug, Clone, Default)]
pub struct RouteTable {
    routes: Vec<Arc<Route>>,
}

impl RouteTable {
    /// A table of `routes`; among routes of equal prefix, the first listed is tried first.
    pub fn new(routes: Vec<Route>) -> RouteTable {
        let mut routes: Vec<Arc<Route>> = routes.into_iter().map(Arc::new).collect();
        routes.sort_by_key(|r| std::cmp::Reverse(r.path_prefix.len()));
        RouteTable { routes }
    }

    /// The route for `method` and `path`.
    pub fn find(&self, method: &Method, path: &str) -> Lookup<'_> {
        let mut matched = false;
        for route in &self.routes {
            if path.starts_with(route.path_prefix.as_str()) {
                if route.allows(method) {
                    return Lookup::Found(route);
                }
                matched = true;
            }
        }
        if matched {
            Lookup::MethodNotAllowed
        } else {
            Lookup::NotFound
        }
    }

    /// The routes, longest prefix first.
    pub fn routes(&self) -> &[Arc<Route>] {
        &self.routes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_prefix_wins_then_methods() {
        let up: Upstream = "http://127.0.0.1:9000".parse().unwrap();
        let table = RouteTable::new(vec![
            Route::new("/", up.clone()),
            Route::new("/api/", up.clone()).methods(vec![Method::GET]),
            Route::new("/api/admin/", up.clone()).methods(vec![Method::POST]),
        ]);
        let prefix = |m: Method, p: &str| match table.find(&m, p) {
            Lookup::Found(r) => r.path_prefix().to_owned(),
            Lookup::MethodNotAllowed => "405".into(),
            Lookup::NotFound => "404".into(),
        };
        assert_eq!(prefix(Method::GET, "/api/x"), "/api/");
        assert_eq!(prefix(Method::POST, "/api/x"), "/");
        assert_eq!(prefix(Method::POST, "/api/admin/x"), "/api/admin/");
        assert_eq!(prefix(Method::GET, "/api/admin/x"), "/api/");
        assert_eq!(prefix(Method::GET, "/other"), "/");
        let only = RouteTable::new(vec![Route::new("/api/", up).methods(vec![Method::GET])]);
        assert!(matches!(
            only.find(&Method::POST, "/api/"),
            Lookup::MethodNotAllowed
        ));
        assert!(matches!(only.find(&Method::GET, "/x"), Lookup::NotFound));
    }

    #[test]
    fn upstream_urls() {
        let up: Upstream = "http://127.0.0.1:9000/base/".parse().unwrap();
        let pq = PathAndQuery::from_static("/api/x?y=1");
        assert_eq!(
            up.uri_for(Some(&pq)),
            "http://127.0.0.1:9000/base/api/x?y=1"
        );
        assert_eq!(up.path_for(None), "/base/");
        let root: Upstream = "http://127.0.0.1:9000".parse().unwrap();
        assert_eq!(root.path_for(Some(&pq)), "/api/x?y=1");
        assert_eq!(root.path_for(None), "/");
        assert_eq!(root.uri_for(Some(&pq)), "http://127.0.0.1:9000/api/x?y=1");
        let tls: Upstream = "https://api.internal".parse().unwrap();
        assert_eq!((tls.protocol(), tls.port()), (Protocol::Https, 443));
        assert_eq!(tls.uri_for(None), "https://api.internal/");
        let h2c: Upstream = "h2c://grpc.internal:50051".parse().unwrap();
        assert_eq!((h2c.protocol(), h2c.port()), (Protocol::H2c, 50051));
        assert_eq!(h2c.uri_for(None), "http://grpc.internal:50051/");
        assert_eq!(h2c.to_string(), "h2c://grpc.internal:50051");
        assert!("ftp://x".parse::<Upstream>().is_err());
        assert!("127.0.0.1:9000".parse::<Upstream>().is_err());
        assert!("http://u:p@x".parse::<Upstream>().is_err());
    }
}
