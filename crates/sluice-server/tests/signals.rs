//! SIGTERM drains, SIGHUP reloads keeping the buckets of unchanged policies and the state,
//! converted, of changed ones.

mod common;

use std::time::{Duration, Instant};

use common::{get, Gateway, Upstream};
use http::StatusCode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_finishes_requests_in_flight_refuses_new_ones_and_exits_0() {
    let up = Upstream::start().await;
    let mut gw = Gateway::start(
        "shutdown_timeout = \"10s\"",
        &format!(
            "[[route]]\npath_prefix = \"/\"\nupstream = \"{}\"\n",
            up.url()
        ),
    )
    .await;
    let slow_url = gw.url("/slow/1500");
    let slow = tokio::spawn(async move { get(&slow_url).await });
    // Wait until the upstream has the request: then it is in flight.
    let deadline = Instant::now() + Duration::from_secs(5);
    while up.count() < 1 {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let signalled = Instant::now();
    gw.signal("TERM");
    // New connections are refused soon after.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
            .await
            .is_err()
        {
            break;
        }
        assert!(Instant::now() < deadline, "still accepting after SIGTERM");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = slow.await.unwrap().expect("the slow request completes");
    assert_eq!(r.status, StatusCode::OK);
    let status = gw.wait_exit(Duration::from_secs(5)).await;
    assert!(status.success(), "exit status {status}");
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_millis(900),
        "exited before the request finished: {took:?}"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

fn config(upstream: &str, capacity: u32, extra_route: bool) -> String {
    let mut text = format!(
        r#"
[[policy]]
name = "api"
capacity = {capacity}
rate = "1/min"

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "{upstream}"
"#
    );
    if extra_route {
        text.push_str(&format!(
            "\n[[route]]\npath_prefix = \"/new/\"\nupstream = \"{upstream}\"\n"
        ));
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_keeping_state_and_refuses_invalid_configs() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url(), 2, false)).await;
    for _ in 0..2 {
        assert_eq!(get(&gw.url("/api/x")).await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        get(&gw.url("/api/x")).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(&gw.url("/new/x")).await.unwrap().status,
        StatusCode::NOT_FOUND
    );

    // Same policy, one more route: the route appears, the bucket stays empty.
    gw.rewrite("", &config(&up.url(), 2, true));
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(5))
        .await;
    assert_eq!(get(&gw.url("/new/x")).await.unwrap().status, StatusCode::OK);
    assert_eq!(
        get(&gw.url("/api/x")).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS,
        "an unchanged policy keeps its buckets"
    );

    // An invalid config is refused; the old one keeps serving.
    std::fs::write(&gw.config, "[[policy]]\nname = \"api\"\ncapacity = 0\n").unwrap();
    gw.signal("HUP");
    gw.wait_log("invalid config refused", Duration::from_secs(5))
        .await;
    assert!(
        gw.log_text().contains("policy[0].capacity"),
        "{}",
        gw.log_text()
    );
    assert_eq!(get(&gw.url("/new/x")).await.unwrap().status, StatusCode::OK);
    assert_eq!(
        get(&gw.url("/api/x")).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // A changed quota keeps what each key had left (nothing here), under the new limit.
    gw.rewrite("", &config(&up.url(), 3, true));
    gw.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.log_text().matches("SIGHUP: reloaded").count() < 2 {
        assert!(Instant::now() < deadline, "{}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = get(&gw.url("/api/x")).await.unwrap();
    assert_eq!(
        r.status,
        StatusCode::TOO_MANY_REQUESTS,
        "no key gains tokens"
    );
    assert_eq!(r.header("ratelimit-policy"), Some(r#""api";q=3;w=180"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_store_keeps_buckets_across_a_restart() {
    let up = Upstream::start().await;
    let dir = common::TempDir::new();
    let state = dir.0.join("state");
    let text = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\n{}",
        state.display(),
        config(&up.url(), 2, false)
    );
    let mut gw = Gateway::start("", &text).await;
    for _ in 0..2 {
        assert_eq!(get(&gw.url("/api/x")).await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(
        get(&gw.url("/api/x")).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS
    );
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(10)).await.success());
    assert!(dir.0.join("state.api").exists(), "one file per policy");
    // Same config, new process: the bucket is still empty.
    let again = Gateway::start("", &text).await;
    assert_eq!(
        get(&again.url("/api/x")).await.unwrap().status,
        StatusCode::TOO_MANY_REQUESTS,
        "restored, not refilled: {}",
        again.log_text()
    );
}
