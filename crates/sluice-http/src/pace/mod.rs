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

pub mod fields;
mod layer;
mod service;
mod sfv;
mod step;

pub use layer::PaceLayer;
pub use service::{Pace, Reconcile, ResponseFuture};
pub use step::Cost;
