//! A benchmark prototype: an HTTP/1.1 reverse proxy on pingora that does the per-request work of
//! a limiter gateway (a per-client-IP GCRA check with sluice-core, `X-Forwarded-For`, `Host`).
//!
//! `pingora-proto --listen 127.0.0.1:PORT --upstream 127.0.0.1:UPORT [--threads N]
//!  [--burst N] [--rate TEXT]` (the limit defaults to 10^9 per second, burst 10^9).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::hash::{BuildHasher, RandomState};
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use http::header::{HeaderValue, CONTENT_LENGTH, HOST, RETRY_AFTER};
use http::HeaderName;
use pingora_core::prelude::{HttpPeer, Result, Server};
use pingora_core::server::configuration::ServerConf;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{http_proxy_service, ProxyHttp, Session};
use sluice_core::{Algorithm, Gcra, Quota};

const SHARDS: usize = 16;
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Per-client-IP GCRA state (the theoretical arrival time, in ns since `start`), in 16 shards.
struct Limiter {
    gcra: Gcra,
    start: Instant,
    hasher: RandomState,
    shards: [Mutex<HashMap<IpAddr, u64>>; SHARDS],
}

impl Limiter {
    fn new(gcra: Gcra) -> Limiter {
        Limiter {
            gcra,
            start: Instant::now(),
            hasher: RandomState::new(),
            shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
        }
    }

    /// `Ok(())` when admitted, `Err(retry_after_secs)` when denied.
    fn check(&self, ip: IpAddr) -> std::result::Result<(), u64> {
        let shard = (self.hasher.hash_one(ip) as usize) % SHARDS;
        let now = self.start.elapsed().as_nanos() as u64;
        let mut map = self.shards[shard].lock().unwrap_or_else(|e| e.into_inner());
        let tat = map.entry(ip).or_insert_with(|| self.gcra.initial_state());
        match self.gcra.check(tat, now, 1) {
            Ok(d) if d.allowed => Ok(()),
            Ok(d) => Err(d.retry_after_secs_ceil().max(1)),
            // A cost above the burst: never with cost 1 and a burst of 10^9.
            Err(_) => Err(1),
        }
    }
}

struct Proxy {
    upstream: SocketAddr,
    /// What nginx sends by default (`proxy_set_header Host $proxy_host`): the upstream's
    /// address as written in `--upstream`.
    host: HeaderValue,
    limiter: Limiter,
}

/// The client's IP address, taken once per request in `request_filter`.
pub struct Ctx {
    client_ip: Option<IpAddr>,
}

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx { client_ip: None }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let ip = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip());
        ctx.client_ip = ip;
        let Some(ip) = ip else { return Ok(false) };
        match self.limiter.check(ip) {
            Ok(()) => Ok(false),
            Err(retry_after) => {
                let mut resp = ResponseHeader::build(429, Some(2))?;
                resp.insert_header(RETRY_AFTER, retry_after.to_string())?;
                resp.insert_header(CONTENT_LENGTH, "0")?;
                session.write_response_header(Box::new(resp), true).await?;
                Ok(true)
            }
        }
    }

    async fn upstream_peer(&self, _session: &mut Session, _ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        // Plain HTTP/1.1; pingora keeps the connection in its pool between requests.
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // Host: set to the upstream address, as nginx does by default ($proxy_host), rather than
        // keeping the client's.
        req.insert_header(HOST, self.host.clone())?;
        // X-Forwarded-For: the client's own value(s), then its address (nginx's
        // $proxy_add_x_forwarded_for).
        if let Some(ip) = ctx.client_ip {
            let mut xff = String::with_capacity(64);
            for v in req.headers.get_all(&X_FORWARDED_FOR) {
                if let Ok(s) = v.to_str() {
                    xff.push_str(s);
                    xff.push_str(", ");
                }
            }
            let _ = write!(xff, "{ip}");
            req.insert_header(X_FORWARDED_FOR, xff)?;
        }
        Ok(())
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: pingora-proto --listen ADDR:PORT --upstream ADDR:PORT [--threads N] \
         [--burst N] [--rate TEXT] [--work-stealing true|false]"
    );
    std::process::exit(2)
}

fn main() {
    let mut listen = None;
    let mut upstream = None;
    let mut threads = 2usize;
    let mut burst = 1_000_000_000u64;
    let mut rate = String::from("1000000000/s");
    let mut work_stealing = true;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--listen" => listen = Some(v),
            "--upstream" => upstream = Some(v),
            "--threads" => threads = v.parse().unwrap_or_else(|_| usage()),
            "--burst" => burst = v.parse().unwrap_or_else(|_| usage()),
            "--rate" => rate = v,
            "--work-stealing" => work_stealing = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let (Some(listen), Some(upstream)) = (listen, upstream) else {
        usage()
    };
    let upstream_addr: SocketAddr = upstream.parse().unwrap_or_else(|_| usage());

    // By default 10^9 per second, burst 10^9: never met, but checked on every request.
    let quota = Quota::parse(burst, &rate).unwrap_or_else(|e| {
        eprintln!("pingora-proto: bad limit: {e}");
        std::process::exit(2)
    });

    // pingora reports a failed bind only through `log`, and no logger is installed: check that
    // the address is free first, so that a taken port is an error rather than a silent no-op.
    if let Err(e) = std::net::TcpListener::bind(&listen) {
        eprintln!("pingora-proto: cannot listen on {listen}: {e}");
        std::process::exit(1)
    }
    let proxy = Proxy {
        upstream: upstream_addr,
        host: HeaderValue::from_str(&upstream).expect("host header"),
        limiter: Limiter::new(Gcra::new(quota)),
    };

    // No logger is installed, so pingora's `log` records (and nothing per request) go nowhere.
    let conf = ServerConf {
        threads: threads.max(1),
        // false: pingora's thread-per-core runtimes (one single-threaded runtime per thread).
        work_stealing,
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = http_proxy_service(&server.configuration, proxy);
    service.add_tcp(&listen);
    server.add_service(service);
    server.run_forever();
}
