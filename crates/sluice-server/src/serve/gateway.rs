//! The main listener: accept, serve HTTP/1.1 with hyper, hand each request to the
//! [`Gateway`](sluice_http::Gateway) in force, log it; drain on shutdown.
//!
//! Later features that answer on the main listener themselves (the browser assets under
//! `/sluice/`, `POST /v1/telemetry`) join in [`handle`], before the route table.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::{HeaderName, Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use sluice_http::body::Body;
use sluice_http::gateway::Outcome;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::serve::state::Shared;

/// `X-Request-Id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Accepts connections on `listener` until `stop` turns true, then stops accepting (the
/// listener is closed, so new connections are refused) and returns the connections in
/// flight, to be drained.
pub async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    server: ServerConfig,
    mut stop: watch::Receiver<bool>,
) -> GracefulShutdown {
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        .max_buf_size(server.max_header_bytes)
        .keep_alive(true);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        let service = service_fn(move |req: Request<Incoming>| {
            let shared = Arc::clone(&shared);
            async move { Ok::<_, Infallible>(handle(&shared, req, peer).await) }
        });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = watched.await {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful
}

/// One request on the main listener.
pub async fn handle(
    shared: &Shared,
    mut req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let started = Instant::now();
    let id = request_id(shared, &mut req);
    let log = tracing::enabled!(target: "sluice::access", tracing::Level::INFO);
    let head = log.then(|| (req.method().clone(), req.uri().path().to_owned()));
    let runtime = shared.current();
    let handled = runtime.gateway.handle(req, peer).await;
    let mut response = handled.response;
    response
        .headers_mut()
        .insert(X_REQUEST_ID.clone(), id.clone());
    if let Some((method, path)) = head {
        let (policy, reason) = match &handled.outcome {
            Outcome::Denied { policy, reason } => (Some(policy.as_ref()), Some(reason.as_str())),
            _ => (None, None),
        };
        tracing::info!(
            target: "sluice::access",
            request_id = id.to_str().unwrap_or(""),
            client = %handled.client_ip,
            method = %method,
            path = %path,
            route = handled.route.as_ref().map(|r| r.path_prefix()),
            status = response.status().as_u16(),
            decision = %handled.outcome,
            policy,
            reason,
            ms = %format_args!("{:.3}", started.elapsed().as_secs_f64() * 1e3),
        );
    }
    response
}

/// The request's id: a well-formed incoming `X-Request-Id` (visible ASCII, at most 64
/// bytes) is kept, anything else replaced; forwarded upstream and echoed in the response.
fn request_id(shared: &Shared, req: &mut Request<Incoming>) -> HeaderValue {
    if let Some(v) = req.headers().get(&X_REQUEST_ID) {
        let b = v.as_bytes();
        if !b.is_empty() && b.len() <= 64 && b.iter().all(u8::is_ascii_graphic) {
            return v.clone();
        }
    }
    let id = HeaderValue::from_str(&shared.ids.next()).unwrap_or(HeaderValue::from_static("0"));
    req.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
    id
}
