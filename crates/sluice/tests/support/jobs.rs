//! Helpers of the job queue tests: workers run until a condition, admission times read back
//! from Redis, and the check of a bucket's bound over every window of them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use sluice::jobs::{Done, Failure, Job, JobQueue, Worker, WorkerOptions};
use sluice_core::{AnyAlgorithm, Kind, Quota};

use super::process::unix_ns;

pub fn gcra(capacity: u64, rate: &str) -> AnyAlgorithm {
    AnyAlgorithm::new(Kind::Gcra, Quota::parse(capacity, rate).unwrap())
}

pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

pub fn unique(label: &str) -> String {
    format!("{label}-{}", unix_ns())
}

/// Runs `worker` with `handler` until `done` says so (checked every 20 ms) or `limit` passes.
pub async fn run_until<H, F>(
    workers: Vec<Arc<Worker>>,
    handler: H,
    limit: Duration,
    done: impl Fn() -> bool + Send + Sync + 'static,
) where
    H: Fn(Job) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Result<Done, Failure>> + Send + 'static,
{
    let done = Arc::new(done);
    let mut tasks = Vec::new();
    for w in workers {
        let done = done.clone();
        let handler = handler.clone();
        tasks.push(tokio::spawn(w.run(handler, async move {
            let end = Instant::now() + limit;
            while !done() && Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

pub fn workers(queue: &JobQueue, n: usize, slots: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|_| {
            let options = WorkerOptions::new()
                .slots(slots)
                .poll(Duration::from_millis(20));
            Arc::new(Worker::new(queue.clone(), options).unwrap())
        })
        .collect()
}

/// The admission times (Redis's, ns) and costs of the jobs of `group` kept after completion.
pub async fn admissions(url: &str, queue: &JobQueue, group: &str) -> Vec<(u64, u64)> {
    let mut conn = raw(url).await;
    let jobs: HashMap<String, String> = conn.hgetall(&queue.group_keys(group)[1]).await.unwrap();
    let field = |json: &str, name: &str| -> u64 {
        let tag = format!("\"{name}\":\"");
        let at = json
            .find(&tag)
            .unwrap_or_else(|| panic!("{name} in {json}"))
            + tag.len();
        json[at..].split('"').next().unwrap().parse().unwrap()
    };
    // Jobs never admitted have no admission time.
    let mut out: Vec<(u64, u64)> = jobs
        .values()
        .filter(|j| !j.contains("\"st\":\"\""))
        .map(|j| (field(j, "st"), field(j, "c")))
        .collect();
    out.sort();
    out
}

/// The worst excess, over every window [t_i, t_j] of the admissions, of the tokens admitted
/// over what a bucket of `capacity` refilling one token per `interval_ns` allows:
/// `capacity + floor((t_j - t_i) / interval)`. Zero or less: the bound held in every window.
pub fn worst_window(adm: &[(u64, u64)], capacity: u64, interval_ns: u64) -> i64 {
    let mut worst = i64::MIN;
    for i in 0..adm.len() {
        let mut tokens = 0u64;
        for j in i..adm.len() {
            tokens += adm[j].1;
            let allowed = capacity + (adm[j].0 - adm[i].0) / interval_ns;
            worst = worst.max(tokens as i64 - allowed as i64);
        }
    }
    worst
}

/// A condition true once `groups` of `queue` have completed `n` jobs between them (for
/// [`run_until`], which polls it from a multi-threaded runtime).
pub fn completed(
    queue: &JobQueue,
    groups: &[&str],
    n: u64,
) -> impl Fn() -> bool + Send + Sync + 'static {
    let queue = queue.clone();
    let groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
    move || {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                let mut done = 0;
                for g in &groups {
                    done += queue.stats(g).await.unwrap().completed;
                }
                done >= n
            })
        })
    }
}
