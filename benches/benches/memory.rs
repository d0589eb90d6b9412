//! Memory and timer figures that criterion does not measure, printed as Markdown rows:
//! bytes per key of a keyed limiter holding 1,000,000 `u64` keys (beside governor's keyed
//! limiter), bytes per queued waiter with 100,000 waiters, and wake-up lateness (actual minus
//! scheduled release) of 100,000 waiters released one every 50 µs after a gate waiter.
//!
//! Run: `cargo bench -p sluice-benches --bench memory`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::task::{Context, Waker};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use governor::{Quota as GQuota, RateLimiter};
use sluice::{Keyed, Limiter};
use sluice_core::{Gcra, Quota, Rate};

/// Counts the bytes currently allocated.
struct Counting;

static ALLOCATED: AtomicIsize = AtomicIsize::new(0);

// Safety: every method forwards to `System` with the caller's arguments unchanged and only
// adds bookkeeping, so `System`'s guarantees carry over.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // Safety: forwarded from the caller.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        ALLOCATED.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // Safety: forwarded from the caller.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // Safety: forwarded from the caller.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocated() -> isize {
    ALLOCATED.load(Ordering::Relaxed)
}

const KEYS: u64 = 1_000_000;

fn keyed_bytes() {
    let quota = GQuota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX);
    let before = allocated();
    let governor = RateLimiter::keyed(quota);
    for k in 0..KEYS {
        governor.check_key(&k).ok();
    }
    let governor_bytes = (allocated() - before) as f64 / KEYS as f64;
    assert_eq!(governor.len(), KEYS as usize);
    drop(governor);

    let open = Quota::new(1 << 40, Rate::from_interval_ns(1).unwrap()).unwrap();
    let before = allocated();
    let sluice: Keyed<u64, Gcra> = Keyed::builder(Gcra::new(open))
        .max_keys(KEYS as usize)
        .build();
    for k in 0..KEYS {
        sluice.try_acquire(&k, 1).ok();
    }
    let sluice_bytes = (allocated() - before) as f64 / KEYS as f64;
    assert_eq!(sluice.len(), KEYS as usize);
    println!("| keyed limiter, 1,000,000 u64 keys: bytes per key | {sluice_bytes:.1} | governor: {governor_bytes:.1} | ratio {:.2} |", sluice_bytes / governor_bytes);
}

const WAITERS: usize = 100_000;

fn waiter_bytes(rt: &tokio::runtime::Runtime) {
    let _guard = rt.enter();
    let limiter = Limiter::builder(Gcra::new(Quota::parse(1, "1/s").unwrap()))
        .queue(WAITERS, Duration::from_secs(1 << 30))
        .build();
    limiter.try_acquire(1).unwrap();
    let before = allocated();
    let mut waiters: Vec<Pin<Box<_>>> = Vec::with_capacity(WAITERS);
    let vec_bytes = allocated() - before;
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..WAITERS {
        let mut fut = Box::pin(limiter.acquire(1));
        assert!(fut.as_mut().poll(&mut cx).is_pending());
        waiters.push(fut);
    }
    assert_eq!(limiter.queued(), WAITERS);
    let per_waiter = (allocated() - before - vec_bytes) as f64 / WAITERS as f64;
    println!("| 100,000 queued waiters: bytes per waiter (queue + boxed future) | {per_waiter:.1} | target <= 256 | |");
    drop(waiters);
    assert_eq!(limiter.queued(), 0);
    black_box(limiter);
}

fn lateness(rt: &tokio::runtime::Runtime) {
    const INTERVAL: Duration = Duration::from_micros(50);
    const GATE: u64 = 20_000; // one second of tokens
    rt.block_on(async {
        let quota = Quota::new(GATE, Rate::from_interval_ns(50_000).unwrap()).unwrap();
        let limiter = Limiter::builder(Gcra::new(quota))
            .queue(WAITERS + 1, Duration::from_secs(3600))
            .build();
        let start = tokio::time::Instant::now();
        limiter.try_acquire(GATE).unwrap();
        // A first waiter for a full bucket holds the line for one second, time enough to
        // queue everyone behind it; then one waiter is due every 50 us after the gate's
        // admission. The gate is admitted when its timer fires, at or after the one-second
        // mark, and the bucket counts from that instant (a late timer never backdates an
        // admission), so that instant is where the waiters' schedule starts.
        let gate = async {
            let decision = limiter.acquire(GATE).await;
            (decision, tokio::time::Instant::now())
        };
        let mut waiting = FuturesUnordered::new();
        for k in 0..WAITERS {
            let limiter = &limiter;
            waiting.push(async move {
                limiter.acquire(1).await.unwrap();
                (k, tokio::time::Instant::now())
            });
        }
        let ((gate_result, gate_at), admitted) = tokio::join!(gate, async {
            let mut admitted = Vec::with_capacity(WAITERS);
            while let Some(done) = waiting.next().await {
                admitted.push(done);
            }
            admitted
        });
        gate_result.unwrap();
        let late_by = |origin: tokio::time::Instant| {
            let mut late: Vec<Duration> = admitted
                .iter()
                .map(|&(k, at)| at.saturating_duration_since(origin + INTERVAL * (k as u32 + 1)))
                .collect();
            late.sort();
            let p = |q: f64| late[((late.len() as f64 * q) as usize).min(late.len() - 1)];
            (p(0.5), p(0.99), late[late.len() - 1])
        };
        let (p50, p99, max) = late_by(gate_at);
        println!(
            "| wake-up lateness, 100,000 waiters, one due every 50 us after the gate: p50 / p99 / max | {p50:?} / {p99:?} / {max:?} | target p99 < 2 ms | |"
        );
        let (p50, p99, max) = late_by(start + Duration::from_secs(1));
        println!(
            "| the same against a gate admitted exactly at 1 s (adds the gate's own lateness, {:?}): p50 / p99 / max | {p50:?} / {p99:?} / {max:?} | | |",
            gate_at.saturating_duration_since(start + Duration::from_secs(1))
        );
    });
}

fn main() {
    // `cargo bench` passes `--bench`; anything else (e.g. a filter) is ignored.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("| figure | sluice | peer / target | ratio |");
    println!("|---|---|---|---|");
    keyed_bytes();
    waiter_bytes(&rt);
    lateness(&rt);
}
