//! The main listener against its clients: body limits and body timeouts, an authenticated
//! admin listener, connection limits, slow and silent clients, and the open-files limit.
//! Real sockets on 127.0.0.1 against the built binary.
//!
//! What the gateway passes on about a client (`Forwarded`, `X-Request-Id`) is in
//! `tests/edge_headers.rs`; how it treats upstreams that stall or drop connections, in
//! `tests/edge_upstream.rs`.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::config::two_routes;
use common::{get, Gateway};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that tells request heads from complete requests: `heads` counts every request
/// whose head arrived, `complete` holds the body length of each request that arrived whole,
/// `broken` counts those whose body failed.
#[derive(Clone)]
struct Recorder {
    addr: SocketAddr,
    heads: Arc<Mutex<u64>>,
    complete: Arc<Mutex<Vec<usize>>>,
    broken: Arc<Mutex<u64>>,
}

impl Recorder {
    async fn start() -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let rec = Recorder {
            addr: listener.local_addr().unwrap(),
            heads: Arc::default(),
            complete: Arc::default(),
            broken: Arc::default(),
        };
        let r = rec.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let r = r.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let r = r.clone();
                        async move {
                            *r.heads.lock().unwrap() += 1;
                            let path = req.uri().path().to_owned();
                            match req.into_body().collect().await {
                                Ok(body) => r.complete.lock().unwrap().push(body.to_bytes().len()),
                                Err(_) => *r.broken.lock().unwrap() += 1,
                            }
                            let body = if let Some(n) = path.strip_prefix("/big/") {
                                vec![b'x'; n.parse().unwrap_or(0)]
                            } else {
                                b"ok".to_vec()
                            };
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        rec
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn heads(&self) -> u64 {
        *self.heads.lock().unwrap()
    }

    fn complete(&self) -> Vec<usize> {
        self.complete.lock().unwrap().clone()
    }
}

/// Writes `head` then each of `parts` (after `pause`), and reads the answer until the gateway
/// closes the connection or `limit` passes. Returns the answer and how long it took.
async fn exchange(
    port: u16,
    head: &str,
    parts: &[&[u8]],
    pause: Duration,
    limit: Duration,
) -> (String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    for part in parts {
        tokio::time::sleep(pause).await;
        if s.write_all(part).await.is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(limit, s.read_to_end(&mut answer)).await;
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

fn status_of(answer: &str) -> u16 {
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_over_max_body_get_413_before_the_upstream_sees_them() {
    let up = Recorder::start().await;
    let gw = Gateway::start(
        "max_body = \"1KiB\"",
        &two_routes(&up.url(), "max_body = \"4KiB\""),
    )
    .await;
    let long = |path: &str, len: usize| {
        format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n")
    };
    let chunked = |path: &str| {
        format!("POST {path} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
    };
    let wait = Duration::from_secs(5);
    let none = Duration::ZERO;

    // By Content-Length, at once: the body is not even sent.
    let (a, took) = exchange(gw.port, &long("/api/x", 16 * 1024), &[], none, wait).await;
    assert_eq!(status_of(&a), 413, "{a}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // By counting a chunked body: 2 KiB in 512-byte chunks.
    let block = chunk(&[b'a'; 512]);
    let mut parts: Vec<&[u8]> = vec![&block; 4];
    parts.push(b"0\r\n\r\n");
    let (a, _) = exchange(gw.port, &chunked("/api/x"), &parts, none, wait).await;
    assert_eq!(status_of(&a), 413, "{a}");
    assert_eq!(up.heads(), 0, "the upstream saw a request");

    // The route's own max_body: 2 KiB chunked passes, whole, and 8 KiB is refused.
    let (a, _) = exchange(gw.port, &chunked("/upload/x"), &parts, none, wait).await;
    assert_eq!(status_of(&a), 200, "{a}");
    assert_eq!(up.complete(), [2048]);
    let (a, _) = exchange(gw.port, &long("/upload/x", 8 * 1024), &[], none, wait).await;
    assert_eq!(status_of(&a), 413, "{a}");
    // At the limit exactly: accepted.
    let body = vec![b'b'; 1024];
    let (a, _) = exchange(gw.port, &long("/api/x", 1024), &[&body], none, wait).await;
    assert_eq!(status_of(&a), 200, "{a}");
    assert_eq!(up.complete(), [2048, 1024]);
    assert_eq!(up.heads(), 2);
    let log = gw.log_text();
    assert!(log.contains("decision=body_too_large"), "{log}");
    let metrics = get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("sluice_request_body_refused_total{route=\"/api/\",reason=\"too_large\",protocol=\"http1\"} 2"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_gets_408_and_never_reaches_the_upstream_whole() {
    let up = Recorder::start().await;
    let gw = Gateway::start("client_body_timeout = \"1s\"", &two_routes(&up.url(), "")).await;
    let wait = Duration::from_secs(6);
    // Content-Length 100, 10 bytes, then nothing: streamed upstream, then cut.
    let head = "POST /api/x HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n";
    let (a, took) = exchange(gw.port, head, &[&[b'x'; 10]], Duration::ZERO, wait).await;
    assert_eq!(status_of(&a), 408, "{a}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?}"
    );
    // Chunked, one chunk, then nothing: stalls before the upstream sees it.
    let head = "POST /api/y HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n";
    let one = chunk(b"0123456789");
    let (a, took) = exchange(gw.port, head, &[&one], Duration::ZERO, wait).await;
    assert_eq!(status_of(&a), 408, "{a}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    // A slow body whose gaps stay under the timeout is forwarded whole.
    let parts: Vec<&[u8]> = vec![b"aaaaa", b"bbbbb"];
    let head = "POST /api/z HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\n";
    let (a, _) = exchange(gw.port, head, &parts, Duration::from_millis(600), wait).await;
    assert_eq!(status_of(&a), 200, "{a}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        up.complete(),
        [10],
        "only the slow but steady body arrived whole"
    );
    assert!(gw.log_text().contains("decision=body_timeout"));
    let metrics = get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("sluice_request_body_refused_total{route=\"/api/\",reason=\"timeout\",protocol=\"http1\"} 2"),
        "{text}"
    );
    assert_eq!(
        get(&gw.admin("/healthz")).await.unwrap().status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_needs_the_token_and_never_logs_it() {
    let up = Recorder::start().await;
    let dir = common::TempDir::new();
    let token = "t0k3n-only-the-operator-knows-4f9a";
    let token_file = dir.0.join("admin-token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let server = format!(
        "admin_token = \"file:{}\"\nheader_read_timeout = \"1s\"",
        token_file.display()
    );
    let gw = Gateway::start(&server, &two_routes(&up.url(), "")).await;
    let client = common::client();
    let ask = |method: &str, path: &str, auth: Option<&str>| {
        let mut req = Request::builder().method(method).uri(gw.admin(path));
        if let Some(auth) = auth {
            req = req.header("authorization", auth);
        }
        let body = if method == "POST" {
            r#"{"policy":"none"}"#
        } else {
            ""
        };
        common::send(&client, req.body(Full::new(Bytes::from(body))).unwrap())
    };
    let right = format!("Bearer {token}");
    let same_length_wrong = format!("Bearer {}", "x".repeat(token.len()));
    for path in ["/metrics", "/v1/stats", "/dashboard", "/nowhere"] {
        for auth in [
            None,
            Some("Bearer nope"),
            Some(same_length_wrong.as_str()),
            Some(token),
        ] {
            let a = ask("GET", path, auth).await.unwrap();
            assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{path} {auth:?}");
            assert!(a
                .header("www-authenticate")
                .is_some_and(|v| v.starts_with("Bearer")));
        }
    }
    let a = ask("POST", "/v1/check", None).await.unwrap();
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        ask("GET", "/metrics", Some(&right)).await.unwrap().status,
        StatusCode::OK
    );
    assert_eq!(
        ask("GET", "/metrics", Some(&format!("bearer   {token}")))
            .await
            .unwrap()
            .status,
        StatusCode::OK
    );
    assert_eq!(
        ask("GET", "/v1/stats", Some(&right)).await.unwrap().status,
        StatusCode::OK
    );
    // An unknown policy: the decision API answered, past the token.
    assert_eq!(
        ask("POST", "/v1/check", Some(&right)).await.unwrap().status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        ask("GET", "/healthz", None).await.unwrap().status,
        StatusCode::OK
    );

    // The admin listener closes a connection whose head is not complete in time.
    let (a, took) = exchange(
        gw.admin_port,
        "GET /healthz HTTP/1.1\r\nhost",
        &[],
        Duration::ZERO,
        Duration::from_secs(6),
    )
    .await;
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "{took:?} {a}"
    );

    // A reload logs what changed, never the secret.
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(5))
        .await;
    let log = gw.log_text();
    assert!(!log.contains(token), "the token is in the log:\n{log}");
    assert!(!log.contains("x".repeat(token.len()).as_str()));
}

/// `[store]` in a file under `dir`, and `/api/` limited by a generous policy kept in it. The
/// file is written every 500 ms and the policy answers 503 once no write has succeeded for a
/// second (so a store that cannot write, as when descriptors run out, shows within a test,
/// while a loaded test machine's scheduling delays do not).
fn file_store_routes(dir: &std::path::Path, up: &str) -> String {
    format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\nmax_loss = \"1s\"\n\n\
         [[policy]]\nname = \"api\"\ncapacity = 100000\nrate = \"100000/s\"\nkey = \"ip\"\n\n\
         [[route]]\npath_prefix = \"/api/\"\npolicies = [\"api\"]\nupstream = \"{up}\"\n",
        dir.join("state").display()
    )
}

/// Whether the gateway closed `stream` within `limit` (EOF or reset), without sending
/// anything on it.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, stream.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// The value of an unlabelled series in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A flood of connections that each begin a request head (so none is idle, and none gives
/// its place to a new connection) is capped at `max_connections`: the rest are closed at
/// accept, and ordinary clients are served again as soon as connections go away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_flood_is_capped_and_ordinary_requests_resume_when_connections_free_up() {
    let up = Recorder::start().await;
    let dir = common::TempDir::new();
    let mut gw = Gateway::start(
        "max_connections = 100\nheader_read_timeout = \"60s\"",
        &file_store_routes(&dir.0, &up.url()),
    )
    .await;
    let mut held = Vec::new();
    for i in 0..300 {
        let mut s = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        // Refused ones may be closed already.
        let _ = s.write_all(b"GET /api/x HTTP/1.1\r\n").await;
        held.push(s);
        if i == 99 {
            // The hundred have their heads begun before the others come.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    // Every connection beyond the hundredth is closed at accept; the hundred stay open.
    let checks: Vec<_> = held
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let closed = closed_within(&mut s, Duration::from_secs(2)).await;
                (closed, s)
            })
        })
        .collect();
    let mut open = Vec::new();
    let mut closed = 0;
    for check in checks {
        let (was_closed, s) = check.await.unwrap();
        if was_closed {
            closed += 1;
        } else {
            open.push(s);
        }
    }
    assert_eq!((open.len(), closed), (100, 200));
    // At the cap, a new client is refused too.
    assert!(get(&gw.url("/api/x")).await.is_err());
    // Ten connections go away: ten ordinary requests are served as soon as they are gone.
    open.truncate(90);
    let freed = Instant::now();
    let mut served = 0;
    while served < 10 {
        match get(&gw.url("/api/x")).await {
            Ok(a) => {
                assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
                served += 1;
            }
            Err(_) => {
                assert!(freed.elapsed() < Duration::from_secs(2), "still refused");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    // The gauge counts the 90 held open once the ten requests' own connections have closed
    // (their clients close them as they finish, a moment after the answers).
    let deadline = Instant::now() + Duration::from_secs(2);
    let text = loop {
        let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        if metric(&text, "sluice_connections_open") == Some(90.0) || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        metric(&text, "sluice_connections_refused_total").is_some_and(|n| n >= 201.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "sluice_connections_open"),
        Some(90.0),
        "{text}"
    );
    drop(open);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = get(&gw.url("/api/x")).await.unwrap();
    assert_eq!(a.status, StatusCode::OK, "{:?} {}", a.body, gw.log_text());
    assert!(gw.child_alive());
    let log = gw.log_text();
    assert!(!log.contains("panicked") && !log.contains("ERROR"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_closed_at_the_header_timeout_and_cost_others_nothing() {
    let up = Recorder::start().await;
    let gw = Gateway::start("header_read_timeout = \"3s\"", &two_routes(&up.url(), "")).await;
    let port = gw.port;
    let head = b"GET /api/slow HTTP/1.1\r\nhost: x\r\nx-padding: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut slow = Vec::new();
    for _ in 0..500 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        slow.push(tokio::spawn(async move {
            let started = Instant::now();
            let mut buf = [0u8; 256];
            for byte in head.iter().cycle() {
                if s.write_all(&[*byte]).await.is_err() {
                    break;
                }
                tokio::select! {
                    read = s.read(&mut buf) => {
                        match read {
                            Ok(0) | Err(_) => break,
                            // An answer would mean the whole head got through.
                            Ok(_) => return Err(String::from_utf8_lossy(&buf).into_owned()),
                        }
                    }
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                if started.elapsed() > Duration::from_secs(20) {
                    break;
                }
            }
            Ok(started.elapsed())
        }));
    }
    // Meanwhile, ordinary requests, each on a new connection.
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        let started = Instant::now();
        let a = get(&gw.url("/api/x")).await.unwrap();
        assert_eq!(a.status, StatusCode::OK);
        latencies.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    assert!(
        median < Duration::from_millis(20),
        "median {median:?} of {}",
        latencies.len()
    );
    for task in slow {
        let lived = task.await.unwrap().unwrap();
        assert!(
            lived >= Duration::from_millis(2900) && lived < Duration::from_secs(8),
            "a slow connection lived {lived:?}"
        );
    }
    assert_eq!(up.heads() as usize, latencies.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_loses_its_connection_and_its_permit_after_send_timeout() {
    let up = Recorder::start().await;
    let gw = Gateway::start(
        "send_timeout = \"1s\"",
        &format!(
            "[[policy]]\nname = \"one\"\ncapacity = 1000\nrate = \"1000/s\"\nconcurrency = 1\n\n\
             [[route]]\npath_prefix = \"/big/\"\npolicies = [\"one\"]\nupstream = \"{}\"\n",
            up.url()
        ),
    )
    .await;
    // 32 MiB: far more than the socket buffers between the gateway and a client that does
    // not read.
    let mut reader = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    reader
        .write_all(b"GET /big/33554432 HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let sent = Instant::now();
    // While its response is stuck, the route's one slot is taken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = get(&gw.url("/big/10")).await.unwrap();
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{:?}", a.body);
    // Then the stalled connection is closed and the next client served.
    let served = loop {
        let a = get(&gw.url("/big/10")).await.unwrap();
        if a.status == StatusCode::OK {
            break sent.elapsed();
        }
        assert!(sent.elapsed() < Duration::from_secs(6), "still refused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        served >= Duration::from_millis(900) && served < Duration::from_secs(4),
        "{served:?}"
    );
    // The stalled client finds its connection closed once it reads what was buffered.
    let mut sink = vec![0u8; 1 << 20];
    let mut total = 0usize;
    let drained = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match reader.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    })
    .await;
    assert!(drained.is_ok() && total < 32 << 20, "read {total} bytes");
    let metrics = get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("sluice_connection_timeouts_total{timeout=\"send\"} 1"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_and_header_timeouts_are_timed_apart() {
    let up = Recorder::start().await;
    // A long keep-alive and a short header timeout: an idle connection outlives the header
    // timeout, a slow head does not.
    let gw = Gateway::start(
        "keep_alive_timeout = \"3s\"\nheader_read_timeout = \"1s\"",
        &two_routes(&up.url(), ""),
    )
    .await;
    let request = b"GET /api/x HTTP/1.1\r\nhost: x\r\n\r\n";
    let idle = async {
        let mut s = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        let idle_from = Instant::now();
        // Still open after twice the header timeout: a second request is served on it.
        tokio::time::sleep(Duration::from_millis(2000)).await;
        s.write_all(request).await.unwrap();
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        let idle_from2 = Instant::now();
        assert!(closed_within(&mut s, Duration::from_secs(6)).await);
        (idle_from2.elapsed(), idle_from)
    };
    let slow_head = async {
        let (a, took) = exchange(
            gw.port,
            "GET /api/x HTTP/1.1\r\nhost",
            &[],
            Duration::ZERO,
            Duration::from_secs(6),
        )
        .await;
        assert!(a.is_empty(), "{a}");
        took
    };
    let ((idle_for, _), head_took) = tokio::join!(idle, slow_head);
    assert!(
        idle_for >= Duration::from_millis(2900) && idle_for < Duration::from_secs(5),
        "closed after {idle_for:?} idle"
    );
    assert!(
        head_took >= Duration::from_millis(900) && head_took < Duration::from_millis(2500),
        "slow head closed after {head_took:?}"
    );

    // A short keep-alive: closed long before the header timeout.
    let gw = Gateway::start(
        "keep_alive_timeout = \"500ms\"\nheader_read_timeout = \"10s\"",
        &two_routes(&up.url(), ""),
    )
    .await;
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf).await.unwrap();
    let idle_from = Instant::now();
    assert!(closed_within(&mut s, Duration::from_secs(5)).await);
    let idle_for = idle_from.elapsed();
    assert!(
        idle_for >= Duration::from_millis(450) && idle_for < Duration::from_secs(2),
        "{idle_for:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_the_edge_settings_at_once_and_names_them() {
    let up = common::Upstream::start().await;
    let dir = common::TempDir::new();
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, "first-token\n").unwrap();
    let server = |extra: &str| {
        format!(
            "admin_token = \"file:{}\"\nmax_body = \"1KiB\"\n{extra}",
            token_file.display()
        )
    };
    let gw = Gateway::start(&server(""), &two_routes(&up.url(), "")).await;
    let body = "y".repeat(2048);
    assert_eq!(common::post(&gw.url("/api/x"), &body).await.status, 413);
    let a = get(&gw.url("/api/x")).await.unwrap();
    assert!(a.header("x-request-id").is_some());

    std::fs::write(&token_file, "second-token\n").unwrap();
    gw.rewrite(
        &server("max_body = \"4KiB\"\nrequest_id = false").replace("max_body = \"1KiB\"\n", ""),
        &two_routes(&up.url(), ""),
    );
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(5))
        .await;
    let log = gw.log_text();
    for field in ["server.max_body", "server.request_id", "server.admin_token"] {
        assert!(log.contains(field), "{field} not named in\n{log}");
    }
    assert!(!log.contains("first-token") && !log.contains("second-token"));
    assert_eq!(common::post(&gw.url("/api/x"), &body).await.status, 200);
    let a = get(&gw.url("/api/x")).await.unwrap();
    assert!(a.header("x-request-id").is_none());
    let admin = gw.admin("/metrics");
    let first = common::get_with(&admin, &[("authorization", "Bearer first-token")]).await;
    assert_eq!(first.status, StatusCode::UNAUTHORIZED);
    let second = common::get_with(&admin, &[("authorization", "Bearer second-token")]).await;
    assert_eq!(second.status, StatusCode::OK);
}

/// The soft and hard open-files limits in a `/proc/PID/limits` text.
fn open_files(limits: &str) -> (u64, u64) {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let mut fields = line.split_whitespace().skip(3).map(|v| v.parse().unwrap());
    (fields.next().unwrap(), fields.next().unwrap())
}

/// Starts `sluice serve` with `max_connections` under `prlimit --nofile=1024:HARD` (HARD: this
/// process's own hard limit, which an unprivileged process cannot raise) and returns the
/// gateway's soft and hard limits once it serves, with its log.
async fn open_files_limit_with(max_connections: u64) -> ((u64, u64), String) {
    let (_, hard) = open_files(&std::fs::read_to_string("/proc/self/limits").unwrap());
    let dir = common::TempDir::new();
    let (port, admin_port) = (common::free_port(), common::free_port());
    let config = dir.0.join("sluice.toml");
    let up = Recorder::start().await;
    let rest = format!(
        "[[route]]\npath_prefix = \"/\"\nupstream = \"{}\"\n",
        up.url()
    );
    let server = format!("max_connections = {max_connections}");
    std::fs::write(
        &config,
        common::config_text(port, admin_port, &server, &rest),
    )
    .unwrap();
    let log = dir.0.join("sluice.log");
    let mut child = std::process::Command::new("prlimit")
        .arg(format!("--nofile=1024:{hard}"))
        .args([common::bin(), "serve", "--config"])
        .arg(&config)
        .env("SLUICE_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("prlimit (util-linux) runs sluice");
    let deadline = Instant::now() + Duration::from_secs(10);
    let healthz = format!("http://127.0.0.1:{admin_port}/healthz");
    while get(&healthz).await.map(|r| r.status) != Ok(StatusCode::OK) {
        assert!(
            Instant::now() < deadline,
            "sluice not ready: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // prlimit execs sluice: the child's pid is the gateway's.
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    (open_files(&limits), std::fs::read_to_string(&log).unwrap())
}

#[tokio::test]
async fn the_open_files_limit_is_raised_to_what_max_connections_needs_up_to_the_hard_limit() {
    let (_, hard) = open_files(&std::fs::read_to_string("/proc/self/limits").unwrap());
    assert!(
        hard >= 4256,
        "this test needs a hard open-files limit of 4256, have {hard}"
    );
    // A soft limit of 1024 (a common default) under a higher hard one: raised to what 2000
    // connections need (a client and an upstream connection each, and 256), no warning.
    let ((soft, _), log) = open_files_limit_with(2000).await;
    assert_eq!(soft, 2 * 2000 + 256, "{log}");
    assert!(!log.contains("need more open files"), "{log}");
    // More than the hard limit allows: raised as far as it goes, and a warning names the setting.
    let ((soft, hard_now), log) = open_files_limit_with(hard).await;
    assert_eq!((soft, hard_now), (hard, hard), "{log}");
    assert!(
        log.contains(
            "server.max_connections and server.max_upstream_connections need more open files"
        ),
        "{log}"
    );
}
