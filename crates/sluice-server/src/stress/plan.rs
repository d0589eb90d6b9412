//! What to send: the URL, method and headers, the rate, the duration and the concurrency
//! bound, validated from the command line.

use std::time::Duration;

use http::header::{HeaderName, HeaderValue, HOST};
use http::{HeaderMap, Method, Uri};
use sluice_core::Rate;

use crate::config::units::parse_duration;

/// The most requests one run may send.
pub const MAX_REQUESTS: u64 = 10_000_000;

/// A validated load plan.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The target (`http://` only).
    pub url: Uri,
    /// The method.
    pub method: Method,
    /// Extra request headers.
    pub headers: HeaderMap,
    /// Nanoseconds between two sends.
    pub interval_ns: u64,
    /// How long to send for.
    pub duration: Duration,
    /// The most requests in flight at once.
    pub concurrency: usize,
    /// How long one request may take before it counts as a `timeout` error.
    pub timeout: Duration,
}

impl Plan {
    /// Requests the plan sends: one every interval from time 0, while before the duration.
    pub fn requests(&self) -> u64 {
        let d = u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX);
        d.div_ceil(self.interval_ns)
    }

    /// The rate as a person reads it: `50/s`, `2.5/s`.
    pub fn rate_text(&self) -> String {
        let per_s = 1e9 / self.interval_ns as f64;
        let s = format!("{per_s:.3}");
        format!("{}/s", s.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// Reads a URL: `http://HOST[:PORT][/PATH][?QUERY]`.
///
/// # Errors
///
/// A message for anything else (https included: the tool speaks plain HTTP/1.1).
pub fn parse_url(text: &str) -> Result<Uri, String> {
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("cannot read `{text}` as a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(format!(
                "`{text}`: https is not supported: sluice stress speaks plain HTTP/1.1 (put it in front of the TLS terminator's upstream)"
            ))
        }
        _ => return Err(format!("`{text}` is not an http:// URL")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` has no host"));
    }
    if uri.path_and_query().is_none() {
        let mut parts = uri.into_parts();
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
        return Uri::from_parts(parts).map_err(|e| e.to_string());
    }
    Ok(uri)
}

/// Reads a rate: a number per second (`50`, `2.5`) or a rate as in the config (`50/s`,
/// `3000/min`).
///
/// # Errors
///
/// A message naming the forms.
pub fn parse_rate(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let rate = if t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        t.parse::<f64>()
            .map_err(|_| format!("cannot read `{text}` as a rate"))
            .and_then(|r| Rate::from_per_second_f64(r).map_err(|e| e.to_string()))
    } else {
        t.parse::<Rate>().map_err(|e| e.to_string())
    };
    rate.map(|r| r.interval_ns())
        .map_err(|e| format!("--rate `{text}`: {e} (e.g. `50`, `50/s`, `3000/min`)"))
}

/// Reads a duration as in the config (`10s`, `500ms`, `1.5min`), longer than zero.
///
/// # Errors
///
/// A message naming the forms.
pub fn parse_positive_duration(flag: &str, text: &str) -> Result<Duration, String> {
    match parse_duration(text) {
        Ok(d) if d.is_zero() => Err(format!("{flag} `{text}` must be longer than zero")),
        Ok(d) => Ok(d),
        Err(e) => Err(format!("{flag}: {e}")),
    }
}

/// Reads `Name: value` into `headers`.
///
/// # Errors
///
/// A message for a missing colon, a bad name or value, or a `Host` header (the URL sets it).
pub fn add_header(headers: &mut HeaderMap, text: &str) -> Result<(), String> {
    let Some((name, value)) = text.split_once(':') else {
        return Err(format!(
            "--header `{text}`: expected `Name: value`, as in `X-Api-Key: k1`"
        ));
    };
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("--header `{text}`: `{}` is not a header name", name.trim()))?;
    if name == HOST {
        return Err(format!("--header `{text}`: Host comes from the URL"));
    }
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("--header `{text}`: the value is not a valid header value"))?;
    headers.append(name, value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(parse_url("http://127.0.0.1:8080").unwrap().path(), "/");
        assert_eq!(
            parse_url("http://127.0.0.1:8080/api/x?a=1")
                .unwrap()
                .path_and_query()
                .unwrap()
                .as_str(),
            "/api/x?a=1"
        );
        assert!(parse_url("https://example.invalid/")
            .unwrap_err()
            .contains("https is not supported"));
        assert!(parse_url("127.0.0.1:8080/x").is_err());
        assert!(parse_url("ftp://x/").is_err());
        assert!(parse_url("http:///x").is_err());
    }

    #[test]
    fn rates_durations_headers() {
        assert_eq!(parse_rate("50"), Ok(20_000_000));
        assert_eq!(parse_rate("50/s"), Ok(20_000_000));
        assert_eq!(parse_rate("2.5"), Ok(400_000_000));
        assert_eq!(parse_rate("600/min"), Ok(100_000_000));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").unwrap_err().contains("--rate `fast`"));
        assert_eq!(
            parse_positive_duration("--duration", "2s"),
            Ok(Duration::from_secs(2))
        );
        assert!(parse_positive_duration("--duration", "0s").is_err());
        assert!(parse_positive_duration("--duration", "2").is_err());
        let mut h = HeaderMap::new();
        add_header(&mut h, "X-Api-Key: k1").unwrap();
        add_header(&mut h, "x-api-key:k2").unwrap();
        assert_eq!(h.get_all("x-api-key").iter().count(), 2);
        assert!(add_header(&mut h, "nocolon").is_err());
        assert!(add_header(&mut h, "bad name: v").is_err());
        assert!(add_header(&mut h, "Host: x").is_err());
        assert!(add_header(&mut h, "X: a\u{1}b").is_err());
    }

    #[test]
    fn counts() {
        let plan = Plan {
            url: parse_url("http://127.0.0.1:1/").unwrap(),
            method: Method::GET,
            headers: HeaderMap::new(),
            interval_ns: 20_000_000,
            duration: Duration::from_secs(2),
            concurrency: 1,
            timeout: Duration::from_secs(1),
        };
        assert_eq!(plan.requests(), 100);
        assert_eq!(plan.rate_text(), "50/s");
    }
}
