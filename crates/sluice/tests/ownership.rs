//! One owner for a limit's state: the memory table and the file store, driven through the
//! changes an operator combines (quota changes while requests wait, algorithm switches,
//! evictions at the key cap, clean restarts, crashes), against a reference model that knows
//! how many tokens each key may hold at most.
//!
//! The model covers the bucket algorithms (`gcra`, `token_bucket`, `leaky_bucket`), which admit
//! alike and refill linearly: a key's bound `U` grows by one token per interval up to the
//! capacity, falls by each admission and by each settled charge (taken whole: below zero when
//! the key goes into debt, up to several times the capacity), rises by at most a refund's
//! cost, falls to `min(U, capacity)` when the quota changes, to `min(U, 0)` at a crash (every
//! key spent, a debt kept), and is unchanged by an eviction or a clean restart. (A full key is
//! as a key never seen: under a raised capacity it starts with the new one.) After every step
//! each admission must have been covered by the bound, and every key must show no more whole
//! tokens than the bound allows (none while in debt).

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluice::store::{FileStore, FileStoreOptions, MemoryStore, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota, Rate};
use support::model::{bucket_kind, drain, paused, wait_on, Admissions, Admits};
use support::paused::settle;
use support::redis::TempDir;

const KEYS: [&str; 4] = ["a", "b", "c", "d"];
/// Tolerance of the model's token arithmetic (the core rounds towards fewer tokens).
const EPS: f64 = 1e-6;

#[derive(Debug, Clone)]
enum Op {
    /// `try_acquire` of `cost` on a key.
    Admit { key: usize, cost: u64 },
    /// `acquire` (waits in the key's queue) of `cost` on a key, in a task of its own.
    Wait { key: usize, cost: u64 },
    /// Time passes (milliseconds); queued requests are admitted meanwhile.
    Advance { ms: u64 },
    /// The quota (and maybe the algorithm) changes in place, with whatever waits.
    Reconfigure {
        kind: Kind,
        capacity: u64,
        per_sec: u64,
    },
    /// A cost learnt after the fact, charged on a key without asking.
    Charge { key: usize, cost: u64 },
    /// The key's latest admission of this process given back (another policy refused it).
    Refund { key: usize },
    /// File store only: a clean stop and start on the same file.
    Restart,
    /// File store only: the process dies (its last periodic file is what the next one reads).
    Crash,
}

fn op(file: bool) -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let common = prop_oneof![
        6 => (key.clone(), 1..=2u64).prop_map(|(key, cost)| Op::Admit { key, cost }),
        3 => (key.clone(), 1..=2u64).prop_map(|(key, cost)| Op::Wait { key, cost }),
        2 => (key.clone(), 1..=15u64).prop_map(|(key, cost)| Op::Charge { key, cost }),
        1 => key.prop_map(|key| Op::Refund { key }),
        4 => (1..1500u64).prop_map(|ms| Op::Advance { ms }),
        2 => (bucket_kind(), 2..=6u64, 1..=4u64)
            .prop_map(|(kind, capacity, per_sec)| Op::Reconfigure { kind, capacity, per_sec }),
    ];
    if file {
        prop_oneof![
            12 => common,
            1 => Just(Op::Restart),
            1 => Just(Op::Crash),
        ]
        .boxed()
    } else {
        common.boxed()
    }
}

fn algorithm(kind: Kind, capacity: u64, per_sec: u64) -> AnyAlgorithm {
    let rate = Rate::from_interval_ns(1_000_000_000 / per_sec).unwrap();
    AnyAlgorithm::new(kind, Quota::new(capacity, rate).unwrap())
}

/// The reference: per key, the most tokens it may hold now.
struct Model {
    capacity: f64,
    interval_ns: f64,
    /// Tokens at most, as of `at` (ns of the test's paused clock).
    bound: [f64; KEYS.len()],
    at: u64,
}

impl Model {
    fn new(capacity: u64, interval_ns: u64) -> Model {
        Model {
            capacity: capacity as f64,
            interval_ns: interval_ns as f64,
            bound: [capacity as f64; KEYS.len()],
            at: 0,
        }
    }

    /// Refill up to `t`.
    fn to(&mut self, t: u64) {
        if t > self.at {
            let gained = (t - self.at) as f64 / self.interval_ns;
            for b in &mut self.bound {
                *b = (*b + gained).min(self.capacity);
            }
            self.at = t;
        }
    }

    fn charge(&mut self, key: usize, cost: u64) {
        self.bound[key] -= cost as f64;
    }

    fn refund(&mut self, key: usize, cost: u64) {
        self.bound[key] = (self.bound[key] + cost as f64).min(self.capacity);
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

    /// A key keeps what it had left, at most the new capacity; a full key is as a key never
    /// seen, which starts with the new capacity.
    fn reconfigure(&mut self, capacity: u64, interval_ns: u64) {
        let full = self.capacity;
        self.capacity = capacity as f64;
        self.interval_ns = interval_ns as f64;
        for b in &mut self.bound {
            *b = if *b + EPS >= full {
                self.capacity
            } else {
                b.min(self.capacity)
            };
        }
    }
}

impl Admits for Model {
    fn admit(&mut self, key: usize, cost: u64, t: u64, context: &str) {
        Model::admit(self, key, cost, t, context);
    }
}

/// The store under test: the memory table or a file store, which restarts and crashes.
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
    fn check(&self, key: &str, cost: u64) -> Result<(), Error> {
        match self {
            Subject::Memory(s) => s.check_now(key, cost).map(drop),
            Subject::File { store, .. } => store.check_now(key, cost).map(drop),
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

    fn now_ns(&self) -> u64 {
        match self {
            Subject::Memory(s) => s.keyed().now_ns(),
            Subject::File { store, .. } => store.keyed().now_ns(),
        }
    }
}

/// Runs `ops` on a store with `max_keys` keys (2: evictions happen), checking the model after
/// each step.
async fn run(ops: Vec<Op>, file: bool) {
    let (mut capacity, mut per_sec) = (3u64, 2u64);
    let first = algorithm(Kind::Gcra, capacity, per_sec);
    let (depth, max_wait) = (4usize, Duration::from_secs(3));
    let mut subject = if file {
        let dir = Arc::new(TempDir::new("ownership-model"));
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
    let mut model = Model::new(capacity, 1_000_000_000 / per_sec);
    let admissions: Admissions = Arc::default();
    let mut tasks = Vec::new();
    // Per key, the `check` admissions of this process not yet refunded: (cost, when).
    let mut refundable: [Vec<(u64, tokio::time::Instant)>; KEYS.len()] = Default::default();
    for (step, op) in ops.into_iter().enumerate() {
        let context = format!("step {step} ({op:?})");
        match op {
            Op::Admit { key, cost } => {
                if subject.check(KEYS[key], cost).is_ok() {
                    let now = tokio::time::Instant::now();
                    admissions.lock().push((key, cost, now));
                    refundable[key].push((cost, now));
                }
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
            Op::Wait { key, cost } => {
                let admitted = Arc::clone(&admissions);
                let task = match &subject {
                    Subject::Memory(s) => wait_on(s.clone(), &KEYS, key, cost, admitted),
                    Subject::File { store, .. } => {
                        wait_on(store.clone(), &KEYS, key, cost, admitted)
                    }
                };
                tasks.push(task);
                settle().await;
            }
            Op::Advance { ms } => {
                // In small steps, so that each admission is seen at its own time.
                for _ in 0..ms.div_ceil(50) {
                    tokio::time::advance(Duration::from_millis(50)).await;
                    settle().await;
                }
            }
            Op::Reconfigure {
                kind,
                capacity: c,
                per_sec: r,
            } => {
                // Admissions so far are under the old quota.
                drain(&admissions, &mut model, &since, &context);
                let to = algorithm(kind, c, r);
                match &subject {
                    Subject::Memory(s) => {
                        s.reconfigure(to, 2, depth, max_wait);
                    }
                    Subject::File { store, options, .. } => {
                        store.reconfigure(to, options);
                    }
                }
                model.to(since(tokio::time::Instant::now()));
                model.reconfigure(c, 1_000_000_000 / r);
                (capacity, per_sec) = (c, r);
                settle().await;
            }
            Op::Restart | Op::Crash => {
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
                let crashed = matches!(op, Op::Crash);
                if crashed {
                    // What a process killed now leaves: its last periodic write.
                    store.flush().unwrap();
                    std::fs::copy(store.path(), &path).unwrap();
                    store.close().unwrap();
                } else {
                    store.close().unwrap();
                    std::fs::copy(store.path(), &path).unwrap();
                }
                let algorithm = store.keyed().algorithm();
                for task in tasks.drain(..) {
                    task.abort();
                }
                *store = FileStore::open(&path, algorithm, options.clone()).unwrap();
                *generation = next;
                let now = since(tokio::time::Instant::now());
                model.to(now);
                // Refunds are for admissions of this process.
                refundable = Default::default();
                if crashed {
                    for b in &mut model.bound {
                        *b = b.min(0.0);
                    }
                } else {
                    // The restore counts the wall-clock time of the restart (in ms, rounded up).
                    let real = wall.elapsed().as_nanos() as u64 + 2_000_000;
                    model.to(now + real);
                    model.at = now;
                }
                let _ = (capacity, per_sec);
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
        let _ = subject.now_ns();
    }
    for task in tasks {
        task.abort();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_memory_table_never_gives_a_key_more_than_the_model(ops in prop::collection::vec(op(false), 1..40)) {
        paused().block_on(run(ops, false));
    }

    #[test]
    fn the_file_store_never_gives_a_key_more_than_the_model(ops in prop::collection::vec(op(true), 1..30)) {
        paused().block_on(run(ops, true));
    }
}
