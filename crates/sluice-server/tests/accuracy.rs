//! The gateway's exactness: capacity 10 at 5/s under 4 s of load at 100 req/s admits within 1
//! of 10 + 5 × 4, and the upstream sees exactly the admitted requests.

mod common;

use std::time::Duration;

use common::{api_10_at_5, client, send, Gateway, Upstream};
use http::{Request, StatusCode};
use http_body_util::Full;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admits_capacity_plus_rate_times_duration() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &api_10_at_5(&upstream.url())).await;
    let client = client();
    let url = gw.url("/api/load");
    // 400 requests, one every 10 ms: each starts on schedule, whatever the others take.
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for i in 0..400u32 {
        let (client, url) = (client.clone(), url.clone());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(start + Duration::from_millis(10 * u64::from(i))).await;
            send(&client, Request::get(url).body(Full::default()).unwrap())
                .await
                .unwrap()
                .status
        }));
    }
    let mut admitted = 0u64;
    let mut denied = 0u64;
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_secs(6), "load took {elapsed:?}");
    assert!(
        (29..=31).contains(&admitted),
        "admitted {admitted}, expected 30 ± 1"
    );
    assert_eq!(admitted + denied, 400);
    assert_eq!(
        upstream.count(),
        admitted,
        "the upstream sees exactly the admitted requests"
    );
}
