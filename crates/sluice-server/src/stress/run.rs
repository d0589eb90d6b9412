//! The load itself: open loop at a fixed rate, bounded in flight, over pooled keep-alive
//! connections.
//!
//! Request `i` is due at `i × interval` from the start, whatever the earlier ones are doing
//! (open loop: a slow server does not slow the offered load down, as it would with a fixed
//! number of looping clients). When `concurrency` requests are already in flight, the next
//! one waits for a slot: it then starts late, and its latency is counted from when it was
//! due, not from when it could start, so the bound cannot hide a slow server (no
//! "coordinated omission"). Late starts are counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::stress::plan::Plan;

/// What one request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A response with this status, its body read to the end.
    Status(u16),
    /// No response.
    Error(ErrorKind),
}

/// Why a request got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// The connection could not be made (refused, unreachable).
    Connect,
    /// No complete response within `--timeout`.
    Timeout,
    /// The connection broke mid-way, or the response was malformed.
    Io,
}

impl ErrorKind {
    /// `connect`, `timeout`, `io`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Io => "io",
        }
    }
}

/// One finished request.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// What came back.
    pub answer: Answer,
    /// From when it was due to the end of its response, in nanoseconds.
    pub latency_ns: u64,
}

/// Live counters, for the progress line.
#[derive(Debug, Default)]
pub struct Progress {
    /// Requests started.
    pub sent: AtomicU64,
    /// Requests finished.
    pub done: AtomicU64,
    /// 2xx responses.
    pub ok: AtomicU64,
    /// 429 responses.
    pub limited: AtomicU64,
    /// Other responses.
    pub other: AtomicU64,
    /// No response.
    pub errors: AtomicU64,
}

/// Everything a run recorded.
#[derive(Debug, Default)]
pub struct Recorded {
    /// One per request, in the order they finished.
    pub samples: Vec<Sample>,
    /// Requests that started late because `concurrency` were in flight.
    pub late: u64,
    /// The latest such start, behind its due time, in nanoseconds.
    pub max_late_ns: u64,
    /// From the first send to the last answer.
    pub elapsed: Duration,
}

/// Sends the plan's load and waits for every answer.
pub async fn run(plan: &Plan, progress: Arc<Progress>) -> Recorded {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(plan.concurrency)
        .pool_idle_timeout(Duration::from_secs(30))
        .build_http();
    let slots = Arc::new(Semaphore::new(plan.concurrency));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(
        usize::try_from(plan.requests()).unwrap_or(0).min(1 << 24),
    )));
    let mut late = 0u64;
    let mut max_late_ns = 0u64;
    let start = Instant::now();
    for i in 0..plan.requests() {
        let due = start + Duration::from_nanos(i.saturating_mul(plan.interval_ns));
        tokio::time::sleep_until(due).await;
        let permit = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                // Every slot is taken: this request starts late.
                let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                    break;
                };
                let behind = Instant::now().saturating_duration_since(due);
                late += 1;
                max_late_ns = max_late_ns.max(u64::try_from(behind.as_nanos()).unwrap_or(u64::MAX));
                permit
            }
        };
        let mut request = Request::builder()
            .method(plan.method.clone())
            .uri(plan.url.clone())
            .body(Empty::<Bytes>::new())
            .unwrap_or_default();
        request.headers_mut().extend(plan.headers.clone());
        let (client, samples, progress) =
            (client.clone(), Arc::clone(&samples), Arc::clone(&progress));
        let timeout = plan.timeout;
        progress.sent.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            let answer = match tokio::time::timeout(timeout, send(&client, request)).await {
                Ok(answer) => answer,
                Err(_) => Answer::Error(ErrorKind::Timeout),
            };
            let latency_ns = u64::try_from(due.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let counter = match answer {
                Answer::Status(s) if (200..300).contains(&s) => &progress.ok,
                Answer::Status(429) => &progress.limited,
                Answer::Status(_) => &progress.other,
                Answer::Error(_) => &progress.errors,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut s) = samples.lock() {
                s.push(Sample { answer, latency_ns });
            }
            progress.done.fetch_add(1, Ordering::Relaxed);
            drop(permit);
        });
    }
    // Every slot back: every request answered (or timed out).
    let all = u32::try_from(plan.concurrency).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    let elapsed = start.elapsed();
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|e| e.into_inner()));
    Recorded {
        samples,
        late,
        max_late_ns,
        elapsed,
    }
}

type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

async fn send(client: &HttpClient, request: Request<Empty<Bytes>>) -> Answer {
    match client.request(request).await {
        Ok(response) => {
            let status = response.status().as_u16();
            match response.into_body().collect().await {
                Ok(_) => Answer::Status(status),
                Err(_) => Answer::Error(ErrorKind::Io),
            }
        }
        Err(e) if e.is_connect() => Answer::Error(ErrorKind::Connect),
        Err(_) => Answer::Error(ErrorKind::Io),
    }
}
