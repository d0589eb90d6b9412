//! # sluice-server
//!
//! The `sluice` binary as a library: [`cli`] parses the command line, [`config`] reads and
//! validates the gateway configuration (every error, with its file, line and field), and
//! [`serve`] runs the gateway: the main listener proxying to upstreams through the policies
//! of [`sluice_http`], and the admin listener with the decision API, `/metrics` and
//! `/healthz`; with a `[browser]` table, [`browser`] serves the limiter that runs in the
//! browser (a Service Worker over sluice-core compiled to WebAssembly) and its telemetry.
//! `main.rs` only calls [`cli::run`].
//!
//! `serve`, `simulate`, `stress` and `bundle` (the browser files for any web host, [`bundle`])
//! live in modules of their own, [`dashboard`] serves
//! `/dashboard` and `/v1/stats` on the admin listener, [`rls`] answers Envoy's rate limit
//! service on `server.rls_listen`, and the two small subcommands,
//! `check-config` and `default-config`, are in [`cli`]. All of them read [`config`]; what the
//! listeners share (the runtime one configuration builds, the state swapped on reload) is in
//! [`runtime`], below every listener. The floors, and the test that keeps every import
//! running downward, are in `tests/layers.rs`; the repository's `ARCHITECTURE.md` walks
//! through the whole house.
//!
//! ```
//! let config = sluice_server::config::parse(
//!     r#"
//!     [[policy]]
//!     name = "api"
//!     capacity = 10
//!     rate = "5/s"
//!     key = "ip"
//!
//!     [[route]]
//!     path_prefix = "/api/"
//!     policies = ["api"]
//!     upstream = "http://127.0.0.1:9000"
//!     "#,
//!     "sluice.toml",
//! )
//! .unwrap();
//! assert_eq!(config.policies[0].quota.capacity(), 10);
//! assert_eq!(config.server.listen.port(), 8080);
//! ```
#![forbid(unsafe_code)]

pub mod browser;
pub mod bundle;
pub mod cli;
pub mod config;
pub mod dashboard;
pub mod jobs;
pub mod rls;
pub mod runtime;
pub mod serve;
pub mod simulate;
pub mod stress;
