//! Real time, real threads: many tasks on two worker threads hammer one limiter, and the
//! admitted cost never exceeds capacity + rate·T over any measured span T.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::cell::LocalAlgorithm;
use sluice::Limiter;
use sluice_core::{Gcra, Quota, TokenBucket};

/// One admission: the instants just before the call and just after it returned, and its cost.
#[derive(Clone, Copy)]
struct Admission {
    before: Instant,
    after: Instant,
    cost: u64,
}

/// Checks the bound soundly: the true decision instants lie inside [before, after], so for any
/// set of admissions the span between their decisions is at most `max(after) - min(before)`.
fn assert_bounded(mut log: Vec<Admission>, capacity: u64, per_sec: f64) -> u64 {
    log.sort_by_key(|a| a.before);
    let total: u64 = log.iter().map(|a| a.cost).sum();
    for i in 0..log.len() {
        let mut cost = 0u64;
        let mut latest = log[i].after;
        for a in &log[i..] {
            cost += a.cost;
            latest = latest.max(a.after);
            let span = latest.duration_since(log[i].before).as_secs_f64();
            let allowed = capacity as f64 + per_sec * span;
            assert!(
                cost as f64 <= allowed + 1e-9,
                "{cost} admitted within {span:.6} s, bound {allowed:.3}"
            );
        }
    }
    total
}

/// 64 tasks, half calling `try_acquire` and half waiting in `acquire`, with costs 1 to 3,
/// for `run_for` of real time; returns every admission.
async fn hammer<A: LocalAlgorithm>(limiter: Limiter<A>, run_for: Duration) -> Vec<Admission> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let end = Instant::now() + run_for;
    let mut tasks = Vec::new();
    for t in 0..64u64 {
        let (log, limiter) = (log.clone(), limiter.clone());
        tasks.push(tokio::spawn(async move {
            let cost = 1 + t % 3;
            while Instant::now() < end {
                let before = Instant::now();
                let result = if t % 2 == 0 {
                    limiter.try_acquire(cost)
                } else {
                    limiter.acquire(cost).await
                };
                let after = Instant::now();
                if result.is_ok() {
                    log.lock().unwrap().push(Admission {
                        before,
                        after,
                        cost,
                    });
                } else {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(log).ok().unwrap().into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_threads_never_exceed_the_bound_gcra() {
    let limiter = Limiter::builder(Gcra::new(Quota::parse(20, "2000/s").unwrap()))
        .queue(32, Duration::from_millis(20))
        .build();
    let total = assert_bounded(
        hammer(limiter, Duration::from_millis(1500)).await,
        20,
        2000.0,
    );
    // Sanity: the limiter was contended, not idle. The bound is loose on purpose: on a loaded
    // 2-core machine the 64 tasks may get little CPU, but a fifth of the rate always got through.
    assert!(total >= 600, "only {total} admitted in 1.5 s at 2000/s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_threads_never_exceed_the_bound_token_bucket() {
    let limiter = Limiter::builder(TokenBucket::new(Quota::parse(50, "5000/s").unwrap()))
        .queue(64, Duration::from_millis(10))
        .build();
    let total = assert_bounded(
        hammer(limiter, Duration::from_millis(1500)).await,
        50,
        5000.0,
    );
    assert!(total >= 1500, "only {total} admitted in 1.5 s at 5000/s");
}
