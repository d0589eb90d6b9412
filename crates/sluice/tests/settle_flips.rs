//! Costs settled where they were granted while Redis comes and goes: two gateways share a
//! Redis prefix with `on_error = local`, admit reservations (as a settled policy does, or a
//! reservation read from the request's body), and settle them later with the actual cost (a
//! refund of the unspent part, or a charge of the overage, up to several capacities) or give
//! them back whole (a later policy refused), while Redis is paused (SIGSTOP) and resumed
//! between an admission and its settlement.
//!
//! The model keeps one bound per store that can grant: Redis (shared by both gateways) and
//! each gateway's local fallback, per key. A settlement changes only the store that granted
//! its admission: a charge takes its whole cost there (below empty: the debt), a refund gives
//! back at most its cost, never beyond full. Each admission must have been covered by its
//! store's upper bound (what the store held, plus the refill since, at the quota's rate), and
//! at the end of each case each store must hold no fewer whole tokens than its lower bound
//! (no refill counted), so that a settlement lost or sent to the other store is caught either
//! way.
//!
//! Real time: the quota refills 10 per hour, so a case's few seconds refill a small fraction
//! of a token, which the upper bound counts.

#![cfg(feature = "redis")]

mod support;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use sluice::store::{OnError, Origin, RedisConfig, RedisStore, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::redis::RedisServer;

const KEYS: [&str; 2] = ["a", "b"];
const CAPACITY: f64 = 10.0;
/// Tokens per nanosecond: 10 per hour.
const RATE: f64 = 10.0 / 3_600e9;
const EPS: f64 = 1e-6;

#[derive(Debug, Clone)]
enum Op {
    /// Gateway `gw` admits a reservation of `reserve` for a key.
    Admit { gw: usize, key: usize, reserve: u64 },
    /// The `pick`-th admission still in flight ends, having cost `actual`.
    Settle { pick: usize, actual: u64 },
    /// The `pick`-th admission still in flight is given back whole.
    GiveBack { pick: usize },
    /// Redis stops answering (or answers again): both gateways notice before the next step.
    Flip,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..2usize, 0..KEYS.len(), 1..=3u64)
            .prop_map(|(gw, key, reserve)| Op::Admit { gw, key, reserve }),
        4 => (any::<usize>(), 0..=6u64).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
        1 => (any::<usize>(), 7..=40u64).prop_map(|(pick, actual)| Op::Settle { pick, actual }),
        2 => any::<usize>().prop_map(|pick| Op::GiveBack { pick }),
        2 => Just(Op::Flip),
    ]
}

/// Which store a bound is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Granter {
    Redis,
    Local(usize),
}

impl Granter {
    fn of(origin: Origin, gw: usize) -> Granter {
        match origin {
            Origin::Store => Granter::Redis,
            Origin::Fallback => Granter::Local(gw),
            Origin::Nowhere => panic!("on_error = local granted an admission nowhere"),
        }
    }

    fn index(self) -> usize {
        match self {
            Granter::Redis => 0,
            Granter::Local(gw) => 1 + gw,
        }
    }
}

/// What the model knows of one key in one store: at least `low` and at most `high` tokens
/// (before refill), refill counted from `since` for the upper bound.
#[derive(Debug, Clone, Copy)]
struct Bound {
    low: f64,
    high: f64,
    since: Instant,
}

impl Bound {
    fn full() -> Bound {
        Bound {
            low: CAPACITY,
            high: CAPACITY,
            since: Instant::now(),
        }
    }

    /// The most the store may hold now.
    fn most(&self) -> f64 {
        let refilled = self.since.elapsed().as_nanos() as f64 * RATE;
        (self.high + refilled).min(CAPACITY)
    }

    /// Brings the refill into `high`, so that later changes apply to what the store holds.
    fn settle_time(&mut self) {
        self.high = self.most();
        self.since = Instant::now();
    }

    fn take(&mut self, cost: u64) {
        self.settle_time();
        self.high -= cost as f64;
        self.low -= cost as f64;
    }

    fn give(&mut self, cost: u64) {
        self.settle_time();
        self.high = (self.high + cost as f64).min(CAPACITY);
        self.low = (self.low + cost as f64).min(CAPACITY);
    }
}

fn algorithm() -> AnyAlgorithm {
    AnyAlgorithm::new(Kind::Gcra, Quota::parse(10, "10/h").unwrap())
}

fn server() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start).as_ref()
}

/// Waits until every gateway decides locally (after `SIGSTOP`) or on Redis again.
async fn wait_for(gateways: &[RedisStore; 2], on_redis: bool) {
    let start = Instant::now();
    for gw in gateways {
        while gw.is_using_redis() != on_redis {
            let _ = gw.check_granted("health", 0).await;
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the store did not {} within 10 s",
                if on_redis {
                    "use Redis again"
                } else {
                    "fall back"
                }
            );
            if gw.is_using_redis() != on_redis {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn forget_denials(gateways: &[RedisStore; 2]) {
    for gw in gateways {
        gw.reconfigure(algorithm(), 0, Duration::ZERO, 1000)
            .unwrap();
    }
}

/// Admits `cost` until refused; returns how many were admitted and asserts where.
async fn drain(store: &RedisStore, key: &str, expected: Origin) -> u64 {
    let mut n = 0;
    loop {
        match store.check_granted(key, 1).await {
            Ok((_, origin)) => {
                assert_eq!(origin, expected, "{key}: drained from the wrong store");
                n += 1;
                assert!(n <= CAPACITY as u64, "{key}: more than the capacity");
            }
            Err(Error::Limited { .. }) => return n,
            Err(e) => panic!("{key}: {e}"),
        }
    }
}

struct InFlight {
    gw: usize,
    key: usize,
    granter: Granter,
    origin: Origin,
    reserve: u64,
    at: Instant,
}

async fn run(ops: Vec<Op>, server: &RedisServer, case: u64) {
    // A failed case may have left Redis paused: each case starts with it answering.
    server.signal("CONT");
    let config = RedisConfig::new(server.url())
        .prefix(format!("flips-{}-{case}", std::process::id()))
        .on_error(OnError::Local)
        .timeout(Duration::from_millis(150))
        .retry_interval(Duration::from_millis(50));
    let gateways = [
        RedisStore::connect(algorithm(), config.clone())
            .await
            .unwrap(),
        RedisStore::connect(algorithm(), config).await.unwrap(),
    ];
    // Per granter (Redis, local of gateway 0, local of gateway 1), per key.
    let mut bounds = [[Bound::full(); KEYS.len()]; 3];
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut paused = false;
    for (step, op) in ops.into_iter().enumerate() {
        let context = format!(
            "step {step} ({op:?}, Redis {})",
            if paused { "paused" } else { "up" }
        );
        eprintln!(
            "TRACE {context} bounds {:?}",
            bounds
                .iter()
                .map(|b| b.iter().map(|x| x.low).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        );
        match op {
            Op::Admit { gw, key, reserve } => {
                match gateways[gw].check_granted(KEYS[key], reserve).await {
                    Ok((_, origin)) => {
                        let granter = Granter::of(origin, gw);
                        assert_eq!(
                            granter == Granter::Redis,
                            !paused,
                            "{context}: granted by {granter:?}"
                        );
                        let bound = &mut bounds[granter.index()][key];
                        let most = bound.most();
                        assert!(
                            most + EPS >= reserve as f64,
                            "{context}: {granter:?} admitted {reserve} of key {} holding at most {most:.4}",
                            KEYS[key]
                        );
                        bound.take(reserve);
                        in_flight.push(InFlight {
                            gw,
                            key,
                            granter,
                            origin,
                            reserve,
                            at: Instant::now(),
                        });
                    }
                    Err(Error::Limited { .. }) => {}
                    Err(e) => panic!("{context}: {e}"),
                }
            }
            Op::Settle { pick, actual } => {
                if in_flight.is_empty() {
                    continue;
                }
                let f = in_flight.remove(pick % in_flight.len());
                let store = &gateways[f.gw];
                let bound = &mut bounds[f.granter.index()][f.key];
                if actual > f.reserve {
                    let over = actual - f.reserve;
                    let forgiven = store.charge_to(f.origin, KEYS[f.key], over, u64::MAX).await;
                    assert_eq!(forgiven, 0, "{context}: a charge with no cap forgave");
                    bound.take(over);
                } else if actual < f.reserve {
                    let unspent = f.reserve - actual;
                    store
                        .refund_to(f.origin, KEYS[f.key], unspent, f.at.elapsed())
                        .await;
                    bound.give(unspent);
                }
            }
            Op::GiveBack { pick } => {
                if in_flight.is_empty() {
                    continue;
                }
                let f = in_flight.remove(pick % in_flight.len());
                gateways[f.gw]
                    .refund_to(f.origin, KEYS[f.key], f.reserve, f.at.elapsed())
                    .await;
                bounds[f.granter.index()][f.key].give(f.reserve);
            }
            Op::Flip => {
                paused = !paused;
                server.signal(if paused { "STOP" } else { "CONT" });
                wait_for(&gateways, !paused).await;
            }
        }
    }
    // Each store holds at least its lower bound: each gateway's local store, Redis paused
    // (drained first: a key Redis refused is refused from memory while the refusal lasts);
    // then Redis's, with every settlement kept while it was paused applied once it answers.
    if !paused {
        server.signal("STOP");
        wait_for(&gateways, false).await;
    }
    // The refusals each gateway remembers from Redis are forgotten (as a reload does): they
    // would answer for the local stores, and would hide what a refund gave back.
    forget_denials(&gateways);
    let mut held = [[0u64; KEYS.len()]; 3];
    for (gw, store) in gateways.iter().enumerate() {
        for (key, name) in KEYS.iter().enumerate() {
            held[1 + gw][key] = drain(store, name, Origin::Fallback).await;
        }
    }
    server.signal("CONT");
    wait_for(&gateways, true).await;
    forget_denials(&gateways);
    for (key, name) in KEYS.iter().enumerate() {
        held[0][key] = drain(&gateways[0], name, Origin::Store).await;
    }
    for (g, granter) in [Granter::Redis, Granter::Local(0), Granter::Local(1)]
        .into_iter()
        .enumerate()
    {
        for (key, name) in KEYS.iter().enumerate() {
            let bound = bounds[g][key];
            let (low, most) = (bound.low.max(0.0).floor(), bound.most().max(0.0));
            let n = held[g][key] as f64;
            assert!(
                n >= low && n <= most + EPS,
                "{granter:?} holds {n} tokens of key {name}: the model allows {low} to {most:.4}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn settlements_across_redis_pauses_land_where_they_were_granted(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        let Some(server) = server() else { return Ok(()) };
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
            .block_on(run(ops, server, case));
    }
}
