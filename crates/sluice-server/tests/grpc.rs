//! gRPC through the gateway: what a gRPC client sees of a refusal (a Trailers-Only response
//! with a gRPC status, the wait as `grpc-retry-pushback-ms`), and real grpcio calls through
//! the `sluice` binary (unary, server streaming with trailers, a denial, a retry policy that
//! honours the pushback, an upstream that is down).

mod common;
mod pyenv;

use std::time::Duration;

use bytes::Bytes;
use common::{client, send, Gateway, Upstream};
use http::Request;
use http_body_util::Full;
use pyenv::{python, run, Server};

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

    // A gRPC-Web client gets its refusal in its own content type family.
    for ct in ["application/grpc-web+proto", "application/grpc-web-text"] {
        let web = send(
            &c,
            Request::post(gw.url("/test.Echo/Unary"))
                .header("content-type", ct)
                .header("x-grpc-web", "1")
                .body(Full::new(Bytes::from_static(b"\0\0\0\0\x05hello")))
                .unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(web.status, 200, "{web:?}");
        assert_eq!(web.header("content-type"), Some(ct), "{web:?}");
        assert_eq!(web.header("grpc-status"), Some("8"), "{web:?}");
        assert!(web.header("ratelimit").is_some(), "{web:?}");
        assert!(web.body.is_empty());
    }

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
        r#"sluice_policy_denied_total{policy="rpc",reason="limit",protocol="grpc"} 3"#,
        r#"sluice_policy_denied_total{policy="rpc",reason="limit",protocol="http1"} 1"#,
        r#"sluice_upstream_errors_total{route="/down/",error="refused",protocol="grpc"} 1"#,
        r#"sluice_upstream_responses_total{route="/test.Echo/",status="2xx",protocol="grpc"} 1"#,
    ] {
        assert!(text.contains(line), "no {line} in\n{text}");
    }
}

/// The route `/test.Echo/` to the gRPC server at `port` (`h2c://`), under `policy` when
/// given (a `[[policy]]` named `rpc`).
fn h2c_config(port: u16, policy: Option<&str>) -> String {
    let (table, names) = match policy {
        Some(p) => (format!("[[policy]]\nname = \"rpc\"\n{p}\n"), r#"["rpc"]"#),
        None => (String::new(), "[]"),
    };
    format!(
        "{table}\n[[route]]\npath_prefix = \"/test.Echo/\"\npolicies = {names}\nupstream = \"h2c://127.0.0.1:{port}\"\n"
    )
}

/// Runs `grpc_client.py args...` on a blocking thread.
async fn grpc_client(py: &str, args: &[&str]) -> serde_json::Value {
    let py = py.to_owned();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&py, "grpc_client.py", &args, Duration::from_secs(60))
    })
    .await
    .unwrap()
}

/// grpcio through sluice (h2c in, h2c out): a unary call and a server-streaming call pass,
/// the stream message by message as the server sends them, the trailers with the server's
/// custom trailing metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_and_streaming_calls_pass_with_their_trailers() {
    let Some(py) = python() else { return };
    let server = Server::start(&py, "grpc_server.py", &[]);
    let gw = Gateway::start("h2c = true", &h2c_config(server.port, None)).await;
    let target = format!("127.0.0.1:{}", gw.port);

    let unary = grpc_client(&py, &["unary", &target]).await;
    assert_eq!(unary["code"], "OK", "{unary}");
    assert_eq!(unary["reply"], "hello", "{unary}");
    assert_eq!(unary["trailers"]["x-trailer"], "unary-done", "{unary}");

    // 5 messages 0.3 s apart: each arrives as it is sent, not all at the end.
    let stream = grpc_client(&py, &["stream", &target, "5"]).await;
    assert_eq!(stream["code"], "OK", "{stream}");
    assert_eq!(stream["trailers"]["x-trailer"], "stream-done", "{stream}");
    let messages = stream["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5, "{stream}");
    for (i, m) in messages.iter().enumerate() {
        assert_eq!(m[0], format!("msg {i}"), "{stream}");
    }
    let at = |i: usize| messages[i][1].as_f64().unwrap();
    for i in 1..5 {
        assert!(
            at(i) - at(i - 1) > 0.15,
            "message {i} came {:.3} s after the one before: buffered? {stream}",
            at(i) - at(i - 1)
        );
    }
    let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    let line =
        r#"sluice_upstream_responses_total{route="/test.Echo/",status="2xx",protocol="grpc"} 2"#;
    assert!(text.contains(line), "no {line} in\n{text}");
}

/// A bidirectional call whose client waits for each answer before it sends the next message
/// (a chat): every message reaches the server as it is sent, though the request body's length
/// is unknown and it stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bidirectional_call_streams_both_ways() {
    let Some(py) = python() else { return };
    let server = Server::start(&py, "grpc_server.py", &[]);
    let gw = Gateway::start("h2c = true", &h2c_config(server.port, None)).await;
    let target = format!("127.0.0.1:{}", gw.port);
    let chat = grpc_client(&py, &["chat", &target, "4"]).await;
    assert_eq!(chat["code"], "OK", "{chat}");
    assert_eq!(
        chat["answers"],
        serde_json::json!(["echo m0", "echo m1", "echo m2", "echo m3"]),
        "{chat}"
    );
}

/// A denied call fails in the client with RESOURCE_EXHAUSTED, sluice's message and the
/// pushback; an upstream that is down is UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_is_resource_exhausted_and_a_down_upstream_unavailable() {
    let Some(py) = python() else { return };
    let server = Server::start(&py, "grpc_server.py", &[]);
    let policy = "algorithm = \"gcra\"\ncapacity = 1\nrate = \"1/min\"";
    let gw = Gateway::start("h2c = true", &h2c_config(server.port, Some(policy))).await;
    let target = format!("127.0.0.1:{}", gw.port);
    let first = grpc_client(&py, &["call", &target]).await;
    assert_eq!(first["code"], "OK", "{first}");
    let denied = grpc_client(&py, &["call", &target]).await;
    assert_eq!(denied["code"], "RESOURCE_EXHAUSTED", "{denied}");
    let details = denied["details"].as_str().unwrap();
    assert!(
        details.contains("rate limit exhausted") && details.contains("policy rpc"),
        "{denied}"
    );
    let pushback: u64 = denied["trailers"]["grpc-retry-pushback-ms"]
        .as_str()
        .unwrap_or_else(|| panic!("no pushback: {denied}"))
        .parse()
        .unwrap();
    assert!((50_000..=60_000).contains(&pushback), "{denied}");
    assert_eq!(
        denied["trailers"]["ratelimit-policy"], r#""rpc";q=1;w=60"#,
        "{denied}"
    );

    let down = common::closed_port();
    let gw = Gateway::start("h2c = true", &h2c_config(down, None)).await;
    let target = format!("127.0.0.1:{}", gw.port);
    let unavailable = grpc_client(&py, &["call", &target]).await;
    assert_eq!(unavailable["code"], "UNAVAILABLE", "{unavailable}");
    assert!(
        unavailable["details"].as_str().unwrap().contains("(502)"),
        "{unavailable}"
    );
}

/// A client whose service config retries RESOURCE_EXHAUSTED (with backoffs of at most
/// 0.1 s, and 5 attempts) waits for the pushback before it retries, and then succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_policy_honours_the_pushback() {
    let Some(py) = python() else { return };
    let server = Server::start(&py, "grpc_server.py", &[]);
    let policy = "algorithm = \"gcra\"\ncapacity = 1\nrate = \"30/min\"";
    let gw = Gateway::start("h2c = true", &h2c_config(server.port, Some(policy))).await;
    let target = format!("127.0.0.1:{}", gw.port);
    let first = grpc_client(&py, &["call", &target]).await;
    assert_eq!(first["code"], "OK", "{first}");
    let retry = grpc_client(&py, &["retry", &target]).await;
    assert_eq!(retry["probe"], "RESOURCE_EXHAUSTED", "{retry}");
    let pushback = retry["pushback_ms"].as_f64().unwrap();
    assert!((500.0..=2000.0).contains(&pushback), "{retry}");
    assert_eq!(retry["result"], "OK", "the retry came too early: {retry}");
    let (elapsed, left) = (
        retry["elapsed_ms"].as_f64().unwrap(),
        retry["left_ms"].as_f64().unwrap(),
    );
    assert!(
        elapsed >= left - 20.0,
        "retried {elapsed:.0} ms into a wait of {left:.0} ms: {retry}"
    );
    let denied = r#"sluice_policy_denied_total{policy="rpc",reason="limit",protocol="grpc"}"#;
    let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.lines().any(|l| l.starts_with(denied)),
        "no {denied} in\n{text}"
    );
}
