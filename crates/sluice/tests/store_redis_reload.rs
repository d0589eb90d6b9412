//! A store with a changed quota converts each key it reads in Redis, so that no key gains
//! tokens: on one server, on every master of a Cluster, and across algorithms.
#![cfg(feature = "redis")]

mod support;

use std::time::Duration;

use sluice::store::{RedisConfig, RedisStore, Store};
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::redis::RedisServer;

fn algorithm(kind: Kind, capacity: u64, rate: &str) -> AnyAlgorithm {
    AnyAlgorithm::new(kind, Quota::parse(capacity, rate).unwrap())
}

async fn admitted(store: &RedisStore, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if store.check(key, 1).await.is_ok() {
            ok += 1;
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_quota_keeps_what_each_key_had_left_in_redis() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    for kind in [Kind::Gcra, Kind::FixedWindow, Kind::SlidingWindow] {
        let config = || {
            RedisConfig::new(server.url())
                .timeout(Duration::from_secs(5))
                .prefix(format!("reload-{kind}"))
        };
        // At 1/min nothing refills during the test.
        let old = algorithm(kind, 100, "1/min");
        let store = RedisStore::connect(old, config()).await.unwrap();
        assert_eq!(admitted(&store, "k", 95).await, 95, "{kind}");
        assert_eq!(admitted(&store, "other", 70).await, 70, "{kind}");

        let new = algorithm(kind, 50, "1/min");
        let tightened = RedisStore::connect(new, config()).await.unwrap();
        assert_eq!(
            admitted(&tightened, "k", 60).await,
            5,
            "{kind}: what the key had left, not the new capacity"
        );
        assert_eq!(admitted(&tightened, "other", 60).await, 30, "{kind}");
        assert_eq!(admitted(&tightened, "fresh", 60).await, 50, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tightened_quota_converts_the_keys_of_every_cluster_master() {
    let Some(cluster) = support::redis::RedisCluster::start(3) else {
        return;
    };
    let config = || {
        RedisConfig::cluster(cluster.urls())
            .timeout(Duration::from_secs(5))
            .prefix("reload-cluster")
    };
    let old = algorithm(Kind::Gcra, 100, "1/min");
    let store = RedisStore::connect(old, config()).await.unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
    for key in &keys {
        assert_eq!(admitted(&store, key, 95).await, 95, "{key}");
    }
    assert!(
        cluster.keys_per_node().iter().all(|&n| n > 0),
        "keys on every master: {:?}",
        cluster.keys_per_node()
    );
    let new = algorithm(Kind::Gcra, 50, "1/min");
    let tightened = RedisStore::connect(new, config()).await.unwrap();
    for key in &keys {
        assert_eq!(admitted(&tightened, key, 8).await, 5, "{key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_algorithm_starts_each_key_with_what_it_had_left() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let config = || {
        RedisConfig::new(server.url())
            .timeout(Duration::from_secs(5))
            .prefix("reload-family")
    };
    let old = algorithm(Kind::Gcra, 100, "1/min");
    let store = RedisStore::connect(old, config()).await.unwrap();
    for kind in [Kind::FixedWindow, Kind::SlidingWindow] {
        let key = format!("k-{kind}");
        assert_eq!(admitted(&store, &key, 95).await, 95);
        let new = algorithm(kind, 50, "1/min");
        let moved = RedisStore::connect(new, config()).await.unwrap();
        assert_eq!(admitted(&moved, &key, 10).await, 5, "{kind}");
    }
}
