//! `[server]`: the listeners, their timeouts and limits, the admin token and `[server.tls]`,
//! read and checked, with the defaults sized from the open-files limit.
//!
//! It only reads: binding, accepting and serving are `serve`'s. The certificates are loaded
//! by `tls`, the secret by `secret`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use toml::de::DeTable;

use super::secret::read_secret;
use super::tls::ServerTls;
use super::values::{boolean, duration, positive_duration, size};
use super::walk::{Errors, Fields};

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
    /// The longest gap between two reads of an upstream's answer body; then the client
    /// connection, whose answer has begun, is closed.
    pub upstream_read_timeout: Duration,
    /// Whether the gateway makes up an `X-Request-Id` for requests without one and echoes it.
    pub request_id: bool,
    /// The bearer token every admin endpoint but `/healthz` requires, if any.
    pub admin_token: Option<AdminToken>,
    /// `[server.tls]`: the main listener speaks TLS only, with this certificate.
    pub tls: Option<ServerTls>,
    /// Plain-text HTTP/2 with prior knowledge beside HTTP/1.1 on a listener without TLS.
    pub h2c: bool,
    /// HTTP/1.1 requests without a body, on routes that allow it, are forwarded as bytes
    /// (`sluice_http::h1`) rather than through hyper.
    pub byte_path: bool,
    /// `rls_listen`: Envoy's rate limit service (gRPC, h2c), off when `None`.
    pub rls_listen: Option<SocketAddr>,
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

/// Reads `[server]` (an empty table when the file has none).
pub(super) fn parse(t: &DeTable<'_>, errors: &mut Errors<'_>) -> ServerConfig {
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
    let request_id = super::values::boolean(&mut f, "request_id", true, errors);
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
    let upstream_read_timeout = positive_duration(
        &mut f,
        "upstream_read_timeout",
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
    let byte_path = boolean(&mut f, "byte_path", true, errors);
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
        upstream_read_timeout,
        request_id,
        max_connections,
        max_connections_sized_from,
        max_upstream_connections,
        max_upstream_per_connection,
        max_requests_per_connection,
        admin_token,
        tls,
        h2c,
        byte_path,
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

#[cfg(test)]
mod tests {
    use crate::config::parse;

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
}
