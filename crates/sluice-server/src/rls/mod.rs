//! Envoy's rate limit service (RLS v3, `envoy.service.ratelimit.v3.RateLimitService`) on
//! `server.rls_listen`: each descriptor Envoy sends is decided by the policy of the first
//! `[[rls]]` rule that matches it, on the same buckets the HTTP gateway spends.
//!
//! - [`RlsTable`]: the rules, built with each runtime (so a reload rebuilds them), and the key a
//!   matched descriptor spends; it lives in [`crate::runtime::rls_table`], below every listener.
//! - [`service`]: `ShouldRateLimit`, and the listener that serves it over h2c.
//!
//! A listener: it borrows the shared state ([`crate::runtime::state::Shared`]) and imports
//! nothing from the other listeners (`serve/`); only the process (`serve::run`) starts it.

pub mod service;

pub use crate::runtime::rls_table::{RlsTable, Unit};
pub use service::{describe_metrics, serve, RlsService, RlsVerdict};
