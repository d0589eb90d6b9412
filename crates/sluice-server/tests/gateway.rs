//! The gateway end to end: headers, keys, trusted proxies, queues, errors, bad input.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, get, get_with, post, send, Gateway, Upstream};
use http::{Request, StatusCode};
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn routes(upstream: &str, policy: &str, route_extra: &str) -> String {
    format!(
        r#"
{policy}

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "{upstream}"
{route_extra}

[[route]]
path_prefix = "/free/"
upstream = "{upstream}"
"#
    )
}

/// A gateway with `server_extra` in `[server]`, and `/api/` limited to `capacity` requests a
/// minute per `key` (the policy's `key`, e.g. `ip` or `header:x-user`), the policy named `api`.
async fn per_minute(up: &Upstream, capacity: u64, key: &str, server_extra: &str) -> Gateway {
    let policy = format!(
        "[[policy]]\nname = \"api\"\ncapacity = {capacity}\nrate = \"1/min\"\nkey = \"{key}\""
    );
    Gateway::start(server_extra, &routes(&up.url(), &policy, "")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_of_a_limited_route_carries_the_headers() {
    let up = Upstream::start().await;
    let policy = "[[policy]]\nname = \"api\"\ncapacity = 3\nrate = \"1/min\"\nkey = \"global\"";
    let gw = Gateway::start("", &routes(&up.url(), policy, "")).await;
    for remaining in [2, 1, 0] {
        let r = get(&gw.url("/api/x")).await.unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("ratelimit-policy"), Some(r#""api";q=3;w=180"#));
        let expected = format!(r#""api";r={remaining};t="#);
        assert!(
            r.header("ratelimit").unwrap().starts_with(&expected),
            "{:?}",
            r.headers
        );
        assert!(r.header("retry-after").is_none());
        assert!(r.header("x-request-id").is_some());
    }
    let r = get(&gw.url("/api/x")).await.unwrap();
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("ratelimit-policy"), Some(r#""api";q=3;w=180"#));
    assert!(r
        .header("ratelimit")
        .unwrap()
        .starts_with(r#""api";r=0;t="#));
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((59..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    let problem = r.json();
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["reason"], "limit");
    assert_eq!(problem["policy"], "api");
    let ms = problem["retry_after_ms"].as_u64().unwrap();
    assert!((58_000..=60_000).contains(&ms), "retry_after_ms {ms}");
    assert_eq!(up.count(), 3);
    // An unlimited route carries none.
    let r = get(&gw.url("/free/x")).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.header("ratelimit").is_none() && r.header("ratelimit-policy").is_none());
    // No route: 404 problem.
    let r = get(&gw.url("/elsewhere")).await.unwrap();
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_cannot_walk_around_its_route() {
    let up = Upstream::start().await;
    let policy = "[[policy]]\nname = \"api\"\ncapacity = 3\nrate = \"1/min\"\nkey = \"global\"";
    let gw = Gateway::start("", &routes(&up.url(), policy, "")).await;
    // Each of these is `/api/x` to an upstream that resolves dot segments, merges slashes or
    // decodes `%61`: each is routed, limited and forwarded as `/api/x`.
    for path in ["/free/../api/x", "//api/x", "/%61pi/x?k=1"] {
        let r = get(&gw.url(path)).await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{path}");
        assert_eq!(r.json()["path"], "/api/x", "{path}");
        assert!(r.header("ratelimit").is_some(), "{path} was not limited");
    }
    let r = get(&gw.url("/free/%2e%2e/api/x")).await.unwrap();
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "the 4th on /api/");
    // An encoded slash next to `..` means `/api/x` only to upstreams that decode it first, and
    // `..;` only to those that drop `;` parameters: refused, never forwarded.
    for path in ["/free/..%2Fapi/x", "/free/..;/api/x", "/free\\..\\api/x"] {
        let r = get(&gw.url(path)).await.unwrap();
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert_eq!(r.json()["status"], 400);
    }
    // An encoded slash inside a segment is data, forwarded as it came.
    let r = get(&gw.url("/free/a%2Fb")).await.unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["path"], "/free/a%2Fb");
    assert_eq!(up.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_isolated() {
    let up = Upstream::start().await;
    let gw = per_minute(&up, 2, "header:x-user", "").await;
    let status = |r: common::Answer| r.status.as_u16();
    let mut alice = Vec::new();
    for _ in 0..3 {
        alice.push(status(
            get_with(&gw.url("/api/a"), &[("x-user", "alice")]).await,
        ));
    }
    assert_eq!(alice, [200, 200, 429]);
    let mut bob = Vec::new();
    for _ in 0..3 {
        bob.push(status(
            get_with(&gw.url("/api/b"), &[("x-user", "bob")]).await,
        ));
    }
    assert_eq!(bob, [200, 200, 429], "bob has his own bucket");
    // No header: one shared bucket (the empty key), so leaving it out is no way around.
    let anon: Vec<u16> = [
        get(&gw.url("/api/c")).await.unwrap(),
        get(&gw.url("/api/c")).await.unwrap(),
        get(&gw.url("/api/c")).await.unwrap(),
    ]
    .into_iter()
    .map(status)
    .collect();
    assert_eq!(anon, [200, 200, 429]);
    assert_eq!(up.count(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_cannot_be_spelled_two_ways() {
    let up = Upstream::start().await;
    let gw = per_minute(&up, 2, "query:api_key", "").await;
    // `abc`, however it is percent-encoded, is one bucket, as it is one key to the upstream.
    let mut statuses = Vec::new();
    for query in ["api_key=abc", "api_key=%61bc", "api%5Fkey=ab%63"] {
        statuses.push(
            get(&gw.url(&format!("/api/x?{query}")))
                .await
                .unwrap()
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 429]);
    // Two different values: which would the upstream read? Refused, not guessed.
    let r = get(&gw.url("/api/x?api_key=fresh&api_key=abc"))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(r.header("retry-after").is_none());
    let problem = r.json();
    assert_eq!(problem["reason"], "ambiguous_key");
    assert_eq!(problem["policy"], "api");
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("query:api_key"),
        "{problem}"
    );
    // The same value twice is one key.
    let r = get(&gw.url("/api/x?api_key=other&api_key=other"))
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(up.count(), 3);
}

const TRUST_LOCALHOST: &str = "trusted_proxies = [\"127.0.0.1/32\"]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_are_counted_by_their_64() {
    let up = Upstream::start().await;
    let gw = per_minute(&up, 2, "ip", TRUST_LOCALHOST).await;
    // One host picking a new address of its /64 for each request spends one bucket.
    let mut statuses = Vec::new();
    for client in ["2001:db8:1:2::a", "2001:db8:1:2:ffff::b", "2001:db8:1:2::c"] {
        let r = get_with(&gw.url("/api/x"), &[("x-forwarded-for", client)]).await;
        statuses.push(r.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 429]);
    // The next /64 is another client.
    let r = get_with(&gw.url("/api/x"), &[("x-forwarded-for", "2001:db8:1:3::a")]).await;
    assert_eq!(r.status, StatusCode::OK);
    // `X-Forwarded-For` still carries the address itself.
    assert_eq!(
        r.json()["headers"]["x-forwarded-for"],
        "2001:db8:1:3::a, 127.0.0.1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_forwarded_for_is_believed_only_from_trusted_proxies() {
    let up = Upstream::start().await;
    let trusted = per_minute(&up, 1, "ip", TRUST_LOCALHOST).await;
    // Behind a trusted proxy, each forwarded client has its own bucket.
    let a = get_with(
        &trusted.url("/api/x"),
        &[("x-forwarded-for", "203.0.113.1")],
    )
    .await;
    let b = get_with(
        &trusted.url("/api/x"),
        &[("x-forwarded-for", "6.6.6.6, 203.0.113.2")],
    )
    .await;
    let a2 = get_with(
        &trusted.url("/api/x"),
        &[("x-forwarded-for", "203.0.113.1")],
    )
    .await;
    assert_eq!(
        (a.status, b.status, a2.status),
        (
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        )
    );
    // The upstream sees the list with the peer appended.
    assert_eq!(
        b.json()["headers"]["x-forwarded-for"],
        "6.6.6.6, 203.0.113.2, 127.0.0.1"
    );
    // Nobody trusted: the header is ignored; all three share the peer's bucket.
    let untrusted = per_minute(&up, 1, "ip", "").await;
    let a = get_with(
        &untrusted.url("/api/x"),
        &[("x-forwarded-for", "203.0.113.1")],
    )
    .await;
    let b = get_with(
        &untrusted.url("/api/x"),
        &[("x-forwarded-for", "203.0.113.2")],
    )
    .await;
    assert_eq!(
        (a.status, b.status),
        (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS)
    );
    assert_eq!(
        a.json()["headers"]["x-forwarded-for"],
        "203.0.113.1, 127.0.0.1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_headers_are_removed() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "",
        &routes(
            &up.url(),
            "[[policy]]\nname = \"api\"\ncapacity = 9\nrate = \"1/s\"",
            "",
        ),
    )
    .await;
    let r = get_with(
        &gw.url("/free/x"),
        &[
            ("connection", "keep-alive, x-private"),
            ("x-private", "secret"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic eA=="),
            ("proxy-foo", "1"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("upgrade", "websocket"),
            ("x-kept", "yes"),
        ],
    )
    .await;
    let headers = &r.json()["headers"];
    for gone in [
        "x-private",
        "keep-alive",
        "proxy-authorization",
        "proxy-foo",
        "te",
        "trailer",
        "upgrade",
    ] {
        assert!(
            headers.get(gone).is_none(),
            "{gone} was forwarded: {headers}"
        );
    }
    assert_eq!(headers["x-kept"], "yes");
    assert!(
        headers["x-request-id"].is_string(),
        "the request id goes upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queues_keep_order_and_deadlines() {
    let up = Upstream::start().await;
    // One token every 200 ms; up to 5 wait, at most 900 ms each. With capacity 1 each late
    // wake of the gateway's timer delays every later turn (no admission is backdated), and a
    // request that arrives late is predicted a shorter wait: the 100 ms between the last turn
    // (800 ms) and the wait limit keep a loaded machine from turning either into a different
    // outcome.
    let policy = "[[policy]]\nname = \"api\"\nalgorithm = \"gcra\"\ncapacity = 1\nrate = \"5/s\"\nqueue = { depth = 5, max_wait = \"900ms\" }";
    let gw = Gateway::start("", &routes(&up.url(), policy, "queue_max_body = \"1KiB\"")).await;
    let client = client();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for seq in 0..8u32 {
        let (client, url) = (client.clone(), gw.url("/api/q"));
        tasks.push(tokio::spawn(async move {
            let req = Request::get(url)
                .header("x-seq", seq.to_string())
                .body(Full::default())
                .unwrap();
            let r = send(&client, req).await.unwrap();
            (
                seq,
                r.status,
                r.header("retry-after").map(str::to_owned),
                r.body,
                started.elapsed(),
            )
        }));
        // Arrive in order.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let admitted: Vec<u32> = results
        .iter()
        .filter(|r| r.1 == StatusCode::OK)
        .map(|r| r.0)
        .collect();
    // 0 at once, then 1..=4 at ~200, 400, 600, 800 ms (each within 900 ms); 5.. would wait
    // 1000 ms or more: denied at once with reason `timeout`.
    assert_eq!(admitted, [0, 1, 2, 3, 4], "{results:?}");
    for (seq, status, retry_after, body, took) in &results {
        if *seq >= 5 {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
            let problem: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert_eq!(problem["reason"], "timeout", "{problem}");
            assert!(retry_after.is_some());
            assert!(
                *took < Duration::from_millis(300),
                "denied at once, took {took:?}"
            );
        } else {
            let expected = Duration::from_millis(200 * u64::from(*seq));
            assert!(
                *took + Duration::from_millis(40) >= expected,
                "{seq} too early: {took:?}"
            );
            assert!(
                *took <= expected + Duration::from_millis(300),
                "{seq} too late: {took:?}"
            );
        }
    }
    let order = up.arrivals.lock().unwrap().clone();
    assert_eq!(order, ["0", "1", "2", "3", "4"], "FIFO");

    // A full queue: depth 5, all waiting.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (client, url) = (client.clone(), gw.url("/api/full"));
        tasks.push(tokio::spawn(async move {
            send(&client, Request::get(url).body(Full::default()).unwrap())
                .await
                .unwrap()
        }));
    }
    let mut reasons = Vec::new();
    for t in tasks {
        let r = t.await.unwrap();
        if r.status == StatusCode::TOO_MANY_REQUESTS {
            reasons.push(r.json()["reason"].as_str().unwrap().to_owned());
        }
    }
    assert!(
        !reasons.is_empty() && reasons.iter().all(|r| r == "queue_full" || r == "timeout"),
        "{reasons:?}"
    );

    // Bodies above queue_max_body never wait: denied at once with `limit`.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let _spend = get(&gw.url("/api/spend")).await.unwrap();
    let big = Request::post(gw.url("/api/big"))
        .body(Full::new(Bytes::from(vec![b'x'; 4096])))
        .unwrap();
    let t = Instant::now();
    let r = send(&client, big).await.unwrap();
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["reason"], "limit");
    assert!(t.elapsed() < Duration::from_millis(90));
    let small = Request::post(gw.url("/api/small"))
        .body(Full::new(Bytes::from_static(b"tiny")))
        .unwrap();
    let r = send(&client, small).await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "a small body waits its turn");
    assert_eq!(
        r.json()["body_len"],
        4,
        "the body is streamed to the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_errors_are_502_and_504_with_headers() {
    let closed = common::closed_port();
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "",
        &format!(
            r#"
[[policy]]
name = "api"
capacity = 100
rate = "100/s"

[[route]]
path_prefix = "/down/"
policies = ["api"]
upstream = "http://127.0.0.1:{closed}"

[[route]]
path_prefix = "/slow/"
policies = ["api"]
upstream = "{}"
upstream_timeout = "200ms"
"#,
            up.url()
        ),
    )
    .await;
    let r = get(&gw.url("/down/x")).await.unwrap();
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert!(r.header("ratelimit").is_some() && r.header("ratelimit-policy").is_some());
    let t = Instant::now();
    let r = get(&gw.url("/slow/2000")).await.unwrap();
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    assert!(r.header("ratelimit").is_some());
    let metrics = get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(
            r#"sluice_upstream_errors_total{route="/down/",error="refused",protocol="http1"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"sluice_upstream_errors_total{route="/slow/",error="timeout",protocol="http1"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"sluice_policy_admitted_total{policy="api",protocol="http1"} 2"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_decision_api() {
    let up = Upstream::start().await;
    let gw = per_minute(&up, 2, "header:x-user", "").await;
    let check = gw.admin("/v1/check");
    let r = post(&check, r#"{"policy": "api", "key": "user-42", "cost": 1}"#).await;
    assert_eq!(r.status, StatusCode::OK);
    let j = r.json();
    assert_eq!(j["allowed"], true);
    assert_eq!(
        (j["limit"].as_u64(), j["remaining"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(j["retry_after_ms"], 0);
    assert!(j["reset_after_ms"].as_u64().unwrap() > 0);
    assert!(r.header("ratelimit").is_some());
    let r = post(&check, r#"{"policy": "api", "key": "user-42", "cost": 2}"#).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.json()["allowed"], false);
    assert!(r.json()["retry_after_ms"].as_u64().unwrap() > 1000);
    assert!(r.header("retry-after").is_some());
    // The decision API and the proxy share the buckets.
    let via_proxy = get_with(&gw.url("/api/x"), &[("x-user", "user-42")]).await;
    assert_eq!(via_proxy.status, StatusCode::OK);
    let via_proxy = get_with(&gw.url("/api/x"), &[("x-user", "user-42")]).await;
    assert_eq!(via_proxy.status, StatusCode::TOO_MANY_REQUESTS);
    // Errors.
    assert_eq!(
        post(&check, r#"{"policy": "api", "key": "k", "cost": 3}"#)
            .await
            .status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        post(&check, r#"{"policy": "nope", "key": "k"}"#)
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    for bad in [
        r#"{"policy": "api""#,
        "",
        "null",
        r#"{"policy": 1}"#,
        r#"{"policy": "api", "cost": -1}"#,
        r#"{"policy":"api","colour":1}"#,
        "\u{0}",
    ] {
        let r = post(&check, bad).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
    }
    let huge = format!(r#"{{"policy": "api", "key": "{}"}}"#, "k".repeat(100_000));
    assert_eq!(
        post(&check, &huge).await.status,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    // A long key is hashed to a bucket of its own, the same every time.
    let long = format!(r#"{{"policy": "api", "key": "{}"}}"#, "k".repeat(5000));
    assert_eq!(post(&check, &long).await.json()["remaining"], 1);
    assert_eq!(post(&check, &long).await.json()["remaining"], 0);
    assert_eq!(
        get(&gw.admin("/healthz")).await.unwrap().status,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_the_server_keeps_serving() {
    let up = Upstream::start().await;
    let gw = per_minute(&up, 2, "header:x-key", "").await;
    // An oversized key is hashed: a bucket of its own, limited like any other.
    let long = "k".repeat(10_000);
    let statuses: Vec<u16> = [
        get_with(&gw.url("/api/x"), &[("x-key", &long)]).await,
        get_with(&gw.url("/api/x"), &[("x-key", &long)]).await,
        get_with(&gw.url("/api/x"), &[("x-key", &long)]).await,
    ]
    .iter()
    .map(|r| r.status.as_u16())
    .collect();
    assert_eq!(statuses, [200, 200, 429]);
    // Oversized headers: 431 from the HTTP layer.
    let huge = "h".repeat(40_000);
    let r = get_with(&gw.url("/api/x"), &[("x-huge", &huge)]).await;
    assert_eq!(r.status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    // Header bytes that are not UTF-8, and garbage on the wire.
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    raw.write_all(
        b"GET /api/x HTTP/1.1\r\nHost: x\r\nX-Key: \xff\xfe\xfd\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    raw.write_all(b"\x00\x01GARBAGE \xff\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer).await;
    assert!(
        answer.is_empty() || answer.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // Still serving.
    let r = get_with(&gw.url("/api/x"), &[("x-key", "fresh")]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        get(&gw.admin("/healthz")).await.unwrap().status,
        StatusCode::OK
    );
    let log = gw.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

/// Sends `request` on a fresh connection and reads until the gateway closes it.
async fn raw_exchange(port: u16, request: &[u8]) -> String {
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    raw.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "the gateway kept the connection open");
    String::from_utf8_lossy(&answer).into_owned()
}

/// The framings request smuggling relies on: the gateway and the upstream must never read a
/// different number of requests from one stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smuggling_framings_are_refused_or_reframed() {
    let up = Upstream::start().await;
    let policy = "[[policy]]\nname = \"api\"\ncapacity = 100\nrate = \"1/min\"";
    let gw = Gateway::start("", &routes(&up.url(), policy, "")).await;
    // Two different lengths: refused by the HTTP layer, nothing forwarded.
    let answer = raw_exchange(
        gw.port,
        b"POST /api/x HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcde",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert_eq!(up.count(), 0);
    // `Content-Length` beside `Transfer-Encoding: chunked`: the chunked framing wins, the
    // stale length is not forwarded, and the connection is closed after the answer (RFC 9112
    // §6.3), so the bytes after the last chunk are never read as a request.
    let answer = raw_exchange(
        gw.port,
        b"POST /api/x HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /free/next HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .await;
    assert_eq!(answer.matches("HTTP/1.1 ").count(), 1, "{answer}");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(answer.contains(r#""path":"/api/x""#), "{answer}");
    assert!(answer.contains(r#""body_len":0"#), "{answer}");
    assert!(!answer.contains(r#""content-length":"40""#), "{answer}");
    assert_eq!(up.count(), 1, "the trailing request was never forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connections_are_reused_and_closed_ones_replaced() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "workers = 1",
        &routes(
            &up.url(),
            "[[policy]]\nname = \"api\"\ncapacity = 9\nrate = \"1/s\"",
            "",
        ),
    )
    .await;
    let client = client();
    for i in 0..20 {
        // Every other answer closes its upstream connection.
        let path = if i % 2 == 0 {
            "/free/close"
        } else {
            "/free/keep"
        };
        let r = send(
            &client,
            Request::get(gw.url(path)).body(Full::default()).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(r.status, StatusCode::OK, "request {i}: {:?}", r.body);
    }
    // A large body, streamed through.
    let body = Full::new(Bytes::from(vec![b'z'; 200_000]));
    let r = send(
        &client,
        Request::post(gw.url("/free/upload")).body(body).unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.json()["body_len"], 200_000);
    assert_eq!(up.count(), 21);
}
