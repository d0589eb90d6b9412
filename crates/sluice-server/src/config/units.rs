//! Durations (`50ms`, `10s`, `1.5min`) and sizes (`64KiB`, `1MB`, `512`) as users write them.

use std::time::Duration;

/// Reads a duration: a non-negative decimal number and a unit (`ns`, `us`, `ms`, `s`, `m` or
/// `min`, `h`, `d`), as in `50ms`, `10s`, `1.5min`.
///
/// # Errors
///
/// A message naming what was expected.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice_server::config::units::parse_duration;
///
/// assert_eq!(parse_duration("50ms"), Ok(Duration::from_millis(50)));
/// assert_eq!(parse_duration("1.5 min"), Ok(Duration::from_secs(90)));
/// assert!(parse_duration("-1s").is_err());
/// assert!(parse_duration("10").is_err());
/// ```
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    const FORMS: &str = "expected a duration such as `50ms`, `10s`, `1.5min` or `2h`";
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!("duration `{text}` must not be negative"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let unit_ns: u128 = match unit.trim() {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" | "sec" | "secs" => 1_000_000_000,
        "m" | "min" | "mins" => 60_000_000_000,
        "h" | "hr" | "hrs" => 3_600_000_000_000,
        "d" | "day" | "days" => 86_400_000_000_000,
        "" => return Err(format!("duration `{text}` has no unit: {FORMS}")),
        _ => return Err(format!("cannot read `{text}` as a duration: {FORMS}")),
    };
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if (int.is_empty() && frac.is_empty())
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
        || int.len() + frac.len() > 30
    {
        return Err(format!("cannot read `{text}` as a duration: {FORMS}"));
    }
    let digits: u128 = format!("{int}{frac}")
        .parse()
        .map_err(|_| format!("cannot read `{text}` as a duration: {FORMS}"))?;
    let scale = 10u128.pow(frac.len() as u32);
    let nanos = digits
        .checked_mul(unit_ns)
        .map(|n| n / scale)
        .ok_or_else(|| format!("duration `{text}` is too long"))?;
    let secs = u64::try_from(nanos / 1_000_000_000)
        .map_err(|_| format!("duration `{text}` is too long"))?;
    Ok(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// Reads a size in bytes: a whole number with an optional unit (`B`, `KB`, `KiB`, `MB`, `MiB`,
/// `GB`, `GiB`; case-insensitive), as in `64KiB` or `512`.
///
/// # Errors
///
/// A message naming what was expected.
///
/// # Examples
///
/// ```
/// use sluice_server::config::units::parse_size;
///
/// assert_eq!(parse_size("64KiB"), Ok(65_536));
/// assert_eq!(parse_size("1 MB"), Ok(1_000_000));
/// assert_eq!(parse_size("512"), Ok(512));
/// assert!(parse_size("12 parsecs").is_err());
/// ```
pub fn parse_size(text: &str) -> Result<u64, String> {
    const FORMS: &str = "expected a size such as `512`, `64KiB` or `1MB`";
    let t = text.trim();
    if t.starts_with('-') {
        return Err(format!("size `{text}` must not be negative"));
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    if number.is_empty() {
        return Err(format!("cannot read `{text}` as a size: {FORMS}"));
    }
    let factor: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" | "k" => 1 << 10,
        "mb" => 1_000_000,
        "mib" | "m" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" | "g" => 1 << 30,
        _ => return Err(format!("cannot read `{text}` as a size: {FORMS}")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("size `{text}` is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration(".5s"), Ok(Duration::from_millis(500)));
        for bad in [
            "",
            "s",
            "NaN s",
            "1.2.3s",
            "5 fortnights",
            "1e3s",
            "99999999999999999999999d",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("64kib"), Ok(65_536));
        for bad in ["", "KiB", "-1", "1.5MiB", "99999999999GiB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
