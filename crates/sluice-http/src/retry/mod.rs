//! The client-side tower middleware: [`RetryLayer`] retries responses 429 and 503, waiting
//! what `Retry-After` asks (delay-seconds or an HTTP-date) and at least an exponential
//! backoff with full jitter, up to a maximum number of attempts and time: the browser's
//! `politeFetch`, for Rust clients.
//!
//! The policy is [`sluice::retry::Backoff`] and the header parsing
//! [`sluice::retry::RetryAfter`], the same code every sluice retry uses. Errors of the inner
//! service (connection failures) are returned, not retried: retry them with
//! [`sluice::retry::Retry`] around the call if they are safe to repeat. The request is cloned
//! for every attempt, so its body type must be `Clone` (e.g. `Full<Bytes>` or `String`).
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::atomic::{AtomicU32, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//! use http::{Request, Response};
//! use sluice::retry::Backoff;
//! use sluice_http::RetryLayer;
//! use tower::{service_fn, Layer, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let calls = Arc::new(AtomicU32::new(0));
//! let counter = calls.clone();
//! let busy_once = service_fn(move |_: Request<String>| {
//!     let n = counter.fetch_add(1, Ordering::SeqCst);
//!     async move {
//!         let mut r = Response::new(String::new());
//!         if n == 0 {
//!             *r.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
//!             r.headers_mut().insert("retry-after", "2".parse().unwrap());
//!         }
//!         Ok::<_, Infallible>(r)
//!     }
//! });
//! let client = RetryLayer::new(Backoff::new(Duration::from_millis(100), Duration::from_secs(5)))
//!     .layer(busy_once);
//! let started = tokio::time::Instant::now();
//! let response = client.oneshot(Request::new(String::from("hello"))).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(calls.load(Ordering::SeqCst), 2);
//! assert!(started.elapsed() >= Duration::from_secs(2)); // Retry-After honoured
//! # Ok(())
//! # }
//! ```

mod layer;
mod service;

pub use layer::RetryLayer;
pub use service::{ResponseFuture, Retry};
