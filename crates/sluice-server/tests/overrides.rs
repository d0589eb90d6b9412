//! Per-key quotas through the admin API, on each store: set, seen by the gateway at once,
//! kept across a reload (memory), a restart (file, Redis), shared by two gateways on one
//! Redis, and removed (the key back to the policy's quota).

mod common;

#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, get_with, send, Answer, Gateway, TempDir, Upstream};
use http::{Request, StatusCode};
use http_body_util::Full;

fn policy(store: &str, upstream: &str) -> String {
    format!(
        r#"
{store}
[[policy]]
name = "api"
algorithm = "gcra"
capacity = 2
rate = "1/h"
key = "header:x-api-key"

[[route]]
path_prefix = "/api/"
policies = ["api"]
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

/// Requests of `key` admitted in a row (at most 20), and the first answer's RateLimit-Policy.
async fn admitted(gw: &Gateway, key: &str) -> (u32, Option<String>) {
    let mut n = 0;
    let mut policy = None;
    for _ in 0..20 {
        let a = get_with(&gw.url("/api/x"), &[("x-api-key", key)]).await;
        if policy.is_none() {
            policy = a.header("ratelimit-policy").map(str::to_owned);
        }
        if a.status != StatusCode::OK {
            assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS, "{a:?}");
            break;
        }
        n += 1;
    }
    (n, policy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_an_override_applies_at_once_survives_a_reload_and_is_removed() {
    let up = Upstream::start().await;
    let text = policy("", &up.url());
    let gw = Gateway::start("", &text).await;

    let a = admin(
        &gw,
        "PUT",
        "/v1/policies/api/keys/vip",
        r#"{"capacity": 5}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    assert_eq!(a.json()["override"]["capacity"], 5);
    // Two spent under the override, then a reload, then the rest: 5 in all.
    for _ in 0..2 {
        assert_eq!(
            get_with(&gw.url("/api/x"), &[("x-api-key", "vip")])
                .await
                .status,
            200
        );
    }
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(5))
        .await;
    let (n, header) = admitted(&gw, "vip").await;
    assert_eq!(n, 3, "the override and the key's state survived the reload");
    assert_eq!(header.as_deref(), Some("\"api\";q=5;w=18000"));
    // Another key keeps the policy's quota.
    assert_eq!(admitted(&gw, "other").await.0, 2);

    let list = admin(&gw, "GET", "/v1/policies/api/keys", "").await.json();
    assert_eq!(list["overrides"].as_array().unwrap().len(), 1);
    assert_eq!(list["overrides"][0]["capacity"], 5);
    let one = admin(&gw, "GET", "/v1/policies/api/keys/vip", "")
        .await
        .json();
    assert_eq!(one["quota"]["source"], "override");
    assert_eq!(one["state"]["remaining"], 0);

    // Removed: the key is converted back to capacity 2 (it had nothing left: still nothing).
    let a = admin(&gw, "DELETE", "/v1/policies/api/keys/vip", "").await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    let one = admin(&gw, "GET", "/v1/policies/api/keys/vip", "")
        .await
        .json();
    assert_eq!(one["override"], serde_json::Value::Null);
    assert_eq!(one["quota"]["capacity"], 2);
    let (n, header) = admitted(&gw, "fresh-after-delete").await;
    assert_eq!((n, header.as_deref()), (2, Some("\"api\";q=2;w=7200")));
    assert_eq!(
        admitted(&gw, "vip").await.0,
        0,
        "removing gave no tokens back"
    );
    assert_eq!(
        admin(&gw, "DELETE", "/v1/policies/api/keys/vip", "")
            .await
            .status,
        404
    );

    // Errors.
    let a = admin(&gw, "PUT", "/v1/policies/api/keys/k", r#"{"capacity": 0}"#).await;
    assert_eq!(a.status, 400);
    assert!(String::from_utf8_lossy(&a.body)
        .contains("capacity: expected a whole number of at least 1, got 0"));
    let a = admin(&gw, "PUT", "/v1/policies/nope/keys/k", r#"{"capacity": 3}"#).await;
    assert_eq!(a.status, 404);
    let a = admin(&gw, "PUT", "/v1/policies/api/keys/k", r#"{"rate": "fast"}"#).await;
    assert_eq!(a.status, 400, "{a:?}");
    assert!(String::from_utf8_lossy(&a.body).contains("rate: `fast`"));
    // Its window (capacity x interval) does not fit: a quota that cannot be built.
    let a = admin(
        &gw,
        "PUT",
        "/v1/policies/api/keys/k",
        r#"{"capacity": 18446744073709551615, "rate": "1/h"}"#,
    )
    .await;
    assert_eq!(a.status, 422, "{a:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_an_override_and_its_state_survive_a_restart() {
    let up = Upstream::start().await;
    let dir = TempDir::new();
    let store = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\n",
        dir.0.join("state").display()
    );
    let text = policy(&store, &up.url());
    let mut gw = Gateway::start("", &text).await;
    let a = admin(
        &gw,
        "PUT",
        "/v1/policies/api/keys/vip",
        r#"{"capacity": 6}"#,
    )
    .await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    for _ in 0..4 {
        assert_eq!(
            get_with(&gw.url("/api/x"), &[("x-api-key", "vip")])
                .await
                .status,
            200
        );
    }
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(10)).await.success());
    let saved = std::fs::read_to_string(dir.0.join("state.api")).unwrap();
    assert!(saved.contains("\"overrides\":[{"), "{saved}");
    drop(gw);
    let gw = Gateway::start("", &text).await;
    let (n, header) = admitted(&gw, "vip").await;
    assert_eq!(n, 2, "6 - 4 spent before the restart");
    assert_eq!(header.as_deref(), Some("\"api\";q=6;w=21600"));
    let list = admin(&gw, "GET", "/v1/policies/api/keys", "").await.json();
    assert_eq!(list["overrides"][0]["capacity"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_override_set_on_one_gateway_is_seen_by_another_and_outlives_both() {
    let redis = redis_support::RedisServer::start().expect("redis-server is installed");
    let up = Upstream::start().await;
    let store = format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\n", redis.url());
    let text = policy(&store, &up.url());
    let a = Gateway::start("", &text).await;
    let b = Gateway::start("", &text).await;
    for gw in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(5);
        while common::get(&gw.url("/api/warm")).await.unwrap().status == 503 {
            assert!(Instant::now() < deadline, "gateway never reached Redis");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let r = admin(
        &a,
        "PUT",
        "/v1/policies/api/keys/vip",
        r#"{"capacity": 7, "rate": "1/h"}"#,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    // B reads the overrides every second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let listed = admin(&b, "GET", "/v1/policies/api/keys", "").await.json();
    assert_eq!(listed["overrides"][0]["capacity"], 7);
    // Spent across both: 3 on A, the rest on B.
    for _ in 0..3 {
        assert_eq!(
            get_with(&a.url("/api/x"), &[("x-api-key", "vip")])
                .await
                .status,
            200
        );
    }
    let (n, header) = admitted(&b, "vip").await;
    assert_eq!(n, 4, "one bucket of 7 shared by both gateways");
    assert_eq!(header.as_deref(), Some("\"api\";q=7;w=25200"));
    drop(a);
    drop(b);
    // A new gateway finds the override (and the spent key) in Redis.
    let c = Gateway::start("", &text).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let one = admin(&c, "GET", "/v1/policies/api/keys/vip", "")
        .await
        .json();
    assert_eq!(one["override"]["capacity"], 7, "{one}");
    assert_eq!(one["state"]["remaining"], 0, "{one}");
    // Deleted: another key, and this one after its debt, follow the policy's 2.
    let r = admin(&c, "DELETE", "/v1/policies/api/keys/vip", "").await;
    assert_eq!(r.status, StatusCode::OK, "{r:?}");
    assert_eq!(
        admitted(&c, "vip").await.0,
        0,
        "removing gave no tokens back"
    );
    let one = admin(&c, "GET", "/v1/policies/api/keys/vip", "")
        .await
        .json();
    assert_eq!(one["quota"]["capacity"], 2, "{one}");
}
