//! The metrics a limiter and a pool report through the `metrics` facade.

use std::future::Future;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use sluice::{AcquireOptions, Error, Keyed, Limiter, ManualClock, Pool};
use sluice_core::{Gcra, Quota};

fn value(
    snapshotter: &Snapshotter,
    kind: MetricKind,
    name: &str,
    labels: &[(&str, &str)],
) -> Option<f64> {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find_map(|(key, _, _, v)| {
            let key_ok = key.kind() == kind
                && key.key().name() == name
                && labels.iter().all(|(k, want)| {
                    key.key()
                        .labels()
                        .any(|l| l.key() == *k && l.value() == *want)
                });
            if !key_ok {
                return None;
            }
            match v {
                DebugValue::Counter(c) => Some(c as f64),
                DebugValue::Gauge(g) => Some(g.into_inner()),
                DebugValue::Histogram(h) => Some(h.len() as f64),
            }
        })
}

#[tokio::test(start_paused = true)]
async fn limiter_reports_admissions_denials_queue_and_waits() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let limiter = metrics::with_local_recorder(&recorder, || {
        Limiter::builder(Gcra::new(Quota::parse(1, "1/s").unwrap()))
            .queue(1, Duration::from_secs(5))
            .name("api")
            .build()
    });
    limiter.try_acquire(1).unwrap();
    assert!(matches!(limiter.try_acquire(1), Err(Error::Limited { .. })));
    let waiter = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire(1).await }
    });
    while limiter.queued() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        value(
            &snapshotter,
            MetricKind::Gauge,
            "sluice_queued",
            &[("limiter", "api")]
        ),
        Some(1.0)
    );
    assert!(matches!(
        limiter.acquire(1).await,
        Err(Error::QueueFull { .. })
    ));
    waiter.await.unwrap().unwrap();

    // Histograms are drained by each snapshot: read the wait first.
    assert_eq!(
        value(
            &snapshotter,
            MetricKind::Histogram,
            "sluice_queue_wait_seconds",
            &[("limiter", "api")]
        ),
        Some(1.0),
        "one queue wait recorded"
    );
    let counter =
        |labels: &[(&str, &str)], name| value(&snapshotter, MetricKind::Counter, name, labels);
    assert_eq!(
        counter(&[("limiter", "api")], "sluice_admitted_total"),
        Some(2.0)
    );
    assert_eq!(
        counter(
            &[("limiter", "api"), ("reason", "limit")],
            "sluice_denied_total"
        ),
        Some(1.0)
    );
    assert_eq!(
        counter(
            &[("limiter", "api"), ("reason", "queue_full")],
            "sluice_denied_total"
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &snapshotter,
            MetricKind::Gauge,
            "sluice_queued",
            &[("limiter", "api")]
        ),
        Some(0.0)
    );
}

#[tokio::test(start_paused = true)]
async fn pool_reports_in_flight() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let pool = metrics::with_local_recorder(&recorder, || {
        Pool::bounded(
            std::num::NonZeroUsize::new(2).unwrap(),
            4,
            Duration::from_secs(1),
            "workers",
        )
    });
    let a = pool.acquire().await.unwrap();
    let b = pool.acquire().await.unwrap();
    let gauge = || {
        value(
            &snapshotter,
            MetricKind::Gauge,
            "sluice_in_flight",
            &[("pool", "workers")],
        )
    };
    assert_eq!(gauge(), Some(2.0));
    drop(a);
    assert_eq!(gauge(), Some(1.0));
    drop(b);
    assert_eq!(gauge(), Some(0.0));
}

#[tokio::test(start_paused = true)]
async fn pool_queued_gauge_falls_when_waiters_leave() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let pool = metrics::with_local_recorder(&recorder, || {
        Pool::bounded(
            std::num::NonZeroUsize::new(1).unwrap(),
            4,
            Duration::from_secs(1),
            "workers",
        )
    });
    let queued = || {
        value(
            &snapshotter,
            MetricKind::Gauge,
            "sluice_queued",
            &[("pool", "workers")],
        )
    };
    let held = pool.acquire().await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let slot = pool.acquire().await?;
                tokio::time::sleep(Duration::from_secs(2)).await;
                drop(slot);
                Ok::<(), Error>(())
            })
        })
        .collect();
    while pool.waiting() < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(queued(), Some(2.0));
    drop(held);
    while pool.waiting() > 1 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        queued(),
        Some(1.0),
        "the first waiter left the queue with the slot"
    );
    // The first waiter holds the slot for 2 s; the second times out after 1 s.
    let results: Vec<_> = futures_util::future::join_all(waiters).await;
    assert!(results[0].as_ref().unwrap().is_ok());
    assert!(matches!(
        results[1].as_ref().unwrap(),
        Err(Error::Timeout { .. })
    ));
    assert_eq!(queued(), Some(0.0), "nobody waits any more");
}

#[tokio::test(start_paused = true)]
async fn keyed_queued_gauge_counts_the_waiters_of_every_key() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    // Every handle, including those of per-key queues made later, goes to this recorder.
    let _guard = metrics::set_default_local_recorder(&recorder);
    let keyed: Keyed<String, Gcra> = Keyed::builder(Gcra::new(Quota::parse(1, "1/s").unwrap()))
        .queue(10, Duration::from_secs(10))
        .name("per-user")
        .build();
    let queued = || {
        value(
            &snapshotter,
            MetricKind::Gauge,
            "sluice_queued",
            &[("limiter", "per-user")],
        )
    };
    keyed.try_acquire("alice", 1).unwrap();
    keyed.try_acquire("bob", 1).unwrap();
    let mut waiters = Vec::new();
    for key in ["alice", "alice", "bob"] {
        let keyed = keyed.clone();
        waiters.push(tokio::spawn(async move {
            keyed.acquire(key, 1, AcquireOptions::default()).await
        }));
        tokio::task::yield_now().await;
    }
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(keyed.waiting_keys(), 2);
    assert_eq!(queued(), Some(3.0), "two waiters on alice and one on bob");
    for w in waiters {
        w.await.unwrap().unwrap();
    }
    assert_eq!(queued(), Some(0.0));
}

#[test]
fn no_runtime_is_its_own_reason() {
    assert_eq!(Error::NoRuntime.reason(), "no_runtime");
    assert_eq!(Error::Closed.reason(), "closed");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let limiter = metrics::with_local_recorder(&recorder, || {
        Limiter::builder(Gcra::new(Quota::parse(1, "1/s").unwrap()))
            .clock(ManualClock::new())
            .name("api")
            .build()
    });
    limiter.try_acquire(1).unwrap();
    // Polled outside any tokio runtime, a wait cannot be timed.
    let mut acquire = std::pin::pin!(limiter.acquire(1));
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(matches!(
        acquire.as_mut().poll(&mut cx),
        std::task::Poll::Ready(Err(Error::NoRuntime))
    ));
    let denied = |reason| {
        value(
            &snapshotter,
            MetricKind::Counter,
            "sluice_denied_total",
            &[("limiter", "api"), ("reason", reason)],
        )
    };
    assert_eq!(denied("no_runtime"), Some(1.0));
    assert_eq!(denied("closed"), Some(0.0));
}
