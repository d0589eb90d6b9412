//! WebSocket through the gateway (HTTP/1.1 Upgrade): the `sluice` binary between the Python
//! `websockets` client and server. An upgrade is admitted or denied like any request (a
//! denial is a 429, never a 101); once admitted the tunnel holds the route's concurrency
//! slot until it closes; closing one side closes the other; a silent tunnel closes after
//! `keep_alive_timeout`, a busy one does not.
//!
//! WebSocket over HTTP/2 (RFC 8441 extended `CONNECT`), over h2c and TLS, is driven by the
//! `h2` Python package (`tests/py/ws_h2_client.py`) against the same upstream: the same
//! admission, concurrency and closing, several tunnels on one connection.

mod common;
mod pyenv;

use std::time::Duration;

use common::Gateway;
use pyenv::{python, run, Server};

/// `/ws/` limited to 100 open sockets; `/limited/` to one upgrade a minute; `/few/` to 3
/// open sockets.
fn config(upstream_port: u16) -> String {
    format!(
        r#"
[[policy]]
name = "sockets"
capacity = 100000
rate = "100000/s"
concurrency = 100

[[policy]]
name = "upgrades"
capacity = 1
rate = "1/min"

[[route]]
path_prefix = "/ws/"
policies = ["sockets"]
upstream = "http://127.0.0.1:{upstream_port}"

[[route]]
path_prefix = "/limited/"
policies = ["upgrades"]
upstream = "http://127.0.0.1:{upstream_port}"

[[policy]]
name = "three"
capacity = 100000
rate = "100000/s"
concurrency = 3

[[route]]
path_prefix = "/few/"
policies = ["three"]
upstream = "http://127.0.0.1:{upstream_port}"
"#
    )
}

fn ws_url(gw: &Gateway, path: &str) -> String {
    format!("ws://127.0.0.1:{}{path}", gw.port)
}

async fn metric(gw: &Gateway, series: &str) -> f64 {
    let text = common::get(&gw.admin("/metrics")).await.unwrap().body;
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// Starts `tests/py/ws_client.py args...` off the runtime; the future is its JSON.
fn ws_client(
    py: &str,
    args: &[&str],
    limit: Duration,
) -> impl std::future::Future<Output = serde_json::Value> {
    run_off_runtime(py, "ws_client.py", args, limit)
}

/// Starts `tests/py/<script> args...` on a blocking thread at once; the future is its JSON.
fn run_off_runtime(
    py: &str,
    script: &'static str,
    args: &[&str],
    limit: Duration,
) -> impl std::future::Future<Output = serde_json::Value> {
    let py = py.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let task = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&py, script, &args, limit)
    });
    async move { task.await.unwrap() }
}

/// The upstream saw the socket on `path` open, then closed less than 2 s after the client's
/// `closed_at` (both stamps are this machine's monotonic clock).
fn upstream_closes_within_2s(upstream: &mut Server, path: &str, out: &serde_json::Value) {
    let closed_at = out["closed_at"].as_f64().unwrap();
    upstream.wait_line(&format!("OPEN {path}"), Duration::from_secs(5));
    let line = upstream.wait_line(&format!("CLOSED {path}"), Duration::from_secs(5));
    let seen: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        seen - closed_at < 2.0,
        "the upstream saw {path} close {:.3} s after the client closed it",
        seen - closed_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_echo_through_the_tunnel() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let url = ws_url(&gw, "/ws/echo");
    let out = ws_client(&py, &["echo", &url, "50"], Duration::from_secs(60)).await;
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(out["echoed"], 50, "{out}");
    let admitted = metric(
        &gw,
        r#"sluice_policy_admitted_total{policy="sockets",protocol="ws"}"#,
    )
    .await;
    assert_eq!(admitted, 1.0);
    let upgraded = metric(
        &gw,
        r#"sluice_upstream_responses_total{route="/ws/",status="1xx",protocol="ws"}"#,
    )
    .await;
    assert_eq!(upgraded, 1.0);

    // The same on a listener that speaks HTTP/1.1 only.
    let gw = Gateway::start("h2c = false", &config(upstream.port)).await;
    let url = ws_url(&gw, "/ws/echo");
    let py = python().unwrap();
    let out = ws_client(&py, &["echo", &url, "3"], Duration::from_secs(60)).await;
    assert_eq!(out["ok"], true, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_101st_socket_on_a_route_of_concurrency_100_is_refused() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let url = ws_url(&gw, "/ws/many");
    let out = ws_client(&py, &["many", &url, "101"], Duration::from_secs(120)).await;
    // 100 open; the 101st refused with 429 and the RateLimit fields; once one closes, a new
    // one gets its slot.
    let refused = out["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{out}");
    assert_eq!(refused[0]["status"], 429, "{out}");
    assert_eq!(
        refused[0]["headers"]["ratelimit-policy"], r#""sockets";q=100000;w=1"#,
        "{out}"
    );
    assert_eq!(out["again"], true, "{out}");
    assert_eq!(out["opened"], 100, "{out}");
    // All closed by the client: the gauge goes back to 0.
    tunnels_close(&gw, "/ws/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_client_closes_the_upstream_socket() {
    let Some(py) = python() else { return };
    let mut upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let url = ws_url(&gw, "/ws/abort");
    let out = ws_client(&py, &["abort", &url], Duration::from_secs(30)).await;
    upstream_closes_within_2s(&mut upstream, "/ws/abort", &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_upgrade_gets_429_never_101() {
    let Some(py) = python() else { return };
    let mut upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let url = ws_url(&gw, "/limited/x");
    let first = ws_client(&py, &["denied", &url], Duration::from_secs(30)).await;
    let second = ws_client(&py, &["denied", &url], Duration::from_secs(30)).await;
    assert_eq!(first["upgraded"], true, "{first}");
    assert_eq!(second["upgraded"], false, "{second}");
    assert_eq!(second["status"], 429, "{second}");
    let h = &second["headers"];
    assert_eq!(h["ratelimit-policy"], r#""upgrades";q=1;w=60"#, "{second}");
    assert!(h["retry-after"].as_str().is_some(), "{second}");
    upstream.wait_line("OPEN /limited/x", Duration::from_secs(5));
    let denied = metric(
        &gw,
        r#"sluice_policy_denied_total{policy="upgrades",reason="limit",protocol="ws"}"#,
    )
    .await;
    assert_eq!(denied, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_tunnel_closes_after_keep_alive_timeout_and_a_busy_one_stays() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start(
        "keep_alive_timeout = \"1s\"\nheader_read_timeout = \"1s\"",
        &config(upstream.port),
    )
    .await;
    let idle_url = ws_url(&gw, "/ws/idle");
    let busy_url = ws_url(&gw, "/ws/busy");
    let (busy, idle) = tokio::join!(
        ws_client(&py, &["busy", &busy_url, "3"], Duration::from_secs(30)),
        ws_client(&py, &["idle", &idle_url, "10"], Duration::from_secs(30)),
    );
    assert_eq!(
        busy["ok"], true,
        "a busy tunnel outlives the timeouts: {busy}"
    );
    let after = idle["closed_after"]
        .as_f64()
        .unwrap_or_else(|| panic!("the silent tunnel stayed open: {idle}"));
    assert!((0.9..3.0).contains(&after), "closed after {after:.3} s");
}

// === WebSocket over HTTP/2 (RFC 8441) ===

/// Runs `ws_h2_client.py MODE URL CAFILE ARGS...` (`-`: h2c).
async fn h2_client(mode: &str, url: String, cafile: &str, args: &[&str]) -> serde_json::Value {
    let py = python().unwrap();
    let mut all = vec![mode, &url, cafile];
    all.extend_from_slice(args);
    run_off_runtime(&py, "ws_h2_client.py", &all, Duration::from_secs(60)).await
}

/// A CA (written to `ca.pem`) and a certificate it signed for `localhost` (the `[server.tls]`
/// table that serves it).
fn tls_files(dir: &std::path::Path) -> (String, String) {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "test ca");
    let ca_key = KeyPair::generate().unwrap();
    let ca = params.self_signed(&ca_key).unwrap();
    let params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    let (ca_path, cert_path, key_path) =
        (dir.join("ca.pem"), dir.join("gw.crt"), dir.join("gw.key"));
    std::fs::write(&ca_path, ca.pem()).unwrap();
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    let table = format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert_path.display(),
        key_path.display()
    );
    (ca_path.display().to_string(), table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_extended_connect_echoes_over_h2c_and_tls() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let out = h2_client("echo", gw.url("/ws/h2c"), "-", &["20"]).await;
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(out["echoed"], 20, "{out}");
    assert_eq!(out["status"], 200, "{out}");
    let admitted = metric(
        &gw,
        r#"sluice_policy_admitted_total{policy="sockets",protocol="ws"}"#,
    )
    .await;
    assert_eq!(admitted, 1.0);

    let dir = common::TempDir::new();
    let (ca, table) = tls_files(&dir.0);
    // The `[server.tls]` table goes after the `[server]` keys.
    let gw = Gateway::start(&table, &config(upstream.port)).await;
    let url = format!("https://127.0.0.1:{}/ws/tls", gw.port);
    let out = h2_client("echo", url, &ca, &["20"]).await;
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(out["echoed"], 20, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_extended_connect_gets_429_with_ratelimit_headers() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let out = h2_client("denied", gw.url("/limited/h2"), "-", &[]).await;
    let answers = out["answers"].as_array().unwrap_or_else(|| panic!("{out}"));
    assert_eq!(answers[0]["status"], 200, "{out}");
    assert_eq!(answers[1]["status"], 429, "{out}");
    let h = &answers[1]["headers"];
    assert_eq!(h["ratelimit-policy"], r#""upgrades";q=1;w=60"#, "{out}");
    assert!(h["ratelimit"].as_str().is_some(), "{out}");
    assert!(h["retry-after"].as_str().is_some(), "{out}");
    let denied = metric(
        &gw,
        r#"sluice_policy_denied_total{policy="upgrades",reason="limit",protocol="ws"}"#,
    )
    .await;
    assert_eq!(denied, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fourth_h2_stream_on_a_route_of_concurrency_3_is_refused_and_the_others_go_on() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let out = h2_client("many", gw.url("/few/h2"), "-", &["4"]).await;
    assert_eq!(out["opened"], 3, "{out}");
    let refused = out["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{out}");
    assert_eq!(refused[0]["status"], 429, "{out}");
    assert_eq!(
        refused[0]["headers"]["ratelimit-policy"], r#""three";q=100000;w=1"#,
        "{out}"
    );
    // The three tunnels on the same connection still echo after the refusal.
    assert_eq!(out["still_echo"], true, "{out}");
    tunnels_close(&gw, "/few/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resetting_the_h2_stream_closes_the_upstream_socket() {
    let Some(py) = python() else { return };
    let mut upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let out = h2_client("abort", gw.url("/ws/h2abort"), "-", &[]).await;
    assert_eq!(out["ok"], true, "{out}");
    // The client kept its connection open for 3 s after the reset: the upstream's close
    // comes from the stream's reset, not from the connection's end.
    upstream_closes_within_2s(&mut upstream, "/ws/h2abort", &out);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_connect_is_405_and_another_protocol_501() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let out = h2_client("other", gw.url("/ws/x"), "-", &[]).await;
    assert_eq!(out["plain"]["status"], 405, "{out}");
    assert_eq!(out["other"]["status"], 501, "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_tunnel_keeps_its_connection_past_keep_alive_timeout_and_a_silent_one_closes() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &[]);
    let gw = Gateway::start(
        "keep_alive_timeout = \"1s\"\nheader_read_timeout = \"1s\"",
        &config(upstream.port),
    )
    .await;
    let (busy, idle) = tokio::join!(
        h2_client("busy", gw.url("/ws/h2busy"), "-", &["3"]),
        h2_client("idle", gw.url("/ws/h2idle"), "-", &["10"]),
    );
    // Its only stream is a tunnel: the connection is not idle while the tunnel is open.
    assert_eq!(
        busy["ok"], true,
        "a busy tunnel outlives the timeouts: {busy}"
    );
    assert_eq!(idle["status"], 200, "{idle}");
    let after = idle["closed_after"]
        .as_f64()
        .unwrap_or_else(|| panic!("the silent tunnel stayed open: {idle}"));
    assert!((0.9..3.0).contains(&after), "closed after {after:.3} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_websocket_negotiates_its_subprotocol_with_the_upstream() {
    let Some(py) = python() else { return };
    let upstream = Server::start(&py, "ws_server.py", &["chat"]);
    let gw = Gateway::start("", &config(upstream.port)).await;
    let out = h2_client("echo", gw.url("/ws/sub"), "-", &["2", "superchat, chat"]).await;
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(out["headers"]["sec-websocket-protocol"], "chat", "{out}");
}

/// Waits (at most 10 s) until `sluice_tunnels_open` of `route` reads 0.
async fn tunnels_close(gw: &Gateway, route: &str) {
    let series = format!("sluice_tunnels_open{{route=\"{route}\"}}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = metric(gw, &series).await;
        if open == 0.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "tunnels still open: {open}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
