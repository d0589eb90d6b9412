//! The Redis store against real redis-server processes: the scripts decide exactly as the Rust
//! core, several processes share one limit (single server and Cluster), Redis dies and comes
//! back under each on_error policy, denials are cached, acquire waits.
//!
//! Real time is needed here (Redis has its own clock): the tests assert bounds, not exact times.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sluice::store::{OnError, RedisConfig, RedisStore, Store};
use sluice::{AcquireOptions, Error};
use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota};
use support::process::{helper, lines_with, role, unix_ns};
use support::redis::{RedisCluster, RedisServer};

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

/// Runs one random schedule through the core and through Redis (with the script's clock
/// overridden) and compares every decision, field by field.
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
        let want = alg.check(&mut state, now, cost).unwrap();
        let got = store.check_at(&key, cost, now).await.unwrap();
        assert_eq!(
            got, want,
            "{kind} capacity {capacity} at {rate}, seed {seed}, step {step}: cost {cost} at {now}"
        );
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
        let config = RedisConfig::new(server.url()).timeout(Duration::from_secs(5));
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
