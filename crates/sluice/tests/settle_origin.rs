//! A refund or a settled charge lands in the store that granted the admission, and nowhere
//! else: with `on_error = local`, a cost Redis took is never given back to the local store
//! (which would give the key tokens it never spent), and a cost the local store took while
//! Redis was down is never given back in Redis after it returns (which would lower the key's
//! shared state on every gateway). A refund or charge of Redis's admission that comes due
//! while Redis does not answer waits for it, and is applied once it answers again.
//!
//! Real time: Redis is paused with SIGSTOP (it keeps its connections, as a hung server does)
//! and resumed with SIGCONT; the store's timeout and retry interval are short, and the tests
//! wait for the store to see Redis again by polling.

#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use sluice::store::{OnError, Origin, RedisConfig, RedisStore, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::redis::RedisServer;

/// Capacity 10, refilled so slowly that nothing refills during a test.
fn algorithm() -> AnyAlgorithm {
    AnyAlgorithm::new(Kind::Gcra, Quota::parse(10, "10/h").unwrap())
}

async fn store(server: &RedisServer, prefix: &str) -> RedisStore {
    let config = RedisConfig::new(server.url())
        .prefix(format!("{prefix}-{}", std::process::id()))
        .on_error(OnError::Local)
        .timeout(Duration::from_millis(300))
        .retry_interval(Duration::from_millis(100));
    RedisStore::connect(algorithm(), config).await.unwrap()
}

/// Checks `key` once, answering whether it was admitted and where.
async fn admit(store: &RedisStore, key: &str) -> Option<Origin> {
    match store.check_granted(key, 1).await {
        Ok((_, origin)) => Some(origin),
        Err(Error::Limited { .. }) => None,
        Err(e) => panic!("{key}: {e}"),
    }
}

/// Admits `key` until it is refused; returns the admissions and their origins.
async fn drain(store: &RedisStore, key: &str) -> Vec<Origin> {
    let mut origins = Vec::new();
    while let Some(origin) = admit(store, key).await {
        origins.push(origin);
        assert!(origins.len() <= 10, "{key}: more than the capacity");
    }
    origins
}

/// Pauses Redis and waits for the store to decide locally.
async fn pause(server: &RedisServer, store: &RedisStore) {
    server.signal("STOP");
    while store.is_using_redis() {
        let _ = store.check_granted("health", 0).await;
    }
}

/// Resumes Redis and waits for the store to use it again.
async fn resume(server: &RedisServer, store: &RedisStore) {
    server.signal("CONT");
    for _ in 0..100 {
        let _ = store.check_granted("health", 0).await;
        if store.is_using_redis() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the store did not use Redis again within 5 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_of_what_redis_took_never_fills_the_local_store() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server, "origin-refund-redis").await;
    // Five tokens taken in Redis.
    for _ in 0..5 {
        assert_eq!(admit(&store, "k").await, Some(Origin::Store));
    }
    pause(&server, &store).await;
    // The local store answers: its own capacity, spent.
    let local = drain(&store, "k").await;
    assert_eq!(
        local,
        vec![Origin::Fallback; 10],
        "the local store's capacity"
    );
    // The five Redis admissions are given back while Redis cannot take them: not locally.
    for _ in 0..5 {
        store
            .refund_to(Origin::Store, "k", 1, Duration::from_millis(10))
            .await;
    }
    let after = drain(&store, "k").await;
    resume(&server, &store).await;
    assert!(
        after.is_empty(),
        "refunds of Redis's admissions gave the local store {} tokens",
        after.len()
    );
    // The refunds waited for Redis: once it answers, they are given back there.
    let shared = drain(&store, "k").await;
    assert_eq!(
        shared,
        vec![Origin::Store; 10],
        "Redis's own state, its five refunds applied"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_or_charge_of_what_the_local_store_took_never_reaches_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server, "origin-refund-local").await;
    // Seven of the key's ten taken in Redis (none refused: no denial is remembered).
    for _ in 0..7 {
        assert_eq!(admit(&store, "k").await, Some(Origin::Store));
    }
    pause(&server, &store).await;
    // Three admitted locally while Redis is down.
    for _ in 0..3 {
        assert_eq!(admit(&store, "k").await, Some(Origin::Fallback));
    }
    resume(&server, &store).await;
    // Given back once Redis is back: to the local store that took them, not to Redis.
    for _ in 0..3 {
        store
            .refund_to(Origin::Fallback, "k", 1, Duration::from_millis(10))
            .await;
    }
    assert_eq!(
        drain(&store, "k").await,
        vec![Origin::Store; 3],
        "Redis's key got tokens from refunds of local admissions"
    );
    // A settled charge of a local admission is taken locally, not in Redis.
    let forgiven = store.charge_to(Origin::Fallback, "c", 4, u64::MAX).await;
    assert_eq!(forgiven, 0);
    assert_eq!(
        drain(&store, "c").await,
        vec![Origin::Store; 10],
        "a charge of a local admission reached Redis"
    );
    // An admission granted by no store (on_error = allow) settles nowhere.
    assert_eq!(store.charge_to(Origin::Nowhere, "c", 4, u64::MAX).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_of_what_redis_took_never_lands_in_the_local_store() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server, "origin-charge-redis").await;
    assert_eq!(admit(&store, "k").await, Some(Origin::Store));
    pause(&server, &store).await;
    // Redis unreachable: the charge waits for it, and is not applied locally.
    let forgiven = store.charge_to(Origin::Store, "k", 7, u64::MAX).await;
    assert_eq!(forgiven, 0, "a charge that waits for Redis is not forgiven");
    let local = drain(&store, "k").await;
    resume(&server, &store).await;
    assert_eq!(
        local.len(),
        10,
        "the local store was charged for an admission Redis granted"
    );
    // Once Redis answers, the charge lands there: 10 - 1 - 7.
    assert_eq!(drain(&store, "k").await, vec![Origin::Store; 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_kept_while_redis_was_paused_land_before_the_decision_that_finds_it_back() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let store = store(&server, "origin-probe-order").await;
    assert_eq!(admit(&store, "k").await, Some(Origin::Store));
    pause(&server, &store).await;
    // The answer cost 10 where 1 was reserved: the overage waits for Redis.
    assert_eq!(store.charge_to(Origin::Store, "k", 9, u64::MAX).await, 0);
    server.signal("CONT");
    // Past the retry interval, the next decision is the one that finds Redis back: the key's
    // charge is applied before it, so the key is spent.
    tokio::time::sleep(Duration::from_millis(150)).await;
    let next = store.check_granted("k", 1).await;
    assert!(
        matches!(next, Err(Error::Limited { .. })),
        "the decision that found Redis back was made before the charge it owed: {next:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlements_kept_while_redis_was_paused_land_without_waiting_for_a_decision() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let idle = store(&server, "origin-idle").await;
    let other = RedisStore::connect(algorithm(), idle.config().clone())
        .await
        .unwrap();
    assert_eq!(admit(&idle, "k").await, Some(Origin::Store));
    pause(&server, &idle).await;
    assert_eq!(idle.charge_to(Origin::Store, "k", 9, u64::MAX).await, 0);
    server.signal("CONT");
    // The gateway that owes the charge takes no more decisions: the charge still reaches
    // Redis, where another gateway sees the key spent.
    let start = std::time::Instant::now();
    loop {
        let left = other.check_granted("k", 0).await.unwrap().0.remaining;
        if left == 0 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the charge kept for Redis was not applied within 5 s of Redis answering: {left} left"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
