//! Forwarding an HTTP/1.1 upgrade (WebSocket): on a connection of its own, never pooled,
//! since the upgrade takes it over.

use std::net::IpAddr;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HOST, UPGRADE};
use http::{HeaderValue, Request, Response, Uri, Version};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::proxy::budget::{self, Budgeted, Socket};
use crate::proxy::forward::{append_forwarded_for, remove_hop_by_hop};
use crate::proxy::ProxyError;
use crate::route::{Protocol, Route};

/// `upgrade`, the `Connection` token of an upgrade.
static UPGRADE_TOKEN: HeaderValue = HeaderValue::from_static("upgrade");

/// Sends the upgrade request `parts` from `peer` to `route`'s `http://` upstream on a new
/// connection
/// (within `connect_timeout`), keeping its `Upgrade` and `Connection: upgrade` (the only
/// hop-by-hop fields passed on), and returns the upstream's response head: on a `101`,
/// `hyper::upgrade::on` of it is the upstream's side of the tunnel, and the response keeps
/// its `Upgrade` and `Connection: upgrade` for the client.
///
/// # Errors
///
/// As [`Proxy::forward`](crate::proxy::Proxy::forward): 502 or 504 errors; an upstream
/// that is not `http://` is [`ProxyError::Connect`] (502).
///
/// # Cancel safety
///
/// Dropping the future closes the new connection.
pub async fn forward_upgrade(
    mut parts: http::request::Parts,
    route: &Route,
    peer: IpAddr,
    connect_timeout: Duration,
) -> Result<Response<Incoming>, ProxyError> {
    if route.upstream().protocol() != Protocol::Http1 {
        // An upgrade is an HTTP/1.1 exchange in plain text: not over TLS, not over HTTP/2.
        return Err(ProxyError::Connect(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "an upgrade (WebSocket) needs an http:// upstream",
        )));
    }
    let upgrade = parts.headers.get(UPGRADE).cloned();
    remove_hop_by_hop(&mut parts.headers);
    append_forwarded_for(&mut parts.headers, peer);
    if let Some(upgrade) = upgrade {
        parts.headers.insert(UPGRADE, upgrade);
        parts.headers.insert(CONNECTION, UPGRADE_TOKEN.clone());
    }
    let upstream = route.upstream();
    let authority = upstream.authority();
    if !parts.headers.contains_key(HOST) {
        if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
            parts.headers.insert(HOST, host);
        }
    }
    parts.uri = Uri::from(upstream.path_for(parts.uri.path_and_query()));
    parts.version = Version::HTTP_11;
    let request = Request::from_parts(parts, Empty::<Bytes>::new());
    let port = authority.port_u16().unwrap_or(80);
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let Some(socket) = Socket::take() else {
        budget::refused("total");
        return Err(ProxyError::Budget(
            "the gateway holds as many upstream connections as it may (server.max_upstream_connections)".to_owned(),
        ));
    };
    let stream = match tokio::time::timeout(connect_timeout, TcpStream::connect((host, port))).await
    {
        Ok(Ok(stream)) => Budgeted::new(stream, socket),
        Ok(Err(e)) => return Err(ProxyError::Connect(e)),
        Err(_) => return Err(ProxyError::ConnectTimeout(connect_timeout)),
    };
    let _ = stream.get_ref().set_nodelay(true);
    let timeout = route.timeout();
    let exchange = async {
        let (mut sender, connection) = http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ProxyError::Upstream)?;
        tokio::spawn(async move {
            if let Err(e) = connection.with_upgrades().await {
                tracing::debug!(error = %e, "upstream upgrade connection ended with an error");
            }
        });
        sender
            .send_request(request)
            .await
            .map_err(ProxyError::Upstream)
    };
    let mut response = match tokio::time::timeout(timeout, exchange).await {
        Ok(result) => result?,
        Err(_) => return Err(ProxyError::Timeout(timeout)),
    };
    let upgrade = response.headers().get(UPGRADE).cloned();
    remove_hop_by_hop(response.headers_mut());
    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
        if let Some(upgrade) = upgrade {
            response.headers_mut().insert(UPGRADE, upgrade);
        }
        response
            .headers_mut()
            .insert(CONNECTION, UPGRADE_TOKEN.clone());
    }
    Ok(response)
}
