//! gRPC through the gateway: what a gRPC client sees of a refusal (a Trailers-Only response
//! with a gRPC status, the wait as `grpc-retry-pushback-ms`), and real grpcio calls through
//! the `sluice` binary (unary, server streaming with trailers, a denial, a retry policy that
//! honours the pushback, an upstream that is down).

mod common;
#[allow(unused)]
mod pyenv;

use bytes::Bytes;
use common::{client, send, Gateway, Upstream};
use http::Request;
use http_body_util::Full;

/// One policy of one request per minute on `/test.Echo/` (to `upstream`), none on `/down/`
/// (to a closed port).
fn config(upstream: &str) -> String {
    let down = common::closed_port();
    format!(
        r#"
[[policy]]
name = "rpc"
algorithm = "gcra"
capacity = 1
rate = "1/min"
key = "global"

[[route]]
path_prefix = "/test.Echo/"
policies = ["rpc"]
upstream = "{upstream}"

[[route]]
path_prefix = "/down/"
upstream = "http://127.0.0.1:{down}"
"#
    )
}

fn grpc_post(url: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x05hello")))
        .unwrap()
}

/// A gRPC-framed request over HTTP/1.1 (as gRPC-Web clients send): the refusals are gRPC
/// statuses, a plain request's are HTTP statuses, and the metrics tell the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_refusals_are_trailers_only_statuses() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &config(&upstream.url())).await;
    let c = client();
    let first = send(&c, grpc_post(&gw.url("/test.Echo/Unary")))
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.header("grpc-status"), None, "the upstream's answer");

    let denied = send(&c, grpc_post(&gw.url("/test.Echo/Unary")))
        .await
        .unwrap();
    assert_eq!(denied.status, 200, "{denied:?}");
    assert_eq!(denied.header("content-type"), Some("application/grpc"));
    assert_eq!(denied.header("grpc-status"), Some("8"), "{denied:?}");
    let pushback: u64 = denied
        .header("grpc-retry-pushback-ms")
        .expect("grpc-retry-pushback-ms")
        .parse()
        .unwrap();
    assert!(
        (50_000..=60_000).contains(&pushback),
        "one token a minute, one taken: {pushback}"
    );
    let message = denied.header("grpc-message").unwrap();
    assert!(
        message.contains("policy rpc") && message.contains("reason limit"),
        "{message}"
    );
    assert_eq!(denied.header("ratelimit-policy"), Some(r#""rpc";q=1;w=60"#));
    assert!(denied
        .header("ratelimit")
        .unwrap()
        .starts_with(r#""rpc";r=0;t="#));
    assert_eq!(denied.header("retry-after"), None);
    assert!(denied.body.is_empty());

    // The same route without gRPC's content-type: the HTTP answer.
    let plain = send(
        &c,
        Request::post(gw.url("/test.Echo/Unary"))
            .body(Full::new(Bytes::from_static(b"x")))
            .unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(plain.status, 429);
    assert_eq!(
        plain.header("content-type"),
        Some("application/problem+json")
    );

    // Upstream down: UNAVAILABLE; no route: UNIMPLEMENTED.
    let down = send(&c, grpc_post(&gw.url("/down/x"))).await.unwrap();
    assert_eq!(down.status, 200);
    assert_eq!(down.header("grpc-status"), Some("14"), "{down:?}");
    assert!(down.header("grpc-message").unwrap().contains("(502)"));
    let nowhere = send(&c, grpc_post(&gw.url("/nowhere"))).await.unwrap();
    assert_eq!(nowhere.header("grpc-status"), Some("12"), "{nowhere:?}");

    let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    for line in [
        r#"sluice_policy_admitted_total{policy="rpc",protocol="grpc"} 1"#,
        r#"sluice_policy_admitted_total{policy="rpc",protocol="http1"} 0"#,
        r#"sluice_policy_denied_total{policy="rpc",reason="limit",protocol="grpc"} 1"#,
        r#"sluice_policy_denied_total{policy="rpc",reason="limit",protocol="http1"} 1"#,
        r#"sluice_upstream_errors_total{route="/down/",error="refused",protocol="grpc"} 1"#,
        r#"sluice_upstream_responses_total{route="/test.Echo/",status="2xx",protocol="grpc"} 1"#,
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
}
