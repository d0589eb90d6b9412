//! One owner for each key's state, whatever an operator combines: a live change or a reload
//! while requests wait in a queue, a crash or a clean restart of a policy that evicts keys, a
//! change of algorithm or quota on a Redis shared with another gateway, a reload that would
//! switch stores. In every case a key admits no more than its capacity plus its refill over
//! the time elapsed, and a waiting request is still served.
//!
//! Real processes: the `sluice` binary, real state files, `kill -9`, a real redis-server.
//! Policies that need no refill refill at 1/min, so that their bounds are crisp; the tests that
//! run in real time assert bounds with a margin, never exact timings.

mod common;
#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, get_with, most_in_a_window, send, Answer, Gateway, TempDir, Upstream};
use http::{Request, StatusCode};
use http_body_util::Full;

// === the policy and how it is driven ===

/// One policy `q` on `/api/` in front of `upstream`, behind `store` (a `[store]` table, or
/// nothing for memory); `extra` goes into the policy's table (`max_keys`, `queue`...).
fn policy(
    upstream: &str,
    store: &str,
    algorithm: &str,
    capacity: u32,
    rate: &str,
    key: &str,
    extra: &str,
) -> String {
    format!(
        r#"
{store}

[[policy]]
name = "q"
algorithm = "{algorithm}"
capacity = {capacity}
rate = "{rate}"
key = "{key}"
{extra}

[[route]]
path_prefix = "/api/"
policies = ["q"]
upstream = "{upstream}"
"#
    )
}

/// A file store at `dir/state` whose lease (`max_loss`) a busy machine's slow disk never
/// lapses, so that a 503 can only come from the gateway's own handling.
fn file_store(dir: &TempDir) -> String {
    format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\nmax_loss = \"2s\"",
        dir.0.join("state").display()
    )
}

/// A Redis store that denies (503, spending nothing) while Redis does not answer.
fn redis_store(redis: &redis_support::RedisServer) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"1s\"\non_error = \"deny\"",
        redis.url()
    )
}

/// `PUT /v1/policies/q` with `body` on the admin listener; a 503 (a Redis store still
/// connecting) is tried again for up to 5 s.
async fn put(gw: &Gateway, body: &str) -> Answer {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let req = Request::put(gw.admin("/v1/policies/q"))
            .body(Full::new(Bytes::from(body.to_owned())))
            .unwrap();
        let answer = send(&client(), req).await.unwrap();
        if answer.status != StatusCode::SERVICE_UNAVAILABLE || Instant::now() > deadline {
            assert_eq!(answer.status, StatusCode::OK, "PUT {body}: {answer:?}");
            return answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `n` decisions on `/api/x` with the key header `x-user: user` (none when `user` is
/// empty) came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Decisions {
    admitted: usize,
    limited: usize,
    other: usize,
}

/// Sends requests for `user` until `n` are decided. A 503 (a Redis store still connecting,
/// under `on_error = "deny"`, spends nothing) is sent again, up to 100 times in all, 50 ms
/// apart; past that it counts as `other`.
async fn decide(gw: &Gateway, user: &str, n: usize) -> Decisions {
    let headers: Vec<(&str, &str)> = if user.is_empty() {
        Vec::new()
    } else {
        vec![("x-user", user)]
    };
    let mut d = Decisions::default();
    let mut unavailable = 0;
    while d.admitted + d.limited + d.other < n {
        match get_with(&gw.url("/api/x"), &headers).await.status {
            StatusCode::OK => d.admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => d.limited += 1,
            StatusCode::SERVICE_UNAVAILABLE if unavailable < 100 => {
                unavailable += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            _ => d.other += 1,
        }
    }
    d
}

/// Sends SIGHUP and waits for the `n`th reload line (`SIGHUP: reloaded` or `SIGHUP: config
/// refused`); returns the last one.
async fn reload(gw: &Gateway, n: usize) -> String {
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = gw.log_text();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("SIGHUP: reloaded") || l.contains("SIGHUP: config refused"))
            .collect();
        if lines.len() >= n {
            return lines[n - 1].to_owned();
        }
        assert!(Instant::now() < deadline, "no reload line #{n}: {log}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// SIGTERM, a clean exit, then `sluice serve` again on the same config and state.
async fn stop_and_start(gw: &mut Gateway) {
    gw.signal("TERM");
    let status = gw.wait_exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}: {}", gw.log_text());
    // The process is gone: this only starts it again.
    gw.crash_and_restart().await;
}

// === a change while requests wait ===

/// How a running policy is changed.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// `PUT /v1/policies/q` on the admin listener.
    Put,
    /// The config file rewritten, then SIGHUP.
    Reload,
}

/// A queued token bucket (capacity 2, 2/s, queue depth 60, max wait 30 s) on one key, kept
/// busy by 24 clients that each send their next request as soon as the last is answered, so
/// that about 22 wait at any time. After 1 s the capacity goes to 3 (`change`); the load
/// runs 10 s.
///
/// Every span T of the upstream's arrivals holds at most 3 + 2·T requests (+ 1 for the
/// proxy's latency), and the requests that wait are served (the longest wait is about 12 s,
/// well within 30 s) or at worst denied as a wait is (429): none gets 503 or an error.
async fn a_change_while_requests_wait(store: &str, change: Change) {
    let up = Upstream::start().await;
    let extra = "queue = { depth = 60, max_wait = \"30s\" }";
    let config = |capacity| {
        policy(
            &up.url(),
            store,
            "token_bucket",
            capacity,
            "2/s",
            "global",
            extra,
        )
    };
    let gw = Gateway::start("", &config(2)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let answered: Arc<Mutex<Vec<u16>>> = Arc::default();
    let started = Instant::now();
    let tasks: Vec<_> = (0..24)
        .map(|_| {
            let (url, stop, answered) =
                (gw.url("/api/x"), Arc::clone(&stop), Arc::clone(&answered));
            tokio::spawn(async move {
                let http = client();
                while !stop.load(Ordering::Relaxed) {
                    let req = Request::get(&url).body(Full::default()).unwrap();
                    let status = match send(&http, req).await {
                        Ok(a) => a.status.as_u16(),
                        Err(_) => 0,
                    };
                    answered.lock().unwrap().push(status);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    match change {
        Change::Put => {
            put(&gw, r#"{"capacity": 3}"#).await;
        }
        Change::Reload => {
            gw.rewrite("", &config(3));
            let line = reload(&gw, 1).await;
            assert!(line.contains("SIGHUP: reloaded"), "{line}");
        }
    }
    let changed_at = started.elapsed();
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    // Requests still waiting are given up: their clients go away.
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    let ran = started.elapsed();
    let mut times = up.times.lock().unwrap().clone();
    times.sort();
    let statuses = answered.lock().unwrap().clone();
    let count = |code: u16| statuses.iter().filter(|&&s| s == code).count();
    let summary = format!(
        "{change:?} at {changed_at:.1?}: the upstream saw {} requests in {ran:.1?} (at 2/s: about {}); answered 200 {}, 429 {}, 503 {}, other {}",
        times.len(),
        2 + (2.0 * ran.as_secs_f64()) as usize,
        count(200),
        count(429),
        count(503),
        statuses.len() - count(200) - count(429) - count(503),
    );
    eprintln!("{summary}");
    let mut over = Vec::new();
    for window_s in [2u64, 5, 9] {
        let most = most_in_a_window(&times, Duration::from_secs(window_s));
        let bound = 3 + 2 * window_s as usize + 1;
        eprintln!("within {window_s} s: {most} arrivals (bound {bound})");
        if most > bound {
            over.push(format!("{most} within {window_s} s (bound {bound})"));
        }
    }
    assert_eq!(count(503), 0, "a waiting request got 503: {summary}");
    assert_eq!(
        statuses.len(),
        count(200) + count(429),
        "every request answered was served, or denied as a wait is: {summary}"
    );
    assert!(
        over.is_empty(),
        "above 3 + 2/s x T + 1: {over:?}; {summary}"
    );
    assert!(
        count(200) >= 10,
        "the queued requests were served: {summary}"
    );
}

/// A live change of a queued memory policy: one bucket, converted in place, goes on serving
/// the requests that wait and the ones that come after, at 2/s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_while_requests_wait_keeps_one_bucket_and_the_bound() {
    a_change_while_requests_wait("", Change::Put).await;
}

/// A reload of a queued policy on the file store: the requests that wait are served (or time
/// out with 429 as usual), never answered 503, and the bound holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_while_requests_wait_on_the_file_store_serves_them_within_the_bound() {
    let dir = TempDir::new();
    a_change_while_requests_wait(&file_store(&dir), Change::Reload).await;
}

// === eviction ===

/// `kill -9`, then a restart of a GCRA policy (capacity 3, 1 per 2 s) on the file store that
/// keeps one key (`max_keys = 1`); two clients then take turns for 4.5 s, each request
/// evicting the other's key. Each key admits at most 3 + 4.5 / 2 = 5.25, whatever the
/// cycling.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_evict_each_other_after_a_crash_stay_within_their_bound() {
    let up = Upstream::start().await;
    let dir = TempDir::new();
    let store = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"",
        dir.0.join("state").display()
    );
    let config = policy(
        &up.url(),
        &store,
        "gcra",
        3,
        "1 per 2s",
        "header:x-user",
        "max_keys = 1",
    );
    let mut gw = Gateway::start("", &config).await;
    let before = (decide(&gw, "a", 1).await, decide(&gw, "b", 1).await);
    // A write of the file (every 50 ms), then the crash.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw.crash_and_restart().await;
    let started = Instant::now();
    let (mut a, mut b) = (Decisions::default(), Decisions::default());
    let mut unavailable = 0;
    while started.elapsed() < Duration::from_millis(4500) {
        for (user, d) in [("a", &mut a), ("b", &mut b)] {
            match get_with(&gw.url("/api/x"), &[("x-user", user)])
                .await
                .status
            {
                StatusCode::OK => d.admitted += 1,
                StatusCode::TOO_MANY_REQUESTS => d.limited += 1,
                StatusCode::SERVICE_UNAVAILABLE => unavailable += 1,
                _ => d.other += 1,
            }
        }
    }
    let summary = format!(
        "before the crash a {:?}, b {:?}; in the {:.1?} after the restart a {a:?}, b {b:?}, 503 {unavailable}",
        before.0,
        before.1,
        started.elapsed()
    );
    eprintln!("{summary}");
    assert!(
        a.admitted <= 5 && b.admitted <= 5,
        "a key admitted more than 3 + 4.5 s / 2 s: {summary}"
    );
    assert!(
        a.admitted >= 1 && b.admitted >= 1,
        "each key admits its refill: {summary}"
    );
}

/// A key spent, then evicted while it is still spent (`max_keys = 1`, another key comes):
/// neither a live change of the quota nor a clean restart on the file store hands it a new
/// burst. At 1/min it has nothing to admit a few seconds later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_spent_key_stays_spent_after_a_change_or_a_restart() {
    let up = Upstream::start().await;
    let config = |store: &str| {
        policy(
            &up.url(),
            store,
            "token_bucket",
            5,
            "1/min",
            "header:x-user",
            "max_keys = 1",
        )
    };

    // In memory, then a live change to capacity 4.
    let gw = Gateway::start("", &config("")).await;
    let spent = decide(&gw, "a", 5).await;
    let other = decide(&gw, "b", 1).await;
    put(&gw, r#"{"capacity": 4}"#).await;
    let after_put = decide(&gw, "a", 4).await;
    drop(gw);

    // On the file store, then SIGTERM and a start on the same state.
    let dir = TempDir::new();
    let mut gw = Gateway::start("", &config(&file_store(&dir))).await;
    let spent_file = decide(&gw, "a", 5).await;
    let other_file = decide(&gw, "b", 1).await;
    stop_and_start(&mut gw).await;
    let after_restart = decide(&gw, "a", 4).await;

    let summary = format!(
        "memory: a spent {spent:?}, b {other:?}, a after PUT capacity 4: {after_put:?}; \
         file: a spent {spent_file:?}, b {other_file:?}, a after a clean restart: {after_restart:?}"
    );
    eprintln!("{summary}");
    assert_eq!(spent.admitted, 5, "{summary}");
    assert_eq!(spent_file.admitted, 5, "{summary}");
    assert_eq!(
        after_put.admitted, 0,
        "an evicted spent key came back with tokens after a change: {summary}"
    );
    assert_eq!(
        after_restart.admitted, 0,
        "an evicted spent key came back with tokens after a restart: {summary}"
    );
}

// === Redis ===

/// On Redis: a live change to 10, a restart (the file still says 5, so the gateway is back at
/// 5), the key spent, and the same live change to 10 again: the empty key stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_change_after_a_restart_on_redis_converts_the_keys_again() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let config = policy(
        &up.url(),
        &redis_store(&redis),
        "token_bucket",
        5,
        "1/min",
        "global",
        "",
    );
    let mut gw = Gateway::start("", &config).await;
    put(&gw, r#"{"capacity": 10}"#).await;
    stop_and_start(&mut gw).await;
    let spent = decide(&gw, "", 6).await;
    put(&gw, r#"{"capacity": 10}"#).await;
    let after = decide(&gw, "", 5).await;
    let summary = format!("spent at capacity 5: {spent:?}; after PUT capacity 10: {after:?}");
    eprintln!("{summary}");
    assert_eq!(spent.admitted, 5, "{summary}");
    assert_eq!(
        after.admitted, 0,
        "a spent key gained tokens from a live change: {summary}"
    );
}

/// On Redis: GCRA, reloaded to a fixed window, reloaded back to GCRA. A key used under the
/// first GCRA (4 left) and spent under the fixed window is still spent under the second GCRA:
/// the state the key had before the fixed window is not read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_algorithm_changed_and_changed_back_on_redis_keeps_a_spent_key_spent() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let store = redis_store(&redis);
    let config = |algorithm| policy(&up.url(), &store, algorithm, 5, "1/min", "global", "");
    let gw = Gateway::start("", &config("gcra")).await;
    let used = decide(&gw, "", 1).await;
    gw.rewrite("", &config("fixed_window"));
    let first = reload(&gw, 1).await;
    let spent = decide(&gw, "", 5).await;
    gw.rewrite("", &config("gcra"));
    let second = reload(&gw, 2).await;
    let after = decide(&gw, "", 5).await;
    let summary = format!(
        "gcra: {used:?}; fixed_window: {spent:?}; back to gcra: {after:?}\n{first}\n{second}"
    );
    eprintln!("{summary}");
    assert!(first.contains("SIGHUP: reloaded"), "{summary}");
    assert!(second.contains("SIGHUP: reloaded"), "{summary}");
    assert_eq!(used.admitted, 1, "{summary}");
    assert_eq!(
        spent.admitted, 4,
        "the fixed window took what was left: {summary}"
    );
    assert_eq!(
        after.admitted, 0,
        "a spent key got back the tokens it had before two changes of algorithm: {summary}"
    );
}

/// Two gateways on one Redis and prefix, GCRA at capacity 10: a key with 2 left, then a live
/// change to capacity 5 on one gateway only. The other gateway, not changed, admits at most
/// the 2 the key had left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_was_not_changed_reads_a_converted_key_without_a_burst() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let config = policy(
        &up.url(),
        &redis_store(&redis),
        "gcra",
        10,
        "1/min",
        "global",
        "",
    );
    let changed = Gateway::start("", &config).await;
    let other = Gateway::start("", &config).await;
    let spent = decide(&changed, "", 8).await;
    put(&changed, r#"{"capacity": 5}"#).await;
    let after = decide(&other, "", 10).await;
    let summary = format!(
        "8 spent of 10: {spent:?}; then, after PUT capacity 5 on the other gateway, this one: {after:?}"
    );
    eprintln!("{summary}");
    assert_eq!(spent.admitted, 8, "{summary}");
    assert!(
        after.admitted <= 2,
        "the key had 2 left, a gateway admitted more: {summary}"
    );
}

// === a change of store ===

/// A reload that would move a policy from memory to the file store is refused, naming
/// `store.backend` as needing a restart; the old configuration keeps serving, and a spent key
/// stays spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_store_backend_is_refused_and_keeps_the_keys() {
    let up = Upstream::start().await;
    let dir = TempDir::new();
    let config = |store: &str| policy(&up.url(), store, "token_bucket", 5, "1/min", "global", "");
    let gw = Gateway::start("", &config("[store]\nbackend = \"memory\"")).await;
    let spent = decide(&gw, "", 6).await;
    gw.rewrite("", &config(&file_store(&dir)));
    let line = reload(&gw, 1).await;
    let after = decide(&gw, "", 5).await;
    let summary = format!("spent: {spent:?}; after the reload: {after:?}\n{line}");
    eprintln!("{summary}");
    assert_eq!(spent.admitted, 5, "{summary}");
    assert!(
        line.contains("SIGHUP: config refused") && line.contains("store.backend needs a restart"),
        "{summary}"
    );
    assert_eq!(after.admitted, 0, "a spent key gained tokens: {summary}");
    let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        metrics.contains("sluice_reloads_total{result=\"refused\"} 1"),
        "{summary}\n{metrics}"
    );
}

/// A reload that lowers `concurrency` while requests hold every slot: the pool is resized in
/// place, so no request starts until fewer than the new size run (two pools would each let
/// their size run), and once they finished exactly the new size runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_concurrency_counts_the_requests_already_running() {
    let up = Upstream::start().await;
    let config = |n: u32| {
        policy(
            &up.url(),
            "",
            "gcra",
            1000,
            "1000/s",
            "global",
            &format!("concurrency = {n}"),
        )
        .replace("/api/", "/slow/")
    };
    let gw = Gateway::start("", &config(4)).await;
    let slow = |ms: u64| {
        let url = gw.url(&format!("/slow/{ms}"));
        tokio::spawn(async move { get_with(&url, &[]).await.status })
    };
    // Four hold every slot for 2 s.
    let holding: Vec<_> = (0..4).map(|_| slow(2000)).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.rewrite("", &config(2));
    let line = reload(&gw, 1).await;
    assert!(line.contains("SIGHUP: reloaded"), "{line}");
    // Four run, the new size is 2: a newcomer finds no slot.
    let late = slow(10).await.unwrap();
    eprintln!("a request during the surplus: {late}");
    assert_eq!(late, StatusCode::TOO_MANY_REQUESTS, "{}", gw.log_text());
    for h in holding {
        assert_eq!(h.await.unwrap(), StatusCode::OK);
    }
    // Now exactly two run at once.
    let three: Vec<_> = (0..3).map(|_| slow(800)).collect();
    let mut statuses = Vec::new();
    for t in three {
        statuses.push(t.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    eprintln!("three at once after the surplus: {statuses:?}");
    assert_eq!(ok, 2, "{statuses:?}");
}
