//! A token quota through `sluice serve`, as a README user writes it: an OpenAI-compatible
//! upstream behind a `gcra` policy of 10,000 tokens per 20 s per API key, each request
//! reserving 1,000 tokens and settled on the answer's `usage`. Clients of several kinds (each
//! its own key, all at once, in real time) ask for chat completions, JSON and streamed, and
//! wait out each 429's `Retry-After`; every window of every client's run is held to the bound
//! of the README's "Settled cost".
//!
//! **The bound checked.** Count an answer's tokens (its `usage.total_tokens`) at its
//! admission. Over any window that ends at an admission, T long, the tokens of the answers
//! admitted in it are at most `capacity + rate × T`, plus the overage (usage above the
//! reservation) of those of them still streaming at the window's end, plus the refunds
//! (reservation above usage) of earlier answers settled within it. Why: the bucket holds at
//! most `capacity` at the window's start, gains at most `rate × T` in it, and holds at least
//! nothing right after the window's last admission; what it gave out in between is the
//! reservations of the answers admitted and the settlements made, and an answer admitted in
//! the window and settled in it has paid its usage whole. A window ending later than its last
//! admission counts the same answers over a longer T, so these windows are the strictest.
//! (Counting an answer at its end instead, or ending a window after the answer ended, cannot
//! be bounded this way: one answer of 20,000 tokens ends inside a window of 1 s whatever the
//! gateway does; the debt it leaves is what keeps the next ones out.)
//!
//! The test sees the gateway from outside, so each time is taken on the side that keeps the
//! bound honest: an admission lies between the request being sent and its arrival at the
//! upstream, so a window's length is counted from the first send to the last arrival (plus
//! [`CLOCK_MARGIN`]); an answer counts as still streaming at an admission unless the client
//! saw its end [`SETTLE_MARGIN`] before that request was sent; an answer whose admission
//! might fall in the window but is not sure to is left out of the tokens and counted in the
//! overage and the refunds.
//!
//! `SLUICE_TOKEN_QUOTA_SECS` sets how long the clients run (default 55 s);
//! `scripts/bench-token-quota.sh` runs them for 5 minutes.

mod common;
#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::llm::LlmUpstream;
use common::{client, Gateway, HttpClient};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

const CAPACITY: u64 = 10_000;
/// The policy's rate as the config writes it, and the same in tokens per second.
const RATE: &str = "10000 per 20s";
const PER_SECOND: f64 = 500.0;
const RESERVE: u64 = 1_000;
/// Added to every window's length: the gateway's and Redis's clocks against the test's.
const CLOCK_MARGIN: Duration = Duration::from_millis(100);
/// How long after the client saw an answer end its settlement may still be on its way to the
/// store (the gateway settles as the end goes through; the store's round trip follows).
const SETTLE_MARGIN: Duration = Duration::from_millis(50);
/// The longest a client waits on a 429 before asking again, whatever `Retry-After` says:
/// a client polling with a bounded back-off, which a gateway must refuse as long as the key
/// owes.
const MAX_WAIT: Duration = Duration::from_secs(5);

/// The policy of the README's worked example, scaled to 10,000 tokens per 20 s, on `/v1/`.
fn config(upstream: &str, store: &str) -> String {
    format!(
        r#"{store}

[[policy]]
name = "llm"
algorithm = "gcra"
capacity = {CAPACITY}
rate = "{RATE}"
key = "header:authorization"
cost = {{ reserve = {RESERVE}, settle = "openai" }}

[[route]]
path_prefix = "/v1/"
policies = ["llm"]
upstream = "http://{upstream}"
"#
    )
}

/// A Redis store. A charge whose round trip outlasts `timeout` is not sent again (the
/// estimate stands), so the timeout is generous: a test machine busy with other suites must
/// not turn a slow answer into a lost charge (losing Redis is the paused test's business).
fn redis_store(redis: &redis_support::RedisServer, timeout: &str, on_error: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"{timeout}\"\non_error = \"{on_error}\"\n",
        redis.url()
    )
}

/// What the answers of a client report.
#[derive(Clone, Copy)]
enum Usage {
    /// Always this many tokens.
    Fixed(u64),
    /// 800 to 1,500 tokens, spread evenly: near the reservation.
    Honest,
}

impl Usage {
    fn of(self, n: u64) -> u64 {
        match self {
            Usage::Fixed(tokens) => tokens,
            Usage::Honest => 800 + (n * 379) % 701,
        }
    }
}

/// One client kind: its own API key, its answers' usage, how many requests it keeps in
/// flight, and how long each answer streams, on the memory or the Redis store.
#[derive(Clone)]
struct Row {
    label: &'static str,
    /// `redis` or `memory`: the gateway it goes through.
    store: &'static str,
    key: &'static str,
    usage: Usage,
    parallel: usize,
    stream_ms: u64,
}

/// One answered request (200), as the client saw it, with its arrival at the upstream.
#[derive(Debug, Clone, Copy)]
struct Call {
    sent: Instant,
    arrived: Instant,
    ended: Instant,
    usage: u64,
}

/// What one row's clients got.
struct Outcome {
    calls: Vec<Call>,
    refused: u64,
    started: Instant,
    stopped: Instant,
}

/// A chat completion request as an OpenAI client sends it: every other one streamed, asking
/// for the usage chunk.
fn chat_request(gw: &Gateway, row: &Row, call: &str, n: u64) -> Request<Full<Bytes>> {
    let stream = n.is_multiple_of(2);
    let mut body = serde_json::json!({
        "model": "test-model",
        "messages": [{ "role": "user", "content": "Say something." }],
        "stream": stream,
    });
    if stream {
        body["stream_options"] = serde_json::json!({ "include_usage": true });
    }
    Request::post(gw.url("/v1/chat/completions"))
        .header("authorization", format!("Bearer sk-{}", row.key))
        .header("content-type", "application/json")
        .header("x-test-usage", row.usage.of(n).to_string())
        .header("x-test-stream-ms", row.stream_ms.to_string())
        .header("x-test-call", call)
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The `usage.total_tokens` a client reads in an answer: of the JSON object, or of the last
/// server-sent event carrying a usage.
fn reported_usage(body: &[u8], streamed: bool) -> Option<u64> {
    let text = std::str::from_utf8(body).ok()?;
    if !streamed {
        let json: serde_json::Value = serde_json::from_str(text).ok()?;
        return json["usage"]["total_tokens"].as_u64();
    }
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|e| e["usage"]["total_tokens"].as_u64())
}

/// One client of `row` asking until `until`: each 200 read to its end and recorded, each 429
/// waited out (its `Retry-After`, at most [`MAX_WAIT`]).
async fn client_loop(
    gw: Arc<Gateway>,
    upstream: Arc<LlmUpstream>,
    http: HttpClient,
    row: Row,
    worker: usize,
    until: Instant,
) -> (Vec<Call>, u64) {
    let (mut calls, mut refused) = (Vec::new(), 0);
    let mut n = worker as u64 * 1_000_000;
    while Instant::now() < until {
        n += 1;
        let call = format!("{}-{n}", row.key);
        let sent = Instant::now();
        let response = http
            .request(chat_request(&gw, &row, &call, n))
            .await
            .unwrap_or_else(|e| panic!("{call}: {e:?}\n{}", gw.log_text()));
        let status = response.status();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        match status {
            StatusCode::OK => {
                let ended = Instant::now();
                let usage = reported_usage(&body, n.is_multiple_of(2));
                assert_eq!(
                    usage,
                    Some(row.usage.of(n)),
                    "{call}: the answer went through whole: {body:?}"
                );
                let arrived = upstream
                    .arrival(&call)
                    .unwrap_or_else(|| panic!("{call} never reached the upstream"));
                calls.push(Call {
                    sent,
                    arrived,
                    ended,
                    usage: row.usage.of(n),
                });
            }
            StatusCode::TOO_MANY_REQUESTS => {
                refused += 1;
                let wait = Duration::from_secs(retry_after.expect("a 429 says when to retry"))
                    .clamp(Duration::from_millis(100), MAX_WAIT)
                    .min(until.saturating_duration_since(Instant::now()));
                tokio::time::sleep(wait).await;
            }
            other => panic!("{call}: {other} {body:?}\n{}", gw.log_text()),
        }
    }
    (calls, refused)
}

/// Runs `row`'s clients against `gw` for `run`.
async fn drive(
    gw: Arc<Gateway>,
    upstream: Arc<LlmUpstream>,
    row: Row,
    run: Duration,
) -> (Row, Outcome) {
    let started = Instant::now();
    let until = started + run;
    let http = client();
    let workers: Vec<_> = (0..row.parallel)
        .map(|w| {
            tokio::spawn(client_loop(
                Arc::clone(&gw),
                Arc::clone(&upstream),
                http.clone(),
                row.clone(),
                w,
                until,
            ))
        })
        .collect();
    let (mut calls, mut refused) = (Vec::new(), 0);
    for w in workers {
        let (c, r) = w.await.unwrap();
        calls.extend(c);
        refused += r;
    }
    calls.sort_by_key(|c| c.sent);
    let stopped = Instant::now();
    (
        row,
        Outcome {
            calls,
            refused,
            started,
            stopped,
        },
    )
}

/// One window's tokens against its bound.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// From the first request sent to the last arrival at the upstream.
    span: Duration,
    delivered: u64,
    bound: f64,
    answers: usize,
}

impl Window {
    fn ratio(&self) -> f64 {
        self.delivered as f64 / self.bound
    }
}

/// The window from `calls[i]`'s send to `calls[j]`'s arrival at the upstream (`calls` sorted
/// by send time, `i <= j`), `counted` picking the answers whose tokens count (the others are
/// treated as possibly admitted in it).
fn window(calls: &[Call], i: usize, j: usize, counted: &dyn Fn(usize) -> bool) -> Window {
    let (start, end, last_sent) = (calls[i].sent, calls[j].arrived, calls[j].sent);
    let span = end.saturating_duration_since(start);
    let (mut delivered, mut answers, mut overage, mut refunds) = (0, 0, 0, 0);
    for (k, c) in calls.iter().enumerate() {
        // Surely admitted within [start, end].
        let inside = c.sent >= start && c.arrived <= end && counted(k);
        // Possibly admitted within it.
        let maybe = c.sent <= end && c.arrived >= start;
        if inside {
            delivered += c.usage;
            answers += 1;
        }
        if maybe && c.ended + SETTLE_MARGIN > last_sent {
            // Maybe still streaming at the window's last admission: its overage may be
            // unpaid there.
            overage += c.usage.saturating_sub(RESERVE);
        }
        if !inside && c.sent < end && c.ended + SETTLE_MARGIN >= start {
            // Maybe admitted before the window and settled in it: its refund may have gone
            // back into the bucket during the window.
            refunds += RESERVE.saturating_sub(c.usage);
        }
    }
    let bound = CAPACITY as f64
        + PER_SECOND * (span + CLOCK_MARGIN).as_secs_f64()
        + overage as f64
        + refunds as f64;
    Window {
        span,
        delivered,
        bound,
        answers,
    }
}

/// What a row's windows came to.
struct Verdict {
    whole: Window,
    worst_5s: Option<Window>,
    worst_20s: Option<Window>,
    worst: Option<Window>,
    /// The windows above their bound.
    over: Vec<Window>,
}

/// Every window of `calls` (from one send to a later arrival), the answers `counted` picks.
fn judge(calls: &[Call], counted: &dyn Fn(usize) -> bool) -> Verdict {
    let worse = |a: Option<Window>, w: Window| match a {
        Some(a) if a.ratio() >= w.ratio() => Some(a),
        _ => Some(w),
    };
    let (mut worst_5s, mut worst_20s, mut worst, mut over) = (None, None, None, Vec::new());
    for i in 0..calls.len() {
        for j in i..calls.len() {
            let w = window(calls, i, j, counted);
            if w.answers == 0 {
                continue;
            }
            if w.delivered as f64 > w.bound {
                over.push(w);
            }
            if w.span <= Duration::from_secs(5) {
                worst_5s = worse(worst_5s, w);
            }
            if w.span <= Duration::from_secs(20) {
                worst_20s = worse(worst_20s, w);
            }
            worst = worse(worst, w);
        }
    }
    // The whole run: from the first send to the last arrival.
    let last = (0..calls.len()).max_by_key(|&k| calls[k].arrived);
    let whole = match last {
        Some(last) => window(calls, 0, last, counted),
        None => Window {
            span: Duration::ZERO,
            delivered: 0,
            bound: CAPACITY as f64,
            answers: 0,
        },
    };
    Verdict {
        whole,
        worst_5s,
        worst_20s,
        worst,
        over,
    }
}

fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ratio(w: Option<Window>) -> String {
    w.map_or("-".into(), |w| {
        format!("{:.2} ({:.1} s)", w.ratio(), w.span.as_secs_f64())
    })
}

/// Prints the table of `rows`: per row, the answers, the 429s, the whole run's tokens against
/// its bound, the same against the plain quota `capacity + rate × run`, and the worst window
/// of at most 5 s, of at most 20 s and of any length (its ratio, and its span).
fn print_table(title: &str, rows: &[(Row, &Outcome, &Verdict)]) {
    println!("\n{title}\n");
    println!(
        "| row | store | 200 | 429 | tokens delivered | bound | ratio | quota (capacity + rate x run) | delivered / quota | worst window <= 5 s | <= 20 s | any |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (row, outcome, verdict) in rows {
        let run = outcome.stopped - outcome.started;
        let quota = CAPACITY as f64 + PER_SECOND * run.as_secs_f64();
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} ({:.0} s) | {:.2} | {} | {} | {} |",
            row.label,
            row.store,
            verdict.whole.answers,
            outcome.refused,
            thousands(verdict.whole.delivered),
            thousands(verdict.whole.bound as u64),
            verdict.whole.ratio(),
            thousands(quota as u64),
            run.as_secs_f64(),
            verdict.whole.delivered as f64 / quota,
            ratio(verdict.worst_5s),
            ratio(verdict.worst_20s),
            ratio(verdict.worst),
        );
    }
    println!();
}

/// How long the clients run: `SLUICE_TOKEN_QUOTA_SECS`, or `default`.
fn run_length(default: u64) -> Duration {
    let secs = std::env::var("SLUICE_TOKEN_QUOTA_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    Duration::from_secs(secs)
}

/// The rows of the quota, each on its own key: answers of 20,000 tokens (twice the capacity)
/// one at a time and four at a time, of 8,000, the same 20,000 on the memory store, and an
/// honest client near its reservation.
fn rows(stream_ms: u64, honest_stream_ms: u64) -> Vec<Row> {
    let row = |label, store, key, usage, parallel, stream_ms| Row {
        label,
        store,
        key,
        usage,
        parallel,
        stream_ms,
    };
    let heavy = Usage::Fixed(20_000);
    vec![
        row(
            "1. 20,000 per answer, 1 at a time",
            "redis",
            "heavy",
            heavy,
            1,
            stream_ms,
        ),
        row(
            "2. 20,000 per answer, 4 at a time",
            "redis",
            "heavy4",
            heavy,
            4,
            stream_ms,
        ),
        row(
            "3. 8,000 per answer, 1 at a time",
            "redis",
            "mid",
            Usage::Fixed(8_000),
            1,
            stream_ms,
        ),
        row(
            "4. 20,000 per answer, 1 at a time",
            "memory",
            "heavy-mem",
            heavy,
            1,
            stream_ms,
        ),
        row(
            "5. honest: 800 to 1,500, 1 at a time",
            "redis",
            "honest",
            Usage::Honest,
            1,
            honest_stream_ms,
        ),
    ]
}

/// The sum of `series` on `gw`'s `/metrics`.
async fn metric(gw: &Gateway, series: &str) -> f64 {
    common::metric(gw, series).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_of_every_client_keeps_the_bound() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let upstream = Arc::new(LlmUpstream::start().await);
    let on_redis = Arc::new(
        Gateway::start(
            "",
            &config(&upstream.addr, &redis_store(&redis, "2s", "deny")),
        )
        .await,
    );
    let on_memory = Arc::new(Gateway::start("", &config(&upstream.addr, "")).await);
    let run = run_length(55);
    let began = Instant::now();
    let drives: Vec<_> = rows(400, 400)
        .into_iter()
        .map(|row| {
            let gw = if row.store == "memory" {
                &on_memory
            } else {
                &on_redis
            };
            tokio::spawn(drive(Arc::clone(gw), Arc::clone(&upstream), row, run))
        })
        .collect();
    let mut outcomes = Vec::new();
    for d in drives {
        outcomes.push(d.await.unwrap());
    }
    let took = began.elapsed();
    let verdicts: Vec<Verdict> = outcomes
        .iter()
        .map(|(_, o)| judge(&o.calls, &|_| true))
        .collect();
    let table: Vec<_> = outcomes
        .iter()
        .zip(&verdicts)
        .map(|((row, outcome), verdict)| (row.clone(), outcome, verdict))
        .collect();
    print_table(
        &format!(
            "Token quota: capacity {CAPACITY}, rate \"{RATE}\", reserve {RESERVE}, settle \"openai\"; clients ran {:.0} s",
            took.as_secs_f64()
        ),
        &table,
    );
    for gw in [&on_redis, &on_memory] {
        let forgiven = metric(
            gw,
            "sluice_settled_cost_total{policy=\"llm\",direction=\"forgiven\"}",
        )
        .await;
        let fallbacks = metric(gw, "sluice_store_fallbacks_total").await;
        println!(
            "gateway on port {}: tokens forgiven {}, decisions by the fallback {}",
            gw.port, forgiven as u64, fallbacks as u64
        );
        assert_eq!(
            forgiven, 0.0,
            "no cap on the debt: every charge is taken whole"
        );
        assert_eq!(fallbacks, 0.0, "Redis answered every decision");
    }
    for ((row, outcome), verdict) in outcomes.iter().zip(&verdicts) {
        assert!(
            verdict.over.is_empty(),
            "{}: {} windows above the bound, the first {:?}; calls {:?}",
            row.label,
            verdict.over.len(),
            verdict.over[0],
            outcome.calls
        );
        assert!(
            verdict.whole.answers >= 2,
            "{}: at least the burst was admitted: {:?}",
            row.label,
            outcome.calls
        );
    }
    // The honest client, refused only once it spent what the quota gives, got most of it.
    let honest = table.iter().find(|t| t.0.key == "honest").unwrap();
    let run = honest.1.stopped - honest.1.started;
    let quota = CAPACITY as f64 + PER_SECOND * run.as_secs_f64();
    assert!(
        honest.2.whole.delivered as f64 >= 0.8 * quota,
        "the honest client got {} of a quota of {quota}",
        honest.2.whole.delivered
    );
}

/// Redis stops answering (SIGSTOP) for 2.25 s while answers admitted by it stream, then
/// comes back (SIGCONT), under `on_error = "local"`. While it is stopped the gateway decides
/// with a bucket of its own, so what it admitted then (every answer whose admission may fall
/// between the SIGSTOP and 2.5 s after the SIGCONT, by which time the gateway is back on
/// Redis) is left out of the count; the answers Redis admitted are held to the bound. Their
/// settlements are due to Redis: a charge made elsewhere, or lost, would let Redis admit the
/// debt over again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_paused_while_settling_keeps_the_bound() {
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let upstream = Arc::new(LlmUpstream::start().await);
    let gw = Arc::new(
        Gateway::start(
            "",
            &config(&upstream.addr, &redis_store(&redis, "200ms", "local")),
        )
        .await,
    );
    let run = Duration::from_secs(25);
    // The heavy answers stream for 1.5 s, so the SIGSTOP finds them streaming and they settle
    // while Redis is stopped; the honest client keeps asking meanwhile.
    let drives: Vec<_> = rows(1500, 400)
        .into_iter()
        .filter(|row| row.store == "redis")
        .map(|row| tokio::spawn(drive(Arc::clone(&gw), Arc::clone(&upstream), row, run)))
        .collect();
    tokio::time::sleep(Duration::from_millis(750)).await;
    redis.signal("STOP");
    let stopped = Instant::now();
    tokio::time::sleep(Duration::from_millis(2250)).await;
    redis.signal("CONT");
    let resumed = Instant::now();
    let mut outcomes = Vec::new();
    for d in drives {
        outcomes.push(d.await.unwrap());
    }
    let local_until = resumed + Duration::from_millis(2500);
    let verdicts: Vec<Verdict> = outcomes
        .iter()
        .map(|(_, o)| {
            let calls = &o.calls;
            judge(calls, &|k| {
                calls[k].arrived < stopped || calls[k].sent > local_until
            })
        })
        .collect();
    let table: Vec<_> = outcomes
        .iter()
        .zip(&verdicts)
        .map(|((row, outcome), verdict)| (row.clone(), outcome, verdict))
        .collect();
    print_table(
        "Redis stopped 0.75 s to 3.0 s into the run, on_error = \"local\" (answers it may have admitted locally left out)",
        &table,
    );
    for (row, outcome) in &outcomes {
        let left_out = outcome
            .calls
            .iter()
            .filter(|c| !(c.arrived < stopped || c.sent > local_until))
            .count();
        println!(
            "{}: {left_out} of {} answers left out (possibly admitted locally)",
            row.label,
            outcome.calls.len()
        );
    }
    let log = gw.log_text();
    let forgiven = metric(
        &gw,
        "sluice_settled_cost_total{policy=\"llm\",direction=\"forgiven\"}",
    )
    .await;
    let fallbacks = metric(&gw, "sluice_store_fallbacks_total").await;
    println!(
        "tokens forgiven {}, decisions by the fallback {}",
        forgiven as u64, fallbacks as u64
    );
    assert!(log.contains("redis store down"), "{log}");
    assert!(log.contains("redis store recovered"), "{log}");
    for ((row, outcome), verdict) in outcomes.iter().zip(&verdicts) {
        assert!(
            verdict.over.is_empty(),
            "{}: {} windows above the bound, the worst {:?}; calls {:?}",
            row.label,
            verdict.over.len(),
            verdict.worst,
            outcome.calls
        );
    }
}
