//! The harness of the integration tests: the real `sluice` binary against a real upstream,
//! both on 127.0.0.1 ports chosen by the OS. The families of helpers only some suites need
//! have modules of their own: `config` (policies and routes in TOML), `h2_frames` (HTTP/2
//! written by hand), `llm` (an OpenAI-like upstream) and `tools` (curl, h2load).
#![allow(dead_code)]

pub mod config;
pub mod h2_frames;
pub mod llm;
pub mod tools;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// A real upstream: counts requests, records their headers, and can be slow.
///
/// - `/slow/<ms>...`: answers after `ms` milliseconds.
/// - `/free/close...`: closes the connection after answering.
/// - anything else: 200 `ok` at once.
///
/// Every answer carries `x-upstream-seq` (its arrival number) and echoes, as JSON, the
/// headers it received.
pub struct Upstream {
    pub addr: SocketAddr,
    pub count: Arc<AtomicU64>,
    /// The `x-seq` header of each request, in arrival order.
    pub arrivals: Arc<Mutex<Vec<String>>>,
    /// When each request arrived, in arrival order.
    pub times: Arc<Mutex<Vec<Instant>>>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let count = Arc::new(AtomicU64::new(0));
        let arrivals = Arc::new(Mutex::new(Vec::new()));
        let times = Arc::new(Mutex::new(Vec::new()));
        let (c, a, t) = (
            Arc::clone(&count),
            Arc::clone(&arrivals),
            Arc::clone(&times),
        );
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (c, a, t) = (Arc::clone(&c), Arc::clone(&a), Arc::clone(&t));
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        t.lock().unwrap().push(Instant::now());
                        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
                        if let Some(seq) = req.headers().get("x-seq") {
                            a.lock()
                                .unwrap()
                                .push(seq.to_str().unwrap_or("?").to_owned());
                        }
                        async move { Ok::<_, Infallible>(answer(req, n).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Upstream {
            addr,
            count,
            arrivals,
            times,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }
}

async fn answer(req: Request<Incoming>, n: u64) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    if let Some(rest) = path.strip_prefix("/slow/") {
        let ms: u64 = rest
            .split('/')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let headers: HashMap<String, String> = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_owned(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let json = serde_json::json!({ "path": path, "headers": headers, "body_len": body });
    let mut r = Response::new(Full::new(Bytes::from(json.to_string())));
    r.headers_mut().insert("x-upstream-seq", n.into());
    if path.starts_with("/free/close") {
        // The upstream closes the connection after this response.
        r.headers_mut()
            .insert("connection", http::HeaderValue::from_static("close"));
    }
    r
}

/// A port the OS just gave out (and took back).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A port where nothing listens, and nothing will: a socket bound to it and never listening
/// holds it (connections to it are refused) until the test process ends, so that no other
/// test's server can take it meanwhile.
pub fn closed_port() -> u16 {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket
        .bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into())
        .unwrap();
    let port = socket.local_addr().unwrap().as_socket().unwrap().port();
    // Held for the process's life on purpose: a few sockets, in a short-lived test process.
    std::mem::forget(socket);
    port
}

/// A running `sluice serve`.
pub struct Gateway {
    pub child: Child,
    pub port: u16,
    pub admin_port: u16,
    pub config: PathBuf,
    pub log: PathBuf,
    _dir: TempDir,
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "sluice-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `sluice` binary under test: Cargo's build of this profile, or `SLUICE_BIN` when set
/// (e.g. `SLUICE_BIN=target/release/sluice` runs a suite against the release binary).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("SLUICE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice").to_owned())
    })
}

/// `sluice check-config PATH`, which must refuse the file (exit 2); what it printed on stderr.
pub fn check_config_refuses(path: &std::path::Path) -> String {
    let out = std::process::Command::new(bin())
        .arg("check-config")
        .arg(path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A global token bucket, capacity 10 at 5/s, no queue, on `/api/` in front of `upstream`:
/// the policy of the accuracy and stress tests.
pub fn api_10_at_5(upstream: &str) -> String {
    format!(
        r#"
[[policy]]
name = "api"
algorithm = "token_bucket"
capacity = 10
rate = "5/s"
key = "global"

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "{upstream}"
"#
    )
}

/// The `[server]` table for these ports, then `rest`.
pub fn config_text(port: u16, admin_port: u16, server_extra: &str, rest: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nadmin_listen = \"127.0.0.1:{admin_port}\"\n{server_extra}\n{rest}\n"
    )
}

impl Gateway {
    /// Starts `sluice serve` with `[server]` extra lines and the rest of a config, and waits
    /// until `/healthz` answers.
    pub async fn start(server_extra: &str, rest: &str) -> Gateway {
        Gateway::start_with_open_files(None, server_extra, rest).await
    }

    /// [`Gateway::start`] under `prlimit --nofile=SOFT:HARD` when `open_files` is given.
    pub async fn start_with_open_files(
        open_files: Option<(u64, u64)>,
        server_extra: &str,
        rest: &str,
    ) -> Gateway {
        let dir = TempDir::new();
        let (port, admin_port) = (free_port(), free_port());
        let config = dir.0.join("sluice.toml");
        std::fs::write(&config, config_text(port, admin_port, server_extra, rest)).unwrap();
        let log = dir.0.join("sluice.log");
        let child = match open_files {
            None => spawn_serve(&config, &log),
            Some((soft, hard)) => {
                let log_file = std::fs::File::create(&log).unwrap();
                // prlimit execs sluice: the child's pid is the gateway's.
                Command::new("prlimit")
                    .arg(format!("--nofile={soft}:{hard}"))
                    .args([bin(), "serve", "--config"])
                    .arg(&config)
                    .env("SLUICE_LOG", "info")
                    .stdout(Stdio::null())
                    .stderr(log_file)
                    .spawn()
                    .expect("prlimit (util-linux) runs sluice")
            }
        };
        let mut gw = Gateway {
            child,
            port,
            admin_port,
            config,
            log,
            _dir: dir,
        };
        gw.wait_ready().await;
        gw
    }

    /// `kill -9`, then `sluice serve` again on the same config (ports, state files), its log
    /// appended to the same file; waits until `/healthz` answers.
    pub async fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_serve(&self.config, &self.log);
        self.wait_ready().await;
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(r) = get(&self.admin("/healthz")).await {
                if r.status == StatusCode::OK {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("sluice exited early with {status}: {}", self.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "sluice not ready: {}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn admin(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Whether the process is still running.
    pub fn child_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Rewrites the config file (same ports) with `rest`.
    pub fn rewrite(&self, server_extra: &str, rest: &str) {
        let mut f = std::fs::File::create(&self.config).unwrap();
        f.write_all(config_text(self.port, self.admin_port, server_extra, rest).as_bytes())
            .unwrap();
    }

    /// Waits for the process to exit, at most `limit`.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "sluice did not exit: {}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the log contains `needle`.
    pub async fn wait_log(&self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.log_text().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no `{needle}` in the log: {}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `sluice serve --config CONFIG` at log level info, its stderr appended to `log`.
fn spawn_serve(config: &std::path::Path, log: &std::path::Path) -> Child {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(bin())
        .args(["serve", "--config"])
        .arg(config)
        .env("SLUICE_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log_file)
        .spawn()
        .unwrap()
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of the samples of `series` (all label sets) on the gateway's `/metrics`.
pub async fn metric(gw: &Gateway, series: &str) -> f64 {
    let text = get(&gw.admin("/metrics")).await.unwrap().body;
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A response, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Result<Answer, String> {
    let response = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

pub async fn get(url: &str) -> Result<Answer, String> {
    send(&client(), Request::get(url).body(Full::default()).unwrap()).await
}

pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send(&client(), req.body(Full::default()).unwrap())
        .await
        .unwrap()
}

pub async fn post(url: &str, body: &str) -> Answer {
    let req = Request::post(url)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(&client(), req).await.unwrap()
}

/// The most of `times` (sorted) that fall in one window `[t, t + window]`.
pub fn most_in_a_window(times: &[std::time::Instant], window: Duration) -> usize {
    let mut most = 0;
    let mut end = 0;
    for (start, &t) in times.iter().enumerate() {
        while end < times.len() && times[end] <= t + window {
            end += 1;
        }
        most = most.max(end - start);
    }
    most
}
