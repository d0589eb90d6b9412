//! What the gateway tells an upstream about a client: `Forwarded` believed and passed on
//! only from trusted proxies, and `X-Request-Id` made up and echoed, or left alone with
//! `request_id = false`. Real sockets on 127.0.0.1 against the built binary.

mod common;

use common::config::two_routes;
use common::{get, Gateway};
use http::StatusCode;

/// `/api/` limited to one request a minute per client address, in front of `up`.
fn one_per_minute_per_ip(up: &str) -> String {
    format!(
        "[[policy]]\nname = \"api\"\ncapacity = 1\nrate = \"1/min\"\nkey = \"ip\"\n\n\
         [[route]]\npath_prefix = \"/api/\"\npolicies = [\"api\"]\nupstream = \"{up}\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_is_believed_and_passed_on_only_from_trusted_proxies() {
    let up = common::Upstream::start().await;
    // The test's own address is not trusted: a client's Forwarded never reaches the upstream.
    let gw = Gateway::start(
        "trusted_proxies = [\"10.0.0.0/8\"]",
        &one_per_minute_per_ip(&up.url()),
    )
    .await;
    let a = common::get_with(&gw.url("/api/x"), &[("forwarded", "for=203.0.113.9")]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.json()["headers"].get("forwarded").is_none(),
        "{:?}",
        a.body
    );
    // Nor does it choose the bucket: the second request from this address is denied.
    let a = common::get_with(&gw.url("/api/x"), &[("forwarded", "for=203.0.113.10")]).await;
    assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
    drop(gw);

    // From a trusted proxy: its Forwarded names the client, and is passed on.
    let gw = Gateway::start(
        "trusted_proxies = [\"127.0.0.1\"]",
        &one_per_minute_per_ip(&up.url()),
    )
    .await;
    let header = "for=\"[2001:db8::7]:4711\";proto=http, for=203.0.113.9";
    let a = common::get_with(&gw.url("/api/x"), &[("forwarded", header)]).await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json()["headers"]["forwarded"], header);
    let a = common::get_with(&gw.url("/api/x"), &[("forwarded", "for=203.0.113.9")]).await;
    assert_eq!(
        a.status,
        StatusCode::TOO_MANY_REQUESTS,
        "one bucket per client"
    );
    let a = common::get_with(&gw.url("/api/x"), &[("forwarded", "for=203.0.113.10")]).await;
    assert_eq!(a.status, StatusCode::OK, "another client, another bucket");
    // The access line is written once the answer is sent: wait for it, within a bound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !gw.log_text().contains("client=203.0.113.10") && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(gw.log_text().contains("client=203.0.113.10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_id_false_neither_makes_up_nor_echoes_an_id() {
    let up = common::Upstream::start().await;
    let gw = Gateway::start("request_id = false", &two_routes(&up.url(), "")).await;
    let a = get(&gw.url("/api/x")).await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.header("x-request-id").is_none());
    assert!(a.json()["headers"].get("x-request-id").is_none());
    // A client's id is passed on untouched, even one the gateway would have replaced.
    for id in ["edge-7f3a", "not visible ascii ✓"] {
        let a = common::get_with(&gw.url("/api/x"), &[("x-request-id", id)]).await;
        assert!(a.header("x-request-id").is_none());
        assert_eq!(a.json()["headers"]["x-request-id"], id);
    }
    let log = gw.log_text();
    assert!(log.contains("request_id=\"edge-7f3a\""), "{log}");
    // The browser paths the gateway answers itself are no different.
    let browser = format!(
        "{}\n[browser]\ncapacity = 10\nrate = \"1/s\"\n",
        two_routes(&up.url(), "")
    );
    let gw = Gateway::start("request_id = false", &browser).await;
    let a = get(&gw.url("/sluice/config.json")).await.unwrap();
    assert_eq!(a.status, StatusCode::OK);
    assert!(
        a.header("x-request-id").is_none(),
        "{:?}",
        a.header("x-request-id")
    );
    let a = common::get_with(
        &gw.url("/sluice/config.json"),
        &[("x-request-id", "page-41")],
    )
    .await;
    assert!(a.header("x-request-id").is_none());
    let log = gw.log_text();
    assert!(log.contains("request_id=\"page-41\""), "{log}");
    // The default makes one up and echoes it.
    let gw = Gateway::start("", &two_routes(&up.url(), "")).await;
    let a = get(&gw.url("/api/x")).await.unwrap();
    let id = a.header("x-request-id").expect("an id").to_owned();
    assert_eq!(a.json()["headers"]["x-request-id"], id.as_str());
}
