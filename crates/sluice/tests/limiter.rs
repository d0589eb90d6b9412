//! The waiting limiter on paused tokio time: order, bounds, deadlines, cancellation, close.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice::{AcquireOptions, Error, Limiter, Priority};
use sluice_core::{Quota, SlidingLog, TokenBucket};
use support::paused::{gcra, settle, SEC};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn waiters_are_admitted_in_fifo_order_at_exact_times() {
    let limiter = Limiter::builder(gcra(1, "1/s"))
        .queue(100, 60 * SEC)
        .build();
    limiter.try_acquire(1).unwrap();
    let start = Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20u64 {
        let (limiter, log) = (limiter.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            limiter.acquire(1).await.unwrap();
            log.lock().unwrap().push((i, start.elapsed()));
        }));
        settle().await; // enqueue in spawn order
    }
    assert_eq!(limiter.queued(), 20);
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();
    let want: Vec<(u64, Duration)> = (0..20).map(|i| (i, SEC * (i as u32 + 1))).collect();
    assert_eq!(*log, want);
}

#[tokio::test(start_paused = true)]
async fn newcomers_never_barge() {
    let limiter = Limiter::builder(gcra(1, "1/s"))
        .queue(100, 60 * SEC)
        .build();
    limiter.try_acquire(1).unwrap();
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    settle().await;
    assert_eq!(limiter.queued(), 1);
    // Half a second later there is still no token; the newcomer's wait counts the waiter.
    tokio::time::advance(SEC / 2).await;
    match limiter.try_acquire(1) {
        Err(Error::Limited { retry_after, .. }) => assert_eq!(retry_after, SEC + SEC / 2),
        other => panic!("expected Limited, got {other:?}"),
    }
    waiter.await.unwrap().unwrap();
    assert_eq!(limiter.queued(), 0);
    // A token later, nobody waits: try_acquire takes it.
    tokio::time::advance(SEC).await;
    limiter.try_acquire(1).unwrap();
}

#[tokio::test(start_paused = true)]
async fn queue_full_and_timeout_are_immediate() {
    let limiter = Limiter::builder(gcra(1, "1/s")).queue(2, 3 * SEC).build();
    limiter.try_acquire(1).unwrap();
    let a = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(1).await }
    });
    let b = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(1).await }
    });
    settle().await;
    let before = Instant::now();
    assert_eq!(
        limiter.acquire(1).await,
        Err(Error::QueueFull {
            retry_after: 3 * SEC
        })
    );
    assert_eq!(before.elapsed(), Duration::ZERO);
    a.await.unwrap().unwrap();
    b.await.unwrap().unwrap();

    // Empty queue, empty bucket: the fourth waiter would need 4 s > 3 s.
    let limiter = Limiter::builder(gcra(1, "1/s")).queue(10, 3 * SEC).build();
    limiter.try_acquire(1).unwrap();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let l = limiter.clone();
        waiters.push(tokio::spawn(async move { l.acquire(1).await }));
        settle().await;
    }
    let before = Instant::now();
    assert_eq!(
        limiter.acquire(1).await,
        Err(Error::Timeout {
            retry_after: 4 * SEC
        })
    );
    assert_eq!(before.elapsed(), Duration::ZERO);
    // A per-call maximum wait can be shorter than the limiter's.
    let short = AcquireOptions {
        max_wait: Some(SEC),
        ..AcquireOptions::default()
    };
    assert_eq!(
        limiter.acquire_with(1, short).await,
        Err(Error::Timeout {
            retry_after: 4 * SEC
        })
    );
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    assert_eq!(
        limiter.acquire(2).await,
        Err(Error::InsufficientCapacity {
            cost: 2,
            capacity: 1
        })
    );
}

#[tokio::test(start_paused = true)]
async fn deadline_is_enforced_when_higher_priorities_arrive() {
    let limiter = Limiter::builder(gcra(1, "1/s")).queue(10, 2 * SEC).build();
    limiter.try_acquire(1).unwrap();
    let start = Instant::now();
    let low = tokio::spawn({
        let l = limiter.clone();
        async move {
            let r = l
                .acquire_with(
                    1,
                    AcquireOptions {
                        priority: Priority::Low,
                        ..Default::default()
                    },
                )
                .await;
            (r, start.elapsed())
        }
    });
    settle().await;
    let mut highs = Vec::new();
    for _ in 0..2 {
        let l = limiter.clone();
        highs.push(tokio::spawn(async move {
            let r = l
                .acquire_with(
                    1,
                    AcquireOptions {
                        priority: Priority::High,
                        ..Default::default()
                    },
                )
                .await;
            (r, start.elapsed())
        }));
        settle().await;
    }
    let (low_result, low_at) = low.await.unwrap();
    assert_eq!(low_result, Err(Error::Timeout { retry_after: SEC }));
    assert_eq!(low_at, 2 * SEC);
    let mut high_times = Vec::new();
    for h in highs {
        let (r, at) = h.await.unwrap();
        r.unwrap();
        high_times.push(at);
    }
    assert_eq!(high_times, vec![SEC, 2 * SEC]);
}

#[tokio::test(start_paused = true)]
async fn priorities_are_served_first() {
    let limiter = Limiter::builder(gcra(1, "1/s"))
        .queue(100, 60 * SEC)
        .build();
    limiter.try_acquire(1).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (name, priority) in [
        ("low", Priority::Low),
        ("normal-1", Priority::Normal),
        ("high", Priority::High),
        ("normal-2", Priority::Normal),
    ] {
        let (l, order) = (limiter.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            l.acquire_with(
                1,
                AcquireOptions {
                    priority,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            order.lock().unwrap().push(name);
        }));
        settle().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec!["high", "normal-1", "normal-2", "low"]
    );
}

#[tokio::test(start_paused = true)]
async fn close_wakes_every_waiter() {
    let limiter = Limiter::builder(gcra(1, "1/s"))
        .queue(100, 60 * SEC)
        .build();
    limiter.try_acquire(1).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let l = limiter.clone();
        tasks.push(tokio::spawn(async move { l.acquire(1).await }));
    }
    settle().await;
    assert_eq!(limiter.queued(), 5);
    let before = Instant::now();
    limiter.close();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Err(Error::Closed));
    }
    assert_eq!(before.elapsed(), Duration::ZERO);
    assert_eq!(limiter.try_acquire(1), Err(Error::Closed));
    assert_eq!(limiter.acquire(1).await, Err(Error::Closed));
}

#[tokio::test(start_paused = true)]
async fn dropping_random_waiters_loses_no_tokens() {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let limiter = Limiter::builder(gcra(1, "1/s"))
        .queue(2000, 10_000 * SEC)
        .build();
    limiter.try_acquire(1).unwrap();
    let start = Instant::now();
    let mut handles = Vec::new();
    for i in 0..1000u32 {
        let l = limiter.clone();
        handles.push((
            i,
            tokio::spawn(async move {
                l.acquire(1).await.unwrap();
                start.elapsed()
            }),
        ));
    }
    while limiter.queued() < 1000 {
        tokio::task::yield_now().await;
    }
    let mut rng = StdRng::seed_from_u64(7);
    let mut kept = Vec::new();
    for (i, h) in handles {
        if rng.random_bool(0.5) {
            h.abort();
        } else {
            kept.push((i, h));
        }
    }
    settle().await;
    assert_eq!(limiter.queued(), kept.len());
    // The survivors are admitted one per second, as if the dropped ones never existed.
    for (k, (_, h)) in kept.into_iter().enumerate() {
        assert_eq!(h.await.unwrap(), SEC * (k as u32 + 1));
    }
    assert_eq!(limiter.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_after_admission_gives_its_tokens_back() {
    let limiter = Limiter::builder(gcra(1, "1/s")).queue(10, 60 * SEC).build();
    limiter.try_acquire(1).unwrap();
    let start = Instant::now();
    let mut first = Box::pin(limiter.acquire(1));
    tokio::select! {
        biased;
        _ = &mut first => panic!("must wait"),
        () = std::future::ready(()) => {}
    }
    let second = tokio::spawn({
        let l = limiter.clone();
        async move {
            l.acquire(1).await.unwrap();
            start.elapsed()
        }
    });
    settle().await;
    // At 1 s the driver admits `first`, but its future is never polled again: drop it.
    tokio::time::advance(SEC).await;
    settle().await;
    drop(first);
    // Its token comes back, so `second` is admitted now instead of at 2 s.
    assert_eq!(second.await.unwrap(), SEC);
}

#[tokio::test(start_paused = true)]
async fn sliding_log_limiter_waits_exactly() {
    // 3 per 3 s, exact.
    let limiter = Limiter::builder(SlidingLog::new(Quota::parse(3, "1/s").unwrap()))
        .queue(10, 60 * SEC)
        .build();
    let start = Instant::now();
    let mut at = Vec::new();
    for _ in 0..7 {
        limiter.acquire(1).await.unwrap();
        at.push(start.elapsed());
    }
    let z = Duration::ZERO;
    assert_eq!(at, vec![z, z, z, 3 * SEC, 3 * SEC, 3 * SEC, 6 * SEC]);
}

#[tokio::test(start_paused = true)]
async fn no_queue_means_acquire_denies_at_once() {
    let limiter = Limiter::builder(TokenBucket::new(Quota::parse(1, "1/s").unwrap()))
        .no_queue()
        .build();
    limiter.acquire(1).await.unwrap();
    match limiter.acquire(1).await {
        Err(Error::Limited { retry_after, .. }) => assert_eq!(retry_after, SEC),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn snapshot_restore_keeps_the_bucket_empty() {
    let limiter = Limiter::new(gcra(5, "1/s"));
    limiter.try_acquire(5).unwrap();
    let snap = limiter.snapshot(1_000_000);
    let fresh = Limiter::new(gcra(5, "1/s"));
    fresh.restore(&snap, 1_002_000).unwrap(); // 2 s later
    assert_eq!(fresh.peek().remaining, 2);
    assert!(fresh.try_acquire(3).is_err());
}
