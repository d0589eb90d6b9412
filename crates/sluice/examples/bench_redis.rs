//! The sluice side of scripts/bench-redis.sh: decisions per second of a `RedisStore` with 50
//! concurrent callers on one tokio thread, against the Redis at `--port`.
//!
//! ```text
//! cargo run --release -p sluice --example bench_redis -- --port 6379 --scenario random|hot
//!     [--concurrency 50] [--seconds 5] [--warmup 1] [--threads 1]
//! ```
//!
//! Prints one JSON line, as scripts/bench-redis-flexible.mjs does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use sluice::store::{OnError, RedisConfig, RedisStore, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut port = String::from("6379");
    let mut scenario = String::from("random");
    let (mut concurrency, mut seconds, mut warmup, mut threads) = (50usize, 5.0f64, 1.0f64, 1usize);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--port" => port = value,
            "--scenario" => scenario = value,
            "--concurrency" => concurrency = value.parse()?,
            "--seconds" => seconds = value.parse()?,
            "--warmup" => warmup = value.parse()?,
            "--threads" => threads = value.parse()?,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    let runtime = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    runtime.block_on(async move {
        let hot = scenario == "hot";
        // random: every key new, every decision allowed. hot: one key, 10 per minute, denied
        // after 10 (the same quotas as the rate-limiter-flexible side).
        let quota = if hot {
            Quota::parse(10, "10/min")?
        } else {
            Quota::parse(1000, "1000/s")?
        };
        let config = RedisConfig::new(format!("redis://127.0.0.1:{port}"))
            .prefix(format!("sluice-{scenario}-{}", std::process::id()))
            .on_error(OnError::Deny)
            // Measures throughput, not the failure policy: a loaded machine must not turn a
            // slow answer into a fallback.
            .timeout(Duration::from_secs(2));
        let store = RedisStore::connect(AnyAlgorithm::new(Kind::Gcra, quota), config).await?;
        let counting = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let allowed = Arc::new(AtomicU64::new(0));
        let denied = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(AtomicU64::new(0));
        let mut callers = Vec::new();
        for i in 0..concurrency {
            let (store, counting, stop) = (store.clone(), counting.clone(), stop.clone());
            let (allowed, denied, errors) = (allowed.clone(), denied.clone(), errors.clone());
            callers.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64);
                let mut key = String::with_capacity(16);
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    key.clear();
                    if hot {
                        key.push_str("hot");
                    } else {
                        use std::fmt::Write;
                        let _ = write!(key, "k{}", rng.random_range(0..1_000_000_000u64));
                    }
                    let result = store.check(&key, 1).await;
                    let counter = match result {
                        Ok(_) => &allowed,
                        Err(Error::Limited { .. }) => &denied,
                        Err(_) => &errors,
                    };
                    if counting.load(Ordering::Relaxed) {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    // A cached denial never waits: let the other callers run now and then.
                    n = n.wrapping_add(1);
                    if n.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs_f64(warmup)).await;
        counting.store(true, Ordering::Relaxed);
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
        counting.store(false, Ordering::Relaxed);
        let elapsed = start.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        for caller in callers {
            caller.await?;
        }
        let (a, d, e) = (
            allowed.load(Ordering::Relaxed),
            denied.load(Ordering::Relaxed),
            errors.load(Ordering::Relaxed),
        );
        println!(
            "{{\"impl\":\"sluice RedisStore\",\"scenario\":\"{scenario}\",\"concurrency\":{concurrency},\"seconds\":{elapsed:.3},\"decisions\":{},\"allowed\":{a},\"denied\":{d},\"errors\":{e},\"per_sec\":{}}}",
            a + d,
            ((a + d) as f64 / elapsed).round() as u64
        );
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
