//! The admin listener: the decision API, Prometheus metrics, health, the dashboard.
//!
//! | method and path | answer |
//! |---|---|
//! | `POST /v1/check` | `{"policy","key","cost"}` → 200 (allowed) or 429 (denied) with `{"allowed","limit","remaining","retry_after_ms","reset_after_ms"}`; 400 malformed JSON, 404 unknown policy, 413 body over 64 KiB, 422 a cost above the capacity, 503 store unavailable |
//! | `GET /metrics` | Prometheus text |
//! | `GET /healthz` | 200 `ok` |
//! | `GET /dashboard`, `GET /v1/stats` | the dashboard and its data |
//! | `GET /v1/policies`, `PUT /v1/policies/NAME` | the policies in force; a live change of one (see [`crate::serve::policies`]) |
//!
//! With `server.admin_token`, every endpoint but `/healthz` answers 401 unless the request
//! carries `Authorization: Bearer <token>`. The listener has the main listener's
//! `header_read_timeout` and `max_header_bytes`.

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
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use sluice::Error;
use sluice_core::Decision;
use sluice_http::admit::Verdict;
use sluice_http::{headers, key};

use crate::serve::state::Shared;

/// The largest `/v1/check` body.
pub const MAX_CHECK_BODY: usize = 64 * 1024;

/// The admin routes.
pub fn router(shared: &'static Shared) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/dashboard", get(crate::dashboard::page::page))
        .route("/v1/stats", get(crate::dashboard::page::stats))
        .route("/v1/policies", get(crate::serve::policies::list))
        .route(
            "/v1/policies/{name}",
            axum::routing::put(crate::serve::policies::update),
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
    let allowed = req.uri().path() == "/healthz" || {
        let runtime = shared.current();
        match runtime.config.server.admin_token.as_ref() {
            None => true,
            Some(token) => req
                .headers()
                .get(AUTHORIZATION)
                .and_then(|v| bearer(v.as_bytes()))
                .is_some_and(|presented| token.matches(presented)),
        }
    };
    if allowed {
        return next.run(req).await;
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
    let service = TowerToHyperService::new(router(shared));
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, _) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
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
        let connection = builder.serve_connection(TokioIo::new(stream), service.clone());
        let watched = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = watched.await;
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

fn problem(status: StatusCode, detail: &str) -> Response {
    headers::problem(status, detail).into_response()
}

async fn check(State(shared): State<&'static Shared>, body: Bytes) -> Response {
    let request: CheckRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("malformed JSON: {e}")),
    };
    let runtime = shared.current();
    let Some(policy) = runtime.policies.get(&request.policy) else {
        return problem(
            StatusCode::NOT_FOUND,
            &format!(
                "unknown policy `{}`",
                request.policy.chars().take(64).collect::<String>()
            ),
        );
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
