//! The answers the gateway writes itself once a request is routed: refusals (a problem body,
//! or a gRPC status), 413, and what an upstream's failure becomes (502, 503, 504, 408, 400),
//! each counted in the route's metrics; and the outcome of an upstream's answer.

use bytes::Bytes;
use http::header::{HeaderValue, CONNECTION, RETRY_AFTER};
use http::{Response, StatusCode};
use http_body_util::Full;

use super::Outcome;
use crate::admit::Reason;
use crate::body::BodyError;
use crate::grpc;
use crate::headers;
use crate::protocol::Protocol;
use crate::proxy::ProxyError;
use crate::route::Route;

/// The outcome of an upstream answer with `status`, counted in the route's metrics.
pub(crate) fn answered<'a>(
    route: &'a Route,
    shadow_denied: &[(usize, Reason)],
    status: StatusCode,
    protocol: Protocol,
) -> Outcome<'a> {
    route.metrics.status(status, protocol);
    match shadow_denied.first() {
        None => Outcome::Admitted,
        Some(&(i, reason)) => Outcome::ShadowDenied {
            policy: route.policy_list()[i].name(),
            reason,
        },
    }
}

/// The gateway's answer to a request it could not forward, counted in the route's metrics.
pub(crate) fn failure(
    route: &Route,
    protocol: Protocol,
    e: &ProxyError,
) -> (Response<Full<Bytes>>, Outcome<'static>) {
    match e {
        ProxyError::Timeout(_) | ProxyError::ConnectTimeout(_) => {
            route.metrics.timeout[protocol as usize].increment(1);
            let r = refusal(
                protocol,
                StatusCode::GATEWAY_TIMEOUT,
                "the upstream did not answer in time",
            );
            (r, Outcome::UpstreamTimeout)
        }
        ProxyError::Budget(why) => {
            tracing::debug!(route = route.path_prefix(), "{why}");
            let mut r = refusal(
                protocol,
                StatusCode::SERVICE_UNAVAILABLE,
                "the gateway has no upstream connection to spare",
            );
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            (r, Outcome::UpstreamBusy)
        }
        e if e.body_error().is_some() || e.is_client_body() => {
            let (status, outcome, detail) = match e.body_error() {
                Some(BodyError::TooLarge(_)) => (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    Outcome::BodyTooLarge,
                    "the request body is larger than this route accepts",
                ),
                Some(BodyError::Stalled(_)) => (
                    StatusCode::REQUEST_TIMEOUT,
                    Outcome::BodyTimeout,
                    "the request body stalled",
                ),
                None => (
                    StatusCode::BAD_REQUEST,
                    Outcome::BodyFailed,
                    "the request body could not be read",
                ),
            };
            match outcome {
                Outcome::BodyTooLarge => {
                    route.metrics.body_too_large[protocol as usize].increment(1)
                }
                Outcome::BodyTimeout => route.metrics.body_timeout[protocol as usize].increment(1),
                _ => {}
            }
            let mut r = refusal(protocol, status, detail);
            r.headers_mut()
                .insert(CONNECTION, HeaderValue::from_static("close"));
            (r, outcome)
        }
        e => {
            if e.is_connect() {
                route.metrics.refused[protocol as usize].increment(1);
            } else {
                route.metrics.other[protocol as usize].increment(1);
            }
            if e.is_tls() {
                // A certificate the route does not trust is a configuration problem
                // someone must see, not noise.
                tracing::warn!(error = %e, upstream = %route.upstream(), route = route.path_prefix(), "upstream TLS failed");
            } else {
                tracing::debug!(error = %e, route = route.path_prefix(), "upstream failed");
            }
            let r = refusal(
                protocol,
                StatusCode::BAD_GATEWAY,
                "the upstream refused the connection or failed",
            );
            (r, Outcome::UpstreamRefused)
        }
    }
}

/// The gateway's own answer of `status`: a problem body, or for gRPC a Trailers-Only
/// response with the matching `grpc-status` ([`grpc::problem`]).
pub(super) fn refusal(
    protocol: Protocol,
    status: StatusCode,
    detail: &str,
) -> Response<Full<Bytes>> {
    if protocol == Protocol::Grpc {
        grpc::problem(status, detail)
    } else {
        headers::problem(status, detail)
    }
}

/// 413 for a body larger than `max_body`; the connection closes, since the body is not read.
pub(super) fn too_large(protocol: Protocol, max_body: u64) -> Response<Full<Bytes>> {
    let mut r = refusal(
        protocol,
        StatusCode::PAYLOAD_TOO_LARGE,
        &format!("the request body is larger than this route accepts ({max_body} bytes)"),
    );
    r.headers_mut()
        .insert(CONNECTION, HeaderValue::from_static("close"));
    r
}
