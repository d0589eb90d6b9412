//! # sluice-http
//!
//! HTTP rate limiting over [`sluice`]: the pieces of the `sluice serve` gateway, usable on their
//! own in any hyper or tower service.
//!
//! - [`policy`]: a named [`Policy`] (algorithm + quota, a [`KeySpec`] saying whose bucket a
//!   request spends, a key cap, an optional wait queue and concurrency limit) over a
//!   [`Backend`] store; [`admit`](admit::admit) runs a request through every policy of a route.
//! - [`headers`]: the IETF `RateLimit-Policy` / `RateLimit` fields
//!   (draft-ietf-httpapi-ratelimit-headers-09, structured-field form), `Retry-After`, and the
//!   `application/problem+json` body of a 429.
//! - [`route`]: the route table (longest `path_prefix` wins) and its upstreams.
//! - [`proxy`]: a streaming reverse proxy on hyper 1 with pooled upstream connections,
//!   hop-by-hop headers removed and `X-Forwarded-For` appended; [`gateway`] puts route, policy
//!   and proxy together into the handler that `sluice serve` runs.
//! - [`limit`]: [`RateLimitLayer`], the same policies as a tower middleware whose state is
//!   shared by every clone of the service (unlike `tower::limit::RateLimit`).
//! - [`retry`]: [`RetryLayer`], a client middleware that retries 429 and 503 honouring
//!   `Retry-After`, with exponential backoff and full jitter.
//! - [`pace`]: [`PaceLayer`](pace::PaceLayer), a client middleware that paces requests from the
//!   limits servers announce (IETF fields, OpenAI, Anthropic, GitHub, `Retry-After`), before
//!   any 429.
//!
//! ```
//! use std::time::Duration;
//! use sluice_core::{AnyAlgorithm, Kind, Quota};
//! use sluice_http::{KeySpec, Policy};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let api = Policy::builder("api", AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(10, "5/s")?))
//!     .key("header:x-api-key".parse::<KeySpec>()?)
//!     .queue(100, Duration::from_secs(10))
//!     .build()?;
//! assert_eq!(api.policy_item(), r#""api";q=10;w=2"#); // the RateLimit-Policy member
//! let decision = api.check("user-42", 1).await?;
//! assert_eq!((decision.limit, decision.remaining), (10, 9));
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub mod admit;
pub mod backend;
pub mod body;
pub mod client_ip;
pub mod cost;
pub mod gateway;
pub mod grpc;
pub mod h1;
pub mod headers;
pub mod key;
pub mod key_hash;
pub mod limit;
mod metrics;
pub use metrics::describe as describe_metrics;
pub mod pace;
pub mod path;
pub mod plan;
pub mod policy;
pub mod protocol;
pub mod proxy;
pub mod retry;
pub mod route;
pub mod tunnel;
pub mod websocket;
pub mod wire;

pub use admit::{Admission, Denial, Reason};
pub use backend::Backend;
pub use client_ip::{ClientIp, TrustedProxies};
pub use gateway::Gateway;
pub use key::{Key, KeySpec, MAX_KEY_LEN};
pub use key_hash::KeyHasher;
pub use limit::{RateLimit, RateLimitLayer};
pub use policy::{Policy, PolicyBuilder, PolicyError};
pub use retry::{Retry, RetryLayer};
pub use route::{Protocol, Route, RouteTable, Upstream};

/// The README's examples, run as doc tests (here, where every crate they use is at hand:
/// sluice, sluice-core, sluice-http, tower, tokio).
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
