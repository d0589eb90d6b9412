//! What an HTTP/2 stream may hold at the edge while its client stalls: a stream whose request
//! body does not come, a stream whose client grants no flow-control window for its answer,
//! and connections left idle once their client cancelled its streams. Each case runs on real
//! sockets on 127.0.0.1 against `sluice serve` and, where nginx serves the same case, against
//! nginx as a reverse proxy in front of the same upstream; an ordinary client asks in the
//! middle of it and must be served.

mod common;
mod nginx;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::Gateway;
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use nginx::Nginx;
use tokio::net::{TcpListener, TcpStream};

/// An HTTP/1.1 upstream that counts the connections open to it now. It reads each request's
/// body whole before it answers `ok`; `/slow/MS` is answered MS ms later.
struct Holder {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
}

impl Holder {
    async fn start() -> Holder {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&open);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let open = Arc::clone(&counted);
                open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let service = service_fn(|req: hyper::Request<Incoming>| async move {
                        let path = req.uri().path().to_owned();
                        let _ = req.into_body().collect().await;
                        if let Some(ms) = path.strip_prefix("/slow/") {
                            let ms = ms.parse().unwrap_or(1000);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                            b"ok\n",
                        ))))
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), service)
                        .await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Holder { addr, open }
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// An h2c client connection to `port` (prior knowledge), granting `window` bytes of initial
/// stream window when given; the connection's task ends when the server closes it.
async fn h2_connect(
    port: u16,
    window: Option<u32>,
) -> Result<
    (
        h2::client::SendRequest<Bytes>,
        tokio::task::JoinHandle<Result<(), h2::Error>>,
    ),
    String,
> {
    let tcp = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let mut builder = h2::client::Builder::new();
    if let Some(window) = window {
        builder.initial_window_size(window);
    }
    let (client, connection) = builder
        .handshake::<_, Bytes>(tcp)
        .await
        .map_err(|e| e.to_string())?;
    Ok((client, tokio::spawn(connection)))
}

fn request(port: u16, method: &str, path: &str) -> http::Request<()> {
    http::Request::builder()
        .method(method)
        .uri(format!("http://127.0.0.1:{port}{path}"))
        .body(())
        .unwrap()
}

/// An ordinary client: a new h2c connection, one `GET path`, the whole answer within 5 s.
/// Its status, or why there was none.
async fn ordinary(port: u16, path: &str) -> Result<u16, String> {
    let exchange = async {
        let (client, _connection) = h2_connect(port, None).await?;
        let mut client = client.ready().await.map_err(|e| e.to_string())?;
        let (response, _) = client
            .send_request(request(port, "GET", path), true)
            .map_err(|e| e.to_string())?;
        let response = response.await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        while let Some(data) = body.data().await {
            let data = data.map_err(|e| e.to_string())?;
            let _ = body.flow_control().release_capacity(data.len());
        }
        Ok(status)
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .unwrap_or_else(|_| Err("no answer within 5 s".to_owned()))
}

/// How each stream of an attack ended: its status, or `0` for a reset or no answer.
fn tally(statuses: &[u16]) -> BTreeMap<u16, usize> {
    let mut t = BTreeMap::new();
    for s in statuses {
        *t.entry(*s).or_insert(0) += 1;
    }
    t
}

/// The policy and route of every gateway here: everything admitted, `/` to `upstream`.
fn routes(upstream: SocketAddr) -> String {
    format!(
        "[[policy]]\nname = \"open\"\ncapacity = 1000000\nrate = \"1000000/s\"\n\n\
         [[route]]\npath_prefix = \"/\"\npolicies = [\"open\"]\nupstream = \"http://{upstream}\"\n"
    )
}

/// What one run of an attack did, seen from outside the server.
#[derive(Debug)]
struct Seen {
    /// Upstream connections open while the attack's streams were stalled.
    upstream_open: usize,
    /// The ordinary client's answer, asked during the stall.
    ordinary: Result<u16, String>,
    /// How the attack's streams were answered.
    statuses: BTreeMap<u16, usize>,
    /// From the attack's start until its last stream was answered or reset.
    ended_after: Duration,
}

/// 4 connections × 10 `POST` streams that declare a 1,000-byte body and send none of it.
async fn stalled_bodies(port: u16, upstream: &Holder) -> Seen {
    let started = Instant::now();
    let mut held = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (mut client, _) = h2_connect(port, None).await.unwrap();
        for _ in 0..10 {
            client = client.ready().await.unwrap();
            let mut post = request(port, "POST", "/body");
            post.headers_mut()
                .insert("content-length", http::HeaderValue::from_static("1000"));
            let (response, body) = client.send_request(post, false).unwrap();
            held.push((response, body));
        }
        clients.push(client);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let upstream_open = upstream.open();
    let ordinary = ordinary(port, "/ordinary").await;
    let mut statuses = Vec::new();
    for (response, _body) in held {
        let status = match tokio::time::timeout(Duration::from_secs(10), response).await {
            Ok(Ok(r)) => r.status().as_u16(),
            _ => 0,
        };
        statuses.push(status);
    }
    Seen {
        upstream_open,
        ordinary,
        statuses: tally(&statuses),
        ended_after: started.elapsed(),
    }
}

/// A request body that does not come holds no upstream connection: nginx reads a body
/// before it opens one, and sluice reads a body of up to 64 KiB before it forwards the
/// request. 40 stalled bodies on a budget of 20 upstream connections leave the ordinary
/// client served, and each stalled stream is answered 408 at `client_body_timeout` (2 s).
/// Before, each stalled stream took an upstream connection at once, 20 took the whole
/// budget, and the rest and the ordinary client were answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_bodies_hold_no_upstream_connection() {
    let up = Holder::start().await;
    let gw = Gateway::start(
        "h2c = true\nmax_upstream_connections = 20\nmax_upstream_per_connection = 32\n\
         client_body_timeout = \"2s\"\nsend_timeout = \"2s\"",
        &routes(up.addr),
    )
    .await;
    let sluice = stalled_bodies(gw.port, &up).await;
    drop(gw);
    let ng = Nginx::start(
        &up.addr.to_string(),
        "client_body_timeout 2s; send_timeout 2s;",
        "",
    )
    .await;
    let nginx = stalled_bodies(ng.port, &up).await;
    eprintln!("40 stalled request bodies\n  sluice: {sluice:?}\n  nginx:  {nginx:?}");
    assert_eq!(sluice.ordinary, Ok(200), "{sluice:?}");
    assert_eq!(sluice.upstream_open, 0, "{sluice:?}");
    assert_eq!(sluice.statuses.get(&408), Some(&40), "{sluice:?}");
    assert!(
        sluice.ended_after >= Duration::from_millis(1800)
            && sluice.ended_after < Duration::from_secs(6),
        "{sluice:?}"
    );
    // No worse than nginx for the ordinary client.
    assert!(
        nginx.ordinary != Ok(200) || sluice.ordinary == Ok(200),
        "{nginx:?}"
    );
}

/// 2 connections granting no stream window (SETTINGS_INITIAL_WINDOW_SIZE = 0) × 20 `GET`s of
/// a 3-byte answer, one after the other's head: the heads come, the bodies cannot.
async fn zero_window(port: u16, upstream: &Holder) -> Seen {
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..2 {
        clients.push(h2_connect(port, Some(0)).await.unwrap().0);
    }
    let mut statuses = Vec::new();
    let mut bodies = Vec::new();
    for i in 0..40 {
        let client = clients[i % 2].clone();
        let mut client = client.ready().await.unwrap();
        let (response, _) = client
            .send_request(request(port, "GET", "/small"), true)
            .unwrap();
        match tokio::time::timeout(Duration::from_secs(5), response).await {
            Ok(Ok(r)) => {
                statuses.push(r.status().as_u16());
                bodies.push(r.into_body());
            }
            _ => statuses.push(0),
        }
    }
    let upstream_open = upstream.open();
    let ordinary = ordinary(port, "/ordinary").await;
    // Every stalled body ends, one way or another, within the send timeout and a margin.
    for mut body in bodies {
        let _ = tokio::time::timeout(Duration::from_secs(8), async {
            while let Some(Ok(_)) = body.data().await {}
        })
        .await;
    }
    Seen {
        upstream_open,
        ordinary,
        statuses: tally(&statuses),
        ended_after: started.elapsed(),
    }
}

/// A small answer is read whole from the upstream before it is sent, and its upstream
/// connection is free again while the client grants no window for it, as nginx buffers
/// answers: 40 such streams, one after another, on a budget of 20 upstream connections are
/// all answered 200 and the ordinary client is served. Before, each stalled stream held its
/// upstream connection until `send_timeout`: 20 took the budget, the rest and the ordinary
/// client got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_without_window_holds_no_upstream_connection() {
    let up = Holder::start().await;
    let gw = Gateway::start(
        "h2c = true\nmax_upstream_connections = 20\nmax_upstream_per_connection = 32\n\
         send_timeout = \"2s\"",
        &routes(up.addr),
    )
    .await;
    let sluice = zero_window(gw.port, &up).await;
    let resets = common::metric(
        &gw,
        "sluice_connection_timeouts_total{timeout=\"stream_send\"}",
    )
    .await;
    drop(gw);
    let ng = Nginx::start(&up.addr.to_string(), "send_timeout 2s;", "").await;
    let nginx = zero_window(ng.port, &up).await;
    eprintln!(
        "40 streams without window\n  sluice: {sluice:?}, {resets} reset by the send clock\n  nginx:  {nginx:?}"
    );
    assert_eq!(sluice.ordinary, Ok(200), "{sluice:?}");
    assert_eq!(sluice.statuses.get(&200), Some(&40), "{sluice:?}");
    assert!(
        nginx.ordinary != Ok(200) || sluice.ordinary == Ok(200),
        "{nginx:?}"
    );
    // The streams themselves still end at send_timeout: the route's slots are not held
    // for longer.
    assert_eq!(resets, 40.0, "{sluice:?}");
    assert!(sluice.ended_after < Duration::from_secs(8), "{sluice:?}");
}

/// Connections whose client cancelled its one stream (RST_STREAM after 100 ms) and then only
/// answers pings: the cancel closes the stream's upstream connection at once, and when
/// `max_connections` are open the longest idle of them is closed (GOAWAY) to let a new client
/// in, as nginx reuses its idle connections when it runs out. Before, the idle connections
/// kept every place until `keep_alive_timeout` (30 s here) and the new client was refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_after_cancelled_streams_make_room_for_new_clients() {
    let up = Holder::start().await;
    let gw = Gateway::start(
        "h2c = true\nmax_connections = 20\nkeep_alive_timeout = \"30s\"",
        &routes(up.addr),
    )
    .await;
    let mut connections = Vec::new();
    for _ in 0..20 {
        let (mut client, task) = h2_connect(gw.port, None).await.unwrap();
        client = client.ready().await.unwrap();
        let (_response, mut stream) = client
            .send_request(request(gw.port, "GET", "/slow/10000"), true)
            .unwrap();
        connections.push((client, task));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            stream.send_reset(h2::Reason::CANCEL);
            // Held until the connection ends.
            std::future::pending::<()>().await;
        });
    }
    let mut during = 0;
    for _ in 0..50 {
        during = during.max(up.open());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after_cancel = up.open();
    let asked = Instant::now();
    let ordinary = ordinary(gw.port, "/ordinary").await;
    let took = asked.elapsed();
    // The reclaimed connection ends once its GOAWAY is through (within 3 s on a loaded machine).
    let closing = Instant::now();
    let mut closed = 0;
    while closed == 0 && closing.elapsed() < Duration::from_secs(3) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        closed = connections
            .iter()
            .filter(|(_, task)| task.is_finished())
            .count();
    }
    // And no other is closed meanwhile.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = connections
        .iter()
        .filter(|(_, task)| task.is_finished())
        .count();
    let reclaimed = common::metric(
        &gw,
        "sluice_connections_closed_early_total{reason=\"reclaimed\"}",
    )
    .await;
    eprintln!(
        "20 connections with a cancelled stream each, max_connections = 20: {during} upstream \
         connections while the streams were open, {after_cancel} after the cancels; a new client: \
         {ordinary:?} after {took:?}; {closed} idle connections closed ({reclaimed} counted)"
    );
    assert_eq!(after_cancel, 0);
    assert_eq!(ordinary, Ok(200));
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(closed, 1);
    assert_eq!(reclaimed, 1.0);
}
