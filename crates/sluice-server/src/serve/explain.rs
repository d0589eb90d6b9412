//! `POST /v1/explain`: what the gateway would do with a described request, consuming nothing.
//!
//! The request is described, not sent: `{"method","path","headers","client_ip"}` (`method`
//! defaults to `GET`, `headers` to none, `client_ip` to `127.0.0.1`, the address the request
//! comes from, so that trusted proxies' `X-Forwarded-For` is read as the gateway reads it).
//! A header's value is a string, or a list of strings for a header sent more than once.
//!
//! The answer is the gateway's own reasoning, from its own functions: the browser paths
//! ([`Browser::owns`](crate::browser::Browser::owns)), the canonical path
//! ([`canonical_uri`]), the route ([`RouteTable::find`](sluice_http::RouteTable::find)), the
//! protocol ([`Protocol::of`]), then each policy in the order [`sluice_http::admit`] asks
//! them, with the key it would spend ([`Policy::request_key_uncounted`]), the quota that
//! decides that key ([`Policy::quota_for`]), what the request would take ([`Ask::reserve`])
//! and the bucket's state ([`Policy::peek`], which consumes nothing).
//!
//! A bucket's state is read, not tried: whether the cost fits is `remaining >= cost`, and
//! the wait for it is predicted from the bucket's reset time and the quota. For the kinds
//! that refill continuously (`token_bucket`, `gcra`, `leaky_bucket`) that wait is exact as of
//! now; for the window kinds it is the time until the window has emptied, an upper bound.
//! Requests already waiting in a key's queue are not seen, so a predicted wait is the
//! shortest one.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http::header::{HeaderName, HeaderValue as Value};
use http::{HeaderMap, Method, Uri};
use serde::Deserialize;
use serde_json::{json, Map, Value as Json};
use sluice_core::{Decision, Kind, Quota};
use sluice_http::admit::{Ask, Reason};
use sluice_http::gateway::{ambiguous_host, body_may_wait, declared_length};
use sluice_http::path::canonical_uri;
use sluice_http::policy::QuotaSource;
use sluice_http::protocol::{asks_websocket_upgrade, Protocol};
use sluice_http::route::{Lookup, Route};
use sluice_http::{headers, Policy};

use crate::runtime::build::Runtime;
use crate::runtime::state::Shared;

/// The described request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Described {
    #[serde(default = "get")]
    method: String,
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, Values>,
    #[serde(default = "loopback")]
    client_ip: String,
}

/// A header's value, or its values when it is sent more than once.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Values {
    One(String),
    Many(Vec<String>),
}

fn get() -> String {
    String::from("GET")
}

fn loopback() -> String {
    String::from("127.0.0.1")
}

/// `POST /v1/explain`: 200 with the explanation, 400 for a description that is no request
/// (malformed JSON, unknown members, a bad method, path, header or address, each named).
pub async fn explain(State(shared): State<&'static Shared>, body: Bytes) -> Response {
    let described: Described = match serde_json::from_slice(&body) {
        Ok(d) => d,
        Err(e) => return bad(&format!("malformed JSON: {e}")),
    };
    let (request, peer) = match build(described) {
        Ok(built) => built,
        Err(detail) => return bad(&detail),
    };
    let runtime = shared.current();
    let answer = explain_request(&runtime, &request, peer).await;
    let mut response = (StatusCode::OK, format!("{answer}\n")).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn bad(detail: &str) -> Response {
    headers::problem(StatusCode::BAD_REQUEST, detail).into_response()
}

/// The first 64 characters of a value, for an error message.
fn shown(value: &str) -> String {
    value.chars().take(64).collect()
}

/// The described request as the gateway would receive it, and the address it comes from.
fn build(d: Described) -> Result<(http::Request<()>, IpAddr), String> {
    let method = Method::from_bytes(d.method.as_bytes())
        .map_err(|_| format!("method: `{}` is not an HTTP method", shown(&d.method)))?;
    if !d.path.starts_with('/') {
        return Err(format!(
            "path: `{}` must start with `/` (the query, if any, follows `?`)",
            shown(&d.path)
        ));
    }
    let uri: Uri = d
        .path
        .parse()
        .map_err(|e| format!("path: `{}` is not a request path: {e}", shown(&d.path)))?;
    let peer: IpAddr = d
        .client_ip
        .parse()
        .map_err(|_| format!("client_ip: `{}` is not an IP address", shown(&d.client_ip)))?;
    let mut headers = HeaderMap::new();
    for (name, values) in d.headers {
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("headers: `{}` is not a header name", shown(&name)))?;
        let values = match values {
            Values::One(v) => vec![v],
            Values::Many(v) => v,
        };
        for value in values {
            let v = Value::from_str(&value).map_err(|_| {
                format!(
                    "headers: the value `{}` of `{name}` is not a header value",
                    shown(&value)
                )
            })?;
            headers.append(header.clone(), v);
        }
    }
    let mut request = http::Request::new(());
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    Ok((request, peer))
}

/// What the gateway of `runtime` would do with `request` from `peer`.
async fn explain_request(runtime: &Runtime, request: &http::Request<()>, peer: IpAddr) -> Json {
    let gateway = &runtime.gateway;
    let headers = request.headers();
    let client_ip = gateway.trusted_proxies().client_ip(peer, headers);
    let path = request.uri().path();
    if let Some(browser) = runtime.browser.as_ref() {
        if browser.owns(path) {
            return json!({
                "client_ip": client_ip.to_string(),
                "route": {"path_prefix": path, "upstream": null, "kind": "browser"},
                "policies": [],
                "decision": "allowed",
                "status": null,
                "policy": null,
                "why": format!("{path} is answered by the gateway itself ([browser]), before any route"),
            });
        }
    }
    let refused = |status: u16, route_why: &str, why: String| {
        json!({
            "client_ip": client_ip.to_string(),
            "route": null,
            "route_why": route_why,
            "policies": [],
            "decision": "refused",
            "status": status,
            "policy": null,
            "why": why,
        })
    };
    if request.method() == Method::CONNECT {
        return refused(
            405,
            "method_not_allowed",
            String::from("CONNECT is not allowed: this is a reverse proxy"),
        );
    }
    if ambiguous_host(headers) {
        return refused(
            400,
            "ambiguous_host",
            String::from("refused with 400: the request has more than one Host field"),
        );
    }
    let uri = match canonical_uri(request.uri()) {
        Ok(None) => request.uri().clone(),
        Ok(Some(uri)) => uri,
        Err(e) => return refused(400, "ambiguous_path", format!("refused with 400: {e}")),
    };
    let route: &Route = match gateway.routes().find(request.method(), uri.path()) {
        Lookup::Found(route) => route,
        Lookup::NotFound => {
            return refused(
                404,
                "no_route",
                format!("refused with 404: no route matches {}", uri.path()),
            )
        }
        Lookup::MethodNotAllowed => {
            return refused(
                405,
                "method_not_allowed",
                format!(
                    "refused with 405: no route for {} allows {}",
                    uri.path(),
                    request.method()
                ),
            )
        }
    };
    if let Some(len) = declared_length(headers).filter(|len| *len > route.body_limit()) {
        return json!({
            "client_ip": client_ip.to_string(),
            "route": route_json(route, kind_of(request)),
            "route_why": "body_too_large",
            "policies": [],
            "decision": "refused",
            "status": 413,
            "policy": null,
            "why": format!(
                "refused with 413: the declared body ({len} bytes) is larger than this route accepts ({} bytes)",
                route.body_limit()
            ),
        });
    }
    let kind = kind_of(request);
    let ask = Ask {
        headers,
        uri: &uri,
        client_ip: Some(client_ip),
        cost: 1,
        may_wait: body_may_wait(headers, route.max_queued_body()),
        from_trusted_proxy: gateway.trusted_proxies().contains(peer),
        // Explained from its head only: a reservation read from the body takes the policy's
        // `reserve`, the most it could be for a body within the route's limit.
        body: None,
    };
    let policies = route.policy_list();
    // The rates, in the order they are asked; then the concurrency slots.
    let mut rows: Vec<(usize, Row)> = Vec::with_capacity(policies.len());
    for waiting in [false, true] {
        for (i, policy) in policies.iter().enumerate() {
            if ask.waits(policy) == waiting {
                rows.push((i, rate_row(policy, &ask).await));
            }
        }
    }
    let mut first: Option<(String, Verdict)> = rows
        .iter()
        .find(|(_, row)| matches!(row.verdict, Verdict::Denied { .. }))
        .map(|(i, row)| (policies[*i].name().to_owned(), row.verdict));
    for (i, policy) in policies.iter().enumerate() {
        let Some(pool) = policy.concurrency() else {
            continue;
        };
        let Some((_, row)) = rows.iter_mut().find(|(j, _)| *j == i) else {
            continue;
        };
        let (in_flight, size) = (pool.in_flight(), pool.size());
        row.fields.insert("in_flight".into(), json!(in_flight));
        row.fields.insert("concurrency".into(), json!(size));
        if in_flight < size || !matches!(row.verdict, Verdict::Allowed | Verdict::Wait(_)) {
            continue;
        }
        let waits = ask.waits(policy);
        row.verdict = if policy.shadow() {
            Verdict::ShadowDenied(Reason::Limit)
        } else if waits {
            // A slot frees when a response ends: no wait to predict.
            Verdict::Wait(None)
        } else {
            Verdict::Denied {
                reason: Reason::Limit,
                retry_after: pool.retry_hint(),
            }
        };
        if first.is_none() && matches!(row.verdict, Verdict::Denied { .. }) {
            first = Some((policy.name().to_owned(), row.verdict));
        }
    }
    let waits: Vec<(String, Option<u64>)> = rows
        .iter()
        .filter_map(|(i, row)| match row.verdict {
            Verdict::Wait(w) => Some((policies[*i].name().to_owned(), w.map(ms))),
            _ => None,
        })
        .collect();
    let listed: Vec<Json> = rows
        .into_iter()
        .map(|(i, row)| row.into_json(&policies[i]))
        .collect();
    let mut answer = json!({
        "client_ip": client_ip.to_string(),
        "route": route_json(route, kind),
        "policies": listed,
    });
    let overall = answer.as_object_mut().expect("an object");
    match first {
        Some((
            name,
            Verdict::Denied {
                reason,
                retry_after,
            },
        )) => {
            let status = reason.status().as_u16();
            overall.insert("decision".into(), json!("denied"));
            overall.insert("status".into(), json!(status));
            overall.insert("policy".into(), json!(name));
            overall.insert("reason".into(), json!(reason.as_str()));
            overall.insert("retry_after_ms".into(), json!(ms(retry_after)));
            let form = if kind == "grpc" {
                " (as a gRPC status)"
            } else {
                ""
            };
            overall.insert(
                "why".into(),
                json!(format!(
                    "refused with {status}{form} by policy `{name}`: {}",
                    plain(reason, retry_after)
                )),
            );
        }
        _ if waits.is_empty() => {
            overall.insert("decision".into(), json!("allowed"));
            overall.insert("status".into(), json!(null));
            overall.insert("policy".into(), json!(null));
            let why = if policies.is_empty() {
                format!("forwarded to {}: the route has no policy", route.upstream())
            } else {
                format!(
                    "forwarded to {} at once: every policy admits it",
                    route.upstream()
                )
            };
            overall.insert("why".into(), json!(why));
        }
        _ => {
            let (name, wait) = &waits[0];
            overall.insert("decision".into(), json!("would_wait"));
            overall.insert("status".into(), json!(null));
            overall.insert("policy".into(), json!(name));
            let wait = match wait {
                Some(ms) => format!("about {ms} ms"),
                None => String::from("until a slot frees"),
            };
            overall.insert(
                "why".into(),
                json!(format!(
                    "forwarded to {} after waiting {wait} in the queue of policy `{name}`",
                    route.upstream()
                )),
            );
        }
    }
    answer
}

/// What the request speaks, as the route's `kind`: `grpc`, `websocket` (an upgrade) or
/// `proxy`.
fn kind_of(request: &http::Request<()>) -> &'static str {
    if Protocol::of(request) == Protocol::Grpc {
        "grpc"
    } else if asks_websocket_upgrade(request.headers()) {
        "websocket"
    } else {
        "proxy"
    }
}

fn route_json(route: &Route, kind: &str) -> Json {
    json!({
        "path_prefix": route.path_prefix(),
        "upstream": route.upstream().to_string(),
        "kind": kind,
    })
}

/// What one policy would do.
#[derive(Debug, Clone, Copy)]
enum Verdict {
    Allowed,
    /// Admitted after waiting in its queue (the predicted wait, when there is one).
    Wait(Option<Duration>),
    Denied {
        reason: Reason,
        retry_after: Duration,
    },
    /// In shadow mode: it would deny for this reason, and lets the request go on.
    ShadowDenied(Reason),
}

/// A policy's row of the answer, and its verdict.
struct Row {
    fields: Map<String, Json>,
    verdict: Verdict,
}

impl Row {
    fn into_json(mut self, policy: &Policy) -> Json {
        let f = &mut self.fields;
        match self.verdict {
            Verdict::Allowed => {
                f.insert("decision".into(), json!("allowed"));
            }
            Verdict::Wait(wait) => {
                f.insert("decision".into(), json!("would_wait"));
                f.insert("wait_ms".into(), json!(wait.map(ms)));
                if let Some(q) = policy.queue() {
                    f.insert("max_wait_ms".into(), json!(ms(q.max_wait)));
                }
            }
            Verdict::Denied {
                reason,
                retry_after,
            } => {
                f.insert("decision".into(), json!("denied"));
                f.insert("reason".into(), json!(reason.as_str()));
                f.insert("retry_after_ms".into(), json!(ms(retry_after)));
            }
            Verdict::ShadowDenied(reason) => {
                f.insert("decision".into(), json!("shadow_denied"));
                f.insert("reason".into(), json!(reason.as_str()));
            }
        }
        Json::Object(self.fields)
    }
}

/// Whole milliseconds, rounded up.
fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// A reason in plain words.
fn plain(reason: Reason, retry_after: Duration) -> String {
    match reason {
        Reason::Limit => format!(
            "its key has too few tokens left; retry in {} ms",
            ms(retry_after)
        ),
        Reason::QueueFull => String::from("its queue is full"),
        Reason::Timeout => format!(
            "the wait ({} ms) would be longer than its max_wait",
            ms(retry_after)
        ),
        Reason::Capacity => String::from("the cost is above the capacity: no wait would admit it"),
        Reason::Unavailable => String::from("its store does not answer"),
        Reason::AmbiguousKey => String::from(
            "the request carries the key's header or query parameter more than once, with different values",
        ),
    }
}

/// The rate side of `policy` for `ask`: key, quota, cost, the bucket's state, and the verdict.
async fn rate_row(policy: &Arc<Policy>, ask: &Ask<'_>) -> Row {
    let mut f = Map::new();
    f.insert("name".into(), json!(policy.name()));
    f.insert("shadow".into(), json!(policy.shadow()));
    let reserved = ask.reserve(policy);
    f.insert(
        "cost".into(),
        json!({
            "reserve": reserved.cost,
            "settled_later": reserved.settles,
            "settle": policy.cost().and_then(|c| c.settle.as_ref()).map(|s| s.to_string()),
        }),
    );
    let denied = |reason: Reason, retry_after: Duration| {
        if policy.shadow() {
            Verdict::ShadowDenied(reason)
        } else {
            Verdict::Denied {
                reason,
                retry_after,
            }
        }
    };
    let shown = policy
        .key_spec()
        .extract(ask.headers, ask.uri, ask.client_ip);
    let key = match policy.request_key_uncounted(ask.headers, ask.uri, ask.client_ip) {
        Ok(key) => key,
        Err(e) => {
            f.insert("key".into(), json!(null));
            f.insert("key_error".into(), json!(e.to_string()));
            return Row {
                fields: f,
                verdict: denied(Reason::AmbiguousKey, Duration::ZERO),
            };
        }
    };
    // The key spec's part: a plan's error was caught above.
    f.insert(
        "key".into(),
        json!(shown.map(|k| String::from(&*k)).unwrap_or_default()),
    );
    f.insert("stored_key".into(), json!(policy.stored_key(&key)));
    f.insert("plan".into(), json!(policy.plan_of(&key)));
    let (quota, source) = policy.quota_for(&key);
    let source = match source {
        QuotaSource::Policy => "policy",
        QuotaSource::Plan(_) => "plan",
        QuotaSource::Override => "override",
    };
    f.insert(
        "quota".into(),
        json!({
            "capacity": quota.capacity(),
            "rate": quota.rate().to_string(),
            "source": source,
        }),
    );
    if reserved.cost > quota.capacity() {
        return Row {
            fields: f,
            verdict: denied(Reason::Capacity, Duration::ZERO),
        };
    }
    let state = match policy.state_of(&key).await {
        Ok(state) => state,
        Err(e) => {
            f.insert("state".into(), json!(null));
            let retry_after = e.retry_after().unwrap_or(Duration::from_secs(1));
            return Row {
                fields: f,
                verdict: denied(Reason::Unavailable, retry_after),
            };
        }
    };
    let (owed, paid_in_ns) = policy.debt_of(&key, &state);
    f.insert(
        "state".into(),
        json!({
            "remaining": state.remaining,
            "reset_after_ms": state.reset_after_ms_ceil(),
            "owed": owed,
            "paid_in_ms": paid_in_ns.div_ceil(1_000_000),
        }),
    );
    let wait = wait_for(policy.algorithm().which(), quota, &state, reserved.cost);
    let verdict = if wait.is_zero() {
        Verdict::Allowed
    } else if ask.waits(policy) {
        match policy.queue() {
            Some(q) if wait <= q.max_wait => Verdict::Wait(Some(wait)),
            _ => denied(Reason::Timeout, wait),
        }
    } else {
        denied(Reason::Limit, wait)
    };
    Row { fields: f, verdict }
}

/// How long until a bucket in `state` (a peek) admits `cost` under `quota`: zero when it has
/// the tokens now. For the kinds that refill one token per interval, the bucket is full at
/// `reset_after` and so holds `capacity - cost` tokens `(capacity - cost) × interval`
/// earlier; a window kind admits again when its window has emptied (at most `reset_after`).
fn wait_for(kind: Kind, quota: Quota, state: &Decision, cost: u64) -> Duration {
    if state.remaining >= cost {
        return Duration::ZERO;
    }
    let ns = match kind {
        Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => state.reset_after_ns.saturating_sub(
            quota
                .capacity()
                .saturating_sub(cost)
                .saturating_mul(quota.interval_ns()),
        ),
        _ => state.reset_after_ns,
    };
    Duration::from_nanos(ns.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(text: &str) -> Result<(http::Request<()>, IpAddr), String> {
        let d: Described = serde_json::from_str(text).map_err(|e| e.to_string())?;
        build(d)
    }

    #[test]
    fn a_description_is_a_request() {
        let (r, ip) = described(
            r#"{"path": "/api/x?y=1", "headers": {"x-api-key": "k1", "x-a": ["1", "2"]}}"#,
        )
        .unwrap();
        assert_eq!(r.method(), Method::GET);
        assert_eq!(r.uri().query(), Some("y=1"));
        assert_eq!(r.headers().get_all("x-a").iter().count(), 2);
        assert_eq!(ip, IpAddr::from([127, 0, 0, 1]));
    }

    #[test]
    fn each_bad_field_is_named_with_its_value() {
        let cases = [
            (r#"{"path": "/", "method": "G ET"}"#, "method: `G ET`"),
            (r#"{"path": "api"}"#, "path: `api`"),
            (
                r#"{"path": "/", "client_ip": "10.0.0"}"#,
                "client_ip: `10.0.0`",
            ),
            (
                r#"{"path": "/", "headers": {"a b": "1"}}"#,
                "headers: `a b`",
            ),
            (r#"{"path": "/", "headers": {"a": "x\ny"}}"#, "of `a`"),
            (r#"{"path": "/", "body": "x"}"#, "unknown field `body`"),
        ];
        for (text, needle) in cases {
            let e = described(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn a_wait_is_what_the_bucket_lacks() {
        let quota = Quota::parse(10, "1/s").unwrap();
        let full = Decision {
            allowed: true,
            limit: 10,
            remaining: 10,
            retry_after_ns: 0,
            reset_after_ns: 0,
        };
        assert_eq!(wait_for(Kind::Gcra, quota, &full, 1), Duration::ZERO);
        // Empty: full again in 10 s; one token in 1 s, three in 3 s.
        let empty = Decision {
            remaining: 0,
            reset_after_ns: 10_000_000_000,
            ..full
        };
        assert_eq!(
            wait_for(Kind::TokenBucket, quota, &empty, 1),
            Duration::from_secs(1)
        );
        assert_eq!(
            wait_for(Kind::Gcra, quota, &empty, 3),
            Duration::from_secs(3)
        );
        assert_eq!(
            wait_for(Kind::FixedWindow, quota, &empty, 1),
            Duration::from_secs(10)
        );
    }
}
