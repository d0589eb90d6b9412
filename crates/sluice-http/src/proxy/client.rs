//! The pooled upstream client.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Version};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::proxy::forward::{append_forwarded_for, remove_hop_by_hop};
use crate::route::Route;

/// Why a request could not be forwarded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The upstream refused the connection, or it failed before a response (502).
    #[error("upstream refused or failed: {0}")]
    Refused(#[source] hyper_util::client::legacy::Error),
    /// No response head within the route's timeout (504).
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
}

/// Forwards requests to upstreams over pooled HTTP/1.1 connections. Clones share the pool.
#[derive(Debug)]
pub struct Proxy<B = Incoming> {
    client: Client<HttpConnector, B>,
}

impl<B> Clone for Proxy<B> {
    fn clone(&self) -> Self {
        Proxy {
            client: self.client.clone(),
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

impl<B> Proxy<B>
where
    B: http_body::Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A proxy with a connection pool (idle connections kept 90 s, up to 1024 per upstream).
    pub fn new() -> Proxy<B> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        connector.set_keepalive(Some(Duration::from_secs(60)));
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .retry_canceled_requests(true)
            .build(connector);
        Proxy { client }
    }

    /// Forwards `request` from `peer` to `route`'s upstream and returns its response head,
    /// with the body streaming.
    ///
    /// # Errors
    ///
    /// [`ProxyError::Refused`] (502) or [`ProxyError::Timeout`] (504).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the upstream request (and its connection, if it was
    /// mid-flight).
    pub async fn forward(
        &self,
        request: Request<B>,
        route: &Route,
        peer: IpAddr,
    ) -> Result<Response<Incoming>, ProxyError> {
        let (mut parts, body) = request.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        append_forwarded_for(&mut parts.headers, peer);
        parts.uri = route.upstream().uri_for(parts.uri.path_and_query());
        parts.version = Version::HTTP_11;
        let request = Request::from_parts(parts, body);
        let timeout = route.timeout();
        match tokio::time::timeout(timeout, self.client.request(request)).await {
            Ok(Ok(mut response)) => {
                remove_hop_by_hop(response.headers_mut());
                Ok(response)
            }
            Ok(Err(e)) => Err(ProxyError::Refused(e)),
            Err(_) => Err(ProxyError::Timeout(timeout)),
        }
    }
}
