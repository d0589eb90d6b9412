//! `shadow = true`: a policy that decides, counts, logs and sends headers as usual, and never
//! denies or queues. The real binary, real sockets.

mod common;

use bytes::Bytes;
use common::{client, get, send, Gateway, Upstream};
use http::Request;
use http_body_util::Full;

/// 105 requests against a capacity of 5 (1 per minute refills nothing meanwhile): every one
/// is proxied, at once though the policy has a queue, and the metric counts exactly the 100
/// the policy would have denied; the headers show the real bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_proxies_everything_and_counts_the_would_be_denials() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "",
        &format!(
            r#"
[[policy]]
name = "trial"
capacity = 5
rate = "1/min"
key = "ip"
shadow = true
queue = {{ depth = 100, max_wait = "30s" }}

[[route]]
path_prefix = "/api/"
policies = ["trial"]
upstream = "{}"
"#,
            up.url()
        ),
    )
    .await;
    let started = std::time::Instant::now();
    for i in 0..105u64 {
        let r = get(&gw.url("/api/x")).await.unwrap();
        assert_eq!(r.status, 200, "request {i}");
        let remaining = 4u64.saturating_sub(i);
        let value = r.header("ratelimit").unwrap_or_default().to_owned();
        assert!(
            value.starts_with(&format!("\"trial\";r={remaining};t=")),
            "request {i}: {value}"
        );
        assert_eq!(r.header("ratelimit-policy"), Some("\"trial\";q=5;w=300"));
        assert!(r.header("retry-after").is_none());
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "no request waited in the queue"
    );
    assert_eq!(up.count(), 105);
    let text = String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    };
    assert_eq!(value("sluice_shadow_denied_total{policy=\"trial\"}"), 100.0);
    assert_eq!(
        value("sluice_policy_admitted_total{policy=\"trial\",protocol=\"http1\"}"),
        5.0
    );
    assert!(text.contains("# HELP sluice_shadow_denied_total"), "{text}");
    assert_eq!(
        value("sluice_policy_denied_total{policy=\"trial\",reason=\"limit\",protocol=\"http1\"}"),
        0.0
    );
    let log = gw.log_text();
    let shadowed = log
        .lines()
        .filter(|l| {
            l.contains("decision=shadow-denied")
                && l.contains("policy=\"trial\"")
                && l.contains("reason=\"limit\"")
                && l.contains("status=200")
        })
        .count();
    assert_eq!(shadowed, 100, "{log}");
    assert_eq!(log.matches("decision=admitted").count(), 5);
}

/// A gRPC-Web call a shadow policy would have denied is the upstream's answer, headers and
/// all: the gateway's gRPC-Web content type belongs on its own refusals only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_denied_grpc_web_call_keeps_the_upstreams_headers() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "",
        &format!(
            r#"
[[policy]]
name = "trial"
capacity = 1
rate = "1/min"
key = "ip"
shadow = true

[[route]]
path_prefix = "/"
policies = ["trial"]
upstream = "{}"
"#,
            up.url()
        ),
    )
    .await;
    let c = client();
    for i in 0..2 {
        let r = send(
            &c,
            Request::post(gw.url("/test.Echo/Unary"))
                .header("content-type", "application/grpc-web+proto")
                .body(Full::new(Bytes::from_static(b"\0\0\0\0\x05hello")))
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, 200, "call {i}: {r:?}");
        assert!(r.header("x-upstream-seq").is_some(), "call {i}: {r:?}");
        // The upstream sends no content type; the gateway adds none.
        assert_eq!(r.header("content-type"), None, "call {i}: {r:?}");
    }
    assert_eq!(up.count(), 2);
}
