//! Live quotas: `PUT /v1/policies/NAME` changes a policy at once, under load, in the memory,
//! file and Redis stores, converting each key's state so that none gains tokens; `GET
//! /v1/policies` lists the effective values; a reload goes back to the file's.

mod common;

#[path = "../../sluice/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, get, send, Answer, Gateway, TempDir, Upstream};
use http::Request;
use http_body_util::Full;
use serde_json::Value;

async fn put(gw: &Gateway, path: &str, body: &str, token: Option<&str>) -> Answer {
    let mut req = Request::put(gw.admin(path));
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    send(
        &client(),
        req.body(Full::new(Bytes::from(body.to_owned()))).unwrap(),
    )
    .await
    .unwrap()
}

fn config(upstream: &str, store: &str) -> String {
    format!(
        r#"
{store}

[[policy]]
name = "api"
capacity = 100
rate = "1/min"
key = "global"

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "{upstream}"
"#
    )
}

/// One request of the load: when it was sent, its status and its `RateLimit-Policy`.
type Sent = (Instant, u16, String);

/// Requests from `tasks` clients, back to back, until `stop`.
fn load(
    gw: &Gateway,
    tasks: usize,
    stop: &Arc<AtomicBool>,
    admitted: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<Vec<Sent>>> {
    (0..tasks)
        .map(|_| {
            let (url, stop, admitted) = (gw.url("/api/x"), Arc::clone(stop), Arc::clone(admitted));
            tokio::spawn(async move {
                let http = client();
                let mut sent = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let at = Instant::now();
                    let req = Request::get(&url).body(Full::default()).unwrap();
                    let Ok(r) = send(&http, req).await else {
                        continue;
                    };
                    if r.status == 200 {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    let q = r.header("ratelimit-policy").unwrap_or_default().to_owned();
                    sent.push((at, r.status.as_u16(), q));
                }
                sent
            })
        })
        .collect()
}

/// Lowers the capacity under load (the next request already sees it, and no more than the
/// new bound is admitted after it), raises it without a reset, raises the rate, lists the
/// effective values, and goes back to the file's values on a reload.
async fn lower_then_raise(store: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), store)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks = load(&gw, 3, &stop, &admitted);
    let deadline = Instant::now() + Duration::from_secs(10);
    while admitted.load(Ordering::Relaxed) < 30 {
        assert!(Instant::now() < deadline, "the load got nowhere");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let r = put(&gw, "/v1/policies/api", r#"{"capacity": 10}"#, None).await;
    let changed_at = Instant::now();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let body = r.json();
    assert_eq!(body["persisted"], false);
    assert_eq!(body["policy"]["capacity"], 10);
    assert_eq!(body["policy"]["rate"], "1/min");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, Ordering::Relaxed);
    let mut all: Vec<Sent> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let after: Vec<&Sent> = all.iter().filter(|(at, _, _)| *at > changed_at).collect();
    assert!(
        after.len() > 20,
        "too little load after the change: {}",
        after.len()
    );
    // Within one request: every request sent after the answer is decided by the new quota.
    for (_, status, q) in &after {
        assert_eq!(q, "\"api\";q=10;w=600", "status {status}");
    }
    // Every request the new quota decided was decided by the store, not by its on_error while
    // a new Redis connection opened (a 503).
    for (_, status, q) in &all {
        assert!(
            q != "\"api\";q=10;w=600" || matches!(status, 200 | 429),
            "status {status}"
        );
    }
    // No key above its new bound: every request the new quota decided (a few were sent just
    // before the answer) took from 10, plus 1/min over the seconds since.
    let q10 = "\"api\";q=10;w=600";
    let new_admitted = all
        .iter()
        .filter(|(_, status, q)| *status == 200 && q == q10)
        .count() as f64;
    let bound = 10.0 + changed_at.elapsed().as_secs_f64() / 60.0;
    assert!(
        new_admitted <= bound,
        "{new_admitted} admitted after lowering to 10, bound {bound:.2}"
    );
    // The key keeps what it had left, at most 10, less what the (at most 3) requests in flight
    // at the swap took under the old quota. It had 100 (and 1/min since) less what the old
    // quota admitted: on a loaded machine the change may come late enough to leave it fewer
    // than 10.
    let old_admitted = all
        .iter()
        .filter(|(_, status, q)| *status == 200 && q != q10)
        .count() as f64;
    let left = (100.0 - old_admitted).clamp(0.0, 10.0);
    assert!(
        new_admitted >= left - 3.0,
        "only {new_admitted} admitted after lowering to 10, where the key had {left} left ({old_admitted} admitted before): the key lost tokens"
    );
    // Raised: no reset (the bucket stays as empty as it was), the new capacity in force.
    let r = put(&gw, "/v1/policies/api", r#"{"capacity": 50}"#, None).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let denied = get(&gw.url("/api/x")).await.unwrap();
    assert_eq!(
        denied.status, 429,
        "raising the capacity gave tokens: {denied:?}"
    );
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"api\";q=50;w=3000")
    );
    // A faster rate refills at once from where the key stands, without a reset.
    let r = put(&gw, "/v1/policies/api", r#"{"rate": "20/s"}"#, None).await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let next = get(&gw.url("/api/x")).await.unwrap();
    let remaining: u64 = next
        .header("ratelimit")
        .and_then(|v| v.split(";r=").nth(1)?.split(';').next()?.parse().ok())
        .unwrap();
    assert!(remaining <= 5, "a reset: {remaining} left right after");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let refilled = get(&gw.url("/api/x")).await.unwrap();
    assert_eq!(refilled.status, 200, "the new rate refills");
    let list = get(&gw.admin("/v1/policies")).await.unwrap().json();
    let api = &list["policies"][0];
    assert_eq!(
        (
            api["name"].as_str(),
            api["capacity"].as_u64(),
            api["rate"].as_str()
        ),
        (Some("api"), Some(50), Some("20/s"))
    );
    assert_eq!(api["shadow"], false);
    // Not persisted: a reload reads the file again.
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(10))
        .await;
    let list = get(&gw.admin("/v1/policies")).await.unwrap().json();
    assert_eq!(list["policies"][0]["capacity"], 100);
    assert_eq!(list["policies"][0]["rate"], "1/min");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_quota_in_memory() {
    lower_then_raise("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_quota_in_the_file_store() {
    let dir = TempDir::new();
    let path = dir.0.join("state");
    lower_then_raise(&format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"",
        path.display()
    ))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_quota_in_redis() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    lower_then_raise(&format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\non_error = \"deny\"\ntimeout = \"1s\"",
        redis.url()
    ))
    .await;
}

/// Bad bodies name the field and value (400), an unknown policy is 404, the admin token
/// guards it, and shadow mode can be switched on live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_changes_are_refused_naming_what_is_wrong() {
    let up = Upstream::start().await;
    let dir = TempDir::new();
    let token = dir.0.join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let gw = Gateway::start(
        &format!("admin_token = \"file:{}\"", token.display()),
        &config(&up.url(), ""),
    )
    .await;
    let unauthorized = put(&gw, "/v1/policies/api", r#"{"capacity": 5}"#, None).await;
    assert_eq!(unauthorized.status, 401);
    let t = Some("s3cret");
    for (path, body, status, says) in [
        ("/v1/policies/api", "{", 400, "malformed JSON"),
        (
            "/v1/policies/api",
            r#"{"rate": "fast"}"#,
            400,
            "rate: `fast`",
        ),
        (
            "/v1/policies/api",
            r#"{"capacity": -1}"#,
            400,
            "capacity: expected a whole number of at least 1, got -1",
        ),
        (
            "/v1/policies/api",
            r#"{"burst": 1}"#,
            400,
            "unknown field `burst`",
        ),
        (
            "/v1/policies/nope",
            r#"{"capacity": 5}"#,
            404,
            "unknown policy `nope`",
        ),
    ] {
        let r = put(&gw, path, body, t).await;
        assert_eq!(r.status, status, "{body}: {:?}", r.body);
        let detail = r.json()["detail"].as_str().unwrap_or_default().to_owned();
        assert!(detail.contains(says), "{body}: {detail}");
    }
    // Nothing changed.
    let list = send(
        &client(),
        Request::get(gw.admin("/v1/policies"))
            .header("authorization", "Bearer s3cret")
            .body(Full::default())
            .unwrap(),
    )
    .await
    .unwrap()
    .json();
    assert_eq!(list["policies"][0]["capacity"], 100);
    // Shadow mode, live: a policy lowered to 1 lets everything through.
    let r = put(
        &gw,
        "/v1/policies/api",
        r#"{"capacity": 1, "shadow": true}"#,
        t,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let seen: Arc<Mutex<Vec<u16>>> = Arc::default();
    for _ in 0..5 {
        let r = get(&gw.url("/api/x")).await.unwrap();
        seen.lock().unwrap().push(r.status.as_u16());
    }
    assert_eq!(*seen.lock().unwrap(), [200; 5]);
    let v: Value = r.json();
    assert_eq!(v["policy"]["shadow"], true);
}
