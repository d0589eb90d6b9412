//! `PaceLayer` over hyper's client against a loopback server that enforces a hidden limit (a
//! fixed window, announced in the IETF fields) and lowers it mid-run: 8 concurrent callers,
//! real sockets and real time, bounds with margins for a loaded machine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use sluice_http::pace::PaceLayer;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const WINDOW: Duration = Duration::from_secs(2);
const PHASE: Duration = Duration::from_secs(6);

/// The hidden limit: `limit` per fixed `WINDOW` from `start`.
struct Hidden {
    start: Instant,
    limit: AtomicU64,
    used: Mutex<(u128, u64)>,
}

impl Hidden {
    fn answer(&self) -> (StatusCode, HeaderMap) {
        let elapsed = self.start.elapsed();
        let index = elapsed.as_nanos() / WINDOW.as_nanos();
        let limit = self.limit.load(Ordering::SeqCst);
        let mut used = self.used.lock();
        if used.0 != index {
            *used = (index, 0);
        }
        let allowed = used.1 < limit;
        if allowed {
            used.1 += 1;
        }
        let end = WINDOW.as_secs_f64() * (index + 1) as f64;
        let t = (end - elapsed.as_secs_f64()).ceil() as u64;
        let mut h = HeaderMap::new();
        let w = WINDOW.as_secs();
        h.insert(
            "ratelimit-policy",
            format!("\"api\";q={limit};w={w}").parse().unwrap(),
        );
        h.insert(
            "ratelimit",
            format!("\"api\";r={};t={t}", limit.saturating_sub(used.1))
                .parse()
                .unwrap(),
        );
        if !allowed {
            h.insert("retry-after", t.max(1).to_string().parse().unwrap());
        }
        let status = if allowed {
            StatusCode::OK
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        (status, h)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_callers_follow_a_hidden_limit_and_its_change(
) -> Result<(), Box<dyn std::error::Error>> {
    let hidden = Arc::new(Hidden {
        start: Instant::now(),
        limit: AtomicU64::new(20),
        used: Mutex::new((0, 0)),
    });
    let server = hidden.clone();
    let app = axum::Router::new().route("/", get(move || async move { server.answer() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>();
    let paced = PaceLayer::new().layer(client);
    let start = hidden.start;
    let lower = hidden.clone();
    tokio::spawn(async move {
        tokio::time::sleep_until(start + PHASE).await;
        lower.limit.store(10, Ordering::SeqCst);
    });
    let mut workers = Vec::new();
    for _ in 0..8 {
        let paced = paced.clone();
        let url: http::Uri = format!("http://{addr}/").parse()?;
        workers.push(tokio::spawn(async move {
            let mut log = Vec::new();
            while start.elapsed() < 2 * PHASE {
                let request = http::Request::get(url.clone()).body(Empty::new()).unwrap();
                let response = paced
                    .clone()
                    .oneshot(request)
                    .await
                    .expect("loopback answers");
                let status = response.status().as_u16();
                response.into_body().collect().await.expect("body");
                log.push((start.elapsed(), status));
            }
            log
        }));
    }
    let mut log = Vec::new();
    for w in workers {
        log.extend(w.await?);
    }
    let count = |from: Duration, to: Duration, status: u16| {
        log.iter()
            .filter(|(t, s)| *t >= from && *t < to && *s == status)
            .count()
    };
    let limited = log.iter().filter(|(_, s)| *s == 429).count();
    // Steady state of each phase, after its first window: 20, then 10, per 2 s.
    let before = count(WINDOW, PHASE, 200) as f64
        / (20.0 * (PHASE - WINDOW).as_secs_f64() / WINDOW.as_secs_f64());
    let after = count(PHASE + WINDOW, 2 * PHASE, 200) as f64
        / (10.0 * (PHASE - WINDOW).as_secs_f64() / WINDOW.as_secs_f64());
    println!("PaceLayer over hyper: {} answers, {limited} 429s in {:?}; share of the hidden rate {before:.3} at 20/2 s, {after:.3} after the change to 10/2 s", log.len(), 2 * PHASE);
    assert!(limited <= 2, "{limited} 429s");
    // A fixed window announced in whole seconds (`t` rounded up) is read as ending up to 1 s
    // late, and the pacer never spends before the reset it read: up to half of a 2 s window
    // can go unused (the loss is 1 s per window, so 1.7 % of a 60 s one).
    assert!((0.7..=1.25).contains(&before), "before: {before}");
    assert!((0.7..=1.25).contains(&after), "after: {after}");
    Ok(())
}
