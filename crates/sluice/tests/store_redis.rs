//! The Redis store against real redis-server processes: the scripts decide exactly as the Rust
//! core, several processes share one limit (single server and Cluster), Redis dies and comes
//! back under each on_error policy, denials are cached, acquire waits.
//!
//! Real time is needed here (Redis has its own clock): the tests assert bounds, not exact times.

#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sluice::store::{OnError, RedisConfig, RedisStore, Store};
use sluice::{AcquireOptions, Error};
use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota, SavedState};
use support::process::{helper, lines_with, role, unix_ns};
use support::proxy::LossyProxy;
use support::redis::{RedisCluster, RedisServer};

/// Held by the tests that load the machine or measure time, so that they do not run at once
/// (each would measure the others' load).
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn algorithm(kind: Kind, capacity: u64, rate: &str) -> AnyAlgorithm {
    AnyAlgorithm::new(kind, Quota::parse(capacity, rate).unwrap())
}

#[allow(dead_code)]
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

// === the scripts decide as the core ===

/// Runs one random schedule of checks, refunds and charges through the core and through Redis (with
/// the script's clock overridden) and compares every decision, field by field.
///
/// Redis expires keys on its own clock, and a key's TTL is computed from the schedule's
/// times; so that a key never vanishes while the core still holds its state, the schedule
/// moves at least as fast as real time (each step at least the real time since the last one,
/// plus 1 ms). Requests at one instant are covered by `a_burst_at_one_instant_...`.
async fn conformance(store: &RedisStore, kind: Kind, capacity: u64, rate: &str, seed: u64) {
    let alg = algorithm(kind, capacity, rate);
    let window = alg.quota().window_ns();
    let interval = alg.quota().interval_ns();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let key = format!("conf-{kind}-{capacity}-{rate}-{seed}");
    let mut state = alg.initial_state();
    // Real Unix times, so the scripts' split arithmetic meets real magnitudes, with a random
    // phase against the windows.
    let mut now = unix_ns() + rng.random_range(0..window);
    let mut last = Instant::now();
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    for step in 0..300 {
        let gap = match rng.random_range(0..10) {
            0..=6 => rng.random_range(0..interval.max(2)),
            7 | 8 => rng.random_range(0..window.max(2)),
            _ => rng.random_range(0..3 * window.max(1)),
        };
        let real = last.elapsed().as_nanos() as u64 + 1_000_000;
        last = Instant::now();
        now += gap.max(real);
        let cost = match rng.random_range(0..10) {
            0 => 0,
            1 => rng.random_range(0..=capacity),
            _ => rng.random_range(1..=capacity.min(3)),
        };
        // Now and then, give back one of the recent admissions (a request another policy
        // refused), as the core would.
        if !admitted.is_empty() && rng.random_range(0..8) == 0 {
            let (at, taken) = admitted.swap_remove(rng.random_range(0..admitted.len()));
            alg.refund(&mut state, at, now, taken);
            let ago = Duration::from_nanos(now - at);
            store.refund_at(&key, taken, ago, now).await.unwrap();
        }
        // Now and then, charge a cost learnt after the fact (up to five times the capacity,
        // into debt up to a cap or none): both take the same and forgive the same rest.
        if rng.random_range(0..8) == 0 {
            let charged = rng.random_range(0..=5 * capacity);
            let max_debt = match rng.random_range(0..3) {
                0 => u64::MAX,
                1 => 0,
                _ => rng.random_range(0..=3 * capacity),
            };
            let want = alg.charge(&mut state, now, charged, max_debt);
            let got = store.charge_at(&key, charged, max_debt, now).await.unwrap();
            assert_eq!(
                got, want,
                "{kind} capacity {capacity} at {rate}, seed {seed}, step {step}: charge {charged} (max debt {max_debt}) at {now}"
            );
        }
        let want = alg.check(&mut state, now, cost).unwrap();
        let got = store.check_at(&key, cost, now).await.unwrap();
        assert_eq!(
            got, want,
            "{kind} capacity {capacity} at {rate}, seed {seed}, step {step}: cost {cost} at {now}"
        );
        if want.allowed && cost > 0 {
            admitted.push((now, cost));
            if admitted.len() > 4 {
                admitted.remove(0);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_at_one_instant_is_decided_as_by_the_core() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for kind in [Kind::Gcra, Kind::SlidingWindow, Kind::FixedWindow] {
        // Capacity 10 at 1/s: every write keeps the key for at least a second of real time.
        let alg = algorithm(kind, 10, "1/s");
        // A prefix of its own: one key per limit and key, whatever the algorithm.
        let config = RedisConfig::new(server.url())
            .prefix(format!("burst-{kind}"))
            .timeout(Duration::from_secs(5));
        let store = RedisStore::connect(alg, config).await.unwrap();
        let mut state = alg.initial_state();
        let start = unix_ns();
        for (offset_ms, burst) in [(0u64, 14), (2_500, 5), (12_000, 12)] {
            let now = start + offset_ms * 1_000_000;
            for i in 0..burst {
                let cost = 1 + (i % 2);
                let want = alg.check(&mut state, now, cost).unwrap();
                let got = store.check_at("burst", cost, now).await.unwrap();
                assert_eq!(got, want, "{kind}: request {i} at +{offset_ms} ms");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_decide_exactly_as_the_core() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let quotas = [
        (1, "1/s"),
        (10, "5/s"),
        (3, "3/s"),       // interval 333,333,334 ns: W does not divide a second
        (7, "10 per 9s"), // W = 6.3 s: neither divides the other
        (100, "1000/s"),  // W = 100 ms divides a second
        (4, "2/s"),       // W = 2 s, a multiple of a second
        (1000, "7/min"),  // long window
        (50, "123456/s"), // odd interval
    ];
    let mut seed = 1;
    for kind in [
        Kind::Gcra,
        Kind::TokenBucket,
        Kind::LeakyBucket,
        Kind::SlidingWindow,
        Kind::FixedWindow,
    ] {
        for (capacity, rate) in quotas {
            let alg = algorithm(kind, capacity, rate);
            // A generous timeout: this compares answers, it does not time them.
            let config = RedisConfig::new(server.url())
                .prefix("conf")
                .timeout(Duration::from_secs(5));
            let store = RedisStore::connect(alg, config).await.unwrap();
            for _ in 0..3 {
                conformance(&store, kind, capacity, rate, seed).await;
                seed += 1;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_and_huge_windows_are_refused_with_a_reason() {
    let config = RedisConfig::new("redis://127.0.0.1:1");
    let err = RedisStore::connect(algorithm(Kind::SlidingLog, 5, "1/s"), config.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("sliding_window"), "{err}");
    let err = RedisStore::new(algorithm(Kind::Gcra, 2000, "1/h"), config).unwrap_err();
    assert!(err.to_string().contains("52 days"), "{err}");
    let err = RedisStore::new(
        algorithm(Kind::Gcra, 1, "1/s"),
        RedisConfig::new("nope://x"),
    )
    .unwrap_err();
    assert!(err.to_string().contains("nope://x"), "{err}");
    assert_eq!("local".parse::<OnError>().unwrap(), OnError::Local);
    assert!("sometimes".parse::<OnError>().is_err());
}

// === a changed quota or algorithm ===

/// Checks cost 1 for `key` `n` times; returns how many were admitted.
async fn admitted(store: &RedisStore, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if store.check(key, 1).await.is_ok() {
            ok += 1;
        }
    }
    ok
}

/// A store on `server` under `prefix`, with a timeout that a loaded machine does not reach.
async fn store_on(server: &RedisServer, prefix: &str, alg: AnyAlgorithm) -> RedisStore {
    let config = RedisConfig::new(server.url())
        .prefix(prefix)
        .timeout(Duration::from_secs(5));
    RedisStore::connect(alg, config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_did_not_reload_never_gains_from_one_that_did() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for kind in [Kind::Gcra, Kind::FixedWindow, Kind::SlidingWindow] {
        // At 1/h nothing comes back during the test: the key has what it had left, no more.
        let (big, small) = (algorithm(kind, 5, "1/h"), algorithm(kind, 2, "1/h"));
        for (first, then, spent, left) in [(big, small, 3, 2), (small, big, 1, 1)] {
            let prefix = format!("two-{kind}-{}", first.quota().capacity());
            // Both gateways ran `first`; one reloads to `then`, the other does not.
            let stays = store_on(&server, &prefix, first).await;
            assert_eq!(admitted(&stays, "k", spent).await, spent, "{kind}");
            let reloaded = store_on(&server, &prefix, then).await;
            let mut total = 0;
            for _ in 0..6 {
                total += admitted(&reloaded, "k", 1).await;
                total += admitted(&stays, "k", 1).await;
            }
            assert_eq!(
                total,
                left,
                "{kind}, {} then {}: the {left} left, no more, no less",
                first.quota(),
                then.quota()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_algorithm_and_back_revives_no_stale_key() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (one, other) in [
        (Kind::Gcra, Kind::FixedWindow),
        (Kind::TokenBucket, Kind::SlidingWindow),
        (Kind::SlidingWindow, Kind::FixedWindow),
        (Kind::FixedWindow, Kind::LeakyBucket),
    ] {
        let prefix = format!("switch-{one}-{other}");
        let (a, b) = (algorithm(one, 5, "1/h"), algorithm(other, 5, "1/h"));
        let first = store_on(&server, &prefix, a).await;
        assert_eq!(admitted(&first, "k", 2).await, 2);
        let switched = store_on(&server, &prefix, b).await;
        assert_eq!(
            admitted(&switched, "k", 10).await,
            3,
            "{one} -> {other}: what the key had left"
        );
        let back = store_on(&server, &prefix, a).await;
        assert_eq!(
            admitted(&back, "k", 10).await,
            0,
            "{one} -> {other} -> {one}: spent, not the stale key"
        );
        let keys = server.cli(&["KEYS", &format!("{prefix}*")]);
        assert_eq!(keys.trim(), format!("{prefix}:{{k}}"), "one key");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_reconfigured_in_place_never_admits_more_than_a_key_had_left() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for kind in [Kind::Gcra, Kind::FixedWindow, Kind::SlidingWindow] {
        let (ten, five) = (algorithm(kind, 10, "1/h"), algorithm(kind, 5, "1/h"));
        let store = store_on(&server, &format!("inplace-{kind}"), ten).await;
        let clone = store.clone();
        assert_eq!(admitted(&store, "k", 7).await, 7);
        // Denied under 10, remembered by the denial cache: forgotten by the change.
        assert_eq!(admitted(&store, "spent", 11).await, 10);
        store.reconfigure(five, 0, Duration::ZERO, 1_000).unwrap();
        assert_eq!(clone.algorithm(), five, "every clone uses the new quota");
        assert_eq!(admitted(&clone, "k", 1).await, 1, "{kind}");
        store.reconfigure(ten, 0, Duration::ZERO, 1_000).unwrap();
        assert_eq!(
            admitted(&store, "k", 20).await,
            2,
            "{kind}: 3 left under 10, 1 spent under 5: 2 left under 10 again"
        );
        assert_eq!(admitted(&store, "spent", 20).await, 0, "{kind}");
        assert_eq!(admitted(&store, "fresh", 20).await, 10, "{kind}");
        // An algorithm the scripts cannot run changes nothing.
        assert!(store
            .reconfigure(
                algorithm(Kind::SlidingLog, 5, "1/h"),
                0,
                Duration::ZERO,
                1_000
            )
            .is_err());
        assert_eq!(store.algorithm(), ten);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restarted_with_a_smaller_quota_and_raised_again_gains_nothing() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for kind in [Kind::Gcra, Kind::FixedWindow, Kind::SlidingWindow] {
        let prefix = format!("restart-{kind}");
        let (ten, five) = (algorithm(kind, 10, "1/h"), algorithm(kind, 5, "1/h"));
        // Raised to 10 by a reload...
        let raised = store_on(&server, &prefix, ten).await;
        drop(raised);
        // ...restarted with 5 in the configuration, which spends the key...
        let restarted = store_on(&server, &prefix, five).await;
        assert_eq!(admitted(&restarted, "k", 10).await, 5, "{kind}");
        // ...and raised to 10 again: the key has nothing left, as under 5.
        let raised = store_on(&server, &prefix, ten).await;
        assert_eq!(admitted(&raised, "k", 10).await, 0, "{kind}");
    }
}

/// The stamp of the values `alg` writes.
fn stamp(alg: &AnyAlgorithm) -> String {
    let family = match alg.which() {
        Kind::FixedWindow => "fw",
        Kind::SlidingWindow => "sw",
        _ => "gcra",
    };
    format!(
        "{family}:{}:{}",
        alg.quota().capacity(),
        alg.quota().interval_ns()
    )
}

/// A stored value as `alg` writes it, for `saved` at `now`.
fn value_of(alg: &AnyAlgorithm, saved: &SavedState, now: u64) -> String {
    let body = match saved {
        SavedState::Debt { debt_ns } => format!("{}", now + debt_ns),
        SavedState::Window { ends_in_ns, count } => format!("{} {count}", now + ends_in_ns),
        SavedState::Sliding {
            ends_in_ns,
            previous,
            current,
        } => format!("{} {previous} {current}", now + ends_in_ns),
        SavedState::Log { .. } => unreachable!(),
    };
    format!("{}|{body}", stamp(alg))
}

/// The state in a stored value written under `alg`, relative to `now`.
fn saved_in(alg: &AnyAlgorithm, value: &str, now: u64) -> SavedState {
    let (head, body) = value.split_once('|').unwrap();
    assert_eq!(head, stamp(alg), "{value}");
    let n: Vec<u64> = body.split(' ').map(|x| x.parse().unwrap()).collect();
    let rel = n[0].checked_sub(now).unwrap();
    match alg.which() {
        Kind::FixedWindow => SavedState::Window {
            ends_in_ns: rel,
            count: n[1],
        },
        Kind::SlidingWindow => SavedState::Sliding {
            ends_in_ns: rel,
            previous: n[1],
            current: n[2],
        },
        _ => SavedState::Debt { debt_ns: rel },
    }
}

/// A random algorithm of `kind` whose quota the scripts take.
fn any_algorithm(rng: &mut impl Rng, kind: Kind) -> AnyAlgorithm {
    let capacities = [1, 2, 3, 7, 10, 64, 1_000, 100_000, 50_000_000];
    let intervals = [
        1,
        7,
        1_000,
        999_983,
        100_000_000,
        333_333_334,
        1_000_000_000,
        60_000_000_000,
    ];
    loop {
        let capacity: u64 = capacities[rng.random_range(0..capacities.len())];
        let interval: u64 = intervals[rng.random_range(0..intervals.len())];
        let window = u128::from(capacity) * u128::from(interval);
        let window_kind = matches!(kind, Kind::FixedWindow | Kind::SlidingWindow);
        if window <= 1 << 52 && (!window_kind || capacity <= 94_906_265) {
            let quota = Quota::new(
                capacity,
                sluice_core::Rate::from_interval_ns(interval).unwrap(),
            )
            .unwrap();
            return AnyAlgorithm::new(kind, quota);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_another_quota_is_converted_on_read_as_the_core_converts_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let mut conn = raw(&server.url()).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let kinds = [
        Kind::Gcra,
        Kind::TokenBucket,
        Kind::LeakyBucket,
        Kind::FixedWindow,
        Kind::SlidingWindow,
    ];
    let mut case = 0;
    for _ in 0..40 {
        let to_kind = kinds[rng.random_range(0..kinds.len())];
        let to = any_algorithm(&mut rng, to_kind);
        let store = store_on(&server, "exact", to).await;
        for _ in 0..40 {
            case += 1;
            let same = rng.random_range(0..10) < 7;
            let from_kind = if same {
                to.which()
            } else {
                kinds[rng.random_range(0..kinds.len())]
            };
            let from = any_algorithm(&mut rng, from_kind);
            let (n, w) = (from.quota().capacity(), from.quota().window_ns());
            let saved = match from.which() {
                Kind::FixedWindow => SavedState::Window {
                    ends_in_ns: rng.random_range(0..=w),
                    count: rng.random_range(0..=n + 1),
                },
                Kind::SlidingWindow => SavedState::Sliding {
                    ends_in_ns: rng.random_range(0..=w),
                    previous: rng.random_range(0..=n + 1),
                    current: rng.random_range(0..=n + 1),
                },
                _ => SavedState::Debt {
                    debt_ns: rng.random_range(0..=w),
                },
            };
            let key = format!("case-{case}");
            let now = unix_ns();
            let _: () = redis::cmd("SET")
                .arg(format!("exact:{{{key}}}"))
                .arg(value_of(&from, &saved, now))
                .query_async(&mut conn)
                .await
                .unwrap();
            let got = store.check_at(&key, 0, now).await.unwrap();
            let value: String = redis::cmd("GET")
                .arg(format!("exact:{{{key}}}"))
                .query_async(&mut conn)
                .await
                .unwrap();
            let converted = saved_in(&to, &value, now);
            let what = format!("case {case}: {saved:?} of {from:?} read by {to:?}");
            let mut state = to.restore(&converted, now, 0).unwrap();
            assert_eq!(
                got,
                to.check(&mut state, now, 0).unwrap(),
                "{what}: the script decides on what it wrote"
            );
            let before = {
                let mut state = from.restore(&saved, now, 0).unwrap();
                from.check(&mut state, now, 0).unwrap().remaining
            };
            assert!(
                got.remaining <= before.min(to.quota().capacity()),
                "{what}: {} left, {before} before",
                got.remaining
            );
            if same {
                // (A value under the reader's own stamp is left as it is: normalised here.)
                let normal = to.save(&to.restore(&converted, 0, 0).unwrap(), 0);
                assert_eq!(
                    normal,
                    to.convert_saved(&from, &saved).unwrap(),
                    "{what}: exactly as the core"
                );
            }
        }
    }
}

// === several processes share one limit ===

/// The helper: hammers `SLUICE_KEYS` keys through Redis from `SLUICE_START_MS` (Unix ms) for
/// `SLUICE_RUN_MS`, with 4 tasks, and prints `ADMITTED <key> <count>` per key.
#[test]
fn helper_redis_hammer() {
    let Some(_role) = role() else {
        return;
    };
    let env = |k: &str| std::env::var(k).unwrap();
    let urls: Vec<String> = env("SLUICE_REDIS_URLS")
        .split(',')
        .map(String::from)
        .collect();
    let keys: Vec<String> = (0..env("SLUICE_KEYS").parse::<usize>().unwrap())
        .map(|i| format!("{}-{i}", env("SLUICE_KEY_PREFIX")))
        .collect();
    let capacity: u64 = env("SLUICE_CAPACITY").parse().unwrap();
    let rate = env("SLUICE_RATE");
    let start_ms: u64 = env("SLUICE_START_MS").parse().unwrap();
    let run_ms: u64 = env("SLUICE_RUN_MS").parse().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let config = if urls.len() > 1 {
            RedisConfig::cluster(urls)
        } else {
            RedisConfig::new(urls[0].clone())
        };
        // Deny when Redis is slow: every admission counted here is Redis's.
        let config = config
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(2));
        let store = RedisStore::connect(algorithm(Kind::Gcra, capacity, &rate), config)
            .await
            .unwrap();
        let start = std::time::UNIX_EPOCH + Duration::from_millis(start_ms);
        let end = start + Duration::from_millis(run_ms);
        if let Ok(wait) = start.duration_since(std::time::SystemTime::now()) {
            tokio::time::sleep(wait).await;
        }
        let keys = std::sync::Arc::new(keys);
        let mut tasks = Vec::new();
        for t in 0..4 {
            let store = store.clone();
            let keys = keys.clone();
            tasks.push(tokio::spawn(async move {
                let mut admitted: HashMap<String, u64> = HashMap::new();
                let mut unavailable = 0u64;
                let mut i = t;
                while std::time::SystemTime::now() < end {
                    let key = &keys[i % keys.len()];
                    i += 1;
                    match store.check(key, 1).await {
                        Ok(_) => *admitted.entry(key.clone()).or_default() += 1,
                        Err(Error::Limited { retry_after, .. }) if keys.len() == 1 => {
                            tokio::time::sleep(retry_after.min(Duration::from_millis(2))).await
                        }
                        // Next key after a pause: spinning over denied keys (answered by
                        // the denial cache) would only take the CPU from the Redis servers
                        // on a loaded machine, and the test would measure that.
                        Err(Error::Limited { .. }) => {
                            tokio::time::sleep(Duration::from_millis(1)).await
                        }
                        Err(Error::Unavailable { .. }) => unavailable += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                (admitted, unavailable)
            }));
        }
        let mut total: HashMap<String, u64> = HashMap::new();
        let mut unavailable = 0;
        for task in tasks {
            let (admitted, u) = task.await.unwrap();
            unavailable += u;
            for (k, n) in admitted {
                *total.entry(k).or_default() += n;
            }
        }
        // A line of its own first: libtest prints the test's name without a line break.
        println!();
        for (k, n) in total {
            println!("ADMITTED {k} {n}");
        }
        println!("UNAVAILABLE {unavailable}");
    });
}

/// Runs `processes` hammer helpers together and sums what they admitted, per key.
fn hammer(
    processes: usize,
    urls: &[String],
    keys: usize,
    capacity: u64,
    rate: &str,
    run_ms: u64,
) -> (HashMap<String, u64>, u64) {
    let prefix = format!("hammer-{}", unix_ns());
    // Start together, once every process is up (a debug build takes a moment to start).
    let start_ms = unix_ns() / 1_000_000 + 1_500;
    let children: Vec<_> = (0..processes)
        .map(|i| {
            helper("helper_redis_hammer", &format!("hammer-{i}"))
                .env("SLUICE_REDIS_URLS", urls.join(","))
                .env("SLUICE_KEYS", keys.to_string())
                .env("SLUICE_KEY_PREFIX", &prefix)
                .env("SLUICE_CAPACITY", capacity.to_string())
                .env("SLUICE_RATE", rate)
                .env("SLUICE_START_MS", start_ms.to_string())
                .env("SLUICE_RUN_MS", run_ms.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut per_key: HashMap<String, u64> = HashMap::new();
    let mut unavailable = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a hammer process failed");
        let out = String::from_utf8(out.stdout).unwrap();
        for line in lines_with(&out, "ADMITTED ") {
            let (k, n) = line.rsplit_once(' ').unwrap();
            *per_key.entry(k.to_string()).or_default() += n.parse::<u64>().unwrap();
        }
        unavailable += lines_with(&out, "UNAVAILABLE ")
            .map(|n| n.parse::<u64>().unwrap())
            .sum::<u64>();
    }
    (per_key, unavailable)
}

#[test]
fn processes_sharing_one_redis_admit_the_limit_between_them() {
    let _heavy = HEAVY.blocking_lock();
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (capacity, per_second, secs) = (50u64, 100u64, 10u64);
    let (per_key, unavailable) = hammer(3, &[server.url()], 1, capacity, "100/s", secs * 1000);
    let total: u64 = per_key.values().sum();
    let bound = capacity + per_second * secs;
    eprintln!("3 processes, one key, {secs} s: admitted {total} of at most {bound} (+1)");
    assert!(total <= bound + 1, "admitted {total}, above {bound} + 1");
    assert!(
        total * 100 >= bound * 95,
        "admitted {total}, below 95% of {bound}: false denials"
    );
    assert_eq!(unavailable, 0);
}

#[test]
fn processes_sharing_a_redis_cluster_admit_each_keys_limit() {
    let _heavy = HEAVY.blocking_lock();
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let (keys, capacity, per_second, secs) = (150usize, 5u64, 10u64, 10u64);
    let (per_key, unavailable) = hammer(2, &cluster.urls(), keys, capacity, "10/s", secs * 1000);
    let spread = cluster.keys_per_node();
    let bound = capacity + per_second * secs;
    let total: u64 = per_key.values().sum();
    eprintln!(
        "2 processes, {keys} keys on a 3-master cluster (keys per node {spread:?}), {secs} s: admitted {total} of at most {}, {unavailable} unavailable",
        bound * keys as u64
    );
    assert_eq!(per_key.len(), keys, "every key was admitted something");
    for (k, n) in &per_key {
        assert!(*n <= bound + 1, "{k}: admitted {n}, above {bound} + 1");
    }
    assert!(
        total * 100 >= bound * keys as u64 * 95,
        "admitted {total}, below 95% of {}",
        bound * keys as u64
    );
    assert!(
        spread.iter().all(|&n| n > 0),
        "keys on every master: {spread:?}"
    );
    assert_eq!(unavailable, 0);
}

// === Redis dies and comes back ===

/// Load while Redis is killed and restarted: each request asks twice for a new key (capacity
/// 1 per minute), so every first ask goes to Redis (no cached denial), and the second tells a
/// limit (refused) from no limit (admitted). Checks what the policy decides meanwhile and how
/// soon Redis decides again.
async fn outage(policy: OnError) {
    let _heavy = HEAVY.lock().await;
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    // A dead Redis refuses connections at once; the timeout only has to cover a slow answer
    // of a debug build on a loaded machine, which must not count as an outage here.
    let config = RedisConfig::new(server.url())
        .on_error(policy)
        .timeout(Duration::from_millis(250))
        .retry_interval(Duration::from_millis(250));
    let store = RedisStore::connect(algorithm(Kind::Gcra, 1, "1/min"), config)
        .await
        .unwrap();
    let load = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut log = Vec::new();
            let start = Instant::now();
            let mut i = 0u64;
            while start.elapsed() < Duration::from_millis(3_500) {
                let key = format!("k{i}");
                i += 1;
                let sent = Instant::now();
                let first = store.check(&key, 1).await;
                let second = store.check(&key, 1).await;
                log.push((sent, sent.elapsed(), first, second));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            log
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(store.is_using_redis());
    let killed = Instant::now();
    server.kill();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        !store.is_using_redis(),
        "{policy}: still using a dead Redis"
    );
    let restarting = Instant::now();
    server.restart();
    let answering = Instant::now();
    while !store.is_using_redis() || server.script_calls() == 0 {
        assert!(
            answering.elapsed() < Duration::from_secs(1),
            "{policy}: decisions did not go back to Redis within 1 s of it answering (last error: {:?})",
            store.last_error()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let back_after = answering.elapsed();
    let log = load.await.expect("the load task did not panic");
    let limited = |r: &Result<_, Error>| matches!(r, Err(Error::Limited { .. }));
    let unavailable = |r: &Result<_, Error>| matches!(r, Err(Error::Unavailable { .. }));
    // (Those sent well before the kill: one in flight at the kill gets the policy.)
    let before: Vec<_> = log
        .iter()
        .filter(|(sent, ..)| *sent + Duration::from_millis(100) < killed)
        .collect();
    assert!(
        before.iter().all(|(_, _, a, b)| a.is_ok() && limited(b)),
        "{policy}: Redis decides before the outage"
    );
    // While Redis was down (from a little after the kill to a little before the restart: a
    // probe may find it as soon as it listens), the policy decided.
    let down: Vec<_> = log
        .iter()
        .filter(|(sent, ..)| {
            *sent > killed + Duration::from_millis(100)
                && *sent + Duration::from_millis(50) < restarting
        })
        .collect();
    assert!(
        down.len() > 50,
        "{policy}: only {} requests during the outage",
        down.len()
    );
    let slowest = down.iter().map(|(_, took, ..)| *took).max().unwrap();
    assert!(
        slowest < Duration::from_millis(300),
        "{policy}: two requests took {slowest:?} during the outage"
    );
    type Answer = Result<sluice_core::Decision, Error>;
    let what = |f: &dyn Fn(&Answer, &Answer) -> bool| down.iter().all(|(_, _, a, b)| f(a, b));
    match policy {
        OnError::Allow => assert!(
            what(&|a, b| a.is_ok() && b.is_ok()),
            "allow admits everything"
        ),
        OnError::Deny => assert!(
            what(&|a, b| unavailable(a) && unavailable(b)),
            "deny refuses everything with Unavailable"
        ),
        OnError::Local => assert!(
            what(&|a, b| a.is_ok() && limited(b)),
            "local keeps the limit in this process"
        ),
    }
    // Once back, Redis decides again.
    let after: Vec<_> = log
        .iter()
        .filter(|(sent, ..)| *sent > answering + back_after)
        .collect();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|(_, _, a, b)| a.is_ok() && limited(b)),
        "{policy}: after recovery Redis decides"
    );
    eprintln!(
        "{policy}: {} requests while down, slowest {slowest:?}; back to Redis {back_after:?} after it answered",
        down.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_then_back_with_policy_allow() {
    outage(OnError::Allow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_then_back_with_policy_deny() {
    outage(OnError::Deny).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_then_back_with_policy_local() {
    outage(OnError::Local).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_made_while_redis_is_down_starts_using_it_when_it_answers() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    server.kill();
    let config = RedisConfig::new(server.url())
        .on_error(OnError::Deny)
        .retry_interval(Duration::from_millis(100));
    let store = RedisStore::new(algorithm(Kind::Gcra, 5, "1/s"), config).unwrap();
    assert!(matches!(
        store.check("k", 1).await,
        Err(Error::Unavailable { .. })
    ));
    assert!(RedisStore::connect(
        algorithm(Kind::Gcra, 5, "1/s"),
        RedisConfig::new(server.url())
    )
    .await
    .unwrap_err()
    .to_string()
    .contains(&server.url().replace("redis://", "")));
    server.restart();
    let answering = Instant::now();
    while store.check("k", 1).await.is_err() {
        assert!(answering.elapsed() < Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(store.is_using_redis());
}

/// The log lines written while it is the thread's subscriber.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

// One thread (the test's), so that its log subscriber sees the store's logs.
#[tokio::test]
async fn a_redis_that_stops_answering_gets_on_error_within_the_timeout_and_is_back_soon_after() {
    use tracing_subscriber::util::SubscriberInitExt;
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let logs = Logs::default();
    let _logs = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .set_default();
    // Long enough for a debug build's answer on a loaded machine, which must not count as an
    // outage here; the bound under test is the timeout plus 10 ms.
    let timeout = Duration::from_millis(100);
    let config = RedisConfig::new(server.url())
        .on_error(OnError::Deny)
        .timeout(timeout);
    let store = RedisStore::connect(algorithm(Kind::Gcra, 1, "1/min"), config)
        .await
        .unwrap();
    let start = Instant::now();
    let end = Duration::from_millis(2_800);
    // Four clients, each asking for a new key (admitted whenever Redis decides).
    let loaders: Vec<_> = (0..4)
        .map(|n| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut log = Vec::new();
                let mut i = 0;
                while start.elapsed() < end {
                    let sent = Instant::now();
                    let answer = store.check(&format!("c{n}-{i}"), 1).await;
                    log.push((sent, sent.elapsed(), answer));
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                log
            })
        })
        .collect();
    // A ticker on the same thread measures how late the thread itself runs (a loaded machine
    // pauses the whole process): that time is not the store's.
    let ticker = tokio::spawn(async move {
        let mut ticks = Vec::new();
        while start.elapsed() < end + Duration::from_millis(200) {
            let before = Instant::now();
            tokio::time::sleep(Duration::from_millis(1)).await;
            ticks.push((before, before.elapsed()));
        }
        ticks
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.signal("STOP");
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    server.signal("CONT");
    let resumed = Instant::now();
    let mut log = Vec::new();
    for loader in loaders {
        log.extend(loader.await.unwrap());
    }
    log.sort_by_key(|(sent, ..)| *sent);
    let ticks = ticker.await.unwrap();

    // Every request is answered within the timeout + 10 ms, plus the longest stall of this
    // thread while it was pending (a 1 ms sleep that took longer; at most 40 ms is excused).
    let stall = |from: Instant, to: Instant| {
        ticks
            .iter()
            .filter(|(at, took)| *at + *took >= from && *at <= to)
            .map(|(_, took)| took.saturating_sub(Duration::from_millis(2)))
            .max()
            .unwrap_or_default()
            .min(Duration::from_millis(40))
    };
    let slowest = log.iter().map(|(_, took, _)| *took).max().unwrap();
    for (sent, took, answer) in &log {
        let excused = stall(*sent, *sent + *took);
        assert!(
            *took <= timeout + Duration::from_millis(10) + excused,
            "a request took {took:?} ({answer:?}), above the timeout {timeout:?} + 10 ms + {excused:?} of stall"
        );
    }
    let stopped_answers: Vec<_> = log
        .iter()
        .filter(|(sent, ..)| *sent > stopped + Duration::from_millis(5) && *sent < resumed)
        .collect();
    assert!(stopped_answers.len() > 50, "{}", stopped_answers.len());
    assert!(
        stopped_answers
            .iter()
            .all(|(.., a)| matches!(a, Err(Error::Unavailable { .. }))),
        "on_error = deny while Redis is stopped"
    );
    // Back on Redis within 1 s of SIGCONT, and from then on.
    let back = log
        .iter()
        .find(|(sent, _, a)| *sent >= resumed && a.is_ok())
        .map(|(sent, took, _)| *sent + *took - resumed)
        .expect("Redis decides again after SIGCONT");
    assert!(back < Duration::from_secs(1), "back after {back:?}");
    assert!(log
        .iter()
        .filter(|(sent, ..)| *sent > resumed + back)
        .all(|(.., a)| a.is_ok()));
    assert!(log
        .iter()
        .filter(|(sent, took, _)| *sent + *took < stopped)
        .all(|(.., a)| a.is_ok()));
    // One line per change of health, however many requests and probes failed.
    let text = logs.text();
    let down = text.matches("redis store down").count();
    let recovered = text.matches("redis store recovered").count();
    assert_eq!((down, recovered), (1, 1), "{text}");
    assert!(
        text.contains("WARN") && text.contains("on_error=deny"),
        "{text}"
    );
    assert!(
        text.find("redis store down") < text.find("redis store recovered"),
        "{text}"
    );
    eprintln!(
        "{} requests while stopped, slowest request {slowest:?}, back on Redis {back:?} after SIGCONT",
        stopped_answers.len()
    );
}

// === a lost answer ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_whose_answer_is_lost_is_not_sent_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = LossyProxy::start(server.port()).await;
    let retry = Duration::from_millis(100);
    let config = RedisConfig::new(proxy.url())
        .on_error(OnError::Deny)
        .timeout(Duration::from_millis(500))
        .retry_interval(retry);
    let store = RedisStore::connect(algorithm(Kind::Gcra, 10, "1/min"), config)
        .await
        .unwrap();
    let before = server.script_calls();
    // Six requests; the answer to the third is lost after Redis decided it.
    let mut answers = Vec::new();
    for i in 0..6 {
        if i == 2 {
            proxy.lose_next_answer();
        }
        answers.push(store.check("k", 1).await);
        if i == 2 {
            assert_eq!(proxy.lost(), 1, "the proxy lost the third answer");
            // Redis is left alone for the retry interval; the next request probes it.
            tokio::time::sleep(retry + Duration::from_millis(20)).await;
        }
    }
    let sent = server.script_calls() - before;
    assert_eq!(sent, 6, "6 requests sent {sent} decisions to Redis");
    assert!(
        matches!(answers[2], Err(Error::Unavailable { .. })),
        "the request whose answer was lost follows on_error = deny: {:?}",
        answers[2]
    );
    let remaining: Vec<u64> = answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|d| d.remaining))
        .collect();
    // Spent once each, the lost one included: no double spend.
    assert_eq!(remaining, [9, 8, 6, 5, 4]);
    assert!(store.is_using_redis());

    // A refund whose answer is lost gives the token back once, not twice.
    proxy.lose_next_answer();
    store.refund("k", 1, Duration::ZERO).await;
    assert_eq!(proxy.lost(), 2);
    tokio::time::sleep(retry + Duration::from_millis(20)).await;
    assert_eq!(store.peek("k").await.unwrap().remaining, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_followed_at_once_by_decisions_on_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = LossyProxy::start(server.port()).await;
    // A retry interval far beyond the test: only a store that reconnects at once passes.
    let config = RedisConfig::new(proxy.url())
        .on_error(OnError::Deny)
        .timeout(Duration::from_millis(500))
        .retry_interval(Duration::from_secs(60));
    let store = RedisStore::connect(algorithm(Kind::Gcra, 10, "1/min"), config)
        .await
        .unwrap();
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    proxy.lose_next_answer();
    assert!(matches!(
        store.check("k", 1).await,
        Err(Error::Unavailable { .. })
    ));
    assert_eq!(proxy.lost(), 1);
    assert!(store.is_using_redis(), "Redis answers: still in use");
    let started = Instant::now();
    for left in [7, 6, 5] {
        assert_eq!(store.check("k", 1).await.unwrap().remaining, left);
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(store.last_error().is_some());
}

// === the denial cache, TTLs, waiting ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_denied_key_costs_no_round_trip_until_redis_would_admit_it() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(
        algorithm(Kind::Gcra, 2, "4/s"),
        RedisConfig::new(server.url()),
    )
    .await
    .unwrap();
    store.check("hot", 2).await.unwrap();
    let Err(Error::Limited { retry_after, .. }) = store.check("hot", 1).await else {
        panic!("the key is spent")
    };
    let calls = server.script_calls();
    for _ in 0..10_000 {
        assert!(store.check("hot", 1).await.is_err());
        assert!(
            store.check("hot", 2).await.is_err(),
            "a larger cost is refused too"
        );
    }
    assert_eq!(server.script_calls(), calls, "denials came from the cache");
    assert_eq!(store.hottest(5)[0].0, "hot");
    // A smaller cost, or a peek, still asks Redis; and at the time Redis gave, it admits.
    store.peek("hot").await.unwrap();
    assert_eq!(server.script_calls(), calls + 1);
    tokio::time::sleep(retry_after).await;
    store.check("hot", 1).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_is_loaded_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = RedisStore::connect(
        algorithm(Kind::Gcra, 5, "1/s"),
        RedisConfig::new(server.url()),
    )
    .await
    .unwrap();
    store.check("k", 1).await.unwrap();
    assert!(server.cli(&["SCRIPT", "FLUSH"]).contains("OK"));
    assert_eq!(
        store.check("k", 1).await.unwrap().remaining,
        3,
        "NOSCRIPT, loaded, run"
    );
    assert!(store.is_using_redis());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_when_full_again() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for (kind, family) in [
        (Kind::Gcra, "gcra"),
        (Kind::SlidingWindow, "sw"),
        (Kind::FixedWindow, "fw"),
    ] {
        let store = RedisStore::connect(
            algorithm(kind, 10, "1/s"),
            RedisConfig::new(server.url()).prefix(format!("ttl-{family}")),
        )
        .await
        .unwrap();
        let d = store.check("k", 3).await.unwrap();
        let ttl: i64 = server
            .cli(&["PTTL", &format!("ttl-{family}:{{k}}")])
            .trim()
            .parse()
            .unwrap();
        // Full again after reset_after; the key lives that long plus the documented second.
        let want = d.reset_after_ns.div_ceil(1_000_000) as i64 + 1_000;
        assert!(
            ttl <= want && ttl > want - 500,
            "{kind}: PTTL {ttl}, reset_after + 1 s = {want}"
        );
        // A denial writes nothing.
        store.check("k", 10).await.unwrap_err();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_in_a_fifo_queue_and_asks_again_when_redis_said() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let config = RedisConfig::new(server.url()).queue(3, Duration::from_secs(1));
    let store = RedisStore::connect(algorithm(Kind::Gcra, 1, "10/s"), config)
        .await
        .unwrap();
    store.check("q", 1).await.unwrap();
    let start = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let store = store.clone();
        let tx = tx.clone();
        waiters.push(tokio::spawn(async move {
            store
                .acquire("q", 1, AcquireOptions::default())
                .await
                .unwrap();
            tx.send((i, start.elapsed())).unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The queue is full now.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(matches!(
        store.acquire("q", 1, AcquireOptions::default()).await,
        Err(Error::QueueFull { .. })
    ));
    for w in waiters {
        w.await.unwrap();
    }
    drop(tx);
    let mut order = Vec::new();
    while let Some((i, at)) = rx.recv().await {
        order.push((i, at));
    }
    assert_eq!(
        order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
        [0, 1, 2],
        "FIFO"
    );
    // One token every 100 ms after the first: at about 100, 200, 300 ms.
    for (n, (_, at)) in order.iter().enumerate() {
        let want = Duration::from_millis(100 * (n as u64 + 1));
        assert!(
            *at >= want - Duration::from_millis(15) && *at < want + Duration::from_millis(400),
            "waiter {n} at {at:?}"
        );
    }
    // A wait beyond max_wait is refused at once.
    let short = AcquireOptions {
        max_wait: Some(Duration::from_millis(10)),
        ..AcquireOptions::default()
    };
    store.check("q", 1).await.ok();
    assert!(matches!(
        store.acquire("q", 1, short).await,
        Err(Error::Timeout { .. })
    ));
}
