//! The baseline of `scripts/bench-gateway.sh`: a plain hyper 1.x reverse proxy, written the
//! way hyper's own examples write one. Tokio's multi-threaded runtime, one task per
//! connection, `hyper_util`'s pooled client; no limiting, no headers added or removed.
//!
//! ```text
//! cargo run --release -p sluice-benches --example plain_hyper_proxy -- 127.0.0.1:8090 127.0.0.1:9000
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, hyper::Error>;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: plain_hyper_proxy LISTEN_ADDR UPSTREAM_ADDR";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstream: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(1024)
        .build(connector);
    let listener = TcpListener::bind(listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let client = client.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), upstream, req));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn forward(
    client: Client<HttpConnector, Incoming>,
    upstream: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let uri: Uri = match format!("http://{upstream}{path}").parse() {
        Ok(uri) => uri,
        Err(_) => return Ok(status(StatusCode::BAD_REQUEST)),
    };
    *req.uri_mut() = uri;
    Ok(match client.request(req).await {
        Ok(response) => response.map(BodyExt::boxed),
        Err(_) => status(StatusCode::BAD_GATEWAY),
    })
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
    *response.status_mut() = code;
    response
}
