//! `/dashboard` and its data, `/v1/stats`, on the admin listener of the real binary.
//! The figures agree with /metrics; keys that may be secrets are masked; the page loads
//! nothing from elsewhere. (web/tests/dashboard.test.mjs opens it in a browser under load.)

mod common;

use bytes::Bytes;
use common::{client, get, get_with, send, Answer, Gateway, Upstream};
use http::Request;
use http_body_util::Full;
use serde_json::Value;

fn config(upstream: &str) -> String {
    format!(
        r#"
[[policy]]
name = "per-key"
algorithm = "token_bucket"
capacity = 3
rate = "1/min"
key = "header:X-Api-Key"

[[policy]]
name = "everyone"
algorithm = "gcra"
capacity = 100
rate = "100/min" # slow enough that its 5 admissions still show when /v1/stats is read on a loaded machine
key = "global"
concurrency = 4
queue = {{ depth = 10, max_wait = "1s" }}

[[route]]
path_prefix = "/api/"
policies = ["per-key", "everyone"]
upstream = "{upstream}"

[[route]]
path_prefix = "/"
upstream = "{upstream}"
"#
    )
}

async fn admin(gw: &Gateway, method: &str, path: &str, body: &str) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(gw.admin(path))
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(&client(), req).await.unwrap()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_agree_with_metrics_and_mask_secret_keys() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &config(&upstream.url())).await;
    let secret = "sk-live-7f3a9c1e55d2";
    for _ in 0..5 {
        get_with(&gw.url("/api/a"), &[("x-api-key", secret)]).await;
    }
    for _ in 0..2 {
        get_with(&gw.url("/api/b"), &[("x-api-key", "k2")]).await;
    }
    get(&gw.url("/free")).await.unwrap();

    let answer = get(&gw.admin("/v1/stats")).await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let stats: Value = answer.json();
    let text = String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap();
    assert_eq!(stats["v"], 1);
    assert!(stats["now_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert!(stats["config"].as_str().unwrap().ends_with("sluice.toml"));

    let policies = stats["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 2);
    let per_key = &policies[0];
    assert_eq!(per_key["name"], "per-key");
    assert_eq!(per_key["algorithm"], "token_bucket");
    assert_eq!(per_key["capacity"], 3);
    assert_eq!(per_key["rate"], "1/min");
    assert_eq!(per_key["key"], "header:x-api-key");
    assert_eq!(per_key["store"], "memory");
    assert_eq!(per_key["queue"], Value::Null);
    // 3 + 2 admitted, 2 denied; the same as /metrics says.
    assert_eq!(per_key["admitted"], 5.0);
    assert_eq!(per_key["denied"]["limit"], 2.0);
    assert_eq!(
        per_key["admitted"].as_f64(),
        Some(metric(
            &text,
            "sluice_policy_admitted_total{policy=\"per-key\",protocol=\"http1\"}"
        ))
    );
    assert_eq!(
        per_key["denied"]["limit"].as_f64(),
        Some(metric(
            &text,
            "sluice_policy_denied_total{policy=\"per-key\",reason=\"limit\",protocol=\"http1\"}"
        ))
    );
    // The hottest keys: the secret one is empty, and masked.
    let hottest = per_key["hottest"].as_array().unwrap();
    assert_eq!(hottest.len(), 2, "{hottest:?}");
    let first = &hottest[0];
    let shown = first["key"].as_str().unwrap();
    assert!(shown.starts_with("sk-l…#"), "{shown}");
    assert!(!shown.contains("7f3a") && !stats.to_string().contains(secret));
    assert_eq!(first["remaining"], 0);
    assert_eq!(first["limit"], 3);
    assert!(first["level"].as_f64().unwrap() < 0.01);
    assert!(first["reset_after_ms"].as_u64().unwrap() > 170_000);
    let second = &hottest[1];
    assert_eq!(second["remaining"], 1);
    assert!(second["key"].as_str().unwrap().starts_with("…#"));

    let everyone = &policies[1];
    assert_eq!(everyone["name"], "everyone");
    assert_eq!(everyone["admitted"], 5.0, "denied requests never reach it");
    assert_eq!(everyone["concurrency"], 4);
    assert_eq!(everyone["in_flight"], 0);
    assert_eq!(everyone["waiting"], 0.0);
    assert_eq!(everyone["queue"]["depth"], 10);
    assert_eq!(everyone["hottest"][0]["key"], "(global)");

    let routes = stats["routes"].as_array().unwrap();
    assert_eq!(routes[0]["route"], "/api/");
    assert_eq!(routes[0]["responses"]["2xx"], 5.0);
    assert_eq!(
        routes[0]["policies"],
        serde_json::json!(["per-key", "everyone"])
    );
    assert_eq!(routes[1]["route"], "/");
    assert_eq!(routes[1]["responses"]["2xx"], 1.0);
    assert_eq!(stats["browser"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_with_a_quota_of_their_own_are_listed_masked_with_it() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &config(&upstream.url())).await;
    let secret = "sk-live-7f3a9c1e55d2";
    let path = format!("/v1/policies/per-key/keys/{secret}");
    let set = admin(&gw, "PUT", &path, r#"{"capacity": 7, "rate": "2/min"}"#).await;
    assert_eq!(set.status, 200, "{set:?}");
    get_with(&gw.url("/api/a"), &[("x-api-key", secret)]).await;

    let stats: Value = get(&gw.admin("/v1/stats")).await.unwrap().json();
    let per_key = &stats["policies"][0];
    assert_eq!(per_key["name"], "per-key");
    let overrides = per_key["overrides"].as_array().unwrap();
    assert_eq!(overrides.len(), 1, "{overrides:?}");
    let own = &overrides[0];
    assert_eq!(own["capacity"], 7);
    // As the admin API lists it, but for the key, masked as the hottest keys are.
    let listed: Value = admin(&gw, "GET", "/v1/policies/per-key/keys", "")
        .await
        .json();
    assert_eq!(own["rate"], listed["overrides"][0]["rate"]);
    assert_eq!(own["capacity"], listed["overrides"][0]["capacity"]);
    let shown = own["key"].as_str().unwrap();
    assert!(shown.starts_with("sk-l…#"), "{shown}");
    assert_eq!(own["key"], per_key["hottest"][0]["key"]);
    assert!(!stats.to_string().contains(secret));
    assert_eq!(stats["policies"][1]["overrides"], serde_json::json!([]));

    let page = get(&gw.admin("/dashboard")).await.unwrap();
    let html = String::from_utf8(page.body.to_vec()).unwrap();
    assert!(html.contains("'grid overrides'") && html.contains("keys with a quota of their own"));
    assert!(
        html.contains("p.overrides"),
        "the table is filled from /v1/stats"
    );

    assert_eq!(admin(&gw, "DELETE", &path, "").await.status, 200);
    let stats: Value = get(&gw.admin("/v1/stats")).await.unwrap().json();
    assert_eq!(stats["policies"][0]["overrides"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_self_contained() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &config(&upstream.url())).await;
    let page = get(&gw.admin("/dashboard")).await.unwrap();
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = page.header("content-security-policy").unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let html = String::from_utf8(page.body.to_vec()).unwrap();
    assert!(html.starts_with("<!doctype html>"));
    assert!(html.contains("fetch('v1/stats'"));
    for needle in ["http://", "https://", " src=", "<link rel=\"stylesheet\""] {
        assert!(!html.contains(needle), "the page refers to {needle}");
    }
    // The admin listener's other answers are unchanged.
    assert_eq!(get(&gw.admin("/healthz")).await.unwrap().status, 200);
    assert_eq!(get(&gw.admin("/dashboard/x")).await.unwrap().status, 404);
}
