//! The handlers: `GET /dashboard` (one self-contained page), `GET /v1/stats` (its data) and
//! `GET /v1/jobs` (the job queues of `[jobs]`, which the page reads when `/v1/stats` says
//! there are some).

use std::sync::OnceLock;

use axum::extract::State;
use axum::http::header::{CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::dashboard::stats;
use crate::runtime::state::Shared;

const HTML: &str = include_str!("assets/index.html");
const CSS: &str = include_str!("assets/dashboard.css");
const JS: &str = include_str!("assets/dashboard.js");

/// What the page may load: nothing from elsewhere, and only `v1/stats` from here. The
/// style and script are inline, so the page works offline and as a single request.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The dashboard page, with its style and script inlined.
pub fn html() -> &'static str {
    static PAGE: OnceLock<String> = OnceLock::new();
    PAGE.get_or_init(|| {
        HTML.replacen("/*STYLE*/", CSS, 1)
            .replacen("/*SCRIPT*/", JS, 1)
    })
}

/// `GET /dashboard`.
pub async fn page() -> Response {
    let mut response = html().into_response();
    let h = response.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `GET /v1/stats`.
pub async fn stats(State(shared): State<&'static Shared>) -> Response {
    let metrics = shared.metrics_text();
    let runtime = shared.current();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut body = stats::snapshot(&runtime, &metrics, now_ms).await;
    body["jobs"] = shared
        .jobs
        .as_ref()
        .map_or(serde_json::Value::Null, |jobs| {
            let c = jobs.config();
            serde_json::json!({
                "queues": c.queues,
                "interval_ms": u64::try_from(c.interval.as_millis()).unwrap_or(u64::MAX),
            })
        });
    json(StatusCode::OK, &body)
}

/// `GET /v1/jobs`: each `[jobs]` queue's groups and their figures, read from Redis now; 404
/// without `[jobs]`.
pub async fn jobs(State(shared): State<&'static Shared>) -> Response {
    match &shared.jobs {
        Some(jobs) => json(StatusCode::OK, &jobs.snapshot().await),
        None => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({ "error": "no [jobs] in the configuration: no job queue is watched" }),
        ),
    }
}

fn json(status: StatusCode, body: &serde_json::Value) -> Response {
    let mut response = (status, body.to_string()).into_response();
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_whole_and_self_contained() {
        let page = html();
        assert!(!page.contains("/*STYLE*/") && !page.contains("/*SCRIPT*/"));
        assert!(page.contains("sluiceDashboard"));
        assert!(page.contains("--ok:"));
        // Nothing fetched from elsewhere.
        for needle in [
            "http://",
            "https://",
            "//cdn",
            "src=\"",
            "rel=\"stylesheet\"",
        ] {
            assert!(!page.contains(needle), "the page mentions {needle}");
        }
    }
}
