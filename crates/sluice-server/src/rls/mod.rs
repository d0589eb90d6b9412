//! Envoy's rate limit service (RLS v3, `envoy.service.ratelimit.v3.RateLimitService`) on
//! `server.rls_listen`: each descriptor Envoy sends is decided by the policy of the first
//! `[[rls]]` rule that matches it, on the same buckets the HTTP gateway spends.
//!
//! - [`table`]: the rules, built with each runtime (so a reload rebuilds them), and the key a
//!   matched descriptor spends.
//! - [`service`]: `ShouldRateLimit`, and the listener that serves it over h2c.

pub mod service;

pub use crate::runtime::rls_table::{RlsTable, Unit};
pub use service::{describe_metrics, serve, RlsService, RlsVerdict};
