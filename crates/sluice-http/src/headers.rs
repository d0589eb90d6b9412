//! What a limited response says: the IETF RateLimit fields, `Retry-After`, and problem bodies.
//!
//! # The fields (draft-ietf-httpapi-ratelimit-headers-09)
//!
//! Both are structured-field lists with one member per policy of the route, named by a
//! string (the policy's name):
//!
//! ```text
//! RateLimit-Policy: "api";q=10;w=2
//! RateLimit: "api";r=7;t=1
//! ```
//!
//! - `q`: the quota, the policy's capacity (the largest burst).
//! - `w`: the window in seconds, `capacity × interval` rounded up (at least 1): the time an
//!   empty bucket takes to fill (for the window algorithms, the window itself).
//! - `r`: whole tokens remaining after this request.
//! - `t`: seconds until the bucket is full again, rounded up.
//!
//! `RateLimit-Policy` is the same on every response of a route and is rendered once per
//! route. A denied request gets, besides those, `Retry-After` in whole seconds (rounded up,
//! at least 1) and an `application/problem+json` body (RFC 9457) with the members `reason`
//! (`limit`, `queue_full`, `timeout`), `retry_after_ms` and `policy`.

use std::fmt::Write as _;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;

use crate::admit::{Denial, Verdict};
use crate::policy::Policy;

/// `RateLimit-Policy`.
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
/// `application/problem+json`.
pub static PROBLEM_JSON: HeaderValue = HeaderValue::from_static("application/problem+json");

/// The `RateLimit-Policy` value of a route with these policies, or `None` without any.
pub fn policy_header(policies: &[Arc<Policy>]) -> Option<HeaderValue> {
    let mut text = String::new();
    for policy in policies {
        if !text.is_empty() {
            text.push_str(", ");
        }
        text.push_str(policy.policy_item());
    }
    if text.is_empty() {
        return None;
    }
    // Policy names are restricted to token characters, so the value is always valid.
    HeaderValue::from_str(&text).ok()
}

/// The `RateLimit-Policy` value for the request `ask`, when a policy of the route decides it
/// by a quota of its own (a plan, a per-key quota); `None` when the route's value, rendered
/// once, is the request's.
pub fn policy_header_for(
    policies: &[Arc<Policy>],
    ask: &crate::admit::Ask<'_>,
) -> Option<HeaderValue> {
    if !policies.iter().any(|p| p.has_tiers()) {
        return None;
    }
    let mut text = String::new();
    for policy in policies {
        if !text.is_empty() {
            text.push_str(", ");
        }
        match policy.request_key_uncounted(ask.headers, ask.uri, ask.client_ip) {
            Ok(key) => text.push_str(&policy.policy_item_for(&key)),
            Err(_) => text.push_str(policy.policy_item()),
        }
    }
    HeaderValue::from_str(&text).ok()
}

/// The `RateLimit` value for these verdicts about `policies`, or `None` without any.
pub fn ratelimit_header(policies: &[Arc<Policy>], verdicts: &[Verdict]) -> Option<HeaderValue> {
    let mut text = BytesMut::with_capacity(48 * verdicts.len());
    let mut num = itoa::Buffer::new();
    for v in verdicts {
        let Some(policy) = policies.get(v.index) else {
            continue;
        };
        if !text.is_empty() {
            text.extend_from_slice(b", ");
        }
        text.extend_from_slice(b"\"");
        text.extend_from_slice(policy.name().as_bytes());
        text.extend_from_slice(b"\";r=");
        text.extend_from_slice(num.format(v.remaining).as_bytes());
        text.extend_from_slice(b";t=");
        let t = v.reset_after_ns.div_ceil(sluice_core::NANOS_PER_SEC);
        text.extend_from_slice(num.format(t).as_bytes());
    }
    if text.is_empty() {
        return None;
    }
    // Names are token characters and the rest digits: always a valid value.
    HeaderValue::from_maybe_shared(text.freeze()).ok()
}

/// A header value of `n` decimal digits, without allocating for `n < 100`.
pub fn number_header(n: u64) -> HeaderValue {
    match SMALL.get(n as usize) {
        Some(s) => HeaderValue::from_static(s),
        None => HeaderValue::from(n),
    }
}

const SMALL: [&str; 100] = [
    "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16",
    "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32",
    "33", "34", "35", "36", "37", "38", "39", "40", "41", "42", "43", "44", "45", "46", "47", "48",
    "49", "50", "51", "52", "53", "54", "55", "56", "57", "58", "59", "60", "61", "62", "63", "64",
    "65", "66", "67", "68", "69", "70", "71", "72", "73", "74", "75", "76", "77", "78", "79", "80",
    "81", "82", "83", "84", "85", "86", "87", "88", "89", "90", "91", "92", "93", "94", "95", "96",
    "97", "98", "99",
];

/// Adds `RateLimit-Policy` (when given) and `RateLimit` to `headers`.
pub fn insert(
    headers: &mut HeaderMap,
    policy: Option<&HeaderValue>,
    policies: &[Arc<Policy>],
    verdicts: &[Verdict],
) {
    if let Some(policy) = policy {
        headers.insert(RATELIMIT_POLICY.clone(), policy.clone());
    }
    if let Some(value) = ratelimit_header(policies, verdicts) {
        headers.insert(RATELIMIT.clone(), value);
    }
}

/// The response to a denied request: 429 (or 422, 503, 400: see
/// [`Reason::status`](crate::Reason::status)) with `Retry-After` (not for 422 and 400), the
/// RateLimit fields and a problem body.
///
/// # Examples
///
/// ```
/// # use std::{sync::Arc, time::Duration};
/// # use sluice_core::{AnyAlgorithm, Kind, Quota};
/// # use sluice_http::{headers, Denial, Policy, Reason};
/// let policy = Arc::new(Policy::builder("api", AnyAlgorithm::new(Kind::Gcra, Quota::parse(10, "5/s")?)).build()?);
/// let policies = [policy];
/// let denial = Denial { index: 0, reason: Reason::Limit, retry_after: Duration::from_millis(200), verdicts: Default::default() };
/// let response = headers::denied(&denial, &policies, headers::policy_header(&policies).as_ref());
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "1");
/// assert_eq!(response.headers()["ratelimit-policy"], r#""api";q=10;w=2"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn denied(
    denial: &Denial,
    policies: &[Arc<Policy>],
    policy: Option<&HeaderValue>,
) -> Response<Full<Bytes>> {
    let status = denial.reason.status();
    let denier = denial.policy(policies);
    let ambiguous;
    let detail = match denial.reason {
        crate::Reason::Limit => "the rate limit of this policy is exhausted",
        crate::Reason::QueueFull => "too many requests are already waiting",
        crate::Reason::Timeout => "the wait for a turn would exceed the maximum wait",
        crate::Reason::Capacity => "the cost exceeds the capacity and can never be admitted",
        crate::Reason::Unavailable => "the limit store is unavailable",
        crate::Reason::AmbiguousKey => {
            ambiguous = format!(
                "the policy's key `{}` appears more than once with different values",
                denier.key_spec()
            );
            &ambiguous
        }
    };
    let mut num = itoa::Buffer::new();
    let mut body = String::with_capacity(192);
    body.push_str("{\"type\":\"about:blank\",\"title\":\"");
    body.push_str(status.canonical_reason().unwrap_or(""));
    body.push_str("\",\"status\":");
    body.push_str(num.format(status.as_u16()));
    body.push_str(",\"detail\":");
    json_string(&mut body, detail);
    body.push_str(",\"policy\":\"");
    body.push_str(denier.name());
    body.push_str("\",\"reason\":\"");
    body.push_str(denial.reason.as_str());
    body.push_str("\",\"retry_after_ms\":");
    body.push_str(num.format(denial.retry_after_ms()));
    body.push_str("}\n");
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, PROBLEM_JSON.clone());
    // No wait admits a cost above the capacity, nor makes a key unambiguous.
    if !matches!(
        denial.reason,
        crate::Reason::Capacity | crate::Reason::AmbiguousKey
    ) {
        headers.insert(RETRY_AFTER, number_header(denial.retry_after_secs()));
    }
    insert(headers, policy, policies, &denial.verdicts);
    response
}

/// A problem response (RFC 9457) with `status` and a `detail` line.
pub fn problem(status: StatusCode, detail: &str) -> Response<Full<Bytes>> {
    let mut body = String::with_capacity(96 + detail.len());
    let _ = write!(
        body,
        "{{\"type\":\"about:blank\",\"title\":\"{}\",\"status\":{},\"detail\":",
        status.canonical_reason().unwrap_or(""),
        status.as_u16()
    );
    json_string(&mut body, detail);
    body.push_str("}\n");
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, PROBLEM_JSON.clone());
    response
}

/// Appends `text` to `out` as a JSON string.
pub fn json_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{AnyAlgorithm, Kind, Quota};

    #[test]
    fn renders_lists() {
        let a = Arc::new(
            Policy::builder(
                "a",
                AnyAlgorithm::new(Kind::Gcra, Quota::parse(10, "5/s").unwrap()),
            )
            .build()
            .unwrap(),
        );
        let b = Arc::new(
            Policy::builder(
                "b",
                AnyAlgorithm::new(Kind::Gcra, Quota::parse(100, "1/min").unwrap()),
            )
            .build()
            .unwrap(),
        );
        let header = policy_header(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(header, "\"a\";q=10;w=2, \"b\";q=100;w=6000");
        let verdicts = [
            Verdict {
                index: 0,
                remaining: 7,
                reset_after_ns: 600_000_000,
            },
            Verdict {
                index: 1,
                remaining: 0,
                reset_after_ns: 0,
            },
        ];
        assert_eq!(
            ratelimit_header(&[a, b], &verdicts).unwrap(),
            "\"a\";r=7;t=1, \"b\";r=0;t=0"
        );
        assert!(policy_header(&[]).is_none());
    }

    #[test]
    fn problem_escapes() {
        let r = problem(StatusCode::BAD_GATEWAY, "say \"hi\"\n");
        assert_eq!(r.headers()[CONTENT_TYPE], "application/problem+json");
    }
}
