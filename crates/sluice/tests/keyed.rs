//! Per-key limits: isolation, the key cap, idle eviction and per-key queues.

mod support;

use std::time::Duration;

use sluice::{AcquireOptions, Error, Keyed};
use sluice_core::{Gcra, Quota, TokenBucket};
use support::paused::{gcra, SEC};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn keys_are_isolated() {
    let keyed: Keyed<String, Gcra> = Keyed::new(gcra(3, "1/s"));
    for _ in 0..3 {
        keyed.try_acquire("alice", 1).unwrap();
    }
    assert!(
        matches!(keyed.try_acquire("alice", 1), Err(Error::Limited { retry_after, .. }) if retry_after == SEC)
    );
    keyed.try_acquire("bob", 3).unwrap();
    assert_eq!(keyed.len(), 2);
    assert_eq!(keyed.peek("carol").remaining, 3);
    assert_eq!(keyed.len(), 2, "peeking does not insert");
    assert_eq!(
        keyed.try_acquire("carol", 4),
        Err(Error::InsufficientCapacity {
            cost: 4,
            capacity: 3
        })
    );
}

#[tokio::test(start_paused = true)]
async fn the_key_cap_holds_and_idle_keys_go_first() {
    let keyed: Keyed<u64, Gcra> = Keyed::builder(gcra(2, "1/s")).max_keys(100).build();
    for k in 0..100 {
        keyed.try_acquire(&k, 2).unwrap();
    }
    assert_eq!(keyed.len(), 100);
    // A flood of new keys never grows the table past the cap. (Busy keys evicted for room
    // are remembered until they would be idle, so some of the flood may be refused.)
    for k in 100..1000 {
        let _ = keyed.try_acquire(&k, 1);
        assert!(keyed.len() <= 100, "{} keys", keyed.len());
    }
    // After 2 s every key is full again: idle, so a sweep drops them all.
    tokio::time::advance(2 * SEC).await;
    let held = keyed.len();
    assert_eq!(keyed.sweep(), held);
    assert_eq!(keyed.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn eviction_prefers_idle_keys_over_busy_ones() {
    let keyed: Keyed<u64, Gcra> = Keyed::builder(gcra(10, "1/s")).max_keys(64).build();
    // Key 0 spends everything and stays busy for 10 s.
    keyed.try_acquire(&0, 10).unwrap();
    // Keys 1.. spend one token each: idle again after 1 s.
    for k in 1..40 {
        keyed.try_acquire(&k, 1).unwrap();
    }
    tokio::time::advance(2 * SEC).await;
    for k in 1000..1100 {
        keyed.try_acquire(&k, 1).unwrap();
    }
    // Key 0 kept its debt: still limited.
    assert!(keyed.try_acquire(&0, 9).is_err());
}

#[tokio::test(start_paused = true)]
async fn hottest_lists_the_emptiest_buckets() {
    let keyed: Keyed<String, TokenBucket> =
        Keyed::new(TokenBucket::new(Quota::parse(5, "1/s").unwrap()));
    keyed.try_acquire("a", 1).unwrap();
    keyed.try_acquire("b", 5).unwrap();
    keyed.try_acquire("c", 3).unwrap();
    let hot: Vec<(String, u64)> = keyed
        .hottest(2)
        .into_iter()
        .map(|(k, d)| (k, d.remaining))
        .collect();
    assert_eq!(hot, vec![("b".to_string(), 0), ("c".to_string(), 2)]);
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_queue() {
    let keyed: Keyed<String, Gcra> = Keyed::builder(gcra(1, "1/s")).queue(10, 5 * SEC).build();
    keyed.try_acquire("alice", 1).unwrap();
    let start = Instant::now();
    let waits: Vec<_> = (0..3)
        .map(|_| {
            let k = keyed.clone();
            tokio::spawn(async move {
                k.acquire("alice", 1, AcquireOptions::default())
                    .await
                    .unwrap();
                start.elapsed()
            })
        })
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    // Bob is not behind alice's queue.
    keyed
        .acquire("bob", 1, AcquireOptions::default())
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    // While alice's queue is busy, try_acquire for alice does not barge.
    assert!(keyed.try_acquire("alice", 1).is_err());
    let mut times = Vec::new();
    for w in waits {
        times.push(w.await.unwrap());
    }
    assert_eq!(times, vec![SEC, 2 * SEC, 3 * SEC]);
    // Past the maximum wait: refused at once.
    keyed.try_acquire("carol", 1).unwrap();
    let k = keyed.clone();
    let many: Vec<_> = (0..5)
        .map(|_| {
            let k = k.clone();
            tokio::spawn(async move { k.acquire("carol", 1, AcquireOptions::default()).await })
        })
        .collect();
    let mut results = Vec::new();
    for m in many {
        results.push(m.await.unwrap());
    }
    let timeouts = results
        .iter()
        .filter(|r| matches!(r, Err(Error::Timeout { .. })))
        .count();
    assert_eq!(
        timeouts, 0,
        "5 waiters at one per second fit in 5 s: {results:?}"
    );
    let sixth = keyed.acquire("carol", 1, AcquireOptions::default());
    keyed.try_acquire("dave", 1).unwrap();
    let _ = sixth.await;
}

#[tokio::test(start_paused = true)]
async fn without_a_queue_acquire_answers_at_once() {
    let keyed: Keyed<u32, Gcra> = Keyed::new(gcra(1, "1/s"));
    keyed.try_acquire(&7, 1).unwrap();
    let start = Instant::now();
    assert!(matches!(
        keyed.acquire(&7, 1, AcquireOptions::default()).await,
        Err(Error::Limited { .. })
    ));
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_refund_gives_back_what_was_taken_and_never_more() {
    let keyed: Keyed<String, Gcra> = Keyed::new(gcra(3, "1/min"));
    keyed.try_acquire("alice", 3).unwrap();
    assert!(keyed.try_acquire("alice", 1).is_err());
    keyed.refund("alice", 1, Duration::ZERO);
    assert_eq!(keyed.peek("alice").remaining, 1);
    keyed.refund("alice", 10, Duration::ZERO);
    assert_eq!(keyed.peek("alice").remaining, 3, "never above the capacity");
    keyed.refund("bob", 1, Duration::ZERO);
    assert_eq!(
        keyed.len(),
        1,
        "a refund for an unknown key inserts nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn a_window_gives_back_only_what_it_still_counts() {
    use sluice_core::FixedWindow;
    // 2 per minute in aligned one-minute windows.
    let keyed: Keyed<String, FixedWindow> =
        Keyed::new(FixedWindow::new(Quota::parse(2, "2/min").unwrap()));
    keyed.try_acquire("k", 2).unwrap();
    tokio::time::advance(Duration::from_secs(61)).await;
    keyed.try_acquire("k", 2).unwrap();
    // Taken 61 s ago, in the window before this one: nothing to give back.
    keyed.refund("k", 2, Duration::from_secs(61));
    assert_eq!(keyed.peek("k").remaining, 0);
    // Taken just now, in this window.
    keyed.refund("k", 1, Duration::ZERO);
    assert_eq!(keyed.peek("k").remaining, 1);
}

#[tokio::test(start_paused = true)]
async fn a_refund_lets_the_head_of_a_keys_queue_in_at_once() {
    let keyed: Keyed<String, Gcra> = Keyed::builder(gcra(1, "1/min"))
        .queue(4, Duration::from_secs(120))
        .build();
    keyed.try_acquire("k", 1).unwrap();
    let start = Instant::now();
    let waiter = {
        let keyed = keyed.clone();
        tokio::spawn(async move {
            keyed
                .acquire("k", 1, AcquireOptions::default())
                .await
                .map(|_| start.elapsed())
        })
    };
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(
        !waiter.is_finished(),
        "it waits for the next token, due at 60 s"
    );
    keyed.refund("k", 1, Duration::from_secs(5));
    let waited = waiter.await.unwrap().unwrap();
    assert!(
        waited < Duration::from_secs(6),
        "admitted at the refund, not at 60 s: {waited:?}"
    );
}

/// A deterministic stream of pseudo-random numbers (splitmix64), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Starts `n` waiters on `key` one after another (each queued before the next starts) and
/// returns the order in which they are admitted.
async fn admission_order(keyed: &Keyed<u64, Gcra>, key: u64, n: usize) -> Vec<usize> {
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (keyed, order) = (keyed.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            keyed
                .acquire(&key, 1, AcquireOptions::default())
                .await
                .unwrap();
            order.lock().unwrap().push(i);
        }));
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

#[tokio::test(start_paused = true)]
async fn dropped_keyed_waiters_leave_nothing_behind_and_fifo_holds() {
    let keyed: Keyed<u64, Gcra> = Keyed::builder(gcra(2, "20/s"))
        .queue(10_000, Duration::from_secs(600))
        .max_keys(1_000)
        .build();
    assert_eq!(keyed.waiting_keys(), 0);
    let mut rng = Rng(0x5EED_F00D_D20F);
    let mut handles = Vec::new();
    for _ in 0..10_000 {
        let key = rng.below(40);
        let keyed = keyed.clone();
        // Each waiter gives up after a random time, from before its first poll (0 ms, or an
        // abort before it runs) to after its admission (the refund path).
        let patience = Duration::from_millis(rng.below(3_000));
        let handle = tokio::spawn(async move {
            tokio::select! {
                biased;
                () = tokio::time::sleep(patience) => None,
                r = keyed.acquire(&key, 1 + rng_cost(key), AcquireOptions::default()) => Some(r),
            }
        });
        match rng.below(10) {
            0 => handle.abort(),
            1 => {
                tokio::task::yield_now().await;
                handle.abort();
            }
            _ => handles.push(handle),
        }
        if rng.below(8) == 0 {
            tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
        }
    }
    for h in handles {
        if let Ok(Some(r)) = h.await {
            assert!(
                !matches!(r, Err(Error::Closed | Error::NoRuntime)),
                "unexpected {r:?}"
            );
        }
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        keyed.waiting_keys(),
        0,
        "every waiting key left the waiting map with its last waiter"
    );
    keyed.sweep();
    assert_eq!(keyed.len(), 0, "every key is idle again");

    // A fresh sequence on one key: served first come, first served.
    keyed.try_acquire(&7, 2).unwrap();
    let order = admission_order(&keyed, 7, 30).await;
    assert_eq!(order, (0..30).collect::<Vec<_>>());
    assert_eq!(keyed.waiting_keys(), 0);
}

/// Some keys ask for two tokens, so that waiters of different sizes share queues.
fn rng_cost(key: u64) -> u64 {
    u64::from(key.is_multiple_of(5))
}

#[tokio::test(start_paused = true)]
async fn a_sliding_log_refund_works_with_the_callers_own_measure_of_the_age() {
    use sluice_core::SlidingLog;
    let keyed: Keyed<String, SlidingLog> =
        Keyed::new(SlidingLog::new(Quota::parse(3, "3/min").unwrap()));
    // The caller starts its stopwatch, then the request waits a little (another limit, a
    // pool slot) before this limit admits it: its measure of the age is a bit too long.
    let at = Instant::now();
    tokio::time::advance(Duration::from_millis(3)).await;
    keyed.try_acquire("k", 2).unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    keyed.try_acquire("k", 1).unwrap();
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(keyed.peek("k").remaining, 0);
    keyed.refund("k", 2, at.elapsed());
    assert_eq!(keyed.peek("k").remaining, 2, "the two tokens come back");
    keyed.try_acquire("k", 2).unwrap();
    // The admission 5 s later is still counted until it leaves the window, 65 s after start.
    tokio::time::advance(Duration::from_secs(53)).await;
    assert_eq!(keyed.peek("k").remaining, 0);
    tokio::time::advance(Duration::from_millis(2_100)).await;
    assert_eq!(keyed.peek("k").remaining, 1);

    // An age measured from just after the admission (as a caller that notes the time when
    // the answer comes back) works too.
    let log: Keyed<String, SlidingLog> =
        Keyed::new(SlidingLog::new(Quota::parse(2, "2/min").unwrap()));
    log.try_acquire("k", 2).unwrap();
    tokio::time::advance(Duration::from_millis(1)).await;
    let at = Instant::now();
    tokio::time::advance(Duration::from_secs(2)).await;
    log.refund("k", 1, at.elapsed());
    assert_eq!(log.peek("k").remaining, 1);
    // A refund never gives back more than was taken.
    log.refund("k", 5, at.elapsed());
    assert_eq!(log.peek("k").remaining, 2);
    log.try_acquire("k", 2).unwrap();
    // An admission that already left the window has nothing to give back.
    tokio::time::advance(Duration::from_secs(61)).await;
    log.try_acquire("k", 2).unwrap();
    log.refund("k", 2, Duration::from_secs(61));
    assert_eq!(log.peek("k").remaining, 0);
}

/// Spends a whole bucket of `gcra(5, "1/min")` on each of `keys`: busy for five minutes.
fn spend_all(keyed: &Keyed<u64, Gcra>, keys: impl IntoIterator<Item = u64>) {
    for k in keys {
        keyed.try_acquire(&k, 5).unwrap();
    }
}

/// New keys, each trying to spend a whole bucket of `gcra(5, "1/min")`; a key may be refused
/// when the table is full of busy keys (see the record of evicted keys).
fn flood(keyed: &Keyed<u64, Gcra>, keys: impl IntoIterator<Item = u64>) {
    for k in keys {
        let _ = keyed.try_acquire(&k, 5);
    }
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_evicted_before_any_busy_one() {
    const MAX: usize = 2_000;
    let keyed: Keyed<u64, Gcra> = Keyed::builder(gcra(5, "1/min")).max_keys(MAX).build();
    let mut rng = Rng(0xE71C_7105);
    let mut busy = Vec::new();
    let mut next = 0;
    // Each round fills the free slots and the slots of the keys gone idle since the last
    // round, no more: new keys never need a busy key's slot. One key in twenty is light (one
    // token: idle again after 1 min), the rest spend their whole bucket (busy for 5 min).
    let mut light_before = 0;
    for round in 0..4 {
        let n = (MAX - keyed.len()) + light_before;
        light_before = 0;
        for _ in 0..n {
            next += 1;
            if rng.below(20) == 0 {
                keyed.try_acquire(&next, 1).unwrap();
                light_before += 1;
            } else {
                spend_all(&keyed, [next]);
                busy.push(next);
            }
        }
        assert!(keyed.len() <= MAX);
        let held: std::collections::HashSet<u64> =
            keyed.export().keys.into_iter().map(|(k, _)| k).collect();
        let lost = busy.iter().filter(|k| !held.contains(k)).count();
        assert_eq!(
            lost, 0,
            "round {round}: busy keys evicted while idle ones were there"
        );
        tokio::time::advance(Duration::from_secs(61)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_evicted_busy_key_does_not_come_back_fuller() {
    let keyed: Keyed<u64, Gcra> = Keyed::builder(gcra(5, "1/min")).max_keys(8).build();
    spend_all(&keyed, [0]);
    tokio::time::advance(SEC).await;
    // Busier keys come in: key 0 is the nearest to idle, the first to go.
    spend_all(&keyed, 1..10);
    assert!(keyed.len() <= 8);
    assert!(
        keyed.try_acquire(&0, 1).is_err(),
        "key 0 spent its bucket a second ago: it has nothing to give"
    );
    // It refills at its own pace: one token a minute after it spent its fifth.
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(keyed.try_acquire(&0, 1).is_ok());
    assert!(keyed.try_acquire(&0, 1).is_err());
}

#[tokio::test(start_paused = true)]
async fn a_key_with_waiters_is_never_evicted() {
    let keyed: Keyed<u64, Gcra> = Keyed::builder(gcra(5, "1/min"))
        .max_keys(8)
        .queue(10, Duration::from_secs(600))
        .build();
    spend_all(&keyed, [0]);
    let start = Instant::now();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let keyed = keyed.clone();
            tokio::spawn(async move {
                keyed
                    .acquire(&0, 1, AcquireOptions::default())
                    .await
                    .map(|_| start.elapsed())
            })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    tokio::time::advance(SEC).await;
    flood(&keyed, 1..200);
    assert!(keyed.len() <= 9, "the cap, and the key with waiters");
    let mut times = Vec::new();
    for w in waiters {
        times.push(w.await.unwrap().unwrap());
    }
    assert_eq!(
        times,
        [Duration::from_secs(60), Duration::from_secs(120)],
        "one token a minute, as if no other key had come"
    );
}

#[tokio::test(start_paused = true)]
async fn evicted_busy_keys_of_the_window_algorithms_come_back_no_fuller() {
    use sluice_core::{AnyAlgorithm, Kind};
    for kind in [
        Kind::SlidingLog,
        Kind::FixedWindow,
        Kind::SlidingWindow,
        Kind::TokenBucket,
        Kind::LeakyBucket,
    ] {
        let alg = AnyAlgorithm::new(kind, Quota::parse(4, "4/min").unwrap());
        let keyed: Keyed<u64, AnyAlgorithm> = Keyed::builder(alg).max_keys(8).build();
        keyed.try_acquire(&0, 4).unwrap();
        tokio::time::advance(SEC).await;
        // Busier keys come in: key 0, the nearest to idle, makes room.
        for k in 1..10 {
            let _ = keyed.try_acquire(&k, 4);
        }
        assert!(
            keyed.try_acquire(&0, 1).is_err(),
            "{kind:?}: key 0 spent everything a second ago"
        );
    }
}
