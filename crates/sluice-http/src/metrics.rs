//! The gateway's metric handles, registered once per policy and route through the `metrics`
//! facade (install the recorder first: handles taken before it stay no-ops).
//!
//! | name | kind | labels |
//! |------|------|--------|
//! | `sluice_policy_admitted_total` | counter | `policy`, `protocol` |
//! | `sluice_policy_denied_total` | counter | `policy`, `reason` (`limit`, `queue_full`, `timeout`, `capacity`, `unavailable`, `ambiguous_key`), `protocol` |
//! | `sluice_policy_waiting` | gauge | `policy`: requests waiting in its queues now |
//! | `sluice_shadow_denied_total` | counter | `policy`: requests a `shadow` policy would have denied |
//! | `sluice_settled_total` | counter | `policy`, `source`: settled requests, with the cost the response `reported` or, without a report, the `estimate` kept |
//! | `sluice_settled_cost_total` | counter | `policy`, `direction`: tokens settlements `refunded`, `charged`, and `forgiven` (a charge beyond `cost.max_debt`, or beyond what a window had left) |
//! | `sluice_policy_unknown_plan_total` | counter | `policy`: requests naming a plan the policy does not list |
//! | `sluice_upstream_responses_total` | counter | `route`, `status` (`1xx` .. `5xx`), `protocol` |
//! | `sluice_upstream_errors_total` | counter | `route`, `error` (`refused`, `timeout`, `other`), `protocol` |
//! | `sluice_request_body_refused_total` | counter | `route`, `reason` (`too_large`: 413, `timeout`: 408), `protocol` |
//! | `sluice_tunnels_open` | gauge | `route`: upgraded connections (WebSocket) open now |
//!
//! `protocol` is the request's ([`Protocol`]): `http1`, `h2`, `grpc` or `ws`; every
//! combination is registered up front, so a counter reads 0 before its first request.

use metrics::{Counter, Gauge};

use crate::admit::Reason;
use crate::protocol::Protocol;

/// One counter per protocol, indexed by [`Protocol`].
pub(crate) type PerProtocol = [Counter; Protocol::ALL.len()];

fn per_protocol(make: impl Fn(&'static str) -> Counter) -> PerProtocol {
    Protocol::ALL.map(|p| make(p.as_str()))
}

/// The handles of one policy.
#[derive(Debug, Clone)]
pub(crate) struct PolicyMetrics {
    admitted: PerProtocol,
    denied: [PerProtocol; Reason::ALL.len()],
    pub(crate) waiting: Gauge,
    pub(crate) shadow_denied: Counter,
    pub(crate) settled_reported: Counter,
    pub(crate) settled_estimate: Counter,
    pub(crate) settled_refunded: Counter,
    pub(crate) settled_charged: Counter,
    pub(crate) settled_forgiven: Counter,
}

impl PolicyMetrics {
    pub(crate) fn new(policy: &str) -> PolicyMetrics {
        let name = policy.to_owned();
        PolicyMetrics {
            admitted: per_protocol(|p| {
                metrics::counter!("sluice_policy_admitted_total", "policy" => name.clone(), "protocol" => p)
            }),
            denied: Reason::ALL.map(|reason| {
                per_protocol(|p| {
                    metrics::counter!("sluice_policy_denied_total", "policy" => name.clone(), "reason" => reason.as_str(), "protocol" => p)
                })
            }),
            waiting: metrics::gauge!("sluice_policy_waiting", "policy" => name.clone()),
            shadow_denied: metrics::counter!("sluice_shadow_denied_total", "policy" => name.clone()),
            settled_reported: metrics::counter!("sluice_settled_total", "policy" => name.clone(), "source" => "reported"),
            settled_estimate: metrics::counter!("sluice_settled_total", "policy" => name.clone(), "source" => "estimate"),
            settled_refunded: metrics::counter!("sluice_settled_cost_total", "policy" => name.clone(), "direction" => "refunded"),
            settled_charged: metrics::counter!("sluice_settled_cost_total", "policy" => name.clone(), "direction" => "charged"),
            settled_forgiven: metrics::counter!("sluice_settled_cost_total", "policy" => name, "direction" => "forgiven"),
        }
    }

    pub(crate) fn admitted(&self, protocol: Protocol) {
        self.admitted[protocol as usize].increment(1);
    }

    pub(crate) fn denied(&self, reason: Reason, protocol: Protocol) {
        self.denied[reason as usize][protocol as usize].increment(1);
    }
}

/// The handles of one route.
#[derive(Debug, Clone)]
pub(crate) struct RouteMetrics {
    /// The route's `path_prefix`, for the lines logged about its requests.
    pub(crate) name: std::sync::Arc<str>,
    status: [PerProtocol; 5],
    pub(crate) refused: PerProtocol,
    pub(crate) timeout: PerProtocol,
    pub(crate) other: PerProtocol,
    pub(crate) read_timeout: PerProtocol,
    pub(crate) body_too_large: PerProtocol,
    pub(crate) body_timeout: PerProtocol,
    pub(crate) tunnels: Gauge,
}

impl RouteMetrics {
    pub(crate) fn new(route: &str) -> RouteMetrics {
        let route = route.to_owned();
        let error = |e: &'static str| {
            per_protocol(
                |p| metrics::counter!("sluice_upstream_errors_total", "route" => route.clone(), "error" => e, "protocol" => p),
            )
        };
        let body = |reason: &'static str| {
            per_protocol(
                |p| metrics::counter!("sluice_request_body_refused_total", "route" => route.clone(), "reason" => reason, "protocol" => p),
            )
        };
        RouteMetrics {
            name: std::sync::Arc::from(route.as_str()),
            status: ["1xx", "2xx", "3xx", "4xx", "5xx"].map(|class| {
                per_protocol(|p| metrics::counter!("sluice_upstream_responses_total", "route" => route.clone(), "status" => class, "protocol" => p))
            }),
            refused: error("refused"),
            timeout: error("timeout"),
            other: error("other"),
            read_timeout: error("read_timeout"),
            body_too_large: body("too_large"),
            body_timeout: body("timeout"),
            tunnels: metrics::gauge!("sluice_tunnels_open", "route" => route.clone()),
        }
    }

    pub(crate) fn status(&self, status: http::StatusCode, protocol: Protocol) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.status[class][protocol as usize].increment(1);
    }
}

/// Gives every metric of the gateway (this crate's and `sluice`'s) its help text and unit, for
/// the installed recorder. Call it once, after installing the recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, Unit};

    sluice::describe_metrics();
    crate::proxy::describe_metrics();
    describe_counter!(
        "sluice_policy_admitted_total",
        Unit::Count,
        "Requests a gateway policy admitted, by `policy` and `protocol` (`http1`, `h2`, `grpc`, `ws`)."
    );
    describe_counter!(
        "sluice_policy_denied_total",
        Unit::Count,
        "Requests a gateway policy refused, by `policy` and `reason`: `limit`, `queue_full` and \
         `timeout` (429), `capacity` (422: the cost exceeds the capacity), `unavailable` (503: \
         the store could not answer and on_error denies), `ambiguous_key` (400: the key appears \
         twice with different values); and by `protocol` (`http1`, `h2`, `grpc`, `ws`)."
    );
    describe_counter!(
        "sluice_policy_unknown_plan_total",
        Unit::Count,
        "Requests to a policy with plans that named a plan it does not list (decided by the \
         policy's own quota), by `policy`."
    );
    describe_counter!(
        "sluice_shadow_denied_total",
        Unit::Count,
        "Requests a `shadow = true` policy would have denied (for any reason) and let through, \
         by `policy`."
    );
    describe_counter!(
        "sluice_settled_total",
        Unit::Count,
        "Requests whose cost a policy settled when the response ended, by `policy` and `source`: \
         `reported` (the response said what it cost) or `estimate` (no report: the reserve stands)."
    );
    describe_counter!(
        "sluice_settled_cost_total",
        Unit::Count,
        "Tokens settlements moved, by `policy` and `direction`: `refunded` (a request cost less \
         than reserved), `charged` (it cost more), `forgiven` (what a charge could not take: \
         beyond the policy's `cost.max_debt`, or beyond what a window had left)."
    );
    describe_gauge!(
        "sluice_policy_waiting",
        Unit::Count,
        "Requests waiting in a policy's queues now, by `policy`."
    );
    describe_counter!(
        "sluice_upstream_responses_total",
        Unit::Count,
        "Upstream responses, by `route`, `status` class (`1xx` to `5xx`) and `protocol` (`http1`, \
         `h2`, `grpc`, `ws`)."
    );
    describe_counter!(
        "sluice_request_body_refused_total",
        Unit::Count,
        "Requests refused for their body, by `route` and `reason`: `too_large` (413: above \
         max_body), `timeout` (408: stalled longer than client_body_timeout); and by `protocol`."
    );
    describe_counter!(
        "sluice_upstream_errors_total",
        Unit::Count,
        "Requests that got no upstream response, or no whole one, by `route` and `error`: \
         `refused` (502), `timeout` (504), `other` (502), `read_timeout` (the answer had begun \
         when its body stalled for longer than upstream_read_timeout: the client connection \
         was closed, an HTTP/2 stream reset); and by `protocol`."
    );
    describe_gauge!(
        "sluice_tunnels_open",
        Unit::Count,
        "Upgraded connections (WebSocket tunnels) open now, by `route`."
    );
}
