//! The metrics a limiter and a pool report through the `metrics` facade.

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use sluice::{Error, Limiter, Pool};
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
