//! The main listener: accept, serve HTTP/1.1 and HTTP/2 with hyper (over TLS with
//! `[server.tls]`, the protocol chosen by ALPN; in plain text, HTTP/2 with prior knowledge
//! beside HTTP/1.1 unless `server.h2c = false`), hand each request to the
//! [`Gateway`](sluice_http::Gateway) in force, log it; drain on shutdown.
//!
//! The browser paths of `[browser]` (the assets under `/sluice/`, `POST /v1/telemetry`) are
//! answered in [`handle`] by [`Browser`](crate::browser::Browser), before the route table.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use http::header::HeaderValue;
use http::{Method, Request, Response, StatusCode, Version};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use sluice_http::body::Body;
use sluice_http::gateway::Outcome;
use sluice_http::proxy::{Proxy, UpstreamShare};
use sluice_http::route::Route;
use sluice_http::tunnel::Hold;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::ServerConfig;
use crate::runtime::state::Shared;
use crate::serve::byte_path::{self, Connection, Left, Prefixed};
use crate::serve::capacity::Counted;
use crate::serve::conn::{EdgeIo, Ending, Exchange, Http1Only, Timeouts};
use crate::serve::ids::{request_id, trace_id};
use crate::serve::stall::{self, EdgeExecutor};

pub use sluice_http::h1::X_REQUEST_ID;

/// Gives the connection metrics their help text.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        "sluice_connections_open",
        metrics::Unit::Count,
        "Client connections open on the main listener now."
    );
    metrics::describe_gauge!(
        "sluice_upstream_pool_idle",
        metrics::Unit::Count,
        "Idle upstream connections pooled by a gateway worker (`worker`), as of its last sweep (every second)."
    );
    metrics::describe_counter!(
        "sluice_connections_refused_total",
        metrics::Unit::Count,
        "Client connections closed as soon as they were accepted, because server.max_connections were open."
    );
}

/// The gateway's worker threads: each runs its own single-threaded event loop with its own
/// listening socket (`SO_REUSEPORT`, so the kernel spreads connections) and its own upstream
/// connection pool, as nginx's workers do. A request never changes thread, and nothing on
/// its path is shared with the other workers but the policies' buckets.
#[derive(Debug)]
pub struct Workers {
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Workers {
    /// Binds `server.workers` sockets to `server.listen` and starts a thread on each. The
    /// threads stop accepting when `stop` turns true (their sockets close, so new
    /// connections are refused), drain their connections for at most
    /// `server.shutdown_timeout`, and end.
    ///
    /// # Errors
    ///
    /// When the address cannot be bound or a thread cannot start.
    pub fn start(
        server: &ServerConfig,
        shared: &'static Shared,
        stop: &watch::Receiver<bool>,
    ) -> std::io::Result<Workers> {
        let mut listeners = Vec::with_capacity(server.workers);
        let mut addr = server.listen;
        for _ in 0..server.workers.max(1) {
            let listener = reuseport_listener(addr)?;
            // With port 0, every socket joins the port the first one got.
            addr = listener.local_addr()?;
            listeners.push(listener);
        }
        let mut threads = Vec::with_capacity(listeners.len());
        for (i, listener) in listeners.into_iter().enumerate() {
            let server = server.clone();
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("sluice-worker-{i}"))
                .spawn(move || {
                    let runtime = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            tracing::error!(error = %e, "worker runtime failed to start");
                            return;
                        }
                    };
                    runtime.block_on(worker(i, listener, shared, server, stop));
                })?;
            threads.push(thread);
        }
        Ok(Workers { threads })
    }

    /// Waits for every worker to finish draining.
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

fn reuseport_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

async fn worker(
    index: usize,
    listener: std::net::TcpListener,
    shared: &'static Shared,
    server: ServerConfig,
    stop: watch::Receiver<bool>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(error = %e, "worker could not register its socket");
            return;
        }
    };
    // One pool per worker for the life of the process: requests borrow it, reloads keep it.
    let proxy: &'static Proxy = Box::leak(Box::new(Proxy::new()));
    proxy.set_timeouts(
        server.upstream_connect_timeout,
        server.upstream_idle_timeout,
    );
    // Pooled connections idle for longer than upstream_idle_timeout are closed within a
    // second of it (none is used past it: the pool checks at checkout too).
    let pooled = metrics::gauge!("sluice_upstream_pool_idle", "worker" => index.to_string());
    let upstream_open = metrics::gauge!("sluice_upstream_connections_open");
    let sweeper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            pooled.set(proxy.close_idle() as f64);
            upstream_open.set(sluice_http::proxy::upstream_open() as f64);
        }
    });
    let alive = accept_loop(listener, shared, &server, stop, proxy).await;
    sweeper.abort();
    // The configuration in force at the signal: a reload may have changed it.
    let shutdown_timeout = shared.current().config.server.shutdown_timeout;
    if tokio::time::timeout(shutdown_timeout, alive.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            timeout = ?shutdown_timeout,
            "shutdown timeout: dropping the requests still in flight"
        );
    }
}

/// The most streams an HTTP/2 client may have open at once on one connection (nginx's
/// `http2_max_concurrent_streams`).
pub const H2_MAX_CONCURRENT_STREAMS: u32 = 128;

/// How often an HTTP/2 connection with requests in flight is pinged, and how long the answer
/// may take before the connection is closed (a peer gone without a FIN).
const H2_PING_INTERVAL: Duration = Duration::from_secs(30);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(20);

/// hyper's connection builders for one setting of `max_header_bytes`.
///
/// HTTP/1.1 is hyper's own server rather than hyper-util's `auto` one: `auto` looks for the
/// HTTP/2 preface at the start of every connection it is given, whatever it was told, so a
/// connection the byte path hands over after its first requests would switch to HTTP/2 on a
/// preface mid-connection (RFC 9113 §3.4 allows it at the start only; hyper's HTTP/1.1
/// refuses it); and `auto` does not set `max_header_size`. Which protocol a connection speaks
/// is decided before: by ALPN, by `h2c` and the connection's first bytes
/// ([`Prefixed::opens_with_preface`]).
struct Protocols {
    /// HTTP/1.1, upgrades included.
    http1: http1::Builder,
    /// HTTP/2 (TLS with ALPN `h2`, or plain text with prior knowledge).
    http2: auto::Builder<EdgeExecutor>,
}

impl Protocols {
    fn new(max_header_bytes: usize) -> Protocols {
        let mut http1 = http1::Builder::new();
        // hyper's HTTP/1 header timer also runs while a connection waits for its next
        // request, so the header and keep-alive timeouts are kept by the socket wrapper
        // (`conn::EdgeIo`): no timer is given to HTTP/1.
        // `max_header_size` bounds every head, a connection's later ones too; `max_buf_size`
        // alone bounds what the read buffer holds of one still partial, and a whole later
        // head read at once into a buffer grown past it went through.
        http1
            .max_buf_size(max_header_bytes)
            .max_header_size(max_header_bytes)
            .keep_alive(true);
        let mut builder = auto::Builder::new(EdgeExecutor);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(H2_MAX_CONCURRENT_STREAMS)
            // RFC 8441: WebSocket over HTTP/2 streams (extended CONNECT).
            .enable_connect_protocol()
            .max_header_list_size(u32::try_from(max_header_bytes).unwrap_or(u32::MAX))
            .keep_alive_interval(H2_PING_INTERVAL)
            .keep_alive_timeout(H2_PING_TIMEOUT);
        Protocols {
            http1,
            http2: builder.http2_only(),
        }
    }
}

/// How the listener speaks, from the configuration in force when a connection is accepted.
enum Listening {
    /// Plain text: HTTP/1.1, and HTTP/2 with prior knowledge when `h2c`.
    Plain { h2c: bool },
    /// TLS with this certificate; ALPN picks HTTP/2 or HTTP/1.1.
    Tls(tokio_rustls::TlsAcceptor),
}

/// Serves one connection until it ends: closes it gracefully (HTTP/1.1: after the response
/// in flight; HTTP/2: `GOAWAY`, then the open streams finish) when `stop` turns true or the
/// connection has had its share ([`Exchange::drained`]).
async fn drive<C, E>(
    connection: C,
    close_gracefully: impl Fn(Pin<&mut C>),
    exchange: &Exchange,
    mut stop: watch::Receiver<bool>,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            served = connection.as_mut() => return served,
            _ = exchange.drained(), if !closing => {
                closing = true;
                close_gracefully(connection.as_mut());
            }
            _ = stop.wait_for(|s| *s), if !closing => {
                closing = true;
                close_gracefully(connection.as_mut());
            }
        }
    }
}

/// Accepts connections on `listener` until `stop` turns true, then stops accepting (the
/// listener is closed, so new connections are refused) and returns a sender whose
/// receivers are the connections in flight: `closed()` resolves once they have all ended.
async fn accept_loop(
    listener: TcpListener,
    shared: &'static Shared,
    server: &ServerConfig,
    mut stop: watch::Receiver<bool>,
    proxy: &'static Proxy,
) -> watch::Sender<()> {
    let (alive, _) = watch::channel(());
    let mut max_header_bytes = server.max_header_bytes;
    let mut protocols = Arc::new(Protocols::new(max_header_bytes));
    let mut upstream_timeouts = (
        server.upstream_connect_timeout,
        server.upstream_idle_timeout,
    );
    let open = metrics::gauge!("sluice_connections_open");
    let refused = metrics::counter!("sluice_connections_refused_total");
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // New connections follow the limits of the configuration in force.
        let (
            current,
            max_connections,
            upstream,
            timeouts,
            listening,
            max_requests,
            shares,
            byte_path,
        ) = {
            let runtime = shared.current();
            let server = &runtime.config.server;
            let listening = match &server.tls {
                Some(tls) => {
                    Listening::Tls(tokio_rustls::TlsAcceptor::from(Arc::clone(&tls.config)))
                }
                None => Listening::Plain { h2c: server.h2c },
            };
            (
                server.max_header_bytes,
                server.max_connections,
                (
                    server.upstream_connect_timeout,
                    server.upstream_idle_timeout,
                ),
                Timeouts {
                    header: server.header_read_timeout,
                    keep_alive: server.keep_alive_timeout,
                    send: server.send_timeout,
                },
                listening,
                server.max_requests_per_connection,
                server.max_upstream_per_connection,
                server.byte_path,
            )
        };
        if upstream != upstream_timeouts {
            upstream_timeouts = upstream;
            proxy.set_timeouts(upstream.0, upstream.1);
        }
        let exchange = Arc::new(Exchange::new(max_requests));
        let Some(counted) = Counted::admit(max_connections, &open, &exchange) else {
            // Closed at once: its descriptor is back before the next accept.
            refused.increment(1);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        if current != max_header_bytes {
            max_header_bytes = current;
            protocols = Arc::new(Protocols::new(max_header_bytes));
        }
        let for_task = Arc::clone(&exchange);
        let send_timeout = timeouts.send;
        // The connection's shares of the upstream sockets, made at its first HTTP/2 request.
        let share = std::sync::OnceLock::new();
        let io = EdgeIo::new(stream, Arc::clone(&exchange), timeouts);
        // Held by the connection's task and by every tunnel it hands over: an upgraded
        // socket is still one of `max_connections` until its tunnel closes.
        let counted = Arc::new(counted);
        let for_tunnels = Arc::clone(&counted);
        let service = service_fn(move |mut req: Request<Incoming>| {
            // Over when its response body is dropped, or with this future if the client
            // cancels the request before a response (an HTTP/2 stream reset).
            let request = exchange.start();
            let mut clock = None;
            let multiplexed = req.version() == Version::HTTP_2;
            if multiplexed {
                exchange.multiplexed();
                clock = Some(stall::clock_for_next_stream(send_timeout));
                let share = share.get_or_init(|| UpstreamShare::new(shares));
                req.extensions_mut().insert(UpstreamShare::clone(share));
                if req.method() == Method::CONNECT {
                    // A stream that may become a WebSocket tunnel (RFC 8441) keeps the
                    // connection busy until the tunnel closes, not only until its `200`.
                    let held = (exchange.hold(), Arc::clone(&for_tunnels));
                    req.extensions_mut().insert(Hold::new(held));
                }
            } else if req.headers().contains_key(http::header::UPGRADE) {
                // The socket itself may become a tunnel: it stays counted while it is one.
                req.extensions_mut()
                    .insert(Hold::new(Arc::clone(&for_tunnels)));
            }
            async move {
                if multiplexed {
                    // Let the stream's task look for a reset first: a stream the client
                    // cancelled in the same breath as it opened it (Rapid Reset) ends here,
                    // before it costs a decision or an upstream connection.
                    tokio::task::yield_now().await;
                }
                let response = handle(shared, proxy, req, peer).await;
                if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                    // An upgrade: the connection becomes a tunnel, with its own idle limit.
                    request.tunnel();
                }
                Ok::<_, Infallible>(response.map(|body| Ending::new(body, request, clock)))
            }
        });
        // Taken now, so that a shutdown signalled while the connection starts (its TLS
        // handshake) still reaches it.
        let (stop, alive) = (stop.clone(), alive.subscribe());
        let protocols = Arc::clone(&protocols);
        // One task type per transport: a plain connection's task holds no TLS state.
        match listening {
            Listening::Plain { h2c } => {
                tokio::spawn(async move {
                    let (mut io, mut stop) = (io, stop);
                    let conn = Connection {
                        peer,
                        shared,
                        proxy,
                        exchange: &for_task,
                        stop: &mut stop,
                        max_head: current,
                    };
                    let Some((read, fresh)) = bytes_first(byte_path, &mut io, conn).await else {
                        drop((counted, alive));
                        return;
                    };
                    let mut io = Prefixed::new(read, io);
                    let served = if h2c && fresh && io.opens_with_preface().await {
                        let connection =
                            protocols.http2.serve_connection(TokioIo::new(io), service);
                        drive(connection, |c| c.graceful_shutdown(), &for_task, stop).await
                    } else if h2c || !fresh {
                        let connection = protocols
                            .http1
                            .serve_connection(TokioIo::new(io), service)
                            .with_upgrades();
                        drive(connection, |c| c.graceful_shutdown(), &for_task, stop)
                            .await
                            .map_err(Into::into)
                    } else {
                        // A connection that opens with the preface where HTTP/2 is off is
                        // closed (`Http1Only`); later, hyper's HTTP/1.1 answers it 400.
                        let connection = protocols
                            .http1
                            .serve_connection(TokioIo::new(Http1Only::new(io)), service)
                            .with_upgrades();
                        drive(connection, |c| c.graceful_shutdown(), &for_task, stop)
                            .await
                            .map_err(Into::into)
                    };
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    drop((counted, alive));
                });
            }
            Listening::Tls(acceptor) => {
                tokio::spawn(async move {
                    // The handshake reads through EdgeIo in its first phase, so it is bounded
                    // by header_read_timeout (from the accept) like a first request head.
                    let stream = match acceptor.accept(io).await {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::debug!(error = %e, %peer, "TLS handshake failed");
                            drop((counted, alive));
                            return;
                        }
                    };
                    let mut stop = stop;
                    let served = if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
                        let connection = protocols
                            .http2
                            .serve_connection(TokioIo::new(stream), service);
                        drive(connection, |c| c.graceful_shutdown(), &for_task, stop).await
                    } else {
                        let mut stream = stream;
                        let conn = Connection {
                            peer,
                            shared,
                            proxy,
                            exchange: &for_task,
                            stop: &mut stop,
                            max_head: current,
                        };
                        let Some((read, fresh)) = bytes_first(byte_path, &mut stream, conn).await
                        else {
                            drop((counted, alive));
                            return;
                        };
                        let io = Prefixed::new(read, stream);
                        let served = if fresh {
                            let connection = protocols
                                .http1
                                .serve_connection(TokioIo::new(Http1Only::new(io)), service)
                                .with_upgrades();
                            drive(connection, |c| c.graceful_shutdown(), &for_task, stop).await
                        } else {
                            let connection = protocols
                                .http1
                                .serve_connection(TokioIo::new(io), service)
                                .with_upgrades();
                            drive(connection, |c| c.graceful_shutdown(), &for_task, stop).await
                        };
                        served.map_err(Into::into)
                    };
                    if let Err(e) = served {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                    drop((counted, alive));
                });
            }
        }
    }
    drop(listener);
    alive
}

/// Serves an HTTP/1.1 connection's plain requests on the byte path when `on`; then what
/// hyper must read first when it takes over, and whether the connection is still at its
/// start (no request served), or `None` when the connection is over.
async fn bytes_first<C>(on: bool, io: &mut C, conn: Connection<'_>) -> Option<(BytesMut, bool)>
where
    C: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    if !on {
        return Some((BytesMut::new(), true));
    }
    match byte_path::serve(io, conn).await {
        Left::Closed => None,
        Left::Handover { read, fresh } => Some((read, fresh)),
    }
}

/// One request on the main listener.
pub async fn handle(
    shared: &Shared,
    proxy: &Proxy,
    mut req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let started = Instant::now();
    let runtime = shared.current();
    let ids = runtime.config.server.request_id;
    let log = tracing::enabled!(target: "sluice::access", tracing::Level::INFO);
    if let Some(browser) = runtime.browser.as_ref() {
        if browser.owns(req.uri().path()) {
            // These answers never go upstream: with `request_id = false` they carry no id.
            let id = ids.then(|| request_id(shared, &mut req));
            return browser.handle(req, peer, id, started).await;
        }
    }
    let (id, head) = identify(shared, &mut req, ids, log);
    // `[telemetry]`: one check per request; nothing is built without it.
    let span = shared.spans.as_ref().map(|spans| {
        (
            spans,
            spans.start_request(req.method(), req.uri().path(), req.headers()),
        )
    });
    let handled = runtime.gateway.handle(proxy, req, peer).await;
    let mut response = handled.response;
    if let Some((spans, started)) = span {
        spans.finish_request(
            started,
            response.status().as_u16(),
            handled.route.map(|r| r.path_prefix()),
            &handled.outcome,
        );
    }
    if let (true, Some(id)) = (ids, id.as_ref()) {
        response
            .headers_mut()
            .insert(X_REQUEST_ID.clone(), id.clone());
    }
    if let Some((method, path, trace)) = head {
        access_log(
            id.as_ref(),
            handled.client_ip,
            &method,
            &path,
            handled.route,
            response.status(),
            &handled.outcome,
            trace.as_ref(),
            started.elapsed(),
        );
    }
    response
}

/// What the access log line of a request names from its head: method, path, trace id.
pub(super) type Logged = (Method, String, Option<HeaderValue>);

/// The request's id (see [`request_id`]) when the server makes or echoes ids (`ids`),
/// otherwise the client's own when the access log wants it; and, when it does (`log`), what
/// its line names from the head. With `request_id = false` a client's id is passed on
/// untouched (and logged), and none is made up or echoed.
pub(super) fn identify<B>(
    shared: &Shared,
    req: &mut Request<B>,
    ids: bool,
    log: bool,
) -> (Option<HeaderValue>, Option<Logged>) {
    let id = if ids {
        Some(request_id(shared, req))
    } else if log {
        req.headers().get(&X_REQUEST_ID).cloned()
    } else {
        None
    };
    let logged = log.then(|| {
        (
            req.method().clone(),
            req.uri().path().to_owned(),
            trace_id(req.headers()),
        )
    });
    (id, logged)
}

/// The `sluice::access` line of one request on the main listener. `took` is its `ms`: from
/// the request's head, read, to its answer's head, ready to be sent (the decision, any wait
/// in a queue, the upstream's time to its head; not the body's transfer, which may go on
/// after the line, and may fail; an answer of up to 64 KiB to an HTTP/2 stream, read whole
/// before it is sent, to its end). Both paths write the line of every request that reached a
/// decision, with the status sent.
#[allow(clippy::too_many_arguments)]
pub(super) fn access_log(
    id: Option<&HeaderValue>,
    client: IpAddr,
    method: &Method,
    path: &str,
    route: Option<&Route>,
    status: StatusCode,
    outcome: &Outcome<'_>,
    trace: Option<&HeaderValue>,
    took: Duration,
) {
    let (policy, reason) = match outcome {
        Outcome::Denied { policy, reason } | Outcome::ShadowDenied { policy, reason } => {
            (Some(*policy), Some(reason.as_str()))
        }
        _ => (None, None),
    };
    tracing::info!(
        target: "sluice::access",
        request_id = id.and_then(|id| id.to_str().ok()).unwrap_or(""),
        client = %client,
        method = %method,
        path = %path,
        route = route.map(|r| r.path_prefix()),
        status = status.as_u16(),
        decision = %outcome,
        policy,
        reason,
        trace_id = trace.and_then(|t| t.to_str().ok()),
        ms = %format_args!("{:.3}", took.as_secs_f64() * 1e3),
    );
}
