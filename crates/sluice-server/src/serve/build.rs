//! From a valid [`Config`] to a running gateway: policies (carrying over the buckets of the
//! previous runtime's), routes, upstreams.
//!
//! A reload is build-then-swap: [`build`] makes the whole new runtime without changing
//! anything the old one uses (a store that cannot be opened fails the build, and the old
//! runtime keeps serving as it was); once it is in use, [`Runtime::take_over`] retires what
//! the old one no longer needs (its file stores stop writing, its Redis keys are converted).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use sluice::store::{FileStore, FileStoreOptions, RedisConfig, RedisStore};
use sluice_core::{Algorithm as _, AnyAlgorithm};
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
    /// The policies whose keys were carried over, converted, into a new store.
    pub carried: Vec<String>,
    /// `[browser]`: the browser assets and telemetry, answered before the routes.
    pub browser: Option<crate::browser::Browser>,
    /// `[[rls]]`: the descriptors Envoy's rate limit service decides, over these policies.
    pub rls: crate::rls::RlsTable,
    /// What to do once this runtime is in use (see [`Runtime::take_over`]).
    handovers: std::sync::Mutex<Vec<Handover>>,
}

/// What the previous runtime hands over once the new one is in use.
#[derive(Debug)]
enum Handover {
    /// A file store that succeeds the old one: the old stops writing, the new starts.
    File(FileStore),
    /// A file store the new runtime does not use: closed, its final file clean.
    Close(String, FileStore),
    /// A Redis store with a new quota: the keys in Redis are converted from `from`.
    Redis(String, RedisStore, AnyAlgorithm),
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
        let old_prefix = old.map(|o| o.config.store.prefix.as_str());
        let (policy, how) = build_policy(&config, p, previous, old_prefix, dry, &mut handovers)?;
        match how {
            Carry::Kept => kept.push(p.name.clone()),
            Carry::Converted => carried.push(p.name.clone()),
            Carry::Fresh => {}
        }
        policies.insert(p.name.clone(), Arc::new(policy));
    }
    if let Some(old) = old {
        // File stores of the old runtime that no policy of the new one writes: closed.
        for (name, policy) in &old.policies {
            if let Backend::File(store) = policy.backend() {
                let still_written = policies.values().any(|p| match p.backend() {
                    Backend::File(s) => s.path() == store.path(),
                    _ => false,
                });
                if !still_written {
                    handovers.push(Handover::Close(name.clone(), store.clone()));
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
    .tunnel_idle_timeout(config.server.keep_alive_timeout);
    let browser = config.browser.as_ref().map(|b| {
        crate::browser::Browser::new(
            b,
            TrustedProxies::new(config.server.trusted_proxies.iter().copied()),
        )
    });
    let rls = crate::rls::RlsTable::new(&config.rls, &policies);
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
    /// Before this runtime is swapped in: converts the Redis keys that are safe to convert
    /// while the old runtime still reads them (see [`before_swap`]), so that the new runtime
    /// finds them converted.
    ///
    /// First waits (at most 2 s) until each of its Redis stores answers: a new store connects
    /// in the background, and until then `on_error` decides (a 503 with `deny`, a bucket of
    /// this process with `local`), which a swap should not bring on while Redis is up.
    pub async fn prepare(&self) {
        self.wait_for_redis().await;
        self.convert_redis(true).await;
    }

    async fn wait_for_redis(&self) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
        for (name, policy) in &self.policies {
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

    /// Once this runtime is the one in use: the file stores it succeeds stop writing and
    /// its own start (on the same file) or the old ones are closed (on another), and the
    /// other Redis keys are converted (read unconverted by the new runtime meanwhile, they
    /// show more debt, never less). Idempotent.
    pub async fn take_over(&self) {
        let handovers = std::mem::take(&mut *self.lock_handovers());
        let mut rest = Vec::new();
        for handover in handovers {
            match handover {
                Handover::File(store) => {
                    if let Err(e) = store.take_over() {
                        tracing::warn!(path = %store.path().display(), error = %e, "file store: first write after the reload failed; retrying");
                    }
                }
                Handover::Close(name, store) => match store.close() {
                    Ok(()) => {
                        tracing::info!(policy = %name, path = %store.path().display(), "file store closed")
                    }
                    Err(e) => tracing::warn!(policy = %name, error = %e, "closing the file store"),
                },
                other => rest.push(other),
            }
        }
        *self.lock_handovers() = rest;
        self.convert_redis(false).await;
    }

    fn lock_handovers(&self) -> std::sync::MutexGuard<'_, Vec<Handover>> {
        self.handovers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Converts the Redis keys of the policies that [`before_swap`] says (`growing`) or not.
    async fn convert_redis(&self, growing: bool) {
        let mut todo = Vec::new();
        self.lock_handovers().retain(|h| match h {
            Handover::Redis(name, store, from)
                if before_swap(store.algorithm(), from) == growing =>
            {
                todo.push((name.clone(), store.clone(), *from));
                false
            }
            _ => true,
        });
        for (name, store, from) in todo {
            let converting = store.convert_from(&from);
            match tokio::time::timeout(std::time::Duration::from_secs(10), converting).await {
                Ok(Ok(keys)) => {
                    tracing::info!(policy = %name, keys, "redis: keys converted to the new quota")
                }
                Ok(Err(e)) => {
                    tracing::warn!(policy = %name, error = %e, "redis: keys not converted to the new quota")
                }
                Err(_) => tracing::warn!(
                    policy = %name,
                    "redis: converting the keys to the new quota took over 10 s; the rest keep the old form"
                ),
            }
        }
    }
}

/// Whether the Redis keys of a policy going from `from` to `to` are converted before the new
/// runtime is in use: when the window grows (converted, the keys read by the old runtime show
/// more debt, never less), or when the keys move to another state family (the old runtime
/// does not read them). Otherwise after: unconverted, they show the new runtime more debt.
fn before_swap(to: &AnyAlgorithm, from: &AnyAlgorithm) -> bool {
    use sluice_core::Kind::{Gcra, LeakyBucket, TokenBucket};
    let bucket = |k| matches!(k, Gcra | TokenBucket | LeakyBucket);
    let same_family = to.which() == from.which() || (bucket(to.which()) && bucket(from.which()));
    !same_family || to.quota().window_ns() >= from.quota().window_ns()
}

/// What became of a policy's state on a reload.
enum Carry {
    /// The old store, unchanged.
    Kept,
    /// A new store, holding the old keys converted.
    Converted,
    /// A new store, starting as that store starts.
    Fresh,
}

fn build_policy(
    config: &Config,
    p: &PolicyConfig,
    previous: Option<&Arc<Policy>>,
    old_prefix: Option<&str>,
    dry: bool,
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
        rc
    });
    let path = file_path(config, &p.name);
    // The same store settings: the old store, as it is, serves the new policy.
    let same_store = previous.is_some_and(|old| match (old.backend(), config.store.backend) {
        (Backend::Memory(_), BackendKind::Memory) => true,
        (Backend::File(s), BackendKind::File) => s.path() == path,
        (Backend::Redis(s), BackendKind::Redis) => Some(s.config()) == redis_config.as_ref(),
        _ => false,
    });
    let unchanged = previous.is_some_and(|old| {
        old.algorithm() == &algorithm
            && old.key_spec() == &p.key
            && old.max_keys() == p.max_keys
            && old.queue() == p.queue.filter(|q| q.depth > 0)
    });
    if let (true, true, Some(old)) = (same_store, unchanged, previous) {
        let policy = builder
            .reuse(old)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        return Ok((policy, Carry::Kept));
    }
    // The keys mean the same only under the same key spec.
    let predecessor = previous.filter(|old| old.key_spec() == &p.key);
    let mut carry = Carry::Fresh;
    match config.store.backend {
        BackendKind::Memory => {}
        BackendKind::Redis => {
            let rc = redis_config.unwrap_or_else(|| RedisConfig::new(""));
            let redis = RedisStore::new(algorithm, rc).map_err(|e| fail(e.to_string()))?;
            // The state is in Redis: same prefix, same keys; a new quota converts them.
            if let Some(Backend::Redis(old)) = predecessor.map(|o| o.backend()) {
                if old_prefix == Some(config.store.prefix.as_str()) {
                    carry = Carry::Kept;
                    if old.algorithm() != &algorithm {
                        carry = Carry::Converted;
                        handovers.push(Handover::Redis(
                            p.name.clone(),
                            redis.clone(),
                            *old.algorithm(),
                        ));
                    }
                }
            }
            builder = builder.backend(Backend::Redis(redis));
        }
        // Validating a config creates no file: a memory store stands in.
        BackendKind::File if dry => {}
        BackendKind::File => {
            let mut options = FileStoreOptions::default()
                .max_keys(p.max_keys)
                .write_interval(config.store.max_loss);
            if let Some(q) = p.queue {
                options = options.queue(q.depth, q.max_wait);
            }
            let store = match predecessor.map(|o| o.backend()) {
                Some(Backend::File(old)) => {
                    let store = FileStore::succeed(old, &path, algorithm, options)
                        .map_err(|e| error(e.to_string(), true))?;
                    handovers.push(Handover::File(store.clone()));
                    carry = Carry::Converted;
                    store
                }
                _ => {
                    if previous.is_some_and(
                        |o| matches!(o.backend(), Backend::File(s) if s.path() == path),
                    ) {
                        // Another key spec on the same file: the old store must stop writing
                        // it first, which only a restart does without a gap.
                        return Err(fail(format!(
                            "its key changed and its state file {} is in use; use another store.path or restart",
                            path.display()
                        )));
                    }
                    let store = FileStore::open(&path, algorithm, options)
                        .map_err(|e| error(e.to_string(), true))?;
                    tracing::info!(policy = %p.name, path = %path.display(), restored = ?store.restored(), "file store opened");
                    store
                }
            };
            builder = builder.backend(Backend::File(store));
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
    let policy = builder.build().map_err(|e| fail(e.to_string()))?;
    if let (Backend::Memory(new), Some(Backend::Memory(old))) =
        (policy.backend(), predecessor.map(|o| o.backend()))
    {
        new.carry_from(old);
        carry = Carry::Converted;
    }
    Ok((policy, carry))
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
