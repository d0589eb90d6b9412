//! The client-side pacing middleware: [`PaceLayer`] reads the limits a server announces on
//! every response (the IETF `RateLimit` / `RateLimit-Policy` fields that `sluice serve`
//! sends, OpenAI's `x-ratelimit-*-{requests,tokens}`, Anthropic's `anthropic-ratelimit-*`,
//! GitHub's `x-ratelimit-*` with Unix resets read on the server's clock, and `Retry-After`),
//! keeps one limit per server policy, and delays each request so that what remains is spread
//! evenly until its reset, before any 429. The npm package's `paced(fetch)`, for Rust clients
//! (hyper's, reqwest's through tower, or any `Service<Request<B>>`).
//!
//! Every service made by one layer (and every clone of them) paces as one client. A request
//! that declares a [`Cost`] in its extensions (an LLM call's estimated tokens) waits on token
//! limits as well. A 429 or a `Retry-After` holds every request back; before the first answer
//! one request goes at a time, and limits given to [`PaceLayer::with_limits`] hold while the
//! server says nothing. The rules are those of packages/sluice-js (its README, "Paced
//! clients"): [`fields`] parses, a pure step decides, this module waits.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use sluice_http::pace::PaceLayer;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Infallible> {
//! // An API that says 4 requests remain until a reset in 2 s.
//! let api = service_fn(|_: Request<()>| async {
//!     let mut r = Response::new(());
//!     r.headers_mut().insert("ratelimit-policy", "\"api\";q=5;w=2".parse().unwrap());
//!     r.headers_mut().insert("ratelimit", "\"api\";r=4;t=2".parse().unwrap());
//!     Ok::<_, Infallible>(r)
//! });
//! let client = PaceLayer::new().layer(api);
//! let started = tokio::time::Instant::now();
//! client.clone().oneshot(Request::new(())).await?;
//! client.clone().oneshot(Request::new(())).await?; // 2 s / (4 + 1) later, not at once
//! assert_eq!(started.elapsed(), Duration::from_millis(400));
//! # Ok(())
//! # }
//! ```
//!
//! Over hyper's client, with a declared token cost reconciled from the answer's JSON usage (a
//! stand-in for OpenAI's API on loopback here; its token fields would do it alone, the body's
//! usage covers a server that sends none, or sends them before the request is counted):
//!
//! ```
//! use http_body_util::{BodyExt, Full};
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use sluice_http::pace::{Cost, PaceLayer, Reconcile};
//! use tower::{Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(|| async {
//! #     ([("x-ratelimit-limit-requests", "60"), ("x-ratelimit-remaining-requests", "59"),
//! #       ("x-ratelimit-reset-requests", "1s"), ("content-type", "application/json")],
//! #      r#"{"usage":{"prompt_tokens":100,"completion_tokens":20,"total_tokens":120}}"#)
//! # }));
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let url = format!("http://{}/v1/chat/completions", listener.local_addr()?);
//! # tokio::spawn(async move { axum::serve(listener, app).await });
//! // 90,000 tokens a minute, which this server does not announce.
//! let layer = PaceLayer::with_limits(&[("tokens", 90_000, std::time::Duration::from_secs(60))]);
//! let client = layer.layer(Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>());
//!
//! let mut request = http::Request::post(url).body(Full::from(r#"{"model":"gpt-4o-mini"}"#))?;
//! request.extensions_mut().insert(Cost::tokens(800)); // the estimate: waits on the token limit
//! let response = client.clone().oneshot(request).await?;
//! let reconcile = response.extensions().get::<Reconcile>().cloned();
//! let body: serde_json::Value = serde_json::from_slice(&response.into_body().collect().await?.to_bytes())?;
//! if let (Some(reconcile), Some(used)) = (reconcile, body["usage"]["total_tokens"].as_u64()) {
//!     reconcile.used(&Cost::tokens(used)); // 680 of the 800 go back
//! }
//! let (remaining, _) = layer.remaining("configured:tokens").expect("a configured limit");
//! assert_eq!(remaining, Some(90_000.0 - 120.0));
//! # Ok(())
//! # }
//! ```
//!
//! A request's cost is reconciled with what it used in the first of these ways that applies:
//! the answer's own token fields (`x-ratelimit-remaining-tokens` and the like: the server's
//! figure replaces the estimate, so the drop it shows is the cost); the layer's
//! [usage extractor](PaceLayer::usage), which reads the use from the answer's head; or the
//! [`Reconcile`] in the answer's extensions, given the use its body tells.

pub mod fields;
mod layer;
mod service;
mod sfv;
mod step;

pub use layer::PaceLayer;
pub use service::{Pace, Reconcile, ResponseFuture};
pub use step::Cost;
