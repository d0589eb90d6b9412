//! An axum service limited by sluice: a token bucket per client IP on `/api/`, with the IETF
//! `RateLimit` headers and 429 problem bodies, shared by every clone axum makes.
//!
//! Run it with `cargo run -p sluice-http --example axum`, then
//! `for i in $(seq 12); do curl -si localhost:3000/api/hello | head -1; done`.
//! `cargo test -p sluice-http --example axum` (part of `cargo test`) runs its test, which
//! serves the same router on a free port and checks the limit over real connections.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use sluice_http::{KeySpec, Policy, RateLimitLayer};

/// The application: `/api/hello` limited to a burst of 5, then 1 per second, per client IP.
fn app() -> Result<Router, Box<dyn std::error::Error>> {
    let per_ip = Policy::builder(
        "api",
        AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(5, "1/s")?),
    )
    .key(KeySpec::Ip)
    .max_keys(10_000)
    .build()?;
    let limit = RateLimitLayer::new(Arc::new(per_ip))
        // axum puts the peer address in `ConnectInfo`; tell the layer where to find it.
        .client_ip(|ext| ext.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()));
    let api = Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .layer(limit);
    Ok(api.route("/", get(|| async { "unlimited\n" })))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app()?.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    #[tokio::test]
    async fn every_connection_shares_the_bucket() -> Result<(), Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let app = app().expect("valid policy");
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        let mut statuses = Vec::new();
        for _ in 0..7 {
            // A new client each time: a new connection, so a new clone of the service.
            let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
            let response = client
                .get(format!("http://{addr}/api/hello").parse()?)
                .await?;
            assert_eq!(response.headers()["ratelimit-policy"], r#""api";q=5;w=5"#);
            assert!(response.headers().contains_key("ratelimit"));
            let status = response.status().as_u16();
            if status == 429 {
                assert!(response.headers().contains_key("retry-after"));
                let body = response.into_body().collect().await?.to_bytes();
                let problem: serde_json::Value = serde_json::from_slice(&body)?;
                assert_eq!(problem["reason"], "limit");
            }
            statuses.push(status);
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
        Ok(())
    }
}
