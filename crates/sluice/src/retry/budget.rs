//! The retry budget: retries allowed as a fraction of recent requests, so that retrying cannot
//! multiply the load on a struggling service.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How many generations a window is cut into; a deposit or withdrawal expires between
/// `ttl × (GENERATIONS - 1) / GENERATIONS` and `ttl` after it was made.
const GENERATIONS: usize = 10;

/// One retry, in the budget's fixed-point unit (millionths of a retry).
const UNIT: i64 = 1_000_000;

/// A budget for retries shared by the clients of one service, after Finagle's `RetryBudget`
/// and linkerd's retry budgets.
///
/// Every original request [deposits](RetryBudget::deposit) `ratio` of a retry; every retry
/// [withdraws](RetryBudget::try_withdraw) one. Deposits and withdrawals count for a window of
/// `ttl`, after which they expire. On top of that a floor of `min_per_sec × ttl` retries per
/// window is always allowed, so that a client with little traffic can still retry.
///
/// Over any window of `ttl`, the retries are thus at most `ratio × requests + min_per_sec × ttl`:
/// with a ratio of 0.2, a storm of failures adds at most 20 % to the load, plus the floor.
///
/// Time is read from `tokio::time::Instant`, so `tokio::time::pause()` drives it in tests.
/// Clones share one budget.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::retry::RetryBudget;
///
/// // 20 % extra load, no floor.
/// let budget = RetryBudget::new(Duration::from_secs(10), 0, 0.2)?;
/// for _ in 0..10 {
///     budget.deposit();
/// }
/// assert!(budget.try_withdraw()); // 10 requests × 0.2 = 2 retries
/// assert!(budget.try_withdraw());
/// assert!(!budget.try_withdraw());
/// # Ok::<(), sluice::retry::InvalidBudget>(())
/// ```
#[derive(Clone)]
pub struct RetryBudget {
    shared: Arc<Shared>,
}

/// A retry budget could not be built from the given values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidBudget {
    /// The window was zero: deposits would expire as soon as they were made.
    #[error("retry budget window (ttl) must be longer than zero")]
    ZeroTtl,
    /// The ratio was negative, above 1000, or not a number.
    #[error("retry ratio must be a number from 0 to 1000, got {ratio}")]
    RatioOutOfRange {
        /// The rejected ratio.
        ratio: f64,
    },
}

struct Shared {
    /// Added per original request, in `UNIT`s.
    deposit: i64,
    /// Always available, in `UNIT`s.
    reserve: i64,
    ttl: Duration,
    generation_ns: u64,
    window: Mutex<Window>,
}

/// A ring of generations, each holding the net deposits made while it was current.
struct Window {
    slots: [i64; GENERATIONS],
    current: usize,
    /// When the current generation began.
    since: Instant,
}

// === impl RetryBudget ===

impl RetryBudget {
    /// A budget over a window of `ttl` allowing `ratio` retries per request (0.2 is 20 %),
    /// and at least `min_per_sec` retries per second whatever the traffic.
    ///
    /// # Errors
    ///
    /// [`InvalidBudget::ZeroTtl`] for a zero window; [`InvalidBudget::RatioOutOfRange`] for a
    /// ratio that is negative, above 1000 or NaN.
    pub fn new(ttl: Duration, min_per_sec: u32, ratio: f64) -> Result<RetryBudget, InvalidBudget> {
        if ttl.is_zero() {
            return Err(InvalidBudget::ZeroTtl);
        }
        if !(0.0..=1000.0).contains(&ratio) {
            return Err(InvalidBudget::RatioOutOfRange { ratio });
        }
        // Both products are finite and non-negative; `as` saturates at i64::MAX.
        let deposit = (ratio * UNIT as f64).round() as i64;
        let reserve = (f64::from(min_per_sec) * ttl.as_secs_f64() * UNIT as f64) as i64;
        let ttl_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        let generation_ns = (ttl_ns / GENERATIONS as u64).max(1);
        Ok(RetryBudget {
            shared: Arc::new(Shared {
                deposit,
                reserve,
                ttl,
                generation_ns,
                window: Mutex::new(Window {
                    slots: [0; GENERATIONS],
                    current: 0,
                    since: Instant::now(),
                }),
            }),
        })
    }

    /// Records an original request (not a retry), adding `ratio` of a retry to the budget.
    pub fn deposit(&self) {
        let mut window = self.shared.window.lock();
        let slot = self.shared.roll(&mut window);
        *slot = slot.saturating_add(self.shared.deposit);
    }

    /// Takes one retry from the budget if there is one; `false` means do not retry.
    pub fn try_withdraw(&self) -> bool {
        let mut window = self.shared.window.lock();
        self.shared.roll(&mut window);
        if self.shared.balance(&window) < UNIT {
            return false;
        }
        let current = window.current;
        window.slots[current] = window.slots[current].saturating_sub(UNIT);
        true
    }

    /// How many whole retries could be withdrawn now.
    pub fn available(&self) -> u64 {
        let mut window = self.shared.window.lock();
        self.shared.roll(&mut window);
        u64::try_from(self.shared.balance(&window) / UNIT).unwrap_or(0)
    }

    /// The window over which deposits and withdrawals count.
    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }
}

impl fmt::Debug for RetryBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryBudget")
            .field("ttl", &self.shared.ttl)
            .field("ratio", &(self.shared.deposit as f64 / UNIT as f64))
            .field("reserve", &(self.shared.reserve as f64 / UNIT as f64))
            .field("available", &self.available())
            .finish()
    }
}

// === impl Shared ===

impl Shared {
    /// Expires the generations that have ended and returns the current one.
    fn roll<'w>(&self, window: &'w mut Window) -> &'w mut i64 {
        let now = Instant::now();
        let elapsed = u64::try_from(now.saturating_duration_since(window.since).as_nanos())
            .unwrap_or(u64::MAX);
        let steps = elapsed / self.generation_ns;
        if steps > 0 {
            for _ in 0..steps.min(GENERATIONS as u64) {
                window.current = (window.current + 1) % GENERATIONS;
                window.slots[window.current] = 0;
            }
            // Keep generation boundaries on the original grid.
            let advanced = Duration::from_nanos(steps.saturating_mul(self.generation_ns));
            window.since = window.since.checked_add(advanced).unwrap_or(now);
        }
        &mut window.slots[window.current]
    }

    fn balance(&self, window: &Window) -> i64 {
        window
            .slots
            .iter()
            .fold(self.reserve, |sum, slot| sum.saturating_add(*slot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_configs_are_errors() {
        assert_eq!(
            RetryBudget::new(Duration::ZERO, 1, 0.2).unwrap_err(),
            InvalidBudget::ZeroTtl
        );
        for ratio in [-0.1, 1000.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                RetryBudget::new(Duration::from_secs(1), 1, ratio),
                Err(InvalidBudget::RatioOutOfRange { .. })
            ));
        }
        assert!(RetryBudget::new(Duration::from_nanos(1), u32::MAX, 1000.0).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn the_floor_is_min_per_sec_times_ttl() {
        let budget = RetryBudget::new(Duration::from_secs(10), 2, 0.0).unwrap();
        assert_eq!(budget.available(), 20);
        for _ in 0..20 {
            assert!(budget.try_withdraw());
        }
        assert!(!budget.try_withdraw());
        // Deposits at ratio 0 add nothing.
        budget.deposit();
        assert!(!budget.try_withdraw());
    }

    #[tokio::test(start_paused = true)]
    async fn withdrawals_expire_after_the_ttl() {
        let budget = RetryBudget::new(Duration::from_secs(10), 1, 0.0).unwrap();
        for _ in 0..10 {
            assert!(budget.try_withdraw());
        }
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(budget.available(), 0, "still inside the window");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(budget.available(), 10, "the window has passed");
    }

    #[tokio::test(start_paused = true)]
    async fn deposits_expire_after_the_ttl() {
        let budget = RetryBudget::new(Duration::from_secs(1), 0, 0.5).unwrap();
        for _ in 0..4 {
            budget.deposit();
        }
        assert_eq!(budget.available(), 2);
        tokio::time::advance(Duration::from_millis(950)).await;
        assert_eq!(budget.available(), 2);
        tokio::time::advance(Duration::from_millis(50)).await;
        assert_eq!(budget.available(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_idle_gap_clears_everything() {
        let budget = RetryBudget::new(Duration::from_secs(1), 0, 1.0).unwrap();
        budget.deposit();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(budget.available(), 0);
        budget.deposit();
        assert_eq!(budget.available(), 1);
    }
}
