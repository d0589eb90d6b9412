//! One owner for a limit's state in Redis: two gateways share a prefix, and each changes its
//! quota (or algorithm) on its own, as gateways that reload at different moments do. Driven
//! against a reference model that knows how many tokens each key may hold at most; the
//! scripts' clock is the schedule's (`check_at`), so the run is exact and repeatable.
//!
//! The model covers the bucket algorithms, which refill linearly. A key's value carries the
//! quota that wrote it: it refills at that quota's rate up to that capacity, and a gateway
//! that reads it under another quota (to decide, or only to look) converts it and writes it
//! back under its own: `min(left, its capacity)` (the model allows its whole capacity for a
//! key that was full, as for a key never seen). A settled charge takes its whole cost (the key
//! goes into debt: a negative bound, kept through every conversion), and a refund gives back
//! at most its cost, never beyond full. After every step each admission must have been
//! covered by the bound, and each gateway must see no more whole tokens than the bound allows.

#![cfg(feature = "redis")]

mod support;

use std::sync::OnceLock;

use proptest::prelude::*;
use sluice::store::{OnError, RedisConfig, RedisStore};
use sluice_core::{AnyAlgorithm, Kind, Quota, Rate};
use support::process::unix_ns;
use support::redis::RedisServer;

const KEYS: [&str; 3] = ["a", "b", "c"];
const EPS: f64 = 1e-6;

#[derive(Debug, Clone)]
enum Op {
    /// Gateway `gw` decides `cost` for a key.
    Admit { gw: usize, key: usize, cost: u64 },
    /// Gateway `gw` charges a cost learnt after the fact (up to several capacities).
    Charge { gw: usize, key: usize, cost: u64 },
    /// Gateway `gw` gives back the key's latest admission (another policy refused it).
    Refund { gw: usize, key: usize },
    /// Time passes (milliseconds of the scripts' clock).
    Advance { ms: u64 },
    /// Gateway `gw` alone changes its quota (the other has not reloaded).
    Reconfigure {
        gw: usize,
        kind: Kind,
        capacity: u64,
        per_sec: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..2usize, 0..KEYS.len(), 1..=2u64).prop_map(|(gw, key, cost)| Op::Admit { gw, key, cost }),
        2 => (0..2usize, 0..KEYS.len(), 1..=20u64).prop_map(|(gw, key, cost)| Op::Charge { gw, key, cost }),
        1 => (0..2usize, 0..KEYS.len()).prop_map(|(gw, key)| Op::Refund { gw, key }),
        3 => (1..1500u64).prop_map(|ms| Op::Advance { ms }),
        2 => (0..2usize, prop_oneof![Just(Kind::Gcra), Just(Kind::TokenBucket), Just(Kind::LeakyBucket)], 2..=8u64, 1..=4u64)
            .prop_map(|(gw, kind, capacity, per_sec)| Op::Reconfigure { gw, kind, capacity, per_sec }),
    ]
}

fn algorithm(kind: Kind, capacity: u64, per_sec: u64) -> AnyAlgorithm {
    let rate = Rate::from_interval_ns(1_000_000_000 / per_sec).unwrap();
    AnyAlgorithm::new(kind, Quota::new(capacity, rate).unwrap())
}

/// What the model knows of one key: at most `tokens` at `at`, written under `capacity` and
/// refilling one token per `interval` (ns).
#[derive(Debug, Clone, Copy)]
struct Bound {
    tokens: f64,
    at: u64,
    capacity: f64,
    interval: f64,
}

impl Bound {
    /// The bound once a gateway of `capacity` and `interval` read the key at `t`: converted
    /// to its quota, and written back so.
    fn reread(&self, t: u64, capacity: f64, interval: f64) -> Bound {
        Bound {
            tokens: self.read(t, capacity),
            at: t,
            capacity,
            interval,
        }
    }

    /// At most this many tokens at `t`, read under a quota of `capacity`.
    fn read(&self, t: u64, capacity: f64) -> f64 {
        let refilled =
            (self.tokens + t.saturating_sub(self.at) as f64 / self.interval).min(self.capacity);
        if refilled + EPS >= self.capacity {
            capacity
        } else {
            refilled.min(capacity)
        }
    }
}

fn server() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start).as_ref()
}

async fn run(ops: Vec<Op>, server: &RedisServer, case: u64) {
    let first = algorithm(Kind::Gcra, 4, 2);
    let prefix = format!("own-{}-{case}", std::process::id());
    // The model is of what Redis holds, not of timeouts: a Redis slowed by a loaded machine
    // answers within 2 s (the default 50 ms would fail the call, not the model).
    let config = RedisConfig::new(server.url())
        .prefix(prefix)
        .timeout(std::time::Duration::from_secs(2))
        .on_error(OnError::Deny);
    let gateways = [
        RedisStore::connect(first, config.clone()).await.unwrap(),
        RedisStore::connect(first, config).await.unwrap(),
    ];
    let mut quota = [(4.0, 500_000_000.0); 2];
    // Real Unix times, so that Redis's TTLs (in real time) never end before the schedule's
    // idle times: the schedule moves at least as fast as real time.
    let mut now = unix_ns();
    let mut real = std::time::Instant::now();
    let mut bounds = [Bound {
        tokens: 4.0,
        at: now,
        capacity: 4.0,
        interval: 500_000_000.0,
    }; KEYS.len()];
    // Per key, the admissions not yet refunded: (cost, when).
    let mut refundable: [Vec<(u64, u64)>; KEYS.len()] = Default::default();
    for (step, op) in ops.into_iter().enumerate() {
        let elapsed = real.elapsed().as_nanos() as u64 + 1_000_000;
        real = std::time::Instant::now();
        let context = format!("step {step} ({op:?})");
        match op {
            Op::Admit { gw, key, cost } => {
                now += elapsed;
                let (capacity, interval) = quota[gw];
                let admitted = gateways[gw].check_at(KEYS[key], cost, now).await;
                bounds[key] = bounds[key].reread(now, capacity, interval);
                let had = bounds[key].tokens;
                if admitted.is_ok_and(|d| d.allowed) {
                    assert!(
                        had + EPS >= cost as f64,
                        "{context}: gateway {gw} admitted {cost} of key {} with at most {had:.4} tokens",
                        KEYS[key]
                    );
                    bounds[key].tokens -= cost as f64;
                    refundable[key].push((cost, now));
                }
            }
            Op::Charge { gw, key, cost } => {
                now += elapsed;
                let (capacity, interval) = quota[gw];
                let forgiven = gateways[gw]
                    .charge_at(KEYS[key], cost, u64::MAX, now)
                    .await
                    .unwrap();
                assert_eq!(forgiven, 0, "{context}: a charge with no cap forgave");
                bounds[key] = bounds[key].reread(now, capacity, interval);
                bounds[key].tokens -= cost as f64;
            }
            Op::Refund { gw, key } => {
                let Some((cost, at)) = refundable[key].pop() else {
                    continue;
                };
                now += elapsed;
                let (capacity, interval) = quota[gw];
                let ago = std::time::Duration::from_nanos(now - at);
                gateways[gw]
                    .refund_at(KEYS[key], cost, ago, now)
                    .await
                    .unwrap();
                bounds[key] = bounds[key].reread(now, capacity, interval);
                bounds[key].tokens = (bounds[key].tokens + cost as f64).min(capacity);
            }
            Op::Advance { ms } => now += (ms * 1_000_000).max(elapsed),
            Op::Reconfigure {
                gw,
                kind,
                capacity,
                per_sec,
            } => {
                gateways[gw]
                    .reconfigure(
                        algorithm(kind, capacity, per_sec),
                        0,
                        Default::default(),
                        1000,
                    )
                    .unwrap();
                quota[gw] = (capacity as f64, 1_000_000_000.0 / per_sec as f64);
            }
        }
        for (gw, store) in gateways.iter().enumerate() {
            now += 1;
            for (key, name) in KEYS.iter().enumerate() {
                let seen = store.check_at(name, 0, now).await.unwrap().remaining;
                let (capacity, interval) = quota[gw];
                // Any read converts the key to the reader's quota, and writes it so.
                bounds[key] = bounds[key].reread(now, capacity, interval);
                // A key in debt (a negative bound) shows no tokens.
                let allowed = bounds[key].tokens.max(0.0);
                assert!(
                    seen as f64 <= allowed + EPS,
                    "{context}: gateway {gw} sees {seen} tokens in key {name}, the model allows {allowed:.4}"
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn two_gateways_changing_quotas_on_their_own_never_give_a_key_more_than_the_model(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        let Some(server) = server() else { return Ok(()) };
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(ops, server, case));
    }
}
