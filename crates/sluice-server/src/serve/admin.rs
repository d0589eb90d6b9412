//! The admin listener: the decision API, Prometheus metrics, health, the dashboard.
//!
//! | method and path | answer |
//! |---|---|
//! | `POST /v1/check` | `{"policy","key","cost"}` → 200 (allowed) or 429 (denied) with `{"allowed","limit","remaining","retry_after_ms","reset_after_ms"}`; 400 malformed JSON, 404 unknown policy, 413 body over 64 KiB, 422 a cost above the capacity, 503 store unavailable |
//! | `POST /v1/settle` | `{"policy","key","reserved","actual","elapsed_ms"}` (`reserved` defaults to 1, `elapsed_ms` to 0) → 200 `{"refunded","charged","forgiven","owed","paid_in_ms","limit","remaining","reset_after_ms"}`: the real cost of a request `/v1/check` admitted; the difference is given back or charged (never refused), a bucket going into debt (`owed` tokens, paid in `paid_in_ms`); 400 malformed JSON, 404 unknown policy |
//! | `GET /metrics` | Prometheus text |
//! | `GET /healthz` | 200 `ok` |
//! | `GET /dashboard`, `GET /v1/stats` | the dashboard and its data |
//! | `GET /v1/jobs` | the job queues of `[jobs]`, each group's figures read from Redis (404 without `[jobs]`) |
//! | `GET /v1/policies`, `PUT /v1/policies/NAME` | the policies in force; a live change of one (see [`crate::serve::policies`]) |
//! | `GET /v1/policies/NAME/keys`, `GET`, `PUT`, `DELETE /v1/policies/NAME/keys/KEY` | per-key quotas (see [`crate::serve::keys`]) |
//! | `POST /v1/explain` | `{"method","path","headers","client_ip"}` → 200 with the route, each policy's key, quota, cost, state and decision, and the overall decision, consuming nothing (see [`crate::serve::explain`]); 400 a description that is no request, naming the field and value |
//!
//! With `server.admin_token`, every endpoint but `/healthz` answers 401 unless the request
//! carries `Authorization: Bearer <token>`. A client address that presented a wrong token
//! [`FAILED_TOKENS`] times within a minute gets 429 (with `Retry-After`) without its token
//! being looked at, until a failure has aged out: guessing is limited by the gateway's own
//! limiter, and each failure is logged. The listener has the main listener's
//! `header_read_timeout` and `max_header_bytes`, and holds at most [`MAX_CONNECTIONS`]
//! connections (more are closed at accept).

use axum::body::Bytes;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use serde::Deserialize;
use sluice::Error;
use sluice_core::Decision;
use sluice_http::admit::Verdict;
use sluice_http::cost::settle::{settle as settle_one, Owed};
use sluice_http::{headers, key};

use crate::runtime::state::Shared;

/// The largest `/v1/check` body.
pub const MAX_CHECK_BODY: usize = 64 * 1024;

/// The most connections the admin listener holds at once: enough for dashboards, scrapers
/// and operators, few enough that a flood of them costs the gateway no descriptors to speak of.
pub const MAX_CONNECTIONS: usize = 256;

/// Wrong tokens a client address may present per minute (one comes back every 2 s): no use
/// to a guesser, room for an operator mistyping.
pub const FAILED_TOKENS: u64 = 30;

/// The client address of an admin request (put in its extensions at accept).
#[derive(Debug, Clone, Copy)]
struct Peer(std::net::IpAddr);

/// Wrong tokens per client address: a GCRA of [`FAILED_TOKENS`] per minute.
fn failures() -> &'static sluice::Keyed<std::net::IpAddr, sluice_core::Gcra> {
    static FAILURES: std::sync::OnceLock<sluice::Keyed<std::net::IpAddr, sluice_core::Gcra>> =
        std::sync::OnceLock::new();
    FAILURES.get_or_init(|| {
        let rate = sluice_core::Rate::from_interval_ns(60_000_000_000 / FAILED_TOKENS)
            .expect("a positive interval");
        let quota = sluice_core::Quota::new(FAILED_TOKENS, rate).expect("a valid quota");
        sluice::Keyed::builder(sluice_core::Gcra::new(quota))
            .max_keys(10_000)
            .name("admin_failed_tokens")
            .build()
    })
}

/// The admin routes.
pub fn router(shared: &'static Shared) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/settle", post(settle))
        .route("/v1/explain", post(crate::serve::explain::explain))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/dashboard", get(crate::dashboard::page::page))
        .route("/v1/stats", get(crate::dashboard::page::stats))
        .route("/v1/jobs", get(crate::dashboard::page::jobs))
        .route("/v1/policies", get(crate::serve::policies::list))
        .route(
            "/v1/policies/{name}",
            axum::routing::put(crate::serve::policies::update),
        )
        .route("/v1/policies/{name}/keys", get(crate::serve::keys::list))
        .route(
            "/v1/policies/{name}/keys/{key}",
            get(crate::serve::keys::show)
                .put(crate::serve::keys::set)
                .delete(crate::serve::keys::remove),
        )
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such admin endpoint") })
        .layer(DefaultBodyLimit::max(MAX_CHECK_BODY))
        .layer(axum::middleware::from_fn_with_state(shared, authorize))
        .with_state(shared)
}

/// With `server.admin_token`: 401 for every request but `/healthz` that does not carry
/// `Authorization: Bearer <token>`. The token is compared in constant time, read from the
/// configuration in force (a reload changes it at once), and never logged.
async fn authorize(State(shared): State<&'static Shared>, req: Request, next: Next) -> Response {
    if req.uri().path() == "/healthz" {
        return next.run(req).await;
    }
    let runtime = shared.current();
    let Some(token) = runtime.config.server.admin_token.as_ref() else {
        return next.run(req).await;
    };
    let peer = req.extensions().get::<Peer>().map(|p| p.0);
    if let Some(peer) = peer {
        // Out of wrong guesses: refused before the token is looked at.
        let left = failures().peek(&peer);
        if left.remaining == 0 {
            let wait = Duration::from_nanos(
                left.reset_after_ns
                    .saturating_sub((FAILED_TOKENS - 1) * (60_000_000_000 / FAILED_TOKENS)),
            )
            .max(Duration::from_secs(1));
            let mut r = problem(
                StatusCode::TOO_MANY_REQUESTS,
                "too many wrong admin tokens from this address; try again later",
            );
            if let Ok(v) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
                r.headers_mut().insert(RETRY_AFTER, v);
            }
            return r;
        }
    }
    let allowed = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| bearer(v.as_bytes()))
        .is_some_and(|presented| token.matches(presented));
    if allowed {
        return next.run(req).await;
    }
    if let Some(peer) = peer {
        let _ = failures().try_acquire(&peer, 1);
        tracing::warn!(%peer, path = %req.uri().path(), "admin: request without the admin token (401)");
    }
    let mut r = problem(
        StatusCode::UNAUTHORIZED,
        "this admin endpoint needs Authorization: Bearer <server.admin_token>",
    );
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"sluice admin\""),
    );
    r
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in any case).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| rest.trim_ascii())
}

/// Serves the admin routes on `listener` until `stop` turns true, with the main listener's
/// header limits (of the configuration in force when each connection is accepted); then
/// lets the requests in flight finish for at most a second.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: &'static Shared,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let router = router(shared);
    let graceful = GracefulShutdown::new();
    let open = std::sync::Arc::new(());
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Each connection holds a clone: the strong count is the connections open, plus this.
        if std::sync::Arc::strong_count(&open) > MAX_CONNECTIONS {
            drop(stream);
            continue;
        }
        let held = std::sync::Arc::clone(&open);
        let (read_timeout, max_header_bytes) = {
            let runtime = shared.current();
            let server = &runtime.config.server;
            (server.header_read_timeout, server.max_header_bytes)
        };
        let mut builder = http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(read_timeout)
            .max_buf_size(max_header_bytes)
            .keep_alive(true);
        let router = router.clone();
        let service =
            hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
                req.extensions_mut().insert(Peer(peer.ip()));
                tower_service::Service::call(&mut router.clone(), req)
            });
        let connection = builder.serve_connection(TokioIo::new(stream), service);
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = watched.await;
            drop(held);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(1), graceful.shutdown()).await;
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: String,
    #[serde(default)]
    key: String,
    #[serde(default = "one")]
    cost: u64,
}

fn one() -> u64 {
    1
}

/// The policy in force named `name`, or the 404 that says there is none.
fn policy_named<'r>(
    runtime: &'r crate::runtime::build::Runtime,
    name: &str,
) -> Result<&'r std::sync::Arc<sluice_http::Policy>, Box<Response>> {
    runtime.policies.get(name).ok_or_else(|| {
        Box::new(problem(
            StatusCode::NOT_FOUND,
            &format!(
                "unknown policy `{}`",
                name.chars().take(64).collect::<String>()
            ),
        ))
    })
}

fn problem(status: StatusCode, detail: &str) -> Response {
    headers::problem(status, detail).into_response()
}

async fn check(State(shared): State<&'static Shared>, body: Bytes) -> Response {
    let request: CheckRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("malformed JSON: {e}")),
    };
    let runtime = shared.current();
    let policy = match policy_named(&runtime, &request.policy) {
        Ok(p) => p,
        Err(not_found) => return *not_found,
    };
    let capacity = policy.quota().capacity();
    if request.cost > capacity {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            &format!(
                "cost {} exceeds the capacity {capacity} of policy `{}`: it can never be admitted",
                request.cost,
                policy.name()
            ),
        );
    }
    let key = key::normalize(request.key.as_bytes());
    let (status, decision) = match policy.check(&key, request.cost).await {
        Ok(d) => (StatusCode::OK, d),
        Err(Error::Limited { decision, .. }) => (StatusCode::TOO_MANY_REQUESTS, decision),
        Err(Error::InsufficientCapacity { cost, capacity }) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("cost {cost} exceeds the capacity {capacity}: it can never be admitted"),
            );
        }
        Err(e) => {
            let mut r = problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string());
            let secs = e.retry_after().map_or(1, |d| d.as_secs().max(1));
            r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(secs));
            return r;
        }
    };
    let body = answer(&decision);
    let mut response = (status, body).into_response();
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if !decision.allowed {
        h.insert(
            RETRY_AFTER,
            HeaderValue::from(decision.retry_after_secs_ceil().max(1)),
        );
    }
    let policy_header = HeaderValue::from_str(policy.policy_item()).ok();
    let verdict = Verdict::new(0, &decision);
    headers::insert(
        h,
        policy_header.as_ref(),
        std::slice::from_ref(policy),
        &[verdict],
    );
    response
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    policy: String,
    key: String,
    #[serde(default = "one")]
    reserved: u64,
    actual: u64,
    #[serde(default)]
    elapsed_ms: u64,
}

/// `POST /v1/settle`: the real cost of a request that `/v1/check` admitted with `reserved`
/// `elapsed_ms` ago. The difference is given back, or charged without asking: a bucket goes
/// into debt (down to the policy's `cost.max_debt`; what lies beyond is forgiven and
/// reported), and the answer says what the key owes and when the refill has paid it.
async fn settle(State(shared): State<&'static Shared>, body: Bytes) -> Response {
    let request: SettleRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("malformed JSON: {e}")),
    };
    let runtime = shared.current();
    let policy = match policy_named(&runtime, &request.policy) {
        Ok(p) => p,
        Err(not_found) => return *not_found,
    };
    let key = key::normalize(request.key.as_bytes());
    let elapsed = Duration::from_millis(request.elapsed_ms);
    let owed = Owed {
        policy: std::sync::Arc::clone(policy),
        key: key.to_string(),
        reserved: request.reserved,
        at: tokio::time::Instant::now()
            .checked_sub(elapsed)
            .unwrap_or_else(tokio::time::Instant::now),
        counts_request_body: false,
        // The decision API's admissions are its caller's: they were granted by the store.
        origin: sluice::store::Origin::Store,
    };
    let settled = settle_one(&owed, Some(request.actual)).await;
    let state = policy.state_of(&key).await.ok();
    let (owed, paid_in_ns) = state.map_or((0, 0), |d| policy.debt_of(&key, &d));
    let body = format!(
        "{{\"refunded\":{},\"charged\":{},\"forgiven\":{},\"owed\":{},\"paid_in_ms\":{},\"limit\":{},\"remaining\":{},\"reset_after_ms\":{}}}\n",
        settled.refunded,
        settled.charged,
        settled.forgiven,
        owed,
        paid_in_ns.div_ceil(1_000_000),
        policy.quota().capacity(),
        state.map_or(0, |d| d.remaining),
        state.map_or(0, |d| d.reset_after_ms_ceil()),
    );
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn answer(d: &Decision) -> String {
    format!(
        "{{\"allowed\":{},\"limit\":{},\"remaining\":{},\"retry_after_ms\":{},\"reset_after_ms\":{}}}\n",
        d.allowed,
        d.limit,
        d.remaining,
        d.retry_after_ms_ceil(),
        d.reset_after_ms_ceil()
    )
}

async fn metrics(State(shared): State<&'static Shared>) -> Response {
    let mut response = shared.metrics_text().into_response();
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
