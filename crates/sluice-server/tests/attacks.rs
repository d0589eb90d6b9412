//! The edge against known HTTP/2 and connection attacks, with real sockets: a hand-driven
//! HTTP/2 client (the `h2` crate: stream resets as an attacker sends them) and raw upgrades.

mod common;
mod pyenv;

use std::time::Duration;

use common::{Gateway, Upstream};
use pyenv::{python, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A policy that admits everything on `/slow/` (the upstream answers `/slow/MS` after MS ms)
/// and on `/ws/` (a WebSocket upstream, when given).
fn config(upstream: &str, ws_port: Option<u16>) -> String {
    let mut text = format!(
        r#"
[[policy]]
name = "open"
capacity = 100000
rate = "100000/s"

[[route]]
path_prefix = "/slow/"
policies = ["open"]
upstream = "{upstream}"
"#
    );
    if let Some(port) = ws_port {
        text.push_str(&format!(
            r#"
[[route]]
path_prefix = "/ws/"
policies = ["open"]
upstream = "http://127.0.0.1:{port}"
"#
        ));
    }
    text
}

/// The sum of `series` over its labels, from `/metrics`.
async fn metric(gw: &Gateway, series: &str) -> f64 {
    let text = common::get(&gw.admin("/metrics")).await.unwrap().body;
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A request cancelled by the client (RST_STREAM) before its response ends that request: the
/// connection goes idle and closes after `keep_alive_timeout`, however long the client stays
/// and answers pings. Counted as started and never ended, it used to keep the connection open
/// for ever (200 such connections then filled `max_connections` for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_stream_leaves_its_connection_idle_and_closed_at_the_keep_alive_timeout() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true\nkeep_alive_timeout = \"2s\"",
        &config(&up.url(), None),
    )
    .await;
    let tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    // Drives the connection (and answers the server's pings) until the server closes it.
    let open = tokio::spawn(connection);
    let request = http::Request::get(format!("http://127.0.0.1:{}/slow/10000", gw.port))
        .body(())
        .unwrap();
    let (_response, mut stream) = client.send_request(request, true).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.send_reset(h2::Reason::CANCEL);
    let started = std::time::Instant::now();
    // The client keeps its handle, so it never closes the connection itself.
    let closed = tokio::time::timeout(Duration::from_secs(8), open).await;
    eprintln!(
        "after the cancel the connection was {} after {:?}",
        if closed.is_ok() {
            "closed"
        } else {
            "still open"
        },
        started.elapsed()
    );
    assert!(
        closed.is_ok(),
        "still open 8 s after the cancel, with keep_alive_timeout = 2s"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "closed before the keep-alive timeout: {:?}",
        started.elapsed()
    );
    drop(client);
}

/// A WebSocket upgrade over HTTP/1.1 (the upgraded socket is handed to a tunnel) stays one
/// of `max_connections` until its tunnel closes: 300 upgrades on a cap of 200 open at most 200
/// tunnels, and `sluice_connections_open` counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_tunnels_count_against_max_connections() {
    let Some(py) = python() else { return };
    let ws = Server::start(&py, "ws_server.py", &[]);
    let up = Upstream::start().await;
    let gw = Gateway::start("max_connections = 200", &config(&up.url(), Some(ws.port))).await;
    let mut tunnels = Vec::new();
    let mut refused = 0;
    for i in 0..300 {
        let Ok(mut tcp) = TcpStream::connect(("127.0.0.1", gw.port)).await else {
            refused += 1;
            continue;
        };
        let upgrade = format!(
            "GET /ws/{i} HTTP/1.1\r\nhost: 127.0.0.1\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
        );
        if tcp.write_all(upgrade.as_bytes()).await.is_err() {
            refused += 1;
            continue;
        }
        let mut head = [0u8; 12];
        match tokio::time::timeout(Duration::from_secs(5), tcp.read_exact(&mut head)).await {
            Ok(Ok(_)) if head.starts_with(b"HTTP/1.1 101") => tunnels.push(tcp),
            _ => refused += 1,
        }
    }
    let open = metric(&gw, "sluice_connections_open").await;
    let tunnels_open = metric(&gw, "sluice_tunnels_open").await;
    eprintln!(
        "{} tunnels opened, {refused} refused; sluice_connections_open {open}, sluice_tunnels_open {tunnels_open}",
        tunnels.len()
    );
    assert!(
        tunnels.len() <= 200,
        "{} tunnels on a cap of 200",
        tunnels.len()
    );
    assert!(
        tunnels.len() >= 190,
        "only {} tunnels opened",
        tunnels.len()
    );
    assert!(
        tunnels_open >= tunnels.len() as f64 - 1.0,
        "sluice_tunnels_open {tunnels_open} for {} tunnels",
        tunnels.len()
    );
    assert!(
        open >= tunnels_open,
        "sluice_connections_open {open} < sluice_tunnels_open {tunnels_open}"
    );
    drop(tunnels);
}

/// Wrong admin tokens are limited per client address by the gateway's own limiter: after 30
/// within a minute the address gets 429 with `Retry-After`, its token not even looked at,
/// each failure is logged, and `/healthz` stays open. Without the limit every guess got an
/// answer, as fast as the client could send them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_admin_tokens_are_limited_per_address_and_logged() {
    let up = Upstream::start().await;
    let dir = common::TempDir::new();
    let token_file = dir.0.join("admin-token");
    std::fs::write(&token_file, "the-real-token-7c1e\n").unwrap();
    let gw = Gateway::start(
        &format!("admin_token = \"file:{}\"", token_file.display()),
        &config(&up.url(), None),
    )
    .await;
    let mut statuses = Vec::new();
    for i in 0..40 {
        let a = common::get_with(
            &gw.admin("/metrics"),
            &[("authorization", &format!("Bearer guess-{i}"))],
        )
        .await;
        statuses.push((
            a.status.as_u16(),
            a.header("retry-after").map(str::to_owned),
        ));
    }
    let unauthorized = statuses.iter().filter(|(s, _)| *s == 401).count();
    let limited: Vec<_> = statuses.iter().filter(|(s, _)| *s == 429).collect();
    eprintln!(
        "40 wrong tokens: {unauthorized} answered 401, {} answered 429",
        limited.len()
    );
    assert_eq!(unauthorized, 30, "{statuses:?}");
    assert_eq!(limited.len(), 10, "{statuses:?}");
    assert!(
        limited.iter().all(|(_, retry)| retry.is_some()),
        "{statuses:?}"
    );
    // Even the right token waits now; health checks never do.
    let right = common::get_with(
        &gw.admin("/metrics"),
        &[("authorization", "Bearer the-real-token-7c1e")],
    )
    .await;
    assert_eq!(right.status.as_u16(), 429);
    let health = common::get_with(&gw.admin("/healthz"), &[]).await;
    assert_eq!(health.status.as_u16(), 200);
    let log = gw.log_text();
    assert!(
        log.matches("admin: request without the admin token")
            .count()
            >= 30,
        "{log}"
    );
    assert!(!log.contains("the-real-token-7c1e"));
}

/// The admin listener holds at most 256 connections: a flood of idle ones beyond it is
/// closed at accept, and those within it are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_holds_at_most_256_connections() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), None)).await;
    let mut held = Vec::new();
    for _ in 0..300 {
        if let Ok(tcp) = TcpStream::connect(("127.0.0.1", gw.admin_port)).await {
            held.push(tcp);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut served = 0;
    for tcp in &mut held {
        if tcp
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .is_err()
        {
            continue;
        }
        let mut head = [0u8; 12];
        if let Ok(Ok(_)) =
            tokio::time::timeout(Duration::from_secs(2), tcp.read_exact(&mut head)).await
        {
            if head.starts_with(b"HTTP/1.1 200") {
                served += 1;
            }
        }
    }
    eprintln!("300 admin connections: {served} served");
    assert!(served <= 256, "{served} served");
    assert!(served >= 250, "only {served} served");
}

/// A client that grants no HTTP/2 flow-control window (SETTINGS_INITIAL_WINDOW_SIZE = 0)
/// stalls its stream's response without a socket write ever blocking. The stream's send
/// stall clock resets it after `send_timeout`, which releases the route's concurrency permit
/// and the upstream connection: a `concurrency = 1` route serves others again. Without that
/// clock the stream held its permit for as long as the client kept the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_flow_control_window_is_reset_after_send_timeout() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true\nsend_timeout = \"1s\"\nkeep_alive_timeout = \"30s\"",
        &format!(
            "[[policy]]\nname = \"one\"\ncapacity = 1000\nrate = \"1000/s\"\nconcurrency = 1\n\n\
             [[route]]\npath_prefix = \"/one/\"\npolicies = [\"one\"]\nupstream = \"{}\"\n",
            up.url()
        ),
    )
    .await;
    let tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let (mut client, connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get(format!("http://127.0.0.1:{}/one/a", gw.port))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let sent = std::time::Instant::now();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    // The headers came; the body cannot. Meanwhile the route's one slot is taken.
    let refused = common::get(&gw.url("/one/b")).await.unwrap();
    assert_eq!(refused.status.as_u16(), 429);
    let served = loop {
        let a = common::get(&gw.url("/one/b")).await.unwrap();
        if a.status.as_u16() == 200 {
            break sent.elapsed();
        }
        assert!(
            sent.elapsed() < Duration::from_secs(8),
            "the route is still taken {:?} after the stalled request",
            sent.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ended = tokio::time::timeout(Duration::from_secs(2), body.data()).await;
    eprintln!("the route served others again {served:?} after the stalled stream; its body ended with {ended:?}");
    assert!(
        served >= Duration::from_millis(900) && served < Duration::from_secs(4),
        "{served:?}"
    );
    match ended {
        Ok(Some(Err(e))) => assert_eq!(e.reason(), Some(h2::Reason::CANCEL), "{e}"),
        other => panic!("the stalled stream was not reset: {other:?}"),
    }
    assert_eq!(
        metric(
            &gw,
            "sluice_connection_timeouts_total{timeout=\"stream_send\"}"
        )
        .await,
        1.0
    );
}
