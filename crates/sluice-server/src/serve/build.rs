//! From a valid [`Config`] to a running gateway: policies (keeping the buckets of unchanged
//! ones across reloads), routes, upstreams.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice::store::{FileStore, FileStoreOptions, RedisConfig, RedisStore};
use sluice_core::AnyAlgorithm;
use sluice_http::{Backend, Gateway, Policy, Route, RouteTable, TrustedProxies, Upstream};

use crate::config::{BackendKind, Config, OnError, PolicyConfig, UpstreamConfig};

/// Everything one configuration runs with; replaced whole on reload.
#[derive(Debug)]
pub struct Runtime {
    /// The configuration.
    pub config: Config,
    /// The request handler.
    pub gateway: Gateway,
    /// The policies by name.
    pub policies: HashMap<String, Arc<Policy>>,
    /// The policies that kept the buckets of the previous runtime.
    pub kept: Vec<String>,
    /// `[browser]`: the browser assets and telemetry, answered before the routes.
    pub browser: Option<crate::browser::Browser>,
}

/// A policy that could not be built from a valid configuration (a store refused it).
#[derive(Debug, thiserror::Error)]
#[error("{file}:{line}: policy `{name}`: {message}")]
pub struct BuildError {
    /// The config file.
    pub file: String,
    /// The line of the policy's name.
    pub line: usize,
    /// The policy.
    pub name: String,
    /// What went wrong.
    pub message: String,
    /// Whether the machine refused it (a state file in use, unreadable or corrupt: exit
    /// status 1, like a port in use) rather than the configuration asking for something
    /// impossible (exit status 2).
    pub machine: bool,
}

/// Builds the runtime of `config`, carrying over the buckets of `old`'s policies that did
/// not change (same name, algorithm, quota, key, key cap, queue and store kind).
///
/// # Errors
///
/// [`BuildError`] when a store refuses a policy (e.g. an algorithm Redis cannot run, or a
/// store kind this build lacks).
pub fn build(
    config: Config,
    old: Option<&Runtime>,
    demo: Option<SocketAddr>,
) -> Result<Runtime, BuildError> {
    build_with(config, old, demo, false)
}

/// [`build`]; with `dry`, file-backed policies are checked but get a memory store, so that
/// validating a config creates no file.
///
/// # Errors
///
/// As [`build`].
pub fn build_with(
    config: Config,
    old: Option<&Runtime>,
    demo: Option<SocketAddr>,
    dry: bool,
) -> Result<Runtime, BuildError> {
    let mut policies = HashMap::new();
    let mut kept = Vec::new();
    for p in &config.policies {
        let previous = old.and_then(|o| o.policies.get(&p.name));
        let (policy, reused) = build_policy(&config, p, previous, dry)?;
        if reused {
            kept.push(p.name.clone());
        }
        policies.insert(p.name.clone(), Arc::new(policy));
    }
    let demo_upstream: Option<Upstream> = demo.and_then(|a| format!("http://{a}").parse().ok());
    let routes = config
        .routes
        .iter()
        .map(|r| {
            let upstream = match &r.upstream {
                UpstreamConfig::Url(u) => u.clone(),
                UpstreamConfig::BuiltinDemo => demo_upstream
                    .clone()
                    .unwrap_or_else(|| "http://127.0.0.1:9".parse().expect("valid URL")),
            };
            Route::new(r.path_prefix.clone(), upstream)
                .methods(r.methods.clone())
                .policies(
                    r.policies
                        .iter()
                        .filter_map(|n| policies.get(n).cloned())
                        .collect(),
                )
                .queue_max_body(r.queue_max_body)
                .upstream_timeout(r.upstream_timeout)
        })
        .collect();
    let gateway = Gateway::new(
        RouteTable::new(routes),
        TrustedProxies::new(config.server.trusted_proxies.iter().copied()),
    );
    let browser = config.browser.as_ref().map(|b| {
        crate::browser::Browser::new(
            b,
            TrustedProxies::new(config.server.trusted_proxies.iter().copied()),
        )
    });
    Ok(Runtime {
        config,
        gateway,
        policies,
        kept,
        browser,
    })
}

fn build_policy(
    config: &Config,
    p: &PolicyConfig,
    previous: Option<&Arc<Policy>>,
    dry: bool,
) -> Result<(Policy, bool), BuildError> {
    let error = |message: String, machine: bool| BuildError {
        file: config.source.clone(),
        line: p.line,
        name: p.name.clone(),
        message,
        machine,
    };
    let fail = |message: String| error(message, false);
    let algorithm = AnyAlgorithm::new(p.algorithm, p.quota);
    let mut builder = Policy::builder(p.name.clone(), algorithm)
        .key(p.key.clone())
        .max_keys(p.max_keys);
    if let Some(q) = p.queue {
        builder = builder.queue(q.depth, q.max_wait);
    }
    if let Some(n) = p.concurrency {
        builder = builder.concurrency(n);
    }
    // Carry over first: an unchanged policy keeps its store (and so its buckets) whatever
    // the store kind; only a changed one gets a new store below.
    let reused = previous.is_some_and(|old| {
        old.algorithm() == &algorithm
            && old.key_spec() == &p.key
            && old.max_keys() == p.max_keys
            && old.queue() == p.queue.filter(|q| q.depth > 0)
            && old.backend().kind() == kind_name(config.store.backend)
    });
    if let (true, Some(old)) = (reused, previous) {
        builder = builder.reuse(old);
    } else {
        match config.store.backend {
            BackendKind::Memory => {}
            BackendKind::Redis => {
                let store = &config.store;
                let mut rc = if store.cluster {
                    RedisConfig::cluster(store.urls.clone())
                } else {
                    RedisConfig::new(store.urls.first().cloned().unwrap_or_default())
                };
                rc = rc
                    .timeout(store.timeout)
                    .on_error(match store.on_error {
                        OnError::Allow => sluice::store::OnError::Allow,
                        OnError::Deny => sluice::store::OnError::Deny,
                        OnError::Local => sluice::store::OnError::Local,
                    })
                    .prefix(format!("{}:{}", store.prefix, p.name))
                    .max_keys(p.max_keys);
                if let Some(q) = p.queue {
                    rc = rc.queue(q.depth, q.max_wait);
                }
                let redis = RedisStore::new(algorithm, rc).map_err(|e| fail(e.to_string()))?;
                builder = builder.backend(Backend::Redis(redis));
            }
            // Validating a config creates no file: a memory store stands in.
            BackendKind::File if dry => {}
            BackendKind::File => {
                let path = file_path(config, &p.name);
                // A changed policy reopens its file: close the old store first, so that it
                // stops writing (its last, clean write is of the old limits; the new store
                // restores from it by the file store's rule).
                if let Some(sluice_http::Backend::File(old)) = previous.map(|o| o.backend()) {
                    if let Err(e) = old.close() {
                        tracing::warn!(error = %e, policy = %p.name, "closing the old file store");
                    }
                }
                let mut options = FileStoreOptions::default()
                    .max_keys(p.max_keys)
                    .write_interval(config.store.max_loss);
                if let Some(q) = p.queue {
                    options = options.queue(q.depth, q.max_wait);
                }
                let store = FileStore::open(&path, algorithm, options)
                    .map_err(|e| error(e.to_string(), true))?;
                tracing::info!(policy = %p.name, path = %path.display(), restored = ?store.restored(), "file store opened");
                builder = builder.backend(sluice_http::Backend::File(store));
            }
        }
        if let Some(old) = previous {
            // Keep at least the concurrency pool when only the rate changed.
            if let (Some(n), Some(pool)) = (p.concurrency, old.concurrency()) {
                if pool.size() == n {
                    builder = builder.reuse_pool(old);
                }
            }
        }
    }
    let policy = builder.build().map_err(|e| fail(e.to_string()))?;
    Ok((policy, reused))
}

fn kind_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Memory => "memory",
        BackendKind::File => "file",
        BackendKind::Redis => "redis",
    }
}

/// The state file of policy `name`: `<store.path>.<name>`.
pub fn file_path(config: &Config, name: &str) -> std::path::PathBuf {
    let base = config
        .store
        .path
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from("sluice.state"));
    let mut file = base.into_os_string();
    file.push(".");
    file.push(name);
    file.into()
}

/// Closes the file stores of `runtime`, writing their final, clean files (at shutdown).
pub fn close_stores(runtime: &Runtime) {
    for (name, policy) in &runtime.policies {
        if let sluice_http::Backend::File(store) = policy.backend() {
            match store.close() {
                Ok(()) => tracing::info!(policy = %name, "file store closed"),
                Err(e) => tracing::warn!(policy = %name, error = %e, "closing the file store"),
            }
        }
    }
}
