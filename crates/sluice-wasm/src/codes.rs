//! The numbers the ABI speaks: algorithm codes, priorities, offer and outcome codes, and the
//! conversions between JavaScript's `f64` milliseconds and the core's `u64` nanoseconds.
//!
//! Everything crossing the boundary is a number, so every conversion here is total: NaN,
//! infinities and negatives have a defined meaning and never panic.

use sluice_core::queue::Priority;
use sluice_core::Kind;

/// Nanoseconds in one millisecond.
pub const NANOS_PER_MS: u64 = 1_000_000;

/// The ABI code of an algorithm: its index in [`Kind::ALL`] (`token_bucket` = 0, `gcra` = 1,
/// `leaky_bucket` = 2, `sliding_log` = 3, `sliding_window` = 4, `fixed_window` = 5).
pub fn kind_code(kind: Kind) -> u32 {
    Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0) as u32
}

/// The algorithm of an ABI code, if it names one.
pub fn kind_from_code(code: u32) -> Option<Kind> {
    Kind::ALL.get(code as usize).copied()
}

/// The priority of an ABI code: 0 high, 1 normal, 2 low; anything else is normal.
pub fn priority_from_code(code: u32) -> Priority {
    match code {
        0 => Priority::High,
        2 => Priority::Low,
        _ => Priority::Normal,
    }
}

/// What `sluice_offer` did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum OfferCode {
    /// The arguments were unusable or no limiter was created.
    Invalid = -1,
    /// Admitted at once.
    Admitted = 0,
    /// Waiting for a later `sluice_poll`.
    Queued = 1,
    /// Denied at once: no queue (or the request may not wait) and no token.
    Limited = 2,
    /// Denied: the queue is at its depth.
    QueueFull = 3,
    /// Denied: the predicted wait exceeds the maximum wait.
    Timeout = 4,
    /// Denied: the cost exceeds the capacity, no wait could ever admit it.
    TooCostly = 5,
    /// Denied: the queue was closed.
    Closed = 6,
}

/// What became of a waiting request, as delivered by `sluice_poll` and `sluice_close`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum OutcomeCode {
    /// Admitted after waiting.
    Admitted = 0,
    /// Its deadline passed first.
    TimedOut = 1,
    /// The queue was closed.
    Closed = 2,
}

/// JavaScript milliseconds (e.g. `performance.now()`) to nanoseconds. NaN, negatives and
/// `-Infinity` are 0; values beyond the `u64` range saturate.
pub fn ms_to_ns(ms: f64) -> u64 {
    // `as` saturates and maps NaN to 0, which is exactly the total behaviour wanted.
    (ms * NANOS_PER_MS as f64) as u64
}

/// Nanoseconds to milliseconds with the fraction kept, for timers.
pub fn ns_to_ms(ns: u64) -> f64 {
    ns as f64 / NANOS_PER_MS as f64
}

/// Nanoseconds to whole milliseconds, rounded up, for `retry_after_ms`.
pub fn ns_to_ms_ceil(ns: u64) -> f64 {
    ns.div_ceil(NANOS_PER_MS) as f64
}

/// The interval between tokens for `per_second` tokens per second, rounded up as
/// [`Rate::from_per_second_f64`](sluice_core::Rate::from_per_second_f64) does, or `None` where
/// it fails. Done here so that the module does not carry the float formatting of the core's
/// error messages (a quarter of its size).
pub fn interval_from_per_second(per_second: f64) -> Option<u64> {
    if !(per_second > 0.0 && per_second.is_finite()) {
        return None;
    }
    let interval = 1e9 / per_second;
    if !(1.0..u64::MAX as f64).contains(&interval) {
        return None;
    }
    let floor = interval as u64;
    Some(if (floor as f64) < interval {
        floor + 1
    } else {
        floor
    })
}

/// A non-negative whole number from JavaScript, or `None` for fractions, negatives, NaN,
/// infinities and values of 2^64 or more.
pub fn whole(value: f64) -> Option<u64> {
    // 2^64 exactly; every f64 below it converts without saturating.
    const LIMIT: f64 = 18_446_744_073_709_551_616.0;
    if !(0.0..LIMIT).contains(&value) {
        return None;
    }
    let n = value as u64;
    (n as f64 == value).then_some(n)
}

/// A `u64` as the smallest `f64` not below it: values above 2^53 round up, never down, so a
/// debt or a count written through JavaScript never shrinks.
pub fn up_f64(n: u64) -> f64 {
    let f = n as f64; // rounds to nearest
                      // `f as u64` saturates, so 2^64 (from values near u64::MAX) counts as not below.
    if f as u64 >= n {
        f
    } else {
        // The next representable value above `f` (positive and finite): one more in its bits.
        f64::from_bits(f.to_bits() + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_in_documented_order() {
        for (i, kind) in Kind::ALL.into_iter().enumerate() {
            assert_eq!(kind_code(kind), i as u32);
            assert_eq!(kind_from_code(i as u32), Some(kind));
        }
        assert_eq!(kind_from_code(0), Some(Kind::TokenBucket));
        assert_eq!(kind_from_code(6), None);
    }

    #[test]
    fn time_conversions_are_total() {
        assert_eq!(ms_to_ns(1.5), 1_500_000);
        assert_eq!(ms_to_ns(-3.0), 0);
        assert_eq!(ms_to_ns(f64::NAN), 0);
        assert_eq!(ms_to_ns(f64::INFINITY), u64::MAX);
        assert_eq!(ns_to_ms(1_500_000), 1.5);
        assert_eq!(ns_to_ms_ceil(1_000_001), 2.0);
        assert_eq!(ns_to_ms_ceil(1_000_000), 1.0);
        assert_eq!(ns_to_ms_ceil(0), 0.0);
    }

    #[test]
    fn per_second_matches_the_core() {
        for r in [
            1.0,
            3.0,
            0.5,
            1e-9,
            7.3,
            1e9,
            1e9 + 1.0,
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e-12,
        ] {
            let core = sluice_core::Rate::from_per_second_f64(r).ok();
            assert_eq!(
                interval_from_per_second(r),
                core.map(|c| c.interval_ns()),
                "{r}"
            );
        }
    }

    #[test]
    fn whole_numbers_only() {
        assert_eq!(whole(0.0), Some(0));
        assert_eq!(whole(10.0), Some(10));
        assert_eq!(whole(1.5), None);
        assert_eq!(whole(-1.0), None);
        assert_eq!(whole(f64::NAN), None);
        assert_eq!(whole(f64::INFINITY), None);
        assert_eq!(whole(18_446_744_073_709_551_616.0), None);
        assert_eq!(whole(9_007_199_254_740_992.0), Some(1 << 53));
    }

    #[test]
    fn large_values_round_up() {
        assert_eq!(up_f64(5), 5.0);
        let n = (1u64 << 60) + 1;
        let f = up_f64(n);
        assert!(whole(f).unwrap() >= n);
        assert_eq!(up_f64(u64::MAX), 18_446_744_073_709_551_616.0);
        for n in [(1u64 << 53) + 1, (1 << 62) - 1, 3 << 55] {
            assert!(whole(up_f64(n)).is_none_or(|m| m >= n), "{n}");
        }
    }
}
