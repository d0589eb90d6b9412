//! The waiting limiter when its timer or its runtime misbehaves: a driver that wakes late never
//! releases a burst, and a driver that dies never leaves a waiter hanging.

mod support;

use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use sluice::{Error, Limiter};
use sluice_core::{Gcra, Quota};
use support::paused::{gcra, settle, SEC};

/// Panics unless every window `[at[i], at[j]]` of sorted admission instants holds at most
/// `capacity + (span + slack) / interval` admissions of cost 1. `slack` allows for the time
/// between the limiter's decision and the instant its caller could record it.
fn assert_within_bound(at: &[Duration], capacity: u64, interval: Duration, slack: Duration) {
    for i in 0..at.len() {
        for j in i..at.len() {
            let count = (j - i + 1) as u64;
            let span = at[j] - at[i] + slack;
            let allowed = capacity + (span.as_nanos() / interval.as_nanos()) as u64;
            assert!(
                count <= allowed,
                "{count} admissions within {:?}: above capacity + rate·T = {allowed} ({at:?})",
                at[j] - at[i],
            );
        }
    }
}

// === a late timer ===

#[tokio::test(start_paused = true)]
async fn a_driver_woken_late_releases_no_more_than_the_bucket_holds() {
    // Capacity 2 at 10/s, 30 waiters behind a spent bucket. The clock then jumps a whole
    // second at once, past ten turns: the driver wakes once, 900 ms late.
    let limiter = Limiter::builder(gcra(2, "10/s"))
        .queue(100, 60 * SEC)
        .build();
    limiter.try_acquire(2).unwrap();
    let start = tokio::time::Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..30u32 {
        let (limiter, log) = (limiter.clone(), log.clone());
        tasks.push(tokio::spawn(async move {
            limiter.acquire(1).await.unwrap();
            log.lock().unwrap().push((i, start.elapsed()));
        }));
        settle().await;
    }
    assert_eq!(limiter.queued(), 30);
    tokio::time::advance(SEC).await;
    settle().await;
    // At 1 s the bucket holds its capacity, two tokens: two go, the rest wait their turns.
    assert_eq!(log.lock().unwrap().len(), 2);
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();
    let order: Vec<u32> = log.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, (0..30).collect::<Vec<_>>(), "FIFO");
    let at: Vec<Duration> = log.iter().map(|&(_, at)| at).collect();
    assert_eq!(at[..3], [SEC, SEC, SEC + SEC / 10]);
    assert_within_bound(&at, 2, SEC / 10, Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_driver_woken_late_again_and_again_stays_within_the_bound() {
    // Capacity 3 at 20/s; the clock moves in irregular jumps of up to 370 ms (many turns at
    // once), with newcomers arriving in between; none of them barges past the waiters.
    let limiter = Limiter::builder(gcra(3, "20/s"))
        .queue(1000, 600 * SEC)
        .build();
    let start = tokio::time::Instant::now();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut next = 0u32;
    for step in 0..40u64 {
        for _ in 0..step % 9 {
            let (limiter, log, i) = (limiter.clone(), log.clone(), next);
            next += 1;
            tasks.push(tokio::spawn(async move {
                limiter.acquire(1).await.unwrap();
                log.lock().unwrap().push((i, start.elapsed()));
            }));
            settle().await;
        }
        tokio::time::advance(Duration::from_millis(step * 37 % 371)).await;
        settle().await;
    }
    for t in tasks {
        t.await.unwrap();
    }
    let log = log.lock().unwrap();
    assert_eq!(log.len(), next as usize);
    let order: Vec<u32> = log.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, (0..next).collect::<Vec<_>>(), "FIFO");
    let at: Vec<Duration> = log.iter().map(|&(_, at)| at).collect();
    assert_within_bound(&at, 3, SEC / 20, Duration::ZERO);
}

#[test]
fn a_starved_runtime_releases_no_burst_when_it_resumes() {
    // Real time: one thread runs the driver and every waiter, and a task blocks it for 500 ms
    // while turns come due every 100 ms. When the thread is back, one token is there, not five.
    const INTERVAL: Duration = Duration::from_millis(100);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let at = rt.block_on(async {
        let limiter = Limiter::builder(gcra(1, "10/s"))
            .queue(100, 60 * SEC)
            .build();
        limiter.try_acquire(1).unwrap();
        let start = std::time::Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let (limiter, log) = (limiter.clone(), log.clone());
            tasks.push(tokio::spawn(async move {
                limiter.acquire(1).await.unwrap();
                log.lock().unwrap().push(start.elapsed());
            }));
        }
        settle().await;
        assert_eq!(limiter.queued(), 8);
        tokio::spawn(async { std::thread::sleep(5 * INTERVAL) })
            .await
            .unwrap();
        for t in tasks {
            t.await.unwrap();
        }
        let at = log.lock().unwrap().clone();
        at
    });
    assert_eq!(at.len(), 8);
    assert!(at[0] >= 5 * INTERVAL, "{at:?}");
    // Half an interval of slack for the scheduling between a decision and its record.
    assert_within_bound(&at, 1, INTERVAL, INTERVAL / 2);
}

// === a dead driver ===

fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

#[test]
fn a_limiter_outlives_the_runtime_that_ran_its_driver() {
    let first = paused_runtime();
    let limiter = first.block_on(async {
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
        drop(waiter); // detached: it is still queued when the runtime goes
        limiter
    });
    // The driver and the waiter go down with their runtime.
    drop(first);
    assert_eq!(limiter.queued(), 0);

    let second = paused_runtime();
    second.block_on(async {
        let start = tokio::time::Instant::now();
        let got = tokio::time::timeout(10 * SEC, limiter.acquire(1)).await;
        assert!(matches!(got, Ok(Ok(_))), "{got:?}");
        assert!(start.elapsed() <= SEC, "{:?}", start.elapsed());
        // And the queue keeps working there: a second waiter one token later.
        let got = tokio::time::timeout(10 * SEC, limiter.acquire(1)).await;
        assert!(matches!(got, Ok(Ok(_))), "{got:?}");
    });
}

#[test]
fn waiters_survive_the_runtime_that_ran_their_driver() {
    // Two runtimes at once: the driver runs on the first, a waiter on the second. When the
    // first shuts down, the waiter gets a driver of its own and is served.
    let first = paused_runtime();
    let limiter = Limiter::builder(gcra(1, "1/s"))
        .queue(100, 60 * SEC)
        .build();
    first.block_on(async {
        limiter.try_acquire(1).unwrap();
        let waiter = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(1).await })
        };
        settle().await;
        assert_eq!(limiter.queued(), 1);
        drop(waiter);
    });
    let second = paused_runtime();
    second.block_on(async {
        let waiter = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(1).await })
        };
        settle().await;
        assert_eq!(limiter.queued(), 2);
        first.shutdown_background();
        let got = tokio::time::timeout(10 * SEC, waiter).await;
        assert!(matches!(got, Ok(Ok(Ok(_)))), "{got:?}");
        assert_eq!(limiter.queued(), 0);
    });
}

#[test]
fn a_runtime_without_timers_gets_a_clear_error_at_once() {
    // Run on a thread of its own so that a hang fails the test instead of stalling it.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let got = rt.block_on(async {
            let limiter = Limiter::builder(gcra(1, "1/s"))
                .queue(100, 60 * SEC)
                .build();
            limiter.try_acquire(1).unwrap();
            let got = limiter.acquire(1).await;
            (got, limiter.queued())
        });
        tx.send(got).unwrap();
    });
    let got = rx.recv_timeout(10 * SEC);
    assert_eq!(got, Ok((Err(Error::NoRuntime), 0)));
    assert_eq!(
        Error::NoRuntime.to_string(),
        "acquire needs a tokio runtime with time enabled"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_due_at_its_deadline_is_admitted_when_the_timer_fires_late() {
    // One token per 1.5 ms and a maximum wait of 1.5 ms: the waiter's turn is its deadline.
    // tokio's timer fires on whole milliseconds (at 2 ms here); the token is there then, so the
    // waiter gets it instead of a timeout.
    let interval = Duration::from_micros(1500);
    let quota = Quota::new(1, sluice_core::Rate::from_interval_ns(1_500_000).unwrap()).unwrap();
    let limiter = Limiter::builder(Gcra::new(quota))
        .queue(10, interval)
        .build();
    limiter.try_acquire(1).unwrap();
    let start = tokio::time::Instant::now();
    let got = limiter.acquire(1).await;
    assert!(got.is_ok(), "{got:?} after {:?}", start.elapsed());
    assert!(start.elapsed() >= interval);
}
