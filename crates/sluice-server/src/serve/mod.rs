//! `sluice serve`: the gateway and admin listeners, signals, reloads.
//!
//! - SIGTERM or SIGINT: stop accepting (the listener is closed, so new connections are
//!   refused), let requests in flight finish for at most `server.shutdown_timeout`, send the
//!   spans not yet exported (`[telemetry]`), exit 0.
//! - SIGHUP: read the config file again and build it whole; only then swap it in. Policies
//!   that did not change keep their buckets; a policy whose quota, algorithm, queue, key cap
//!   or store settings changed keeps each key's state, converted so that no key gains
//!   tokens (tokens left after = min(before, new capacity)). A config that is invalid, that
//!   cannot be built (a store that cannot open), or that changes `server.listen`,
//!   `server.admin_listen`, `server.rls_listen`, `server.workers`,
//!   `telemetry.otlp_endpoint` or `[jobs]` (they need a restart) is
//!   refused, and the old configuration keeps serving untouched. Each reload logs one line
//!   saying what changed and counts itself in `sluice_reloads_total{result="ok"|"refused"}`.
//!   The files of `[server.tls]` and every `upstream_ca` are read again too: new connections
//!   get the new certificate, those open keep theirs; a pair that does not load refuses the
//!   reload.
//!
//! The room of the gateway and admin listeners ([`gateway`], `capacity`, [`conn`], [`stall`], [`admin`],
//! [`policies`], [`keys`], [`explain`]) and of the process that starts every listener
//! ([`run()`]). What more than one listener needs (the runtime, the shared state, reload
//! changes) lives below, in [`crate::runtime`]; nothing here is imported by a room beneath
//! it.

pub mod admin;
mod byte_path;
mod capacity;
pub mod conn;
pub mod demo;
pub mod explain;
pub mod gateway;
mod ids;
pub mod keys;
pub mod policies;
pub mod stall;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::config::{self, Config, UpstreamConfig};
use crate::runtime::build::{self, build};
use crate::runtime::state::Shared;
use crate::runtime::{changes, otlp};

/// Why `serve` stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is invalid (exit status 2).
    #[error("{0}")]
    Config(String),
    /// Anything else: a port in use, a signal handler (exit status 1).
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Loads the configuration at `path`, or the embedded defaults.
///
/// # Errors
///
/// [`ServeError::Config`] with every error.
pub fn load(path: Option<&PathBuf>) -> Result<Config, ServeError> {
    match path {
        Some(path) => config::load(path).map_err(|e| ServeError::Config(e.to_string())),
        None => Ok(config::defaults()),
    }
}

/// Runs the gateway until SIGTERM or SIGINT.
///
/// # Errors
///
/// [`ServeError`] when it cannot start.
pub async fn run(path: Option<PathBuf>) -> Result<(), ServeError> {
    let config = load(path.as_ref())?;
    // Before any policy exists: metric handles taken earlier would stay no-ops.
    let prometheus = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the metrics recorder")?;
    sluice_http::describe_metrics();
    crate::browser::telemetry::describe();
    gateway::describe_metrics();
    conn::describe_metrics();
    byte_path::describe_metrics();
    crate::rls::describe_metrics();
    crate::runtime::jobs::describe_metrics();
    metrics::describe_counter!(
        "sluice_reloads_total",
        metrics::Unit::Count,
        "Configuration reloads (SIGHUP), by `result`: `ok` (the new configuration serves) or `refused` (the running one keeps serving)."
    );
    let upkeep = prometheus.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let demo = if config
        .routes
        .iter()
        .any(|r| r.upstream == UpstreamConfig::BuiltinDemo)
    {
        let addr = demo::start().await.context("starting the demo upstream")?;
        tracing::info!(%addr, "built-in demo upstream");
        Some(addr)
    } else {
        None
    };
    let server = config.server.clone();
    let source = config.source.clone();
    let spans = otlp::Spans::start(&config.telemetry)?;
    let runtime = build(config, None, demo).map_err(|e| {
        if e.machine {
            ServeError::Other(e.into())
        } else {
            ServeError::Config(e.to_string())
        }
    })?;
    // Before any listener accepts: connections never meet the lower limit.
    make_room_for_connections(&server);
    sluice_http::proxy::set_upstream_budget(server.max_upstream_connections);
    let admin_listener = TcpListener::bind(server.admin_listen)
        .await
        .with_context(|| format!("binding server.admin_listen {}", server.admin_listen))?;
    let rls_listener = match server.rls_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding server.rls_listen {addr}"))?,
        ),
        None => None,
    };
    // Lives as long as the process: every request borrows it instead of counting references.
    let shared: &'static Shared =
        Box::leak(Box::new(Shared::new(runtime, prometheus, demo, spans)));
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = gateway::Workers::start(&server, shared, &stop_rx)
        .with_context(|| format!("binding server.listen {}", server.listen))?;
    let admin = tokio::spawn(admin::serve(admin_listener, shared, stop_rx.clone()));
    if let Some(jobs) = &shared.jobs {
        tokio::spawn(jobs.report_every());
    }
    let rls = rls_listener.map(|l| tokio::spawn(crate::rls::serve(l, shared, stop_rx.clone())));
    drop(stop_rx);
    tracing::info!(
        listen = %server.listen,
        admin_listen = %server.admin_listen,
        rls_listen = ?server.rls_listen,
        otlp_endpoint = shared.spans.as_ref().map(otlp::Spans::endpoint),
        jobs = ?shared.jobs.as_ref().map(|j| &j.config().queues),
        workers = server.workers,
        config = %source,
        "sluice serving"
    );
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); break; }
            _ = hup.recv() => reload(shared, path.as_ref(), demo).await,
        }
    }
    let _ = stop_tx.send(true);
    // The workers drain (each bounded by shutdown_timeout) on their own threads.
    tokio::task::spawn_blocking(move || workers.join())
        .await
        .context("joining the workers")?;
    tracing::info!("drained");
    build::give_back_leases(&shared.current()).await;
    build::close_stores(&shared.current());
    if let Some(spans) = &shared.spans {
        spans.shutdown().await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), admin).await;
    if let Some(rls) = rls {
        let _ = tokio::time::timeout(Duration::from_secs(1), rls).await;
    }
    Ok(())
}

/// SIGHUP: build the new configuration whole, then swap it in; refuse one that is invalid,
/// cannot be built, or changes a setting only a restart can apply. The old configuration is
/// untouched until the swap. One log line per reload, and `sluice_reloads_total{result}`.
async fn reload(shared: &Shared, path: Option<&PathBuf>, demo: Option<std::net::SocketAddr>) {
    let refused = |reason: &str| {
        metrics::counter!("sluice_reloads_total", "result" => "refused").increment(1);
        tracing::error!(target: "sluice::reload", "SIGHUP: config refused; the old one keeps serving: {reason}");
    };
    let Some(path) = path else {
        tracing::warn!("SIGHUP: running on the embedded defaults, nothing to reload");
        return;
    };
    let _one_at_a_time = shared.reconfigure.lock().await;
    let config = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            for line in e.to_string().lines() {
                tracing::error!(target: "sluice::reload", "{line}");
            }
            metrics::counter!("sluice_reloads_total", "result" => "refused").increment(1);
            tracing::error!(config = %path.display(), "SIGHUP: invalid config refused; the old one keeps serving");
            return;
        }
    };
    let old = shared.current();
    if let Some(field) = changes::needs_restart(&old.config, &config) {
        refused(&format!("{field} needs a restart"));
        return;
    }
    if config
        .routes
        .iter()
        .any(|r| r.upstream == UpstreamConfig::BuiltinDemo)
        && demo.is_none()
    {
        refused("builtin:demo needs a restart (the demo upstream was not started)");
        return;
    }
    let changed = changes::describe(&old.config, &config);
    match build(config, Some(&old), demo) {
        Ok(new) => {
            let new = Arc::new(new);
            new.prepare().await;
            sluice_http::proxy::set_upstream_budget(new.config.server.max_upstream_connections);
            shared.runtime.store(Arc::clone(&new));
            new.take_over().await;
            metrics::counter!("sluice_reloads_total", "result" => "ok").increment(1);
            tracing::info!(
                config = %path.display(),
                %changed,
                kept = ?new.kept,
                converted = ?new.carried,
                "SIGHUP: reloaded"
            );
        }
        Err(e) => refused(&e.to_string()),
    }
}

/// Makes room for `server.max_connections` client connections and
/// `server.max_upstream_connections` upstream sockets, and a reserve.
///
/// Raises the soft limit on open files towards what that needs, up to the hard limit (as
/// nginx's `worker_rlimit_nofile` does when set, and as most servers do at start: the soft
/// limit is often 1024 while the hard one is far higher). Says when `max_connections` was
/// sized from the hard limit (it was not set, and its default would not fit), and warns when
/// even the hard limit is short of what the settings need: a flood would then exhaust
/// descriptors before the caps, and the stores could not open or write their files.
fn make_room_for_connections(server: &config::ServerConfig) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

    if let Some(hard) = server.max_connections_sized_from {
        tracing::info!(
            max_connections = server.max_connections,
            max_upstream_connections = server.max_upstream_connections,
            open_files_limit = hard,
            "server.max_connections sized from the open-files limit (ulimit -Hn): a client and an upstream socket per connection, and 256 more; set it to choose"
        );
    }
    let needed =
        config::descriptors_needed(server.max_connections, server.max_upstream_connections);
    let limit = getrlimit(Resource::Nofile);
    // `None` is "unlimited".
    let (Some(soft), hard) = (limit.current, limit.maximum) else {
        return;
    };
    let mut have = soft;
    if soft < needed {
        let target = hard.map_or(needed, |hard| hard.min(needed));
        if target > soft {
            let raised = Rlimit {
                current: Some(target),
                maximum: hard,
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => {
                    tracing::debug!(from = soft, to = target, "raised the open-files limit");
                    have = target;
                }
                Err(e) => tracing::debug!(error = %e, "could not raise the open-files limit"),
            }
        }
    }
    if have < needed {
        tracing::warn!(
            open_files_limit = have,
            needed,
            "server.max_connections and server.max_upstream_connections need more open files than this process may have (ulimit -Hn): raise the limit or lower them"
        );
    }
}
