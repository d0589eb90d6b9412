//! `PaceLayer` over hyper's client against loopback servers: one that enforces a hidden limit
//! (a fixed window, announced in the IETF fields) and lowers it mid-run, and an OpenAI-style
//! one (requests and tokens) that requests declaring a token cost are paced by and reconciled
//! with. 8 concurrent callers, real sockets and real time, bounds with margins for a loaded
//! machine.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use parking_lot::Mutex;
use sluice_http::pace::{Cost, PaceLayer, Reconcile};
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

/// A token bucket of `capacity` refilled evenly over `WINDOW`, as OpenAI's limits are.
struct Bucket {
    capacity: f64,
    level: f64,
    at: Instant,
}

impl Bucket {
    fn new(capacity: f64) -> Bucket {
        Bucket {
            capacity,
            level: capacity,
            at: Instant::now(),
        }
    }
    fn refill(&mut self) {
        let now = Instant::now();
        let gained = self.capacity * (now - self.at).as_secs_f64() / WINDOW.as_secs_f64();
        self.level = (self.level + gained).min(self.capacity);
        self.at = now;
    }
    /// Time until full, as OpenAI's `x-ratelimit-reset-*` says it (a Go duration).
    fn reset(&self) -> String {
        let ms = (self.capacity - self.level) * WINDOW.as_secs_f64() * 1000.0 / self.capacity;
        if ms < 1000.0 {
            format!("{}ms", ms.ceil() as u64)
        } else {
            format!("{:.2}s", (ms / 10.0).ceil() / 100.0)
        }
    }
}

/// An OpenAI-style API: requests and tokens per `WINDOW` (two buckets); a request uses the
/// tokens its `x-use-tokens` header says, counted when it is admitted, and the answer says so
/// in its JSON body (`usage.total_tokens`) and in `x-usage-tokens`. With `announce_tokens`
/// false its fields name the request limit only (the token limit is enforced, unannounced).
struct OpenAiStandIn {
    requests: Mutex<Bucket>,
    tokens: Mutex<Bucket>,
    announce_tokens: bool,
    ok: AtomicU64,
    limited: AtomicU64,
}

impl OpenAiStandIn {
    fn answer(&self, asked: &HeaderMap) -> (StatusCode, HeaderMap, String) {
        let want: f64 = asked
            .get("x-use-tokens")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(100.0);
        let (mut requests, mut tokens) = (self.requests.lock(), self.tokens.lock());
        requests.refill();
        tokens.refill();
        let allowed = requests.level >= 1.0 && tokens.level >= want;
        if allowed {
            requests.level -= 1.0;
            tokens.level -= want;
            self.ok.fetch_add(1, Ordering::SeqCst);
        } else {
            self.limited.fetch_add(1, Ordering::SeqCst);
        }
        let mut h = HeaderMap::new();
        let mut put = |name: &'static str, value: String| {
            h.insert(name, value.parse().unwrap());
        };
        put("content-type", "application/json".into());
        put(
            "x-ratelimit-limit-requests",
            format!("{}", requests.capacity),
        );
        put(
            "x-ratelimit-remaining-requests",
            format!("{}", requests.level.floor()),
        );
        put("x-ratelimit-reset-requests", requests.reset());
        if self.announce_tokens {
            put("x-ratelimit-limit-tokens", format!("{}", tokens.capacity));
            put(
                "x-ratelimit-remaining-tokens",
                format!("{}", tokens.level.floor()),
            );
            put("x-ratelimit-reset-tokens", tokens.reset());
        }
        if allowed {
            put("x-usage-tokens", format!("{want}"));
            let body = format!("{{\"usage\":{{\"total_tokens\":{want}}}}}");
            (StatusCode::OK, h, body)
        } else {
            put("retry-after", "1".into());
            let body = "{\"error\":\"rate limited\"}".to_owned();
            (StatusCode::TOO_MANY_REQUESTS, h, body)
        }
    }
}

/// How a paced client learns what a request used.
#[derive(Clone, Copy, Debug)]
enum Usage {
    /// The drop in `x-ratelimit-remaining-tokens` (the answer's figure replaces the estimate).
    RemainingTokens,
    /// `usage.total_tokens` of the JSON body, given to the answer's `Reconcile`.
    Body,
    /// The layer's extractor, reading `x-usage-tokens` from the head.
    Extractor,
}

/// 8 callers for `RUN`, each request declaring `DECLARED` tokens and using `USED`, against an
/// OpenAI-style stand-in of 60 requests and 2,000 tokens per 2 s (the tokens bind: 20 requests
/// per 2 s). Returns the share of that rate served after the first window, and the 429s.
async fn declared_costs(usage: Usage) -> Result<(f64, u64), Box<dyn std::error::Error>> {
    const RUN: Duration = Duration::from_secs(10);
    const DECLARED: u64 = 300;
    const USED: u64 = 100;
    let api = Arc::new(OpenAiStandIn {
        requests: Mutex::new(Bucket::new(60.0)),
        tokens: Mutex::new(Bucket::new(2000.0)),
        announce_tokens: matches!(usage, Usage::RemainingTokens),
        ok: AtomicU64::new(0),
        limited: AtomicU64::new(0),
    });
    let server = api.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |h: HeaderMap| async move { server.answer(&h) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });

    let layer = match usage {
        // The server's fields name its token limit: they are what the pacer follows.
        Usage::RemainingTokens => PaceLayer::new(),
        // Silent about tokens: the client says the token limit it was given.
        Usage::Body => PaceLayer::with_limits(&[("tokens", 2000, WINDOW)]),
        Usage::Extractor => {
            PaceLayer::with_limits(&[("tokens", 2000, WINDOW)]).usage(|h: &HeaderMap| {
                let used = h.get("x-usage-tokens")?.to_str().ok()?.parse().ok()?;
                Some(Cost::tokens(used))
            })
        }
    };
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<bytes::Bytes>>();
    let paced = layer.layer(client);
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..8 {
        let paced = paced.clone();
        let url: http::Uri = format!("http://{addr}/v1/chat/completions").parse()?;
        workers.push(tokio::spawn(async move {
            let mut log = Vec::new();
            while start.elapsed() < RUN {
                let mut request = http::Request::post(url.clone())
                    .header("x-use-tokens", USED.to_string())
                    .body(Full::new(bytes::Bytes::from_static(b"{}")))
                    .unwrap();
                request.extensions_mut().insert(Cost::tokens(DECLARED));
                let response = paced
                    .clone()
                    .oneshot(request)
                    .await
                    .expect("loopback answers");
                let status = response.status().as_u16();
                let reconcile = response.extensions().get::<Reconcile>().cloned();
                let body = response.into_body().collect().await.expect("body");
                if let (Usage::Body, Some(reconcile), 200) = (usage, reconcile, status) {
                    let json: serde_json::Value =
                        serde_json::from_slice(&body.to_bytes()).expect("a JSON body");
                    let used = json["usage"]["total_tokens"].as_u64().expect("usage");
                    reconcile.used(&Cost::tokens(used));
                }
                log.push((start.elapsed(), status));
            }
            log
        }));
    }
    let mut log = Vec::new();
    for w in workers {
        log.extend(w.await?);
    }
    let served = log
        .iter()
        .filter(|(t, s)| *t >= WINDOW && *t < RUN && *s == 200)
        .count();
    // 2,000 tokens per 2 s at 100 a request.
    let allowed = 20.0 * (RUN - WINDOW).as_secs_f64() / WINDOW.as_secs_f64();
    let share = served as f64 / allowed;
    let limited = api.limited.load(Ordering::SeqCst);
    println!(
        "declared {DECLARED} tokens, used {USED}, usage from {usage:?}: {} answers, {limited} 429s in {RUN:?}; share of the token limit's rate {share:.3} (declared costs alone would allow {:.3})",
        log.len(),
        USED as f64 / DECLARED as f64
    );
    Ok((share, limited))
}

// Each bound: no more than one 429 (the requests would be sent at 30/s by the request limit
// alone, 3 times what the tokens allow), and at least 0.8 of the token rate, where the declared
// costs without reconciliation would allow 0.33.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_tokens_wait_on_the_token_limit_and_follow_the_remaining_tokens(
) -> Result<(), Box<dyn std::error::Error>> {
    let (share, limited) = declared_costs(Usage::RemainingTokens).await?;
    assert!(limited <= 1, "{limited} 429s");
    assert!((0.8..=1.2).contains(&share), "share {share}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_tokens_are_reconciled_from_the_json_usage(
) -> Result<(), Box<dyn std::error::Error>> {
    let (share, limited) = declared_costs(Usage::Body).await?;
    assert!(limited <= 1, "{limited} 429s");
    assert!((0.8..=1.2).contains(&share), "share {share}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_tokens_are_reconciled_by_the_layers_usage_extractor(
) -> Result<(), Box<dyn std::error::Error>> {
    let (share, limited) = declared_costs(Usage::Extractor).await?;
    assert!(limited <= 1, "{limited} 429s");
    assert!((0.8..=1.2).contains(&share), "share {share}");
    Ok(())
}
