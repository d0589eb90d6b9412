//! Clocks: where a limiter's monotonic nanoseconds come from.
//!
//! The default, [`TokioClock`], reads `tokio::time::Instant`, so tests can pause and advance
//! time. [`QuantaClock`] reads the CPU's time-stamp counter through `quanta`, as governor does,
//! and is cheaper: on the benchmark machine an uncontended `try_acquire` costs 38.3 ns with
//! tokio's clock and about 9 to 10 ns with quanta's (BENCHMARKS-history.md, section
//! "2026-11-30 03:55-04:06 UTC, commit 293e77c against 445c301, then b398699"). It does not
//! follow tokio's paused time.

use std::sync::Arc;

/// A monotonic clock in nanoseconds since some origin of the clock's choosing.
pub trait Clock: Send + Sync + 'static {
    /// Nanoseconds since this clock's origin. Never decreases.
    fn now_ns(&self) -> u64;

    /// When the tokio timer should fire for the moment `at_ns` of this clock.
    fn deadline(&self, at_ns: u64) -> tokio::time::Instant;
}

/// `tokio::time::Instant`, relative to the moment the clock was made. Follows
/// `tokio::time::pause()` and `advance()`.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is now.
    pub fn new() -> TokioClock {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> TokioClock {
        TokioClock::new()
    }
}

impl Clock for TokioClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.origin);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    fn deadline(&self, at_ns: u64) -> tokio::time::Instant {
        self.origin + std::time::Duration::from_nanos(at_ns)
    }
}

/// A hand-driven clock for tests and simulations.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: Arc<std::sync::atomic::AtomicU64>,
}

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.now.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets the clock to `ns` (tests may move it backwards on purpose).
    pub fn set(&self, ns: u64) {
        self.now.store(ns, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn deadline(&self, at_ns: u64) -> tokio::time::Instant {
        let now = self.now_ns();
        tokio::time::Instant::now() + std::time::Duration::from_nanos(at_ns.saturating_sub(now))
    }
}

/// The CPU's time-stamp counter through `quanta`, the clock governor uses by default. Cheaper
/// than tokio's (see the module docs); it does not follow `tokio::time::pause()`.
#[cfg(feature = "quanta")]
#[derive(Debug, Clone)]
pub struct QuantaClock {
    clock: quanta::Clock,
    origin_raw: u64,
    tokio_origin: tokio::time::Instant,
}

#[cfg(feature = "quanta")]
impl QuantaClock {
    /// A clock whose origin is now.
    pub fn new() -> QuantaClock {
        let clock = quanta::Clock::new();
        QuantaClock {
            origin_raw: clock.raw(),
            clock,
            tokio_origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "quanta")]
impl Default for QuantaClock {
    fn default() -> QuantaClock {
        QuantaClock::new()
    }
}

#[cfg(feature = "quanta")]
impl Clock for QuantaClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        // A raw counter read scaled to nanoseconds: no `Duration` round trip.
        self.clock.delta_as_nanos(self.origin_raw, self.clock.raw())
    }

    fn deadline(&self, at_ns: u64) -> tokio::time::Instant {
        self.tokio_origin + std::time::Duration::from_nanos(at_ns)
    }
}
