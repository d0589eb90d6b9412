//! The limits a server announces in its response header fields, read without I/O: the IETF
//! fields (`RateLimit-Policy`, `RateLimit`), OpenAI's, Anthropic's and GitHub's, `Retry-After`
//! and the `Date` that measures the server's clock. The same rules as the npm package's
//! `readRateLimits()` (packages/sluice-js/src/headers.js).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use http::HeaderMap;
//! use sluice_http::pace::fields::{read_limits, Family};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut h = HeaderMap::new();
//! h.insert("ratelimit-policy", r#""burst";q=100;w=60, "daily";q=1000;w=86400"#.parse()?);
//! h.insert("ratelimit", r#""burst";r=50;t=30, "daily";r=400;t=36000"#.parse()?);
//! let ietf = read_limits(&h, SystemTime::now(), None);
//! assert_eq!((ietf.family, ietf.limits[1].remaining), (Some(Family::Ietf), Some(400)));
//!
//! let mut h = HeaderMap::new();
//! h.insert("x-ratelimit-remaining-tokens", "149984".parse()?);
//! h.insert("x-ratelimit-reset-tokens", "6m0s".parse()?);
//! assert_eq!(read_limits(&h, SystemTime::now(), None).limits[0].reset, Some(Duration::from_secs(360)));
//!
//! let mut h = HeaderMap::new();
//! h.insert("anthropic-ratelimit-requests-remaining", "49".parse()?);
//! h.insert("anthropic-ratelimit-requests-reset", "2030-01-01T00:00:00Z".parse()?);
//! assert_eq!(read_limits(&h, SystemTime::now(), None).family, Some(Family::Anthropic));
//!
//! // GitHub: the Date field gives the server's clock, the Unix reset is read on it.
//! let mut h = HeaderMap::new();
//! h.insert("date", httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120)).parse()?);
//! h.insert("x-ratelimit-remaining", "4999".parse()?);
//! h.insert("x-ratelimit-resource", "core".parse()?);
//! let github = read_limits(&h, SystemTime::now(), None);
//! assert!(github.skew_ms.unwrap() >= 119_000);
//! # Ok(())
//! # }
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderMap;
use sluice::retry::RetryAfter;

pub use crate::pace::sfv::{parse_list, Item, Member};

/// Which provider's fields a response carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers, 09 to 12).
    Ietf,
    /// `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`, resets as Go durations.
    OpenAi,
    /// `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-*`, RFC 3339 resets.
    Anthropic,
    /// `x-ratelimit-{limit,remaining,reset,used,resource}`, Unix-time resets.
    GitHub,
}

impl Family {
    /// The name used in limit keys: `ietf`, `openai`, `anthropic`, `github`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ietf => "ietf",
            Family::OpenAi => "openai",
            Family::Anthropic => "anthropic",
            Family::GitHub => "github",
        }
    }
}

/// One limit a server announced. Times are from the moment the response was read.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerLimit {
    /// The policy's name, the kind (`requests`, `tokens`, ...) or the GitHub resource.
    pub id: String,
    /// What it counts: `requests`, `tokens`, `input-tokens`, `output-tokens`, or an IETF `qu`.
    pub unit: String,
    /// The quota, when said.
    pub limit: Option<u64>,
    /// The window, when said (IETF `w`).
    pub window: Option<Duration>,
    /// What is left, when said.
    pub remaining: Option<u64>,
    /// The time until the quota is full again, when said.
    pub reset: Option<Duration>,
    /// Whether the server refills it evenly until it is full at the reset (OpenAI,
    /// Anthropic), rather than all at once (GitHub, and the IETF fields, which do not say).
    pub continuous: bool,
}

/// Everything a response says about its limits.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reading {
    /// The first family whose fields are there (IETF, OpenAI, Anthropic, GitHub), if any.
    pub family: Option<Family>,
    /// Its limits.
    pub limits: Vec<ServerLimit>,
    /// `Retry-After`, if valid.
    pub retry_after: Option<Duration>,
    /// Server clock minus local clock in ms, the estimate after this response's `Date`.
    pub skew_ms: Option<i64>,
}

fn text<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn count(value: Option<&str>) -> Option<u64> {
    let t = value?.trim();
    if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    t.parse().ok()
}

/// The IETF fields: each `RateLimit` member naming a policy (String or Token) with a whole
/// `r` is a limit, with `t`, and the policy's `q`, `w` and `qu` when valid; members are joined
/// by name and partition key (`pk`). A policy without a `RateLimit` member has no remaining.
pub fn parse_ietf(policy: Option<&str>, ratelimit: Option<&str>) -> Vec<ServerLimit> {
    fn name(m: &Member) -> Option<String> {
        match &m.item {
            Item::String(s) | Item::Token(s) => Some(s.clone()),
            _ => None,
        }
    }
    fn key(name: &str, m: &Member) -> String {
        match m.param("pk") {
            Some(Item::Bytes(b)) => format!("{name}|{b}"),
            _ => name.to_owned(),
        }
    }
    let mut out: Vec<(String, ServerLimit)> = Vec::new();
    for m in policy.and_then(parse_list).unwrap_or_default() {
        let (Some(n), Some(q)) = (name(&m), m.count("q")) else {
            continue;
        };
        let unit = match m.param("qu") {
            Some(Item::String(u)) => u.clone(),
            _ => "requests".to_owned(),
        };
        let limit = ServerLimit {
            id: n.clone(),
            unit,
            limit: Some(q),
            window: m.count("w").map(Duration::from_secs),
            remaining: None,
            reset: None,
            continuous: false,
        };
        out.push((key(&n, &m), limit));
    }
    for m in ratelimit.and_then(parse_list).unwrap_or_default() {
        let (Some(n), Some(r)) = (name(&m), m.count("r")) else {
            continue;
        };
        let k = key(&n, &m);
        let i = match out.iter().position(|(key, _)| *key == k) {
            Some(i) => i,
            None => {
                out.push((
                    k,
                    ServerLimit {
                        id: n,
                        unit: "requests".to_owned(),
                        limit: None,
                        window: None,
                        remaining: None,
                        reset: None,
                        continuous: false,
                    },
                ));
                out.len() - 1
            }
        };
        out[i].1.remaining = Some(r);
        out[i].1.reset = m.count("t").map(Duration::from_secs);
    }
    out.into_iter().map(|(_, l)| l).collect()
}

// === Durations and times ===

/// A Go duration (OpenAI's resets: `6m0s`, `1s`, `12ms`, `1h2m3.5s`); a bare number is seconds.
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let s = text.trim();
    if s.is_empty() {
        return None;
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return s
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map(Duration::from_secs_f64);
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter(|&n| n > 0)?;
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let units: [(&str, f64); 8] = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("μs", 1e-6),
            ("ms", 1e-3),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
        ];
        let (unit, scale) = units.iter().find(|(u, _)| rest.starts_with(u))?;
        total += value * scale;
        rest = &rest[unit.len()..];
    }
    Some(Duration::from_secs_f64(total))
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

/// An RFC 3339 time (`2026-12-06T17:00:01Z`, `...T18:00:00.5+01:00`) in ms since 1970.
pub fn parse_rfc3339(text: &str) -> Option<i64> {
    let b = text.trim().as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(part).ok()?.parse().ok()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d, h, mi, s) = (
        num(0..4)?,
        num(5..7)?,
        num(8..10)?,
        num(11..13)?,
        num(14..16)?,
        num(17..19)?,
    );
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        let frac: String = std::str::from_utf8(&b[start..i])
            .ok()?
            .chars()
            .chain("000".chars())
            .take(3)
            .collect();
        ms = frac.parse().ok()?;
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        c @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let v = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
            if *c == b'-' {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s - offset_min * 60;
    Some(secs * 1000 + ms)
}

fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// From 10^9 up, a reset is a Unix time in seconds (September 2001).
const UNIX_TIME_FROM: f64 = 1e9;

/// The skew estimate after a `Date` field: the largest sample (server minus local, a lower
/// bound: `Date` is whole seconds rounded down), unless a sample is more than 2 s below it.
pub fn measure_skew(date: Option<&str>, now: SystemTime, previous: Option<i64>) -> Option<i64> {
    let Some(server) = date.and_then(|d| httpdate::parse_http_date(d.trim()).ok()) else {
        return previous;
    };
    let sample = unix_ms(server) - unix_ms(now);
    match previous {
        Some(p) if sample <= p && sample >= p - 2000 => Some(p),
        _ => Some(sample),
    }
}

/// Reads a response's fields at local wall time `now`, with the skew estimate so far.
pub fn read_limits(headers: &HeaderMap, now: SystemTime, skew_ms: Option<i64>) -> Reading {
    let skew_ms = measure_skew(text(headers, "date"), now, skew_ms);
    let server_now = unix_ms(now) + skew_ms.unwrap_or(0);
    let retry_after = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| RetryAfter::parse_bytes(v.as_bytes()).ok())
        .map(|after| match after {
            // An HTTP date is the server's clock: read it against the skew-corrected local clock.
            RetryAfter::Delay(d) => d,
            RetryAfter::At(at) => Duration::from_millis((unix_ms(at) - server_now).max(0) as u64),
        });
    let mut reading = Reading {
        family: None,
        limits: Vec::new(),
        retry_after,
        skew_ms,
    };
    let (rl, rp) = (
        text(headers, "ratelimit"),
        text(headers, "ratelimit-policy"),
    );
    if rl.is_some() || rp.is_some() {
        reading.limits = parse_ietf(rp, rl);
        if !reading.limits.is_empty() {
            reading.family = Some(Family::Ietf);
        }
        return reading;
    }
    if headers.contains_key("x-ratelimit-remaining-requests")
        || headers.contains_key("x-ratelimit-remaining-tokens")
    {
        reading.family = Some(Family::OpenAi);
        for unit in ["requests", "tokens"] {
            let Some(remaining) = count(text(headers, &format!("x-ratelimit-remaining-{unit}")))
            else {
                continue;
            };
            reading.limits.push(ServerLimit {
                id: unit.to_owned(),
                unit: unit.to_owned(),
                limit: count(text(headers, &format!("x-ratelimit-limit-{unit}"))),
                window: None,
                remaining: Some(remaining),
                reset: text(headers, &format!("x-ratelimit-reset-{unit}"))
                    .and_then(parse_go_duration),
                continuous: true,
            });
        }
        return reading;
    }
    if ["requests", "tokens", "input-tokens"]
        .iter()
        .any(|u| headers.contains_key(format!("anthropic-ratelimit-{u}-remaining").as_str()))
    {
        reading.family = Some(Family::Anthropic);
        for unit in ["requests", "tokens", "input-tokens", "output-tokens"] {
            let Some(remaining) = count(text(
                headers,
                &format!("anthropic-ratelimit-{unit}-remaining"),
            )) else {
                continue;
            };
            let at =
                text(headers, &format!("anthropic-ratelimit-{unit}-reset")).and_then(parse_rfc3339);
            reading.limits.push(ServerLimit {
                id: unit.to_owned(),
                unit: unit.to_owned(),
                limit: count(text(headers, &format!("anthropic-ratelimit-{unit}-limit"))),
                window: None,
                remaining: Some(remaining),
                reset: at.map(|at| Duration::from_millis((at - server_now).max(0) as u64)),
                continuous: true,
            });
        }
        return reading;
    }
    if let Some(remaining) = count(text(headers, "x-ratelimit-remaining")) {
        let reset = text(headers, "x-ratelimit-reset")
            .and_then(|r| r.trim().parse::<f64>().ok())
            .filter(|v| *v >= 0.0 && v.is_finite());
        let reset = reset.map(|v| {
            if v >= UNIX_TIME_FROM {
                Duration::from_millis(((v * 1000.0) as i64 - server_now).max(0) as u64)
            } else {
                Duration::from_secs_f64(v)
            }
        });
        let used = count(text(headers, "x-ratelimit-used"));
        let limit = count(text(headers, "x-ratelimit-limit")).or(used.map(|u| u + remaining));
        let id = text(headers, "x-ratelimit-resource")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .unwrap_or("default");
        reading.family = Some(Family::GitHub);
        reading.limits.push(ServerLimit {
            id: id.to_owned(),
            unit: "requests".to_owned(),
            limit,
            window: None,
            remaining: Some(remaining),
            reset,
            continuous: false,
        });
    }
    reading
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn ietf_fields_join_by_name_and_partition_key() {
        let l = parse_ietf(
            Some(r#""burst";q=10;w=1, "daily";q=1000;w=86400"#),
            Some(r#""daily";r=400;t=36000, "burst";r=3;t=1"#),
        );
        assert_eq!(l.len(), 2);
        assert_eq!(
            (l[0].id.as_str(), l[0].remaining, l[0].reset),
            ("burst", Some(3), Some(Duration::from_secs(1)))
        );
        assert_eq!(
            (l[1].limit, l[1].window, l[1].remaining),
            (Some(1000), Some(Duration::from_secs(86400)), Some(400))
        );
        let pk = parse_ietf(
            Some(r#""p";q=5;pk=:AQ==:, "p";q=9;pk=:Ag==:"#),
            Some(r#""p";r=1;pk=:Ag==:"#),
        );
        assert_eq!(
            pk.iter().find(|l| l.limit == Some(9)).unwrap().remaining,
            Some(1)
        );
        let skipped = parse_ietf(
            Some(r#""a";w=5, "b";q=-1, "c";q=2.5, "d";q=4;qu="content-bytes""#),
            Some(r#""d";r=1.5"#),
        );
        assert_eq!(skipped.len(), 1);
        assert_eq!(
            (skipped[0].unit.as_str(), skipped[0].remaining),
            ("content-bytes", None)
        );
        // Not a List: ignored whole.
        assert_eq!(
            parse_ietf(None, Some("limit=100, remaining=50, reset=5")),
            vec![]
        );
    }

    #[test]
    fn go_durations_and_rfc3339() {
        for (t, ms) in [
            ("6m0s", 360_000.0),
            ("1s", 1000.0),
            ("12ms", 12.0),
            ("1.5s", 1500.0),
            ("1h2m3.5s", 3_723_500.0),
            ("0s", 0.0),
            ("7", 7000.0),
        ] {
            assert!(
                (parse_go_duration(t).unwrap().as_secs_f64() * 1000.0 - ms).abs() < 1e-6,
                "{t}"
            );
        }
        for bad in ["", "s", "1x", "-1s", "1s2"] {
            assert_eq!(parse_go_duration(bad), None, "{bad}");
        }
        assert_eq!(parse_rfc3339("1970-01-01T00:00:01Z"), Some(1000));
        assert_eq!(
            parse_rfc3339("2026-12-06T17:00:00Z"),
            Some(1_796_576_400_000)
        );
        assert_eq!(
            parse_rfc3339("2026-12-06T18:00:00.5+01:00"),
            Some(1_796_576_400_500)
        );
        assert_eq!(parse_rfc3339("tomorrow"), None);
    }

    #[test]
    fn providers_and_skew() {
        let now = UNIX_EPOCH + Duration::from_secs(1_796_576_400);
        let openai = read_limits(
            &headers(&[
                ("x-ratelimit-limit-requests", "60"),
                ("x-ratelimit-remaining-requests", "59"),
                ("x-ratelimit-reset-requests", "1s"),
                ("x-ratelimit-remaining-tokens", "149984"),
                ("x-ratelimit-reset-tokens", "6m0s"),
            ]),
            now,
            None,
        );
        assert_eq!(openai.family, Some(Family::OpenAi));
        assert_eq!(
            (
                openai.limits[1].id.as_str(),
                openai.limits[1].remaining,
                openai.limits[1].reset
            ),
            ("tokens", Some(149_984), Some(Duration::from_secs(360)))
        );
        // GitHub: the server's clock 37 s ahead, its reset 600 s after its now.
        let server = 1_796_576_437u64;
        let date = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(server));
        let reset = (server + 600).to_string();
        let gh = read_limits(
            &headers(&[
                ("date", &date),
                ("x-ratelimit-remaining", "4999"),
                ("x-ratelimit-used", "1"),
                ("x-ratelimit-reset", &reset),
                ("x-ratelimit-resource", "core"),
            ]),
            now,
            None,
        );
        assert_eq!(gh.skew_ms, Some(37_000));
        assert_eq!(
            gh.limits[0],
            ServerLimit {
                id: "core".into(),
                unit: "requests".into(),
                limit: Some(5000),
                window: None,
                remaining: Some(4999),
                reset: Some(Duration::from_secs(600)),
                continuous: false
            }
        );
        let anthropic = read_limits(
            &headers(&[
                ("anthropic-ratelimit-requests-remaining", "49"),
                ("anthropic-ratelimit-requests-limit", "50"),
                ("anthropic-ratelimit-requests-reset", "2026-12-06T17:00:03Z"),
            ]),
            now,
            Some(0),
        );
        assert_eq!(
            (anthropic.family, anthropic.limits[0].reset),
            (Some(Family::Anthropic), Some(Duration::from_secs(3)))
        );
        let ra = read_limits(
            &headers(&[("retry-after", "7"), ("ratelimit", r#""p";r=0"#)]),
            now,
            None,
        );
        assert_eq!(
            (ra.retry_after, ra.family),
            (Some(Duration::from_secs(7)), Some(Family::Ietf))
        );
        assert_eq!(measure_skew(Some("not a date"), now, Some(5)), Some(5));
    }
}
