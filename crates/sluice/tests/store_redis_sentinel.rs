//! The Redis store through Redis Sentinel, against real processes: a master, a replica and
//! three `redis-sentinel`, and `SENTINEL FAILOVER` while tasks hammer one key. Decisions go
//! back to Redis (the new master) within 2 s of the promotion, the admissions over the whole
//! run stay within capacity + rate x T in every window, and in between `on_error` decides.
//!
//! Real time is needed here (Redis has its own clock): the tests assert bounds, not exact times.

#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::store::{LeaseConfig, LeaseSize, OnError, RedisConfig, RedisStore, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::redis::RedisSentinels;

/// Held by the tests that load the machine or measure time, so that they do not run at once.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const CAPACITY: u64 = 50;
const PER_SECOND: u64 = 100;
/// The longest a decision may take before `on_error` decides (a debug build on a loaded
/// machine must not time out in normal operation).
const TIMEOUT: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Admitted,
    Limited,
    Unavailable,
}

#[derive(Clone, Copy, Debug)]
struct Answer {
    sent: Instant,
    got: Instant,
    outcome: Outcome,
}

/// `n` admissions spread over `secs` seconds: the most the limit allows.
fn bound(secs: f64) -> f64 {
    CAPACITY as f64 + PER_SECOND as f64 * secs
}

/// The admissions, sorted by answer, checked in every window: those answered in [got_i,
/// got_j] were decided by Redis between the earliest of their requests and got_j, so at most
/// `bound` of that span. Returns the window closest to its bound: (count, bound, span).
fn worst_window(admissions: &[Answer]) -> (usize, f64, Duration) {
    let mut worst = (0usize, f64::MAX, Duration::ZERO);
    for i in 0..admissions.len() {
        let mut earliest = admissions[i].sent;
        for (j, a) in admissions.iter().enumerate().skip(i) {
            earliest = earliest.min(a.sent);
            let span = a.got.saturating_duration_since(earliest);
            let (count, allowed) = (j - i + 1, bound(span.as_secs_f64()));
            if count as f64 - allowed > worst.0 as f64 - worst.1 {
                worst = (count, allowed, span);
            }
        }
    }
    worst
}

/// What one failover under load showed.
struct Run {
    answers: Vec<Answer>,
    /// `SENTINEL FAILOVER` sent.
    asked: Instant,
    /// The replica answers `ROLE` with `master`.
    promoted: Instant,
    /// Every Sentinel names the new master.
    named: Instant,
    /// The store stopped using Redis (first seen), was last seen off it, and used it again
    /// (first seen; the monitor looks every 5 ms).
    down: Instant,
    last_down: Instant,
    up: Instant,
    /// Scripts run by the old and the new master (`INFO commandstats`).
    calls_old: u64,
    calls_new: u64,
}

/// Four tasks hammer one key (capacity 50, 100/s) through the Sentinels of a master with
/// `replicas` replicas for 1.5 s, then the first Sentinel fails the master over; the load goes
/// on until 3.5 s after the promotion.
async fn failover_under_load(policy: OnError, replicas: usize) -> Option<Run> {
    failover_under_load_with(policy, replicas, None).await
}

/// [`failover_under_load`], the key spent in leased slices when `lease` is given.
async fn failover_under_load_with(
    policy: OnError,
    replicas: usize,
    lease: Option<LeaseConfig>,
) -> Option<Run> {
    let set = Arc::new(RedisSentinels::start(replicas)?);
    let mut config = RedisConfig::new(set.url())
        .on_error(policy)
        .timeout(TIMEOUT)
        .retry_interval(Duration::from_millis(100))
        .prefix(format!("failover-{policy}-{}", lease.is_some()));
    if let Some(lease) = lease {
        config = config.lease(lease);
    }
    let quota = Quota::parse(CAPACITY, &format!("{PER_SECOND}/s")).unwrap();
    let store = RedisStore::connect(AnyAlgorithm::new(Kind::Gcra, quota), config)
        .await
        .expect("the store finds the master through the Sentinels");
    assert!(store.is_using_redis());
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (store, stop) = (store.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut answers = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let outcome = match store.check("hot", 1).await {
                        Ok(_) => Outcome::Admitted,
                        Err(Error::Limited { .. }) => Outcome::Limited,
                        Err(Error::Unavailable { .. }) => Outcome::Unavailable,
                        Err(e) => panic!("{e}"),
                    };
                    answers.push(Answer {
                        sent,
                        got: Instant::now(),
                        outcome,
                    });
                    match outcome {
                        Outcome::Admitted => {}
                        // A pause: spinning on cached denials or on the policy would only take
                        // the CPU from the Redis processes of a loaded machine.
                        _ => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                answers
            })
        })
        .collect();
    // Whether the store uses Redis, every 5 ms.
    let monitor = {
        let (store, stop) = (store.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut samples = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                samples.push((Instant::now(), store.is_using_redis()));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            samples
        })
    };
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (asked, promoted, named, new) = tokio::task::spawn_blocking({
        let set = Arc::clone(&set);
        move || {
            let asked = Instant::now();
            set.failover();
            // Which replica the Sentinels chose: the one that answers ROLE with master.
            let new = loop {
                let masters = set.masters();
                if let Some(&new) = masters.iter().find(|&&i| i > 0) {
                    break new;
                }
                assert!(
                    asked.elapsed() < Duration::from_secs(10),
                    "no promotion within 10 s"
                );
                std::thread::sleep(Duration::from_millis(5));
            };
            let promoted = Instant::now();
            let new_port = set.servers[new].port().to_string();
            while !set
                .ports
                .iter()
                .all(|&p| set.sentinel_master(p).get("port") == Some(&new_port))
            {
                assert!(
                    asked.elapsed() < Duration::from_secs(20),
                    "the Sentinels did not all name the new master within 20 s"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
            (asked, promoted, Instant::now(), new)
        }
    })
    .await
    .unwrap();
    // Decisions must be back within 2 s of the promotion; 1.5 s more to see them there.
    tokio::time::sleep(Duration::from_millis(3_500).saturating_sub(promoted.elapsed())).await;
    stop.store(true, Ordering::Relaxed);
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    answers.sort_by_key(|a| a.got);
    let samples = monitor.await.unwrap();
    let down = samples
        .iter()
        .find(|(at, up)| *at > asked && !up)
        .map(|(at, _)| *at)
        .unwrap_or_else(|| {
            panic!(
                "{policy}: the store never stopped using the old master (last error {:?})",
                store.last_error()
            )
        });
    let up = samples
        .iter()
        .find(|(at, up)| *at > down && *up)
        .map(|(at, _)| *at)
        .unwrap_or_else(|| {
            panic!(
                "{policy}: the store was not back on Redis 3.5 s after the promotion (last error {:?})",
                store.last_error()
            )
        });
    let last_down = samples
        .iter()
        .rev()
        .find(|(at, is_up)| *at < up && !is_up)
        .map_or(down, |(at, _)| *at);
    let (calls_old, calls_new) = (
        set.servers[0].script_calls(),
        set.servers[new].script_calls(),
    );
    Some(Run {
        answers,
        asked,
        promoted,
        named,
        down,
        last_down,
        up,
        calls_old,
        calls_new,
    })
}

fn ms(later: Instant, earlier: Instant) -> String {
    if later >= earlier {
        format!("+{} ms", later.duration_since(earlier).as_millis())
    } else {
        format!("-{} ms", earlier.duration_since(later).as_millis())
    }
}

/// The figures of a run, printed.
fn report(policy: OnError, run: &Run) {
    let first = run.answers.first().unwrap().sent;
    let last = run.answers.last().unwrap().got;
    let admitted = run
        .answers
        .iter()
        .filter(|a| a.outcome == Outcome::Admitted)
        .count();
    eprintln!(
        "{policy}: failover asked {}, replica promoted P, store off Redis at P{}, Sentinels all name the new master at P{}, store back on Redis at P{}; \
         {} answers over {:.2} s, {admitted} admitted (bound {:.0}); scripts run: old master {}, new master {}",
        ms(run.asked, run.promoted),
        ms(run.down, run.promoted),
        ms(run.named, run.promoted),
        ms(run.up, run.promoted),
        run.answers.len(),
        last.duration_since(first).as_secs_f64(),
        bound(last.duration_since(first).as_secs_f64()),
        run.calls_old,
        run.calls_new,
    );
}

/// Decisions back on Redis, the new master, within 2 s of the promotion, and admissions
/// again from it.
fn assert_resumed(policy: OnError, run: &Run) {
    if policy == OnError::Deny {
        // Only Redis admits: the first admission after the store went off Redis is the new
        // master's.
        let first = run
            .answers
            .iter()
            .find(|a| a.sent > run.down && a.outcome == Outcome::Admitted)
            .expect("deny: an admission after the failover");
        eprintln!(
            "deny: first admission after the failover answered at P{}",
            ms(first.got, run.promoted)
        );
        assert!(
            first.got.duration_since(run.promoted) <= Duration::from_secs(2),
            "deny: first admission {} after the promotion, more than 2 s",
            ms(first.got, run.promoted)
        );
    }
    assert!(
        run.up.duration_since(run.promoted) <= Duration::from_secs(2),
        "{policy}: back on Redis {} after the promotion, more than 2 s",
        ms(run.up, run.promoted)
    );
    assert!(run.calls_new > 0, "{policy}: the new master ran no script");
    let admitted_after = run
        .answers
        .iter()
        .filter(|a| a.sent > run.up && a.outcome == Outcome::Admitted)
        .count();
    assert!(
        admitted_after > 0,
        "{policy}: nothing admitted once back on Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_with_on_error_deny_stays_within_the_limit() {
    let _heavy = HEAVY.lock().await;
    if let Some(run) = failover_under_load(OnError::Deny, 1).await {
        deny_run(&run);
    }
}

/// With two replicas, the one not promoted follows the old master (and would acknowledge its
/// writes) until the Sentinels point it at the new one: the old master must still admit
/// nothing once the other is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_of_a_master_with_two_replicas_stays_within_the_limit() {
    let _heavy = HEAVY.lock().await;
    if let Some(run) = failover_under_load(OnError::Deny, 2).await {
        deny_run(&run);
    }
}

/// Leased slices across a failover: a slice is spent only once the replicas have it, so the
/// promoted master still holds it, and no window goes above the bound. (A slice confirmed
/// before the failover may be spent while the store is off Redis: it was counted already.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_with_leased_slices_stays_within_the_limit() {
    let _heavy = HEAVY.lock().await;
    let lease = LeaseConfig::new(LeaseSize::Tokens(10), Duration::from_millis(100));
    let Some(run) = failover_under_load_with(OnError::Deny, 1, Some(lease)).await else {
        return;
    };
    report(OnError::Deny, &run);
    assert_resumed(OnError::Deny, &run);
    let admissions: Vec<Answer> = run
        .answers
        .iter()
        .copied()
        .filter(|a| a.outcome == Outcome::Admitted)
        .collect();
    let (count, allowed, span) = worst_window(&admissions);
    eprintln!(
        "leases: closest window to the limit: {count} admitted in {span:?}, bound {allowed:.1}"
    );
    assert!(
        count as f64 <= allowed + 1e-9,
        "leases: {count} admitted within {span:?}, above the bound {allowed:.1}"
    );
}

/// The checks of a failover under `on_error = deny`.
fn deny_run(run: &Run) {
    report(OnError::Deny, run);
    assert_resumed(OnError::Deny, run);
    // Every admission is Redis's (deny admits nothing by itself): within the limit in every
    // window of the run, the failover included.
    let admissions: Vec<Answer> = run
        .answers
        .iter()
        .copied()
        .filter(|a| a.outcome == Outcome::Admitted)
        .collect();
    let (count, allowed, span) = worst_window(&admissions);
    eprintln!(
        "deny: closest window to the limit: {count} admitted in {span:?}, bound {allowed:.1}"
    );
    assert!(
        count as f64 <= allowed + 1e-9,
        "deny: {count} admitted within {span:?}, above the bound {allowed:.1}"
    );
    // While no master answered (the store seen off Redis), the policy refused: nothing
    // admitted, some refused as unavailable, none waiting longer than the timeout.
    let off: Vec<&Answer> = run
        .answers
        .iter()
        .filter(|a| a.sent > run.down && a.got <= run.last_down)
        .collect();
    let unavailable = off
        .iter()
        .filter(|a| a.outcome == Outcome::Unavailable)
        .count();
    let slowest = off
        .iter()
        .map(|a| a.got.duration_since(a.sent))
        .max()
        .unwrap_or_default();
    eprintln!(
        "deny: seen off Redis for {} ms: {} answers, {unavailable} unavailable, {} admitted, slowest {slowest:?}",
        run.last_down.duration_since(run.down).as_millis(),
        off.len(),
        off.iter().filter(|a| a.outcome == Outcome::Admitted).count()
    );
    assert!(unavailable > 0, "deny: no request refused as unavailable");
    assert!(
        off.iter().all(|a| a.outcome != Outcome::Admitted),
        "deny: admitted while off Redis"
    );
    assert!(
        slowest <= TIMEOUT * 2 + Duration::from_millis(200),
        "deny: a request waited {slowest:?} while off Redis"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_under_load_with_on_error_local_decides_in_process_meanwhile() {
    let _heavy = HEAVY.lock().await;
    let Some(run) = failover_under_load(OnError::Local, 1).await else {
        return;
    };
    report(OnError::Local, &run);
    assert_resumed(OnError::Local, &run);
    // While off Redis, the same quota in this process decided: it admitted, within its own
    // limit over that time.
    let local: Vec<Answer> = run
        .answers
        .iter()
        .copied()
        .filter(|a| a.sent > run.down && a.got <= run.last_down && a.outcome == Outcome::Admitted)
        .collect();
    let off = run.last_down.duration_since(run.down).as_secs_f64();
    eprintln!(
        "local: off Redis for {:.0} ms: {} admitted by the local limit (its bound {:.1})",
        off * 1000.0,
        local.len(),
        bound(off)
    );
    assert!(!local.is_empty(), "local: nothing admitted while off Redis");
    assert!(
        local.len() as f64 <= bound(off),
        "local: {} admitted in {off:.3} s, above the local bound",
        local.len()
    );
    // Over the run: Redis's limit, plus at most the local limit over the time off Redis.
    let admissions: Vec<Answer> = run
        .answers
        .iter()
        .copied()
        .filter(|a| a.outcome == Outcome::Admitted)
        .collect();
    let (count, allowed, span) = worst_window(&admissions);
    eprintln!(
        "local: closest window to the limit: {count} admitted in {span:?}, bound {allowed:.1} (+ {:.1} for the local limit)",
        bound(off)
    );
    assert!(
        count as f64 <= allowed + bound(off),
        "local: {count} admitted within {span:?}, above Redis's bound {allowed:.1} plus the local one"
    );
}
