//! The pool and the throttle on paused tokio time.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{stream, StreamExt};
use sluice::{Error, Limiter, Pool, Throttle};
use sluice_core::{Quota, TokenBucket};
use tokio::time::{sleep, Instant};

const SEC: Duration = Duration::from_secs(1);

/// Tracks how many tasks run at once.
#[derive(Clone, Default)]
struct Gauge {
    now: Arc<AtomicUsize>,
    max: Arc<AtomicUsize>,
}

impl Gauge {
    async fn hold(&self, d: Duration) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        sleep(d).await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn at_most_n_in_flight() {
    let pool = Pool::with_size(3).unwrap();
    let gauge = Gauge::default();
    let start = Instant::now();
    let tasks: Vec<_> = (0..10)
        .map(|_| {
            let (pool, gauge) = (pool.clone(), gauge.clone());
            tokio::spawn(async move { pool.run(gauge.hold(SEC)).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    assert_eq!(gauge.max.load(Ordering::SeqCst), 3);
    assert_eq!(start.elapsed(), 4 * SEC);
    assert_eq!(pool.in_flight(), 0);
    assert_eq!(pool.waiting(), 0);
}

#[tokio::test(start_paused = true)]
async fn zero_size_is_an_error() {
    assert!(Pool::with_size(0).is_err());
}

#[tokio::test(start_paused = true)]
async fn queue_full_is_immediate_and_max_wait_is_enforced() {
    let pool = Pool::bounded(NonZeroUsize::new(1).unwrap(), 1, 2 * SEC, "test");
    let holder = pool.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let p = pool.clone();
        async move {
            let started = Instant::now();
            (p.acquire().await.map(drop), started.elapsed())
        }
    });
    while pool.waiting() < 1 {
        tokio::task::yield_now().await;
    }
    let started = Instant::now();
    assert!(matches!(pool.acquire().await, Err(Error::QueueFull { .. })));
    assert_eq!(started.elapsed(), Duration::ZERO);
    let (result, waited) = waiter.await.unwrap();
    assert!(matches!(result, Err(Error::Timeout { .. })), "{result:?}");
    assert_eq!(waited, 2 * SEC);
    drop(holder);
    pool.acquire().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_panicking_task_releases_its_slot() {
    let pool = Pool::with_size(1).unwrap();
    let p = pool.clone();
    let joined = tokio::spawn(async move {
        p.run(async {
            sleep(SEC).await;
            panic!("task failed");
        })
        .await
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    assert_eq!(pool.in_flight(), 0);
    let started = Instant::now();
    pool.run(async {}).await.unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_task_releases_its_slot() {
    let pool = Pool::with_size(1).unwrap();
    let p = pool.clone();
    let long = tokio::spawn(async move { p.run(sleep(100 * SEC)).await });
    while pool.in_flight() < 1 {
        tokio::task::yield_now().await;
    }
    long.abort();
    let _ = long.await;
    assert_eq!(pool.in_flight(), 0);
    assert!(pool.try_acquire().is_ok());
}

#[tokio::test(start_paused = true)]
async fn close_wakes_waiters() {
    let pool = Pool::with_size(1).unwrap();
    let _held = pool.acquire().await.unwrap();
    let waiter = tokio::spawn({
        let p = pool.clone();
        async move { p.acquire().await.map(drop) }
    });
    while pool.waiting() < 1 {
        tokio::task::yield_now().await;
    }
    pool.close();
    assert_eq!(waiter.await.unwrap(), Err(Error::Closed));
}

#[tokio::test(start_paused = true)]
async fn ordered_and_unordered_streams() {
    let pool = Pool::with_size(2).unwrap();
    let gauge = Gauge::default();
    // Item i takes (5 - i) seconds: later items finish first.
    let g = gauge.clone();
    let ordered: Vec<u64> = pool
        .map_ordered(stream::iter(0..5u64), move |i| {
            let g = g.clone();
            async move {
                g.hold(SEC * (5 - i as u32)).await;
                i
            }
        })
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(ordered, vec![0, 1, 2, 3, 4]);
    assert_eq!(gauge.max.load(Ordering::SeqCst), 2);
    let unordered: Vec<u64> = pool
        .map_unordered(stream::iter(0..4u64), |i| async move {
            sleep(SEC * (4 - i as u32)).await;
            i
        })
        .map(Result::unwrap)
        .collect()
        .await;
    // 0 (4 s) and 1 (3 s) start; 1 ends at 3 s, 2 (2 s) starts and ends at 5 s; 0 ends at 4 s,
    // 3 (1 s) starts and ends at 5 s, after 2 was polled first.
    assert_eq!(unordered, vec![1, 0, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn throttle_bounds_both_concurrency_and_rate() {
    // At most 5 in flight, at most 20 per minute.
    let throttle = Throttle::new(
        Pool::with_size(5).unwrap(),
        Limiter::new(TokenBucket::new(Quota::parse(20, "20/min").unwrap())),
    );
    let gauge = Gauge::default();
    let starts = Arc::new(Mutex::new(Vec::new()));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..60)
        .map(|_| {
            let (throttle, gauge, starts) = (throttle.clone(), gauge.clone(), starts.clone());
            tokio::spawn(async move {
                throttle
                    .run(1, async {
                        starts.lock().unwrap().push(t0.elapsed());
                        gauge.hold(SEC / 2).await;
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(gauge.max.load(Ordering::SeqCst), 5);
    let starts = starts.lock().unwrap();
    // Any window of T seconds holds at most 20 + 20·T/60 starts.
    for (i, a) in starts.iter().enumerate() {
        for (j, b) in starts.iter().enumerate().skip(i) {
            let count = (j - i + 1) as f64;
            let allowed = 20.0 + (b.as_secs_f64() - a.as_secs_f64()) / 3.0;
            assert!(count <= allowed + 1e-9, "{count} starts in [{a:?}, {b:?}]");
        }
    }
    // The burst of 20 goes at once (5 at a time), then one every 3 s: the 60th at 120 s.
    assert_eq!(*starts.last().unwrap(), 120 * SEC);
}

/// A pool resized in place, with tasks in flight and callers waiting: a larger size lets the
/// waiters in at once; a smaller one cuts no task short but starts none until fewer than the
/// new size run, however the slots come back.
#[tokio::test(start_paused = true)]
async fn a_resized_pool_never_runs_more_than_its_size_once_the_surplus_finished() {
    let pool = Pool::bounded(
        NonZeroUsize::new(4).unwrap(),
        100,
        Duration::from_secs(60),
        "resize",
    );
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let start = |ms: u64| {
        let (pool, running, most) = (pool.clone(), running.clone(), most.clone());
        tokio::spawn(async move {
            pool.run(async {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                running.fetch_sub(1, Ordering::SeqCst);
            })
            .await
        })
    };
    let tasks: Vec<_> = (0..12).map(|i| start(100 + i * 10)).collect();
    tokio::task::yield_now().await;
    assert_eq!(pool.in_flight(), 4);
    assert_eq!(running.load(Ordering::SeqCst), 4);

    // Down to 2 with 4 running: none is cut, and no new one starts until only one runs.
    pool.resize(NonZeroUsize::new(2).unwrap());
    assert_eq!(pool.size(), 2);
    assert_eq!(pool.in_flight(), 4, "the tasks in flight run on");
    most.store(running.load(Ordering::SeqCst), Ordering::SeqCst);
    for _ in 0..20 {
        tokio::time::advance(Duration::from_millis(20)).await;
        tokio::task::yield_now().await;
        let now = running.load(Ordering::SeqCst);
        assert!(now <= 4, "{now} running");
        if now <= 2 {
            break;
        }
    }
    most.store(0, Ordering::SeqCst);
    for _ in 0..20 {
        tokio::time::advance(Duration::from_millis(20)).await;
        tokio::task::yield_now().await;
    }
    assert!(
        most.load(Ordering::SeqCst) <= 2,
        "{} ran at once at size 2",
        most.load(Ordering::SeqCst)
    );

    // Up to 5: the waiters get in at once.
    pool.resize(NonZeroUsize::new(5).unwrap());
    tokio::task::yield_now().await;
    assert!(
        running.load(Ordering::SeqCst) > 2,
        "a larger pool lets waiters in"
    );
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert!(most.load(Ordering::SeqCst) <= 5);
    assert_eq!(pool.in_flight(), 0);
    // Every slot is back: exactly 5 can run now.
    let held: Vec<_> = (0..5).map(|_| pool.try_acquire().unwrap()).collect();
    assert!(pool.try_acquire().is_err());
    drop(held);
}
