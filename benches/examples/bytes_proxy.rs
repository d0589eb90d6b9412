//! A prototype measured by `scripts/bench-gateway.sh`: the gateway's HTTP/1.1 path as it
//! would run if request and response heads were forwarded as bytes. Heads are read with
//! `sluice_http::wire` (httparse, with hyper's framing rules); the client's header block goes
//! upstream as it came, with only the fields a gateway changes spliced in or out; anything
//! `wire` does not call plain (and HTTP/1.0) is handed, with the rest of its connection, to
//! hyper. Not part of the product: it answers what the byte path would be worth.
//!
//! Per request it does the work of the gateway's `request_id = false` run: a GCRA check per
//! client address (sluice's `Keyed`), `X-Forwarded-For` appended, hop-by-hop fields dropped
//! both ways, `RateLimit-Policy` and `RateLimit` on the answer, and a `429` problem answer
//! with `Retry-After` when denied. Thread per core as the gateway: each worker has its own
//! current-thread runtime, `SO_REUSEPORT` listener and upstream connections.
//!
//! ```text
//! cargo run --release -p sluice-benches --example bytes_proxy -- 127.0.0.1:8090 127.0.0.1:9000 [WORKERS] [open|shut]
//! ```

use std::cell::RefCell;
use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::Keyed;
use sluice_core::{Gcra, Quota, Rate};
use sluice_http::wire::{self, Chunks, Field, Framing, Step};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// The gateway's default `max_header_bytes`.
const MAX_HEAD: usize = 16 * 1024;
/// hyper's client default for a response head.
const MAX_RESPONSE_HEAD: usize = 400 * 1024;

type Limit = Keyed<IpAddr, Gcra>;

struct Worker {
    limit: Arc<Limit>,
    /// `"name";q=N;w=S`, the policy's `RateLimit-Policy`.
    policy: String,
    upstream: SocketAddr,
    idle: RefCell<Vec<Upstream>>,
    fallback: Client<HttpConnector, Incoming>,
}

/// A pooled upstream connection and the bytes read from it but not yet used.
struct Upstream {
    stream: TcpStream,
    buf: Vec<u8>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bytes_proxy LISTEN_ADDR UPSTREAM_ADDR [WORKERS] [open|shut]";
    let listen: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let upstream: SocketAddr = args.next().ok_or(usage)?.parse()?;
    let workers: usize = args.next().map_or(Ok(2), |w| w.parse())?;
    let (quota, policy) = match args.next().as_deref() {
        None | Some("open") => (
            Quota::new(1_000_000, Rate::from_interval_ns(1_000)?)?,
            "\"open\";q=1000000;w=1",
        ),
        Some("shut") => (
            Quota::new(1, Rate::from_interval_ns(3_600_000_000_000)?)?,
            "\"shut\";q=1;w=3600",
        ),
        Some(other) => return Err(format!("{usage}: not a policy: {other}").into()),
    };
    let limit: Arc<Limit> = Arc::new(Keyed::builder(Gcra::new(quota)).build());
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let listener = reuseport_listener(listen)?;
            let limit = Arc::clone(&limit);
            let policy = policy.to_owned();
            Ok(std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    let mut connector = HttpConnector::new();
                    connector.set_nodelay(true);
                    let worker = Rc::new(Worker {
                        limit,
                        policy,
                        upstream,
                        idle: RefCell::new(Vec::new()),
                        fallback: Client::builder(TokioExecutor::new()).build(connector),
                    });
                    let listener = TcpListener::from_std(listener).expect("a tokio listener");
                    loop {
                        let Ok((stream, peer)) = listener.accept().await else {
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let worker = Rc::clone(&worker);
                        tokio::task::spawn_local(async move {
                            let _ = serve(stream, peer.ip().to_canonical(), worker).await;
                        });
                    }
                })
            }))
        })
        .collect::<io::Result<_>>()?;
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

fn reuseport_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    socket.set_nonblocking(true)?;
    Ok(socket.into())
}

async fn read_more<R: AsyncRead + Unpin>(from: &mut R, buf: &mut Vec<u8>) -> io::Result<usize> {
    buf.reserve(8192);
    from.read_buf(buf).await
}

/// Serves one client connection.
async fn serve(mut client: TcpStream, peer: IpAddr, worker: Rc<Worker>) -> io::Result<()> {
    let mut buf: Vec<u8> = Vec::with_capacity(8192);
    let mut out: Vec<u8> = Vec::with_capacity(8192);
    // The peer's address as `X-Forwarded-For` writes it: once per connection.
    let peer_text = peer.to_string();
    loop {
        let head = loop {
            if !buf.is_empty() {
                match wire::Request::parse(&buf, MAX_HEAD) {
                    wire::Request::Plain(head) if !head.http10 => break head,
                    wire::Request::Partial => {}
                    _ => return hand_to_hyper(client, buf, peer, worker).await,
                }
            }
            if read_more(&mut client, &mut buf).await? == 0 {
                return Ok(());
            }
        };
        let keep_alive = head.keep_alive;
        out.clear();
        match worker.limit.try_acquire(&peer, 1) {
            Ok(decision) => {
                forward(
                    &mut client,
                    &mut buf,
                    &head,
                    peer_text.as_bytes(),
                    &worker,
                    &mut out,
                    decision,
                )
                .await?
            }
            Err(sluice::Error::Limited { decision, .. }) => {
                deny(&mut client, &mut buf, &head, &worker, &mut out, decision).await?
            }
            Err(e) => return Err(io::Error::other(e.to_string())),
        }
        if !keep_alive {
            return client.shutdown().await;
        }
    }
}

/// Whether `name` is hop-by-hop, or listed by one of the `Connection` values in `listed`.
fn hop_by_hop(name: &[u8], listed: &[&[u8]]) -> bool {
    let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
    is("connection")
        || is("keep-alive")
        || is("te")
        || is("trailer")
        || is("transfer-encoding")
        || is("upgrade")
        || (name.len() > 6 && name[..6].eq_ignore_ascii_case(b"proxy-"))
        || listed.iter().any(|value| {
            value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(name))
        })
}

fn connection_values<'a>(buf: &'a [u8], fields: &[Field]) -> Vec<&'a [u8]> {
    fields
        .iter()
        .filter(|f| buf[f.name.clone()].eq_ignore_ascii_case(b"connection"))
        .map(|f| &buf[f.value.clone()])
        .collect()
}

fn rate_limit_fields(out: &mut Vec<u8>, worker: &Worker, decision: &sluice_core::Decision) {
    let mut n = itoa::Buffer::new();
    out.extend_from_slice(b"ratelimit-policy: ");
    out.extend_from_slice(worker.policy.as_bytes());
    let name_end = worker.policy.find(';').unwrap_or(worker.policy.len());
    out.extend_from_slice(b"\r\nratelimit: ");
    out.extend_from_slice(&worker.policy.as_bytes()[..name_end]);
    out.extend_from_slice(b";r=");
    out.extend_from_slice(n.format(decision.remaining).as_bytes());
    out.extend_from_slice(b";t=");
    out.extend_from_slice(n.format(decision.reset_after_secs_ceil()).as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Answers `429` and skips the request's body.
async fn deny(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &wire::RequestHead,
    worker: &Worker,
    out: &mut Vec<u8>,
    decision: sluice_core::Decision,
) -> io::Result<()> {
    let mut n = itoa::Buffer::new();
    let retry_ms = decision.retry_after_ms_ceil();
    let body = format!(
        "{{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,\"detail\":\"the rate limit of this policy is exhausted\",\"policy\":\"{}\",\"reason\":\"limit\",\"retry_after_ms\":{retry_ms}}}\n",
        worker.policy.split(';').next().unwrap_or("").trim_matches('"')
    );
    out.extend_from_slice(b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/problem+json\r\nretry-after: ");
    out.extend_from_slice(n.format(decision.retry_after_secs_ceil()).as_bytes());
    out.extend_from_slice(b"\r\n");
    rate_limit_fields(out, worker, &decision);
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(n.format(body.len()).as_bytes());
    if !head.keep_alive {
        out.extend_from_slice(b"\r\nconnection: close");
    }
    out.extend_from_slice(b"\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    let mut left = match head.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let here = (buf.len() - head.len).min(usize::try_from(left).unwrap_or(usize::MAX));
    buf.drain(..head.len + here);
    left -= here as u64;
    while left > 0 {
        if read_more(client, buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        buf.drain(..n);
        left -= n as u64;
    }
    client.write_all(out).await
}

/// Forwards an admitted request and passes its answer back.
async fn forward(
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    head: &wire::RequestHead,
    peer: &[u8],
    worker: &Worker,
    out: &mut Vec<u8>,
    decision: sluice_core::Decision,
) -> io::Result<()> {
    // The upstream head: the client's request line and fields, less the hop-by-hop ones, with
    // the peer at the end of one `X-Forwarded-For`.
    let listed = connection_values(buf, &head.fields);
    out.extend_from_slice(&buf[head.method.clone()]);
    out.push(b' ');
    out.extend_from_slice(&buf[head.target.clone()]);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut forwarded: Vec<&[u8]> = Vec::new();
    for f in &head.fields {
        let name = &buf[f.name.clone()];
        if hop_by_hop(name, &listed) {
            continue;
        }
        if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            forwarded.push(&buf[f.value.clone()]);
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(&buf[f.value.clone()]);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    for v in forwarded.iter().filter(|v| !v.trim_ascii().is_empty()) {
        out.extend_from_slice(v.trim_ascii());
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(peer);
    out.extend_from_slice(b"\r\n\r\n");
    let mut left = match head.framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let here = (buf.len() - head.len).min(usize::try_from(left).unwrap_or(usize::MAX));
    out.extend_from_slice(&buf[head.len..head.len + here]);
    buf.drain(..head.len + here);
    left -= here as u64;
    let is_head = out.starts_with(b"HEAD ");

    // A pooled connection the upstream closed meanwhile fails before any answer: the request
    // (whole in `out` when it had no more body to read) goes again on a new one.
    let mut pooled = worker.idle.borrow_mut().pop();
    let (mut up, answer) = loop {
        let again = pooled.is_some() && left == 0;
        let mut up = match pooled.take() {
            Some(up) => up,
            None => match connect(worker).await {
                Ok(up) => up,
                Err(_) => return bad_gateway(client, out).await,
            },
        };
        if send(&mut up, out, client, left).await.is_err() {
            if again {
                continue;
            }
            return bad_gateway(client, out).await;
        }
        match read_answer(&mut up, is_head).await {
            Ok(Some(answer)) => break (up, answer),
            Ok(None) if again && up.buf.is_empty() => continue,
            Err(_) if again && up.buf.is_empty() => continue,
            _ => return bad_gateway(client, out).await,
        }
    };

    // The client's head: the upstream's status line and fields, less the hop-by-hop ones, and
    // the policy's fields.
    out.clear();
    let line_end = memchr::memchr(b'\n', &up.buf).unwrap_or(0);
    let status_line = up.buf[..line_end].trim_ascii_end();
    out.extend_from_slice(b"HTTP/1.1");
    out.extend_from_slice(&status_line[8.min(status_line.len())..]);
    out.extend_from_slice(b"\r\n");
    let listed = connection_values(&up.buf, &answer.fields);
    for f in &answer.fields {
        let name = &up.buf[f.name.clone()];
        if hop_by_hop(name, &listed) {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(&up.buf[f.value.clone()]);
        out.extend_from_slice(b"\r\n");
    }
    rate_limit_fields(out, worker, &decision);
    match answer.framing {
        Framing::Chunked | Framing::UntilClose => {
            out.extend_from_slice(b"transfer-encoding: chunked\r\n")
        }
        _ => {}
    }
    if !head.keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    up.buf.drain(..answer.len);

    let complete = match answer.framing {
        Framing::Empty => true,
        Framing::Length(n) => {
            let mut left = n;
            loop {
                let k = up
                    .buf
                    .len()
                    .min(usize::try_from(left).unwrap_or(usize::MAX));
                out.extend_from_slice(&up.buf[..k]);
                up.buf.drain(..k);
                left -= k as u64;
                if left == 0 {
                    break true;
                }
                client.write_all(out).await?;
                out.clear();
                if read_more(&mut up.stream, &mut up.buf).await? == 0 {
                    break false;
                }
            }
        }
        Framing::Chunked => {
            let mut chunks = Chunks::Size;
            loop {
                match chunks.advance(&up.buf) {
                    Step::Take(k) => {
                        out.extend_from_slice(&up.buf[..k]);
                        up.buf.drain(..k);
                        if chunks == Chunks::Done {
                            break true;
                        }
                    }
                    Step::More => {
                        if out.len() >= 16 * 1024 {
                            client.write_all(out).await?;
                            out.clear();
                        }
                        if read_more(&mut up.stream, &mut up.buf).await? == 0 {
                            break false;
                        }
                    }
                    Step::Broken => break false,
                }
            }
        }
        Framing::UntilClose => {
            loop {
                if !up.buf.is_empty() {
                    out.extend_from_slice(format!("{:x}\r\n", up.buf.len()).as_bytes());
                    out.extend_from_slice(&up.buf);
                    out.extend_from_slice(b"\r\n");
                    up.buf.clear();
                }
                client.write_all(out).await?;
                out.clear();
                if read_more(&mut up.stream, &mut up.buf).await? == 0 {
                    break;
                }
            }
            out.extend_from_slice(b"0\r\n\r\n");
            false
        }
    };
    client.write_all(out).await?;
    if !complete && answer.framing != Framing::UntilClose {
        // The client cannot tell the answer was cut short otherwise.
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    if complete && answer.keep_alive && up.buf.is_empty() {
        worker.idle.borrow_mut().push(up);
    }
    Ok(())
}

/// Reads the final response head: `None` when the upstream closed, or sent what hyper's client
/// would refuse, first.
async fn read_answer(up: &mut Upstream, is_head: bool) -> io::Result<Option<wire::ResponseHead>> {
    loop {
        match wire::Response::parse(&up.buf, is_head, MAX_RESPONSE_HEAD) {
            wire::Response::Final(h) => return Ok(Some(h)),
            wire::Response::Informational(len) => {
                up.buf.drain(..len);
            }
            wire::Response::Partial => {
                if read_more(&mut up.stream, &mut up.buf).await? == 0 {
                    return Ok(None);
                }
            }
            wire::Response::Refused => return Ok(None),
        }
    }
}

/// Writes the request head (and what body came with it), then the `left` body bytes still
/// to read from the client.
async fn send(
    up: &mut Upstream,
    out: &[u8],
    client: &mut TcpStream,
    mut left: u64,
) -> io::Result<()> {
    up.stream.write_all(out).await?;
    let mut chunk = vec![0; 16 * 1024];
    while left > 0 {
        let want = chunk.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = client.read(&mut chunk[..want]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        up.stream.write_all(&chunk[..n]).await?;
        left -= n as u64;
    }
    Ok(())
}

async fn connect(worker: &Worker) -> io::Result<Upstream> {
    let stream = TcpStream::connect(worker.upstream).await?;
    let _ = stream.set_nodelay(true);
    Ok(Upstream {
        stream,
        buf: Vec::with_capacity(8192),
    })
}

async fn bad_gateway(client: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    out.clear();
    out.extend_from_slice(
        b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
    );
    client.write_all(out).await?;
    Err(io::ErrorKind::ConnectionAborted.into())
}

/// A connection whose first bytes were already read: they are read again first.
struct Prefixed {
    prefix: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = buf.remaining().min(self.prefix.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

/// The rest of the connection, from the request `wire` did not call plain, served by hyper.
async fn hand_to_hyper(
    client: TcpStream,
    read: Vec<u8>,
    peer: IpAddr,
    worker: Rc<Worker>,
) -> io::Result<()> {
    let io = Prefixed {
        prefix: read,
        at: 0,
        inner: client,
    };
    let service = service_fn(move |req| {
        let worker = Rc::clone(&worker);
        async move { Ok::<_, Infallible>(through_hyper(&worker, peer, req).await) }
    });
    hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades()
        .await
        .map_err(io::Error::other)
}

async fn through_hyper(
    worker: &Worker,
    peer: IpAddr,
    mut req: Request<Incoming>,
) -> Response<Body> {
    if worker.limit.try_acquire(&peer, 1).is_err() {
        return status(StatusCode::TOO_MANY_REQUESTS);
    }
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("http://{}{path}", worker.upstream).parse::<Uri>() else {
        return status(StatusCode::BAD_REQUEST);
    };
    *req.uri_mut() = uri;
    sluice_http::proxy::remove_hop_by_hop(req.headers_mut());
    sluice_http::proxy::append_forwarded_for(req.headers_mut(), peer);
    match worker.fallback.request(req).await {
        Ok(mut response) => {
            sluice_http::proxy::remove_hop_by_hop(response.headers_mut());
            response.map(BodyExt::boxed)
        }
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::new()).map_err(|e| match e {}).boxed());
    *response.status_mut() = code;
    response
}
