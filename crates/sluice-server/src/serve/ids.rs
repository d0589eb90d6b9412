//! The identifiers a request carries through the gateway: its request id (kept or made up,
//! forwarded and echoed) and the trace id of its `traceparent`, for the access log.

use http::{HeaderValue, Request};

use crate::runtime::state::Shared;
use sluice_http::h1::X_REQUEST_ID;

/// The trace id of a well-formed W3C `traceparent` (`VERSION-TRACEID-PARENTID-FLAGS`, the
/// trace id 32 lowercase hex digits, not all zero), for the access log; `None` without one.
/// The header itself (and `tracestate`) goes upstream untouched either way.
pub(super) fn trace_id(headers: &http::HeaderMap) -> Option<HeaderValue> {
    let value = headers.get("traceparent")?.as_bytes();
    let id = value.get(3..35)?;
    let well_formed = value.len() >= 55
        && value[2] == b'-'
        && value[35] == b'-'
        && id.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && id.iter().any(|&b| b != b'0');
    well_formed.then(|| HeaderValue::from_bytes(id).ok())?
}

/// The request's id: a well-formed incoming `X-Request-Id` (visible ASCII, at most 64
/// bytes) is kept, anything else replaced; forwarded upstream and echoed in the response.
pub(super) fn request_id<B>(shared: &Shared, req: &mut Request<B>) -> HeaderValue {
    if let Some(v) = req.headers().get(&X_REQUEST_ID) {
        let b = v.as_bytes();
        if !b.is_empty() && b.len() <= 64 && b.iter().all(u8::is_ascii_graphic) {
            return v.clone();
        }
    }
    let id = shared.ids.next();
    req.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
    id
}
