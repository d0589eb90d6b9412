//! Leased limits across several `sluice serve` processes sharing one Redis: together they
//! never admit beyond the bound, nearly all of it, at a fraction of a script per request;
//! a gateway killed (`kill -9`) while it holds a slice costs the others only until that slice
//! expires; the decision API answers on a leased policy.

mod common;
#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Gateway, Upstream};

const CAPACITY: u64 = 200;
const PER_SEC: u64 = 400;

fn config(redis: &redis_support::RedisServer, upstream: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "1s"
on_error = "deny"

[[policy]]
name = "hot"
algorithm = "token_bucket"
capacity = {CAPACITY}
rate = "{PER_SEC}/s"
lease = {{ max = "10%", ttl = "100ms" }}

[[route]]
path_prefix = "/api/"
policies = ["hot"]
upstream = "{upstream}"
"#,
        url = redis.url()
    )
}

/// Clients hammering each gateway's `/api/` for `run_for`; the 200s they got.
async fn hammer(gateways: &[&Gateway], per_gateway: usize, run_for: Duration) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for gw in gateways {
        for _ in 0..per_gateway {
            let url = gw.url("/api/x");
            let admitted = Arc::clone(&admitted);
            tasks.push(tokio::spawn(async move {
                let client = common::client();
                while started.elapsed() < run_for {
                    let req = http::Request::get(&url)
                        .body(http_body_util::Full::new(bytes::Bytes::new()))
                        .unwrap();
                    if let Ok(a) = common::send(&client, req).await {
                        if a.status == 200 {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_leasing_one_key_stay_within_the_bound_and_survive_a_crash() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let text = config(&redis, &up.url());
    let gateways = [
        Gateway::start("", &text).await,
        Gateway::start("", &text).await,
        Gateway::start("", &text).await,
    ];
    // Every gateway has connected (a decision answered by Redis, not by on_error).
    for gw in &gateways {
        let deadline = Instant::now() + Duration::from_secs(5);
        while common::get(&gw.url("/api/warm")).await.unwrap().status == 503 {
            assert!(Instant::now() < deadline, "gateway never reached Redis");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Full again, then the run.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let calls = redis.script_calls();
    let before = up.count();
    let started = Instant::now();
    let run_for = Duration::from_secs(2);
    let refs: Vec<&Gateway> = gateways.iter().collect();
    let admitted = hammer(&refs, 6, run_for).await;
    let elapsed = started.elapsed();
    let reached = up.count() - before;
    let scripts = redis.script_calls() - calls;
    let bound = CAPACITY as f64 + PER_SEC as f64 * elapsed.as_secs_f64();
    eprintln!(
        "3 gateways: {admitted} admitted in {elapsed:?} (bound {bound:.0}: {:.1}%), the upstream saw {reached}; {scripts} Redis scripts, one per {:.1} admissions",
        100.0 * admitted as f64 / bound,
        admitted as f64 / scripts.max(1) as f64
    );
    assert_eq!(admitted, reached);
    assert!(
        admitted as f64 <= bound,
        "{admitted} above the bound {bound:.0}"
    );
    assert!(
        admitted as f64 >= 0.8 * bound,
        "{admitted}: under-admission beyond 20%"
    );
    // Slices of 20 (10% of 200) refill in 50 ms; one gateway takes each while the two
    // others are told to wait: a few scripts per slice.
    assert!(
        scripts * 4 <= admitted,
        "{scripts} scripts for {admitted} admissions"
    );

    // One gateway dies holding its slice; the two others go on, and never above the bound.
    let [mut a, b, c] = gateways;
    let _ = a.child.kill();
    let _ = a.child.wait();
    let before = up.count();
    let started = Instant::now();
    let admitted = hammer(&[&b, &c], 6, Duration::from_millis(1500)).await;
    let elapsed = started.elapsed();
    let bound = CAPACITY as f64 + PER_SEC as f64 * elapsed.as_secs_f64();
    eprintln!(
        "after a kill -9: {admitted} admitted in {elapsed:?} by the two others (bound {bound:.0}: {:.1}%)",
        100.0 * admitted as f64 / bound
    );
    assert_eq!(admitted, up.count() - before);
    assert!(
        admitted as f64 <= bound,
        "{admitted} above the bound {bound:.0}"
    );
    // What the killed gateway held is lost until its lease expires (100 ms): at most a slice.
    assert!(
        admitted as f64 >= 0.7 * bound,
        "{admitted}: the others starved"
    );

    // The decision API on a leased policy.
    let check = common::post(
        &b.admin("/v1/check"),
        r#"{"policy": "hot", "key": "k", "cost": 1}"#,
    )
    .await;
    eprintln!(
        "decision API on a leased policy: {} {}",
        check.status,
        String::from_utf8_lossy(&check.body)
    );
    assert!(
        [200, 429].contains(&check.status.as_u16()),
        "{:?}",
        check.status
    );
}
