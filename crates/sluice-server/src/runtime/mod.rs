//! What the listeners share, built from the configuration: the floor below `serve/` (the
//! gateway and admin listeners), `rls/` (Envoy's rate limit service) and `dashboard/`.
//!
//! - [`build`]: the [`Runtime`](build::Runtime) one configuration makes (routes, policies and
//!   their stores, the browser limiter, the RLS descriptor table), built whole before it is
//!   swapped in, and what a reload keeps of the one before.
//! - [`state`]: [`Shared`](state::Shared), the runtime in force (swapped whole on reload), the
//!   metrics handle and request ids, borrowed by every listener.
//! - [`changes`]: what a reload changes, and which changes need a restart.
//! - [`otlp`]: the span exporter of `[telemetry]`.
//! - [`jobs`]: the job queues of `[jobs]`, read for the dashboard and `/metrics`.
//! - [`rls_table`]: Envoy rate limit descriptors to policies.
//! - [`overrides`]: a policy's keys with a quota of their own, as the admin API and the
//!   dashboard list them.
//!
//! Nothing here listens, accepts or reads a socket, and nothing here imports a listener's
//! module: listeners import this room, never the other way.

pub mod build;
pub mod changes;
pub mod jobs;
pub mod otlp;
pub mod overrides;
pub mod rls_table;
pub mod state;

use crate::config::Config;

/// For tests and `check-config`: builds a runtime from `config` without listening.
///
/// # Errors
///
/// As [`build::build`].
pub fn dry_run(config: Config) -> Result<build::Runtime, build::BuildError> {
    build::build_with(config, None, None, true)
}
