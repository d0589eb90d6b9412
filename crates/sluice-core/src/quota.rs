//! Quotas: how many tokens a limiter holds (capacity) and how fast they come back (rate).
//!
//! Time inside the core is a count of nanoseconds. A [`Rate`] is kept as the whole number of
//! nanoseconds between two tokens, rounded **up** when the written rate does not divide a
//! nanosecond evenly. Rounding up means the effective rate is never above the written one, and
//! the difference is below one nanosecond per token (for `3/s` the interval is 333,333,334 ns,
//! a relative difference of 2e-9). Every algorithm then works on whole numbers only, so two
//! runs with the same inputs give the same decisions on every platform, wasm included.

use alloc::string::{String, ToString};
use core::fmt;
use core::str::FromStr;

use crate::error::QuotaError;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// The longest span the core reasons about: capacity × interval must fit in it (about 146 years).
pub const MAX_SPAN_NS: u64 = 1 << 62;

/// How fast tokens come back: one token every `interval_ns` nanoseconds.
///
/// # Examples
///
/// ```
/// use sluice_core::Rate;
///
/// let r: Rate = "10/min".parse().unwrap();
/// assert_eq!(r.interval_ns(), 6_000_000_000);
/// assert_eq!("10 per 90s".parse::<Rate>().unwrap().interval_ns(), 9_000_000_000);
/// assert_eq!("0.5/s".parse::<Rate>().unwrap().interval_ns(), 2_000_000_000);
/// assert!("0/s".parse::<Rate>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rate {
    interval_ns: u64,
}

impl Rate {
    /// One token every `interval_ns` nanoseconds.
    ///
    /// # Errors
    ///
    /// [`QuotaError::RateTooHigh`] when `interval_ns` is zero.
    pub fn from_interval_ns(interval_ns: u64) -> Result<Rate, QuotaError> {
        if interval_ns == 0 {
            return Err(QuotaError::RateTooHigh {
                value: "one token every 0 ns".to_string(),
            });
        }
        Ok(Rate { interval_ns })
    }

    /// `n` tokens per second. A zero `n` cannot be written, as in governor's `per_second`.
    pub const fn per_second(n: core::num::NonZeroU32) -> Rate {
        Rate::per_period(n, NANOS_PER_SEC)
    }

    /// `n` tokens per minute.
    pub const fn per_minute(n: core::num::NonZeroU32) -> Rate {
        Rate::per_period(n, 60 * NANOS_PER_SEC)
    }

    /// `n` tokens per hour.
    pub const fn per_hour(n: core::num::NonZeroU32) -> Rate {
        Rate::per_period(n, 3600 * NANOS_PER_SEC)
    }

    const fn per_period(n: core::num::NonZeroU32, period_ns: u64) -> Rate {
        let n = n.get() as u64;
        let interval_ns = period_ns.div_ceil(n);
        Rate { interval_ns }
    }

    /// A rate given as a floating-point number of tokens per second, as JavaScript callers have it.
    ///
    /// # Errors
    ///
    /// NaN and infinities are [`QuotaError::NotFinite`], zero and negatives
    /// [`QuotaError::NonPositiveRate`], more than 1e9/s [`QuotaError::RateTooHigh`] and rates so
    /// slow that the interval overflows [`QuotaError::RateTooLow`].
    pub fn from_per_second_f64(per_second: f64) -> Result<Rate, QuotaError> {
        let value = || alloc::format!("{per_second}/s");
        if per_second.is_nan() || per_second.is_infinite() {
            return Err(QuotaError::NotFinite { value: value() });
        }
        if per_second <= 0.0 {
            return Err(QuotaError::NonPositiveRate { value: value() });
        }
        let interval = NANOS_PER_SEC as f64 / per_second;
        if interval < 1.0 {
            return Err(QuotaError::RateTooHigh { value: value() });
        }
        if interval >= u64::MAX as f64 {
            return Err(QuotaError::RateTooLow { value: value() });
        }
        // `as` saturates; the value is finite and in range here.
        let floor = interval as u64;
        let interval_ns = if (floor as f64) < interval {
            floor + 1
        } else {
            floor
        };
        Ok(Rate { interval_ns })
    }

    /// Nanoseconds between two tokens.
    pub const fn interval_ns(&self) -> u64 {
        self.interval_ns
    }

    /// Tokens per second as a float, for display and metrics only.
    pub fn per_second_f64(&self) -> f64 {
        NANOS_PER_SEC as f64 / self.interval_ns as f64
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (NANOS_PER_SEC, "s"),
            (60 * NANOS_PER_SEC, "min"),
            (3600 * NANOS_PER_SEC, "h"),
            (86_400 * NANOS_PER_SEC, "d"),
        ];
        for (period, unit) in UNITS {
            if period % self.interval_ns == 0 {
                return write!(f, "{}/{unit}", period / self.interval_ns);
            }
        }
        write!(f, "1 per {}ns", self.interval_ns)
    }
}

impl FromStr for Rate {
    type Err = QuotaError;

    /// Reads `N/unit`, `N/Munit` and `N per Munit`, where N may have a fraction (`0.5/s`) and the
    /// units are `ns` (`nanosecond(s)`), `us` (`µs`, `microsecond(s)`), `ms` (`millisecond(s)`),
    /// `s` (`sec(s)`, `second(s)`), `m` (`min(s)`, `minute(s)`), `h` (`hr(s)`, `hour(s)`) and `d`
    /// (`day(s)`).
    fn from_str(text: &str) -> Result<Rate, QuotaError> {
        parse_rate(text)
    }
}

const RATE_FORMS: &str = "a rate such as `5/s`, `10/min`, `100/h`, `0.5/s` or `10 per 90s`";

/// A non-negative decimal as `mantissa / 10^scale`.
#[derive(Debug, Clone, Copy)]
struct Decimal {
    mantissa: u128,
    scale: u32,
}

fn parse_decimal(s: &str) -> Option<Decimal> {
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i, f),
        None => (s, ""),
    };
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let digits = int.len() + frac.len();
    if digits > 30 {
        return None;
    }
    let mut mantissa: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        mantissa = mantissa * 10 + u128::from(b - b'0');
    }
    Some(Decimal {
        mantissa,
        scale: frac.len() as u32,
    })
}

fn unit_ns(unit: &str) -> Option<u128> {
    let ns: u128 = match unit {
        "ns" | "nanosecond" | "nanoseconds" => 1,
        "us" | "µs" | "microsecond" | "microseconds" => 1_000,
        "ms" | "millisecond" | "milliseconds" => 1_000_000,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000_000,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000_000_000,
        "d" | "day" | "days" => 86_400_000_000_000,
        _ => return None,
    };
    Some(ns)
}

/// Parses a duration such as `90s`, `1.5min` or `s` (one unit), into nanoseconds as a decimal.
fn parse_period(s: &str) -> Option<Decimal> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let unit = unit.trim();
    let unit = unit_ns(unit)?;
    let count = if num.is_empty() {
        Decimal {
            mantissa: 1,
            scale: 0,
        }
    } else {
        parse_decimal(num)?
    };
    Some(Decimal {
        mantissa: count.mantissa.checked_mul(unit)?,
        scale: count.scale,
    })
}

fn parse_rate(text: &str) -> Result<Rate, QuotaError> {
    let value = || text.to_string();
    let trimmed = text.trim();
    let lower = trimmed.to_ascii_lowercase();
    let (amount, period) = if let Some((a, p)) = lower.split_once('/') {
        (a.trim(), p.trim())
    } else if let Some((a, p)) = lower.split_once(" per ") {
        (a.trim(), p.trim())
    } else {
        return Err(QuotaError::Syntax {
            value: value(),
            expected: RATE_FORMS,
        });
    };
    let amount = amount.strip_prefix('+').unwrap_or(amount);
    if amount.starts_with('-') {
        return Err(QuotaError::NonPositiveRate { value: value() });
    }
    if matches!(amount, "nan" | "inf" | "infinity") {
        return Err(QuotaError::NotFinite { value: value() });
    }
    let amount = parse_decimal(amount).ok_or_else(|| QuotaError::Syntax {
        value: value(),
        expected: RATE_FORMS,
    })?;
    let period = parse_period(period).ok_or_else(|| QuotaError::Syntax {
        value: value(),
        expected: RATE_FORMS,
    })?;
    if amount.mantissa == 0 || period.mantissa == 0 {
        return Err(QuotaError::NonPositiveRate { value: value() });
    }
    // interval = period / amount
    //          = (pm / 10^ps) / (am / 10^as) = pm * 10^as / (am * 10^ps)
    let too_low = || QuotaError::RateTooLow { value: value() };
    let num = 10u128
        .checked_pow(amount.scale)
        .and_then(|p| p.checked_mul(period.mantissa))
        .ok_or_else(too_low)?;
    let den = 10u128
        .checked_pow(period.scale)
        .and_then(|p| p.checked_mul(amount.mantissa))
        .ok_or_else(|| QuotaError::RateTooHigh { value: value() })?;
    if num < den {
        return Err(QuotaError::RateTooHigh { value: value() });
    }
    let interval = num.div_ceil(den);
    let interval_ns = u64::try_from(interval).map_err(|_| too_low())?;
    Ok(Rate { interval_ns })
}

/// Capacity (the largest burst) and rate: the two numbers that configure every algorithm.
///
/// For the window algorithms the window is `capacity × interval`, so `capacity = 10` with
/// `rate = "10/min"` means 10 per minute.
///
/// # Examples
///
/// ```
/// use sluice_core::Quota;
///
/// let q = Quota::parse(10, "5/s").unwrap();
/// assert_eq!(q.capacity(), 10);
/// assert_eq!(q.window_ns(), 2_000_000_000);
/// assert!(Quota::parse(0, "5/s").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    capacity: u64,
    rate: Rate,
}

impl Quota {
    /// A quota of `capacity` tokens refilled at `rate`.
    ///
    /// # Errors
    ///
    /// [`QuotaError::ZeroCapacity`] for a zero capacity, [`QuotaError::Overflow`] when
    /// `capacity × interval` exceeds [`MAX_SPAN_NS`].
    pub fn new(capacity: u64, rate: Rate) -> Result<Quota, QuotaError> {
        if capacity == 0 {
            return Err(QuotaError::ZeroCapacity);
        }
        match capacity.checked_mul(rate.interval_ns) {
            Some(span) if span <= MAX_SPAN_NS => Ok(Quota { capacity, rate }),
            _ => Err(QuotaError::Overflow {
                capacity,
                interval_ns: rate.interval_ns,
            }),
        }
    }

    /// Parses the rate text and builds the quota.
    ///
    /// # Errors
    ///
    /// Any error of [`Rate::from_str`] or [`Quota::new`].
    pub fn parse(capacity: u64, rate: &str) -> Result<Quota, QuotaError> {
        Quota::new(capacity, rate.parse()?)
    }

    /// The largest burst, and the largest cost one check may ask for.
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The refill rate.
    pub const fn rate(&self) -> Rate {
        self.rate
    }

    /// Nanoseconds between two tokens.
    pub const fn interval_ns(&self) -> u64 {
        self.rate.interval_ns
    }

    /// `capacity × interval`: the time an empty bucket takes to fill, and the window length of
    /// the window algorithms.
    pub const fn window_ns(&self) -> u64 {
        self.capacity * self.rate.interval_ns
    }

    /// The same rate with another capacity.
    ///
    /// # Errors
    ///
    /// As [`Quota::new`].
    pub fn with_capacity(&self, capacity: u64) -> Result<Quota, QuotaError> {
        Quota::new(capacity, self.rate)
    }
}

impl fmt::Display for Quota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "capacity {} at {}", self.capacity, self.rate)
    }
}

/// Renders a nanosecond count in the largest unit that divides it exactly: `s`, `ms`, `us` or
/// `ns`, so 1.5 s is `1500ms` and zero is `0s`. Every form it writes is one a quota's rate
/// accepts back (`10 per 1500ms`).
///
/// # Examples
///
/// ```
/// use sluice_core::format_duration_ns;
///
/// assert_eq!(format_duration_ns(2_000_000_000), "2s");
/// assert_eq!(format_duration_ns(1_500_000_000), "1500ms");
/// assert_eq!(format_duration_ns(200_000_000), "200ms");
/// assert_eq!(format_duration_ns(15_000), "15us");
/// assert_eq!(format_duration_ns(7), "7ns");
/// assert_eq!(format_duration_ns(0), "0s");
///
/// let text = format!("10 per {}", format_duration_ns(1_500_000_000));
/// let rate: sluice_core::Rate = text.parse().unwrap();
/// assert_eq!(rate.interval_ns(), 150_000_000);
/// ```
pub fn format_duration_ns(ns: u64) -> String {
    if ns == 0 {
        return "0s".to_string();
    }
    if ns.is_multiple_of(NANOS_PER_SEC) {
        alloc::format!("{}s", ns / NANOS_PER_SEC)
    } else if ns.is_multiple_of(1_000_000) {
        alloc::format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        alloc::format!("{}us", ns / 1_000)
    } else {
        alloc::format!("{ns}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(s: &str) -> u64 {
        s.parse::<Rate>().unwrap().interval_ns()
    }

    #[test]
    fn parses_the_forms_users_write() {
        assert_eq!(iv("5/s"), 200_000_000);
        assert_eq!(iv("10/min"), 6_000_000_000);
        assert_eq!(iv("100/h"), 36_000_000_000);
        assert_eq!(iv("10 per 90s"), 9_000_000_000);
        assert_eq!(iv("0.5/s"), 2_000_000_000);
        assert_eq!(iv(" 5 / second "), 200_000_000);
        assert_eq!(iv("20/1.5min"), 4_500_000_000);
        assert_eq!(iv("1/d"), 86_400_000_000_000);
        assert_eq!(iv("1000000000/s"), 1);
        assert_eq!(iv("3/s"), 333_333_334, "rounds the interval up");
        assert_eq!(iv("5 PER SECOND"), 200_000_000);
    }

    #[test]
    fn rejects_bad_rates_naming_the_value() {
        for (text, want) in [
            ("0/s", "greater than zero"),
            ("-5/s", "greater than zero"),
            ("5/0s", "greater than zero"),
            ("NaN/s", "finite"),
            ("inf/s", "finite"),
            ("2000000000/s", "too high"),
            ("1/100000000d", "too low"),
            ("5", "expected"),
            ("five/s", "expected"),
            ("5/fortnight", "expected"),
            ("", "expected"),
            ("1.2.3/s", "expected"),
            ("99999999999999999999999999999999999/s", "expected"),
        ] {
            let err = text.parse::<Rate>().unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
            if !text.is_empty() {
                assert!(
                    err.contains(text.trim()) || err.contains("0 ns"),
                    "{text}: {err}"
                );
            }
        }
    }

    #[test]
    fn f64_rates_are_checked() {
        assert_eq!(
            Rate::from_per_second_f64(4.0).unwrap().interval_ns(),
            250_000_000
        );
        assert!(matches!(
            Rate::from_per_second_f64(f64::NAN),
            Err(QuotaError::NotFinite { .. })
        ));
        assert!(matches!(
            Rate::from_per_second_f64(f64::INFINITY),
            Err(QuotaError::NotFinite { .. })
        ));
        assert!(matches!(
            Rate::from_per_second_f64(0.0),
            Err(QuotaError::NonPositiveRate { .. })
        ));
        assert!(matches!(
            Rate::from_per_second_f64(-1.0),
            Err(QuotaError::NonPositiveRate { .. })
        ));
        assert!(matches!(
            Rate::from_per_second_f64(1e10),
            Err(QuotaError::RateTooHigh { .. })
        ));
        assert!(matches!(
            Rate::from_per_second_f64(1e-12),
            Err(QuotaError::RateTooLow { .. })
        ));
        assert!(Rate::from_interval_ns(0).is_err());
    }

    #[test]
    fn quota_rejects_zero_and_overflow() {
        assert_eq!(Quota::parse(0, "1/s"), Err(QuotaError::ZeroCapacity));
        let err = Quota::parse(u64::MAX, "1/s").unwrap_err();
        assert!(matches!(
            err,
            QuotaError::Overflow {
                capacity: u64::MAX,
                ..
            }
        ));
        assert!(err.to_string().contains(&u64::MAX.to_string()));
        assert!(Quota::parse(1, "1/d").is_ok());
    }

    #[test]
    fn display_round_trips() {
        for text in ["5/s", "10/min", "7/h", "1/d", "1 per 7ns"] {
            let r: Rate = text.parse().unwrap();
            let shown = r.to_string();
            assert_eq!(shown.parse::<Rate>().unwrap(), r, "{text} -> {shown}");
        }
        assert_eq!("0.5/s".parse::<Rate>().unwrap().to_string(), "30/min");
        assert_eq!(format_duration_ns(1_500_000_000), "1500ms");
        assert_eq!(format_duration_ns(2_000_000_000), "2s");
    }
}
