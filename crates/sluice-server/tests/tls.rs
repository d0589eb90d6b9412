//! TLS at the main listener and towards upstreams, driven with clients nobody here wrote
//! (curl, h2load, rustls, hyper's HTTP/2) against the built `sluice` binary: HTTPS over
//! HTTP/1.1 and HTTP/2, certificates swapped at SIGHUP, bad TLS settings, and `https://`
//! upstreams verified. The certificates are made by each test with rcgen.
//!
//! curl and h2load are needed: without them a test fails under `CI=true`, and says
//! `skipped: <tool> missing` otherwise. Plain-text HTTP/2 (h2c) is in `tests/h2c.rs`.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::config::{policy, route};
use common::tools::{count, curl, curl_many, h2load, have};
use common::{Gateway, TempDir, Upstream};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

// === certificates ===

/// A test certificate authority.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Ca { cert, key }
    }

    /// A server certificate for `localhost` and 127.0.0.1, named `subject`, with `serial`.
    fn leaf(&self, subject: &str, serial: u64) -> Leaf {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, subject);
        params.serial_number = Some(serial.into());
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.cert.pem()).unwrap();
        path
    }

    /// A rustls client config that trusts this CA only.
    fn client(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.cert.der().clone()).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

impl Leaf {
    /// Writes `NAME.crt` and `NAME.key`.
    fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let (cert, key) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

/// The `[server.tls]` table for these files.
fn tls_table(cert: &Path, key: &Path) -> String {
    format!(
        "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
        cert.display(),
        key.display()
    )
}

// === test servers ===

/// A TLS connection to the gateway with `config`: the certificate it presented, and the
/// negotiated ALPN protocol.
async fn tls_connect(
    port: u16,
    config: Arc<rustls::ClientConfig>,
) -> (
    tokio_rustls::client::TlsStream<TcpStream>,
    CertificateDer<'static>,
) {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let presented = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
    (stream, presented)
}

/// An HTTPS upstream (HTTP/1.1 over TLS with `leaf`): answers `tls ok`.
async fn https_upstream(leaf: &Leaf, dir: &Path) -> SocketAddr {
    let (cert, key) = leaf.write(dir, "upstream");
    let certs = sluice_http::proxy::pem_certificates(&std::fs::read(cert).unwrap()).unwrap();
    use rustls::pki_types::pem::PemObject as _;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let svc = service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"tls ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

// === the tests ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_over_http1_and_http2_keeps_the_policies_exact() {
    if !have("curl") {
        return;
    }
    let dir = TempDir::new();
    let ca = Ca::new("sluice test CA");
    let (cert, key) = ca.leaf("gateway", 1).write(&dir.0, "gw");
    let ca_pem = ca.write(&dir.0, "ca.pem");
    let ca_arg = ca_pem.to_str().unwrap();
    let up = Upstream::start().await;
    let rest = format!(
        "{}{}{}{}{}{}",
        tls_table(&cert, &key),
        policy("one", 5),
        policy("two", 5),
        route("/one/", &["one"], &up.url()),
        route("/two/", &["two"], &up.url()),
        route("/free/", &[], &up.url()),
    );
    let gw = Gateway::start("", &rest).await;
    let base = format!("https://localhost:{}", gw.port);

    let h1 = curl_many(
        &["--cacert", ca_arg, "--http1.1"],
        &format!("{base}/one/x"),
        20,
    );
    assert_eq!(count(&h1, "1.1 200"), 5, "{h1:?}");
    assert_eq!(count(&h1, "1.1 429"), 15, "{h1:?}");

    let h2 = curl_many(
        &["--cacert", ca_arg, "--http2"],
        &format!("{base}/two/x"),
        20,
    );
    assert_eq!(count(&h2, "2 200"), 5, "{h2:?}");
    assert_eq!(count(&h2, "2 429"), 15, "{h2:?}");

    // A denial over HTTP/2 carries the RateLimit headers and Retry-After.
    let denied = curl(&[
        "--cacert",
        ca_arg,
        "--http2",
        "-i",
        &format!("{base}/two/x"),
    ]);
    assert!(denied.starts_with("HTTP/2 429"), "{denied}");
    for header in [
        "ratelimit-policy: \"two\";q=5",
        "ratelimit: \"two\";r=0",
        "retry-after:",
    ] {
        assert!(denied.contains(header), "no {header} in {denied}");
    }
    // The upstream (HTTP/1.1) got the client's host from :authority, and an X-Request-Id.
    let echoed = curl(&["--cacert", ca_arg, "--http2", &format!("{base}/free/echo")]);
    let json: serde_json::Value =
        serde_json::from_str(&echoed).unwrap_or_else(|e| panic!("{e}: {echoed}"));
    assert_eq!(
        json["headers"]["host"],
        format!("localhost:{}", gw.port),
        "{json}"
    );
    assert!(json["headers"]["x-request-id"].is_string(), "{json}");
    assert_eq!(json["headers"]["x-forwarded-for"], "127.0.0.1", "{json}");

    // Plain HTTP on the TLS port is not served.
    let plain = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &format!("http://127.0.0.1:{}/one/x", gw.port),
    ]);
    assert_ne!(plain, "200", "plain HTTP answered on the TLS listener");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2load_over_tls_and_h2c_admits_exactly_the_capacity() {
    if !have("h2load") {
        return;
    }
    let dir = TempDir::new();
    let ca = Ca::new("sluice test CA");
    let (cert, key) = ca.leaf("gateway", 7).write(&dir.0, "gw");
    let up = Upstream::start().await;
    let limited = format!(
        "{}{}",
        policy("api", 25),
        route("/api/", &["api"], &up.url())
    );
    let tls = Gateway::start("", &format!("{}{limited}", tls_table(&cert, &key))).await;
    let (ok, denied, failed, text) = h2load(&[
        "-n",
        "200",
        "-c",
        "4",
        "-m",
        "10",
        &format!("https://localhost:{}/api/x", tls.port),
    ]);
    assert_eq!((ok, denied, failed), (25, 175, 0), "{text}");
    assert!(text.contains("TLS Protocol: TLSv1.3"), "{text}");
    assert!(text.contains("Application protocol: h2"), "{text}");

    let plain = Gateway::start("", &limited).await;
    let (ok, denied, failed, text) =
        h2load(&["-n", "200", "-c", "4", "-m", "10", &plain.url("/api/x")]);
    assert_eq!((ok, denied, failed), (25, 175, 0), "{text}");
    assert!(text.contains("Application protocol: h2c"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_swaps_the_certificate_and_keeps_it_when_the_new_pair_is_bad() {
    let dir = TempDir::new();
    let ca = Ca::new("sluice test CA");
    let first = ca.leaf("first", 1);
    let (cert, key) = first.write(&dir.0, "gw");
    let up = Upstream::start().await;
    let rest = format!("{}{}", tls_table(&cert, &key), route("/", &[], &up.url()));
    let gw = Gateway::start("", &rest).await;
    let client = ca.client(&[b"http/1.1"]);

    // A slow request in flight on a connection made with the first certificate.
    let (stream, presented) = tls_connect(gw.port, Arc::clone(&client)).await;
    assert_eq!(presented, first.der);
    let (mut old, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let slow = tokio::spawn(async move {
        let req = Request::get("/slow/1500")
            .header("host", "localhost")
            .body(Full::<Bytes>::default())
            .unwrap();
        let r = old.send_request(req).await.unwrap();
        let status = r.status();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The files change, SIGHUP: new connections get the second certificate.
    let second = ca.leaf("second", 2);
    second.write(&dir.0, "gw");
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(10))
        .await;
    assert!(gw.log_text().contains("server.tls"), "{}", gw.log_text());
    let (_, presented) = tls_connect(gw.port, Arc::clone(&client)).await;
    assert_eq!(
        presented, second.der,
        "a new connection got the old certificate"
    );
    let (status, body) = slow.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert!(!body.is_empty());

    // A key that is not the certificate's: refused, named, and the second one kept.
    std::fs::write(&key, &first.key_pem).unwrap();
    gw.signal("HUP");
    gw.wait_log("config refused", Duration::from_secs(10)).await;
    let log = gw.log_text();
    assert!(
        log.contains("server.tls.key") && log.contains(key.to_str().unwrap()),
        "{log}"
    );
    let (_, presented) = tls_connect(gw.port, client).await;
    assert_eq!(presented, second.der);
    // check-config says the same.
    let stderr = common::check_config_refuses(&gw.config);
    assert!(
        stderr.contains("server.tls.key") && stderr.contains("is not the key of"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_upstream_ca_or_the_system_roots() {
    let dir = TempDir::new();
    let ca = Ca::new("upstream CA");
    let other = Ca::new("another CA");
    let upstream = https_upstream(&ca.leaf("upstream", 3), &dir.0).await;
    let good = ca.write(&dir.0, "good-ca.pem");
    let wrong = other.write(&dir.0, "wrong-ca.pem");
    let url = format!("https://localhost:{}", upstream.port());
    let rest = format!(
        "{}upstream_ca = \"{}\"\n{}upstream_ca = \"{}\"\n{}",
        route("/good/", &[], &url),
        good.display(),
        route("/wrong/", &[], &url),
        wrong.display(),
        route("/system/", &[], &url),
    );
    let gw = Gateway::start("", &rest).await;
    let good = common::get(&gw.url("/good/x")).await.unwrap();
    assert_eq!(good.status, StatusCode::OK, "{}", gw.log_text());
    assert_eq!(good.body, "tls ok");
    for path in ["/wrong/x", "/system/x"] {
        let bad = common::get(&gw.url(path)).await.unwrap();
        assert_eq!(bad.status, StatusCode::BAD_GATEWAY, "{path}");
    }
    gw.wait_log("upstream TLS failed", Duration::from_secs(5))
        .await;
    let log = gw.log_text();
    assert!(
        log.contains("invalid peer certificate: UnknownIssuer"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_client_that_never_says_hello_is_closed_at_the_header_timeout() {
    let dir = TempDir::new();
    let ca = Ca::new("sluice test CA");
    let (cert, key) = ca.leaf("gateway", 1).write(&dir.0, "gw");
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "header_read_timeout = \"1s\"",
        &format!("{}{}", tls_table(&cert, &key), route("/", &[], &up.url())),
    )
    .await;
    let started = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "not closed: {read:?}");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(4),
        "closed after {took:?}"
    );
    // Meanwhile a real client is served.
    let (stream, _) = tls_connect(gw.port, ca.client(&[b"h2"])).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tls_settings_are_named_by_check_config() {
    let dir = TempDir::new();
    let ca = Ca::new("sluice test CA");
    let (cert, key) = ca.leaf("gateway", 1).write(&dir.0, "gw");
    let (_, other_key) = ca.leaf("other", 2).write(&dir.0, "other");
    let junk = dir.0.join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = dir.0.join("missing.pem");
    let ca_pem = ca.write(&dir.0, "ca.pem");
    let check = |text: String| -> String {
        let path = dir.0.join("check.toml");
        std::fs::write(&path, text).unwrap();
        common::check_config_refuses(&path)
    };
    let up = route("/", &[], "http://127.0.0.1:9");
    let cases = [
        (
            tls_table(&missing, &key),
            vec!["server.tls.cert", "missing.pem", "cannot read"],
        ),
        (
            tls_table(&cert, &other_key),
            vec!["server.tls.key", "other.key", "is not the key of", "gw.crt"],
        ),
        (
            tls_table(&junk, &key),
            vec!["server.tls.cert", "junk.pem", "no PEM certificate"],
        ),
        (
            tls_table(&cert, &junk),
            vec!["server.tls.key", "junk.pem", "private key"],
        ),
        (
            "[server.tls]\ncert = \"x\"\n".to_owned(),
            vec!["server.tls.key", "needs `key`"],
        ),
    ];
    for (table, needles) in cases {
        let err = check(format!("{table}{up}"));
        for n in needles {
            assert!(err.contains(n), "no `{n}` in {err}");
        }
    }
    let err = check(format!(
        "{}upstream_ca = \"{}\"\n",
        route("/", &[], "h2c://127.0.0.1:9"),
        ca_pem.display()
    ));
    assert!(
        err.contains("route[0].upstream_ca") && err.contains("https:// upstreams only"),
        "{err}"
    );
    let err = check(format!(
        "{}upstream_ca = \"{}\"\n",
        route("/", &[], "https://127.0.0.1:9"),
        junk.display()
    ));
    assert!(
        err.contains("route[0].upstream_ca") && err.contains("junk.pem"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_http2_request_in_flight_finish() {
    let dir = TempDir::new();
    let ca = Ca::new("sluice test CA");
    let (cert, key) = ca.leaf("gateway", 1).write(&dir.0, "gw");
    let up = Upstream::start().await;
    let mut gw = Gateway::start(
        "",
        &format!("{}{}", tls_table(&cert, &key), route("/", &[], &up.url())),
    )
    .await;
    let (stream, _) = tls_connect(gw.port, ca.client(&[b"h2"])).await;
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("https://localhost:{}/slow/1000", gw.port))
        .body(Full::<Bytes>::default())
        .unwrap();
    let pending = tokio::spawn(async move {
        let r = sender.send_request(req).await.unwrap();
        let status = r.status();
        (status, r.into_body().collect().await.unwrap().to_bytes())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.signal("TERM");
    let (status, body) = pending.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("/slow/1000"));
    assert!(gw.wait_exit(Duration::from_secs(10)).await.success());
}
