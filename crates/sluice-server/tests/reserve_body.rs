//! A reservation read from an OpenAI-compatible request body (`cost.reserve = "openai"`):
//! the gateway reads the body whole (within the route's `max_body`) before any policy
//! decides, reserves the answer's budget (`max_completion_tokens`, `max_tokens`, or the
//! policy's `max_tokens`) times `n` plus the body's length in bytes (a bound of the prompt's
//! tokens), forwards the same body, and settles the usage reported: an answer within its own
//! budget is only ever refunded, never charged.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::llm::LlmUpstream;
use common::{client, Gateway};
use http::Request;
use http_body_util::{BodyExt, Full};

const CAPACITY: u64 = 10_000;

fn config(upstream: &str) -> String {
    format!(
        "[[policy]]\nname = \"llm\"\nalgorithm = \"gcra\"\ncapacity = {CAPACITY}\nrate = \"{CAPACITY}/day\"\nkey = \"header:authorization\"\ncost = {{ reserve = \"openai\", max_tokens = 2000, settle = \"openai\" }}\n\
         [[route]]\npath_prefix = \"/v1/\"\npolicies = [\"llm\"]\nupstream = \"http://{upstream}\"\nmax_body = \"64KiB\"\n"
    )
}

/// Posts `body` as `key`, reporting `usage` tokens; returns the status and the RateLimit
/// remaining the gateway answered with (right after the reservation).
async fn post(gw: &Gateway, key: &str, body: &str, usage: u64) -> (u16, String) {
    let req = Request::post(gw.url("/v1/chat/completions"))
        .header("authorization", key)
        .header("content-type", "application/json")
        .header("x-test-usage", usage.to_string())
        .header("x-test-stream-ms", "10")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let response = client().request(req).await.unwrap();
    let status = response.status().as_u16();
    let rate_limit = response
        .headers()
        .get("ratelimit")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let _ = response.into_body().collect().await;
    (status, rate_limit)
}

/// The key's remaining tokens, read by `/v1/explain`.
async fn remaining(gw: &Gateway, key: &str) -> u64 {
    let body = format!(
        r#"{{"method": "POST", "path": "/v1/chat/completions", "headers": {{"authorization": "{key}"}}}}"#
    );
    let answer = common::post(&gw.admin("/v1/explain"), &body).await;
    answer.json()["policies"][0]["state"]["remaining"]
        .as_u64()
        .unwrap()
}

async fn settles_to(gw: &Gateway, key: &str, want: u64) {
    for _ in 0..100 {
        if remaining(gw, key).await == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(remaining(gw, key).await, want, "{key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reservation_is_read_from_the_body_and_only_refunded() {
    let upstream = LlmUpstream::start().await;
    let gw = Gateway::start("", &config(&upstream.addr)).await;
    let cases = [
        // (key, body, usage reported)
        (
            "max-tokens",
            r#"{"model":"m","max_tokens":300,"messages":[{"role":"user","content":"hi"}]}"#,
            250,
        ),
        (
            "max-completion-tokens",
            r#"{"model":"m","max_completion_tokens":120,"max_tokens":900,"n":2,"messages":[{"role":"user","content":"hello there"}]}"#,
            200,
        ),
        (
            "default",
            r#"{"model":"m","messages":[{"role":"user","content":"no budget given"}]}"#,
            1500,
        ),
        ("not-json", "plain words, not JSON", 30),
    ];
    for (key, body, usage) in cases {
        let reserve = match key {
            "max-tokens" => 300,
            "max-completion-tokens" => 240,
            _ => 2000,
        } + body.len() as u64;
        let (status, rate_limit) = post(&gw, key, body, usage).await;
        assert_eq!(status, 200, "{key}: {}", gw.log_text());
        assert!(
            rate_limit.contains(&format!("r={}", CAPACITY - reserve)),
            "{key}: reserved {reserve}, the answer said {rate_limit:?}"
        );
        // The usage reported is below the reservation: the difference comes back.
        settles_to(&gw, key, CAPACITY - usage).await;
        println!(
            "{key}: body {} bytes, reserved {reserve}, settled {usage}",
            body.len()
        );
    }
    let charged = common::metric(
        &gw,
        "sluice_settled_cost_total{policy=\"llm\",direction=\"charged\"}",
    )
    .await;
    assert_eq!(charged, 0.0, "an answer within its budget is never charged");
    // A budget above what is left (8,500) is refused before the upstream sees it; one above
    // the capacity can never be admitted.
    let greedy = r#"{"model":"m","max_tokens":9500,"messages":[]}"#;
    let (status, _) = post(&gw, "default", greedy, 1).await;
    assert_eq!(status, 429);
    let impossible = r#"{"model":"m","max_tokens":9990,"messages":[]}"#;
    let (status, _) = post(&gw, "default", impossible, 1).await;
    assert_eq!(status, 422);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_above_max_body_is_refused_before_any_token_is_taken() {
    let upstream = LlmUpstream::start().await;
    let gw = Gateway::start("", &config(&upstream.addr)).await;
    let big = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(70_000)
    );
    let (status, _) = post(&gw, "big", &big, 1).await;
    assert_eq!(status, 413);
    assert_eq!(remaining(&gw, "big").await, CAPACITY, "nothing was taken");
}
