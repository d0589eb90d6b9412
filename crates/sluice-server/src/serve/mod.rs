//! `sluice serve`: the gateway and admin listeners, signals, reloads.
//!
//! - SIGTERM or SIGINT: stop accepting (the listener is closed, so new connections are
//!   refused), let requests in flight finish for at most `server.shutdown_timeout`, exit 0.
//! - SIGHUP: read the config file again. A valid one replaces the running configuration;
//!   policies that did not change (same name, algorithm, quota, key, key cap, queue and
//!   store kind) keep their buckets, others start full. An invalid one is refused with its
//!   errors in the log, and the old configuration keeps serving. The listen addresses are
//!   read at start only.

pub mod admin;
pub mod build;
pub mod demo;
pub mod gateway;
pub mod state;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

use crate::config::{self, Config, UpstreamConfig};
use crate::serve::build::{build, Runtime};
use crate::serve::state::{RequestIds, Shared};

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
    let runtime = build(config, None, demo).map_err(|e| {
        if e.machine {
            ServeError::Other(e.into())
        } else {
            ServeError::Config(e.to_string())
        }
    })?;
    let admin_listener = TcpListener::bind(server.admin_listen)
        .await
        .with_context(|| format!("binding server.admin_listen {}", server.admin_listen))?;
    // Lives as long as the process: every request borrows it instead of counting references.
    let shared: &'static Shared = Box::leak(Box::new(Shared {
        runtime: ArcSwap::from_pointee(runtime),
        prometheus,
        ids: RequestIds,
    }));
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = gateway::Workers::start(&server, shared, &stop_rx)
        .with_context(|| format!("binding server.listen {}", server.listen))?;
    let admin = {
        let router = admin::router(shared);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            axum::serve(admin_listener, router)
                .with_graceful_shutdown(stopped)
                .await
        })
    };
    drop(stop_rx);
    tracing::info!(
        listen = %server.listen,
        admin_listen = %server.admin_listen,
        workers = server.workers,
        config = %source,
        "sluice serving"
    );
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: draining"); break; }
            _ = int.recv() => { tracing::info!("SIGINT: draining"); break; }
            _ = hup.recv() => reload(shared, path.as_ref(), demo),
        }
    }
    let _ = stop_tx.send(true);
    // The workers drain (each bounded by shutdown_timeout) on their own threads.
    tokio::task::spawn_blocking(move || workers.join())
        .await
        .context("joining the workers")?;
    tracing::info!("drained");
    build::close_stores(&shared.current());
    let _ = tokio::time::timeout(Duration::from_secs(1), admin).await;
    Ok(())
}

/// SIGHUP: reload, keeping the buckets of unchanged policies; refuse an invalid config.
fn reload(shared: &Shared, path: Option<&PathBuf>, demo: Option<std::net::SocketAddr>) {
    let Some(path) = path else {
        tracing::warn!("SIGHUP: running on the embedded defaults, nothing to reload");
        return;
    };
    let config = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            for line in e.to_string().lines() {
                tracing::error!(target: "sluice::reload", "{line}");
            }
            tracing::error!(config = %path.display(), "SIGHUP: invalid config refused; the old one keeps serving");
            return;
        }
    };
    let old = shared.current();
    if config.server.listen != old.config.server.listen
        || config.server.admin_listen != old.config.server.admin_listen
    {
        tracing::warn!("SIGHUP: listen addresses are read at start only; restart to change them");
    }
    if config
        .routes
        .iter()
        .any(|r| r.upstream == UpstreamConfig::BuiltinDemo)
        && demo.is_none()
    {
        tracing::error!("SIGHUP: builtin:demo needs a restart (the demo upstream was not started); config refused");
        return;
    }
    match build(config, Some(&old), demo) {
        Ok(new) => {
            tracing::info!(
                config = %path.display(),
                policies = new.policies.len(),
                kept = ?new.kept,
                "SIGHUP: reloaded; the listed policies kept their buckets"
            );
            shared.runtime.store(Arc::new(new));
        }
        Err(e) => {
            tracing::error!(error = %e, "SIGHUP: config refused; the old one keeps serving");
        }
    }
}

/// For tests and `check-config`: builds a runtime from `config` without listening.
///
/// # Errors
///
/// As [`build`].
pub fn dry_run(config: Config) -> Result<Runtime, build::BuildError> {
    build::build_with(config, None, None, true)
}
