//! The async crate's in-process benchmarks, each beside its peer in the same run:
//! `try_acquire` vs governor's `check()` (alone and with 2 threads on one limiter), a pool
//! slot vs a bare tokio `Semaphore` permit, and a keyed limiter over 1,000,000 keys vs
//! governor's keyed limiter.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use governor::{Quota as GQuota, RateLimiter};
use sluice::{Keyed, Limiter, Pool, QuantaClock};
use sluice_core::{Gcra, Quota, Rate};

/// A quota that admits every check of the bench: one token per nanosecond, a huge burst.
fn open_quota() -> Quota {
    Quota::new(1 << 40, Rate::from_interval_ns(1).unwrap()).unwrap()
}

fn open_governor_quota() -> GQuota {
    GQuota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX)
}

fn uncontended(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire/uncontended");
    let governor = RateLimiter::direct(open_governor_quota());
    g.bench_function("governor check()", |b| {
        b.iter(|| black_box(governor.check()).is_ok())
    });
    let sluice = Limiter::builder(Gcra::new(open_quota()))
        .clock(QuantaClock::new())
        .build();
    g.bench_function("sluice try_acquire (gcra, quanta clock)", |b| {
        b.iter(|| black_box(sluice.try_acquire(1)).is_ok())
    });
    let tokio_clock = Limiter::new(Gcra::new(open_quota()));
    g.bench_function("sluice try_acquire (gcra, tokio clock)", |b| {
        b.iter(|| black_box(tokio_clock.try_acquire(1)).is_ok())
    });
    // What any such check must do: read the clock (quanta's counter, scaled to nanoseconds)
    // and swap a new state in. Both limiters above do this and little else.
    let clock = quanta::Clock::new();
    let state = AtomicU64::new(0);
    g.bench_function("floor: quanta read + one compare_exchange", |b| {
        b.iter(|| {
            let now = clock.delta_as_nanos(0, clock.raw());
            let current = state.load(Ordering::Acquire);
            black_box(
                state
                    .compare_exchange(
                        current,
                        current.max(now) + 1,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_ok(),
            )
        })
    });
    // The clock read alone, with nothing after it: on this machine the counter read's own
    // throughput is what bounds both limiters above, whatever follows it.
    g.bench_function("clock: one quanta counter read", |b| {
        b.iter(|| black_box(clock.raw()))
    });
    g.finish();
}

/// Runs `op` `iters` times on each of two threads at once; reports the wall time divided by
/// two, i.e. the time per check of the pair's combined throughput.
fn two_threads(iters: u64, op: &(dyn Fn() + Sync)) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                barrier.wait();
                for _ in 0..iters {
                    op();
                }
                barrier.wait();
            });
        }
        barrier.wait();
        let start = Instant::now();
        barrier.wait();
        start.elapsed() / 2
    })
}

fn contended(c: &mut Criterion) {
    let mut g = c.benchmark_group("try_acquire/2 threads, one limiter");
    let governor = RateLimiter::direct(open_governor_quota());
    g.bench_function("governor check()", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(governor.check()).ok();
            })
        })
    });
    let sluice = Limiter::builder(Gcra::new(open_quota()))
        .clock(QuantaClock::new())
        .build();
    g.bench_function("sluice try_acquire (gcra, quanta clock)", |b| {
        b.iter_custom(|iters| {
            two_threads(iters, &|| {
                black_box(sluice.try_acquire(1)).ok();
            })
        })
    });
    g.finish();
}

fn pool(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("pool/acquire+release");
    let semaphore = tokio::sync::Semaphore::new(8);
    g.bench_function("tokio Semaphore acquire+drop", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(black_box(semaphore.acquire().await.unwrap())) })
    });
    let pool = Pool::with_size(8).unwrap();
    g.bench_function("sluice Pool acquire+drop", |b| {
        b.to_async(&rt)
            .iter(|| async { drop(black_box(pool.acquire().await.unwrap())) })
    });
    g.finish();
}

const KEYS: u64 = 1_000_000;

/// A cheap generator of keys spread over the whole key space.
struct Keys(u64);

impl Keys {
    #[inline]
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % KEYS
    }
}

fn keyed(c: &mut Criterion) {
    let mut g = c.benchmark_group("keyed/1M u64 keys, one check");
    let governor = RateLimiter::keyed(open_governor_quota());
    for k in 0..KEYS {
        governor.check_key(&k).ok();
    }
    let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
    g.bench_function("governor keyed check_key()", |b| {
        b.iter(|| black_box(governor.check_key(&keys.next())).is_ok())
    });
    drop(governor);
    let sluice: Keyed<u64, Gcra, QuantaClock> = Keyed::builder(Gcra::new(open_quota()))
        .max_keys(KEYS as usize)
        .clock(QuantaClock::new())
        .build();
    for k in 0..KEYS {
        sluice.try_acquire(&k, 1).ok();
    }
    let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
    g.bench_function("sluice Keyed try_acquire()", |b| {
        b.iter(|| black_box(sluice.try_acquire(&keys.next(), 1)).is_ok())
    });
    g.finish();
}

criterion_group!(benches, uncontended, contended, pool, keyed);
criterion_main!(benches);
