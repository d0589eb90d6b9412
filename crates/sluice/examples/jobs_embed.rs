//! Embedding a corpus through an LLM API with a tokens-per-minute limit per API key, as durable
//! jobs: `cargo run -p sluice --example jobs_embed [REDIS_URL]` (default
//! redis://127.0.0.1:6379).
//!
//! A stand-in embedding API on 127.0.0.1 plays the provider: it allows each key 6,000 tokens a
//! second (its own count, which the queue never sees) and answers 429 with `Retry-After` beyond
//! that. The queue holds each key to the same rate with the gateway's bucket (a
//! `RedisStore` with prefix `sluice:embed`, so a gateway policy `embed` on a store prefixed
//! `sluice` shares it), charges each document's estimated tokens when it starts and settles
//! the tokens the API reports when it ends. Node workers of the npm package may join the same
//! queue.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::jobs::{Done, Failure, Job, JobQueue, NewJob, QueueOptions, Worker, WorkerOptions};
use sluice::store::{RedisConfig, RedisStore};
use sluice_core::{AnyAlgorithm, Kind, Quota};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The API's own limit per key, tokens per second.
const API_TOKENS_PER_SECOND: u64 = 6_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| String::from("redis://127.0.0.1:6379"));
    let api = stand_in_api().await?;
    let redis = RedisConfig::new(url).prefix("sluice:embed");
    let tpm = AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(6_000, "6000/s")?);
    let store = RedisStore::connect(tpm, redis.clone()).await?;
    let name = format!("embed-{}", std::process::id());
    let options = QueueOptions::new()
        .limit_of(&store)
        .concurrency(4)
        .max_debt(6_000);
    let queue = JobQueue::connect(&redis, &name, options).await?;

    // 60 documents for three API keys; a document's estimate is its length in tokens, rounded
    // up to the next thousand: the API reports what it really used.
    for i in 0..60u64 {
        let key = ["key-a", "key-b", "key-c"][i as usize % 3];
        let tokens = 500 + (i * 377) % 2_500;
        let estimate = tokens.div_ceil(1_000) * 1_000;
        let job = NewJob::new(key, format!("{tokens}"))
            .cost(estimate)
            .idempotency_key(format!("doc-{i}"))
            .max_attempts(5);
        queue.enqueue(job).await?;
    }

    let worker = Arc::new(Worker::new(queue.clone(), WorkerOptions::new().slots(8))?);
    let start = Instant::now();
    let watcher = queue.clone();
    let done = async move {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let mut completed = 0;
            for key in ["key-a", "key-b", "key-c"] {
                completed += watcher.stats(key).await.map_or(0, |s| s.completed);
            }
            if completed >= 60 {
                return;
            }
        }
    };
    let report = worker.run(move |job: Job| embed(api, job), done).await;
    println!("60 documents in {:.1?}: {report:?}", start.elapsed());
    for (key, s) in queue.all_stats().await? {
        println!(
            "{key}: completed {}, retried {}, dead {}",
            s.completed, s.retried, s.dead
        );
    }
    for key in ["key-a", "key-b", "key-c"] {
        queue.purge(key, sluice::jobs::Purge::All).await?;
    }
    Ok(())
}

/// One job: POST the document to the API; 200 reports the tokens used, 429 the wait.
async fn embed(api: u16, job: Job) -> Result<Done, Failure> {
    let io = |e: std::io::Error| Failure::new(e.to_string());
    let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", api))
        .await
        .map_err(io)?;
    let body = String::from_utf8_lossy(&job.payload).into_owned();
    let request = format!(
        "POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        job.group,
        body.len()
    );
    sock.write_all(request.as_bytes()).await.map_err(io)?;
    let mut answer = String::new();
    sock.read_to_string(&mut answer).await.map_err(io)?;
    let header = |name: &str| {
        answer
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    match answer.split(' ').nth(1) {
        Some("200") => {
            let used = header("x-tokens-used:").and_then(|v| v.parse().ok());
            Ok(used.map_or_else(Done::new, Done::with_cost))
        }
        Some("429") => {
            let failure = Failure::new("429 from the API");
            match header("retry-after:") {
                Some(wait) => Err(failure
                    .retry_after_header(wait)
                    .unwrap_or_else(|e| Failure::new(e.to_string()))),
                None => Err(failure),
            }
        }
        other => Err(Failure::new(format!("the API answered {other:?}"))),
    }
}

/// The provider: per key, a bucket of `API_TOKENS_PER_SECOND` refilling as much a second;
/// answers 429 with `Retry-After` (seconds) when a document's tokens are not there.
async fn stand_in_api() -> std::io::Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let buckets: Arc<parking_lot::Mutex<HashMap<String, (f64, Instant)>>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let buckets = buckets.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut len = 0;
                let text = loop {
                    match sock.read(&mut buf[len..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => len += n,
                    }
                    let text = String::from_utf8_lossy(&buf[..len]).into_owned();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let want = head
                            .lines()
                            .find_map(|l| l.strip_prefix("Content-Length: "))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        if body.len() >= want {
                            break text;
                        }
                    }
                    if len == buf.len() {
                        return;
                    }
                };
                let key = text
                    .lines()
                    .find_map(|l| l.strip_prefix("Authorization: Bearer "))
                    .unwrap_or("")
                    .to_string();
                let tokens: f64 = text
                    .split("\r\n\r\n")
                    .nth(1)
                    .and_then(|b| b.trim().parse().ok())
                    .unwrap_or(1.0);
                let rate = API_TOKENS_PER_SECOND as f64;
                let reply = {
                    let mut buckets = buckets.lock();
                    let (level, at) = buckets.entry(key).or_insert((rate, Instant::now()));
                    *level = (*level + at.elapsed().as_secs_f64() * rate).min(rate);
                    *at = Instant::now();
                    if *level >= tokens {
                        *level -= tokens;
                        format!("HTTP/1.1 200 OK\r\nx-tokens-used: {tokens}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    } else {
                        let wait = ((tokens - *level) / rate).ceil() as u64;
                        format!("HTTP/1.1 429 Too Many Requests\r\nretry-after: {wait}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    }
                };
                let _ = sock.write_all(reply.as_bytes()).await;
            });
        }
    });
    Ok(port)
}
