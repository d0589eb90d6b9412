//! gRPC answers for what the gateway refuses: a request whose `content-type` is gRPC's
//! ([`Protocol::Grpc`](crate::protocol::Protocol)) gets, instead of a problem body, a "Trailers-Only"
//! response a gRPC client reads as a status: HTTP 200, `content-type: application/grpc`, an
//! empty body, and `grpc-status`, `grpc-message` (percent-encoded) and, when a retry makes
//! sense, `grpc-retry-pushback-ms` (the wait gRPC's retry policy honours, gRFC A6) in the
//! headers, beside the RateLimit fields.
//!
//! | gateway answer | `grpc-status` | `grpc-retry-pushback-ms` |
//! |---|---|---|
//! | 429 denied (`limit`, `queue_full`, `timeout`) | 8 `RESOURCE_EXHAUSTED` | the wait, in ms |
//! | 422 cost above the capacity | 8 `RESOURCE_EXHAUSTED` | `-1` (never retry) |
//! | 503 limit store unavailable | 14 `UNAVAILABLE` | the wait, in ms |
//! | 400 ambiguous key | 3 `INVALID_ARGUMENT` | none |
//! | 502 upstream refused or failed, 504 upstream timeout | 14 `UNAVAILABLE` | none |
//! | 413 body above `max_body` | 8 `RESOURCE_EXHAUSTED` | `-1` (never retry) |
//! | 408 body stalled | 4 `DEADLINE_EXCEEDED` | none |
//! | 404 no route, 405 method not allowed | 12 `UNIMPLEMENTED` | none |
//! | 400 otherwise (ambiguous path, broken body) | 13 `INTERNAL` | none |
//!
//! The upstream's own responses (and their trailers) pass through untouched.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};
use http_body_util::Full;

use crate::admit::{Denial, Reason};
use crate::headers;
use crate::policy::Policy;

/// `grpc-status`.
pub static GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-message`.
pub static GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
/// `grpc-retry-pushback-ms`.
pub static GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");
/// `application/grpc`.
pub static APPLICATION_GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// The gRPC status codes the gateway answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Code {
    /// 2.
    Unknown = 2,
    /// 3.
    InvalidArgument = 3,
    /// 4.
    DeadlineExceeded = 4,
    /// 8.
    ResourceExhausted = 8,
    /// 12.
    Unimplemented = 12,
    /// 13.
    Internal = 13,
    /// 14.
    Unavailable = 14,
}

impl Code {
    /// The code for a gateway answer of `status` (see the [module docs](self)).
    pub fn for_status(status: StatusCode) -> Code {
        match status.as_u16() {
            400 => Code::Internal,
            404 | 405 => Code::Unimplemented,
            408 => Code::DeadlineExceeded,
            413 | 422 | 429 => Code::ResourceExhausted,
            502..=504 => Code::Unavailable,
            _ => Code::Unknown,
        }
    }

    /// The code for a denial of `reason`.
    pub fn for_reason(reason: Reason) -> Code {
        match reason {
            Reason::Limit | Reason::QueueFull | Reason::Timeout | Reason::Capacity => {
                Code::ResourceExhausted
            }
            Reason::Unavailable => Code::Unavailable,
            Reason::AmbiguousKey => Code::InvalidArgument,
        }
    }

    /// The `grpc-status` value.
    pub fn header(self) -> HeaderValue {
        headers::number_header(self as u64)
    }
}

/// What `grpc-retry-pushback-ms` tells a client with a retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// Retry after this long (whole milliseconds, rounded up).
    After(Duration),
    /// Do not retry (`-1`).
    Never,
}

impl Pushback {
    fn header(self) -> HeaderValue {
        match self {
            Pushback::After(wait) => {
                let ms = u64::try_from(wait.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
                headers::number_header(ms)
            }
            Pushback::Never => HeaderValue::from_static("-1"),
        }
    }
}

/// The `content-type` of the gateway's answers to a gRPC-Web request whose `content-type` is
/// `value`: the request's own (`application/grpc-web+proto`, `application/grpc-web-text`,
/// ...), without parameters; `None` for native gRPC. gRPC-Web clients read a Trailers-Only
/// answer's status from its headers, in their own content type.
///
/// # Examples
///
/// ```
/// use sluice_http::grpc::web_content_type;
///
/// assert_eq!(web_content_type(b"application/grpc-web-text+proto; charset=x").unwrap(), "application/grpc-web-text+proto");
/// assert_eq!(web_content_type(b"application/grpc+proto"), None);
/// ```
pub fn web_content_type(value: &[u8]) -> Option<HeaderValue> {
    const WEB: &[u8] = b"application/grpc-web";
    if value.len() < WEB.len() || !value[..WEB.len()].eq_ignore_ascii_case(WEB) {
        return None;
    }
    let end = value.iter().position(|&b| b == b';').unwrap_or(value.len());
    let kind = value[..end].trim_ascii();
    if !matches!(kind.get(WEB.len()), None | Some(b'+' | b'-')) {
        return None;
    }
    HeaderValue::from_bytes(&kind.to_ascii_lowercase()).ok()
}

/// A Trailers-Only response: 200, `content-type: application/grpc`, an empty body, and the
/// status in the headers.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice_http::grpc::{trailers_only, Code, Pushback};
///
/// let r = trailers_only(Code::ResourceExhausted, "slow down: 50%", Some(Pushback::After(Duration::from_micros(1500))));
/// assert_eq!(r.status(), 200);
/// assert_eq!(r.headers()["grpc-status"], "8");
/// assert_eq!(r.headers()["grpc-message"], "slow down: 50%25");
/// assert_eq!(r.headers()["grpc-retry-pushback-ms"], "2");
/// ```
pub fn trailers_only(
    code: Code,
    message: &str,
    pushback: Option<Pushback>,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, APPLICATION_GRPC.clone());
    h.insert(GRPC_STATUS.clone(), code.header());
    if let Ok(message) = HeaderValue::from_maybe_shared(percent_encode(message)) {
        h.insert(GRPC_MESSAGE.clone(), message);
    }
    if let Some(pushback) = pushback {
        h.insert(GRPC_RETRY_PUSHBACK_MS.clone(), pushback.header());
    }
    response
}

/// The gRPC answer to a denied request: the status of its reason, a message naming the
/// policy and the wait, the pushback, and the RateLimit fields.
pub fn denied(
    denial: &Denial,
    policies: &[Arc<Policy>],
    policy: Option<&HeaderValue>,
) -> Response<Full<Bytes>> {
    let reason = denial.reason;
    let pushback = match reason {
        Reason::Limit | Reason::QueueFull | Reason::Timeout | Reason::Unavailable => {
            Some(Pushback::After(denial.retry_after))
        }
        Reason::Capacity => Some(Pushback::Never),
        Reason::AmbiguousKey => None,
    };
    let what = match reason {
        Reason::Limit => "rate limit exhausted",
        Reason::QueueFull => "too many requests are already waiting",
        Reason::Timeout => "the wait for a turn would exceed the maximum wait",
        Reason::Capacity => "the cost exceeds the capacity and can never be admitted",
        Reason::Unavailable => "the limit store is unavailable",
        Reason::AmbiguousKey => "the policy's key appears more than once with different values",
    };
    let mut num = itoa::Buffer::new();
    let mut message = String::with_capacity(96);
    message.push_str("sluice: ");
    message.push_str(what);
    message.push_str(" (policy ");
    message.push_str(denial.policy(policies).name());
    message.push_str(", reason ");
    message.push_str(reason.as_str());
    if pushback.is_some_and(|p| p != Pushback::Never) {
        message.push_str(", retry after ");
        message.push_str(num.format(denial.retry_after_ms()));
        message.push_str(" ms");
    }
    message.push(')');
    let mut response = trailers_only(Code::for_reason(reason), &message, pushback);
    headers::insert(response.headers_mut(), policy, policies, &denial.verdicts);
    response
}

/// The gRPC answer for a gateway answer of `status` with `detail` (see the
/// [module docs](self)).
pub fn problem(status: StatusCode, detail: &str) -> Response<Full<Bytes>> {
    let code = Code::for_status(status);
    let pushback = matches!(status.as_u16(), 413 | 422).then_some(Pushback::Never);
    let mut message = String::with_capacity(16 + detail.len());
    message.push_str("sluice: ");
    message.push_str(detail);
    message.push_str(" (");
    message.push_str(itoa::Buffer::new().format(status.as_u16()));
    message.push(')');
    trailers_only(code, &message, pushback)
}

/// `grpc-message` encoding: every byte outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(text: &str) -> Bytes {
    if text.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'%') {
        return Bytes::copy_from_slice(text.as_bytes());
    }
    let mut out = Vec::with_capacity(text.len() + 8);
    for b in text.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b);
        } else {
            out.extend_from_slice(format!("%{b:02X}").as_bytes());
        }
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::Verdict;
    use sluice_core::{AnyAlgorithm, Kind, Quota};

    fn policy() -> Arc<Policy> {
        Arc::new(
            Policy::builder(
                "api",
                AnyAlgorithm::new(Kind::Gcra, Quota::parse(10, "5/s").unwrap()),
            )
            .build()
            .unwrap(),
        )
    }

    fn denial(reason: Reason, ms: u64) -> Denial {
        let mut verdicts = crate::admit::Verdicts::new();
        verdicts.push(Verdict {
            index: 0,
            remaining: 0,
            reset_after_ns: 2_000_000_000,
        });
        Denial {
            index: 0,
            reason,
            retry_after: Duration::from_millis(ms),
            verdicts,
        }
    }

    #[test]
    fn a_limited_call_is_resource_exhausted_with_the_wait_as_pushback() {
        let policies = [policy()];
        let header = headers::policy_header(&policies);
        let r = denied(&denial(Reason::Limit, 1234), &policies, header.as_ref());
        assert_eq!(r.status(), StatusCode::OK);
        let h = r.headers();
        assert_eq!(h[CONTENT_TYPE], "application/grpc");
        assert_eq!(h["grpc-status"], "8");
        assert_eq!(h["grpc-retry-pushback-ms"], "1234");
        assert_eq!(
            h["grpc-message"],
            "sluice: rate limit exhausted (policy api, reason limit, retry after 1234 ms)"
        );
        assert_eq!(h["ratelimit-policy"], r#""api";q=10;w=2"#);
        assert_eq!(h["ratelimit"], r#""api";r=0;t=2"#);
        assert!(!h.contains_key("retry-after"));
        assert!(http_body::Body::is_end_stream(r.body()));
    }

    #[test]
    fn each_reason_has_its_code_and_pushback() {
        let policies = [policy()];
        let cases = [
            (Reason::QueueFull, "8", Some("5")),
            (Reason::Timeout, "8", Some("5")),
            (Reason::Capacity, "8", Some("-1")),
            (Reason::Unavailable, "14", Some("5")),
            (Reason::AmbiguousKey, "3", None),
        ];
        for (reason, code, pushback) in cases {
            let r = denied(&denial(reason, 5), &policies, None);
            let h = r.headers();
            assert_eq!(h["grpc-status"], code, "{reason:?}");
            assert_eq!(
                h.get("grpc-retry-pushback-ms").map(|v| v.to_str().unwrap()),
                pushback,
                "{reason:?}"
            );
        }
    }

    #[test]
    fn gateway_statuses_map_to_grpc_codes() {
        let cases = [
            (StatusCode::BAD_GATEWAY, 14, None),
            (StatusCode::GATEWAY_TIMEOUT, 14, None),
            (StatusCode::PAYLOAD_TOO_LARGE, 8, Some("-1")),
            (StatusCode::REQUEST_TIMEOUT, 4, None),
            (StatusCode::NOT_FOUND, 12, None),
            (StatusCode::METHOD_NOT_ALLOWED, 12, None),
            (StatusCode::BAD_REQUEST, 13, None),
            (StatusCode::IM_A_TEAPOT, 2, None),
        ];
        for (status, code, pushback) in cases {
            let r = problem(status, "the upstream did not answer in time");
            assert_eq!(r.status(), StatusCode::OK);
            let h = r.headers();
            assert_eq!(h["grpc-status"], code.to_string().as_str(), "{status}");
            assert_eq!(
                h.get("grpc-retry-pushback-ms").map(|v| v.to_str().unwrap()),
                pushback,
                "{status}"
            );
            assert!(h["grpc-message"]
                .to_str()
                .unwrap()
                .ends_with(&format!("({})", status.as_u16())));
        }
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(&percent_encode("plain text")[..], b"plain text");
        assert_eq!(&percent_encode("100% é\n")[..], b"100%25 %C3%A9%0A");
    }
}
