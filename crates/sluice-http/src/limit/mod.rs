//! The server-side tower middleware: [`RateLimitLayer`] runs every request through a set of
//! [`Policy`](crate::Policy)s with the same keys, headers and 429s as `sluice serve`. A
//! gRPC request (`application/grpc…`, `application/grpc-web…`) is refused as the gateway
//! refuses it: a Trailers-Only gRPC status ([`crate::grpc`]), in the request's content type
//! family.
//!
//! Unlike `tower::limit::RateLimit`, whose state lives in each clone of the service (so that
//! axum, which clones the service per connection or per request, ends up with one bucket per
//! clone: tower #794, axum #2634), the state here lives in the policies' stores and every
//! clone shares it.
//!
//! The client address for `key = "ip"` comes from a [`ClientIp`](crate::ClientIp) extension,
//! else a [`std::net::SocketAddr`] extension, else a function given to
//! [`RateLimitLayer::client_ip`]; [`RateLimitLayer::trusted_proxies`] makes it believe
//! `X-Forwarded-For` from those peers. Concurrency slots are held until the inner service's
//! response future completes (as `tower::limit::ConcurrencyLimit` does), not until the body
//! is sent.
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::Arc;
//! use http::{Request, Response};
//! use sluice_core::{AnyAlgorithm, Kind, Quota};
//! use sluice_http::{Policy, RateLimitLayer};
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let policy = Arc::new(Policy::builder("api", AnyAlgorithm::new(Kind::Gcra, Quota::parse(1, "1/s")?)).build()?);
//! let layer = RateLimitLayer::new(policy);
//! let svc = layer.layer(service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::from("hi"))) }));
//! let first = svc.clone().oneshot(Request::new(())).await?;
//! assert_eq!(first.status(), 200);
//! assert_eq!(first.headers()["ratelimit"], r#""api";r=0;t=1"#);
//! let second = svc.clone().oneshot(Request::new(())).await?; // another clone, same bucket
//! assert_eq!(second.status(), 429);
//! assert_eq!(second.headers()["retry-after"], "1");
//! # Ok(())
//! # }
//! ```

mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use service::RateLimit;
