//! sluice-core: the cost of one allowed check.
//!
//! One criterion group, so every row is measured in the same run on the same machine:
//!
//! - each of the six sluice algorithms on a caller-supplied time (a counter, no clock read);
//! - governor's direct limiter, `RateLimiter::direct(..).check()`, with its default clock
//!   (quanta);
//! - sluice's token bucket and GCRA with a clock read of the same kind, then the check, in two
//!   forms: `quanta::Clock::now()` converted to `u64` nanoseconds since a start instant (through
//!   `Duration`), and `Clock::delta_as_nanos(start, Clock::raw())`, which is exactly the read
//!   governor's default clock makes (`QuantaClock::now`).
//!
//! Every check must be allowed (the quotas are far above the request rate); every row runs in
//! the same timed loop, which counts denials and fails the bench if there is any.
//!
//! Run: `cargo bench -p sluice-benches --bench core -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, Bencher, BenchmarkGroup, Criterion};
use sluice_core::{
    Algorithm, FixedWindow, Gcra, LeakyBucket, Quota, Rate, SlidingLog, SlidingWindow, TokenBucket,
};

/// Nanoseconds the fake clock advances per check: half the refill rate of the quotas below.
const STEP_NS: u64 = 2;

/// A million tokens, one per nanosecond: at one check per `STEP_NS` every check is allowed, and
/// the window algorithms roll their one-millisecond window once every 500,000 checks.
fn roomy() -> Quota {
    Quota::new(1_000_000, Rate::from_interval_ns(1).unwrap()).unwrap()
}

/// The sliding log keeps one entry per admission in its window, so its window is short:
/// 1,024 ns, which holds 512 entries at one check per `STEP_NS` (each check expires one).
fn log_quota() -> Quota {
    Quota::new(1_024, Rate::from_interval_ns(1).unwrap()).unwrap()
}

/// Times `iters` calls of `step`, which makes one check and says whether it was allowed.
///
/// Every row goes through this loop, so the harness costs the same everywhere: the denial
/// count is a local, checked after the timed loop (a denial fails the bench). Each step hands
/// its result to `black_box` by reference, so that it is computed but not copied.
fn allowed_loop(b: &mut Bencher<'_>, name: &str, mut step: impl FnMut() -> bool) {
    b.iter_custom(|iters| {
        let mut denied = 0u64;
        let start = Instant::now();
        for _ in 0..iters {
            denied += u64::from(!step());
        }
        let elapsed = start.elapsed();
        assert_eq!(denied, 0, "{name}: some checks were denied");
        elapsed
    });
}

/// One allowed check per iteration on a fake clock.
fn fake_clock<A: Algorithm>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, alg: A) {
    let mut state = alg.initial_state();
    let mut now = 0u64;
    group.bench_function(name, |b| {
        allowed_loop(b, name, || {
            now += STEP_NS;
            let d = alg.check(black_box(&mut state), black_box(now), black_box(1));
            let d = d.unwrap();
            black_box(&d);
            d.allowed
        })
    });
}

/// One allowed check per iteration, reading `quanta::Clock::now()` first and converting it to
/// nanoseconds since the start.
fn quanta_now<A: Algorithm>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, alg: A) {
    let clock = quanta::Clock::new();
    let start = clock.now();
    let mut state = alg.initial_state();
    group.bench_function(name, |b| {
        allowed_loop(b, name, || {
            let now = clock.now().saturating_duration_since(start).as_nanos() as u64;
            let d = alg.check(black_box(&mut state), now, black_box(1));
            let d = d.unwrap();
            black_box(&d);
            d.allowed
        })
    });
}

/// One allowed check per iteration, reading the clock as governor's `QuantaClock` does: the raw
/// counter, scaled to nanoseconds since the start by `delta_as_nanos`.
fn quanta_raw<A: Algorithm>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, alg: A) {
    let clock = quanta::Clock::new();
    let start = clock.raw();
    let mut state = alg.initial_state();
    group.bench_function(name, |b| {
        allowed_loop(b, name, || {
            let now = clock.delta_as_nanos(start, clock.raw());
            let d = alg.check(black_box(&mut state), now, black_box(1));
            let d = d.unwrap();
            black_box(&d);
            d.allowed
        })
    });
}

fn one_allowed_check(c: &mut Criterion) {
    let mut group = c.benchmark_group("one allowed check");

    fake_clock(&mut group, "token_bucket", TokenBucket::new(roomy()));
    fake_clock(&mut group, "gcra", Gcra::new(roomy()));
    fake_clock(&mut group, "leaky_bucket", LeakyBucket::new(roomy()));
    fake_clock(&mut group, "sliding_log", SlidingLog::new(log_quota()));
    fake_clock(&mut group, "sliding_window", SlidingWindow::new(roomy()));
    fake_clock(&mut group, "fixed_window", FixedWindow::new(roomy()));

    // A billion cells per second, burst a billion: no check in this loop can be refused.
    let per_second = NonZeroU32::new(1_000_000_000).unwrap();
    let limiter = governor::RateLimiter::direct(governor::Quota::per_second(per_second));
    let name = "governor direct (quanta clock)";
    group.bench_function(name, |b| {
        allowed_loop(b, name, || {
            let r = black_box(&limiter).check();
            black_box(&r);
            r.is_ok()
        })
    });

    quanta_now(
        &mut group,
        "token_bucket + quanta now()",
        TokenBucket::new(roomy()),
    );
    quanta_now(&mut group, "gcra + quanta now()", Gcra::new(roomy()));
    quanta_raw(
        &mut group,
        "token_bucket + quanta raw()",
        TokenBucket::new(roomy()),
    );
    quanta_raw(&mut group, "gcra + quanta raw()", Gcra::new(roomy()));

    group.finish();
}

criterion_group!(benches, one_allowed_check);
criterion_main!(benches);
