//! Leases never admit beyond the bound: several gateways share one key in a real Redis, each
//! spending slices it leased, giving them back (at once, or late: after its next slice was
//! taken, or after the slice expired), crashing while it holds one (its lease then expires in
//! Redis), settling costs after the fact (charges up to several capacities, from the slice
//! first and the rest into debt; refunds), while another gateway decides per request on the
//! same key, the policy's quota changes on one gateway at a time (a SIGHUP reload, or a `PUT`
//! of the policy) and the key's own quota is set and removed. Every way the store changes a
//! key's state is an operation here. The scripts' clock is the schedule's (`lease_at`,
//! `check_at`, `charge_at`, `refund_at`), so the run is exact and repeatable.
//!
//! The model is the bound itself: over any window `[a, b]`, the admissions of every gateway
//! together (a charge counted whole, at its cost) are at most the largest capacity in force
//! from `a - ttl` (a slice taken under a quota is spent until its deadline) to `b`, plus the
//! refill over `[a, b]` at the fastest rate in force at each moment, plus what the key still
//! owes at `b` (a charge may take it below empty), plus what was refunded within the window (a
//! refund gives tokens back now). The quotas in force for the key are its own, while it has
//! one, else every gateway's policy quota, and the quota its value was last written under (it
//! refills at that one's rate until a script under another rewrites it). Each gateway
//! spends a slice only until its local deadline (the lease's ttl less the store's margin, from
//! the moment it asked), as `RedisStore` does.

#![cfg(feature = "redis")]

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use proptest::prelude::*;
use sluice::store::{LeaseConfig, LeaseSize, OnError, RedisConfig, RedisStore};
use sluice_core::{AnyAlgorithm, Kind, Quota, Rate};
use support::process::unix_ns;
use support::redis::RedisServer;

const CAPACITY: u64 = 6;
/// One token per 250 ms.
const INTERVAL: u64 = 250_000_000;
const TTL: Duration = Duration::from_millis(400);
/// Gateways that lease; one more (this index) decides per request.
const GATEWAYS: usize = 3;
/// The quotas a policy or a key may take, as (capacity, interval): the policy's first, then a
/// smaller capacity, a faster rate, and a smaller capacity at a slower rate.
const QUOTAS: [(u64, u64); 4] = [
    (CAPACITY, INTERVAL),
    (3, INTERVAL),
    (CAPACITY, INTERVAL / 2),
    (4, 2 * INTERVAL),
];
/// A multiple of every interval of `QUOTAS`: refill summed exactly over several rates.
const EVERY_INTERVAL: u64 = 2 * INTERVAL;

#[derive(Debug, Clone)]
enum Op {
    /// Gateway `gw` admits `cost`: from its slice, or by giving it back and taking another
    /// of up to `want` (at least `cost`).
    Spend { gw: usize, cost: u64, want: u64 },
    /// Gateway `gw` takes its slice out to give it back (its sweeper, or its stopping): what
    /// it spent leaves with its next `Deliver`, and meanwhile it may take its next slice.
    GiveBack { gw: usize },
    /// Gateway `gw`'s give-backs taken out so far reach Redis: late, when the gateway took its
    /// next slice since, or when the slice expired meanwhile.
    Deliver { gw: usize },
    /// Gateway `gw`'s give-back arrives after its next renewal: its slice taken out to be
    /// given back, a request then spending `cost` from a new slice of up to `want`, and only
    /// then the give-back reaching Redis (its round trip behind others).
    LateGiveBack { gw: usize, cost: u64, want: u64 },
    /// Gateway `gw`'s give-back arrives after its slice expired in Redis (settled there as all
    /// spent), `ms` after it was taken out: within the grace in which it returns what the
    /// settlement still holds of what was not spent.
    ExpiredGiveBack { gw: usize, ms: u64 },
    /// Gateway `gw` dies holding its slice (its give-backs not sent are lost); it comes back
    /// with a new lease id.
    Crash { gw: usize },
    /// The gateway that does not lease decides `cost` per request.
    Direct { cost: u64 },
    /// Gateway `gw` settles a cost learnt after the fact: from its slice first, the rest
    /// charged in Redis, into debt.
    Charge { gw: usize, cost: u64 },
    /// Gateway `gw` gives back `cost` it admitted (the request never ran): into its slice
    /// while that is good, else in Redis.
    Refund { gw: usize, cost: u64 },
    /// Gateway `gw`'s policy takes `QUOTAS[q]` (a SIGHUP reload, or a `PUT` of the policy on
    /// that gateway): its store is reconfigured, the slice it holds is spent until its
    /// deadline, and the other gateways keep their quota until their own change.
    Requota { gw: usize, q: usize },
    /// The key's own quota set to `QUOTAS[q]`, or removed (`PUT` or `DELETE` of
    /// `/v1/policies/NAME/keys/KEY`): in the shared hash, read by every gateway, and the key
    /// converted at once by a peek under its new quota, as `set_override` does.
    Override { q: Option<usize> },
    /// Time passes (milliseconds of the scripts' clock).
    Advance { ms: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0..GATEWAYS, 1..=CAPACITY, 1..=4u64).prop_map(|(gw, cost, want)| Op::Spend { gw, cost, want }),
        3 => (0..GATEWAYS).prop_map(|gw| Op::GiveBack { gw }),
        3 => (0..GATEWAYS).prop_map(|gw| Op::Deliver { gw }),
        3 => (0..GATEWAYS, 1..=CAPACITY, 1..=4u64).prop_map(|(gw, cost, want)| Op::LateGiveBack { gw, cost, want }),
        2 => (0..GATEWAYS, 400..1500u64).prop_map(|(gw, ms)| Op::ExpiredGiveBack { gw, ms }),
        1 => (0..GATEWAYS).prop_map(|gw| Op::Crash { gw }),
        3 => (1..=2u64).prop_map(|cost| Op::Direct { cost }),
        2 => (0..GATEWAYS, 1..=3 * CAPACITY).prop_map(|(gw, cost)| Op::Charge { gw, cost }),
        1 => (0..GATEWAYS, 1..=3u64).prop_map(|(gw, cost)| Op::Refund { gw, cost }),
        2 => (0..=GATEWAYS, 0..QUOTAS.len()).prop_map(|(gw, q)| Op::Requota { gw, q }),
        1 => prop::option::of(0..QUOTAS.len()).prop_map(|q| Op::Override { q }),
        4 => (1..500u64).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// One gateway's slice, as `RedisStore` keeps it, and its give-backs not sent yet.
#[derive(Debug, Clone, Default)]
struct Slice {
    id: String,
    granted: u64,
    left: u64,
    deadline: u64,
    /// (lease id, tokens spent of it), taken out and not yet given back.
    pending: Vec<(String, u64)>,
    /// Tokens it admitted and did not refund.
    admitted: u64,
}

/// Runs `test` to its end on a runtime of its own (one thread, I/O and timers).
fn block_on<F: std::future::Future>(test: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(test)
}

fn server() -> Option<&'static RedisServer> {
    static SERVER: OnceLock<Option<RedisServer>> = OnceLock::new();
    SERVER.get_or_init(RedisServer::start).as_ref()
}

fn algorithm(q: usize) -> AnyAlgorithm {
    let (capacity, interval) = QUOTAS[q];
    AnyAlgorithm::new(
        Kind::TokenBucket,
        Quota::new(capacity, Rate::from_interval_ns(interval).unwrap()).unwrap(),
    )
}

/// What the key's quotas allowed over time: from each entry's time on, the largest capacity
/// and the shortest interval in force, until the next entry.
#[derive(Debug, Default)]
struct InForce(Vec<(u64, u64, u64)>);

impl InForce {
    /// The quotas in force from `at`: the key's own if it has one, else every policy's; and
    /// the quota its value in Redis was last written under (`stamp`), at whose rate it refills
    /// until a script under another rewrites it.
    fn set(&mut self, at: u64, policies: &[usize], own: Option<usize>, stamp: Option<(u64, u64)>) {
        let mut quotas: Vec<(u64, u64)> = match own {
            Some(q) => vec![QUOTAS[q]],
            None => policies.iter().map(|&q| QUOTAS[q]).collect(),
        };
        quotas.extend(stamp);
        let capacity = quotas.iter().map(|q| q.0).max().unwrap_or(0);
        let interval = quotas.iter().map(|q| q.1).min().unwrap_or(u64::MAX);
        self.0.push((at, capacity, interval));
    }

    /// The largest capacity in force at any time in `[a, b]`.
    fn capacity(&self, a: u64, b: u64) -> u64 {
        let mut most = 0;
        for (k, &(t, capacity, _)) in self.0.iter().enumerate() {
            let until = self.0.get(k + 1).map_or(u64::MAX, |e| e.0);
            if t <= b && until > a {
                most = most.max(capacity);
            }
        }
        most
    }

    /// The whole tokens refilled over `[a, b]` at the fastest rate in force at each moment.
    fn refill(&self, a: u64, b: u64) -> u64 {
        let mut units: u128 = 0;
        for (k, &(t, _, interval)) in self.0.iter().enumerate() {
            let until = self.0.get(k + 1).map_or(u64::MAX, |e| e.0);
            let (from, to) = (t.max(a), until.min(b));
            if to > from {
                units += u128::from(to - from) * u128::from(EVERY_INTERVAL / interval);
            }
        }
        (units / u128::from(EVERY_INTERVAL)) as u64
    }
}

/// Every window of `admitted` (times, one entry per token, sorted) within the bound, given
/// the quotas in force, what the key owed (`owed`: time, tokens beyond empty) at each window's
/// end and the refunds (`refunded`: time, tokens).
fn within_bound(
    admitted: &[u64],
    owed: &[(u64, u64)],
    in_force: &InForce,
    refunded: &[(u64, u64)],
) -> Result<(), String> {
    let ttl = TTL.as_nanos() as u64;
    for i in 0..admitted.len() {
        for j in i..admitted.len() {
            let (a, b) = (admitted[i], admitted[j]);
            let count = (j - i + 1) as u64;
            let at_end = owed
                .iter()
                .rev()
                .find(|&&(t, _)| t <= b)
                .map_or(0, |&(_, o)| o);
            let back: u64 = refunded
                .iter()
                .filter(|&&(t, _)| t > a && t <= b)
                .map(|&(_, n)| n)
                .sum();
            let capacity = in_force.capacity(a.saturating_sub(ttl), b);
            let refill = in_force.refill(a, b);
            let allowed = capacity + refill + at_end + back;
            if count > allowed {
                return Err(format!(
                    "{count} admissions within {} ms, the bound allows {allowed} (capacity {capacity}, refill {refill}, {at_end} owed, {back} refunded)",
                    (b - a) / 1_000_000
                ));
            }
        }
    }
    Ok(())
}

/// The tokens the key owes beyond empty at `now`, its slices counted as owed (a looser
/// bound), read from its value in Redis: `<stamp>|<full again at> <leases>...`; and the
/// stamp's quota (capacity, interval).
async fn owed_now(
    conn: &mut redis::aio::MultiplexedConnection,
    key: &str,
    now: u64,
) -> (u64, Option<(u64, u64)>) {
    let value: Option<String> = redis::cmd("GET").arg(key).query_async(conn).await.unwrap();
    let Some(value) = value else { return (0, None) };
    let (stamp, state) = value.split_once('|').unwrap();
    let mut stamp = stamp.split(':').skip(1).map(|n| n.parse::<u64>().unwrap());
    let (capacity, interval) = (stamp.next().unwrap(), stamp.next().unwrap());
    let mut fields = state.split(' ');
    let full_at: u64 = fields.next().unwrap().parse().unwrap();
    // Leases held, and those expired but not yet settled (debited whole when next read).
    let held: u64 = fields
        .filter_map(|l| l.split(':').nth(1)?.parse::<u64>().ok())
        .sum();
    let owed = full_at.saturating_sub(now) + held * interval;
    let beyond = owed.saturating_sub(capacity * interval).div_ceil(interval);
    (beyond, Some((capacity, interval)))
}

async fn run(ops: Vec<Op>, server: &RedisServer, case: u64) -> (usize, u64) {
    let prefix = format!("lease-{}-{case}", std::process::id());
    let config = RedisConfig::new(server.url())
        .prefix(prefix.clone())
        .on_error(OnError::Deny)
        // The schedule's steps, not Redis's speed, are under test: a loaded machine must not
        // turn a slow answer into an error.
        .timeout(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(5))
        .lease(LeaseConfig::new(LeaseSize::Tokens(4), TTL));
    // One store per gateway, the last one deciding per request (it leases nothing).
    let mut stores = Vec::new();
    for _ in 0..=GATEWAYS {
        stores.push(
            RedisStore::connect(algorithm(0), config.clone())
                .await
                .unwrap(),
        );
    }
    let mut raw = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let redis_key = format!("{prefix}:{{k}}");
    let mut policies = [0usize; GATEWAYS + 1];
    let mut own: Option<usize> = None;
    let margin = (TTL / 50).max(Duration::from_millis(1)).as_nanos() as u64;
    let ttl = TTL.as_nanos() as u64;
    let mut slices: Vec<Slice> = (0..GATEWAYS)
        .map(|gw| Slice {
            id: format!("g{gw}x0"),
            ..Slice::default()
        })
        .collect();
    let mut restarts = 0;
    // Real Unix times, so that Redis's TTLs (in real time) never end before the schedule's.
    let mut now = unix_ns();
    let mut real = std::time::Instant::now();
    let mut in_force = InForce::default();
    let mut stamp: Option<(u64, u64)> = None;
    in_force.set(0, &policies, own, stamp);
    let mut admitted: Vec<u64> = Vec::new();
    let mut refunded: Vec<(u64, u64)> = Vec::new();
    // (time, tokens owed beyond empty) after each step.
    let mut owed: Vec<(u64, u64)> = Vec::new();
    let mut takes = 0;
    // A late give-back is three steps of its own, run in a row.
    let ops = ops.into_iter().flat_map(|op| match op {
        Op::LateGiveBack { gw, cost, want } => vec![
            Op::GiveBack { gw },
            Op::Spend { gw, cost, want },
            Op::Deliver { gw },
        ],
        Op::ExpiredGiveBack { gw, ms } => {
            vec![Op::GiveBack { gw }, Op::Advance { ms }, Op::Deliver { gw }]
        }
        op => vec![op],
    });
    for (step, op) in ops.enumerate() {
        now += real.elapsed().as_nanos() as u64 + 1_000_000;
        real = std::time::Instant::now();
        let context = format!("step {step} ({op:?})");
        match op {
            Op::LateGiveBack { .. } | Op::ExpiredGiveBack { .. } => {
                unreachable!("run as its three steps")
            }
            Op::Spend { gw, cost, want } => {
                // The store refuses a cost above its policy's capacity, without a decision.
                if cost > QUOTAS[policies[gw]].0 {
                    continue;
                }
                let s = &mut slices[gw];
                if s.granted > 0 && now < s.deadline && s.left >= cost {
                    s.left -= cost;
                    s.admitted += cost;
                    admitted.extend(std::iter::repeat_n(now, cost as usize));
                } else {
                    // Each slice named apart, by its generation, as `RedisStore` names them.
                    let spent = (s.granted > 0).then(|| s.granted - s.left);
                    let next = format!("{}n{takes}", s.id.split('n').next().unwrap_or("g"));
                    let ids = match spent {
                        Some(_) => (s.id.as_str(), Some(next.as_str())),
                        None => (next.as_str(), None),
                    };
                    let (granted, _free) = stores[gw]
                        .lease_at("k", ids, spent, want.max(cost), TTL, now)
                        .await
                        .unwrap();
                    s.id = next;
                    takes += 1;
                    s.granted = granted;
                    s.left = granted;
                    s.deadline = now + ttl - margin;
                    if granted >= cost {
                        s.left -= cost;
                        s.admitted += cost;
                        admitted.extend(std::iter::repeat_n(now, cost as usize));
                    }
                }
            }
            Op::GiveBack { gw } => {
                // As the store's sweep: a slice spent whole and past its deadline is left to
                // Redis's expiry; any other is taken out to be given back.
                let s = &mut slices[gw];
                if s.granted > 0 && !(s.left == 0 && now >= s.deadline) {
                    s.pending.push((s.id.clone(), s.granted - s.left));
                }
                s.granted = 0;
                s.left = 0;
            }
            Op::Deliver { gw } => {
                for (id, spent) in std::mem::take(&mut slices[gw].pending) {
                    stores[gw]
                        .lease_at("k", (&id, None), Some(spent), 0, TTL, now)
                        .await
                        .unwrap();
                }
            }
            Op::Crash { gw } => {
                restarts += 1;
                slices[gw] = Slice {
                    id: format!("g{gw}x{restarts}"),
                    ..Slice::default()
                };
            }
            Op::Direct { cost } => {
                let d = stores[GATEWAYS].check_at("k", cost, now).await.unwrap();
                if d.allowed {
                    admitted.extend(std::iter::repeat_n(now, cost as usize));
                }
            }
            Op::Charge { gw, cost } => {
                let s = &mut slices[gw];
                let mut rest = cost;
                if s.left > 0 && now < s.deadline {
                    let take = rest.min(s.left);
                    s.left -= take;
                    rest -= take;
                }
                s.admitted += cost;
                let forgiven = stores[gw]
                    .charge_at("k", rest, u64::MAX, now)
                    .await
                    .unwrap();
                assert_eq!(forgiven, 0, "{context}: a charge with no cap forgave");
                admitted.extend(std::iter::repeat_n(now, cost as usize));
            }
            Op::Refund { gw, cost } => {
                let s = &mut slices[gw];
                let cost = cost.min(s.admitted);
                if cost == 0 {
                    continue;
                }
                s.admitted -= cost;
                if s.granted > 0 && now < s.deadline {
                    s.left = (s.left + cost).min(s.granted);
                } else {
                    stores[gw]
                        .refund_at("k", cost, Duration::ZERO, now)
                        .await
                        .unwrap();
                }
                refunded.push((now, cost));
            }
            Op::Requota { gw, q } => {
                policies[gw] = q;
                stores[gw]
                    .reconfigure(algorithm(q), 0, Duration::ZERO, 1000)
                    .unwrap();
                in_force.set(now, &policies, own, stamp);
            }
            Op::Override { q } => {
                let hash = format!("{prefix}:overrides");
                let cmd = match q {
                    Some(q) => {
                        let mut c = redis::cmd("HSET");
                        c.arg(&hash)
                            .arg("k")
                            .arg(format!("{}:{}", QUOTAS[q].0, QUOTAS[q].1));
                        c
                    }
                    None => {
                        let mut c = redis::cmd("HDEL");
                        c.arg(&hash).arg("k");
                        c
                    }
                };
                let _: i64 = cmd.query_async(&mut raw).await.unwrap();
                for store in &stores {
                    store.overrides().await.unwrap();
                }
                own = q;
                in_force.set(now, &policies, own, stamp);
                stores[0].check_at("k", 0, now).await.unwrap();
            }
            Op::Advance { ms } => now += ms * 1_000_000,
        }
        let (beyond, written) = owed_now(&mut raw, &redis_key, now).await;
        owed.push((now, beyond));
        if written != stamp {
            stamp = written;
            in_force.set(now, &policies, own, stamp);
        }
        if let Err(e) = within_bound(&admitted, &owed, &in_force, &refunded) {
            panic!("{context}: {e}; admissions (ms from the first): {:?}", {
                let first = admitted.first().copied().unwrap_or(0);
                admitted
                    .iter()
                    .map(|t| (t - first) / 1_000_000)
                    .collect::<Vec<_>>()
            });
        }
    }
    (admitted.len(), takes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn gateways_leasing_settling_crashing_and_changing_quotas_never_exceed_the_bound(
        ops in prop::collection::vec(op(), 1..60)
    ) {
        let Some(server) = server() else { return Ok(()) };
        static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let case = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        block_on(run(ops, server, case));
    }
}

/// A schedule written out: a gateway takes the whole bucket, spends it at once, and gives the
/// slice back just after the bucket would have refilled; another then finds nothing free,
/// because the tokens spent count from when they were given back.
#[test]
fn tokens_spent_from_a_slice_are_not_refilled_before_they_are_given_back() {
    let Some(server) = server() else { return };
    block_on(async {
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(CAPACITY, Rate::from_interval_ns(INTERVAL).unwrap()).unwrap(),
        );
        let config = RedisConfig::new(server.url())
            .prefix(format!("lease-fixed-{}", std::process::id()))
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(5))
            .lease(LeaseConfig::new(LeaseSize::Tokens(CAPACITY), TTL));
        let store = RedisStore::connect(algorithm, config).await.unwrap();
        let t0 = unix_ns();
        let (a, free) = store
            .lease_at("k", ("a", None), None, CAPACITY, TTL, t0)
            .await
            .unwrap();
        assert_eq!((a, free), (CAPACITY, 0));
        // Nobody else gets anything while the slice is held, however long.
        let (b, _) = store
            .lease_at("k", ("b", None), None, 1, TTL, t0 + 300_000_000)
            .await
            .unwrap();
        assert_eq!(b, 0);
        let direct = store.check_at("k", 1, t0 + 300_000_000).await.unwrap();
        assert!(!direct.allowed);
        // `a` spent all six at once, and gives them back at 350 ms: they are spent now.
        let (_, free) = store
            .lease_at("k", ("a", None), Some(CAPACITY), 0, TTL, t0 + 350_000_000)
            .await
            .unwrap();
        assert_eq!(free, 0, "tokens spent came back before their refill");
        // One interval later, one token.
        let (b, _) = store
            .lease_at(
                "k",
                ("b", None),
                Some(0),
                2,
                TTL,
                t0 + 350_000_000 + INTERVAL,
            )
            .await
            .unwrap();
        assert_eq!(b, 1);
        // A slice given back unspent is free at once.
        let (_, free) = store
            .lease_at(
                "k",
                ("b", None),
                Some(0),
                0,
                TTL,
                t0 + 360_000_000 + INTERVAL,
            )
            .await
            .unwrap();
        assert_eq!(free, 1);
        // A lease left to expire counts as all spent at its expiry.
        let t1 = t0 + 360_000_000 + INTERVAL;
        let (c, _) = store
            .lease_at("k", ("c", None), None, 1, TTL, t1)
            .await
            .unwrap();
        assert_eq!(c, 1);
        let after = t1 + TTL.as_nanos() as u64 + 1;
        let (_, free) = store
            .lease_at("k", ("d", None), None, 0, TTL, after)
            .await
            .unwrap();
        assert_eq!(
            free, 1,
            "an expired lease settled as all spent at its expiry"
        );
    });
}

/// Two stores (two gateways) lease one hot key and spend it from eight tasks as fast as they
/// can, in real time: together they never admit more than the bound over the run, they
/// admit nearly all of it, and Redis runs one script per fifteen admissions at most (slices
/// grow to 5% of the capacity, 50 tokens; at the limit each slice costs its taker one script
/// and the other gateway about one denial). Then one gateway stops without giving its slice back: the
/// other gets the whole bucket again once that lease expires.
#[test]
fn a_hot_key_leased_by_two_gateways_is_exact_and_costs_one_script_per_slice() {
    // A server of its own: the scripts it counts are this test's only.
    let Some(server) = RedisServer::start() else {
        return;
    };
    let server = &server;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let capacity = 1000;
            let per_sec = 2000;
            let algorithm = AnyAlgorithm::new(
                Kind::TokenBucket,
                Quota::new(capacity, Rate::from_interval_ns(1_000_000_000 / per_sec).unwrap()).unwrap(),
            );
            let config = RedisConfig::new(server.url())
                .prefix(format!("lease-hot-{}", std::process::id()))
                .on_error(OnError::Deny)
                .lease(LeaseConfig::new(
                    LeaseSize::Basis(500),
                    Duration::from_millis(100),
                ));
            let stores = [
                RedisStore::connect(algorithm, config.clone()).await.unwrap(),
                RedisStore::connect(algorithm, config).await.unwrap(),
            ];
            let calls_before = server.script_calls();
            let started = std::time::Instant::now();
            let run_for = Duration::from_millis(1500);
            let mut tasks = Vec::new();
            for i in 0..8 {
                let store = stores[i % 2].clone();
                tasks.push(tokio::spawn(async move {
                    use sluice::store::Store as _;
                    let mut admitted = 0u64;
                    while started.elapsed() < run_for {
                        if store.check("hot", 1).await.is_ok_and(|d| d.allowed) {
                            admitted += 1;
                        } else {
                            tokio::task::yield_now().await;
                        }
                    }
                    admitted
                }));
            }
            let mut admitted = 0;
            for t in tasks {
                admitted += t.await.unwrap();
            }
            let elapsed = started.elapsed();
            let calls = server.script_calls() - calls_before;
            let bound = capacity as f64 + per_sec as f64 * elapsed.as_secs_f64();
            eprintln!(
                "{admitted} admitted in {elapsed:?} (bound {bound:.0}, {:.1}% of it); {calls} scripts, one per {:.1} admissions",
                100.0 * admitted as f64 / bound,
                admitted as f64 / calls as f64
            );
            assert!(admitted as f64 <= bound, "{admitted} above the bound {bound:.0}");
            // Under-admission: slices held and not spent, and a loaded machine's slow tasks.
            assert!(
                admitted as f64 >= 0.7 * bound,
                "{admitted} admitted: under-admission beyond 30% of {bound:.0}"
            );
            assert!(calls * 15 <= admitted, "{calls} scripts for {admitted} admissions");
            // One gateway stops without giving its slice back (a crash): the other waits out
            // that lease, then has the bucket.
            let [a, b] = stores;
            drop(b);
            tokio::time::sleep(Duration::from_millis(700)).await;
            use sluice::store::Store as _;
            let mut burst = 0;
            while a.check("hot", 1).await.is_ok_and(|d| d.allowed) {
                burst += 1;
                if burst > 2 * capacity {
                    break;
                }
            }
            eprintln!("after the other gateway's crash and its lease's expiry: a burst of {burst}");
            assert!(
                burst >= capacity - 60 && burst <= capacity + 100,
                "a burst of {burst} after a refill of 700 ms on a capacity of {capacity}"
            );
        });
}

/// A key that turns hot, then cold: its slices grow while it is hot, and shrink back to one
/// token once it is cold, so that each cold request costs one script, and what was held is
/// given back.
#[test]
fn a_key_that_turns_hot_then_cold_takes_slices_back_down_to_one() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let server = &server;
    block_on(async {
        use sluice::store::Store as _;
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(1000, Rate::from_interval_ns(1_000_000).unwrap()).unwrap(),
        );
        let config = RedisConfig::new(server.url())
            .prefix("hot-cold")
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(2))
            .lease(LeaseConfig::new(
                LeaseSize::Tokens(64),
                Duration::from_millis(50),
            ));
        let store = RedisStore::connect(algorithm, config).await.unwrap();
        let before = server.script_calls();
        for _ in 0..500 {
            assert!(store.check("k", 1).await.unwrap().allowed);
        }
        let hot = server.script_calls() - before;
        let mut cold = Vec::new();
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(120)).await;
            let before = server.script_calls();
            assert!(store.check("k", 1).await.unwrap().allowed);
            // The sweeper gives back what the slice left unspent.
            tokio::time::sleep(Duration::from_millis(120)).await;
            cold.push(server.script_calls() - before);
        }
        eprintln!("hot: 500 admissions in {hot} scripts; then cold, scripts per request: {cold:?}");
        assert!(hot <= 20, "{hot} scripts for 500 hot admissions");
        assert!(cold[cold.len() - 3..].iter().all(|&n| n == 1), "{cold:?}");
        // Nothing held any more: the key is whole but for what was spent.
        let free = store.peek("k").await.unwrap().remaining;
        assert!(free >= 990, "{free} free after the key went cold");
    });
}

/// Leases on a Redis Cluster: two stores lease keys spread over three masters (each key's
/// value, with its leases, is one slot), and together never admit beyond each key's bound.
#[test]
fn leases_on_a_redis_cluster_keep_each_keys_bound() {
    let Some(cluster) = support::redis::RedisCluster::start(3) else {
        return;
    };
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            use sluice::store::Store as _;
            let (capacity, per_sec) = (20u64, 40u64);
            let algorithm = AnyAlgorithm::new(
                Kind::TokenBucket,
                Quota::new(capacity, Rate::from_interval_ns(1_000_000_000 / per_sec).unwrap())
                    .unwrap(),
            );
            let config = RedisConfig::cluster(cluster.urls())
                .prefix("lease-cluster")
                .on_error(OnError::Deny)
                .timeout(Duration::from_secs(2))
                .lease(LeaseConfig::new(LeaseSize::Tokens(5), Duration::from_millis(100)));
            let stores = [
                RedisStore::connect(algorithm, config.clone()).await.unwrap(),
                RedisStore::connect(algorithm, config).await.unwrap(),
            ];
            let keys: Vec<String> = (0..12).map(|i| format!("key-{i}")).collect();
            let started = std::time::Instant::now();
            let run_for = Duration::from_millis(1500);
            let mut tasks = Vec::new();
            for (i, key) in keys.iter().enumerate() {
                for store in &stores {
                    let (store, key) = (store.clone(), key.clone());
                    let _ = i;
                    tasks.push(tokio::spawn(async move {
                        let mut admitted = 0u64;
                        while started.elapsed() < run_for {
                            match store.check(&key, 1).await {
                                Ok(d) if d.allowed => admitted += 1,
                                _ => tokio::time::sleep(Duration::from_millis(2)).await,
                            }
                        }
                        (key, admitted)
                    }));
                }
            }
            let mut per_key = std::collections::BTreeMap::<String, u64>::new();
            for t in tasks {
                let (key, n) = t.await.unwrap();
                *per_key.entry(key).or_default() += n;
            }
            let bound = capacity as f64 + per_sec as f64 * started.elapsed().as_secs_f64();
            eprintln!("a 3-master cluster, 12 leased keys, 2 stores: admitted per key {per_key:?}, bound {bound:.0}");
            for (key, n) in &per_key {
                assert!(*n as f64 <= bound, "{key}: {n} above the bound {bound:.0}");
                assert!(*n as f64 >= 0.6 * bound, "{key}: only {n} of {bound:.0}");
            }
        });
}

/// A charge on a leased key (a cost settled after the request ran) is taken from the slice
/// this gateway holds first, the rest in Redis, into debt down to the cap, the part beyond
/// forgiven; once the slice is given back, a gateway that leases nothing sees every token of
/// it spent and the debt owed.
#[test]
fn a_charge_on_a_leased_key_is_spent_from_the_slice_then_in_redis() {
    let Some(server) = server() else { return };
    block_on(async {
        use sluice::store::Store;
        // 100 tokens, one a second: what refills during the test is under one token.
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(100, Rate::from_interval_ns(1_000_000_000).unwrap()).unwrap(),
        );
        let prefix = format!("lease-charge-{}", std::process::id());
        let config = |lease: bool| {
            let c = RedisConfig::new(server.url())
                .prefix(prefix.clone())
                .on_error(OnError::Deny)
                .timeout(Duration::from_secs(5));
            if lease {
                c.lease(LeaseConfig::new(
                    LeaseSize::Tokens(10),
                    Duration::from_secs(5),
                ))
            } else {
                c
            }
        };
        let leased = RedisStore::connect(algorithm, config(true)).await.unwrap();
        let plain = RedisStore::connect(algorithm, config(false)).await.unwrap();
        // Four admissions: slices of 1, then 2, then larger, held by `leased`.
        for _ in 0..4 {
            assert!(leased.check("k", 1).await.unwrap().allowed);
        }
        assert_eq!(
            leased.charge("k", 30, u64::MAX).await,
            0,
            "30 of 96 free: nothing forgiven"
        );
        assert_eq!(
            leased.charge("k", 100, 20).await,
            14,
            "66 were left (the slice's and Redis's) and 20 may be owed: the rest is forgiven"
        );
        leased.give_back_leases().await;
        // A key in debt refuses even a query, until the debt is paid.
        let seen = match plain.peek("k").await {
            Err(sluice::Error::Limited { decision, .. }) => decision,
            other => panic!("a key in debt answered a query with {other:?}"),
        };
        assert_eq!(seen.remaining, 0, "every token spent: {seen:?}");
        assert!(
            seen.retry_after_ns > 19_000_000_000 && seen.retry_after_ns <= 20_000_000_000,
            "the debt of 20 tokens is paid in {} ns",
            seen.retry_after_ns
        );
        // 100 tokens of window and 20 owed beyond it, at a token a second.
        let owed = Duration::from_nanos(seen.reset_after_ns);
        assert!(
            owed > Duration::from_secs(119) && owed <= Duration::from_secs(120),
            "full again in {owed:?}: the debt is kept"
        );
        assert!(
            !plain
                .check("k", 1)
                .await
                .unwrap_or_else(|e| match e {
                    sluice::Error::Limited { decision, .. } => decision,
                    other => panic!("{other}"),
                })
                .allowed
        );
    });
}

/// A quota changed while a gateway holds a slice (a reload, or `PUT` of the policy, builds a
/// store under the new stamp): the next decision under the new quota reads the held slice as
/// spent and decides, rather than failing in the script and falling back to `on_error`.
#[test]
fn a_quota_change_while_a_slice_is_held_decides_under_the_new_quota() {
    let Some(server) = server() else { return };
    block_on(async {
        use sluice::store::Store;
        let prefix = format!("lease-requota-{}", std::process::id());
        let store = |capacity: u64| {
            let algorithm = AnyAlgorithm::new(
                Kind::Gcra,
                Quota::new(capacity, Rate::from_interval_ns(10_000_000).unwrap()).unwrap(),
            );
            let config = RedisConfig::new(server.url())
                .prefix(prefix.clone())
                .on_error(OnError::Deny)
                .timeout(Duration::from_secs(5))
                .lease(LeaseConfig::new(
                    LeaseSize::Tokens(10),
                    Duration::from_secs(5),
                ));
            RedisStore::connect(algorithm, config)
        };
        let before = store(200).await.unwrap();
        assert!(before.check("k", 1).await.unwrap().allowed);
        let after = store(100).await.unwrap();
        let decided = after.check("k", 1).await;
        assert!(
            matches!(decided, Ok(d) if d.allowed),
            "the first request under the new quota: {decided:?}"
        );
    });
}

/// A key with a quota of its own (`PUT /v1/policies/NAME/keys/KEY`) on a leased policy takes
/// its slices on its own quota: a key held to 3 admits 3, not a slice of the policy's 100.
#[test]
fn a_leased_key_with_a_quota_of_its_own_takes_slices_on_it() {
    let Some(server) = server() else { return };
    block_on(async {
        use sluice::store::Store;
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(100, Rate::from_interval_ns(1_000_000_000).unwrap()).unwrap(),
        );
        let config = RedisConfig::new(server.url())
            .prefix(format!("lease-own-{}", std::process::id()))
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(5))
            .lease(LeaseConfig::new(
                LeaseSize::Tokens(10),
                Duration::from_secs(5),
            ));
        let store = RedisStore::connect(algorithm, config).await.unwrap();
        // 3 tokens, one an hour.
        let own = Quota::new(3, Rate::from_interval_ns(3_600_000_000_000).unwrap()).unwrap();
        store.set_override("k", Some(own)).await.unwrap();
        let mut admitted = 0;
        for _ in 0..20 {
            if store.check("k", 1).await.is_ok() {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 3, "admitted on the key's own quota of 3");
        // A slice partly spent is given back under the key's own stamp: the key is not
        // converted to the policy's quota and back.
        let roomy = Quota::new(50, Rate::from_interval_ns(3_600_000_000_000).unwrap()).unwrap();
        store.set_override("m", Some(roomy)).await.unwrap();
        for _ in 0..5 {
            assert!(store.check("m", 1).await.is_ok());
        }
        store.give_back_leases().await;
        let value = server.cli(&["GET", &format!("lease-own-{}:{{m}}", std::process::id())]);
        assert!(
            value.starts_with("gcra:50:3600000000000|"),
            "the key after its slice was given back: {value}"
        );
    });
}

/// A give-back that arrives after its holder took the next slice (the sweeper's round trip
/// behind others while a request renewed the key) settles the slice it names and nothing
/// else. Named by the process alone, the late give-back would settle the live slice and free
/// tokens the gateway is still spending; named with each slice's generation, it finds its own
/// slice gone and changes nothing.
#[test]
fn a_late_give_back_settles_only_the_slice_it_names() {
    let Some(server) = server() else { return };
    block_on(async {
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(100, Rate::from_interval_ns(3_600_000_000_000).unwrap()).unwrap(),
        );
        let late_give_back = |prefix: &str, first: &'static str, second: &'static str| {
            let config = RedisConfig::new(server.url())
                .prefix(format!("{prefix}-{}", std::process::id()))
                .on_error(OnError::Deny);
            async move {
                let store = RedisStore::connect(algorithm, config).await.unwrap();
                let t0 = unix_ns();
                let ttl = Duration::from_secs(10);
                // A slice of 10; spent whole, given back as the next slice of 10 is taken.
                store
                    .lease_at("k", (first, None), None, 10, ttl, t0)
                    .await
                    .unwrap();
                let renewed = (first, (first != second).then_some(second));
                let (granted, free) = store
                    .lease_at("k", renewed, Some(10), 10, ttl, t0 + 1)
                    .await
                    .unwrap();
                assert_eq!((granted, free), (10, 80));
                // The first slice's give-back again, late, as having spent 2 of it.
                let (_, free) = store
                    .lease_at("k", (first, None), Some(2), 0, ttl, t0 + 2)
                    .await
                    .unwrap();
                free
            }
        };
        assert_eq!(
            late_give_back("late-one-name", "p", "p").await,
            88,
            "one name for every slice: the late give-back settled the live slice"
        );
        assert_eq!(
            late_give_back("late-generations", "pg1", "pg2").await,
            80,
            "named by generation: the live slice is untouched"
        );
    });
}

/// Under a steady load above the rate, a leased key admits the rate, as an unleased one does:
/// a slice that ends with tokens left gives them back before Redis settles it as all spent,
/// so the under-admission is bounded by the slices held, not a share of the rate. One store,
/// capacity 50 at 50/s, slices of up to 10 lasting 100 ms, 90 requests a second for 4 s;
/// real time, so the bound is the rate over the run with a margin for the test's own timing.
#[test]
fn a_steady_load_on_a_leased_key_admits_the_rate() {
    let Some(server) = server() else { return };
    block_on(async {
        use sluice::store::Store;
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(50, Rate::from_interval_ns(20_000_000).unwrap()).unwrap(),
        );
        let run = |lease: bool| {
            let mut config = RedisConfig::new(server.url())
                .prefix(format!("steady-{lease}-{}", std::process::id()))
                .on_error(OnError::Deny)
                .timeout(Duration::from_secs(2));
            if lease {
                config = config.lease(LeaseConfig::new(
                    LeaseSize::Tokens(10),
                    Duration::from_millis(100),
                ));
            }
            async move {
                let store = RedisStore::connect(algorithm, config).await.unwrap();
                // The burst first, so that the steady state is what is measured.
                while store.check("k", 1).await.is_ok() {}
                let started = std::time::Instant::now();
                let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / 90));
                let mut admitted = 0u64;
                while started.elapsed() < Duration::from_secs(4) {
                    tick.tick().await;
                    if store.check("k", 1).await.is_ok() {
                        admitted += 1;
                    }
                }
                admitted as f64 / started.elapsed().as_secs_f64()
            }
        };
        let plain = run(false).await;
        let leased = run(true).await;
        println!("steady 90/s offered at 50/s: leased {leased:.1}/s, without a lease {plain:.1}/s");
        assert!(
            leased >= 0.96 * plain,
            "leased {leased:.1}/s against {plain:.1}/s without a lease"
        );
    });
}

/// Slices of many keys given back at once (the gateway stopping, or the sweeper finding a
/// batch of them past their deadline) go to Redis in one pipeline: one round trip for all of
/// them, counted by a proxy between the store and Redis, rather than one per key. Each is
/// settled all the same: what was not spent is free again.
#[test]
fn slices_of_many_keys_are_given_back_in_one_round_trip() {
    let Some(server) = server() else { return };
    block_on(async {
        use sluice::store::Store;
        const KEYS: usize = 32;
        let proxy = support::proxy::LossyProxy::start(server.port()).await;
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(100, Rate::from_interval_ns(3_600_000_000_000).unwrap()).unwrap(),
        );
        let config = RedisConfig::new(proxy.url())
            .prefix(format!("lease-many-{}", std::process::id()))
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(5))
            // Slices that outlast the test: only the give-back under test settles them.
            .lease(LeaseConfig {
                min: 10,
                ..LeaseConfig::new(LeaseSize::Tokens(10), Duration::from_secs(30))
            });
        let store = RedisStore::connect(algorithm, config).await.unwrap();
        for k in 0..KEYS {
            let d = store.check(&format!("k{k}"), 1).await.unwrap();
            assert_eq!(d.remaining, 99, "key k{k} took a slice of 10 and spent one");
        }
        let before = proxy.flights();
        store.give_back_leases().await;
        let flights = proxy.flights() - before;
        println!("{KEYS} keys' slices given back in {flights} round trip(s)");
        assert!(
            flights <= 2,
            "{KEYS} keys' slices given back in {flights} round trips"
        );
        // Each key owes only the token it spent: the other nine are free again.
        let direct = RedisStore::connect(
            algorithm,
            RedisConfig::new(server.url())
                .prefix(format!("lease-many-{}", std::process::id()))
                .on_error(OnError::Deny),
        )
        .await
        .unwrap();
        for k in 0..KEYS {
            let d = direct.peek(&format!("k{k}")).await.unwrap();
            assert_eq!(d.remaining, 99, "key k{k} after its slice was given back");
        }
    });
}

/// A refund that lands while a slice settled at its expiry is in its grace pays that
/// settlement first, as the refill does: the slice's late give-back then returns only what the
/// debt still holds of it. Without that, the refund and the give-back return the same tokens
/// twice, and an admission made between them is forgotten. A schedule written out: a slice of
/// four never spent, settled at its expiry; a refund of one; one admission; the late
/// give-back of the slice (nothing spent). The key still owes the admission.
#[test]
fn a_refund_and_a_late_give_back_do_not_return_the_same_tokens() {
    let Some(server) = server() else { return };
    block_on(async {
        let algorithm = AnyAlgorithm::new(
            Kind::Gcra,
            Quota::new(CAPACITY, Rate::from_interval_ns(INTERVAL).unwrap()).unwrap(),
        );
        let config = RedisConfig::new(server.url())
            .prefix(format!("lease-refund-grace-{}", std::process::id()))
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(5));
        let store = RedisStore::connect(algorithm, config).await.unwrap();
        let ms = 1_000_000;
        let t0 = unix_ns();
        let ttl = TTL.as_nanos() as u64;
        let (granted, _) = store
            .lease_at("k", ("ag1", None), None, 4, TTL, t0)
            .await
            .unwrap();
        assert_eq!(granted, 4);
        // Expired 1 ms ago: settled as all spent; then a refund of one token.
        let t1 = t0 + ttl + ms;
        store.refund_at("k", 1, Duration::ZERO, t1).await.unwrap();
        assert!(store.check_at("k", 1, t1 + ms).await.unwrap().allowed);
        // The slice's give-back, late: none of it was spent.
        store
            .lease_at("k", ("ag1", None), Some(0), 0, TTL, t1 + 2 * ms)
            .await
            .unwrap();
        let owed = store
            .check_at("k", 0, t1 + 2 * ms)
            .await
            .unwrap()
            .reset_after_ns;
        println!(
            "after the refund, an admission and the late give-back the key owes {} ms",
            owed / ms
        );
        assert!(
            owed >= INTERVAL - 5 * ms,
            "the admission between the refund and the give-back is forgotten: the key owes {} ms",
            owed / ms
        );
    });
}
