//! The built-in demo upstream (`upstream = "builtin:demo"`): an in-process HTTP server on an
//! ephemeral 127.0.0.1 port, so that `sluice serve` with no config shows limiting at once.
//!
//! - `/` (and any path outside `/api/`): a page explaining what to try.
//! - `/api/...`: a small JSON answer naming the path, the time and the request number.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const PAGE: &str = include_str!("demo.html");

/// Starts the demo upstream; returns its address.
///
/// # Errors
///
/// When 127.0.0.1:0 cannot be bound.
pub async fn start() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let served = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let served = Arc::clone(&served);
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let n = served.fetch_add(1, Ordering::Relaxed) + 1;
                    async move { Ok::<_, Infallible>(answer(&req, n)) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

fn answer(req: &Request<Incoming>, n: u64) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    let (body, kind) = if path.starts_with("/api/") {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut json = String::from("{\"ok\":true,\"path\":");
        sluice_http::headers::json_string(&mut json, path);
        json.push_str(&format!(",\"unix_ms\":{ms},\"served\":{n}}}\n"));
        (json, "application/json")
    } else {
        (PAGE.to_owned(), "text/html; charset=utf-8")
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, http::HeaderValue::from_static(kind));
    response
}
