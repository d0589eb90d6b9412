//! Plain-text HTTP/2 (h2c): with prior knowledge beside HTTP/1.1 on the main listener,
//! towards h2c upstreams (trailers both ways, a connection the upstream closes), and an idle
//! HTTP/2 connection closed at the keep-alive timeout. Driven with curl and hyper's HTTP/2
//! client against the built `sluice` binary; HTTP/2 over TLS is in `tests/tls.rs`.
//!
//! curl is needed: without it a test fails under `CI=true`, and says `skipped: curl missing`
//! otherwise.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::config::{policy, route};
use common::tools::{count, curl_each, curl_many, have};
use common::{Gateway, Upstream};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

// === test servers ===

/// An HTTP/2 server with prior knowledge (an h2c upstream, as a gRPC server is): answers
/// `hello` with the trailer `grpc-status: 0` and `x-got-authority` (the `:authority` it got),
/// and echoes in `x-got-te` the `TE` it received and in `x-got-trailer` the request's
/// trailer `x-client-trailer`.
async fn h2c_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let authority = req.uri().authority().map(|a| a.to_string());
                    let te = req.headers().get("te").cloned();
                    let collected = req.into_body().collect().await.ok();
                    let trailer = collected
                        .as_ref()
                        .and_then(|c| c.trailers())
                        .and_then(|t| t.get("x-client-trailer"))
                        .cloned();
                    let mut trailers = HeaderMap::new();
                    trailers.insert("grpc-status", "0".parse().unwrap());
                    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                        Ok(Frame::data(Bytes::from_static(b"hello"))),
                        Ok(Frame::trailers(trailers)),
                    ];
                    let mut r = Response::new(StreamBody::new(futures_util::stream::iter(frames)));
                    let h = r.headers_mut();
                    h.insert(
                        "x-got-authority",
                        authority.unwrap_or_default().parse().unwrap(),
                    );
                    if let Some(te) = te {
                        h.insert("x-got-te", te);
                    }
                    if let Some(t) = trailer {
                        h.insert("x-got-trailer", t);
                    }
                    Ok::<_, Infallible>(r)
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// An h2c upstream that closes each connection (GOAWAY) once it has answered one request;
/// the answer names the connection (`conn-N`).
async fn one_request_h2c_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for n in 0u64.. {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
                let done_tx = std::sync::Mutex::new(Some(done_tx));
                let svc = service_fn(move |_req: Request<Incoming>| {
                    if let Some(tx) = done_tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                    async move {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "conn-{n}"
                        )))))
                    }
                });
                let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => return,
                    _ = done_rx => {}
                }
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            });
        }
    });
    addr
}

// === the tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_prior_knowledge_beside_http1_and_h2c_upstreams_with_trailers() {
    if !have("curl") {
        return;
    }
    let h2 = h2c_upstream().await;
    let rest = format!(
        "{}{}",
        policy("api", 5),
        route("/api/", &["api"], &format!("h2c://{h2}")),
    );
    let gw = Gateway::start("", &rest).await;

    let prior = curl_each(&["--http2-prior-knowledge"], &gw.url("/api/x"), 20);
    assert_eq!(count(&prior, "2 200"), 5, "{prior:?}");
    assert_eq!(count(&prior, "2 429"), 15, "{prior:?}");
    // HTTP/1.1 on the same port still works (and is limited by the same bucket).
    let h1 = curl_many(&["--http1.1"], &gw.url("/api/x"), 1);
    assert_eq!(h1, ["1.1 429"]);

    // An HTTP/2 client with prior knowledge through the gateway to the h2c upstream: the
    // trailers pass both ways, TE: trailers reaches the upstream, :authority is the client's.
    let gw2 = Gateway::start("", &route("/rpc/", &[], &format!("h2c://{h2}"))).await;
    let tcp = TcpStream::connect(("127.0.0.1", gw2.port)).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-client-trailer", "sent".parse().unwrap());
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
        Ok(Frame::data(Bytes::from_static(b"ping"))),
        Ok(Frame::trailers(trailers)),
    ];
    let authority = format!("grpc.example:{}", gw2.port);
    let req = Request::post(format!("http://{authority}/rpc/Say"))
        .header("te", "trailers")
        .header("content-type", "application/grpc")
        .body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap();
    let response = sender.send_request(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-got-authority"], authority.as_str());
    assert_eq!(response.headers()["x-got-te"], "trailers");
    assert_eq!(response.headers()["x-got-trailer"], "sent");
    let body = response.into_body().collect().await.unwrap();
    let trailers = body.trailers().cloned().expect("the upstream's trailers");
    assert_eq!(trailers["grpc-status"], "0");
    assert_eq!(body.to_bytes(), "hello");

    // With h2c = false the plain port speaks HTTP/1.1 only.
    let gw3 = Gateway::start("h2c = false", &route("/", &[], &format!("h2c://{h2}"))).await;
    let refused = curl_many(&["--http2-prior-knowledge"], &gw3.url("/x"), 1);
    assert!(!refused.iter().any(|l| l.starts_with("2 ")), "{refused:?}");
    let h1 = curl_many(&["--http1.1"], &gw3.url("/x"), 1);
    assert_eq!(h1, ["1.1 200"]);
    assert!(!gw.log_text().contains("panicked"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upstream_connection_that_closes_is_made_again() {
    let up = one_request_h2c_upstream().await;
    let gw = Gateway::start("workers = 1", &route("/", &[], &format!("h2c://{up}"))).await;
    let mut seen = Vec::new();
    for _ in 0..4 {
        let a = common::get(&gw.url("/x")).await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{:?} {}", a.body, gw.log_text());
        seen.push(String::from_utf8_lossy(&a.body).into_owned());
        // Let the GOAWAY arrive, as it would between a client's requests.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    seen.dedup();
    assert_eq!(seen.len(), 4, "each request on a new connection: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_at_the_keep_alive_timeout_though_it_pings() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "keep_alive_timeout = \"1s\"\nheader_read_timeout = \"6s\"",
        &route("/", &[], &up.url()),
    )
    .await;
    let tcp = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(200))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let closed = tokio::spawn(conn);
    let req = Request::get(format!("http://127.0.0.1:{}/x", gw.port))
        .body(Full::<Bytes>::default())
        .unwrap();
    let r = sender.send_request(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.into_body().collect().await.unwrap();
    let idle_since = Instant::now();
    // The client pings every 200 ms; the gateway still closes the idle connection at
    // keep_alive_timeout, not at the (longer) header timeout the pings would start.
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the idle connection stayed open")
        .unwrap()
        .ok();
    let idle = idle_since.elapsed();
    assert!(
        idle >= Duration::from_millis(800) && idle < Duration::from_secs(4),
        "closed after {idle:?}"
    );
}
