//! The browser limiter as the real `sluice serve` serves it (`[browser]`): the
//! `/sluice/sw.js` contract of `web/README.md`, `/sluice/config.json`, the files of `web/`,
//! `POST /v1/telemetry` and the `sluice_browser_*` metrics, reloads, and `check-config`.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{
    bin, check_config_refuses, client, get, get_with, post, send, Gateway, TempDir, Upstream,
};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};
use sluice_server::browser::assets::WASM;

const BROWSER: &str = r#"
[browser]
path_prefixes = ["/api/", "/v2/"]
algorithm = "gcra"
capacity = 12
rate = "10 per 90s"
queue = { depth = 7, max_wait = "2.5s" }
queue_max_body = "2KiB"
persist = false
persist_debounce = "40ms"
telemetry = { endpoint = "/v1/telemetry", interval = "2s", sample = 0.5, limit = { capacity = 3, rate = "1/h" } }
fail = "closed"
pace_from_server = true
"#;

/// What the worker is given for [`BROWSER`].
fn browser_json() -> Value {
    json!({
        "path_prefixes": ["/api/", "/v2/"],
        "algorithm": "gcra",
        "capacity": 12,
        "rate": "10 per 90s",
        "queue": { "depth": 7, "max_wait_ms": 2500 },
        "max_queued_body_bytes": 2048,
        "persist": false,
        "persist_debounce_ms": 40,
        "telemetry": { "endpoint": "/v1/telemetry", "interval_ms": 2000, "sample": 0.5 },
        "fail": "closed",
        "pace_from_server": true,
    })
}

fn config(upstream: &str, browser: &str) -> String {
    format!("[[route]]\npath_prefix = \"/\"\nupstream = \"{upstream}\"\n{browser}")
}

const BATCH: &str = r#"{"v":1,"worker":"k3j2h1q9","seq":3,"sample":1,"window_ms":5003,"admitted":12,"queued":4,"rejected":{"queue_full":2,"timeout":1,"limit":5},"cancelled":1,"redispatched":1,"wait_ms":{"sum":1830,"count":3,"max":950}}"#;

/// Standard base64 with padding, strictly: `None` for anything else.
fn unbase64(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for quad in text.as_bytes().chunks(4) {
        let pad = quad.iter().rev().take_while(|&&b| b == b'=').count();
        let mut n = 0u32;
        for &b in &quad[..4 - pad] {
            n = n << 6 | ALPHABET.iter().position(|&a| a == b)? as u32;
        }
        n <<= 6 * pad as u32;
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    Some(out)
}

/// The `sluice_browser_*` and other samples of `/metrics`, by series.
async fn metric(gw: &Gateway, series: &str) -> f64 {
    let text = String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

async fn post_with(url: &str, body: &str, headers: &[(&str, &str)]) -> common::Answer {
    let mut req = Request::post(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send(
        &client(),
        req.body(Full::new(Bytes::from(body.to_owned()))).unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sw_js_is_the_generated_prefix_then_web_sw_js() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), BROWSER)).await;
    let r = get(&gw.url("/sluice/sw.js")).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("content-type"),
        Some("text/javascript; charset=utf-8")
    );
    assert_eq!(r.header("service-worker-allowed"), Some("/"));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let text = std::str::from_utf8(&r.body).unwrap();
    let mut lines = text.splitn(4, '\n');
    let (one, two, three, rest) = (
        lines.next().unwrap(),
        lines.next().unwrap(),
        lines.next().unwrap(),
        lines.next().unwrap(),
    );
    assert_eq!(
        one,
        "// sluice: generated prefix (configuration and module); web/sw.js follows"
    );
    let config = two
        .strip_prefix("self.__SLUICE_CONFIG__ = ")
        .and_then(|s| s.strip_suffix(';'))
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(config).unwrap(),
        browser_json()
    );
    let head = "self.__SLUICE_WASM__ = (function (s) { var b = atob(s), u = new Uint8Array(b.length); for (var i = 0; i < b.length; i++) u[i] = b.charCodeAt(i); return u; })(\"";
    let base64 = three
        .strip_prefix(head)
        .and_then(|s| s.strip_suffix("\");"))
        .unwrap();
    let module = unbase64(base64).expect("standard base64 with padding");
    assert!(
        module.starts_with(b"\0asm\x01\0\0\0"),
        "wasm magic and version 1"
    );
    assert!(module.len() > 1000, "{} bytes", module.len());
    assert_eq!(module.len(), WASM.len());
    assert!(module == WASM, "the embedded sluice-wasm module");
    assert_eq!(
        rest,
        include_str!("../../../web/sw.js"),
        "web/sw.js unchanged"
    );
    assert_eq!(r.header("content-length"), Some(&*text.len().to_string()));

    // A revalidation with the entity tag costs nothing.
    let tag = r.header("etag").unwrap().to_owned();
    let again = get_with(&gw.url("/sluice/sw.js"), &[("if-none-match", &tag)]).await;
    assert_eq!(again.status, StatusCode::NOT_MODIFIED);
    assert!(again.body.is_empty());
    assert_eq!(up.count(), 0, "nothing of this reached the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_json_and_the_files_of_web() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), BROWSER)).await;
    let r = get(&gw.url("/sluice/config.json")).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.json(), browser_json());
    for (path, body, kind) in [
        (
            "/sluice/client.js",
            include_str!("../../../web/client.js"),
            "text/javascript; charset=utf-8",
        ),
        (
            "/sluice/demo.html",
            include_str!("../../../web/demo.html"),
            "text/html; charset=utf-8",
        ),
        (
            "/sluice/demo.js",
            include_str!("../../../web/demo.js"),
            "text/javascript; charset=utf-8",
        ),
    ] {
        let r = get(&gw.url(path)).await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.header("content-type"), Some(kind), "{path}");
        assert_eq!(r.header("cache-control"), Some("no-cache"), "{path}");
        assert_eq!(r.body, body.as_bytes(), "{path}");
        assert!(r.header("x-request-id").is_some());
    }
    let r = post(&gw.url("/sluice/sw.js"), "").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.header("allow"), Some("GET, HEAD"));
    // The worker answers /sluice/state itself; the gateway routes it like any other path.
    let r = get(&gw.url("/sluice/state")).await.unwrap();
    assert_eq!(r.json()["path"], "/sluice/state");
    assert_eq!(up.count(), 1);
    // The access log names what the gateway answered itself.
    gw.wait_log("decision=browser_asset", Duration::from_secs(5))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_statuses_and_metrics() {
    let up = Upstream::start().await;
    // Three batches an hour per client address; X-Forwarded-For believed from 127.0.0.1.
    let gw = Gateway::start(
        "trusted_proxies = [\"127.0.0.1/32\"]",
        &config(&up.url(), BROWSER),
    )
    .await;
    let endpoint = gw.url("/v1/telemetry");
    let from = |ip: &'static str| {
        [
            ("x-forwarded-for", ip),
            ("content-type", "application/json"),
        ]
    };
    // Before any batch, every series is there at 0.
    assert_eq!(
        metric(&gw, "sluice_browser_telemetry_batches_total").await,
        0.0
    );

    let r = post_with(&endpoint, BATCH, &from("198.51.100.1")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert!(r.body.is_empty());
    // A newer worker's batch also counts failures; an older one's has no such fields.
    let second = BATCH.replace("\"max\":950", "\"max\":400").replace(
        "\"redispatched\":1,",
        "\"redispatched\":1,\"failures\":1,\"failed\":9,",
    );
    let r = post_with(&endpoint, &second, &from("198.51.100.1")).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    for (series, value) in [
        ("sluice_browser_telemetry_batches_total", 2.0),
        ("sluice_browser_admitted_total", 24.0),
        ("sluice_browser_queued_total", 8.0),
        ("sluice_browser_rejected_total{reason=\"queue_full\"}", 4.0),
        ("sluice_browser_rejected_total{reason=\"timeout\"}", 2.0),
        ("sluice_browser_rejected_total{reason=\"limit\"}", 10.0),
        ("sluice_browser_cancelled_total", 2.0),
        ("sluice_browser_redispatched_total", 2.0),
        ("sluice_browser_limiter_failures_total", 1.0),
        ("sluice_browser_failed_requests_total", 9.0),
        ("sluice_browser_queue_wait_seconds_total", 3.66),
        ("sluice_browser_queue_waits_total", 6.0),
        ("sluice_browser_queue_wait_max_seconds", 0.95),
    ] {
        assert_eq!(metric(&gw, series).await, value, "{series}");
    }

    // The third batch of this address is malformed: 400, and its token is spent.
    let r = post_with(&endpoint, "{\"v\":1,", &from("198.51.100.1")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    // Flooded: 429 with Retry-After (about an hour) and a JSON reason.
    let r = post_with(&endpoint, BATCH, &from("198.51.100.1")).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((3500..=3600).contains(&retry), "retry-after {retry}");
    assert_eq!(r.json()["reason"], "limit");
    // Another address has its own allowance.
    let other = from("203.0.113.7");
    let version = BATCH.replace("\"v\":1", "\"v\":2");
    let r = post_with(&endpoint, &version, &other).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(String::from_utf8_lossy(&r.body).contains("version 2"));
    let padded = BATCH.replace(
        "\"v\":1",
        &format!("\"pad\":\"{}\",\"v\":1", "x".repeat(1100)),
    );
    let r = post_with(&endpoint, &padded, &other).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    let r = get_with(&endpoint, &other).await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.header("allow"), Some("POST"));
    for (reason, n) in [
        ("malformed", 2.0),
        ("too_large", 1.0),
        ("limit", 1.0),
        ("method", 1.0),
    ] {
        let series = format!("sluice_browser_telemetry_refused_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&gw, &series).await, n, "{series}");
    }
    assert_eq!(
        metric(&gw, "sluice_browser_telemetry_batches_total").await,
        2.0
    );
    assert_eq!(up.count(), 0, "telemetry never reaches the upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_1_kib_is_refused_before_it_is_read_or_while_it_is() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), "[browser]")).await;
    let endpoint = gw.url("/v1/telemetry");
    // Declared too large: refused on the header alone.
    let r = post_with(&endpoint, &"x".repeat(1025), &[]).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Chunked, length unknown: refused once 1 KiB has been read.
    let chunks: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = (0..8)
        .map(|_| Ok(hyper::body::Frame::data(Bytes::from(vec![b' '; 200]))))
        .collect();
    let body = http_body_util::StreamBody::new(futures_util::stream::iter(chunks));
    let req = Request::post(&endpoint).body(body).unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http();
    let r = client.request(req).await.unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    // Exactly 1 KiB of whitespace is read whole, and is not a batch.
    let r = post_with(&endpoint, &" ".repeat(1024), &[]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_browser_the_paths_are_routed_and_a_reload_adds_them() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), "")).await;
    let r = get(&gw.url("/sluice/sw.js")).await.unwrap();
    assert_eq!(r.json()["path"], "/sluice/sw.js", "proxied to the upstream");
    let r = post(&gw.url("/v1/telemetry"), BATCH).await;
    assert_eq!(r.json()["path"], "/v1/telemetry");
    assert_eq!(up.count(), 2);

    gw.rewrite(
        "",
        &config(&up.url(), "[browser]\ncapacity = 20\ntelemetry = false"),
    );
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    let served = loop {
        let r = get(&gw.url("/sluice/config.json")).await.unwrap();
        if r.header("content-type") == Some("application/json") {
            break r.json();
        }
        assert!(Instant::now() < deadline, "not reloaded: {}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(served["capacity"], 20);
    assert_eq!(served["rate"], "1/s");
    assert_eq!(served["telemetry"], Value::Null);
    // Telemetry off: its endpoint is an ordinary path again.
    let r = post(&gw.url("/v1/telemetry"), BATCH).await;
    assert_eq!(r.json()["path"], "/v1/telemetry");
}

#[test]
fn check_config_names_every_bad_browser_key_with_its_line() {
    let dir = TempDir::new();
    let path = dir.0.join("browser.toml");
    std::fs::write(
        &path,
        r#"[[route]]
path_prefix = "/"
upstream = "http://127.0.0.1:9000"

[browser]
path_prefixes = ["api/"]
capacity = 0
rate = "5 per fortnight"
queue = { depth = 100, max_wait = "ten seconds" }
persist = "yes"
telemetry = { interval = "100ms", sample = 2.0 }
colour = "blue"
fail = "sometimes"
"#,
    )
    .unwrap();
    let stderr = check_config_refuses(&path);
    let file = path.display().to_string();
    for (line, field) in [
        (6, "browser.path_prefixes"),
        (7, "browser.capacity"),
        (8, "browser.rate"),
        (9, "browser.queue.max_wait"),
        (10, "browser.persist"),
        (11, "browser.telemetry.interval"),
        (11, "browser.telemetry.sample"),
        (12, "browser.colour"),
        (13, "browser.fail"),
    ] {
        let head = format!("{file}:{line}:");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&head) && l.contains(&format!(" {field}: "))),
            "no {head} {field} in\n{stderr}"
        );
    }
    assert!(
        stderr.contains("`sometimes` is not a failure mode"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 9, "{stderr}");

    // The same table, fixed, is valid; and `serve` refuses the broken one with exit 2.
    let good = dir.0.join("good.toml");
    std::fs::write(
        &good,
        format!("[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9000\"\n{BROWSER}"),
    )
    .unwrap();
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("browser.capacity"));
}
