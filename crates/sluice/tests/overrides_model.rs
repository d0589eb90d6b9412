//! Keys with a quota of their own, driven against a reference model: a key's override set,
//! changed or removed, the table's quota reloaded, requests admitted, queued, charged and
//! refunded in between, on the memory table and the file store (which also restarts cleanly).
//!
//! The model is the one of `ownership.rs`, with a quota per key: a key's bound `U` (the most
//! tokens it may hold) grows by one token per interval of the quota the key is held under, up
//! to that quota's capacity; it falls by each admission and by each charge (taken whole,
//! below zero when the key goes into debt), rises
//! by at most a refund's cost; and when the key's quota changes (its override set or removed,
//! or the table reloaded for a key without one) it falls to `min(U, new capacity)`, a full key
//! being as a key never seen, which starts with the new capacity. After every step each
//! admission must have been covered by the bound, and every key must show no more whole
//! tokens than the bound allows. This bound implies the interval form: what a key admitted
//! over any interval (less what was refunded) is at most the largest capacity it was held
//! under plus the refill, at the fastest rate it was held under, over that interval.
//!
//! Each override change is also checked directly against what `sluice_core::convert`
//! promises, as the key's own `peek` sees it: whole tokens after `≤ min(before, new
//! capacity)`, or the new capacity for a key that was full.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluice::store::{FileStore, FileStoreOptions, MemoryStore, Store};
use sluice_core::{AnyAlgorithm, Kind, Quota, Rate};
use support::model::{bucket_kind, drain, paused, wait_on, Admissions, Admits};
use support::paused::settle;
use support::redis::TempDir;

const KEYS: [&str; 3] = ["a", "b", "c"];
/// Tolerance of the model's token arithmetic (the core rounds towards fewer tokens).
const EPS: f64 = 1e-6;
const NS: u64 = 1_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    /// `check` of `cost` on a key.
    Admit { key: usize, cost: u64 },
    /// `acquire` (waits in the key's queue) of `cost` on a key, in a task of its own.
    Wait { key: usize, cost: u64 },
    /// A cost learnt after the request, taken whatever is left.
    Charge { key: usize, cost: u64 },
    /// The key's latest admission not yet refunded is given back.
    Refund { key: usize },
    /// The key gets a quota of its own (or a changed one).
    SetOverride {
        key: usize,
        capacity: u64,
        per_sec: u64,
    },
    /// The key is held under the table's quota again.
    RemoveOverride { key: usize },
    /// The table's quota (and maybe its algorithm) changes in place, with whatever waits.
    Reconfigure {
        kind: Kind,
        capacity: u64,
        per_sec: u64,
    },
    /// Time passes (milliseconds); queued requests are admitted meanwhile.
    Advance { ms: u64 },
    /// File store only: a clean stop and start on the same file.
    Restart,
}

fn op(file: bool) -> impl Strategy<Value = Op> {
    let key = || 0..KEYS.len();
    let common = prop_oneof![
        6 => (key(), 1..=3u64).prop_map(|(key, cost)| Op::Admit { key, cost }),
        3 => (key(), 1..=2u64).prop_map(|(key, cost)| Op::Wait { key, cost }),
        2 => (key(), 1..=10u64).prop_map(|(key, cost)| Op::Charge { key, cost }),
        2 => key().prop_map(|key| Op::Refund { key }),
        4 => (key(), 1..=8u64, 1..=6u64)
            .prop_map(|(key, capacity, per_sec)| Op::SetOverride { key, capacity, per_sec }),
        2 => key().prop_map(|key| Op::RemoveOverride { key }),
        2 => (bucket_kind(), 2..=6u64, 1..=4u64)
            .prop_map(|(kind, capacity, per_sec)| Op::Reconfigure { kind, capacity, per_sec }),
        4 => (1..1500u64).prop_map(|ms| Op::Advance { ms }),
    ];
    if file {
        prop_oneof![12 => common, 1 => Just(Op::Restart)].boxed()
    } else {
        common.boxed()
    }
}

fn quota(capacity: u64, per_sec: u64) -> Quota {
    Quota::new(capacity, Rate::from_interval_ns(NS / per_sec).unwrap()).unwrap()
}

/// A quota as the model reads it: capacity and interval (ns).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Q {
    capacity: f64,
    interval: f64,
}

impl Q {
    fn new(capacity: u64, per_sec: u64) -> Q {
        Q {
            capacity: capacity as f64,
            interval: (NS / per_sec) as f64,
        }
    }
}

/// The reference: per key, the most tokens it may hold now, under the quota it is held by.
struct Model {
    table: Q,
    own: [Option<Q>; KEYS.len()],
    /// Tokens at most, as of `at` (ns of the test's paused clock).
    bound: [f64; KEYS.len()],
    at: u64,
}

impl Model {
    fn new(table: Q) -> Model {
        Model {
            table,
            own: [None; KEYS.len()],
            bound: [table.capacity; KEYS.len()],
            at: 0,
        }
    }

    fn quota(&self, key: usize) -> Q {
        self.own[key].unwrap_or(self.table)
    }

    /// Refill up to `t`, each key at its own quota's rate.
    fn to(&mut self, t: u64) {
        if t > self.at {
            for key in 0..KEYS.len() {
                let q = self.quota(key);
                let gained = (t - self.at) as f64 / q.interval;
                self.bound[key] = (self.bound[key] + gained).min(q.capacity);
            }
            self.at = t;
        }
    }

    fn admit(&mut self, key: usize, cost: u64, t: u64, context: &str) {
        self.to(t);
        assert!(
            self.bound[key] + EPS >= cost as f64,
            "{context}: key {} admitted {cost} at {t} ns with at most {:.4} tokens",
            KEYS[key],
            self.bound[key]
        );
        self.bound[key] -= cost as f64;
    }

    /// A charge with no cap on the debt is taken whole: what is left after it is `U - cost`,
    /// below zero when the key goes into debt, which the refill then pays first.
    fn charge(&mut self, key: usize, cost: u64) {
        self.bound[key] -= cost as f64;
    }

    fn refund(&mut self, key: usize, cost: u64) {
        self.bound[key] = (self.bound[key] + cost as f64).min(self.quota(key).capacity);
    }

    /// The key moves from quota `from` to `to`: it keeps what it had, at most the new
    /// capacity; a full key starts full under the new one.
    fn convert(&mut self, key: usize, from: Q, to: Q) {
        let b = &mut self.bound[key];
        *b = if *b + EPS >= from.capacity {
            to.capacity
        } else {
            b.min(to.capacity)
        };
    }

    fn set_own(&mut self, key: usize, own: Option<Q>) {
        let from = self.quota(key);
        self.own[key] = own;
        self.convert(key, from, self.quota(key));
    }

    fn reconfigure(&mut self, table: Q) {
        let from = self.table;
        self.table = table;
        for key in 0..KEYS.len() {
            if self.own[key].is_none() {
                self.convert(key, from, table);
            }
        }
    }
}

impl Admits for Model {
    fn admit(&mut self, key: usize, cost: u64, t: u64, context: &str) {
        Model::admit(self, key, cost, t, context);
    }
}

/// The store under test: the memory table or a file store, which restarts.
enum Subject {
    Memory(MemoryStore),
    File {
        store: FileStore,
        dir: Arc<TempDir>,
        generation: u32,
        options: FileStoreOptions,
    },
}

impl Subject {
    async fn check(&self, key: &str, cost: u64) -> bool {
        match self {
            Subject::Memory(s) => s.check(key, cost).await.is_ok(),
            Subject::File { store, .. } => store.check(key, cost).await.is_ok(),
        }
    }

    async fn charge(&self, key: &str, cost: u64) {
        match self {
            Subject::Memory(s) => s.charge(key, cost, u64::MAX).await,
            Subject::File { store, .. } => store.charge(key, cost, u64::MAX).await,
        };
    }

    async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        match self {
            Subject::Memory(s) => s.refund(key, cost, ago).await,
            Subject::File { store, .. } => store.refund(key, cost, ago).await,
        }
    }

    async fn peek(&self, key: &str) -> u64 {
        match self {
            Subject::Memory(s) => s.peek(key).await.unwrap().remaining,
            Subject::File { store, .. } => store.peek(key).await.unwrap().remaining,
        }
    }

    fn set_override(&self, key: &str, quota: Option<Quota>) {
        match self {
            Subject::Memory(s) => s.set_override(key, quota),
            Subject::File { store, .. } => store.set_override(key, quota),
        };
    }

    fn reconfigure(&self, algorithm: AnyAlgorithm, depth: usize, max_wait: Duration) {
        match self {
            Subject::Memory(s) => {
                s.reconfigure(algorithm, 2, depth, max_wait);
            }
            Subject::File { store, options, .. } => {
                store.reconfigure(algorithm, options);
            }
        }
    }

    fn spawn_wait(&self, key: usize, cost: u64, admitted: Admissions) -> JoinHandle {
        match self {
            Subject::Memory(s) => wait_on(s.clone(), &KEYS, key, cost, admitted),
            Subject::File { store, .. } => wait_on(store.clone(), &KEYS, key, cost, admitted),
        }
    }
}

type JoinHandle = tokio::task::JoinHandle<()>;

/// Runs `ops` on a store with at most 2 keys (evictions happen), checking the model after
/// each step and the conversion at each override change.
async fn run(ops: Vec<Op>, file: bool) {
    let first = AnyAlgorithm::new(Kind::Gcra, quota(3, 2));
    let (depth, max_wait) = (4usize, Duration::from_secs(3));
    let mut subject = if file {
        let dir = Arc::new(TempDir::new("overrides-model"));
        let options = FileStoreOptions::default()
            .max_keys(2)
            .queue(depth, max_wait);
        let store = FileStore::open(dir.path().join("state.0"), first, options.clone()).unwrap();
        Subject::File {
            store,
            dir,
            generation: 0,
            options,
        }
    } else {
        Subject::Memory(MemoryStore::new(first, 2, depth, max_wait))
    };
    let start = tokio::time::Instant::now();
    let since = |t: tokio::time::Instant| u64::try_from((t - start).as_nanos()).unwrap();
    let mut model = Model::new(Q::new(3, 2));
    let admissions: Admissions = Arc::default();
    // Per key, the `check` admissions not yet refunded: (cost, when).
    let mut refundable: [Vec<(u64, tokio::time::Instant)>; KEYS.len()] = Default::default();
    let mut tasks = Vec::new();
    for (step, op) in ops.into_iter().enumerate() {
        let context = format!("step {step} ({op:?})");
        match op {
            Op::Admit { key, cost } => {
                if subject.check(KEYS[key], cost).await {
                    let now = tokio::time::Instant::now();
                    admissions.lock().push((key, cost, now));
                    refundable[key].push((cost, now));
                }
            }
            Op::Wait { key, cost } => {
                tasks.push(subject.spawn_wait(key, cost, Arc::clone(&admissions)));
                settle().await;
            }
            Op::Charge { key, cost } => {
                drain(&admissions, &mut model, &since, &context);
                model.to(since(tokio::time::Instant::now()));
                subject.charge(KEYS[key], cost).await;
                model.charge(key, cost);
            }
            Op::Refund { key } => {
                let Some((cost, at)) = refundable[key].pop() else {
                    continue;
                };
                drain(&admissions, &mut model, &since, &context);
                model.to(since(tokio::time::Instant::now()));
                subject
                    .refund(KEYS[key], cost, tokio::time::Instant::now() - at)
                    .await;
                model.refund(key, cost);
            }
            Op::SetOverride { key, .. } | Op::RemoveOverride { key } => {
                let own = match op {
                    Op::SetOverride {
                        capacity, per_sec, ..
                    } => Some((capacity, per_sec)),
                    _ => None,
                };
                drain(&admissions, &mut model, &since, &context);
                model.to(since(tokio::time::Instant::now()));
                let from = model.quota(key);
                let before = subject.peek(KEYS[key]).await;
                subject.set_override(KEYS[key], own.map(|(c, r)| quota(c, r)));
                let after = subject.peek(KEYS[key]).await;
                model.set_own(key, own.map(|(c, r)| Q::new(c, r)));
                let to = model.quota(key);
                // What `convert` promises: min(before, new capacity); a full key starts full.
                let allowed = if before as f64 >= from.capacity {
                    to.capacity as u64
                } else {
                    before.min(to.capacity as u64)
                };
                assert!(
                    after <= allowed,
                    "{context}: key {} showed {before} of {} tokens and {after} after the change \
                     to {}, at most {allowed} allowed",
                    KEYS[key],
                    from.capacity,
                    to.capacity,
                );
                settle().await;
            }
            Op::Reconfigure {
                kind,
                capacity,
                per_sec,
            } => {
                // Admissions so far are under the old quota.
                drain(&admissions, &mut model, &since, &context);
                subject.reconfigure(
                    AnyAlgorithm::new(kind, quota(capacity, per_sec)),
                    depth,
                    max_wait,
                );
                model.to(since(tokio::time::Instant::now()));
                model.reconfigure(Q::new(capacity, per_sec));
                settle().await;
            }
            Op::Advance { ms } => {
                // In small steps, so that each admission is seen at its own time.
                for _ in 0..ms.div_ceil(50) {
                    tokio::time::advance(Duration::from_millis(50)).await;
                    settle().await;
                }
            }
            Op::Restart => {
                let Subject::File {
                    store,
                    dir,
                    generation,
                    options,
                } = &mut subject
                else {
                    continue;
                };
                drain(&admissions, &mut model, &since, &context);
                let wall = std::time::Instant::now();
                let next = *generation + 1;
                let path = dir.path().join(format!("state.{next}"));
                store.close().unwrap();
                std::fs::copy(store.path(), &path).unwrap();
                let algorithm = store.keyed().algorithm();
                for task in tasks.drain(..) {
                    task.abort();
                }
                *store = FileStore::open(&path, algorithm, options.clone()).unwrap();
                *generation = next;
                let now = since(tokio::time::Instant::now());
                model.to(now);
                // The restore counts the wall-clock time of the restart (in ms, rounded up).
                let real = wall.elapsed().as_nanos() as u64 + 2_000_000;
                model.to(now + real);
                model.at = now;
                // Refunds are for admissions of this process.
                refundable = Default::default();
            }
        }
        drain(&admissions, &mut model, &since, &context);
        model.to(since(tokio::time::Instant::now()));
        for (key, name) in KEYS.iter().enumerate() {
            let shown = subject.peek(name).await;
            // A key in debt (a negative bound) shows no tokens; its admissions are what the
            // debt holds back, and `Model::admit` checks them.
            assert!(
                shown as f64 <= model.bound[key].max(0.0) + EPS,
                "{context}: key {name} shows {shown} tokens, the model allows {:.4}",
                model.bound[key]
            );
        }
    }
    for task in tasks {
        task.abort();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_override_change_gives_a_memory_key_more_than_the_model(ops in prop::collection::vec(op(false), 1..40)) {
        paused().block_on(run(ops, false));
    }

    #[test]
    fn no_override_change_gives_a_file_key_more_than_the_model(ops in prop::collection::vec(op(true), 1..30)) {
        paused().block_on(run(ops, true));
    }
}
