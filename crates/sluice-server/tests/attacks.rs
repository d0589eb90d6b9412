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
    let open = common::metric(&gw, "sluice_connections_open").await;
    let tunnels_open = common::metric(&gw, "sluice_tunnels_open").await;
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
        common::metric(
            &gw,
            "sluice_connection_timeouts_total{timeout=\"stream_send\"}"
        )
        .await,
        1.0
    );
}

/// An h2c client connection to the gateway, driven in the background.
async fn h2_client(gw: &Gateway) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    client
}

fn h2_get(gw: &Gateway, path: &str) -> http::Request<()> {
    http::Request::get(format!("http://127.0.0.1:{}{path}", gw.port))
        .body(())
        .unwrap()
}

/// An upstream that counts the TCP connections it accepts and answers each request `200`
/// after 200 ms.
async fn counting_upstream() -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(AtomicU64::new(0));
    let count = std::sync::Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = tcp.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                    if tcp.write_all(answer).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (url, accepted)
}

/// Rapid Reset paced below h2's burst detection (HEADERS then RST_STREAM, one pair every 5 ms):
/// once a connection has cancelled 64 requests, more than half of its own, it gets `GOAWAY`;
/// and a stream cancelled in the same breath as it opened never reaches the upstream.
/// Without that, one connection sent 11,700 such pairs in 14 s, each opening an upstream
/// connection. (Faster pacing meets h2's own limit on streams reset before they are done
/// with, `GOAWAY ENHANCE_YOUR_CALM`, sooner.) The client runs on one thread, so that each
/// HEADERS and its RST_STREAM leave in one write, as an attacker sends them.
#[tokio::test]
async fn a_paced_rapid_reset_is_cut_off_and_never_reaches_the_upstream() {
    let (upstream, accepted) = counting_upstream().await;
    let gw = Gateway::start("h2c = true", &config(&upstream, None)).await;
    let mut client = h2_client(&gw).await;
    let mut sent = 0u32;
    let started = std::time::Instant::now();
    for _ in 0..1000 {
        let Ok(ready) = tokio::time::timeout(Duration::from_secs(2), client.clone().ready()).await
        else {
            break;
        };
        let Ok(mut ready) = ready else { break };
        match ready.send_request(h2_get(&gw, "/slow/200"), true) {
            Ok((_, mut stream)) => {
                stream.send_reset(h2::Reason::CANCEL);
                sent += 1;
            }
            Err(_) => break,
        }
        client = ready;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let reached = accepted.load(std::sync::atomic::Ordering::SeqCst);
    let closed_early = common::metric(
        &gw,
        "sluice_connections_closed_early_total{reason=\"cancelled\"}",
    )
    .await;
    eprintln!(
        "paced Rapid Reset: the connection took {sent} HEADERS + RST_STREAM pairs in {:?} before GOAWAY; the upstream accepted {reached} connections; closed early (cancelled): {closed_early}",
        started.elapsed()
    );
    assert!(sent < 300, "{sent} pairs taken without a GOAWAY");
    assert!(
        reached <= 5,
        "the upstream accepted {reached} connections for cancelled requests"
    );
    assert_eq!(closed_early, 1.0);
    // An ordinary client is served.
    let mut other = h2_client(&gw).await;
    let (response, _) = other.send_request(h2_get(&gw, "/slow/0"), true).unwrap();
    assert_eq!(response.await.unwrap().status(), 200);
}

/// `server.max_requests_per_connection` (nginx's `keepalive_requests`): after that many
/// requests an HTTP/2 connection gets `GOAWAY` and an HTTP/1.1 connection `Connection: close`,
/// and the next request needs a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_is_closed_gracefully_after_max_requests_per_connection() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true\nmax_requests_per_connection = 20",
        &config(&up.url(), None),
    )
    .await;
    // HTTP/2.
    let mut client = h2_client(&gw).await;
    let mut answered = 0;
    for _ in 0..30 {
        let Ok(ready) = client.clone().ready().await else {
            break;
        };
        client = ready;
        let Ok((response, _)) = client.send_request(h2_get(&gw, "/slow/0"), true) else {
            break;
        };
        match response.await {
            Ok(r) if r.status() == 200 => answered += 1,
            _ => break,
        }
    }
    eprintln!("HTTP/2: {answered} requests answered on one connection (max 20)");
    assert_eq!(answered, 20);
    // HTTP/1.1.
    let tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<bytes::Bytes>,
    >(hyper_util::rt::TokioIo::new(tcp))
    .await
    .unwrap();
    tokio::spawn(connection);
    let mut answered = 0;
    let mut last_close = false;
    for _ in 0..30 {
        if sender.ready().await.is_err() {
            break;
        }
        let request = http::Request::get("/slow/0")
            .header("host", "x")
            .body(http_body_util::Empty::new())
            .unwrap();
        match sender.send_request(request).await {
            Ok(r) if r.status() == 200 => {
                answered += 1;
                last_close = r
                    .headers()
                    .get("connection")
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                let _ = http_body_util::BodyExt::collect(r.into_body()).await;
            }
            _ => break,
        }
    }
    eprintln!(
        "HTTP/1.1: {answered} requests answered on one connection, the last with Connection: close = {last_close}"
    );
    assert_eq!(answered, 20);
    assert!(last_close);
    assert_eq!(
        common::metric(
            &gw,
            "sluice_connections_closed_early_total{reason=\"max_requests\"}"
        )
        .await,
        2.0
    );
}

/// `server.max_upstream_connections`: beyond that many upstream sockets requests get 503 with
/// `Retry-After` at once, rather than the process running out of descriptors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_upstream_budget_get_503_with_retry_after() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true\nmax_upstream_connections = 20\nmax_upstream_per_connection = 100",
        &config(&up.url(), None),
    )
    .await;
    let mut client = h2_client(&gw).await;
    let mut pending = Vec::new();
    for _ in 0..40 {
        client = client.ready().await.unwrap();
        let (response, _) = client
            .send_request(h2_get(&gw, "/slow/1500"), true)
            .unwrap();
        pending.push(response);
    }
    let mut statuses = std::collections::BTreeMap::new();
    let mut retry_after = 0;
    for response in pending {
        let r = response.await.unwrap();
        retry_after += usize::from(r.headers().contains_key("retry-after"));
        *statuses.entry(r.status().as_u16()).or_insert(0) += 1;
    }
    eprintln!("40 slow requests on a budget of 20 upstream sockets: {statuses:?}");
    assert_eq!(statuses.get(&200), Some(&20), "{statuses:?}");
    assert_eq!(statuses.get(&503), Some(&20), "{statuses:?}");
    assert_eq!(retry_after, 20);
    assert_eq!(
        common::metric(&gw, "sluice_upstream_budget_refused_total{scope=\"total\"}").await,
        20.0
    );
}

/// `server.max_upstream_per_connection`: the requests of one HTTP/2 connection take turns for
/// its shares of upstream sockets; all are answered, a share at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_requests_of_one_connection_take_turns_for_its_upstream_shares() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "h2c = true\nmax_upstream_per_connection = 4",
        &config(&up.url(), None),
    )
    .await;
    let mut client = h2_client(&gw).await;
    let started = std::time::Instant::now();
    let mut pending = Vec::new();
    for _ in 0..8 {
        client = client.ready().await.unwrap();
        let (response, _) = client
            .send_request(h2_get(&gw, "/slow/1000"), true)
            .unwrap();
        pending.push(response);
    }
    for response in pending {
        assert_eq!(response.await.unwrap().status(), 200);
    }
    let took = started.elapsed();
    eprintln!("8 requests of 1 s on 4 shares took {took:?}");
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(4),
        "{took:?}"
    );
}

/// The soft and hard open-files limits of process `pid`.
fn open_files_of(pid: u32) -> (u64, u64) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let mut fields = line.split_whitespace().skip(3).map(|v| v.parse().unwrap());
    (fields.next().unwrap(), fields.next().unwrap())
}

/// Without `max_connections` set, on a machine whose hard open-files limit (20,000) cannot
/// hold the default's 20,256 descriptors, the cap is sized from the limit (9,872: a client and
/// an upstream socket each, and 256), the log says so, and nothing warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_is_sized_from_the_open_files_limit_when_not_set() {
    let up = Upstream::start().await;
    let gw =
        Gateway::start_with_open_files(Some((1024, 20_000)), "", &config(&up.url(), None)).await;
    let log = gw.log_text();
    let limits = open_files_of(gw.child.id());
    let line = log
        .lines()
        .find(|l| l.contains("sized from the open-files limit"))
        .unwrap_or_default();
    eprintln!("open files {limits:?}; {line}");
    assert!(line.contains("max_connections=9872"), "{log}");
    assert!(line.contains("max_upstream_connections=9872"), "{log}");
    assert!(!log.contains("need more open files"), "{log}");
    assert_eq!(limits, (20_000, 20_000));
}

/// HTTP/2 multiplies upstream sockets: 8 connections × 125 slow streams would need 1,000
/// upstream sockets. Under a hard open-files limit of 600 (so `max_connections` 172, and as
/// many upstream sockets), the upstream sockets stop at the budget, the requests beyond it
/// get 503 (or wait their connection's turn and reuse a socket), and the process never runs
/// out of descriptors: an ordinary client connecting during the attack is answered.
/// Without the budget every stream opened its socket until `accept` failed with "Too many
/// open files".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multiplied_upstream_sockets_stop_at_the_budget_before_descriptors_run_out() {
    let up = Upstream::start().await;
    let gw =
        Gateway::start_with_open_files(Some((600, 600)), "h2c = true", &config(&up.url(), None))
            .await;
    let mut attackers = Vec::new();
    for _ in 0..8 {
        let mut client = h2_client(&gw).await;
        let mut pending = Vec::new();
        for _ in 0..125 {
            client = client.ready().await.unwrap();
            let (response, _) = client
                .send_request(h2_get(&gw, "/slow/3000"), true)
                .unwrap();
            pending.push(response);
        }
        attackers.push((client, pending));
    }
    // The attack's requests are all in flight: an ordinary client now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ordinary =
        tokio::time::timeout(Duration::from_secs(5), common::get(&gw.url("/slow/0"))).await;
    // The gauge is refreshed every second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let sockets = common::metric(&gw, "sluice_upstream_connections_open").await;
    let mut statuses = std::collections::BTreeMap::new();
    for (_client, pending) in attackers {
        for response in pending {
            let status = match response.await {
                Ok(r) => r.status().as_u16(),
                Err(_) => 0,
            };
            *statuses.entry(status).or_insert(0) += 1;
        }
    }
    let log = gw.log_text();
    eprintln!(
        "1,000 slow streams under 600 open files: {statuses:?}; {sockets} upstream sockets open during the attack; an ordinary client during the attack: {:?}; \"Too many open files\" in the log: {}",
        ordinary.as_ref().map(|a| a.as_ref().map(|a| a.status)),
        log.matches("Too many open files").count()
    );
    assert!(!log.contains("Too many open files"), "{log}");
    let ordinary = ordinary
        .expect("an ordinary client not served within 5 s")
        .unwrap();
    assert!(
        [200, 503].contains(&ordinary.status.as_u16()),
        "{:?}",
        ordinary.status
    );
    assert!(
        (100.0..=172.0).contains(&sockets),
        "{sockets} upstream sockets"
    );
    let served = statuses.get(&200).copied().unwrap_or(0);
    assert!(served >= 172, "{statuses:?}");
    assert_eq!(
        served + statuses.get(&503).copied().unwrap_or(0),
        1000,
        "{statuses:?}"
    );
}
