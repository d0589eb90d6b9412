//! SIGHUP reloads: nothing of the old configuration is touched until the new one is built, a
//! changed quota keeps what each key had left (never more than the new capacity), changed
//! store and server settings are applied or refused by name, and every reload is logged on one
//! line and counted.

mod common;
#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::time::{Duration, Instant};

use common::{get, get_with, Gateway, Upstream};
use http::StatusCode;

/// A policy on `/api/` with `capacity` at 1/min (so no refill during a test), keyed by
/// `key`, and `store` as the `[store]` table.
fn config(upstream: &str, store: &str, algorithm: &str, capacity: u32, key: &str) -> String {
    format!(
        r#"
{store}

[[policy]]
name = "api"
algorithm = "{algorithm}"
capacity = {capacity}
rate = "1/min"
key = "{key}"

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "{upstream}"
"#
    )
}

/// Sends requests with `headers` until `n` decisions are in; returns how many admitted, how
/// many were limited (429), and how many got anything else.
///
/// The file store takes the token and then refuses with 503 while a slow disk write delays
/// its lease (a busy test machine; its own tests cover that): such a 503 is a token spent, so
/// it counts as admitted, up to 10 in a row (20 ms apart). A store that keeps answering 503
/// shows as `other` after that.
async fn statuses(gw: &Gateway, n: usize, headers: &[(&str, &str)]) -> (usize, usize, usize) {
    let (mut ok, mut limited, mut other) = (0, 0, 0);
    let mut unavailable = 0;
    while ok + limited + other < n {
        match get_with(&gw.url("/api/x"), headers).await.status {
            StatusCode::OK => (ok, unavailable) = (ok + 1, 0),
            StatusCode::TOO_MANY_REQUESTS => (limited, unavailable) = (limited + 1, 0),
            StatusCode::SERVICE_UNAVAILABLE if unavailable < 10 => {
                (ok, unavailable) = (ok + 1, unavailable + 1);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            _ => other += 1,
        }
    }
    (ok, limited, other)
}

/// Sends SIGHUP and waits for the `n`th reload log line containing `needle`.
async fn reload(gw: &Gateway, needle: &str, n: usize) {
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.log_text().matches(needle).count() < n {
        assert!(
            Instant::now() < deadline,
            "no `{needle}` #{n}: {}",
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn metrics(gw: &Gateway) -> String {
    String::from_utf8_lossy(&get(&gw.admin("/metrics")).await.unwrap().body).into_owned()
}

/// 95 of 100 spent, then the capacity is lowered to 50: 5 are left, not 50.
async fn tightened_keeps_what_was_left(store: &str) {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), store, "gcra", 100, "ip")).await;
    assert_eq!(statuses(&gw, 95, &[]).await, (95, 0, 0));
    gw.rewrite("", &config(&up.url(), store, "gcra", 50, "ip"));
    reload(&gw, "SIGHUP: reloaded", 1).await;
    let (ok, limited, other) = statuses(&gw, 60, &[]).await;
    assert_eq!(other, 0, "{}", gw.log_text());
    assert_eq!(
        (ok, limited),
        (5, 55),
        "what the key had left, not the new capacity"
    );
    // A loosened limit applies without a reset: still nothing left, more to come.
    gw.rewrite("", &config(&up.url(), store, "gcra", 200, "ip"));
    reload(&gw, "SIGHUP: reloaded", 2).await;
    assert_eq!(statuses(&gw, 3, &[]).await, (0, 3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_memory_policy_keeps_what_each_key_had_left() {
    tightened_keeps_what_was_left("[store]\nbackend = \"memory\"").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_file_policy_keeps_what_each_key_had_left() {
    let dir = common::TempDir::new();
    let store = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"",
        dir.0.join("state").display()
    );
    tightened_keeps_what_was_left(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_redis_policy_keeps_what_each_key_had_left() {
    let Some(server) = redis_support::RedisServer::start() else {
        return;
    };
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_error = \"deny\"",
        server.url()
    );
    tightened_keeps_what_was_left(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_redis_settings_are_applied() {
    let Some(server) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let store = |url: &str, on_error: &str| {
        format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"2s\"\non_error = \"{on_error}\"")
    };
    let dead = format!("redis://127.0.0.1:{}", common::closed_port());
    let gw = Gateway::start(
        "",
        &config(&up.url(), &store(&dead, "deny"), "gcra", 10, "ip"),
    )
    .await;
    for _ in 0..2 {
        let status = get_with(&gw.url("/api/x"), &[]).await.status;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "no Redis, on_error = deny"
        );
    }
    // on_error = allow: applied.
    gw.rewrite(
        "",
        &config(&up.url(), &store(&dead, "allow"), "gcra", 10, "ip"),
    );
    reload(&gw, "SIGHUP: reloaded", 1).await;
    assert!(
        gw.log_text().contains("store.on_error"),
        "{}",
        gw.log_text()
    );
    assert_eq!(statuses(&gw, 2, &[]).await, (2, 0, 0), "{}", gw.log_text());
    // A Redis that answers: applied, and it limits.
    gw.rewrite(
        "",
        &config(&up.url(), &store(&server.url(), "deny"), "gcra", 10, "ip"),
    );
    reload(&gw, "SIGHUP: reloaded", 2).await;
    // Until the new store has its connection, `on_error = deny` answers 503 and spends
    // nothing (not the file store's 503 that `statuses` counts as a token spent): wait for
    // the first 200, the bucket's first token.
    let deadline = Instant::now() + Duration::from_secs(5);
    while get_with(&gw.url("/api/x"), &[]).await.status != StatusCode::OK {
        assert!(Instant::now() < deadline, "{}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(statuses(&gw, 12, &[]).await, (9, 3, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_cannot_be_built_leaves_the_old_config_serving() {
    let up = Upstream::start().await;
    let dir = common::TempDir::new();
    let store = |path: &std::path::Path| {
        format!("[store]\nbackend = \"file\"\npath = \"{}\"", path.display())
    };
    let good = dir.0.join("state");
    let gw = Gateway::start("", &config(&up.url(), &store(&good), "gcra", 10, "ip")).await;
    assert_eq!(statuses(&gw, 3, &[]).await, (3, 0, 0));
    // A changed quota and another state path: refused (the store owns its file).
    let bad = dir.0.join("no-such-dir").join("state");
    gw.rewrite("", &config(&up.url(), &store(&bad), "gcra", 5, "ip"));
    reload(&gw, "SIGHUP: config refused", 1).await;
    assert!(
        gw.log_text().contains("store.path needs a restart"),
        "{}",
        gw.log_text()
    );
    // The old config keeps serving, with its state: 7 left, then 429, never 503.
    assert_eq!(statuses(&gw, 9, &[]).await, (7, 2, 0), "{}", gw.log_text());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(statuses(&gw, 1, &[]).await, (0, 1, 0), "{}", gw.log_text());
    let m = metrics(&gw).await;
    assert!(
        m.contains("sluice_reloads_total{result=\"refused\"} 1"),
        "{m}"
    );

    // The changed policy builds; a policy after it does not (its state file is corrupt).
    std::fs::write(dir.0.join("state.later"), "not a snapshot").unwrap();
    let later = format!(
        "{}\n[[policy]]\nname = \"later\"\ncapacity = 1\nrate = \"1/s\"\n",
        config(&up.url(), &store(&good), "gcra", 5, "ip")
    );
    gw.rewrite("", &later);
    reload(&gw, "SIGHUP: config refused", 2).await;
    assert!(gw.log_text().contains("state.later"), "{}", gw.log_text());
    assert_eq!(statuses(&gw, 2, &[]).await, (0, 2, 0), "{}", gw.log_text());
    // And the old store still writes its file.
    let before = std::fs::metadata(dir.0.join("state.api"))
        .unwrap()
        .modified()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = std::fs::metadata(dir.0.join("state.api"))
        .unwrap()
        .modified()
        .unwrap();
    assert!(after > before, "the old file store was stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_state_path_is_refused_and_the_keys_stay_in_the_store_that_owns_them() {
    let up = Upstream::start().await;
    let dir = common::TempDir::new();
    let store = |path: &std::path::Path| {
        format!("[store]\nbackend = \"file\"\npath = \"{}\"", path.display())
    };
    let first = dir.0.join("first");
    let gw = Gateway::start("", &config(&up.url(), &store(&first), "gcra", 10, "ip")).await;
    assert_eq!(statuses(&gw, 4, &[]).await, (4, 0, 0));
    let second = dir.0.join("second");
    gw.rewrite("", &config(&up.url(), &store(&second), "gcra", 10, "ip"));
    gw.signal("HUP");
    gw.wait_log("store.path needs a restart", Duration::from_secs(10))
        .await;
    assert!(!dir.0.join("second.api").exists(), "no second store");
    assert_eq!(statuses(&gw, 7, &[]).await, (6, 1, 0), "the same keys");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reload_is_logged_on_one_line_with_what_changed_and_counted() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), "", "gcra", 10, "ip")).await;
    gw.rewrite(
        "trusted_proxies = [\"10.0.0.0/8\"]\nshutdown_timeout = \"3s\"",
        &config(&up.url(), "", "token_bucket", 20, "ip"),
    );
    reload(&gw, "SIGHUP: reloaded", 1).await;
    let log = gw.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("SIGHUP: reloaded"))
        .unwrap();
    for what in [
        "policy api",
        "algorithm",
        "capacity 10 -> 20",
        "server.trusted_proxies",
        "server.shutdown_timeout",
    ] {
        assert!(line.contains(what), "`{what}` not in: {line}");
    }
    // A setting only a restart can apply: refused, naming it.
    gw.rewrite("workers = 7", &config(&up.url(), "", "gcra", 10, "ip"));
    reload(&gw, "SIGHUP: config refused", 1).await;
    assert!(
        gw.log_text().contains("server.workers needs a restart"),
        "{}",
        gw.log_text()
    );
    let m = metrics(&gw).await;
    assert!(m.contains("sluice_reloads_total{result=\"ok\"} 1"), "{m}");
    assert!(
        m.contains("sluice_reloads_total{result=\"refused\"} 1"),
        "{m}"
    );
    // Unchanged config: reloaded, nothing changed.
    gw.rewrite(
        "trusted_proxies = [\"10.0.0.0/8\"]\nshutdown_timeout = \"3s\"",
        &config(&up.url(), "", "token_bucket", 20, "ip"),
    );
    reload(&gw, "SIGHUP: reloaded", 2).await;
    assert!(
        gw.log_text().contains("changed=nothing"),
        "{}",
        gw.log_text()
    );
    let _ = get_with(&gw.url("/api/x"), &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_header_limits_apply_to_new_connections() {
    let up = Upstream::start().await;
    let rest = config(&up.url(), "", "gcra", 100, "ip");
    let gw = Gateway::start("max_header_bytes = \"64KiB\"", &rest).await;
    let huge = "h".repeat(40_000);
    let r = get_with(&gw.url("/api/x"), &[("x-huge", &huge)]).await;
    assert_eq!(r.status, StatusCode::OK);
    gw.rewrite("max_header_bytes = \"16KiB\"", &rest);
    reload(&gw, "SIGHUP: reloaded", 1).await;
    assert!(
        gw.log_text().contains("server.max_header_bytes"),
        "{}",
        gw.log_text()
    );
    let r = get_with(&gw.url("/api/x"), &[("x-huge", &huge)]).await;
    assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
}

/// A reload that tightens a policy from 100 to 20 under about 500 requests a second over four
/// keys spending at different speeds: no 5xx after the reload, and no key above its new bound.
/// The busiest key is empty at the reload and gets nothing more; the others had more than 20
/// left and get at most 20 more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_under_load_that_tightens_a_policy_gives_no_5xx_and_no_burst() {
    // Of every 10 requests, key k0 sends 6 (300/s: its 100 are gone after about 0.33 s), k1
    // and k2 send 2 (100/s: 50 spent at the reload) and k3 sends 1 (50/s).
    const KEY_OF: [usize; 10] = [0, 1, 0, 2, 0, 0, 1, 0, 2, 3];
    // The file store with a lease long enough that a disk slowed by the rest of a loaded
    // machine never lapses it: this test is about the reload, not the disk (whose stalls
    // give 503 by design, and have tests of their own).
    for store in [
        "",
        "[store]\nbackend = \"file\"\npath = \"STATE\"\nmax_loss = \"2s\"",
    ] {
        let up = Upstream::start().await;
        let dir = common::TempDir::new();
        let store = store.replace("STATE", &dir.0.join("state").display().to_string());
        let policy = |capacity| config(&up.url(), &store, "token_bucket", capacity, "header:x-k");
        let gw = Gateway::start("", &policy(100)).await;
        // About 500 requests a second for 1.5 s; the reload is sent after 0.5 s and applies
        // when its log line is out (`reloaded_at`).
        let url = gw.url("/api/x");
        let mut tasks = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(2));
        let started = Instant::now();
        let (mut signalled, mut reloaded_at) = (false, None);
        let mut i = 0;
        while started.elapsed() < Duration::from_millis(1500) {
            tick.tick().await;
            if !signalled && started.elapsed() >= Duration::from_millis(500) {
                gw.rewrite("", &policy(20));
                gw.signal("HUP");
                signalled = true;
            }
            if signalled && reloaded_at.is_none() && gw.log_text().contains("SIGHUP: reloaded") {
                reloaded_at = Some(Instant::now());
            }
            let (url, key) = (url.clone(), KEY_OF[i % 10]);
            let (after_signal, after_reload) = (signalled, reloaded_at.is_some());
            tasks.push(tokio::spawn(async move {
                let answer = get_with(&url, &[("x-k", &format!("k{key}"))]).await;
                (key, after_signal, after_reload, answer.status)
            }));
            i += 1;
        }
        reload(&gw, "SIGHUP: reloaded", 1).await;
        let (mut admitted, mut admitted_after) = ([0usize; 4], [0usize; 4]);
        let (mut fivexx_after, mut seen) = (0, Vec::new());
        for t in tasks {
            let (key, after_signal, after_reload, status) = t.await.unwrap();
            // The file store takes the token, then may refuse with 503 while a slow disk
            // write delays its lease (its own tests cover that); either way a token is spent.
            if status == StatusCode::OK || status == StatusCode::SERVICE_UNAVAILABLE {
                admitted[key] += 1;
                if after_reload {
                    admitted_after[key] += 1;
                }
            }
            if after_signal && status.is_server_error() {
                fivexx_after += 1;
            }
            seen.push(status.as_u16());
        }
        let count = |code: u16| seen.iter().filter(|&&s| s == code).count();
        let summary = format!(
            "{store}: 200 {}, 429 {}, 503 {}; admitted per key {admitted:?}, of which after the reload {admitted_after:?}",
            count(200),
            count(429),
            count(503)
        );
        assert_eq!(fivexx_after, 0, "{summary}");
        if store.is_empty() {
            assert_eq!(count(503), 0, "{summary}");
        }
        // 1/min refills at most 2 per key over the run.
        for key in 0..4 {
            assert!(admitted[key] <= 102, "k{key}: {summary}");
            assert!(admitted_after[key] <= 22, "k{key}: {summary}");
        }
        // k0 is empty at the reload: the new capacity gives it nothing.
        assert!(admitted[0] >= 100, "k0 spent its 100: {summary}");
        assert!(admitted_after[0] <= 2, "k0: {summary}");
        assert!(
            reloaded_at.is_some(),
            "the reload applied during the run: {summary}"
        );
        eprintln!("{summary}");
    }
}
