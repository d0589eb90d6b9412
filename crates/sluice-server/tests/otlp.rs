//! `[telemetry] otlp_endpoint`: one span per gateway request, POSTed over OTLP/HTTP
//! (protobuf) to `<endpoint>/v1/traces`, child of the caller's `traceparent`, with the
//! decision as an attribute; flushed on SIGTERM. Without `[telemetry]` nothing is sent.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{get_with, Gateway, Upstream};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const TRACESTATE: &str = "congo=t61rcWkgMzE";

/// An OTLP/HTTP collector stand-in: decodes every `POST /v1/traces` and keeps its spans.
struct Collector {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    /// Every request it was sent, as `METHOD PATH content-type`.
    requests: Arc<Mutex<Vec<String>>>,
}

/// Answers the OTLP/HTTP requests of one connection.
async fn serve_collector<I>(io: I, spans: Arc<Mutex<Vec<Span>>>, requests: Arc<Mutex<Vec<String>>>)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req: Request<Incoming>| {
        let (spans, requests) = (Arc::clone(&spans), Arc::clone(&requests));
        async move {
            let line = format!(
                "{} {} {}",
                req.method(),
                req.uri().path(),
                req.headers()
                    .get("content-type")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
            );
            requests.lock().unwrap().push(line);
            let ok = req.method() == http::Method::POST && req.uri().path() == "/v1/traces";
            let body = req.into_body().collect().await.unwrap().to_bytes();
            if !ok {
                return Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .status(StatusCode::NOT_FOUND)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                );
            }
            let export =
                ExportTraceServiceRequest::decode(body).expect("an ExportTraceServiceRequest");
            let mut kept = spans.lock().unwrap();
            for resource in export.resource_spans {
                for scope in resource.scope_spans {
                    kept.extend(scope.spans);
                }
            }
            // An empty ExportTraceServiceResponse: full success.
            Ok(Response::builder()
                .header("content-type", "application/x-protobuf")
                .body(Full::new(Bytes::new()))
                .unwrap())
        }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), service)
        .await;
}

impl Collector {
    async fn start() -> Collector {
        Collector::start_with(None).await
    }

    /// Over TLS with `tls`, in plain text without.
    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (s, r) = (Arc::clone(&spans), Arc::clone(&requests));
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (spans, requests) = (Arc::clone(&s), Arc::clone(&r));
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                serve_collector(stream, spans, requests).await;
                            }
                        }
                        None => serve_collector(stream, spans, requests).await,
                    }
                });
            }
        });
        Collector {
            addr,
            spans,
            requests,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// A token bucket of capacity 3 that refills once an hour, on `/api/`.
fn config(upstream: &str, telemetry: &str) -> String {
    format!(
        r#"
[[policy]]
name = "small"
algorithm = "token_bucket"
capacity = 3
rate = "1/h"
key = "global"

[[route]]
path_prefix = "/api/"
policies = ["small"]
upstream = "{upstream}"

{telemetry}
"#
    )
}

fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sends `n` GETs to `/api/0` .. `/api/{n-1}`, the first with a `traceparent`; their statuses.
async fn requests(gw: &Gateway, n: usize) -> Vec<u16> {
    let traceparent = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let mut statuses = Vec::new();
    for i in 0..n {
        let headers: &[(&str, &str)] = if i == 0 {
            &[("traceparent", &traceparent), ("tracestate", TRACESTATE)]
        } else {
            &[]
        };
        let r = get_with(&gw.url(&format!("/api/{i}")), headers).await;
        if i == 0 {
            // Untouched on its way upstream: no new traceparent is injected.
            assert_eq!(r.json()["headers"]["traceparent"], traceparent.as_str());
            assert_eq!(r.json()["headers"]["tracestate"], TRACESTATE);
        }
        statuses.push(r.status.as_u16());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_span_per_request_child_of_the_callers_traceparent() {
    let up = Upstream::start().await;
    let collector = Collector::start().await;
    let telemetry = format!("[telemetry]\notlp_endpoint = \"{}\"", collector.endpoint());
    let mut gw = Gateway::start("", &config(&up.url(), &telemetry)).await;
    let n = 6;
    let statuses = requests(&gw, n).await;
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    // SIGTERM flushes the spans the batch processor still holds.
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}: {}", gw.log_text());
    let spans = collector.spans();
    assert_eq!(
        spans.len(),
        n,
        "one span per request: {spans:#?}\n{:?}\n{}",
        collector.requests(),
        gw.log_text()
    );
    for line in collector.requests() {
        assert_eq!(line, "POST /v1/traces application/x-protobuf");
    }
    let mut by_path: HashMap<String, (Span, HashMap<String, String>)> = HashMap::new();
    for span in spans {
        assert_eq!(span.name, "sluice.request");
        assert_eq!(span.kind, SpanKind::Server as i32);
        assert!(span.end_time_unix_nano >= span.start_time_unix_nano);
        let attrs = attributes(&span);
        let path = attrs["url.path"].clone();
        assert!(
            by_path.insert(path.clone(), (span, attrs)).is_none(),
            "two spans for {path}"
        );
    }
    for (i, status) in statuses.iter().enumerate() {
        let path = format!("/api/{i}");
        let (span, attrs) = by_path
            .get(&path)
            .unwrap_or_else(|| panic!("no span for {path}"));
        assert_eq!(attrs["http.request.method"], "GET");
        assert_eq!(attrs["sluice.route"], "/api/");
        assert_eq!(
            attrs["http.response.status_code"],
            status.to_string(),
            "{path}"
        );
        if *status == 200 {
            assert_eq!(attrs["sluice.decision"], "admitted", "{path}");
            assert!(!attrs.contains_key("sluice.policy"), "{path}: {attrs:?}");
        } else {
            assert_eq!(attrs["sluice.decision"], "denied:limit", "{path}");
            assert_eq!(attrs["sluice.policy"], "small", "{path}");
        }
        if i == 0 {
            // The caller's trace, with the caller's span as the parent.
            assert_eq!(hex(&span.trace_id), TRACE_ID);
            assert_eq!(hex(&span.parent_span_id), PARENT_ID);
            assert_eq!(span.trace_state, TRACESTATE);
        } else {
            // A new trace of its own: a root span.
            assert_ne!(hex(&span.trace_id), TRACE_ID);
            assert_eq!(span.trace_id.len(), 16);
            assert!(span.parent_span_id.is_empty(), "{path}");
        }
        assert_eq!(span.span_id.len(), 8);
    }
    // The access log's trace_id is the span's.
    let log = gw.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("sluice::access") && l.contains("path=/api/0 "))
        .unwrap_or_else(|| panic!("no access line: {log}"));
    assert!(line.contains(&format!("trace_id=\"{TRACE_ID}\"")), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_telemetry_nothing_is_sent() {
    let up = Upstream::start().await;
    let collector = Collector::start().await;
    let mut gw = Gateway::start("", &config(&up.url(), "")).await;
    let statuses = requests(&gw, 4).await;
    assert_eq!(statuses, [200, 200, 200, 429]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}: {}", gw.log_text());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        collector.requests().is_empty(),
        "{:?}",
        collector.requests()
    );
    assert!(collector.spans().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_delays_nothing_and_shutdown_still_ends() {
    let up = Upstream::start().await;
    let telemetry = format!(
        "[telemetry]\notlp_endpoint = \"http://127.0.0.1:{}\"",
        common::closed_port()
    );
    let mut gw = Gateway::start("", &config(&up.url(), &telemetry)).await;
    let started = std::time::Instant::now();
    assert_eq!(requests(&gw, 4).await, [200, 200, 200, 429]);
    // Spans are exported off the request path: a failing export costs the requests nothing.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}: {}", gw.log_text());
    // The spans that could not be sent are not lost silently.
    assert!(
        gw.log_text().contains("flushing the spans failed"),
        "{}",
        gw.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changing_the_endpoint_needs_a_restart() {
    let up = Upstream::start().await;
    let collector = Collector::start().await;
    let gw = Gateway::start("", &config(&up.url(), "")).await;
    let telemetry = format!("[telemetry]\notlp_endpoint = \"{}\"", collector.endpoint());
    gw.rewrite("", &config(&up.url(), &telemetry));
    gw.signal("HUP");
    gw.wait_log(
        "telemetry.otlp_endpoint needs a restart",
        Duration::from_secs(10),
    )
    .await;
    // The old configuration keeps serving, and still exports nothing.
    assert_eq!(requests(&gw, 1).await, [200]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        collector.requests().is_empty(),
        "{:?}",
        collector.requests()
    );
}

#[test]
fn check_config_names_a_bad_endpoint_by_file_line_field_and_value() {
    let dir = common::TempDir::new();
    let path = dir.0.join("gw.toml");
    let run = |text: &str| {
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(common::bin())
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let route = "[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9000\"\n";
    for bad in [
        "grpc://127.0.0.1:4317",
        "127.0.0.1:4318",
        "http://h:4318/?x=1",
        "http://",
    ] {
        let (code, stderr) = run(&format!(
            "{route}\n[telemetry]\notlp_endpoint = \"{bad}\"\n"
        ));
        assert_eq!(code, 2, "{bad}: {stderr}");
        let prefix = format!("{}:6:", path.display());
        assert!(
            stderr.lines().any(|l| l.starts_with(&prefix)
                && l.contains(" telemetry.otlp_endpoint: ")
                && l.contains(&format!("`{bad}`"))),
            "{bad}: {stderr}"
        );
    }
    let (code, stderr) = run(&format!("{route}\n[telemetry]\notlp_endpoint = 4318\n"));
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("telemetry.otlp_endpoint"), "{stderr}");
    let (code, stderr) = run(&format!("{route}\n[telemetry]\nendpoint = \"http://h\"\n"));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("telemetry.endpoint: unknown key"),
        "{stderr}"
    );
    for good in [
        "http://127.0.0.1:4318",
        "https://collector.example:4318/otlp/",
    ] {
        let (code, stderr) = run(&format!(
            "{route}\n[telemetry]\notlp_endpoint = \"{good}\"\n"
        ));
        assert_eq!(code, 0, "{good}: {stderr}");
    }
    let (code, stderr) = run(&format!("{route}\n[telemetry]\n"));
    assert_eq!(code, 0, "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_collector_is_reached_over_rustls() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let dir = common::TempDir::new();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "otlp test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &ca, &ca_key)
        .unwrap();
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let mut server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls_pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap(),
    )
    .unwrap();
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let collector =
        Collector::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))).await;

    let up = Upstream::start().await;
    let (port, admin_port) = (common::free_port(), common::free_port());
    let telemetry = format!(
        "[telemetry]\notlp_endpoint = \"https://{}\"",
        collector.addr
    );
    let config_file = dir.0.join("sluice.toml");
    std::fs::write(
        &config_file,
        common::config_text(port, admin_port, "", &config(&up.url(), &telemetry)),
    )
    .unwrap();
    let log = dir.0.join("sluice.log");
    // The collector's CA is the only root the gateway trusts (rustls-native-certs reads
    // SSL_CERT_FILE).
    let mut child = std::process::Command::new(common::bin())
        .args(["serve", "--config"])
        .arg(&config_file)
        .env("SLUICE_LOG", "info")
        .env("SSL_CERT_FILE", &ca_file)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let healthz = format!("http://127.0.0.1:{admin_port}/healthz");
    while !matches!(common::get(&healthz).await, Ok(r) if r.status == StatusCode::OK) {
        assert!(child.try_wait().unwrap().is_none(), "{}", log_text());
        assert!(std::time::Instant::now() < deadline, "{}", log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = get_with(&format!("http://127.0.0.1:{port}/api/tls"), &[]).await;
    assert_eq!(r.status, 200);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "{}", log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status}: {}", log_text());
    let spans = collector.spans();
    assert_eq!(spans.len(), 1, "{:?}\n{}", collector.requests(), log_text());
    assert_eq!(attributes(&spans[0])["url.path"], "/api/tls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_denials_and_upstream_failures_are_told_apart() {
    let up = Upstream::start().await;
    let collector = Collector::start().await;
    let rest = format!(
        r#"
[[policy]]
name = "trial"
algorithm = "token_bucket"
capacity = 1
rate = "1/h"
key = "global"
shadow = true

[[route]]
path_prefix = "/shadow/"
policies = ["trial"]
upstream = "{}"

[[route]]
path_prefix = "/down/"
upstream = "http://127.0.0.1:{}"

[telemetry]
otlp_endpoint = "{}"
"#,
        up.url(),
        common::closed_port(),
        collector.endpoint()
    );
    let mut gw = Gateway::start("", &rest).await;
    for path in ["/shadow/1", "/shadow/2", "/down/1"] {
        get_with(&gw.url(path), &[]).await;
    }
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(15)).await;
    assert!(status.success(), "{status}: {}", gw.log_text());
    let spans = collector.spans();
    assert_eq!(spans.len(), 3, "{spans:#?}");
    let by_path: HashMap<String, (Span, HashMap<String, String>)> = spans
        .into_iter()
        .map(|s| {
            let a = attributes(&s);
            (a["url.path"].clone(), (s, a))
        })
        .collect();
    let (span, a) = &by_path["/shadow/1"];
    assert_eq!(a["sluice.decision"], "admitted");
    assert!(!a.contains_key("sluice.policy"));
    assert!(span.status.as_ref().is_none_or(|s| s.code == 0), "{span:?}");
    let (_, a) = &by_path["/shadow/2"];
    assert_eq!(a["sluice.decision"], "shadow-denied");
    assert_eq!(a["sluice.policy"], "trial");
    assert_eq!(a["http.response.status_code"], "200");
    let (span, a) = &by_path["/down/1"];
    assert_eq!(a["sluice.decision"], "upstream_refused");
    assert_eq!(a["sluice.route"], "/down/");
    assert_eq!(a["http.response.status_code"], "502");
    // A 5xx answer: the span's status is an error (STATUS_CODE_ERROR = 2).
    assert_eq!(span.status.as_ref().map(|s| s.code), Some(2), "{span:?}");
}
