//! Settled cost against real upstreams on loopback: a policy reserves an estimate, the
//! gateway reads the real cost as the response streams through (a JSON `usage`, the last
//! server-sent event's `usage`, a trailer, a header, the bytes), and the key ends up charged
//! exactly what the upstream reported, on the memory, file and Redis stores; a client that
//! goes away mid-stream is charged the report it saw or the estimate; a body of 100 MiB
//! streams through in bounded memory; the decision API settles too.

mod common;
#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::llm::{llm_upstream, Chan};
use common::{client, Gateway};
use http::Request;
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioExecutor;
use tokio::sync::mpsc;

const CAPACITY: u64 = 10_000;
const RESERVE: u64 = 1_000;

fn config(upstream: &str, store: &str) -> String {
    let route = |prefix: &str, policy: &str, scheme: &str| {
        format!(
            "[[route]]\npath_prefix = \"{prefix}\"\npolicies = [\"{policy}\"]\nupstream = \"{scheme}://{upstream}\"\n"
        )
    };
    let policy = |name: &str, cost: &str| {
        format!(
            "[[policy]]\nname = \"{name}\"\nalgorithm = \"gcra\"\ncapacity = {CAPACITY}\nrate = \"{CAPACITY}/day\"\nkey = \"header:x-api-key\"\ncost = {cost}\n"
        )
    };
    [
        store.to_owned(),
        policy(
            "llm",
            &format!("{{ reserve = {RESERVE}, settle = \"openai\" }}"),
        ),
        policy(
            "trailered",
            &format!("{{ reserve = {RESERVE}, settle = \"trailer:x-usage\" }}"),
        ),
        policy(
            "headed",
            &format!("{{ reserve = {RESERVE}, settle = \"header:x-usage\" }}"),
        ),
        policy(
            "uploads",
            &format!("{{ reserve = {RESERVE}, request = \"body_bytes\" }}"),
        ),
        policy("bytes", "{ reserve = 1, settle = \"response_bytes\" }"),
        policy("priced", "{ reserve = 10, request = \"header:x-cost\" }"),
        route("/v1/", "llm", "http"),
        route("/h2/", "llm", "h2c"),
        route("/trailer/", "trailered", "http"),
        route("/h2trailer/", "trailered", "h2c"),
        route("/header/", "headed", "http"),
        route("/upload/", "uploads", "http"),
        route("/download/", "bytes", "http"),
        route("/priced/", "priced", "http"),
    ]
    .join("\n")
}

/// `key`'s tokens left in `policy`, from the decision API (a query: cost 0).
async fn remaining(gw: &Gateway, policy: &str, key: &str) -> u64 {
    let body = format!(r#"{{"policy":"{policy}","key":"{key}","cost":0}}"#);
    let answer = common::post(&gw.admin("/v1/check"), &body).await;
    answer.json()["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("{answer:?}"))
}

/// Waits until `key` has `want` tokens left (a settlement runs once the body is dropped),
/// then checks it stays there.
async fn settles_to(gw: &Gateway, policy: &str, key: &str, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut seen = remaining(gw, policy, key).await;
    while seen != want && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        seen = remaining(gw, policy, key).await;
    }
    assert_eq!(seen, want, "{policy}/{key}: {}", gw.log_text());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        remaining(gw, policy, key).await,
        want,
        "{policy}/{key} moved"
    );
}

async fn call(gw: &Gateway, path: &str, key: &str) -> common::Answer {
    let req = Request::get(gw.url(path))
        .header("x-api-key", key)
        .header("te", "trailers")
        .body(Full::new(Bytes::new()))
        .unwrap();
    common::send(&client(), req).await.unwrap()
}

/// JSON, server-sent events (HTTP/1.1 and h2c), a header, a trailer (h2c and chunked
/// HTTP/1.1), an upstream that reports nothing: each key ends up charged what was reported,
/// or the estimate.
async fn each_source_settles(store: &str, tag: &str) {
    let upstream = llm_upstream().await;
    let gw = Gateway::start("", &config(&upstream, store)).await;
    let cases: [(&str, &str, u64, u64); 9] = [
        // (policy, path, tokens reported, tokens the key ends up charged)
        ("llm", "/v1/chat?kind=json&tokens=300", 300, 300),
        ("llm", "/v1/chat?kind=json&tokens=2500", 2500, 2500),
        ("llm", "/v1/chat?kind=sse&tokens=1234&chunks=20", 1234, 1234),
        ("llm", "/h2/chat?kind=sse&tokens=77", 77, 77),
        ("llm", "/h2/chat?kind=json&tokens=4321", 4321, 4321),
        ("llm", "/v1/chat?kind=silent", 0, RESERVE),
        ("headed", "/header/x?kind=header&tokens=42", 42, 42),
        (
            "trailered",
            "/h2trailer/x?kind=trailer&tokens=5000",
            5000,
            5000,
        ),
        ("trailered", "/trailer/x?kind=trailer&tokens=123", 123, 123),
    ];
    for (i, (policy, path, reported, charged)) in cases.into_iter().enumerate() {
        let key = format!("{tag}-key-{i}");
        let answer = call(&gw, path, &key).await;
        assert_eq!(answer.status, 200, "{path}: {answer:?}");
        if path.contains("kind=json") && reported > 0 {
            assert!(
                String::from_utf8_lossy(&answer.body)
                    .contains(&format!("\"total_tokens\":{reported}")),
                "the body went through unchanged"
            );
        }
        settles_to(&gw, policy, &key, CAPACITY - charged).await;
        println!("{tag}: {path}: reported {reported}, charged {charged}");
    }
    // A report beyond what is left is charged whole: the key owes 2,000 tokens beyond empty,
    // and its next request waits for the refill that pays them and its own reserve.
    let key = format!("{tag}-heavy");
    call(&gw, "/v1/chat?kind=json&tokens=12000", &key).await;
    settles_to(&gw, "llm", &key, 0).await;
    let refused = call(&gw, "/v1/chat?kind=json&tokens=1", &key).await;
    assert_eq!(refused.status, 429, "a key in debt waits for the refill");
    // 10,000 a day: a token every 8.64 s, so 3,000 tokens (the debt and the reserve) take
    // 25,920 s.
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (25_919..=25_921).contains(&retry),
        "Retry-After {retry} s covers the debt of 2,000 tokens and the reserve of 1,000"
    );
    // `/v1/explain` shows the debt and when the refill has paid it (2,000 × 8.64 s).
    let explained = common::post(
        &gw.admin("/v1/explain"),
        &format!(r#"{{"path": "/v1/chat", "headers": {{"x-api-key": "{key}"}}}}"#),
    )
    .await;
    let json = explained.json();
    let state = &json["policies"][0]["state"];
    assert_eq!(state["owed"], 2000, "{json}");
    let paid_in = state["paid_in_ms"].as_u64().unwrap();
    assert!(
        paid_in.abs_diff(2000 * 8_640) <= 2 * 8_640,
        "paid in {paid_in} ms"
    );
    assert_eq!(json["status"], 429, "{json}");
    let series = |labels: &str| format!("sluice_settled{labels}");
    let forgiven = common::metric(
        &gw,
        &series("_cost_total{policy=\"llm\",direction=\"forgiven\"}"),
    )
    .await;
    let reported = common::metric(&gw, &series("_total{policy=\"llm\",source=\"reported\"}")).await;
    let estimate = common::metric(&gw, &series("_total{policy=\"llm\",source=\"estimate\"}")).await;
    println!(
        "{tag}: settled with a report {reported}, with the estimate {estimate}, forgiven {forgiven}"
    );
    assert_eq!((reported, estimate, forgiven), (6.0, 1.0, 0.0));
    // The requests to `http://` upstreams were served as bytes, their answers metered as
    // they were relayed: the JSON, event-stream, silent, header and trailer cases, and the
    // heavy key's two.
    let bytes = common::metric(&gw, "sluice_byte_path_requests_total").await;
    assert!(bytes >= 8.0, "{bytes} requests served on the byte path");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_settles_on_the_memory_store() {
    each_source_settles("", "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_settles_on_the_file_store() {
    let dir = common::TempDir::new();
    // The default `max_loss` (100 ms) refuses admissions with 503 whenever the writer runs
    // more than 50 ms late, as it may on a loaded test machine; settlement is what is tested.
    let store = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\nmax_loss = \"2s\"\n",
        dir.0.join("state.bin").display()
    );
    each_source_settles(&store, "file").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_source_settles_on_the_redis_store() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    each_source_settles(&store, "redis").await;
}

/// Reads `path` as `key` until the body holds `until` (or ends), then drops the connection:
/// a client gone mid-stream.
async fn read_then_leave(gw: &Gateway, path: &str, key: &str, until: &str) {
    let req = Request::get(gw.url(path))
        .header("x-api-key", key)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client().request(req).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !String::from_utf8_lossy(&seen).contains(until) {
        assert!(Instant::now() < deadline, "never saw {until:?}");
        match tokio::time::timeout(Duration::from_secs(5), body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    seen.extend_from_slice(data);
                }
            }
            other => panic!("the stream ended early: {other:?}"),
        }
    }
    drop(body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_is_charged_the_report_it_saw_or_the_estimate() {
    let upstream = llm_upstream().await;
    let gw = Gateway::start("", &config(&upstream, "")).await;
    // The usage event came, then the client left before `[DONE]`: charged the report.
    read_then_leave(
        &gw,
        "/v1/chat?kind=sse&tokens=2222&stall=after",
        "reported",
        "total_tokens",
    )
    .await;
    settles_to(&gw, "llm", "reported", CAPACITY - 2222).await;
    // It left before any usage: the estimate stands.
    read_then_leave(
        &gw,
        "/v1/chat?kind=sse&stall=before&chunks=5",
        "unreported",
        "word 4",
    )
    .await;
    settles_to(&gw, "llm", "unreported", CAPACITY - RESERVE).await;
    // The same over HTTP/2 to the upstream.
    read_then_leave(
        &gw,
        "/h2/chat?kind=sse&tokens=3333&stall=after",
        "reported-h2",
        "total_tokens",
    )
    .await;
    settles_to(&gw, "llm", "reported-h2", CAPACITY - 3333).await;
}

/// Resident memory of a process, in KiB, from `/proc`.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_100_mib_goes_through_in_bounded_memory_and_settles() {
    let upstream = llm_upstream().await;
    let gw = Gateway::start("", &config(&upstream, "")).await;
    // Warm the gateway up (its pools, its first allocations) before the baseline.
    call(&gw, "/v1/chat?kind=json&tokens=1", "warm").await;
    let pid = gw.child.id();
    let before = rss_kib(pid);
    let req = Request::get(gw.url("/v1/chat?kind=big&mib=100&tokens=4096"))
        .header("x-api-key", "big")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let started = Instant::now();
    let response = client().request(req).await.unwrap();
    let mut body = response.into_body();
    let (mut bytes, mut peak) = (0usize, before);
    let mut last_sample = Instant::now();
    let mut tail = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.unwrap().data_ref() {
            bytes += data.len();
            tail = data.to_vec();
        }
        if last_sample.elapsed() > Duration::from_millis(20) {
            peak = peak.max(rss_kib(pid));
            last_sample = Instant::now();
        }
    }
    peak = peak.max(rss_kib(pid));
    println!(
        "{} MiB in {:?}; gateway RSS {} KiB before, {} KiB at most (+{} KiB)",
        bytes >> 20,
        started.elapsed(),
        before,
        peak,
        peak - before
    );
    assert!(bytes >= 100 << 20);
    assert!(String::from_utf8_lossy(&tail).contains("[DONE]"));
    assert!(
        peak - before < 16 * 1024,
        "the gateway grew by {} KiB streaming 100 MiB",
        peak - before
    );
    settles_to(&gw, "llm", "big", CAPACITY - 4096).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_side_costs_and_bytes_sent() {
    let upstream = llm_upstream().await;
    let gw = Gateway::start("", &config(&upstream, "")).await;
    let upload = |key: &'static str, body: Vec<u8>, chunked: bool| {
        let url = gw.url("/upload/x?kind=echo");
        async move {
            let builder = Request::post(url).header("x-api-key", key);
            if chunked {
                // A body of unknown length: the estimate first, the bytes read settled.
                let (tx, rx) = mpsc::channel(4);
                let req = builder.body(Chan(rx)).unwrap();
                let send = tokio::spawn(async move {
                    for piece in body.chunks(1000) {
                        tx.send(Frame::data(Bytes::copy_from_slice(piece)))
                            .await
                            .unwrap();
                    }
                });
                let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                    .build_http::<Chan>();
                let response = client.request(req).await.unwrap();
                send.await.unwrap();
                let status = response.status();
                let _ = response.into_body().collect().await;
                status
            } else {
                let req = builder.body(Full::new(Bytes::from(body))).unwrap();
                common::send(&client(), req).await.unwrap().status
            }
        }
    };
    assert_eq!(upload("sized", vec![b'a'; 2_500], false).await, 200);
    settles_to(&gw, "uploads", "sized", CAPACITY - 2_500).await;
    assert_eq!(upload("chunked", vec![b'a'; 3_700], true).await, 200);
    settles_to(&gw, "uploads", "chunked", CAPACITY - 3_700).await;
    // A declared length above the capacity can never be admitted.
    assert_eq!(upload("huge", vec![b'a'; 10_001], false).await, 422);
    // The bytes of a download.
    let answer = call(&gw, "/download/x?kind=json&tokens=5", "dl").await;
    settles_to(&gw, "bytes", "dl", CAPACITY - answer.body.len() as u64).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_api_settles_after_a_check() {
    let upstream = llm_upstream().await;
    let gw = Gateway::start("", &config(&upstream, "")).await;
    let check = common::post(
        &gw.admin("/v1/check"),
        r#"{"policy":"llm","key":"api","cost":1000}"#,
    )
    .await;
    assert_eq!(check.status, 200);
    assert_eq!(check.json()["remaining"], CAPACITY - 1000);
    let settle = |body: &'static str| {
        let url = gw.admin("/v1/settle");
        async move { common::post(&url, body).await }
    };
    let refunded =
        settle(r#"{"policy":"llm","key":"api","reserved":1000,"actual":250,"elapsed_ms":5}"#).await;
    assert_eq!(refunded.status, 200, "{refunded:?}");
    let json = refunded.json();
    println!("{json}");
    assert_eq!(
        (
            &json["refunded"],
            &json["charged"],
            &json["forgiven"],
            &json["remaining"]
        ),
        (&750.into(), &0.into(), &0.into(), &(CAPACITY - 250).into())
    );
    // 20,000 reported against a reserve of 1 with 9,750 left: all of it is charged, and the
    // key owes 10,249 tokens beyond empty, paid in 10,249 × 8.64 s.
    let charged = settle(r#"{"policy":"llm","key":"api","reserved":1,"actual":20000}"#).await;
    let json = charged.json();
    println!("{json}");
    assert_eq!(
        (
            &json["charged"],
            &json["forgiven"],
            &json["owed"],
            &json["remaining"]
        ),
        (&19_999.into(), &0.into(), &10_249.into(), &0.into())
    );
    let paid_in = json["paid_in_ms"].as_u64().unwrap();
    assert!(
        paid_in.abs_diff(10_249 * 8_640) <= 9,
        "paid in {paid_in} ms"
    );
    let unknown = settle(r#"{"policy":"nope","key":"k","actual":1}"#).await;
    assert_eq!(unknown.status, 404);
    let bad = settle(r#"{"policy":"llm","key":"k"}"#).await;
    assert_eq!(bad.status, 400);
    assert!(
        String::from_utf8_lossy(&bad.body).contains("actual"),
        "{bad:?}"
    );
}

/// A cost header counts only from a trusted proxy: a client cannot price its own requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_header_counts_only_from_a_trusted_proxy() {
    let upstream = llm_upstream().await;
    let priced = |gw: &Gateway, key: &'static str| {
        let req = Request::get(gw.url("/priced/x?kind=silent"))
            .header("x-api-key", key)
            .header("x-cost", "400")
            .body(Full::new(Bytes::new()))
            .unwrap();
        async move { common::send(&client(), req).await.unwrap().status }
    };
    let untrusted = Gateway::start("", &config(&upstream, "")).await;
    assert_eq!(priced(&untrusted, "client").await, 200);
    settles_to(&untrusted, "priced", "client", CAPACITY - 10).await;
    let trusted = Gateway::start(
        "trusted_proxies = [\"127.0.0.1/32\"]",
        &config(&upstream, ""),
    )
    .await;
    assert_eq!(priced(&trusted, "proxy").await, 200);
    settles_to(&trusted, "priced", "proxy", CAPACITY - 400).await;
}
