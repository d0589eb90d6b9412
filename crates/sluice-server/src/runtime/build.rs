//! From a valid [`Config`] to a running gateway: policies (carrying over the buckets of the
//! previous runtime's), routes, upstreams.
//!
//! A reload is build-then-swap: [`build`] makes the whole new runtime without changing
//! anything the old one uses (a store that cannot be opened fails the build, and the old
//! runtime keeps serving as it was). A policy whose store settings and key are unchanged keeps
//! its store, the one owner of its keys' state: [`Runtime::prepare`] changes that store's
//! quota, key cap and queue in place (every key converted under its shard's lock, requests
//! waiting left in their queues) just before the swap, and [`Runtime::take_over`] closes, once
//! the new runtime is in use, the file stores it no longer needs.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice::store::{FileStore, FileStoreOptions, RedisConfig, RedisStore};
use sluice_core::AnyAlgorithm;
use sluice_http::{
    Backend, Gateway, KeyHasher, KeySpec, Policy, Route, RouteTable, TrustedProxies, Upstream,
};

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
    /// The policies that kept the store of the previous runtime as it was.
    pub kept: Vec<String>,
    /// The policies that kept the store of the previous runtime, converted in place to a new
    /// quota, key cap or queue.
    pub carried: Vec<String>,
    /// `[browser]`: the browser assets and telemetry, answered before the routes.
    pub browser: Option<crate::browser::Browser>,
    /// `[[rls]]`: the descriptors Envoy's rate limit service decides, over these policies.
    pub rls: crate::runtime::rls_table::RlsTable,
    /// What to do once this runtime is in use (see [`Runtime::take_over`]).
    handovers: std::sync::Mutex<Vec<Handover>>,
}

/// What changes hands between the previous runtime and this one.
#[derive(Debug)]
enum Handover {
    /// A store kept from the previous runtime, reconfigured in place before the swap.
    Reconfigure(String, Backend, Settings),
    /// A concurrency pool kept from the previous runtime (its slots in use included),
    /// resized in place before the swap: its size, queue depth and longest wait.
    Resize(sluice::Pool, usize, usize, std::time::Duration),
    /// A file store the new runtime does not use: closed once it is in use, its final file
    /// clean.
    Close(String, FileStore),
}

/// What a policy's store is reconfigured to.
#[derive(Debug, Clone, Copy)]
struct Settings {
    algorithm: AnyAlgorithm,
    max_keys: usize,
    queue_depth: usize,
    max_wait: std::time::Duration,
}

impl Settings {
    /// Applies the settings to `backend`, converting its keys in place.
    fn apply(&self, backend: &Backend) -> Result<usize, String> {
        match backend {
            Backend::Memory(store) => Ok(store.reconfigure(
                self.algorithm,
                self.max_keys,
                self.queue_depth,
                self.max_wait,
            )),
            Backend::File(store) => {
                let options = FileStoreOptions::default()
                    .max_keys(self.max_keys)
                    .queue(self.queue_depth, self.max_wait);
                Ok(store.reconfigure(self.algorithm, &options))
            }
            Backend::Redis(store) => store
                .reconfigure(
                    self.algorithm,
                    self.queue_depth,
                    self.max_wait,
                    self.max_keys,
                )
                .map(|()| 0)
                .map_err(|e| e.to_string()),
            _ => Ok(0),
        }
    }
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

/// Builds the runtime of `config`, carrying over the state of `old`'s policies of the same
/// name and key: as it is when nothing else changed, else converted to the new quota so that
/// no key gains tokens. Nothing `old` uses is changed: see [`Runtime::take_over`].
///
/// # Errors
///
/// [`BuildError`] when a store refuses a policy (e.g. an algorithm Redis cannot run, a state
/// file that cannot be written, or a store kind this build lacks).
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
    if old.is_none() && !dry && config.store.key_salt.is_none() {
        for p in &config.policies {
            if matches!(config.store.backend, BackendKind::File | BackendKind::Redis)
                && matches!(
                    p.key,
                    KeySpec::Header(_) | KeySpec::Cookie(_) | KeySpec::Query(_)
                )
            {
                tracing::warn!(policy = %p.name, "keys are stored as an unsalted hash: set store.key_salt (env:NAME or file:/path) so that a leaked store does not let anyone test guesses of them");
            }
        }
    }
    let mut policies = HashMap::new();
    let mut kept = Vec::new();
    let mut carried = Vec::new();
    let mut handovers = Vec::new();
    for p in &config.policies {
        let previous = old.and_then(|o| o.policies.get(&p.name));
        let previous_prefix = old.map(|o| o.config.store.prefix.as_str());
        // Each plan is a policy of its own quota and store, `NAME@PLAN`, carried over from
        // the previous runtime's plan of that name as any policy is.
        let mut tiers = Vec::with_capacity(p.plans.len());
        for plan in &p.plans {
            let tier_config = PolicyConfig {
                name: format!("{}@{}", p.name, plan.name),
                quota: plan.quota,
                concurrency: None,
                plan: None,
                plans: Vec::new(),
                ..p.clone()
            };
            let previous_tier = previous
                .and_then(|o| o.plans())
                .and_then(|plans| plans.get(&plan.name));
            let (tier, _) = build_policy(
                &config,
                &tier_config,
                previous_tier,
                previous_prefix,
                dry,
                Vec::new(),
                &mut handovers,
            )?;
            tiers.push((plan.name.clone(), Arc::new(tier)));
        }
        let (policy, how) = build_policy(
            &config,
            p,
            previous,
            previous_prefix,
            dry,
            tiers,
            &mut handovers,
        )?;
        match how {
            Carry::Kept => kept.push(p.name.clone()),
            Carry::Converted => carried.push(p.name.clone()),
            Carry::Fresh => {}
        }
        policies.insert(p.name.clone(), Arc::new(policy));
    }
    if let Some(old) = old {
        // File stores of the old runtime that no policy (or plan) of the new one writes:
        // closed.
        let written: Vec<Arc<Policy>> = every_store(&policies).map(|(_, p)| p).collect();
        for (name, policy) in every_store(&old.policies) {
            if let Backend::File(store) = policy.backend() {
                let still_written = written.iter().any(|p| match p.backend() {
                    Backend::File(s) => s.path() == store.path(),
                    _ => false,
                });
                if !still_written {
                    handovers.push(Handover::Close(name, store.clone()));
                }
            }
        }
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
                .max_body(r.max_body.unwrap_or(config.server.max_body))
        })
        .collect();
    let gateway = Gateway::new(
        RouteTable::new(routes),
        TrustedProxies::new(config.server.trusted_proxies.iter().copied()),
    )
    .client_body_timeout(config.server.client_body_timeout)
    .upstream_read_timeout(config.server.upstream_read_timeout)
    .tunnel_idle_timeout(config.server.keep_alive_timeout);
    let browser = config.browser.as_ref().map(|b| {
        crate::browser::Browser::new(
            b,
            TrustedProxies::new(config.server.trusted_proxies.iter().copied()),
        )
    });
    let rls = crate::runtime::rls_table::RlsTable::new(&config.rls, &policies);
    Ok(Runtime {
        rls,
        config,
        gateway,
        policies,
        kept,
        carried,
        browser,
        handovers: std::sync::Mutex::new(handovers),
    })
}

impl Runtime {
    /// Before this runtime is swapped in: waits (at most 2 s) until each of its new Redis
    /// stores answers (a new store connects in the background, and until then `on_error`
    /// decides, which a swap should not bring on while Redis is up), then reconfigures in
    /// place the stores it keeps from the previous runtime, so that the new quota applies to
    /// their keys, and to the requests waiting on them, from this moment.
    pub async fn prepare(&self) {
        self.wait_for_redis().await;
        let reconfigure: Vec<Handover> = {
            let mut handovers = self.lock_handovers();
            let (now, later) = std::mem::take(&mut *handovers)
                .into_iter()
                .partition(|h| matches!(h, Handover::Reconfigure(..) | Handover::Resize(..)));
            *handovers = later;
            now
        };
        for handover in reconfigure {
            match handover {
                Handover::Reconfigure(name, backend, settings) => match settings.apply(&backend) {
                    Ok(keys) => {
                        tracing::info!(policy = %name, store = backend.kind(), keys, "policy reconfigured in place: each key converted to the new quota")
                    }
                    Err(e) => {
                        tracing::warn!(policy = %name, error = %e, "policy not reconfigured: its store keeps the previous quota")
                    }
                },
                Handover::Resize(pool, size, depth, max_wait) => {
                    if let Some(size) = std::num::NonZeroUsize::new(size) {
                        pool.resize(size);
                    }
                    pool.set_queue(depth, max_wait);
                }
                Handover::Close(..) => {}
            }
        }
    }

    async fn wait_for_redis(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
        for (name, policy) in every_store(&self.policies) {
            let Backend::Redis(store) = policy.backend() else {
                continue;
            };
            while !store.is_using_redis() {
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!(policy = %name, "redis: the new store is not connected yet; store.on_error decides until it is");
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
        }
    }

    /// Once this runtime is the one in use: the file stores of the previous runtime that no
    /// policy uses any more are closed, their final files clean. Idempotent.
    pub async fn take_over(&self) {
        let handovers = std::mem::take(&mut *self.lock_handovers());
        for handover in handovers {
            if let Handover::Close(name, store) = handover {
                match store.close() {
                    Ok(()) => {
                        tracing::info!(policy = %name, path = %store.path().display(), "file store closed")
                    }
                    Err(e) => tracing::warn!(policy = %name, error = %e, "closing the file store"),
                }
            }
        }
    }

    fn lock_handovers(&self) -> std::sync::MutexGuard<'_, Vec<Handover>> {
        self.handovers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What became of a policy's state on a reload.
enum Carry {
    /// The old store, unchanged.
    Kept,
    /// The old store, reconfigured in place.
    Converted,
    /// A new store, starting as that store starts.
    Fresh,
}

/// Every store of `policies`: each policy's, and each of its plans' (named `NAME@PLAN`).
pub fn every_store(
    policies: &HashMap<String, Arc<Policy>>,
) -> impl Iterator<Item = (String, Arc<Policy>)> + '_ {
    policies.iter().flat_map(|(name, policy)| {
        let tiers: Vec<(String, Arc<Policy>)> = policy
            .plans()
            .map(|plans| {
                plans
                    .iter()
                    .map(|(plan, p)| (format!("{name}@{plan}"), Arc::clone(p)))
                    .collect()
            })
            .unwrap_or_default();
        std::iter::once((name.clone(), Arc::clone(policy))).chain(tiers)
    })
}

fn build_policy(
    config: &Config,
    p: &PolicyConfig,
    previous: Option<&Arc<Policy>>,
    previous_prefix: Option<&str>,
    dry: bool,
    tiers: Vec<(String, Arc<Policy>)>,
    handovers: &mut Vec<Handover>,
) -> Result<(Policy, Carry), BuildError> {
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
        .shadow(p.shadow)
        .key(p.key.clone())
        .max_keys(p.max_keys);
    if let Some(q) = p.queue {
        builder = builder.queue(q.depth, q.max_wait);
    }
    if let Some(n) = p.concurrency {
        builder = builder.concurrency(n);
    }
    if let Some(cost) = &p.cost {
        builder = builder.cost(cost.clone());
    }
    if let Some(source) = &p.plan {
        builder = builder.plans(source.clone(), tiers);
    }
    if matches!(config.store.backend, BackendKind::File | BackendKind::Redis) {
        // Keys from headers, cookies and query parameters are secrets: the store gets their
        // keyed hash (the policy leaves IP keys as they are).
        let salt = config
            .store
            .key_salt
            .as_ref()
            .map_or(&[][..], |s| &s.bytes[..]);
        builder = builder.hash_keys(KeyHasher::new(salt));
    }
    let redis_config = (config.store.backend == BackendKind::Redis).then(|| {
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
        if let Some(lease) = p.lease {
            rc = rc.lease(lease.config);
        }
        rc
    });
    let path = file_path(config, &p.name);
    // The same store settings: the old store, the owner of its keys' state, serves the new
    // policy (a change of store settings needs a restart, see `changes::needs_restart`).
    let same_store = previous.is_some_and(|old| match (old.backend(), config.store.backend) {
        (Backend::Memory(_), BackendKind::Memory) => true,
        (Backend::File(s), BackendKind::File) => s.path() == path,
        (Backend::Redis(s), BackendKind::Redis) => redis_config
            .as_ref()
            .is_some_and(|rc| same_redis(s.config(), rc)),
        _ => false,
    });
    if let (true, Some(old)) = (same_store, previous.filter(|o| o.key_spec() == &p.key)) {
        let unchanged = old.algorithm() == &algorithm
            && old.max_keys() == p.max_keys
            && old.queue() == p.queue.filter(|q| q.depth > 0);
        let (depth, max_wait) = p
            .queue
            .map_or((0, std::time::Duration::ZERO), |q| (q.depth, q.max_wait));
        let backend = old.backend().clone();
        let how = if unchanged {
            Carry::Kept
        } else {
            handovers.push(Handover::Reconfigure(
                p.name.clone(),
                backend.clone(),
                Settings {
                    algorithm,
                    max_keys: p.max_keys,
                    queue_depth: depth,
                    max_wait,
                },
            ));
            Carry::Converted
        };
        builder = keep_pool(builder.backend(backend), p, previous, handovers);
        let policy = builder.build().map_err(|e| fail(e.to_string()))?;
        return Ok((policy, how));
    }
    match config.store.backend {
        BackendKind::Memory => {}
        BackendKind::Redis => {
            let rc = redis_config.unwrap_or_else(|| RedisConfig::new(""));
            if let Some(Backend::Redis(old)) = previous.map(|o| o.backend()) {
                if old.config().urls() != rc.urls()
                    || config.store.prefix != previous_prefix.unwrap_or_default()
                {
                    tracing::warn!(policy = %p.name, prefix = %config.store.prefix, "redis: the policy now reads its keys under this prefix and URL; those under the previous ones are not read again and expire by themselves");
                }
            }
            let redis = RedisStore::new(algorithm, rc).map_err(|e| fail(e.to_string()))?;
            builder = builder.backend(Backend::Redis(redis));
        }
        // Validating a config creates no file: a memory store stands in.
        BackendKind::File if dry => {}
        BackendKind::File => {
            if previous.is_some_and(|o| matches!(o.backend(), Backend::File(s) if s.path() == path))
            {
                // Another key spec on the same file: the old store must stop writing it
                // first, which only a restart does without a gap.
                return Err(fail(format!(
                    "its key changed and its state file {} is in use; use another store.path or restart",
                    path.display()
                )));
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
            builder = builder.backend(Backend::File(store));
        }
    }
    builder = keep_pool(builder, p, previous, handovers);
    let policy = builder.build().map_err(|e| fail(e.to_string()))?;
    Ok((policy, Carry::Fresh))
}

/// Keeps the previous policy's concurrency pool, with its slots in use, and has it resized in
/// place before the swap: two pools would each admit their size.
fn keep_pool(
    builder: sluice_http::PolicyBuilder,
    p: &PolicyConfig,
    previous: Option<&Arc<Policy>>,
    handovers: &mut Vec<Handover>,
) -> sluice_http::PolicyBuilder {
    let (Some(size), Some(pool)) = (p.concurrency, previous.and_then(|o| o.concurrency())) else {
        return builder;
    };
    let (depth, max_wait) = p
        .queue
        .map_or((0, std::time::Duration::ZERO), |q| (q.depth, q.max_wait));
    handovers.push(Handover::Resize(pool.clone(), size, depth, max_wait));
    builder.pool(pool.clone())
}

/// Whether two Redis configurations reach the same keys the same way: all but the quota, the
/// key cap and the queue, which a store changes in place.
fn same_redis(a: &RedisConfig, b: &RedisConfig) -> bool {
    let strip = |c: &RedisConfig| c.clone().max_keys(1).queue(0, std::time::Duration::ZERO);
    strip(a) == strip(b)
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

/// Gives back the slices every leased Redis policy holds, so that other gateways can spend
/// them at once rather than after they expire.
pub async fn give_back_leases(runtime: &Runtime) {
    for (name, policy) in every_store(&runtime.policies) {
        if let sluice_http::Backend::Redis(store) = policy.backend() {
            if store.config().leasing().is_some() {
                store.give_back_leases().await;
                tracing::info!(policy = %name, "redis leases given back");
            }
        }
    }
}

/// Closes the file stores of `runtime`, writing their final, clean files (at shutdown).
pub fn close_stores(runtime: &Runtime) {
    for (name, policy) in every_store(&runtime.policies) {
        if let sluice_http::Backend::File(store) = policy.backend() {
            match store.close() {
                Ok(()) => tracing::info!(policy = %name, "file store closed"),
                Err(e) => tracing::warn!(policy = %name, error = %e, "closing the file store"),
            }
        }
    }
}
