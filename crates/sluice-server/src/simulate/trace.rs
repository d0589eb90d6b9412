//! Trace files: one request per line, `TIME [KEY [COST]]`.
//!
//! - `TIME` is either seconds from the start of the run as a decimal (`0`, `0.25`, `12.5`, at
//!   most nine decimal places), or an RFC 3339 timestamp (`2024-05-01T12:00:00.250Z`,
//!   `2024-05-01 12:00:00+02:00`) counted from the first line's. One file uses one kind.
//! - `KEY` is the value the policy's `key` would extract (an IP, a header value...); `-`
//!   means no key. A policy with `key = "global"` ignores it.
//! - `COST` is a whole number of tokens, at least 1 (default 1).
//! - Blank lines and lines starting with `#` are skipped. Times must not go backwards.
//!
//! ```text
//! # time  key     cost
//! 0       alice
//! 0.25    bob     2
//! 0.25    alice
//! 1.5     -
//! ```

use std::fmt;

use crate::simulate::arrival::{format_seconds, parse_seconds, Arrival};

/// The most requests one trace may hold.
pub const MAX_REQUESTS: usize = 10_000_000;

/// A trace line that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct TraceError {
    /// The trace file as given.
    pub file: String,
    /// 1-based line number (0: the file as a whole).
    pub line: usize,
    /// What is wrong, and what was expected.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Clock {
    Seconds,
    /// Nanoseconds since the Unix epoch of the first line.
    Wall(i128),
}

impl fmt::Display for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Clock::Seconds => "seconds",
            Clock::Wall(_) => "RFC 3339 times",
        })
    }
}

const TIME_FORMS: &str =
    "expected seconds such as `0.25` or an RFC 3339 time such as `2024-05-01T12:00:00.250Z`";

/// Reads a trace; `file` names it in errors.
///
/// # Errors
///
/// The first bad line, with its number: an unreadable time, key or cost, extra fields, a
/// time before the previous line's, a mix of seconds and timestamps, or no request at all.
///
/// # Examples
///
/// ```
/// use sluice_server::simulate::trace;
///
/// let arrivals = trace::parse("0 alice\n0.5 bob 2\n", "t.trace").unwrap();
/// assert_eq!(arrivals[1].at_ns, 500_000_000);
/// assert_eq!((arrivals[1].key.as_str(), arrivals[1].cost), ("bob", 2));
///
/// let e = trace::parse("1\n0.5\n", "t.trace").unwrap_err();
/// assert_eq!(e.line, 2);
/// ```
pub fn parse(text: &str, file: &str) -> Result<Vec<Arrival>, TraceError> {
    let fail = |line: usize, message: String| TraceError {
        file: file.to_owned(),
        line,
        message,
    };
    let mut out = Vec::new();
    let mut clock: Option<Clock> = None;
    let mut previous: Option<(u64, usize)> = None;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let content = raw.trim();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        // `2024-05-01 12:00:00Z`: a date and a time in two fields.
        let joined;
        let mut fields: Vec<&str> = content.split_whitespace().collect();
        if fields.len() > 1 && is_date(fields[0]) && fields[1].contains(':') {
            joined = format!("{}T{}", fields[0], fields[1]);
            fields.splice(0..2, [joined.as_str()]);
        }
        let mut fields = fields.into_iter();
        let time = fields.next().unwrap_or_default();
        let at_ns = if let Some(ns) = parse_seconds(time) {
            match clock {
                None => clock = Some(Clock::Seconds),
                Some(Clock::Seconds) => {}
                Some(c @ Clock::Wall(_)) => {
                    return Err(fail(
                        line,
                        format!("`{time}` is in seconds but the trace started with {c}: use one kind of time"),
                    ))
                }
            }
            ns
        } else if let Some(wall) = parse_rfc3339(time) {
            let first = match clock {
                None => {
                    clock = Some(Clock::Wall(wall));
                    wall
                }
                Some(Clock::Wall(first)) => first,
                Some(c @ Clock::Seconds) => {
                    return Err(fail(
                        line,
                        format!("`{time}` is an RFC 3339 time but the trace started with {c}: use one kind of time"),
                    ))
                }
            };
            let since = wall - first;
            if since < 0 {
                let (at, prev_line) = previous.unwrap_or((0, 0));
                return Err(fail(
                    line,
                    format!(
                        "`{time}` is {} s before the first line's time (line {prev_line} was at +{} s): a trace must be sorted by time",
                        format_seconds(u64::try_from(-since).unwrap_or(u64::MAX)),
                        format_seconds(at)
                    ),
                ));
            }
            u64::try_from(since).map_err(|_| {
                fail(
                    line,
                    format!("`{time}` is too far from the first line's time"),
                )
            })?
        } else {
            let hint = if time.starts_with('-') {
                "times must not be negative; "
            } else {
                ""
            };
            return Err(fail(
                line,
                format!("cannot read `{time}` as a time: {hint}{TIME_FORMS}"),
            ));
        };
        if let Some((prev, prev_line)) = previous {
            if at_ns < prev {
                return Err(fail(
                    line,
                    format!(
                        "time {} s is before line {prev_line}'s {} s: a trace must be sorted by time",
                        format_seconds(at_ns),
                        format_seconds(prev)
                    ),
                ));
            }
        }
        previous = Some((at_ns, line));
        let key = match fields.next() {
            None | Some("-") => String::new(),
            Some(k) => k.to_owned(),
        };
        let cost = match fields.next() {
            None => 1,
            Some(c) => match c.parse::<u64>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(fail(
                        line,
                        format!("cannot read `{c}` as a cost: expected a whole number of tokens, at least 1"),
                    ))
                }
            },
        };
        if let Some(extra) = fields.next() {
            return Err(fail(
                line,
                format!("unexpected `{extra}`: a line is `TIME [KEY [COST]]`"),
            ));
        }
        if out.len() == MAX_REQUESTS {
            return Err(fail(
                line,
                format!("more than {MAX_REQUESTS} requests: split the trace"),
            ));
        }
        out.push(Arrival { at_ns, key, cost });
    }
    if out.is_empty() {
        return Err(fail(
            0,
            "no requests: a trace has one line per request, `TIME [KEY [COST]]`".to_owned(),
        ));
    }
    Ok(out)
}

fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

/// Nanoseconds since the Unix epoch of `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` (`t`, `z` and
/// a space for `T` are accepted too).
fn parse_rfc3339(s: &str) -> Option<i128> {
    let b = s.as_bytes();
    if b.len() < 20 || !is_date(&s[..10]) || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut nanos: i64 = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() || digits.len() > 9 {
            return None;
        }
        nanos = digits.parse().ok()?;
        for _ in digits.len()..9 {
            nanos *= 10;
        }
    }
    let offset_s: i64 = match &s[i..] {
        "Z" | "z" => 0,
        tz if tz.len() == 6 && (tz.starts_with('+') || tz.starts_with('-')) && &tz[3..4] == ":" => {
            let h = num(i + 1..i + 3)?;
            let m = num(i + 4..i + 6)?;
            if h > 23 || m > 59 {
                return None;
            }
            let sign = if tz.starts_with('-') { -1 } else { 1 };
            sign * (h * 3600 + m * 60)
        }
        _ => return None,
    };
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let days_in_month = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month[(month - 1) as usize]
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Some(i128::from(secs) * 1_000_000_000 + i128::from(nanos))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_keys_costs_and_comments() {
        let a = parse(
            "# a comment\n\n0 alice\n0.25 bob 2\n  0.25  -  3 \n1.5\n",
            "t",
        )
        .unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(
            a[0],
            Arrival {
                at_ns: 0,
                key: "alice".into(),
                cost: 1
            }
        );
        assert_eq!(
            a[1],
            Arrival {
                at_ns: 250_000_000,
                key: "bob".into(),
                cost: 2
            }
        );
        assert_eq!(
            a[2],
            Arrival {
                at_ns: 250_000_000,
                key: String::new(),
                cost: 3
            }
        );
        assert_eq!(a[3], Arrival::at(1_500_000_000));
    }

    #[test]
    fn rfc3339_counts_from_the_first_line() {
        let a = parse(
            "2024-05-01T12:00:00Z k\n2024-05-01T12:00:00.250Z\n2024-05-01 14:00:01+02:00\n2024-05-02t00:00:00.000000001z\n",
            "t",
        )
        .unwrap();
        let at: Vec<u64> = a.iter().map(|x| x.at_ns).collect();
        assert_eq!(at, [0, 250_000_000, 1_000_000_000, 43_200_000_000_001]);
        assert_eq!(a[0].key, "k");
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert!(parse_rfc3339("2024-02-30T00:00:00Z").is_none());
        assert!(parse_rfc3339("2024-02-29T00:00:00Z").is_some());
    }

    #[test]
    fn errors_name_the_line() {
        let e = |text: &str| parse(text, "t.trace").unwrap_err();
        let unsorted = e("0\n2\n# x\n1.5\n");
        assert_eq!(unsorted.line, 4);
        assert_eq!(
            unsorted.to_string(),
            "t.trace:4: time 1.5 s is before line 2's 2 s: a trace must be sorted by time"
        );
        let bad = e("0\nabc\n");
        assert_eq!(bad.line, 2);
        assert!(bad.message.contains("cannot read `abc` as a time"), "{bad}");
        assert!(e("0\n-1\n").message.contains("must not be negative"));
        assert!(e("0 k 0\n").message.contains("cannot read `0` as a cost"));
        assert!(e("0 k 1.5\n")
            .message
            .contains("cannot read `1.5` as a cost"));
        assert!(e("0 k 1 x\n").message.contains("unexpected `x`"));
        assert!(e("0\n2024-05-01T12:00:00Z\n")
            .message
            .contains("one kind of time"));
        assert!(e("2024-05-01T12:00:00Z\n3\n")
            .message
            .contains("one kind of time"));
        assert!(e("2024-05-01T12:00:01Z\n2024-05-01T12:00:00Z\n")
            .message
            .contains("sorted by time"));
        let empty = e("# nothing\n\n");
        assert_eq!(empty.line, 0);
        assert!(empty.message.contains("no requests"));
        assert!(e("1.0000000001\n").message.contains("cannot read"));
    }
}
