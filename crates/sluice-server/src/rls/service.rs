//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over gRPC (h2c).
//!
//! Each descriptor of a request is decided by the policy of the first `[[rls]]` rule that
//! matches it ([`RlsTable::find`]), taking `hits_addend` tokens (0 means 1; a descriptor's own
//! `hits_addend` overrides the request's) from the key's bucket, never waiting: queues and
//! concurrency limits are the HTTP path's. The answer is `OVER_LIMIT` when any descriptor is
//! over its limit, and then, as on the HTTP path, the tokens the other descriptors took are
//! given back: a denial spends nothing anywhere. A descriptor no rule matches is `OK`, counted
//! in `sluice_rls_descriptors_unmatched_total`. A descriptor with `is_negative_hits` gives its
//! `hits_addend` back (never beyond a full bucket) and is `OK`. A descriptor of an
//! `on_stream_done` rule (Envoy's `apply_on_stream_done`, sent once a stream is done with what
//! it really cost) has its `hits_addend` charged whatever the key has left, and is `OK`: the
//! key's next requests wait for the refill that pays it.
//!
//! A policy in shadow mode answers `OK` where it would answer `OVER_LIMIT`, with its real
//! `limit_remaining`, counting the would-be denial in `sluice_shadow_denied_total` (the
//! access log says `decision=shadow-denied` when no other policy denied).
//!
//! Every matched descriptor's status carries `current_limit` (the policy's rate, see
//! [`Unit::of_interval`]), `limit_remaining` (whole tokens left) and `duration_until_reset`
//! (until the bucket is full again); `response_headers_to_add` carries `RateLimit-Policy` and
//! `RateLimit` as the HTTP gateway writes them, and `Retry-After` when over the limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit, Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use metrics::Counter;
use sluice::store::Origin;
use sluice::Error;
use sluice_core::Decision;
use sluice_http::admit::Verdict;
use sluice_http::{headers, Policy, Reason};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::runtime::rls_table::{RlsTable, Unit};
use crate::runtime::state::Shared;

/// The service: decides on the runtime in force at each request (a reload swaps the rules
/// and policies whole).
#[derive(Debug)]
pub struct RlsService {
    shared: &'static Shared,
    metrics: RlsMetrics,
}

/// The service's own counters.
#[derive(Debug, Clone)]
pub struct RlsMetrics {
    ok: Counter,
    over_limit: Counter,
    unmatched: Counter,
}

impl RlsMetrics {
    /// The handles (take them after the recorder is installed).
    pub fn new() -> RlsMetrics {
        let requests =
            |code: &'static str| metrics::counter!("sluice_rls_requests_total", "code" => code);
        RlsMetrics {
            ok: requests("ok"),
            over_limit: requests("over_limit"),
            unmatched: metrics::counter!("sluice_rls_descriptors_unmatched_total"),
        }
    }
}

impl Default for RlsMetrics {
    fn default() -> RlsMetrics {
        RlsMetrics::new()
    }
}

/// Gives the service's metrics their help text (after the recorder is installed).
pub fn describe_metrics() {
    metrics::describe_counter!(
        "sluice_rls_requests_total",
        metrics::Unit::Count,
        "ShouldRateLimit calls of Envoy's rate limit service, by the overall `code`: `ok` or `over_limit`."
    );
    metrics::describe_counter!(
        "sluice_rls_descriptors_unmatched_total",
        metrics::Unit::Count,
        "Rate limit descriptors no [[rls]] rule matched (answered OK)."
    );
}

impl RlsService {
    /// The service over the runtime `shared` holds.
    pub fn new(shared: &'static Shared) -> RlsService {
        RlsService {
            shared,
            metrics: RlsMetrics::new(),
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RlsService {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let runtime = self.shared.current();
        let started = Instant::now();
        let request = request.into_inner();
        let (response, verdict) = decide(&runtime.rls, &request, &self.metrics).await;
        if tracing::enabled!(target: "sluice::access", tracing::Level::INFO) {
            let (decision, policy) = match &verdict {
                RlsVerdict::Ok => ("ok", ""),
                RlsVerdict::OverLimit(p) => ("over_limit", p.as_str()),
                RlsVerdict::ShadowDenied(p) => ("shadow-denied", p.as_str()),
            };
            tracing::info!(
                target: "sluice::access",
                rls_domain = %request.domain.chars().take(64).collect::<String>(),
                descriptors = request.descriptors.len(),
                decision,
                policy,
                ms = started.elapsed().as_secs_f64() * 1000.0,
            );
        }
        Ok(tonic::Response::new(response))
    }
}

/// One descriptor's ask: its policy, key and cost, or `None` when no rule matched.
struct Ask<'a> {
    policy: &'a Arc<Policy>,
    key: String,
    cost: u64,
    refill: bool,
    /// A finished stream's cost, charged (`on_stream_done`).
    charge: bool,
}

/// Decides `request` on `table`'s policies; also how, for the access log.
pub async fn decide(
    table: &RlsTable,
    request: &RateLimitRequest,
    metrics: &RlsMetrics,
) -> (RateLimitResponse, RlsVerdict) {
    let base = u64::from(request.hits_addend.max(1));
    let asks: Vec<Option<Ask<'_>>> = request
        .descriptors
        .iter()
        .map(|d| {
            table.find(&request.domain, d).map(|m| Ask {
                policy: m.policy,
                key: m.key,
                cost: d
                    .hits_addend
                    .as_ref()
                    .map(|h| h.value)
                    .filter(|&v| v > 0)
                    .unwrap_or(base),
                refill: d.is_negative_hits,
                charge: m.on_stream_done,
            })
        })
        .collect();
    let started = tokio::time::Instant::now();
    let results = futures_util::future::join_all(asks.iter().map(|ask| async move {
        let ask = ask.as_ref()?;
        // With where each admission was granted, so that a later refund goes there.
        Some(if ask.refill {
            ask.policy.refund(&ask.key, ask.cost, Duration::ZERO).await;
            ask.policy.peek(&ask.key).await.map(|d| (d, Origin::Store))
        } else if ask.charge {
            ask.policy.charge(&ask.key, ask.cost).await;
            ask.policy.peek(&ask.key).await.map(|d| (d, Origin::Store))
        } else {
            ask.policy.check_granted(&ask.key, ask.cost).await
        })
    }))
    .await;
    let mut statuses = Vec::with_capacity(asks.len());
    let mut policies: Vec<Arc<Policy>> = Vec::new();
    let mut verdicts: Vec<Verdict> = Vec::new();
    let mut over = false;
    let mut retry_after = Duration::ZERO;
    let mut denied_by = None;
    let mut shadow_denied = None;
    // The positions of the descriptors a shadow policy would have denied.
    let mut shadowed: Vec<usize> = Vec::new();
    // Where each descriptor's admission was granted (by position).
    let mut origins: Vec<Origin> = Vec::with_capacity(asks.len());
    for (ask, result) in asks.iter().zip(results) {
        let (Some(ask), Some(result)) = (ask, result) else {
            origins.push(Origin::Nowhere);
            metrics.unmatched.increment(1);
            statuses.push(DescriptorStatus {
                code: Code::Ok as i32,
                ..Default::default()
            });
            continue;
        };
        origins.push(match &result {
            Ok((_, origin)) => *origin,
            Err(_) => Origin::Nowhere,
        });
        let (code, decision) = match result {
            Ok((decision, _)) => (Code::Ok, decision),
            Err(e) if ask.policy.shadow() => {
                let (_, wait, decision) = classify(e);
                ask.policy.count_shadow_denied();
                shadowed.push(statuses.len());
                shadow_denied.get_or_insert_with(|| ask.policy.name().to_owned());
                let decision = match decision {
                    Some(d) => d,
                    None => fallback(ask, wait).await,
                };
                (Code::Ok, decision)
            }
            Err(e) => {
                let (reason, wait, decision) = classify(e);
                let decision = match decision {
                    Some(d) => d,
                    None => fallback(ask, wait).await,
                };
                ask.policy
                    .count_denied(reason, sluice_http::protocol::Protocol::Grpc);
                over = true;
                retry_after = retry_after.max(wait);
                denied_by.get_or_insert_with(|| ask.policy.name().to_owned());
                (Code::OverLimit, decision)
            }
        };
        verdicts.push(Verdict {
            index: policies.len(),
            remaining: decision.remaining,
            reset_after_ns: decision.reset_after_ns,
        });
        policies.push(Arc::clone(ask.policy));
        statuses.push(status(code, ask.policy, &decision));
    }
    if over {
        // As on the HTTP path: a denial spends nothing anywhere.
        let ago = started.elapsed();
        for (i, (ask, status)) in asks.iter().zip(&statuses).enumerate() {
            // A shadow policy's would-be denial took nothing.
            if let Some(ask) = ask
                .as_ref()
                .filter(|a| !a.refill && !a.charge && !shadowed.contains(&i))
            {
                if status.code == Code::Ok as i32 {
                    ask.policy
                        .refund_to(origins[i], &ask.key, ask.cost, ago)
                        .await;
                }
            }
        }
        metrics.over_limit.increment(1);
    } else {
        for (i, ask) in asks.iter().enumerate() {
            // A shadow policy's would-be denial is counted as that, not as an admission.
            if let Some(ask) = ask.as_ref().filter(|a| !a.refill && !shadowed.contains(&i)) {
                ask.policy
                    .count_admitted(sluice_http::protocol::Protocol::Grpc);
            }
        }
        metrics.ok.increment(1);
    }
    let mut response_headers_to_add = Vec::new();
    let mut distinct: Vec<Arc<Policy>> = Vec::new();
    for p in &policies {
        if !distinct.iter().any(|d| Arc::ptr_eq(d, p)) {
            distinct.push(Arc::clone(p));
        }
    }
    if let Some(v) = headers::policy_header(&distinct) {
        response_headers_to_add.push(header("ratelimit-policy", &v));
    }
    if let Some(v) = headers::ratelimit_header(&policies, &verdicts) {
        response_headers_to_add.push(header("ratelimit", &v));
    }
    if over {
        let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
        response_headers_to_add.push(HeaderValue {
            key: "retry-after".to_owned(),
            value: secs.max(1).to_string(),
            ..Default::default()
        });
    }
    let response = RateLimitResponse {
        overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
        statuses,
        response_headers_to_add,
        ..Default::default()
    };
    let verdict = match (denied_by, shadow_denied) {
        (Some(policy), _) => RlsVerdict::OverLimit(policy),
        (None, Some(policy)) => RlsVerdict::ShadowDenied(policy),
        (None, None) => RlsVerdict::Ok,
    };
    (response, verdict)
}

/// How a call was decided, for the access log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RlsVerdict {
    /// Every descriptor was within its limit.
    Ok,
    /// This policy (the first) was over its limit.
    OverLimit(String),
    /// Within every limit but this shadow policy's (the first), which let it through.
    ShadowDenied(String),
}

/// The bucket of a descriptor whose store gave no decision with its refusal.
async fn fallback(ask: &Ask<'_>, wait: Duration) -> Decision {
    ask.policy.peek(&ask.key).await.unwrap_or(Decision {
        allowed: false,
        limit: ask.policy.quota().capacity(),
        remaining: 0,
        retry_after_ns: duration_ns(wait),
        reset_after_ns: duration_ns(wait),
    })
}

/// Why a check failed, how long until it could pass, and the bucket when the store said.
fn classify(error: Error) -> (Reason, Duration, Option<Decision>) {
    match error {
        Error::Limited {
            retry_after,
            decision,
        } => (Reason::Limit, retry_after, Some(decision)),
        Error::InsufficientCapacity { .. } => (Reason::Capacity, Duration::ZERO, None),
        Error::Unavailable { retry_after } => (Reason::Unavailable, retry_after, None),
        Error::QueueFull { retry_after } => (Reason::QueueFull, retry_after, None),
        Error::Timeout { retry_after } => (Reason::Timeout, retry_after, None),
        _ => (Reason::Unavailable, Duration::from_secs(1), None),
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn status(code: Code, policy: &Policy, decision: &Decision) -> DescriptorStatus {
    let (requests_per_unit, unit) = Unit::of_interval(policy.quota().interval_ns());
    let unit = match unit {
        Unit::Second => rate_limit::Unit::Second,
        Unit::Minute => rate_limit::Unit::Minute,
        Unit::Hour => rate_limit::Unit::Hour,
        Unit::Day => rate_limit::Unit::Day,
    };
    let reset = decision.reset_after_ns;
    DescriptorStatus {
        code: code as i32,
        current_limit: Some(RateLimit {
            name: policy.name().to_owned(),
            requests_per_unit,
            unit: unit as i32,
        }),
        limit_remaining: u32::try_from(decision.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(PbDuration {
            seconds: i64::try_from(reset / 1_000_000_000).unwrap_or(i64::MAX),
            nanos: (reset % 1_000_000_000) as i32,
        }),
        quota: None,
    }
}

fn header(name: &str, value: &http::HeaderValue) -> HeaderValue {
    HeaderValue {
        key: name.to_owned(),
        value: value.to_str().unwrap_or_default().to_owned(),
        ..Default::default()
    }
}

/// Serves the rate limit service on `listener` (gRPC over h2c) until `stop` turns true; the
/// calls in flight then finish.
pub async fn serve(
    listener: TcpListener,
    shared: &'static Shared,
    mut stop: watch::Receiver<bool>,
) {
    let service = RateLimitServiceServer::new(RlsService::new(shared));
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let result = tonic::transport::Server::builder()
        .serve_with_incoming_shutdown(service, incoming, async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "server.rls_listen stopped");
    }
}
