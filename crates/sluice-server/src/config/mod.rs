//! The gateway configuration: TOML with every error reported at once, with its line.
//!
//! [`parse`] reads the document with spans (`toml::de::DeTable`), walks it by hand and
//! collects every problem (unknown keys included, as `deny_unknown_fields` would, but all of
//! them rather than the first) before anything is built. The keys are documented in the
//! crate's README.

mod browser;
pub mod lease;
mod otlp;
mod rls;
pub mod tls;
pub mod units;
mod walk;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use http::Method;
use ipnet::IpNet;
use sluice_core::{Kind, Quota, Rate};
use sluice_http::path::{canonical_path, Canonical};
use sluice_http::policy::{is_valid_name, QueueSpec};
use sluice_http::{KeySpec, Protocol, Upstream};
use toml::de::{DeTable, DeValue};

pub use browser::{
    BrowserConfig, FailMode, TelemetryConfig, RESERVED_PREFIX as BROWSER_RESERVED_PREFIX,
};
pub use otlp::OtlpConfig;
pub use rls::{RlsEntry, RlsRule};
pub use tls::{ServerTls, UpstreamCa};
pub use walk::ConfigError;
use walk::{Errors, Fields};

/// The embedded defaults used by `sluice serve` without `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The name shown for the embedded defaults.
pub const DEFAULT_SOURCE: &str = "<embedded defaults>";

/// The most policies one route may name.
pub const MAX_POLICIES_PER_ROUTE: usize = 16;

/// A valid configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from.
    pub source: String,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[store]`.
    pub store: StoreConfig,
    /// `[[policy]]`, in file order.
    pub policies: Vec<PolicyConfig>,
    /// `[[route]]`, in file order.
    pub routes: Vec<RouteConfig>,
    /// `[browser]`: the browser limiter the gateway serves, if any.
    pub browser: Option<BrowserConfig>,
    /// `[[rls]]`: Envoy rate-limit descriptors to policies, in file order.
    pub rls: Vec<RlsRule>,
    /// `[telemetry]`: span export over OTLP, off by default.
    pub telemetry: OtlpConfig,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Proxied traffic.
    pub listen: SocketAddr,
    /// Decision API, metrics, health.
    pub admin_listen: SocketAddr,
    /// Peers whose `X-Forwarded-For` is believed.
    pub trusted_proxies: Vec<IpNet>,
    /// How long SIGTERM waits for requests in flight.
    pub shutdown_timeout: Duration,
    /// How long a client may take to send its request head.
    pub header_read_timeout: Duration,
    /// The largest request head accepted (431 above).
    pub max_header_bytes: usize,
    /// Gateway worker threads, each with its own event loop, listening socket
    /// (`SO_REUSEPORT`) and upstream connection pool.
    pub workers: usize,
    /// The largest request body of a route without its own `max_body` (413 above).
    pub max_body: u64,
    /// The longest gap between two reads of a request body (408 after it).
    pub client_body_timeout: Duration,
    /// The most open client connections on the main listener, for the whole process; beyond
    /// it new connections are closed as soon as they are accepted.
    pub max_connections: usize,
    /// When `max_connections` was not set and the open-files limit could not hold its default:
    /// that hard limit, from which `max_connections` was sized instead.
    pub max_connections_sized_from: Option<u64>,
    /// The most upstream sockets the process holds at once (pooled, in use, tunnels); beyond
    /// it requests get 503.
    pub max_upstream_connections: usize,
    /// The most requests of one client connection (HTTP/2) holding upstream sockets at once;
    /// the others wait their turn for at most the connect timeout.
    pub max_upstream_per_connection: usize,
    /// The most requests one client connection may send; then it is closed gracefully
    /// (HTTP/1.1 `Connection: close`, HTTP/2 `GOAWAY`), as nginx's `keepalive_requests`.
    pub max_requests_per_connection: u32,
    /// The longest a write to a client may stall before its connection is closed.
    pub send_timeout: Duration,
    /// How long a client connection may stay idle between requests.
    pub keep_alive_timeout: Duration,
    /// How long connecting to an upstream may take (504 after it).
    pub upstream_connect_timeout: Duration,
    /// How long a pooled upstream connection may stay idle before it is closed.
    pub upstream_idle_timeout: Duration,
    /// Whether the gateway makes up an `X-Request-Id` for requests without one and echoes it.
    pub request_id: bool,
    /// The bearer token every admin endpoint but `/healthz` requires, if any.
    pub admin_token: Option<AdminToken>,
    /// `[server.tls]`: the main listener speaks TLS only, with this certificate.
    pub tls: Option<ServerTls>,
    /// Plain-text HTTP/2 with prior knowledge beside HTTP/1.1 on a listener without TLS.
    pub h2c: bool,
    /// `rls_listen`: Envoy's rate limit service (gRPC, h2c), off when `None`.
    pub rls_listen: Option<SocketAddr>,
}

/// `store.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// In memory.
    Memory,
    /// A local file.
    File,
    /// Redis.
    Redis,
}

/// `store.on_error`: what a Redis store does when Redis does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Admit.
    Allow,
    /// Deny (503).
    Deny,
    /// Decide with a local in-memory limit.
    Local,
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// `memory | file | redis`.
    pub backend: BackendKind,
    /// The state file (`file`).
    pub path: Option<PathBuf>,
    /// Redis URLs (`redis`).
    pub urls: Vec<String>,
    /// Whether `url` was given as a list: a Redis Cluster, reached through any of them.
    pub cluster: bool,
    /// What to do when Redis fails.
    pub on_error: OnError,
    /// How long to wait for Redis.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub prefix: String,
    /// `key_salt`: the salt of the keyed hash under which keys from headers, cookies and query
    /// parameters are stored in a file or Redis store.
    pub key_salt: Option<KeySalt>,
    /// `file`: D, the most consumption a crash may lose (the file is written every D/2).
    pub max_loss: Duration,
}

/// `store.key_salt`, read from where it names: `env:NAME` or `file:/path`.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySalt {
    /// What the config says (`env:NAME`, `file:/path`), never the secret.
    pub source: String,
    /// The salt.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for KeySalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySalt({})", self.source)
    }
}

impl KeySalt {
    /// Reads the salt named by `source`; a file's trailing newline is not part of it.
    ///
    /// # Errors
    ///
    /// What is wrong, for `store.key_salt`: another form, an unset variable, an unreadable
    /// file, an empty salt.
    pub fn read(source: &str) -> Result<KeySalt, String> {
        let bytes = read_secret(source, "the salt")?;
        Ok(KeySalt {
            source: source.to_owned(),
            bytes,
        })
    }
}

/// `server.admin_token`, read from where it names: `env:NAME` or `file:/path`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminToken {
    /// What the config says (`env:NAME`, `file:/path`), never the secret.
    pub source: String,
    /// The token.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AdminToken({})", self.source)
    }
}

impl AdminToken {
    /// Reads the token named by `source`; a file's trailing newline is not part of it.
    ///
    /// # Errors
    ///
    /// What is wrong, for `server.admin_token`: another form, an unset variable, an
    /// unreadable file, an empty token, or one that cannot travel in a header.
    pub fn read(source: &str) -> Result<AdminToken, String> {
        let bytes = read_secret(source, "the token")?;
        if !bytes.iter().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "`{source}` holds characters a bearer token cannot carry (visible ASCII only)"
            ));
        }
        Ok(AdminToken {
            source: source.to_owned(),
            bytes,
        })
    }

    /// Whether `presented` is the token, in time that depends on its length only.
    pub fn matches(&self, presented: &[u8]) -> bool {
        if presented.len() != self.bytes.len() {
            return false;
        }
        let diff = presented
            .iter()
            .zip(&self.bytes)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// Reads a secret named `env:NAME` or `file:/path` (a file's trailing newline is not part
/// of it); `what` names it in the errors.
fn read_secret(source: &str, what: &str) -> Result<Vec<u8>, String> {
    let bytes = if let Some(name) = source.strip_prefix("env:") {
        std::env::var_os(name)
            .ok_or_else(|| format!("environment variable `{name}` is not set"))?
            .into_encoded_bytes()
    } else if let Some(path) = source.strip_prefix("file:") {
        let mut bytes = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
        while bytes.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
            bytes.pop();
        }
        bytes
    } else {
        return Err(format!(
            "expected env:NAME or file:/path ({what} itself does not belong in the config file)"
        ));
    };
    if bytes.is_empty() {
        return Err(format!("`{source}` is empty"));
    }
    Ok(bytes)
}

/// The default `server.max_connections`, on a machine whose open-files limit holds it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;

/// Descriptors the process needs beside its client and upstream connections: the listeners,
/// state files, Redis and the logs.
pub const DESCRIPTOR_RESERVE: u64 = 256;

/// The open files `max_connections` client connections and `max_upstream` upstream sockets
/// need, with the reserve.
pub fn descriptors_needed(max_connections: usize, max_upstream: usize) -> u64 {
    max_connections as u64 + max_upstream as u64 + DESCRIPTOR_RESERVE
}

/// The hard open-files limit of this process, the most it may raise its soft limit to
/// (`None`: unlimited).
pub fn open_files_hard_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).maximum
}

/// The default `server.max_connections` under a hard open-files limit of `hard`: 10,000, or
/// as many as fit with an upstream socket each and the reserve.
pub fn default_max_connections(hard: Option<u64>) -> (usize, Option<u64>) {
    match hard {
        Some(hard)
            if hard < descriptors_needed(DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS) =>
        {
            let fit = hard.saturating_sub(DESCRIPTOR_RESERVE) / 2;
            (usize::try_from(fit.max(1)).unwrap_or(1), Some(hard))
        }
        _ => (DEFAULT_MAX_CONNECTIONS, None),
    }
}

/// The default `server.max_upstream_per_connection`.
pub const DEFAULT_MAX_UPSTREAM_PER_CONNECTION: usize = 32;

/// The default `server.max_requests_per_connection` (nginx's `keepalive_requests`).
pub const DEFAULT_MAX_REQUESTS_PER_CONNECTION: u32 = 1000;

/// The default `server.max_body`: nginx's `client_max_body_size`.
pub const DEFAULT_MAX_BODY: u64 = 1 << 20;

/// The default `store.max_loss`.
pub const DEFAULT_MAX_LOSS: Duration = Duration::from_millis(100);
/// The bounds of `store.max_loss`: below, the disk would be written too often; above, a
/// crash would leave every key spent for too long.
const MAX_LOSS_RANGE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(60));

/// `[[policy]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// `name`.
    pub name: String,
    /// `algorithm`.
    pub algorithm: Kind,
    /// `capacity` and `rate`.
    pub quota: Quota,
    /// `key`.
    pub key: KeySpec,
    /// `max_keys`.
    pub max_keys: usize,
    /// `queue`.
    pub queue: Option<QueueSpec>,
    /// `concurrency`.
    pub concurrency: Option<usize>,
    /// `shadow`: decide, count, log and send headers as usual, never deny or queue.
    pub shadow: bool,
    /// `lease`: the keys are spent in slices leased from Redis.
    pub lease: Option<lease::LeaseSpec>,
    /// The line of its `name`, for errors found when it is built.
    pub line: usize,
}

/// `route.upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamConfig {
    /// An `http://` URL.
    Url(Upstream),
    /// `builtin:demo`: the in-process demo upstream.
    BuiltinDemo,
}

/// `[[route]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// `path_prefix`.
    pub path_prefix: String,
    /// `methods` (empty: any).
    pub methods: Vec<Method>,
    /// `policies`, by name.
    pub policies: Vec<String>,
    /// `upstream`.
    pub upstream: UpstreamConfig,
    /// `queue_max_body`.
    pub queue_max_body: u64,
    /// `upstream_timeout`.
    pub upstream_timeout: Duration,
    /// `max_body`: this route's own limit, or `server.max_body`.
    pub max_body: Option<u64>,
    /// `upstream_ca`: the CA an `https://` upstream is verified against (else the system's).
    pub upstream_ca: Option<UpstreamCa>,
}

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// It could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is invalid; every error is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigError>),
}

/// Reads and validates the file at `path`.
///
/// # Errors
///
/// [`LoadError::Read`], or [`LoadError::Invalid`] with every problem found.
pub fn load(path: &Path) -> Result<Config, LoadError> {
    load_as(path, Routes::Required)
}

/// Whether a file must have a `[[route]]`: the gateway's must; one read for `sluice bundle`
/// (whose `[browser]` table alone matters) may have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// No `[[route]]` is an error.
    Required,
    /// No `[[route]]` is fine.
    Optional,
}

/// Reads and validates the file at `path` as [`load`] does, with or without its routes.
///
/// # Errors
///
/// [`LoadError::Read`], or [`LoadError::Invalid`] with every problem found.
pub fn load_as(path: &Path, routes: Routes) -> Result<Config, LoadError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        path: shown.clone(),
        source,
    })?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let mut errors = Errors::new(&shown, &text);
            errors.at(offset, "(file)", "the file is not valid UTF-8");
            return Err(LoadError::Invalid(errors.list));
        }
    };
    parse_as(&text, &shown, routes).map_err(LoadError::Invalid)
}

/// The embedded defaults.
pub fn defaults() -> Config {
    match parse(DEFAULT_CONFIG, DEFAULT_SOURCE) {
        Ok(config) => config,
        // A test checks the embedded file; this is unreachable in a tested build.
        Err(errors) => panic!("the embedded default config is invalid: {errors:?}"),
    }
}

/// Validates `text`, read from `file`.
///
/// # Errors
///
/// Every problem, in file order.
pub fn parse(text: &str, file: &str) -> Result<Config, Vec<ConfigError>> {
    parse_as(text, file, Routes::Required)
}

/// Validates `text`, read from `file`, with or without its routes.
///
/// # Errors
///
/// Every problem, in file order.
pub fn parse_as(text: &str, file: &str, need: Routes) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Errors::new(file, text);
    let (document, syntax) = DeTable::parse_recoverable(text);
    for e in &syntax {
        let offset = e.span().map_or(0, |s| s.start);
        errors.at(offset, "(syntax)", e.message().trim().to_owned());
    }
    if !syntax.is_empty() {
        errors.list.sort_by_key(|e| (e.line, e.column));
        return Err(errors.list);
    }
    let root = document.get_ref();
    let mut top = Fields::new(root, "");
    let server = match top.table("server", &mut errors) {
        Some((t, _)) => server(t, &mut errors),
        None => server(&DeTable::default(), &mut errors),
    };
    let store = match top.table("store", &mut errors) {
        Some((t, at)) => store(t, at, &mut errors),
        None => store(&DeTable::default(), 0, &mut errors),
    };
    let mut policies = Vec::new();
    // Names first, so that a route naming a policy with an error elsewhere is not also
    // told the policy does not exist.
    let mut names: HashMap<String, usize> = HashMap::new();
    let items = top.array("policy", &mut errors).unwrap_or_default();
    for (i, item) in items.iter().enumerate() {
        let Some(DeValue::String(name)) = item.get_ref().get("name").map(|v| v.get_ref()) else {
            continue;
        };
        let at = item.get_ref().get("name").map_or(0, |v| v.span().start);
        match names.get(name.as_ref()) {
            Some(first) => {
                let first_line = line_of(text, *first);
                errors.at(
                    at,
                    &format!("policy[{i}].name"),
                    format!("duplicate policy name `{name}` (first defined on line {first_line})"),
                );
            }
            None => {
                names.insert(name.to_string(), at);
            }
        }
    }
    for (i, item) in items.into_iter().enumerate() {
        let field = format!("policy[{i}]");
        let DeValue::Table(t) = item.get_ref() else {
            errors.value(item, &field, "expected a table ([[policy]])");
            continue;
        };
        if let Some((p, at)) = policy(t, &field, &mut errors) {
            if names.get(&p.name) == Some(&at) {
                policies.push(p);
            }
        }
    }
    if store.backend != BackendKind::Redis {
        for p in policies.iter().filter_map(|p| p.lease.map(|l| (p, l))) {
            errors.at(p.1.at, &format!("policy {}.lease", p.0.name), "leases are slices of a bucket shared through Redis: they need store.backend = \"redis\"");
        }
    }
    let mut routes: Vec<(RouteConfig, usize)> = Vec::new();
    if let Some(items) = top.array("route", &mut errors) {
        for (i, item) in items.into_iter().enumerate() {
            let field = format!("route[{i}]");
            let DeValue::Table(t) = item.get_ref() else {
                errors.value(item, &field, "expected a table ([[route]])");
                continue;
            };
            if let Some((r, at)) = route(t, &field, &names, &mut errors) {
                let clash = routes.iter().find(|(other, _)| {
                    other.path_prefix == r.path_prefix
                        && (other.methods.is_empty()
                            || r.methods.is_empty()
                            || other.methods.iter().any(|m| r.methods.contains(m)))
                });
                if let Some((_, first)) = clash {
                    let first_line = line_of(text, *first);
                    errors.at(at, &format!("{field}.path_prefix"), format!("duplicate route for `{}` and the same methods (first defined on line {first_line})", r.path_prefix));
                } else {
                    routes.push((r, at));
                }
            }
        }
    }
    if routes.is_empty() && errors.list.is_empty() && need == Routes::Required {
        errors.at(
            0,
            "route",
            "no [[route]]: the gateway would answer 404 to everything",
        );
    }
    let browser = top
        .table("browser", &mut errors)
        .map(|(t, _)| browser::parse(t, &mut errors));
    let rls = top
        .array("rls", &mut errors)
        .map(|items| rls::parse(items, &names, &mut errors))
        .unwrap_or_default();
    let telemetry = top
        .table("telemetry", &mut errors)
        .map(|(t, _)| otlp::parse(t, &mut errors))
        .unwrap_or_default();
    top.finish(&mut errors);
    if errors.list.is_empty() {
        Ok(Config {
            source: file.to_owned(),
            server,
            store,
            policies,
            routes: routes.into_iter().map(|(r, _)| r).collect(),
            browser,
            rls,
            telemetry,
        })
    } else {
        errors.list.sort_by_key(|e| (e.line, e.column));
        Err(errors.list)
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

fn duration(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: Duration,
    errors: &mut Errors<'_>,
) -> Duration {
    match fields.str(key, errors) {
        Some((text, at)) => match units::parse_duration(text) {
            Ok(d) => d,
            Err(message) => {
                errors.at(at, &fields.path(key), message);
                default
            }
        },
        None => default,
    }
}

/// A duration that must be greater than zero.
fn positive_duration(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: Duration,
    errors: &mut Errors<'_>,
) -> Duration {
    let at = fields.get(key).map_or(0, |v| v.span().start);
    let d = duration(fields, key, default, errors);
    if d.is_zero() {
        errors.at(at, &fields.path(key), "must be greater than zero");
        return default;
    }
    d
}

fn size(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: u64,
    errors: &mut Errors<'_>,
) -> u64 {
    let Some(value) = fields.get(key) else {
        return default;
    };
    let field = fields.path(key);
    match value.get_ref() {
        DeValue::String(text) => units::parse_size(text).unwrap_or_else(|message| {
            errors.value(value, &field, message);
            default
        }),
        DeValue::Integer(_) => walk::uint_value(value, &field, errors).unwrap_or(default),
        other => {
            errors.value(
                value,
                &field,
                format!(
                    "expected a size such as `64KiB`, found {}",
                    other.type_str()
                ),
            );
            default
        }
    }
}

fn socket_addr(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: &str,
    errors: &mut Errors<'_>,
) -> SocketAddr {
    let fallback: SocketAddr = default
        .parse()
        .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0)));
    match fields.str(key, errors) {
        Some((text, at)) => text.parse().unwrap_or_else(|_| {
            errors.at(at, &fields.path(key), format!("cannot read `{text}` as an address: expected IP:PORT such as `127.0.0.1:8080` or `[::1]:8080`"));
            fallback
        }),
        None => fallback,
    }
}

/// Whether two listeners cannot both bind: the same fixed port on the same address, or on
/// any address when either is the unspecified one (`0.0.0.0`, `[::]`). Port 0 asks the kernel
/// for a free port, so two port-0 listeners never collide.
fn listeners_collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

fn server(t: &DeTable<'_>, errors: &mut Errors<'_>) -> ServerConfig {
    let mut f = Fields::new(t, "server");
    let listen = socket_addr(&mut f, "listen", "127.0.0.1:8080", errors);
    let admin_at = f.get("admin_listen").map_or(0, |v| v.span().start);
    let admin_listen = socket_addr(&mut f, "admin_listen", "127.0.0.1:8081", errors);
    if listeners_collide(listen, admin_listen) {
        errors.at(
            admin_at,
            "server.admin_listen",
            format!("`{admin_listen}` would take the same port as server.listen (`{listen}`): give one of them another port, or port 0 for any free one"),
        );
    }
    let rls_listen = f.str("rls_listen", errors).and_then(|(text, at)| {
        let parsed = text.parse::<SocketAddr>().ok();
        match parsed {
            None => errors.at(at, "server.rls_listen", format!("cannot read `{text}` as an address: expected IP:PORT such as `127.0.0.1:8081`")),
            Some(rls) => {
                for (other, name) in [(listen, "server.listen"), (admin_listen, "server.admin_listen")] {
                    if listeners_collide(rls, other) {
                        errors.at(at, "server.rls_listen", format!("`{rls}` would take the same port as {name} (`{other}`): give one of them another port, or port 0 for any free one"));
                    }
                }
            }
        }
        parsed
    });
    let mut trusted_proxies = Vec::new();
    for (text, at) in f.strings("trusted_proxies", errors).unwrap_or_default() {
        let net = text
            .parse::<IpNet>()
            .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
        match net {
            Ok(net) => trusted_proxies.push(net),
            Err(_) => errors.at(at, "server.trusted_proxies", format!("cannot read `{text}` as a network: expected a CIDR such as `10.0.0.0/8` or an address")),
        }
    }
    let shutdown_timeout = duration(&mut f, "shutdown_timeout", Duration::from_secs(30), errors);
    let header_read_timeout = duration(
        &mut f,
        "header_read_timeout",
        Duration::from_secs(10),
        errors,
    );
    if header_read_timeout.is_zero() {
        errors.at(0, "server.header_read_timeout", "must be greater than zero");
    }
    let at = t.get("max_header_bytes").map_or(0, |v| v.span().start);
    let max_header_bytes = size(&mut f, "max_header_bytes", 16 * 1024, errors);
    if !(8192..=1 << 20).contains(&max_header_bytes) {
        errors.at(
            at,
            "server.max_header_bytes",
            format!("must be between 8KiB and 1MiB, got {max_header_bytes} bytes"),
        );
    }
    let cores = std::thread::available_parallelism().map_or(2, usize::from);
    let workers = match f.uint("workers", errors) {
        None => cores,
        Some((n, at)) if n == 0 || n > 1024 => {
            errors.at(
                at,
                "server.workers",
                format!("must be between 1 and 1024, got {n}"),
            );
            cores
        }
        Some((n, _)) => n as usize,
    };
    let max_body = size(&mut f, "max_body", DEFAULT_MAX_BODY, errors);
    let client_body_timeout = positive_duration(
        &mut f,
        "client_body_timeout",
        Duration::from_secs(60),
        errors,
    );
    let admin_token = f
        .str("admin_token", errors)
        .and_then(|(source, at)| match AdminToken::read(source) {
            Ok(token) => Some(token),
            Err(e) => {
                errors.at(at, "server.admin_token", e);
                None
            }
        });
    let (max_connections, max_connections_sized_from) = match f.uint("max_connections", errors) {
        None => default_max_connections(open_files_hard_limit()),
        Some((n, at)) if n == 0 || n > 1_000_000 => {
            errors.at(
                at,
                "server.max_connections",
                format!("must be between 1 and 1000000, got {n}"),
            );
            (DEFAULT_MAX_CONNECTIONS, None)
        }
        Some((n, _)) => (n as usize, None),
    };
    let mut count = |key: &'static str, default: u64, max: u64| match f.uint(key, errors) {
        None => default,
        Some((n, at)) if n == 0 || n > max => {
            errors.at(
                at,
                &format!("server.{key}"),
                format!("must be between 1 and {max}, got {n}"),
            );
            default
        }
        Some((n, _)) => n,
    };
    let max_upstream_connections = count(
        "max_upstream_connections",
        max_connections as u64,
        1_000_000,
    ) as usize;
    let max_upstream_per_connection = count(
        "max_upstream_per_connection",
        DEFAULT_MAX_UPSTREAM_PER_CONNECTION as u64,
        100_000,
    ) as usize;
    let max_requests_per_connection = count(
        "max_requests_per_connection",
        u64::from(DEFAULT_MAX_REQUESTS_PER_CONNECTION),
        u64::from(u32::MAX),
    ) as u32;
    let request_id = match f.get("request_id") {
        None => true,
        Some(value) => match value.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                errors.value(
                    value,
                    "server.request_id",
                    format!("expected true or false, found {}", other.type_str()),
                );
                true
            }
        },
    };
    let upstream_connect_timeout = positive_duration(
        &mut f,
        "upstream_connect_timeout",
        Duration::from_secs(5),
        errors,
    );
    let upstream_idle_timeout = positive_duration(
        &mut f,
        "upstream_idle_timeout",
        Duration::from_secs(60),
        errors,
    );
    let send_timeout = positive_duration(&mut f, "send_timeout", Duration::from_secs(60), errors);
    let keep_alive_timeout = positive_duration(
        &mut f,
        "keep_alive_timeout",
        Duration::from_secs(75),
        errors,
    );
    let h2c = boolean(&mut f, "h2c", true, errors);
    let tls = f
        .table("tls", errors)
        .and_then(|(t, at)| server_tls(t, at, errors));
    f.finish(errors);
    ServerConfig {
        rls_listen,
        send_timeout,
        keep_alive_timeout,
        upstream_connect_timeout,
        upstream_idle_timeout,
        request_id,
        max_connections,
        max_connections_sized_from,
        max_upstream_connections,
        max_upstream_per_connection,
        max_requests_per_connection,
        admin_token,
        tls,
        h2c,
        max_body,
        client_body_timeout,
        listen,
        admin_listen,
        trusted_proxies,
        shutdown_timeout,
        header_read_timeout,
        workers,
        max_header_bytes: usize::try_from(max_header_bytes).unwrap_or(16 * 1024),
    }
}

/// `true` or `false`.
fn boolean(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: bool,
    errors: &mut Errors<'_>,
) -> bool {
    let field = fields.path(key);
    match fields.get(key) {
        None => default,
        Some(value) => match value.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                errors.value(
                    value,
                    &field,
                    format!("expected true or false, found {}", other.type_str()),
                );
                default
            }
        },
    }
}

/// `[server.tls]`: `cert` and `key`, both required, read and checked now.
fn server_tls(t: &DeTable<'_>, table_at: usize, errors: &mut Errors<'_>) -> Option<ServerTls> {
    let mut f = Fields::new(t, "server.tls");
    let cert = f.str("cert", errors);
    let key = f.str("key", errors);
    f.finish(errors);
    for (name, value) in [("cert", &cert), ("key", &key)] {
        if value.is_none() && !t.contains_key(name) {
            errors.at(
                table_at,
                &format!("server.tls.{name}"),
                format!("[server.tls] needs `{name}`: the path of a PEM file"),
            );
        }
    }
    let ((cert, cert_at), (key, key_at)) = (cert?, key?);
    match ServerTls::load(Path::new(cert), Path::new(key)) {
        Ok(tls) => Some(tls),
        Err((field, message)) => {
            let at = if field == "cert" { cert_at } else { key_at };
            errors.at(at, &format!("server.tls.{field}"), message);
            None
        }
    }
}

fn store(t: &DeTable<'_>, table_at: usize, errors: &mut Errors<'_>) -> StoreConfig {
    let mut f = Fields::new(t, "store");
    let backend = match f.str("backend", errors) {
        None => BackendKind::Memory,
        Some(("memory", _)) => BackendKind::Memory,
        Some(("file", _)) => BackendKind::File,
        Some(("redis", _)) => BackendKind::Redis,
        Some((other, at)) => {
            errors.at(
                at,
                "store.backend",
                format!("unknown backend `{other}`: expected memory, file or redis"),
            );
            BackendKind::Memory
        }
    };
    let path = f.str("path", errors).map(|(p, at)| {
        if p.is_empty() {
            errors.at(at, "store.path", "must not be empty");
        }
        PathBuf::from(p)
    });
    let mut urls = Vec::new();
    let mut cluster = false;
    if let Some(value) = f.get("url") {
        cluster = matches!(value.get_ref(), DeValue::Array(_));
        let list: Vec<(&str, usize)> = match value.get_ref() {
            DeValue::String(s) => vec![(s.as_ref(), value.span().start)],
            DeValue::Array(items) => items
                .iter()
                .filter_map(|item| match item.get_ref() {
                    DeValue::String(s) => Some((s.as_ref(), item.span().start)),
                    other => {
                        errors.value(
                            item,
                            "store.url",
                            format!("expected a string, found {}", other.type_str()),
                        );
                        None
                    }
                })
                .collect(),
            other => {
                errors.value(
                    value,
                    "store.url",
                    format!(
                        "expected a URL or a list of URLs, found {}",
                        other.type_str()
                    ),
                );
                Vec::new()
            }
        };
        for (url, at) in list {
            if sluice::store::RedisConfig::new(url).is_sentinel() {
                // Redis Sentinel: the URL names the Sentinels and the master itself.
                let problem = if cluster {
                    Some(String::from("a Sentinel URL names every Sentinel itself: give it as one string, not in a list (a list is a Redis Cluster)"))
                } else {
                    match sluice::store::RedisConfig::new(url).check() {
                        Ok(()) => None,
                        Err(sluice::store::RedisStoreError::BadUrl { reason, .. }) => Some(reason),
                        Err(e) => Some(e.to_string()),
                    }
                };
                match problem {
                    None => urls.push(url.to_owned()),
                    Some(reason) => errors.at(
                        at,
                        "store.url",
                        format!("cannot read `{url}` as a Redis Sentinel URL: {reason}"),
                    ),
                }
                continue;
            }
            let rest = url
                .strip_prefix("redis://")
                .or_else(|| url.strip_prefix("rediss://"))
                .or_else(|| url.strip_prefix("redis+unix://"))
                .or_else(|| url.strip_prefix("unix://"));
            match rest {
                Some(rest) if !rest.is_empty() => urls.push(url.to_owned()),
                _ => errors.at(
                    at,
                    "store.url",
                    format!("cannot read `{url}` as a Redis URL: expected redis://HOST:PORT, or redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME for Redis Sentinel"),
                ),
            }
        }
    }
    let on_error = match f.str("on_error", errors) {
        None | Some(("local", _)) => OnError::Local,
        Some(("allow", _)) => OnError::Allow,
        Some(("deny", _)) => OnError::Deny,
        Some((other, at)) => {
            errors.at(
                at,
                "store.on_error",
                format!("unknown on_error `{other}`: expected allow, deny or local"),
            );
            OnError::Local
        }
    };
    let timeout = duration(&mut f, "timeout", Duration::from_millis(50), errors);
    let max_loss = match f.str("max_loss", errors) {
        Some((text, at)) => match units::parse_duration(text) {
            Ok(d) if (MAX_LOSS_RANGE.0..=MAX_LOSS_RANGE.1).contains(&d) => d,
            Ok(_) => {
                errors.at(
                    at,
                    "store.max_loss",
                    format!("`{text}` is out of range: expected 10ms to 60s (the file is written every max_loss / 2)"),
                );
                DEFAULT_MAX_LOSS
            }
            Err(message) => {
                errors.at(at, "store.max_loss", message);
                DEFAULT_MAX_LOSS
            }
        },
        None => DEFAULT_MAX_LOSS,
    };
    let prefix = f
        .str("prefix", errors)
        .map_or("sluice", |(p, _)| p)
        .to_owned();
    let key_salt = f
        .str("key_salt", errors)
        .and_then(|(source, at)| match KeySalt::read(source) {
            Ok(salt) => Some(salt),
            Err(e) => {
                errors.at(at, "store.key_salt", e);
                None
            }
        });
    f.finish(errors);
    match backend {
        BackendKind::File if path.is_none() => {
            errors.at(table_at, "store.path", "backend = \"file\" needs a path")
        }
        BackendKind::Redis if urls.is_empty() => {
            errors.at(table_at, "store.url", "backend = \"redis\" needs a url")
        }
        _ => {}
    }
    StoreConfig {
        backend,
        path,
        urls,
        cluster,
        on_error,
        timeout,
        prefix,
        key_salt,
        max_loss,
    }
}

fn policy(t: &DeTable<'_>, field: &str, errors: &mut Errors<'_>) -> Option<(PolicyConfig, usize)> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let name = f.str("name", errors);
    if let Some((n, at)) = name {
        if !is_valid_name(n) {
            errors.at(
                at,
                &f.path("name"),
                format!("invalid policy name `{n}`: use 1 to 64 of A-Z a-z 0-9 _ - ."),
            );
        }
    }
    let algorithm = match f.str("algorithm", errors) {
        None => Some(Kind::TokenBucket),
        Some((text, at)) => match text.parse::<Kind>() {
            Ok(kind) => Some(kind),
            Err(e) => {
                errors.at(at, &f.path("algorithm"), e.to_string());
                None
            }
        },
    };
    let capacity = f.uint("capacity", errors);
    let rate = match f.str("rate", errors) {
        Some((text, at)) => match text.parse::<Rate>() {
            Ok(rate) => Some(rate),
            Err(e) => {
                errors.at(at, &f.path("rate"), e.to_string());
                None
            }
        },
        None => None,
    };
    let quota = match (capacity, rate) {
        (Some((capacity, at)), Some(rate)) => match Quota::new(capacity, rate) {
            Ok(q) => Some(q),
            Err(e) => {
                errors.at(at, &f.path("capacity"), e.to_string());
                None
            }
        },
        (Some((0, at)), None) => {
            errors.at(
                at,
                &f.path("capacity"),
                "capacity must be at least 1, got 0",
            );
            None
        }
        _ => None,
    };
    let key = match f.str("key", errors) {
        None => Some(KeySpec::Global),
        Some((text, at)) => match text.parse::<KeySpec>() {
            Ok(k) => Some(k),
            Err(e) => {
                errors.at(at, &f.path("key"), e.to_string());
                None
            }
        },
    };
    let max_keys = match f.uint("max_keys", errors) {
        None => 100_000,
        Some((0, at)) => {
            errors.at(at, &f.path("max_keys"), "must be at least 1");
            1
        }
        Some((n, at)) => usize::try_from(n).unwrap_or_else(|_| {
            errors.at(at, &f.path("max_keys"), "is too large");
            1
        }),
    };
    let queue = match f.table("queue", errors) {
        None => None,
        Some((q, _)) => {
            let mut qf = Fields::new(q, f.path("queue"));
            let depth = qf.uint("depth", errors);
            let max_wait = duration(&mut qf, "max_wait", Duration::from_secs(10), errors);
            qf.finish(errors);
            match depth {
                Some((depth, at)) => Some(QueueSpec {
                    depth: usize::try_from(depth).unwrap_or_else(|_| {
                        errors.at(at, &format!("{field}.queue.depth"), "is too large");
                        0
                    }),
                    max_wait,
                }),
                None => {
                    if !q.contains_key("depth") {
                        errors.at(q.iter().next().map_or(0, |(k, _)| k.span().start), &format!("{field}.queue.depth"), "a queue needs a depth, as in queue = { depth = 100, max_wait = \"10s\" }");
                    }
                    None
                }
            }
        }
    };
    let concurrency = match f.uint("concurrency", errors) {
        None => None,
        Some((0, at)) => {
            errors.at(
                at,
                &f.path("concurrency"),
                "must be at least 1 (omit it for no limit)",
            );
            None
        }
        Some((n, _)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let shadow = match f.get("shadow") {
        None => false,
        Some(value) => match value.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                errors.value(
                    value,
                    &f.path("shadow"),
                    format!("expected true or false, found {}", other.type_str()),
                );
                false
            }
        },
    };
    let lease = f.table("lease", errors).and_then(|(l, at)| {
        let spec = lease::lease(l, at, f.path("lease"), errors)?;
        if algorithm.is_some_and(|k| !matches!(k, Kind::Gcra | Kind::TokenBucket | Kind::LeakyBucket)) {
            errors.at(at, &f.path("lease"), format!("leases slice a bucket: {} keeps none; use gcra, token_bucket or leaky_bucket, or no lease", algorithm.map_or("", |k| k.name())));
        }
        Some(spec)
    });
    let table_at = t.iter().next().map_or(0, |(k, _)| k.span().start);
    if name.is_none() {
        errors.at(table_at, &f.path("name"), "a policy needs a name");
    }
    if capacity.is_none() && !t.contains_key("capacity") {
        errors.at(table_at, &f.path("capacity"), "a policy needs a capacity");
    }
    if rate.is_none() && !t.contains_key("rate") {
        errors.at(
            table_at,
            &f.path("rate"),
            "a policy needs a rate, such as \"5/s\"",
        );
    }
    f.finish(errors);
    if errors.list.len() > before {
        return None;
    }
    let (name, at) = name?;
    Some((
        PolicyConfig {
            name: name.to_owned(),
            algorithm: algorithm?,
            quota: quota?,
            key: key?,
            max_keys,
            queue,
            concurrency,
            shadow,
            lease,
            line: errors.line_of(at),
        },
        at,
    ))
}

fn route(
    t: &DeTable<'_>,
    field: &str,
    names: &HashMap<String, usize>,
    errors: &mut Errors<'_>,
) -> Option<(RouteConfig, usize)> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let table_at = t.iter().next().map_or(0, |(k, _)| k.span().start);
    let prefix = f.str("path_prefix", errors);
    if let Some((p, at)) = prefix {
        if !p.starts_with('/') {
            errors.at(
                at,
                &f.path("path_prefix"),
                format!("`{p}` must start with `/`"),
            );
        } else {
            // Requests are routed by their canonical path: a prefix in another form would
            // never match.
            match canonical_path(p) {
                Canonical::Unchanged => {}
                Canonical::Changed(c) => errors.at(
                    at,
                    &f.path("path_prefix"),
                    format!(
                        "`{p}` would never match: requests are routed by their canonical \
                         path, so write `{c}`"
                    ),
                ),
                Canonical::Ambiguous => errors.at(
                    at,
                    &f.path("path_prefix"),
                    format!(
                        "`{p}` would never match: a request path with an encoded slash or a \
                         `;` parameter next to a dot segment or another slash is refused"
                    ),
                ),
            }
        }
    } else if !t.contains_key("path_prefix") {
        errors.at(
            table_at,
            &f.path("path_prefix"),
            "a route needs a path_prefix, such as \"/api/\"",
        );
    }
    let mut methods = Vec::new();
    for (text, at) in f.strings("methods", errors).unwrap_or_default() {
        let upper = text.to_ascii_uppercase();
        if text != upper && Method::from_bytes(upper.as_bytes()).is_ok() {
            errors.at(
                at,
                &f.path("methods"),
                format!("methods are case-sensitive: `{text}` (did you mean `{upper}`?)"),
            );
            continue;
        }
        match Method::from_bytes(text.as_bytes()) {
            Ok(m) => methods.push(m),
            Err(_) => errors.at(
                at,
                &f.path("methods"),
                format!("`{text}` is not an HTTP method"),
            ),
        }
    }
    let mut policies: Vec<String> = Vec::new();
    for (name, at) in f.strings("policies", errors).unwrap_or_default() {
        if !names.contains_key(name) {
            let known: Vec<&str> = names.keys().map(String::as_str).collect();
            errors.at(
                at,
                &f.path("policies"),
                format!(
                    "unknown policy `{name}`; defined: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            );
        } else if policies.iter().any(|p| p == name) {
            errors.at(
                at,
                &f.path("policies"),
                format!("policy `{name}` is listed twice"),
            );
        } else {
            policies.push(name.to_owned());
        }
    }
    if policies.len() > MAX_POLICIES_PER_ROUTE {
        errors.at(
            table_at,
            &f.path("policies"),
            format!("at most {MAX_POLICIES_PER_ROUTE} policies per route"),
        );
    }
    let upstream = match f.str("upstream", errors) {
        Some(("builtin:demo", _)) => Some(UpstreamConfig::BuiltinDemo),
        Some((url, at)) => match url.parse::<Upstream>() {
            Ok(u) => Some(UpstreamConfig::Url(u)),
            Err(e) => {
                errors.at(
                    at,
                    &f.path("upstream"),
                    format!("{e} (or use \"builtin:demo\")"),
                );
                None
            }
        },
        None => {
            if !t.contains_key("upstream") {
                errors.at(
                    table_at,
                    &f.path("upstream"),
                    "a route needs an upstream, such as \"http://127.0.0.1:9000\"",
                );
            }
            None
        }
    };
    let upstream_ca = match f.str("upstream_ca", errors) {
        None => None,
        Some((path, at)) => match &upstream {
            Some(UpstreamConfig::Url(u)) if u.protocol() != Protocol::Https => {
                errors.at(
                    at,
                    &f.path("upstream_ca"),
                    format!(
                        "`{path}`: upstream_ca applies to https:// upstreams only, and this \
                         route's upstream is `{u}`"
                    ),
                );
                None
            }
            Some(UpstreamConfig::BuiltinDemo) => {
                errors.at(
                    at,
                    &f.path("upstream_ca"),
                    format!("`{path}`: upstream_ca applies to https:// upstreams only, and this route's upstream is builtin:demo"),
                );
                None
            }
            _ => match UpstreamCa::load(Path::new(path)) {
                Ok(ca) => Some(ca),
                Err(message) => {
                    errors.at(at, &f.path("upstream_ca"), message);
                    None
                }
            },
        },
    };
    // An https:// upstream gets its TLS config now: a trust store that cannot be made is
    // an error of this configuration.
    let upstream = match upstream {
        Some(UpstreamConfig::Url(u)) if u.protocol() == Protocol::Https => {
            let roots = upstream_ca.as_ref().map(|ca| ca.certs.as_slice());
            match sluice_http::proxy::client_config(roots) {
                Ok(tls) => Some(UpstreamConfig::Url(u.with_tls(tls))),
                Err(e) => {
                    let at = t.get("upstream").map_or(table_at, |v| v.span().start);
                    errors.at(at, &f.path("upstream"), format!("`{u}`: {e}"));
                    None
                }
            }
        }
        other => other,
    };
    let queue_max_body = size(&mut f, "queue_max_body", 64 * 1024, errors);
    let max_body = f
        .get("max_body")
        .is_some()
        .then(|| size(&mut f, "max_body", DEFAULT_MAX_BODY, errors));
    let upstream_timeout = duration(&mut f, "upstream_timeout", Duration::from_secs(30), errors);
    if upstream_timeout.is_zero() {
        errors.at(
            table_at,
            &f.path("upstream_timeout"),
            "must be greater than zero",
        );
    }
    f.finish(errors);
    if errors.list.len() > before {
        return None;
    }
    let (prefix, at) = prefix?;
    Some((
        RouteConfig {
            path_prefix: prefix.to_owned(),
            methods,
            policies,
            upstream: upstream?,
            queue_max_body,
            upstream_timeout,
            max_body,
            upstream_ca,
        },
        at,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_defaults_are_valid() {
        let c = defaults();
        assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.policies[0].quota, Quota::parse(10, "5/s").unwrap());
        assert_eq!(c.routes[0].upstream, UpstreamConfig::BuiltinDemo);
    }

    #[test]
    fn an_unknown_key_that_is_not_bare_is_named_as_toml_writes_it() {
        // An empty key, or one with a space or a dot, would make an empty or misleading field.
        let text = "\"\" = 1\n[server]\n\"a b\" = 2\n\"x.y\" = 3\nok_key-2 = 4\n";
        let errors = parse(text, "t.toml").unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "\"\"",
                "server.\"a b\"",
                "server.\"x.y\"",
                "server.ok_key-2"
            ],
            "{errors:?}"
        );
    }

    #[test]
    fn every_error_is_listed_with_its_line() {
        let text = r#"
[server]
listen = "nowhere"
colour = "blue"

[[policy]]
name = "api"
capacity = 0
rate = "5/s"

[[policy]]
name = "api2"
capacity = 10
rate = "NaN/s"
key = "body:x"
queue = { depth = -1, max_wait = "forever" }

[[policy]]
name = "api2"
capacity = 1.5
rate = "1/s"

[[route]]
path_prefix = "api"
policies = ["api", "nope"]
upstream = "ftp://x"
queue_max_body = "64 parsecs"
"#;
        let errors = parse(text, "t.toml").unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let expect = [
            ("t.toml:3:", "server.listen"),
            ("t.toml:4:", "server.colour"),
            ("t.toml:8:", "policy[0].capacity"),
            ("t.toml:14:", "policy[1].rate"),
            ("t.toml:15:", "policy[1].key"),
            ("t.toml:16:", "policy[1].queue.depth"),
            ("t.toml:16:", "policy[1].queue.max_wait"),
            ("t.toml:19:", "policy[2].name"),
            ("t.toml:20:", "policy[2].capacity"),
            ("t.toml:24:", "route[0].path_prefix"),
            ("t.toml:25:", "route[0].policies"),
            ("t.toml:26:", "route[0].upstream"),
            ("t.toml:27:", "route[0].queue_max_body"),
        ];
        assert_eq!(shown.len(), expect.len(), "{}", shown.join("\n"));
        assert!(shown.iter().any(|s| s.contains("unknown policy `nope`")));
        assert!(!shown.iter().any(|s| s.contains("unknown policy `api`")));
        for (line, field) in expect {
            assert!(
                shown
                    .iter()
                    .any(|s| s.starts_with(line) && s.contains(&format!(" {field}: "))),
                "missing {line} {field} in\n{}",
                shown.join("\n")
            );
        }
    }

    #[test]
    fn two_listeners_may_both_ask_for_a_free_port() {
        let config = |listen: &str, admin: &str| {
            format!(
                "[server]\nlisten = \"{listen}\"\nadmin_listen = \"{admin}\"\n\
                 [[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n"
            )
        };
        for (listen, admin) in [
            ("127.0.0.1:0", "127.0.0.1:0"),
            ("[::1]:0", "[::1]:0"),
            ("0.0.0.0:0", "127.0.0.1:0"),
            ("127.0.0.1:8080", "127.0.0.2:8080"),
            ("127.0.0.1:8080", "127.0.0.1:8081"),
        ] {
            let parsed = parse(&config(listen, admin), "p.toml");
            assert!(parsed.is_ok(), "{listen} and {admin}: {:?}", parsed.err());
        }
        for (listen, admin) in [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("0.0.0.0:8080", "127.0.0.1:8080"),
            ("127.0.0.1:8080", "[::]:8080"),
        ] {
            let errors = parse(&config(listen, admin), "p.toml").unwrap_err();
            assert_eq!(errors.len(), 1, "{errors:?}");
            let shown = errors[0].to_string();
            assert!(
                shown.starts_with("p.toml:3:")
                    && shown.contains("server.admin_listen")
                    && shown.contains(admin),
                "{shown}"
            );
        }
    }

    #[test]
    fn duplicates_and_syntax() {
        let text = "[[policy]]\nname = \"a\"\ncapacity = 1\nrate = \"1/s\"\n[[policy]]\nname = \"a\"\ncapacity = 1\nrate = \"1/s\"\n[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n";
        let errors = parse(text, "d.toml").unwrap_err();
        assert!(errors[0].to_string().starts_with("d.toml:6:"), "{errors:?}");
        assert!(errors[0].message.contains("first defined on line 2"));
        let errors = parse("[server\nlisten = 1", "s.toml").unwrap_err();
        assert_eq!(errors[0].line, 1);
    }

    /// Requests are routed by their canonical path, so a prefix in another form is refused
    /// with the form to write.
    #[test]
    fn path_prefixes_must_be_canonical() {
        let route = |prefix: &str| {
            format!("[[route]]\npath_prefix = \"{prefix}\"\nupstream = \"http://127.0.0.1:1\"\n")
        };
        for ok in ["/", "/api/", "/api", "/files/a%2Fb/"] {
            assert!(parse(&route(ok), "p.toml").is_ok(), "{ok}");
        }
        for (bad, hint) in [
            ("/api//", "write `/api/`"),
            ("/./api/", "write `/api/`"),
            ("/%61pi/", "write `/api/`"),
            ("/v1/../api/", "write `/api/`"),
            ("/a/..%2F", "encoded slash"),
        ] {
            let errors = parse(&route(bad), "p.toml").unwrap_err();
            assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
            let shown = errors[0].to_string();
            assert!(
                shown.starts_with("p.toml:2:") && shown.contains("route[0].path_prefix"),
                "{shown}"
            );
            assert!(shown.contains(hint), "{bad}: {shown}");
        }
    }
}
