//! `POST /v1/explain`: what the gateway would do with a described request, for each kind of
//! route (proxy, gRPC, WebSocket, browser path, no policy, no route, an ambiguous path), with
//! plans, a per-key quota and a settled cost; and that an explanation consumes nothing.

mod common;

use bytes::Bytes;
use common::{client, closed_port, get_with, send, Answer, Gateway, Upstream};
use http::{Request, StatusCode};
use http_body_util::Full;
use serde_json::{json, Value};

fn config(upstream: &str, grpc_port: u16) -> String {
    format!(
        r#"
[[policy]]
name = "per_ip"
algorithm = "token_bucket"
capacity = 5
rate = "1/min"
key = "ip"

[[policy]]
name = "per_key"
algorithm = "gcra"
capacity = 3
rate = "1/h"
key = "header:x-api-key"

[[policy]]
name = "tiered"
algorithm = "gcra"
capacity = 2
rate = "1/h"
key = "header:x-api-key"
plan = "header:x-plan"
plans = {{ pro = {{ capacity = 5, rate = "2/h" }} }}

[[policy]]
name = "tokens"
algorithm = "gcra"
capacity = 1000
rate = "1000/day"
key = "header:x-api-key"
cost = {{ reserve = 100, settle = "openai" }}

[[policy]]
name = "rpc"
algorithm = "gcra"
capacity = 4
rate = "4/min"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["per_ip", "per_key"]
upstream = "{upstream}"

[[route]]
path_prefix = "/open/"
methods = ["GET"]
upstream = "{upstream}"

[[route]]
path_prefix = "/plans/"
policies = ["tiered"]
upstream = "{upstream}"

[[route]]
path_prefix = "/llm/"
policies = ["tokens"]
upstream = "{upstream}"

[[route]]
path_prefix = "/ws/"
policies = ["per_ip"]
upstream = "{upstream}"

[[route]]
path_prefix = "/test.Echo/"
policies = ["rpc"]
upstream = "h2c://127.0.0.1:{grpc_port}"

[browser]
capacity = 4
"#
    )
}

async fn start() -> (Upstream, Gateway) {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), closed_port())).await;
    (up, gw)
}

async fn admin(gw: &Gateway, method: &str, path: &str, body: &str) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(gw.admin(path))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    send(&client(), req).await.unwrap()
}

async fn explain(gw: &Gateway, body: Value) -> Value {
    let a = admin(gw, "POST", "/v1/explain", &body.to_string()).await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.header("content-type"), Some("application/json"));
    a.json()
}

fn policy<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no policy {name} in {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_route_with_two_policies_and_explaining_consumes_nothing() {
    let (up, gw) = start().await;
    let described = json!({
        "path": "/api/x?y=1",
        "headers": {"x-api-key": "k1"},
        "client_ip": "127.0.0.1",
    });
    for _ in 0..5 {
        let a = explain(&gw, described.clone()).await;
        assert_eq!(a["route"]["path_prefix"], "/api/");
        assert_eq!(a["route"]["kind"], "proxy");
        assert_eq!(a["route"]["upstream"], up.url());
        assert_eq!(a["client_ip"], "127.0.0.1");
        let names: Vec<&str> = a["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["per_ip", "per_key"], "in the order asked");
        let ip = policy(&a, "per_ip");
        assert_eq!(ip["key"], "127.0.0.1");
        assert_eq!(ip["stored_key"], "127.0.0.1");
        assert_eq!(ip["plan"], Value::Null);
        assert_eq!(
            ip["quota"],
            json!({"capacity": 5, "rate": "1/min", "source": "policy"})
        );
        assert_eq!(ip["state"]["remaining"], 5);
        assert_eq!(ip["shadow"], false);
        assert_eq!(ip["decision"], "allowed");
        let key = policy(&a, "per_key");
        assert_eq!(key["key"], "k1");
        assert_eq!(
            key["stored_key"], "k1",
            "a memory store keeps keys as they are"
        );
        assert_eq!(key["quota"]["capacity"], 3);
        assert_eq!(
            key["cost"],
            json!({"reserve": 1, "settled_later": false, "settle": null})
        );
        assert_eq!(key["state"]["remaining"], 3);
        assert_eq!(key["decision"], "allowed");
        assert_eq!(a["decision"], "allowed");
        assert_eq!(a["status"], Value::Null);
        assert!(a["why"]
            .as_str()
            .unwrap()
            .contains("every policy admits it"));
    }
    assert_eq!(up.count(), 0, "explaining sends nothing upstream");

    // The first real request finds every bucket full.
    let r = get_with(&gw.url("/api/x?y=1"), &[("x-api-key", "k1")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let limit = r.header("ratelimit").unwrap();
    assert!(
        limit.contains("\"per_ip\";r=4;") && limit.contains("\"per_key\";r=2;"),
        "{limit}"
    );
    assert_eq!(up.count(), 1);
    let a = explain(&gw, described.clone()).await;
    assert_eq!(policy(&a, "per_ip")["state"]["remaining"], 4);
    assert_eq!(policy(&a, "per_key")["state"]["remaining"], 2);

    // Spend k1, then the explanation says who denies, and when to retry.
    for _ in 0..2 {
        let r = get_with(&gw.url("/api/x"), &[("x-api-key", "k1")]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
    let a = explain(&gw, described.clone()).await;
    let key = policy(&a, "per_key");
    assert_eq!(key["state"]["remaining"], 0);
    assert_eq!(key["decision"], "denied");
    assert_eq!(key["reason"], "limit");
    let retry = key["retry_after_ms"].as_u64().unwrap();
    assert!(
        (3_590_000..=3_600_000).contains(&retry),
        "one token of 1/h: {retry} ms"
    );
    assert_eq!(a["decision"], "denied");
    assert_eq!(a["status"], 429);
    assert_eq!(a["policy"], "per_key");
    assert_eq!(a["reason"], "limit");
    assert!(a["retry_after_ms"].as_u64().unwrap() > 0);
    assert!(a["why"].as_str().unwrap().contains("per_key"), "{a}");
    // The real request agrees, and the explanation took nothing from per_ip.
    let r = get_with(&gw.url("/api/x"), &[("x-api-key", "k1")]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    let real: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!(
        real.abs_diff(retry.div_ceil(1000)) <= 2,
        "{real} s, explained {retry} ms"
    );
    assert_eq!(up.count(), 3);
    let a = explain(&gw, described).await;
    assert_eq!(policy(&a, "per_ip")["state"]["remaining"], 2);

    // Another address, another bucket; trusted nothing, X-Forwarded-For is not believed.
    let a = explain(
        &gw,
        json!({"path": "/api/x", "headers": {"x-api-key": "k2", "x-forwarded-for": "1.2.3.4"}, "client_ip": "10.0.0.1"}),
    )
    .await;
    assert_eq!(a["client_ip"], "10.0.0.1");
    assert_eq!(policy(&a, "per_ip")["key"], "10.0.0.1");
    assert_eq!(policy(&a, "per_ip")["state"]["remaining"], 5);
    assert_eq!(a["decision"], "allowed");

    // A key header sent twice with different values has no key: 400.
    let a = explain(
        &gw,
        json!({"path": "/api/x", "headers": {"x-api-key": ["a", "b"]}}),
    )
    .await;
    let key = policy(&a, "per_key");
    assert_eq!(key["key"], Value::Null);
    assert_eq!(key["decision"], "denied");
    assert_eq!(key["reason"], "ambiguous_key");
    assert_eq!(a["status"], 400);
    assert_eq!(up.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_route() {
    let (_up, gw) = start().await;
    let a = explain(
        &gw,
        json!({"method": "POST", "path": "/test.Echo/Say", "headers": {"content-type": "application/grpc"}}),
    )
    .await;
    assert_eq!(a["route"]["kind"], "grpc");
    assert_eq!(a["route"]["path_prefix"], "/test.Echo/");
    assert!(a["route"]["upstream"]
        .as_str()
        .unwrap()
        .starts_with("h2c://127.0.0.1:"));
    assert_eq!(policy(&a, "rpc")["state"]["remaining"], 4);
    assert_eq!(a["decision"], "allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade() {
    let (up, gw) = start().await;
    let a = explain(
        &gw,
        json!({"path": "/ws/chat", "headers": {
            "upgrade": "websocket",
            "connection": "keep-alive, Upgrade",
            "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
            "sec-websocket-version": "13",
        }}),
    )
    .await;
    assert_eq!(a["route"]["kind"], "websocket");
    assert_eq!(a["route"]["path_prefix"], "/ws/");
    assert_eq!(policy(&a, "per_ip")["decision"], "allowed");
    // The same path without the upgrade is a plain proxied request.
    let a = explain(&gw, json!({"path": "/ws/chat"})).await;
    assert_eq!(a["route"]["kind"], "proxy");
    assert_eq!(up.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_path() {
    let (_up, gw) = start().await;
    let a = explain(&gw, json!({"path": "/sluice/sw.js"})).await;
    assert_eq!(a["route"]["kind"], "browser");
    assert_eq!(a["route"]["path_prefix"], "/sluice/sw.js");
    assert_eq!(a["route"]["upstream"], Value::Null);
    assert_eq!(a["policies"], json!([]));
    assert_eq!(a["decision"], "allowed");
    assert_eq!(a["status"], Value::Null);
    assert!(a["why"].as_str().unwrap().contains("[browser]"));
    // Another path under /sluice/ is no browser file: it goes to the routes (none here).
    let a = explain(&gw, json!({"path": "/sluice/other"})).await;
    assert_eq!(a["route"], Value::Null);
    assert_eq!(a["route_why"], "no_route");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_policy_no_route_and_a_refused_method() {
    let (up, gw) = start().await;
    let a = explain(&gw, json!({"path": "/open/x"})).await;
    assert_eq!(a["route"]["path_prefix"], "/open/");
    assert_eq!(a["policies"], json!([]));
    assert_eq!(a["decision"], "allowed");
    assert!(a["why"].as_str().unwrap().contains("no policy"), "{a}");

    // A body larger than the route accepts is refused before any policy.
    let a = explain(
        &gw,
        json!({"method": "GET", "path": "/api/x", "headers": {"content-length": "2000000"}}),
    )
    .await;
    assert_eq!(a["route"]["path_prefix"], "/api/");
    assert_eq!(a["route_why"], "body_too_large");
    assert_eq!(a["status"], 413);
    assert_eq!(a["policies"], json!([]));

    let a = explain(&gw, json!({"path": "/nowhere"})).await;
    assert_eq!(a["route"], Value::Null);
    assert_eq!(a["route_why"], "no_route");
    assert_eq!(a["decision"], "refused");
    assert_eq!(a["status"], 404);
    assert!(a["why"].as_str().unwrap().contains("/nowhere"));

    let a = explain(&gw, json!({"method": "POST", "path": "/open/x"})).await;
    assert_eq!(a["route"], Value::Null);
    assert_eq!(a["route_why"], "method_not_allowed");
    assert_eq!(a["status"], 405);
    assert_eq!(up.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_path_is_refused_and_a_dotted_one_is_routed_canonical() {
    let (_up, gw) = start().await;
    let a = explain(&gw, json!({"path": "/open/..%2Fapi/x"})).await;
    assert_eq!(a["route"], Value::Null);
    assert_eq!(a["route_why"], "ambiguous_path");
    assert_eq!(a["decision"], "refused");
    assert_eq!(a["status"], 400);
    assert!(a["why"].as_str().unwrap().contains("encoded slash"), "{a}");
    // `/open/%2e%2e/api/x` is `/api/x`: routed there, under /api/'s policies.
    let a = explain(&gw, json!({"path": "/open/%2e%2e/api/x"})).await;
    assert_eq!(a["route"]["path_prefix"], "/api/");
    assert_eq!(a["policies"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_host_fields_are_refused_as_the_gateway_refuses_them() {
    let (_up, gw) = start().await;
    let a = explain(
        &gw,
        json!({"path": "/api/x", "headers": {"host": ["a.test", "b.test"]}}),
    )
    .await;
    assert_eq!(a["route"], Value::Null);
    assert_eq!(a["route_why"], "ambiguous_host");
    assert_eq!(a["status"], 400);
    let a = explain(
        &gw,
        json!({"path": "/api/x", "headers": {"host": "a.test"}}),
    )
    .await;
    assert_eq!(a["route"]["path_prefix"], "/api/");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_and_a_per_key_quota() {
    let (up, gw) = start().await;
    let a = explain(
        &gw,
        json!({"path": "/plans/x", "headers": {"x-api-key": "alice", "x-plan": "pro"}}),
    )
    .await;
    let p = policy(&a, "tiered");
    assert_eq!(p["key"], "alice");
    assert_eq!(p["plan"], "pro");
    assert_eq!(
        p["quota"],
        json!({"capacity": 5, "rate": "2/h", "source": "plan"})
    );
    assert_eq!(p["state"]["remaining"], 5);

    // No plan, or one the policy does not list: the policy's own quota.
    for headers in [
        json!({"x-api-key": "alice"}),
        json!({"x-api-key": "alice", "x-plan": "gold"}),
    ] {
        let a = explain(&gw, json!({"path": "/plans/x", "headers": headers})).await;
        let p = policy(&a, "tiered");
        assert_eq!(p["plan"], Value::Null);
        assert_eq!(p["quota"]["source"], "policy");
        assert_eq!(p["quota"]["capacity"], 2);
    }

    // A key's own quota beats its plan.
    let r = admin(
        &gw,
        "PUT",
        "/v1/policies/tiered/keys/vip",
        r#"{"capacity": 9}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    let described = json!({"path": "/plans/x", "headers": {"x-api-key": "vip", "x-plan": "pro"}});
    for _ in 0..3 {
        let a = explain(&gw, described.clone()).await;
        let p = policy(&a, "tiered");
        assert_eq!(p["quota"]["capacity"], 9);
        assert_eq!(p["quota"]["source"], "override");
        assert_eq!(p["state"]["remaining"], 9);
        assert_eq!(p["decision"], "allowed");
    }
    let r = get_with(
        &gw.url("/plans/x"),
        &[("x-api-key", "vip"), ("x-plan", "pro")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let limit = r.header("ratelimit").unwrap();
    assert!(limit.starts_with("\"tiered\";r=8;"), "{limit}");
    assert_eq!(up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settled_cost() {
    let (up, gw) = start().await;
    let described =
        json!({"method": "POST", "path": "/llm/v1/chat", "headers": {"x-api-key": "team-a"}});
    for _ in 0..4 {
        let a = explain(&gw, described.clone()).await;
        let p = policy(&a, "tokens");
        assert_eq!(
            p["cost"],
            json!({"reserve": 100, "settled_later": true, "settle": "openai"})
        );
        assert_eq!(p["state"]["remaining"], 1000);
        assert_eq!(p["decision"], "allowed");
    }
    let r = send(
        &client(),
        Request::post(gw.url("/llm/v1/chat"))
            .header("x-api-key", "team-a")
            .body(Full::default())
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    let limit = r.header("ratelimit").unwrap();
    assert!(limit.starts_with("\"tokens\";r=900;"), "{limit}");
    assert_eq!(up.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_description_that_is_no_request_is_refused_naming_the_field() {
    let (_up, gw) = start().await;
    let cases = [
        ("{", "malformed JSON"),
        (r#"{"path": "/", "verb": "GET"}"#, "unknown field `verb`"),
        (r#"{"path": "/", "method": "G T"}"#, "method: `G T`"),
        (r#"{"path": "/", "client_ip": "nope"}"#, "client_ip: `nope`"),
        (
            r#"{"path": "/", "headers": {"bad name": "1"}}"#,
            "`bad name`",
        ),
        (r#"{"path": "/", "headers": {"a": "\u0001"}}"#, "of `a`"),
        (r#"{"path": "api"}"#, "path: `api`"),
    ];
    for (body, needle) in cases {
        let a = admin(&gw, "POST", "/v1/explain", body).await;
        assert_eq!(a.status, StatusCode::BAD_REQUEST, "{body}");
        let text = String::from_utf8_lossy(&a.body);
        assert!(text.contains(needle), "{body}: {text}");
    }
}

/// A queue that would admit after a wait, one whose wait is too long, a shadow policy, a
/// concurrency limit whose only slot is held, and keys hashed by a file store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_shadow_concurrency_and_hashed_keys() {
    let up = Upstream::start().await;
    let dir = common::TempDir::new();
    let text = format!(
        r#"
[store]
backend = "file"
path = "{state}"

[[policy]]
name = "queued"
algorithm = "gcra"
capacity = 1
rate = "1/s"
key = "header:x-api-key"
queue = {{ depth = 4, max_wait = "5s" }}

[[policy]]
name = "slow"
algorithm = "gcra"
capacity = 1
rate = "1/min"
key = "global"
queue = {{ depth = 4, max_wait = "2s" }}

[[policy]]
name = "watch"
algorithm = "token_bucket"
capacity = 1
rate = "1/h"
key = "global"
shadow = true

[[policy]]
name = "slots"
algorithm = "gcra"
capacity = 100
rate = "100/s"
key = "global"
concurrency = 1

[[route]]
path_prefix = "/q/"
policies = ["queued"]
upstream = "{upstream}"

[[route]]
path_prefix = "/t/"
policies = ["slow"]
upstream = "{upstream}"

[[route]]
path_prefix = "/s/"
policies = ["watch"]
upstream = "{upstream}"

[[route]]
path_prefix = "/slow/"
policies = ["slots"]
upstream = "{upstream}"
"#,
        state = dir.0.join("state").display(),
        upstream = up.url(),
    );
    let gw = Gateway::start("", &text).await;

    // One token a second: the next request of key `a` waits for it.
    let described = json!({"path": "/q/x", "headers": {"x-api-key": "a"}});
    let a = explain(&gw, described.clone()).await;
    let p = policy(&a, "queued");
    assert_eq!(p["key"], "a");
    let stored = p["stored_key"].as_str().unwrap();
    assert!(
        stored != "a" && stored.len() == 32,
        "a file store keeps header keys hashed: {stored}"
    );
    assert_eq!(p["decision"], "allowed");
    let r = get_with(&gw.url("/q/x"), &[("x-api-key", "a")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let a = explain(&gw, described).await;
    let p = policy(&a, "queued");
    assert_eq!(p["decision"], "would_wait", "{a}");
    let wait = p["wait_ms"].as_u64().unwrap();
    assert!((1..=1_000).contains(&wait), "{wait} ms");
    assert_eq!(p["max_wait_ms"], 5_000);
    assert_eq!(a["decision"], "would_wait");
    assert_eq!(a["policy"], "queued");

    // One token a minute, and at most 2 s of waiting: denied at once.
    assert_eq!(get_with(&gw.url("/t/x"), &[]).await.status, StatusCode::OK);
    let a = explain(&gw, json!({"path": "/t/x"})).await;
    let p = policy(&a, "slow");
    assert_eq!(p["decision"], "denied");
    assert_eq!(p["reason"], "timeout");
    assert!(p["retry_after_ms"].as_u64().unwrap() > 2_000);
    assert_eq!(a["status"], 429);
    assert_eq!(a["reason"], "timeout");

    // A shadow policy would deny, and lets the request go on.
    assert_eq!(get_with(&gw.url("/s/x"), &[]).await.status, StatusCode::OK);
    let a = explain(&gw, json!({"path": "/s/x"})).await;
    let p = policy(&a, "watch");
    assert_eq!(p["shadow"], true);
    assert_eq!(p["decision"], "shadow_denied");
    assert_eq!(a["decision"], "allowed");

    // The only slot is held by a slow request: the next one would be refused.
    let a = explain(&gw, json!({"path": "/slow/1"})).await;
    assert_eq!(policy(&a, "slots")["in_flight"], 0);
    assert_eq!(policy(&a, "slots")["concurrency"], 1);
    let url = gw.url("/slow/1500");
    let held = tokio::spawn(async move { get_with(&url, &[]).await });
    let mut seen = Value::Null;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        seen = explain(&gw, json!({"path": "/slow/1"})).await;
        if policy(&seen, "slots")["in_flight"] == 1 {
            break;
        }
    }
    let p = policy(&seen, "slots");
    assert_eq!(p["in_flight"], 1, "{seen}");
    assert_eq!(p["decision"], "denied");
    assert_eq!(p["reason"], "limit");
    assert_eq!(seen["status"], 429);
    assert_eq!(held.await.unwrap().status, StatusCode::OK);
    let a = explain(&gw, json!({"path": "/slow/1"})).await;
    assert_eq!(policy(&a, "slots")["in_flight"], 0);
    assert_eq!(policy(&a, "slots")["decision"], "allowed");
    assert_eq!(up.count(), 4, "explanations sent nothing upstream");
}
