//! The admin listener: the decision API, Prometheus metrics, health. Later the dashboard
//! (`/dashboard`) joins [`router`].
//!
//! | method and path | answer |
//! |---|---|
//! | `POST /v1/check` | `{"policy","key","cost"}` → 200 (allowed) or 429 (denied) with `{"allowed","limit","remaining","retry_after_ms","reset_after_ms"}`; 400 malformed JSON, 404 unknown policy, 413 body over 64 KiB, 422 a cost above the capacity, 503 store unavailable |
//! | `GET /metrics` | Prometheus text |
//! | `GET /healthz` | 200 `ok` |

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
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
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such admin endpoint") })
        .layer(DefaultBodyLimit::max(MAX_CHECK_BODY))
        .with_state(shared)
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
