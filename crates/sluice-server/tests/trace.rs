//! W3C trace context: `traceparent` and `tracestate` reach the upstream untouched, and the
//! access log line carries the trace id when the request has one.

mod common;

use common::{get_with, Gateway, Upstream};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_context_goes_upstream_untouched_and_into_the_access_log() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &common::api_10_at_5(&up.url())).await;
    let r = get_with(
        &gw.url("/api/traced"),
        &[("traceparent", TRACEPARENT), ("tracestate", TRACESTATE)],
    )
    .await;
    assert_eq!(r.status, 200);
    let seen = r.json();
    assert_eq!(seen["headers"]["traceparent"], TRACEPARENT);
    assert_eq!(seen["headers"]["tracestate"], TRACESTATE);
    // Malformed: passed on as it came, not logged as a trace id.
    let odd = "00-XYZ-00f067aa0ba902b7-01";
    let r = get_with(&gw.url("/api/odd"), &[("traceparent", odd)]).await;
    assert_eq!(r.json()["headers"]["traceparent"], odd);
    let r = get_with(&gw.url("/api/plain"), &[]).await;
    assert_eq!(r.status, 200);
    gw.wait_log("path=/api/plain", std::time::Duration::from_secs(5))
        .await;
    let log = gw.log_text();
    let line = |path: &str| {
        log.lines()
            .find(|l| l.contains("sluice::access") && l.contains(&format!("path={path} ")))
            .unwrap_or_else(|| panic!("no access line for {path}: {log}"))
            .to_owned()
    };
    assert!(
        line("/api/traced").contains("trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\""),
        "{log}"
    );
    assert!(!line("/api/odd").contains("trace_id"), "{log}");
    assert!(!line("/api/plain").contains("trace_id"), "{log}");
}
