//! The retry combinator, its backoff schedule, `Retry-After` and the retry budget, on paused
//! tokio time: every delay below is measured on the paused clock, never slept for real.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use metrics::Key;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};
use sluice::retry::{Backoff, Jitter, Outcome, Retry, RetryAfter, RetryBudget, RetryReport, Stop};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const SEC: Duration = Duration::from_secs(1);

fn attempts(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("test attempt limits are positive")
}

/// Runs `retry` over an operation that fails every time, and returns the report with the
/// paused-clock gaps between consecutive attempts.
async fn always_failing<C>(retry: &Retry<C>) -> (RetryReport<(), &'static str>, Vec<Duration>)
where
    C: sluice::retry::Classify<(), &'static str>,
{
    let mut starts = Vec::new();
    let report = retry
        .run_with_report(|_| {
            starts.push(Instant::now());
            async { Err("down") }
        })
        .await;
    let gaps = starts.windows(2).map(|w| w[1] - w[0]).collect();
    (report, gaps)
}

/// A random number generator that plays back a script of `u64`s.
struct Script(std::vec::IntoIter<u64>);

impl RngCore for Script {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }
    fn next_u64(&mut self) -> u64 {
        self.0.next().expect("the script ran out of numbers")
    }
    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for byte in dst {
            *byte = self.next_u32() as u8;
        }
    }
}

// === the schedule ===

#[tokio::test(start_paused = true)]
async fn without_jitter_the_schedule_doubles_up_to_the_cap() {
    let backoff = Backoff::new(100 * MS, SEC)
        .with_jitter(Jitter::None)
        .with_max_attempts(attempts(6));
    let (report, gaps) = always_failing(&Retry::new(backoff)).await;
    assert_eq!(gaps, [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS]);
    assert_eq!(report.attempts, 6);
    assert_eq!(report.stop, Stop::AttemptsExhausted);
    assert_eq!(report.result, Err("down"));
}

#[tokio::test(start_paused = true)]
async fn full_jitter_schedule_follows_the_random_numbers_exactly() {
    // x / 2^64 of each ceiling: 1/2 of 100 ms, 1/4 of 200 ms, 0 of 400 ms, all of 800 ms.
    let script = Script(vec![1 << 63, 1 << 62, 0, u64::MAX].into_iter());
    let backoff = Backoff::new(100 * MS, 10 * SEC).with_max_attempts(attempts(5));
    let (report, gaps) = always_failing(&Retry::new(backoff).with_rng(script)).await;
    assert_eq!(gaps, [50 * MS, 50 * MS, Duration::ZERO, 800 * MS]);
    assert_eq!(report.attempts, 5);
}

#[tokio::test(start_paused = true)]
async fn a_seeded_schedule_is_reproducible_and_jittered() {
    let backoff = Backoff::new(100 * MS, 2 * SEC).with_max_attempts(attempts(8));
    let expected: Vec<Duration> = backoff.delays(StdRng::seed_from_u64(42)).collect();
    assert_eq!(expected.len(), 7);

    let (_, first) = always_failing(&Retry::new(backoff).with_seed(42)).await;
    let (_, again) = always_failing(&Retry::new(backoff).with_seed(42)).await;
    let (_, other) = always_failing(&Retry::new(backoff).with_seed(43)).await;
    assert_eq!(first, again, "same seed, same schedule");
    assert_ne!(first, other, "another seed, another schedule");

    // tokio's timer rounds each sleep up to the next millisecond.
    for (gap, delay) in first.iter().zip(&expected) {
        assert!(
            *delay <= *gap && *gap < *delay + MS,
            "{gap:?} for {delay:?}"
        );
    }
    // Jitter really happened: not every delay is its ceiling.
    let ceilings: Vec<Duration> = (0..7).map(|n| backoff.ceiling(n)).collect();
    assert_ne!(expected, ceilings);
}

proptest! {
    #[test]
    fn every_jittered_delay_is_within_zero_and_its_ceiling(
        base_ms in 0u32..10_000,
        cap_ms in 0u32..60_000,
        retry in 0u32..200,
        seed in any::<u64>(),
    ) {
        let backoff = Backoff::new(base_ms * MS, cap_ms * MS);
        let mut rng = StdRng::seed_from_u64(seed);
        let delay = backoff.delay(retry, &mut rng);
        let ceiling = backoff.ceiling(retry);
        prop_assert!(ceiling <= cap_ms * MS);
        prop_assert!(delay <= ceiling, "{delay:?} > {ceiling:?}");
        let exponential = (base_ms * MS).saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX));
        prop_assert!(ceiling <= exponential || retry >= 32);
    }

    #[test]
    fn every_slept_delay_is_within_the_cap(
        base_ms in 1u32..500,
        cap_ms in 1u32..2_000,
        seed in any::<u64>(),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("a paused runtime");
        let backoff = Backoff::new(base_ms * MS, cap_ms * MS).with_max_attempts(attempts(10));
        let retry = Retry::new(backoff).with_seed(seed);
        let (report, gaps) = runtime.block_on(always_failing(&retry));
        prop_assert_eq!(report.attempts, 10);
        prop_assert_eq!(gaps.len(), 9);
        for gap in gaps {
            // Rounded up to tokio's millisecond tick at most.
            prop_assert!(gap <= cap_ms * MS + MS, "{:?} > cap {} ms", gap, cap_ms);
        }
    }
}

// === the limits ===

#[tokio::test(start_paused = true)]
async fn max_attempts_bounds_the_calls() {
    let calls = AtomicU32::new(0);
    let backoff = Backoff::new(10 * MS, SEC).with_max_attempts(attempts(4));
    let report = Retry::new(backoff)
        .run_with_report(|attempt| {
            assert_eq!(
                attempt,
                calls.fetch_add(1, Ordering::Relaxed) + 1,
                "numbered from 1"
            );
            async { Err::<(), _>("down") }
        })
        .await;
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    assert_eq!((report.attempts, report.stop), (4, Stop::AttemptsExhausted));

    let start = Instant::now();
    let once = Retry::new(backoff.with_max_attempts(NonZeroU32::MIN));
    let (report, gaps) = always_failing(&once).await;
    assert_eq!((report.attempts, gaps.len()), (1, 0));
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no sleep after the last attempt"
    );
}

#[tokio::test(start_paused = true)]
async fn success_stops_retrying() {
    let backoff = Backoff::new(10 * MS, SEC).with_max_attempts(attempts(10));
    let report = Retry::new(backoff)
        .run_with_report(|attempt| async move {
            if attempt < 3 {
                Err("down")
            } else {
                Ok(attempt)
            }
        })
        .await;
    assert_eq!(report.result, Ok(3));
    assert_eq!((report.attempts, report.stop), (3, Stop::Success));
}

#[tokio::test(start_paused = true)]
async fn a_non_retryable_failure_is_returned_at_once() {
    let retry = Retry::new(Backoff::default()).with_classifier(|r: &Result<(), u16>| match r {
        Err(status) if *status >= 500 => Outcome::RETRY,
        Err(_) => Outcome::Fail,
        Ok(()) => Outcome::Success,
    });
    let report = retry.run_with_report(|_| async { Err(404) }).await;
    assert_eq!(report.result, Err(404));
    assert_eq!((report.attempts, report.stop), (1, Stop::NotRetryable));
    let report = retry.run_with_report(|_| async { Err(503) }).await;
    assert_eq!((report.attempts, report.stop), (3, Stop::AttemptsExhausted));
}

#[tokio::test(start_paused = true)]
async fn max_elapsed_stops_before_a_retry_that_would_start_too_late() {
    let backoff = Backoff::new(SEC, SEC)
        .with_jitter(Jitter::None)
        .with_max_attempts(attempts(100))
        .with_max_elapsed(2500 * MS);
    let start = Instant::now();
    let (report, gaps) = always_failing(&Retry::new(backoff)).await;
    // Attempts at 0 s, 1 s and 2 s; one at 3 s would be past 2.5 s.
    assert_eq!(gaps, [SEC, SEC]);
    assert_eq!((report.attempts, report.stop), (3, Stop::DeadlineExceeded));
    assert_eq!(
        start.elapsed(),
        2 * SEC,
        "gave up without sleeping past the limit"
    );

    // A retry starting exactly at the limit is still made.
    let (report, _) = always_failing(&Retry::new(backoff.with_max_elapsed(3 * SEC))).await;
    assert_eq!((report.attempts, report.stop), (4, Stop::DeadlineExceeded));
}

// === Retry-After ===

/// A fake HTTP response.
#[derive(Debug, Clone, PartialEq)]
struct Response {
    status: u16,
    retry_after: Option<&'static str>,
}

/// Retries 503s, honouring `Retry-After` as read at the wall-clock time `now`.
fn honour_retry_after(now: SystemTime) -> impl Fn(&Result<Response, ()>) -> Outcome {
    move |result| match result {
        Ok(Response {
            status: 503,
            retry_after,
        }) => Outcome::Retry {
            after: retry_after.and_then(|value| RetryAfter::parse_delay(value, now).ok()),
        },
        Ok(_) => Outcome::Success,
        Err(()) => Outcome::Fail,
    }
}

/// A 503 with `retry_after` first, then a 200.
async fn busy_then_ok(
    retry: &Retry<impl sluice::retry::Classify<Response, ()>>,
    retry_after: Option<&'static str>,
) -> (RetryReport<Response, ()>, Duration) {
    let start = Instant::now();
    let report = retry
        .run_with_report(|attempt| async move {
            Ok(if attempt == 1 {
                Response {
                    status: 503,
                    retry_after,
                }
            } else {
                Response {
                    status: 200,
                    retry_after: None,
                }
            })
        })
        .await;
    (report, start.elapsed())
}

#[tokio::test(start_paused = true)]
async fn retry_after_delta_seconds_is_honoured() {
    let backoff = Backoff::new(10 * MS, SEC).with_jitter(Jitter::None);
    let retry = Retry::new(backoff).with_classifier(honour_retry_after(SystemTime::now()));
    let (report, waited) = busy_then_ok(&retry, Some("3")).await;
    assert_eq!(waited, 3 * SEC, "not the 10 ms backoff");
    assert_eq!(report.result.unwrap().status, 200);
    assert_eq!(report.attempts, 2);

    // Without the header, the backoff applies.
    let (_, waited) = busy_then_ok(&retry, None).await;
    assert_eq!(waited, 10 * MS);
}

#[tokio::test(start_paused = true)]
async fn retry_after_http_date_is_honoured_relative_to_now() {
    // The wall clock is supplied, so the test does not depend on when it runs.
    let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
    let backoff = Backoff::new(10 * MS, SEC).with_jitter(Jitter::None);
    let retry = Retry::new(backoff).with_classifier(honour_retry_after(now));
    let (report, waited) = busy_then_ok(&retry, Some("Wed, 21 Oct 2015 07:28:07 GMT")).await;
    assert_eq!(waited, 7 * SEC);
    assert_eq!(report.stop, Stop::Success);
}

#[tokio::test(start_paused = true)]
async fn the_longer_of_retry_after_and_the_backoff_wins() {
    let backoff = Backoff::new(5 * SEC, 5 * SEC).with_jitter(Jitter::None);
    let retry = Retry::new(backoff).with_classifier(honour_retry_after(SystemTime::now()));
    let (_, waited) = busy_then_ok(&retry, Some("1")).await;
    assert_eq!(waited, 5 * SEC);
}

#[tokio::test(start_paused = true)]
async fn garbage_retry_after_is_rejected_and_falls_back_to_the_backoff() {
    for garbage in ["soon", "-5", "1.5", "", "Wed, 21 Oct 2015 25:00:00 GMT"] {
        let err = RetryAfter::parse(garbage).unwrap_err();
        assert_eq!(err.value(), garbage);
        assert!(err.to_string().contains(&format!("`{garbage}`")), "{err}");
    }
    let backoff = Backoff::new(10 * MS, SEC).with_jitter(Jitter::None);
    let retry = Retry::new(backoff).with_classifier(honour_retry_after(SystemTime::now()));
    let (report, waited) = busy_then_ok(&retry, Some("next tuesday")).await;
    assert_eq!(waited, 10 * MS);
    assert_eq!(report.stop, Stop::Success);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_beyond_the_time_limit_gives_up_with_the_last_response() {
    let backoff = Backoff::new(10 * MS, SEC)
        .with_jitter(Jitter::None)
        .with_max_elapsed(10 * SEC);
    let retry = Retry::new(backoff).with_classifier(honour_retry_after(SystemTime::now()));
    let (report, waited) = busy_then_ok(&retry, Some("30")).await;
    assert_eq!(
        waited,
        Duration::ZERO,
        "did not wait for a retry it would not make"
    );
    assert_eq!(report.attempts, 1);
    assert_eq!(report.stop, Stop::RetryAfterBeyondDeadline);
    assert_eq!(
        report.result,
        Ok(Response {
            status: 503,
            retry_after: Some("30")
        }),
        "the last response, not an error of the retry layer"
    );

    // Within the limit it is honoured.
    let (report, waited) = busy_then_ok(&retry, Some("10")).await;
    assert_eq!((waited, report.stop), (10 * SEC, Stop::Success));
}

// === the budget ===

/// 100 calls to a service that always fails, each allowed 3 attempts; returns how many
/// retries were made in all.
async fn storm(retry: &Retry, concurrent: bool) -> u32 {
    let total = Arc::new(AtomicU32::new(0));
    let call = |retry: Retry| {
        let total = total.clone();
        async move {
            let report = retry
                .run_with_report(|_| async { Err::<(), _>("down") })
                .await;
            total.fetch_add(report.attempts - 1, Ordering::Relaxed);
        }
    };
    if concurrent {
        join_all((0..100).map(|_| call(retry.clone()))).await;
    } else {
        for _ in 0..100 {
            call(retry.clone()).await;
        }
    }
    total.load(Ordering::Relaxed)
}

fn storm_backoff() -> Backoff {
    Backoff::new(MS, MS)
        .with_jitter(Jitter::None)
        .with_max_attempts(attempts(3))
}

#[tokio::test(start_paused = true)]
async fn a_budget_stops_a_retry_storm() {
    // Without a budget: 2 retries for each of the 100 calls.
    assert_eq!(storm(&Retry::new(storm_backoff()), false).await, 200);

    // 20 % of 100 calls plus a floor of 1/s over 10 s: 20 + 10. The storm lasts well under
    // the 10 s window, so nothing expires, and the last call leaves less than one retry.
    let budget = RetryBudget::new(10 * SEC, 1, 0.2).unwrap();
    let retry = Retry::new(storm_backoff()).with_budget(budget.clone());
    assert_eq!(storm(&retry, false).await, 30);
    assert_eq!(budget.available(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_budget_is_shared_by_concurrent_callers() {
    let budget = RetryBudget::new(10 * SEC, 1, 0.2).unwrap();
    let retry = Retry::new(storm_backoff()).with_budget(budget);
    let retries = storm(&retry, true).await;
    // Deposits and withdrawals interleave across the 100 callers; they still add up to the
    // same 20 + 10, shared rather than per caller.
    assert_eq!(retries, 30);
}

#[tokio::test(start_paused = true)]
async fn budget_exhaustion_is_reported() {
    let budget = RetryBudget::new(10 * SEC, 0, 0.0).unwrap();
    let retry = Retry::new(storm_backoff()).with_budget(budget);
    let (report, gaps) = always_failing(&retry).await;
    assert_eq!((report.attempts, report.stop), (1, Stop::BudgetExhausted));
    assert!(gaps.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_budget_refills_as_the_window_moves() {
    let budget = RetryBudget::new(10 * SEC, 1, 0.0).unwrap();
    let retry = Retry::new(storm_backoff()).with_budget(budget.clone());
    assert_eq!(storm(&retry, false).await, 10, "the floor alone");
    assert_eq!(storm(&retry, false).await, 0, "spent");
    tokio::time::advance(10 * SEC).await;
    assert_eq!(budget.available(), 10, "the withdrawals expired");
}

// === cancel safety ===

#[tokio::test(start_paused = true)]
async fn dropping_the_run_stops_further_attempts() {
    let calls = Arc::new(AtomicU32::new(0));
    let backoff = Backoff::new(SEC, SEC)
        .with_jitter(Jitter::None)
        .with_max_attempts(attempts(10));
    let retry = Retry::new(backoff);
    let counted = calls.clone();
    let run = retry.run(move |_| {
        counted.fetch_add(1, Ordering::Relaxed);
        async { Err::<(), _>("down") }
    });
    // Cancelled during the second backoff sleep.
    let timed_out = tokio::time::timeout(1500 * MS, run).await;
    assert!(timed_out.is_err());
    assert_eq!(calls.load(Ordering::Relaxed), 2);
    tokio::time::sleep(60 * SEC).await;
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "nothing runs after the drop"
    );
}

// === metrics ===

/// One snapshot of every metric. Histograms are drained by a snapshot, so take only one.
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
    let found = metrics.iter().find(|(key, _)| {
        key.name() == name
            && labels
                .iter()
                .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
    });
    match found {
        Some((_, value)) => value,
        None => panic!("no metric {name} {labels:?}"),
    }
}

fn counter(metrics: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    match find(metrics, name, labels) {
        DebugValue::Counter(n) => *n,
        other => panic!("{name} {labels:?} is not a counter: {other:?}"),
    }
}

#[test]
fn metrics_count_retries_and_runs() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let retry = Retry::new(Backoff::new(MS, MS).with_max_attempts(attempts(3))).with_name("orders");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    // The handles are registered on the first run, which happens under the local recorder.
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            always_failing(&retry).await;
            retry.run(|_| async { Ok::<_, ()>(()) }).await.unwrap();
        })
    });
    let metrics = snapshot(&snapshotter);
    assert!(
        metrics.iter().all(|(key, _)| key
            .labels()
            .any(|l| l.key() == "retry" && l.value() == "orders")),
        "every series is labelled with the name, none with the unused default"
    );
    let retries = |outcome| {
        counter(
            &metrics,
            "sluice_retries_total",
            &[("retry", "orders"), ("outcome", outcome)],
        )
    };
    assert_eq!(retries("retried"), 2);
    assert_eq!(retries("attempts_exhausted"), 1);
    assert_eq!(retries("budget_exhausted"), 0);
    let runs = |outcome| {
        counter(
            &metrics,
            "sluice_retry_runs_total",
            &[("retry", "orders"), ("outcome", outcome)],
        )
    };
    assert_eq!(runs("attempts_exhausted"), 1);
    assert_eq!(runs("success"), 1);
    match find(
        &metrics,
        "sluice_retry_delay_seconds",
        &[("retry", "orders")],
    ) {
        DebugValue::Histogram(delays) => {
            assert_eq!(delays.len(), 2);
            assert!(delays.iter().all(|d| d.into_inner() <= 0.001));
        }
        other => panic!("not a histogram: {other:?}"),
    }
}

#[test]
fn the_public_types_can_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Retry>();
    send_sync::<RetryBudget>();
    send_sync::<Backoff>();
}
