//! The gateway towards its upstreams at the edge: a pooled connection the upstream dropped
//! without a word, and an upstream that does not accept connections. Real sockets on
//! 127.0.0.1 against the built binary.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{get, Gateway};
use http::{Request, StatusCode};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that silently stops answering on a connection idle for more than a second
/// (as one behind a firewall that drops idle flows without a word): it reads the request and
/// never replies. Records when it saw each connection closed by the gateway.
struct Sulky {
    addr: SocketAddr,
    accepted: Arc<Mutex<u64>>,
    closed: Arc<Mutex<Vec<Instant>>>,
}

impl Sulky {
    async fn start() -> Sulky {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted: Arc<Mutex<u64>> = Arc::default();
        let closed: Arc<Mutex<Vec<Instant>>> = Arc::default();
        let (a, c) = (Arc::clone(&accepted), Arc::clone(&closed));
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    continue;
                };
                *a.lock().unwrap() += 1;
                let c = Arc::clone(&c);
                tokio::spawn(async move {
                    let mut last = Instant::now();
                    let mut buf = vec![0u8; 4096];
                    let mut pending = Vec::new();
                    loop {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => {
                                c.lock().unwrap().push(Instant::now());
                                return;
                            }
                            Ok(n) => pending.extend_from_slice(&buf[..n]),
                        }
                        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                            pending.drain(..end + 4);
                            if last.elapsed() > Duration::from_secs(1) {
                                continue; // silent from now on
                            }
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                .await;
                            last = Instant::now();
                        }
                    }
                });
            }
        });
        Sulky {
            addr,
            accepted,
            closed,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_drops_idle_connections_silently_costs_no_request_its_timeout() {
    // With the idle timeout at 60 s, the pooled connection is used again and the request
    // waits the whole upstream_timeout: what upstream_idle_timeout prevents.
    let up = Sulky::start().await;
    let routes = |idle: &str| {
        format!(
            "[[route]]\npath_prefix = \"/\"\nupstream = \"http://{}\"\nupstream_timeout = \"2s\"\n",
            up.addr
        ) + idle
    };
    let gw = Gateway::start("workers = 1", &routes("")).await;
    let client = common::client();
    let ask = || {
        common::send(
            &client,
            Request::get(gw.url("/x")).body(Full::default()).unwrap(),
        )
    };
    assert_eq!(ask().await.unwrap().status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = Instant::now();
    assert_eq!(ask().await.unwrap().status, StatusCode::GATEWAY_TIMEOUT);
    assert!(started.elapsed() >= Duration::from_millis(1900));
    drop(gw);

    let up = Sulky::start().await;
    let gw = Gateway::start(
        "workers = 1\nupstream_idle_timeout = \"500ms\"",
        &format!(
            "[[route]]\npath_prefix = \"/\"\nupstream = \"http://{}\"\nupstream_timeout = \"2s\"\n",
            up.addr
        ),
    )
    .await;
    let ask = || {
        common::send(
            &client,
            Request::get(gw.url("/x")).body(Full::default()).unwrap(),
        )
    };
    assert_eq!(ask().await.unwrap().status, StatusCode::OK);
    let idle_since = Instant::now();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The gateway closed the idle connection itself, between 0.5 s and a sweep later.
    let closed = up.closed.lock().unwrap().clone();
    assert_eq!(closed.len(), 1, "the pooled connection is still open");
    let after = closed[0] - idle_since;
    assert!(
        after >= Duration::from_millis(450) && after < Duration::from_millis(2000),
        "{after:?}"
    );
    let started = Instant::now();
    assert_eq!(ask().await.unwrap().status, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(*up.accepted.lock().unwrap(), 2);
    let metrics = get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("sluice_upstream_pool_idle{worker=\"0\"}"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_does_not_accept_gets_504_after_the_connect_timeout() {
    // A listener whose accept queue is full: the kernel drops further SYNs, so a connect
    // neither succeeds nor fails.
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket
        .bind(&"127.0.0.1:0".parse::<SocketAddr>().unwrap().into())
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(300), TcpStream::connect(addr)).await
        {
            fillers.push(s);
        }
    }
    let gw = Gateway::start(
        "upstream_connect_timeout = \"500ms\"",
        &format!(
            "[[route]]\npath_prefix = \"/\"\nupstream = \"http://{addr}\"\nupstream_timeout = \"10s\"\n"
        ),
    )
    .await;
    let started = Instant::now();
    let a = get(&gw.url("/x")).await.unwrap();
    let took = started.elapsed();
    assert_eq!(a.status, StatusCode::GATEWAY_TIMEOUT, "{:?}", a.body);
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // The access line is written once the answer is sent: wait for it, within a bound.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !gw.log_text().contains("decision=upstream_timeout")
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gw.log_text().contains("decision=upstream_timeout"));
    drop(socket);
}

/// An upstream that answers every request with a head and the first 5 of 10 promised body
/// bytes, then stalls, its connection open. Records when it saw each connection closed.
async fn stalling_upstream() -> (SocketAddr, Arc<Mutex<Vec<Instant>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let closed: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let c = Arc::clone(&closed);
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            let c = Arc::clone(&c);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut answered = false;
                loop {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => {
                            c.lock().unwrap().push(Instant::now());
                            return;
                        }
                        Ok(_) if !answered => {
                            answered = true;
                            let _ = s
                                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhello")
                                .await;
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    (addr, closed)
}

/// An upstream that sends its answer's head and then stalls holds nothing for longer than
/// `upstream_read_timeout` (nginx's `proxy_read_timeout`), on the byte path and hyper's: the
/// client connection, whose answer has begun, is closed; the concurrency slot and the upstream
/// connection are given back; the stall is counted and logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_body_that_stalls_closes_the_client_connection_after_the_read_timeout() {
    let (addr, closed) = stalling_upstream().await;
    let config = format!(
        "[[policy]]\nname = \"one\"\ncapacity = 1000\nrate = \"1000/s\"\nconcurrency = 1\n\n\
         [[route]]\npath_prefix = \"/\"\npolicies = [\"one\"]\nupstream = \"http://{addr}\"\n"
    );
    for byte_path in [true, false] {
        let gw = Gateway::start(
            &format!("workers = 1\nbyte_path = {byte_path}\nupstream_read_timeout = \"500ms\""),
            &config,
        )
        .await;
        let upstream_closes = closed.lock().unwrap().len();
        let mut client = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        client
            .write_all(b"GET /x HTTP/1.1\r\nHost: example.test\r\n\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let mut got = Vec::new();
        let ended =
            tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut got)).await;
        let took = started.elapsed();
        let text = String::from_utf8_lossy(&got).into_owned();
        assert!(
            ended.is_ok(),
            "byte_path = {byte_path}: the client connection is still open after 5 s: {text:?}"
        );
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text:?}");
        assert!(text.ends_with("hello"), "{text:?}");
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(3),
            "byte_path = {byte_path}: closed after {took:?}"
        );
        // The slot is free again: the next request is admitted (and stalls in its turn).
        let mut next = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
        next.write_all(b"GET /y HTTP/1.1\r\nHost: example.test\r\n\r\n")
            .await
            .unwrap();
        let mut head = [0u8; 12];
        next.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 200", "byte_path = {byte_path}");
        drop(next);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            closed.lock().unwrap().len() > upstream_closes,
            "byte_path = {byte_path}: the upstream connection is still open"
        );
        let errors = get(&gw.admin("/metrics")).await.unwrap();
        let errors = String::from_utf8_lossy(&errors.body).into_owned();
        assert!(
            errors
                .lines()
                .any(|l| l.starts_with("sluice_upstream_errors_total")
                    && l.contains("error=\"read_timeout\"")
                    && l.ends_with(" 1")),
            "byte_path = {byte_path}: {errors}"
        );
        gw.wait_log("the upstream's answer stalled", Duration::from_secs(2))
            .await;
    }
}

/// An upstream that answers one request on each connection, keeping it open, and closes it
/// 1.5 s later (as one whose own idle timeout is short does).
async fn closing_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
                tokio::time::sleep(Duration::from_millis(1500)).await;
            });
        }
    });
    addr
}

/// A pooled connection the upstream closes leaves the pool at once, on the byte path as on
/// hyper's: its socket is closed (no CLOSE_WAIT) and its place in the budget given back
/// without waiting for a request to find it closed, or for `upstream_idle_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_connection_the_upstream_closes_leaves_the_pool_at_once() {
    let addr = closing_upstream().await;
    let config = format!("[[route]]\npath_prefix = \"/\"\nupstream = \"http://{addr}\"\n");
    for byte_path in [true, false] {
        let gw = Gateway::start(&format!("workers = 1\nbyte_path = {byte_path}"), &config).await;
        let a = get(&gw.url("/x")).await.unwrap();
        assert_eq!(a.status, StatusCode::OK);
        let answered = Instant::now();
        // The gauges follow the pool within a sweep (every second).
        let gauges = || async {
            (
                common::metric(&gw, "sluice_upstream_connections_open").await,
                common::metric(&gw, "sluice_upstream_pool_idle").await,
            )
        };
        let mut seen = gauges().await;
        while seen != (1.0, 1.0) && answered.elapsed() < Duration::from_millis(1400) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen = gauges().await;
        }
        assert_eq!(seen, (1.0, 1.0), "byte_path = {byte_path}: pooled");
        // The upstream closes its side 1.5 s after its answer.
        while seen != (0.0, 0.0) && answered.elapsed() < Duration::from_millis(3500) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            seen = gauges().await;
        }
        assert_eq!(
            seen,
            (0.0, 0.0),
            "byte_path = {byte_path}: (upstream connections open, pooled) 2 s after the upstream closed its side"
        );
    }
}
