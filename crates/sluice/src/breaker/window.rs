//! The sliding windows of recent calls: the last N calls, or the calls of the last T.
//!
//! Pure data: the caller passes the time in, so the windows know nothing of clocks.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::config::Window;

/// How many buckets a time window is cut into.
const BUCKETS: usize = 10;

/// The largest ring a count window allocates up front; larger windows grow as calls come.
const MAX_PREALLOCATED: usize = 1024;

/// The counts of a breaker's window at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Calls recorded (cancelled calls are not).
    pub calls: u64,
    /// Of those, calls that failed.
    pub failures: u64,
    /// Of those, calls at least as long as the slow-call threshold, failed or not.
    pub slow_calls: u64,
}

/// How one call went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) failed: bool,
    pub(crate) slow: bool,
}

/// A window of either kind.
#[derive(Debug)]
pub(crate) enum CallWindow {
    Count(CountWindow),
    Time(TimeWindow),
}

/// The last `size` calls, oldest first, with running totals.
#[derive(Debug)]
pub(crate) struct CountWindow {
    calls: VecDeque<Call>,
    size: usize,
    stats: WindowStats,
}

/// The calls of the last `BUCKETS × bucket` time, in buckets.
#[derive(Debug)]
pub(crate) struct TimeWindow {
    /// Boxed to keep [`CallWindow`] small whichever kind it is.
    buckets: Box<[WindowStats; BUCKETS]>,
    current: usize,
    /// When the current bucket began.
    since: Instant,
    bucket: Duration,
}

// === impl WindowStats ===

impl WindowStats {
    /// The share of calls that failed, 0 with no calls.
    pub fn failure_rate(&self) -> f64 {
        ratio(self.failures, self.calls)
    }

    /// The share of calls that were slow, 0 with no calls.
    pub fn slow_call_rate(&self) -> f64 {
        ratio(self.slow_calls, self.calls)
    }

    fn add(&mut self, call: Call) {
        self.calls += 1;
        self.failures += u64::from(call.failed);
        self.slow_calls += u64::from(call.slow);
    }

    fn remove(&mut self, call: Call) {
        self.calls -= 1;
        self.failures -= u64::from(call.failed);
        self.slow_calls -= u64::from(call.slow);
    }

    fn merge(mut self, other: &WindowStats) -> WindowStats {
        self.calls += other.calls;
        self.failures += other.failures;
        self.slow_calls += other.slow_calls;
        self
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

// === impl CallWindow ===

impl CallWindow {
    pub(crate) fn new(window: Window, now: Instant) -> CallWindow {
        match window {
            Window::Count(size) => {
                let size = usize::try_from(size.get()).unwrap_or(usize::MAX);
                CallWindow::Count(CountWindow {
                    calls: VecDeque::with_capacity(size.min(MAX_PREALLOCATED)),
                    size,
                    stats: WindowStats::default(),
                })
            }
            Window::Time(period) => CallWindow::Time(TimeWindow {
                buckets: Box::new([WindowStats::default(); BUCKETS]),
                current: 0,
                since: now,
                // Nonzero periods below 10 ns make 0-long buckets; one nanosecond is as fine a
                // grain as the clock has.
                bucket: (period / BUCKETS as u32).max(Duration::from_nanos(1)),
            }),
        }
    }

    pub(crate) fn record(&mut self, now: Instant, call: Call) {
        match self {
            CallWindow::Count(window) => {
                if window.calls.len() == window.size {
                    if let Some(oldest) = window.calls.pop_front() {
                        window.stats.remove(oldest);
                    }
                }
                window.calls.push_back(call);
                window.stats.add(call);
            }
            CallWindow::Time(window) => {
                window.roll(now);
                window.buckets[window.current].add(call);
            }
        }
    }

    pub(crate) fn stats(&mut self, now: Instant) -> WindowStats {
        match self {
            CallWindow::Count(window) => window.stats,
            CallWindow::Time(window) => {
                window.roll(now);
                window
                    .buckets
                    .iter()
                    .fold(WindowStats::default(), WindowStats::merge)
            }
        }
    }

    /// Forgets every call, as after a state change.
    pub(crate) fn clear(&mut self, now: Instant) {
        match self {
            CallWindow::Count(window) => {
                window.calls.clear();
                window.stats = WindowStats::default();
            }
            CallWindow::Time(window) => {
                *window.buckets = [WindowStats::default(); BUCKETS];
                window.current = 0;
                window.since = now;
            }
        }
    }
}

// === impl TimeWindow ===

impl TimeWindow {
    /// Empties the buckets whose time has passed and makes the bucket of `now` current.
    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.since);
        let steps = elapsed.as_nanos() / self.bucket.as_nanos();
        if steps == 0 {
            return;
        }
        for _ in 0..steps.min(BUCKETS as u128) {
            self.current = (self.current + 1) % BUCKETS;
            self.buckets[self.current] = WindowStats::default();
        }
        // Stay on the grid of bucket boundaries; after a long gap, start a new grid at `now`.
        let step = u32::try_from(steps)
            .ok()
            .and_then(|steps| self.bucket.checked_mul(steps));
        self.since = step
            .and_then(|step| self.since.checked_add(step))
            .unwrap_or(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    const OK: Call = Call {
        failed: false,
        slow: false,
    };
    const FAIL: Call = Call {
        failed: true,
        slow: false,
    };
    const SLOW: Call = Call {
        failed: false,
        slow: true,
    };

    fn stats(calls: u64, failures: u64, slow_calls: u64) -> WindowStats {
        WindowStats {
            calls,
            failures,
            slow_calls,
        }
    }

    #[test]
    fn count_window_keeps_the_last_n() {
        let now = Instant::now();
        let mut w = CallWindow::new(Window::Count(NonZeroU32::new(3).unwrap()), now);
        w.record(now, FAIL);
        w.record(now, SLOW);
        w.record(now, OK);
        assert_eq!(w.stats(now), stats(3, 1, 1));
        w.record(now, OK); // pushes out the failure
        assert_eq!(w.stats(now), stats(3, 0, 1));
        w.record(now, OK); // pushes out the slow call
        assert_eq!(w.stats(now), stats(3, 0, 0));
        // Time does not age a count window.
        let later = now + Duration::from_secs(3600);
        assert_eq!(w.stats(later), stats(3, 0, 0));
        w.clear(later);
        assert_eq!(w.stats(later), WindowStats::default());
    }

    #[test]
    fn time_window_ages_calls_out_by_buckets() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = CallWindow::new(Window::Time(Duration::from_secs(1)), t0);
        w.record(t0, FAIL);
        w.record(t0 + ms(500), OK);
        assert_eq!(w.stats(t0 + ms(899)), stats(2, 1, 0));
        // The failure's bucket, [0, 100 ms), leaves the window at 1 s.
        assert_eq!(w.stats(t0 + ms(999)), stats(2, 1, 0));
        assert_eq!(w.stats(t0 + ms(1000)), stats(1, 0, 0));
        assert_eq!(w.stats(t0 + ms(1500)), stats(0, 0, 0));
    }

    #[test]
    fn time_window_survives_long_gaps() {
        let t0 = Instant::now();
        let mut w = CallWindow::new(Window::Time(Duration::from_secs(1)), t0);
        w.record(t0, FAIL);
        let later = t0 + Duration::from_secs(86_400 * 365);
        assert_eq!(w.stats(later), WindowStats::default());
        w.record(later, OK);
        assert_eq!(w.stats(later), stats(1, 0, 0));
    }

    #[test]
    fn rates() {
        assert_eq!(WindowStats::default().failure_rate(), 0.0);
        assert_eq!(stats(4, 1, 3).failure_rate(), 0.25);
        assert_eq!(stats(4, 1, 3).slow_call_rate(), 0.75);
    }
}
