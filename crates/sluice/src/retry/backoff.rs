//! The backoff policy: exponential growth, a cap, full jitter, and the two limits on retrying.

use std::num::NonZeroU32;
use std::time::Duration;

use rand::RngCore;

/// How a delay is drawn below its exponential ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Jitter {
    /// "Full jitter": a delay drawn uniformly from `[0, ceiling]`. Clients that failed together
    /// spread out instead of retrying in lockstep. The default.
    #[default]
    Full,
    /// No jitter: every delay is its ceiling, `min(cap, base × 2^n)`. Deterministic, and the
    /// right choice only when a single client retries (or in a test).
    None,
}

/// Exponential backoff with full jitter, a cap, a maximum number of attempts and a maximum
/// elapsed time.
///
/// The delay before retry `n` (`n = 0` is the first retry, made after attempt 1 failed) is drawn
/// from `[0, min(cap, base × 2^n)]` (see [`Jitter`]). A `Backoff` holds no random state:
/// [`delay`](Backoff::delay) takes the random number generator, so a test can pass a seeded one
/// and know the schedule in advance.
///
/// Bad values cannot be written: the attempt limit is a [`NonZeroU32`], a cap below the base
/// simply caps every delay, and the arithmetic saturates instead of overflowing.
///
/// # Examples
///
/// ```
/// use std::num::NonZeroU32;
/// use std::time::Duration;
/// use rand::{rngs::StdRng, SeedableRng};
/// use sluice::retry::Backoff;
///
/// let backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2))
///     .with_max_attempts(NonZeroU32::new(5).unwrap())
///     .with_max_elapsed(Duration::from_secs(10));
///
/// assert_eq!(backoff.ceiling(0), Duration::from_millis(100));
/// assert_eq!(backoff.ceiling(3), Duration::from_millis(800));
/// assert_eq!(backoff.ceiling(10), Duration::from_secs(2)); // capped
///
/// let delays: Vec<Duration> = backoff.delays(StdRng::seed_from_u64(7)).collect();
/// assert_eq!(delays.len(), 4); // 5 attempts, so 4 retries
/// for (n, delay) in delays.iter().enumerate() {
///     assert!(*delay <= backoff.ceiling(n as u32));
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    max_attempts: NonZeroU32,
    max_elapsed: Option<Duration>,
    jitter: Jitter,
}

// === impl Backoff ===

impl Backoff {
    /// The default attempt limit: the first call and two retries.
    pub const DEFAULT_MAX_ATTEMPTS: NonZeroU32 = match NonZeroU32::new(3) {
        Some(n) => n,
        None => NonZeroU32::MIN,
    };

    /// Backoff starting at `base` and doubling up to `cap`, with full jitter,
    /// [`DEFAULT_MAX_ATTEMPTS`](Self::DEFAULT_MAX_ATTEMPTS) attempts and no limit on elapsed time.
    ///
    /// A `cap` below `base` is allowed and caps every delay at `cap`.
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            max_elapsed: None,
            jitter: Jitter::Full,
        }
    }

    /// At most `attempts` calls in all, the first one included (`1` means never retry).
    #[must_use]
    pub fn with_max_attempts(mut self, attempts: NonZeroU32) -> Backoff {
        self.max_attempts = attempts;
        self
    }

    /// No retry is started that would begin later than `elapsed` after the first attempt began.
    ///
    /// This bounds the waiting, not the attempts themselves: an attempt in flight when the time
    /// runs out is not interrupted (wrap it in `tokio::time::timeout` for that).
    #[must_use]
    pub fn with_max_elapsed(mut self, elapsed: Duration) -> Backoff {
        self.max_elapsed = Some(elapsed);
        self
    }

    /// Chooses how delays are drawn below their ceiling.
    #[must_use]
    pub fn with_jitter(mut self, jitter: Jitter) -> Backoff {
        self.jitter = jitter;
        self
    }

    /// The first ceiling, before any doubling.
    pub fn base(&self) -> Duration {
        self.base
    }

    /// The largest delay.
    pub fn cap(&self) -> Duration {
        self.cap
    }

    /// The attempt limit, the first attempt included.
    pub fn max_attempts(&self) -> NonZeroU32 {
        self.max_attempts
    }

    /// The elapsed-time limit, if any.
    pub fn max_elapsed(&self) -> Option<Duration> {
        self.max_elapsed
    }

    /// The jitter mode.
    pub fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The ceiling of the delay before retry `retry` (0-based): `min(cap, base × 2^retry)`,
    /// saturating.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let base = self.base.as_nanos();
        let cap = self.cap.as_nanos();
        let grown = if base == 0 {
            0
        } else if retry >= base.leading_zeros() {
            // base × 2^retry does not fit 128 bits: far beyond any cap a Duration can hold.
            u128::MAX
        } else {
            base << retry
        };
        from_nanos_u128(grown.min(cap))
    }

    /// The delay before retry `retry` (0-based), drawn from `rng` according to the jitter mode.
    ///
    /// With [`Jitter::Full`] it takes exactly one `u64` from `rng` (`x`) and returns
    /// `⌊x × (c + 1) / 2^64⌋` nanoseconds for the ceiling `c` in nanoseconds: uniform over
    /// `[0, c]` up to a bias below `c / 2^64`, never above `c`, and the same on every platform
    /// and `rand` version for the same stream of numbers. With [`Jitter::None`] it takes nothing
    /// from `rng` and returns the ceiling.
    pub fn delay<R: RngCore + ?Sized>(&self, retry: u32, rng: &mut R) -> Duration {
        let ceiling = self.ceiling(retry);
        match self.jitter {
            Jitter::None => ceiling,
            Jitter::Full => {
                let ceiling_ns = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
                Duration::from_nanos(scale(rng.next_u64(), ceiling_ns))
            }
        }
    }

    /// The delays before each retry the attempt limit allows, in order, drawn from `rng`.
    ///
    /// The elapsed-time limit is not applied: it depends on how long the attempts take.
    pub fn delays<R: RngCore>(&self, rng: R) -> Delays<R> {
        Delays {
            backoff: *self,
            rng,
            next: 0,
        }
    }
}

impl Default for Backoff {
    /// 100 ms doubling up to 10 s, full jitter, three attempts, no elapsed-time limit.
    fn default() -> Backoff {
        Backoff::new(Duration::from_millis(100), Duration::from_secs(10))
    }
}

/// A duration of `nanos` nanoseconds; the caller knows it fits (it is at most some `Duration`).
fn from_nanos_u128(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = u64::try_from(nanos / NANOS_PER_SEC).unwrap_or(u64::MAX);
    // The remainder is below 10^9 and fits a u32.
    let sub = u32::try_from(nanos % NANOS_PER_SEC).unwrap_or(0);
    Duration::new(secs, sub)
}

/// Maps a uniform `u64` onto `[0, max]` by multiply-shift (Lemire), without rejection.
fn scale(x: u64, max: u64) -> u64 {
    let range = u128::from(max) + 1;
    // x < 2^64, so x × range < 2^64 × range and the shifted result is < range, i.e. ≤ max.
    u64::try_from((u128::from(x) * range) >> 64).unwrap_or(max)
}

/// The iterator of [`Backoff::delays`].
#[derive(Debug, Clone)]
pub struct Delays<R> {
    backoff: Backoff,
    rng: R,
    next: u32,
}

// === impl Delays ===

impl<R: RngCore> Iterator for Delays<R> {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.next >= self.backoff.max_attempts.get() - 1 {
            return None;
        }
        let delay = self.backoff.delay(self.next, &mut self.rng);
        self.next += 1;
        Some(delay)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.backoff.max_attempts.get() - 1).saturating_sub(self.next);
        let left = usize::try_from(left).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

impl<R: RngCore> ExactSizeIterator for Delays<R> {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields a fixed list of numbers, then repeats the last one.
    struct Script(Vec<u64>, usize);

    impl RngCore for Script {
        fn next_u32(&mut self) -> u32 {
            (self.next_u64() >> 32) as u32
        }
        fn next_u64(&mut self) -> u64 {
            let x = self.0[self.1.min(self.0.len() - 1)];
            self.1 += 1;
            x
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            for b in dst {
                *b = self.next_u32() as u8;
            }
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn ceilings_double_then_cap() {
        let b = Backoff::new(100 * MS, 1000 * MS);
        let got: Vec<_> = (0..6).map(|n| b.ceiling(n)).collect();
        assert_eq!(
            got,
            [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
        );
    }

    #[test]
    fn ceiling_saturates_instead_of_overflowing() {
        let b = Backoff::new(Duration::from_secs(1), Duration::MAX);
        assert_eq!(b.ceiling(31), Duration::from_secs(1 << 31));
        assert_eq!(b.ceiling(40), Duration::from_secs(1 << 40));
        assert_eq!(b.ceiling(100), Duration::MAX);
        assert_eq!(b.ceiling(u32::MAX), Duration::MAX);
        // A tiny base keeps doubling past 2^32 without jumping to the cap.
        let tiny = Backoff::new(Duration::from_nanos(1), Duration::from_secs(3600));
        assert_eq!(tiny.ceiling(32), Duration::from_nanos(1 << 32));
        let zero = Backoff::new(Duration::ZERO, Duration::MAX);
        assert_eq!(zero.ceiling(u32::MAX), Duration::ZERO);
    }

    #[test]
    fn cap_below_base_caps_everything() {
        let b = Backoff::new(500 * MS, 50 * MS);
        assert_eq!(b.ceiling(0), 50 * MS);
        assert_eq!(b.ceiling(9), 50 * MS);
    }

    #[test]
    fn full_jitter_maps_the_extremes_and_the_middle() {
        let b = Backoff::new(100 * MS, Duration::from_secs(10));
        let mut rng = Script(vec![0, u64::MAX, 1 << 63, 1 << 62], 0);
        assert_eq!(b.delay(0, &mut rng), Duration::ZERO);
        assert_eq!(b.delay(0, &mut rng), 100 * MS); // the top of [0, 100 ms] is reachable
        assert_eq!(b.delay(1, &mut rng), 100 * MS); // half of 200 ms
        assert_eq!(b.delay(2, &mut rng), 100 * MS); // a quarter of 400 ms
    }

    #[test]
    fn no_jitter_is_the_ceiling_and_draws_nothing() {
        let b = Backoff::new(100 * MS, Duration::from_secs(10)).with_jitter(Jitter::None);
        let mut rng = Script(vec![0], 0);
        assert_eq!(b.delay(2, &mut rng), 400 * MS);
        assert_eq!(rng.1, 0);
    }

    #[test]
    fn delays_stop_at_the_attempt_limit() {
        let b = Backoff::new(MS, MS).with_max_attempts(NonZeroU32::new(4).unwrap());
        let delays = b.delays(Script(vec![0], 0));
        assert_eq!(delays.len(), 3);
        assert_eq!(delays.count(), 3);
        let once = b.with_max_attempts(NonZeroU32::MIN);
        assert_eq!(once.delays(Script(vec![0], 0)).count(), 0);
    }

    #[test]
    fn scale_never_exceeds_max() {
        for max in [0, 1, 2, 1_000, u64::MAX - 1, u64::MAX] {
            for x in [0, 1, 1 << 63, u64::MAX - 1, u64::MAX] {
                assert!(scale(x, max) <= max);
            }
        }
        assert_eq!(scale(u64::MAX, u64::MAX), u64::MAX);
        assert_eq!(scale(u64::MAX, 0), 0);
    }
}
