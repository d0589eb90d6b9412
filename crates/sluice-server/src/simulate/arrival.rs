//! One offered request: when, whose bucket, how many tokens. Traces and patterns make them;
//! the engine replays them.

/// A request offered to the simulated policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// Virtual time in nanoseconds from the start of the run.
    pub at_ns: u64,
    /// The key, as the policy's `key` would extract it (empty: no key).
    pub key: String,
    /// Tokens it takes (1 for a plain request).
    pub cost: u64,
}

impl Arrival {
    /// A request of cost 1 without a key at `at_ns`.
    pub fn at(at_ns: u64) -> Arrival {
        Arrival {
            at_ns,
            key: String::new(),
            cost: 1,
        }
    }
}

/// Nanoseconds in a second.
pub const NS: u64 = 1_000_000_000;

/// `ns` as seconds, for display.
pub fn secs(ns: u64) -> f64 {
    ns as f64 / NS as f64
}

/// Reads a non-negative decimal number of seconds (`0`, `2.5`, `.25`, at most nine decimal
/// places) into nanoseconds, exactly.
///
/// # Errors
///
/// `None` for anything else (signs, exponents, more than nine decimals, overflow).
pub fn parse_seconds(text: &str) -> Option<u64> {
    let (int, frac) = text.split_once('.').unwrap_or((text, ""));
    if (int.is_empty() && frac.is_empty())
        || frac.len() > 9
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut nanos: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    for _ in frac.len()..9 {
        nanos *= 10;
    }
    whole.checked_mul(NS)?.checked_add(nanos)
}

/// `ns` as seconds with up to nine decimals and no trailing zeros (`1.5`, `0.000001`, `3`).
pub fn format_seconds(ns: u64) -> String {
    let (s, f) = (ns / NS, ns % NS);
    if f == 0 {
        return s.to_string();
    }
    let frac = format!("{f:09}");
    format!("{s}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_trip() {
        assert_eq!(parse_seconds("0"), Some(0));
        assert_eq!(parse_seconds("0.25"), Some(250_000_000));
        assert_eq!(parse_seconds(".5"), Some(500_000_000));
        assert_eq!(parse_seconds("12.000000001"), Some(12_000_000_001));
        assert_eq!(parse_seconds("1.0000000001"), None);
        assert_eq!(parse_seconds("-1"), None);
        assert_eq!(parse_seconds("1e3"), None);
        assert_eq!(parse_seconds("."), None);
        assert_eq!(parse_seconds("99999999999999999999"), None);
        assert_eq!(format_seconds(1_500_000_000), "1.5");
        assert_eq!(format_seconds(3 * NS), "3");
        assert_eq!(format_seconds(1_000), "0.000001");
    }
}
