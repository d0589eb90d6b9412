//! The circuit breaker's transitions, windows and permits, on paused tokio time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::Key;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use sluice::breaker::{
    BreakerBuilder, BreakerError, BreakerPermit, BreakerState, CircuitBreaker, Open, WindowStats,
};
use tokio::time::advance;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

/// A call that succeeds or fails at once.
async fn quick(breaker: &CircuitBreaker, fail: bool) -> Result<(), BreakerError<&'static str>> {
    breaker
        .call(async move {
            if fail {
                Err("boom")
            } else {
                Ok(())
            }
        })
        .await
}

/// A call that succeeds after `took` of paused time.
async fn taking(breaker: &CircuitBreaker, took: Duration) -> Result<(), BreakerError<()>> {
    breaker
        .call(async move {
            tokio::time::sleep(took).await;
            Ok(())
        })
        .await
}

/// Records a pattern of calls: `F` failed, `S` succeeded.
async fn pattern(breaker: &CircuitBreaker, calls: &str) {
    for call in calls.chars() {
        let result = quick(breaker, call == 'F').await;
        assert!(
            !matches!(result, Err(BreakerError::Open { .. })),
            "rejected while recording {calls}"
        );
    }
}

fn build(builder: BreakerBuilder) -> CircuitBreaker {
    builder.build().expect("a valid test configuration")
}

/// Opens `breaker` (count window 2, min 2) with two failures.
async fn trip(breaker: &CircuitBreaker) {
    pattern(breaker, "FF").await;
    assert_eq!(breaker.state(), BreakerState::Open);
}

fn tiny(open_for: Duration, probes: u32) -> CircuitBreaker {
    build(
        CircuitBreaker::builder()
            .count_window(2)
            .min_calls(2)
            .failure_rate(1.0)
            .open_for(open_for)
            .half_open_probes(probes),
    )
}

// === closed → open ===

#[tokio::test(start_paused = true)]
async fn the_failure_rate_opens_the_breaker_at_the_threshold() {
    let builder = || {
        CircuitBreaker::builder()
            .count_window(10)
            .min_calls(10)
            .failure_rate(0.5)
    };
    // 4 failures in 10: 40 %, below the threshold.
    let below = build(builder());
    pattern(&below, "SSSSSSFFFF").await;
    assert_eq!(below.state(), BreakerState::Closed);
    assert_eq!(below.stats().failures, 4);

    // 5 failures in 10: 50 %, at the threshold; open on the tenth call, not before.
    let at = build(builder());
    pattern(&at, "SSSSSFFFF").await;
    assert_eq!(at.state(), BreakerState::Closed);
    pattern(&at, "F").await;
    assert_eq!(at.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn no_verdict_before_the_minimum_number_of_calls() {
    let breaker = build(
        CircuitBreaker::builder()
            .count_window(100)
            .min_calls(5)
            .failure_rate(0.5),
    );
    pattern(&breaker, "FFFF").await; // 100 % failed, but only 4 calls
    assert_eq!(breaker.state(), BreakerState::Closed);
    pattern(&breaker, "F").await;
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn the_slow_call_rate_opens_the_breaker_even_when_calls_succeed() {
    let breaker = build(
        CircuitBreaker::builder()
            .count_window(4)
            .min_calls(4)
            .failure_rate(1.0)
            .slow_calls(100 * MS, 0.5),
    );
    taking(&breaker, 99 * MS).await.unwrap(); // just under: not slow
    taking(&breaker, 10 * MS).await.unwrap();
    taking(&breaker, 100 * MS).await.unwrap(); // at the threshold: slow
    assert_eq!(breaker.stats().slow_calls, 1);
    assert_eq!(breaker.stats().failures, 0);
    assert_eq!(breaker.state(), BreakerState::Closed);
    taking(&breaker, SEC).await.unwrap(); // 2 slow of 4
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn without_a_slow_call_setting_slowness_is_ignored() {
    let breaker = build(CircuitBreaker::builder().count_window(2).min_calls(2));
    taking(&breaker, 3600 * SEC).await.unwrap();
    taking(&breaker, 3600 * SEC).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.stats().slow_calls, 0);
}

// === windows ===

#[tokio::test(start_paused = true)]
async fn a_count_window_forgets_calls_pushed_out_by_newer_ones() {
    let builder = |size| {
        CircuitBreaker::builder()
            .count_window(size)
            .min_calls(4)
            .failure_rate(0.75)
    };
    // Over the last 4 calls, `SFFF` is 75 % failed; over all 8 calls it is only 62.5 %.
    let last_four = build(builder(4));
    pattern(&last_four, "FFSSSFF").await;
    assert_eq!(last_four.state(), BreakerState::Closed);
    assert_eq!(last_four.stats(), stats(4, 2, 0));
    pattern(&last_four, "F").await;
    assert_eq!(last_four.state(), BreakerState::Open);

    let all_eight = build(builder(8));
    pattern(&all_eight, "FFSSSFFF").await;
    assert_eq!(all_eight.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_time_window_forgets_calls_older_than_its_period() {
    let builder = || {
        CircuitBreaker::builder()
            .time_window(10 * SEC)
            .min_calls(4)
            .failure_rate(0.5)
    };
    // Three failures, then a success 10 s later: the failures have aged out.
    let aged = build(builder());
    pattern(&aged, "FFF").await;
    advance(10 * SEC).await;
    pattern(&aged, "S").await;
    assert_eq!(aged.stats(), stats(1, 0, 0));
    assert_eq!(aged.state(), BreakerState::Closed);
    pattern(&aged, "SSF").await;
    assert_eq!(aged.stats(), stats(4, 1, 0));
    assert_eq!(aged.state(), BreakerState::Closed);

    // The same calls 5 s apart: 3 failures of 4 calls in the window, so it opens.
    let recent = build(builder());
    pattern(&recent, "FFF").await;
    advance(5 * SEC).await;
    pattern(&recent, "S").await;
    assert_eq!(recent.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_time_window_counts_calls_when_they_end() {
    let breaker = build(CircuitBreaker::builder().time_window(SEC).min_calls(100));
    let permit = breaker.try_acquire().unwrap();
    advance(5 * SEC).await;
    permit.record_failure();
    assert_eq!(breaker.stats(), stats(1, 1, 0));
    advance(SEC).await;
    assert_eq!(breaker.stats(), WindowStats::default());
}

fn stats(calls: u64, failures: u64, slow_calls: u64) -> WindowStats {
    WindowStats {
        calls,
        failures,
        slow_calls,
    }
}

// === open ===

#[tokio::test(start_paused = true)]
async fn an_open_breaker_rejects_without_running_the_call() {
    let breaker = tiny(10 * SEC, 1);
    trip(&breaker).await;
    let ran = AtomicBool::new(false);
    let result = breaker
        .call(async {
            ran.store(true, Ordering::Relaxed);
            Ok::<_, ()>(())
        })
        .await;
    assert_eq!(
        result,
        Err(BreakerError::Open {
            retry_after: 10 * SEC
        })
    );
    assert!(
        !ran.load(Ordering::Relaxed),
        "the rejected future was never polled"
    );

    advance(3 * SEC).await;
    assert_eq!(
        breaker.try_acquire().unwrap_err(),
        Open {
            retry_after: 7 * SEC
        },
        "retry_after counts down"
    );
    let message = breaker.try_acquire().unwrap_err().to_string();
    assert_eq!(message, "circuit breaker is open; retry after 7s");
}

#[tokio::test(start_paused = true)]
async fn open_turns_half_open_when_the_wait_is_over() {
    let breaker = tiny(10 * SEC, 1);
    trip(&breaker).await;
    advance(10 * SEC - MS).await;
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.try_acquire().unwrap_err().retry_after, MS);
    advance(MS).await;
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    assert!(breaker.try_acquire().is_ok());
}

// === half-open ===

#[tokio::test(start_paused = true)]
async fn half_open_admits_a_bounded_number_of_probes() {
    let breaker = tiny(10 * SEC, 2);
    trip(&breaker).await;
    advance(10 * SEC).await;
    let first = breaker.try_acquire().unwrap();
    let second = breaker.try_acquire().unwrap();
    let third = breaker.try_acquire().unwrap_err();
    assert_eq!(
        third.retry_after,
        10 * SEC,
        "the open wait, as an upper bound"
    );
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    // A success frees no slot: the two probes are the whole quota.
    first.record_success();
    assert!(breaker.try_acquire().is_err());
    second.record_success();
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_closes_after_enough_successes_with_a_fresh_window() {
    let breaker = tiny(SEC, 3);
    trip(&breaker).await;
    advance(SEC).await;
    quick(&breaker, false).await.unwrap();
    quick(&breaker, false).await.unwrap();
    assert_eq!(
        breaker.state(),
        BreakerState::HalfOpen,
        "2 of 3 probes are not enough"
    );
    quick(&breaker, false).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.stats(), WindowStats::default());
    // The old failures are forgotten: one new failure does not reopen it.
    pattern(&breaker, "F").await;
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn half_open_reopens_on_a_failed_probe_for_a_full_wait() {
    let breaker = tiny(SEC, 3);
    trip(&breaker).await;
    advance(SEC).await;
    quick(&breaker, false).await.unwrap();
    assert_eq!(
        quick(&breaker, true).await,
        Err(BreakerError::Inner("boom"))
    );
    assert_eq!(breaker.state(), BreakerState::Open);
    assert_eq!(breaker.try_acquire().unwrap_err().retry_after, SEC);
}

#[tokio::test(start_paused = true)]
async fn half_open_reopens_on_a_slow_probe() {
    let breaker = build(
        CircuitBreaker::builder()
            .count_window(2)
            .min_calls(2)
            .slow_calls(100 * MS, 1.0)
            .open_for(SEC)
            .half_open_probes(1),
    );
    trip(&breaker).await;
    advance(SEC).await;
    taking(&breaker, 100 * MS).await.unwrap();
    assert_eq!(breaker.state(), BreakerState::Open);
}

// === permits ===

#[tokio::test(start_paused = true)]
async fn a_dropped_permit_is_cancelled_not_failed() {
    let breaker = tiny(SEC, 1);
    for _ in 0..10 {
        drop(breaker.try_acquire().unwrap());
    }
    assert_eq!(breaker.stats(), WindowStats::default());
    assert_eq!(breaker.state(), BreakerState::Closed);

    // In half-open, a cancelled probe gives its slot back.
    trip(&breaker).await;
    advance(SEC).await;
    let probe: BreakerPermit = breaker.try_acquire().unwrap();
    assert!(breaker.try_acquire().is_err());
    drop(probe);
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    breaker.try_acquire().unwrap().record_success();
    assert_eq!(breaker.state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_call_dropped_by_an_outer_timeout_is_cancelled() {
    let breaker = tiny(SEC, 1);
    for _ in 0..3 {
        let slow = taking(&breaker, 10 * SEC);
        assert!(tokio::time::timeout(SEC, slow).await.is_err());
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    assert_eq!(breaker.stats().calls, 0);

    // A timeout inside the call is a failure.
    for _ in 0..2 {
        let result = breaker
            .call(tokio::time::timeout(SEC, tokio::time::sleep(10 * SEC)))
            .await;
        assert!(matches!(result, Err(BreakerError::Inner(_))));
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_verdict_from_before_a_state_change_is_ignored() {
    let breaker = tiny(SEC, 1);
    let early = breaker.try_acquire().unwrap();
    trip(&breaker).await;
    advance(SEC).await;
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
    early.record_success(); // admitted while closed: not a probe
    assert_eq!(breaker.state(), BreakerState::HalfOpen);
}

#[tokio::test(start_paused = true)]
async fn classified_calls_count_only_real_failures() {
    let breaker = tiny(SEC, 1);
    let is_failure = |result: &Result<u16, ()>| matches!(result, Ok(500..) | Err(()));
    for _ in 0..5 {
        let status = breaker.call_classified(async { Ok(404) }, is_failure).await;
        assert_eq!(status, Ok(404));
    }
    assert_eq!(breaker.state(), BreakerState::Closed);
    for _ in 0..2 {
        let status = breaker.call_classified(async { Ok(503) }, is_failure).await;
        assert_eq!(status, Ok(503), "the response is returned as it came");
    }
    assert_eq!(breaker.state(), BreakerState::Open);
}

// === sharing ===

#[tokio::test(start_paused = true)]
async fn clones_share_one_breaker_across_tasks() {
    let breaker = build(
        CircuitBreaker::builder()
            .count_window(100)
            .min_calls(100)
            .failure_rate(0.5),
    );
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let breaker = breaker.clone();
            tokio::spawn(async move {
                breaker
                    .call(async move {
                        tokio::task::yield_now().await;
                        if i % 2 == 0 {
                            Err(())
                        } else {
                            Ok(())
                        }
                    })
                    .await
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap().ok();
    }
    assert_eq!(breaker.stats(), stats(50, 25, 0));
}

#[tokio::test(start_paused = true)]
async fn threads_hammering_one_breaker_open_it_exactly_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let breaker = metrics::with_local_recorder(&recorder, || {
        build(
            CircuitBreaker::builder()
                .name("hammered")
                .count_window(64)
                .min_calls(64)
                .failure_rate(0.5)
                .open_for(3600 * SEC),
        )
    });
    let handle = tokio::runtime::Handle::current();
    std::thread::scope(|scope| {
        for thread in 0..8 {
            let breaker = breaker.clone();
            let handle = handle.clone();
            scope.spawn(move || {
                let _paused_clock = handle.enter();
                for call in 0..200 {
                    if let Ok(permit) = breaker.try_acquire() {
                        permit.record((thread + call) % 2 == 0);
                    }
                }
            });
        }
    });
    assert_eq!(breaker.state(), BreakerState::Open);
    let metrics = snapshot(&snapshotter);
    let transitions = |from, to| {
        counter(
            &metrics,
            "sluice_breaker_transitions_total",
            &[("breaker", "hammered"), ("from", from), ("to", to)],
        )
    };
    assert_eq!(transitions("closed", "open"), 1);
    assert_eq!(transitions("open", "half_open"), 0);
    let recorded = counter(
        &metrics,
        "sluice_breaker_calls_total",
        &[("outcome", "success")],
    ) + counter(
        &metrics,
        "sluice_breaker_calls_total",
        &[("outcome", "failure")],
    );
    let rejected = counter(&metrics, "sluice_breaker_rejections_total", &[]);
    assert_eq!(
        recorded + rejected,
        8 * 200,
        "every call was admitted or rejected"
    );
    assert!(recorded >= 64, "{recorded} calls before opening");
}

#[test]
fn the_public_types_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<CircuitBreaker>();
    send_sync::<BreakerPermit>();
    send_sync::<BreakerError<std::io::Error>>();
}

// === metrics ===

type Metrics = Vec<(Key, DebugValue)>;

fn snapshot(snapshotter: &Snapshotter) -> Metrics {
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().clone(), value))
        .collect()
}

fn find<'m>(metrics: &'m Metrics, name: &str, labels: &[(&str, &str)]) -> &'m DebugValue {
    metrics
        .iter()
        .find(|(key, _)| {
            key.name() == name
                && labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
        })
        .map(|(_, value)| value)
        .unwrap_or_else(|| panic!("no metric {name} {labels:?}"))
}

fn counter(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    match find(metrics, name, labels) {
        DebugValue::Counter(n) => *n,
        other => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

fn gauge(metrics: &Metrics, name: &str) -> f64 {
    match find(metrics, name, &[]) {
        DebugValue::Gauge(value) => value.into_inner(),
        other => panic!("{name} is not a gauge: {other:?}"),
    }
}

#[test]
fn metrics_follow_every_transition() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let breaker = metrics::with_local_recorder(&recorder, || {
        build(
            CircuitBreaker::builder()
                .name("payments")
                .count_window(2)
                .min_calls(2)
                .open_for(SEC)
                .half_open_probes(1),
        )
    });
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let state = || gauge(&snapshot(&snapshotter), "sluice_breaker_state");
    runtime.block_on(async {
        assert_eq!(state(), 0.0);
        trip(&breaker).await;
        assert_eq!(state(), 2.0);
        assert!(quick(&breaker, false).await.is_err());
        assert!(quick(&breaker, false).await.is_err());
        advance(SEC).await;
        assert_eq!(breaker.state(), BreakerState::HalfOpen);
        assert_eq!(state(), 1.0);
        quick(&breaker, true).await.unwrap_err(); // half-open → open
        advance(SEC).await;
        quick(&breaker, false).await.unwrap(); // open → half-open → closed
        assert_eq!(state(), 0.0);
    });
    let metrics = snapshot(&snapshotter);
    let transitions = |from, to| {
        counter(
            &metrics,
            "sluice_breaker_transitions_total",
            &[("breaker", "payments"), ("from", from), ("to", to)],
        )
    };
    assert_eq!(transitions("closed", "open"), 1);
    assert_eq!(transitions("open", "half_open"), 2);
    assert_eq!(transitions("half_open", "open"), 1);
    assert_eq!(transitions("half_open", "closed"), 1);
    assert_eq!(
        counter(
            &metrics,
            "sluice_breaker_rejections_total",
            &[("breaker", "payments")]
        ),
        2
    );
    assert_eq!(
        counter(
            &metrics,
            "sluice_breaker_calls_total",
            &[("outcome", "failure")]
        ),
        3
    );
    assert_eq!(
        counter(
            &metrics,
            "sluice_breaker_calls_total",
            &[("outcome", "success")]
        ),
        1
    );
}
