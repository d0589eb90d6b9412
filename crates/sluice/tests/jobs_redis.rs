//! The job queue against real redis-server processes: a worker killed with SIGKILL mid-job
//! loses no job, and idempotency keys keep every effect once; a group's bound holds in every
//! window across 4 worker processes; fairness between a group of 10,000 jobs and one of 10;
//! weighted costs and settled costs; a stand-in API's Retry-After; one bucket shared with
//! `RedisStore` (the gateway's); priorities, delays, dead letters; Redis Cluster, with each
//! group's keys in one slot.
//!
//! Real time is needed here (Redis has its own clock): admission times are Redis's own (each
//! job keeps the time its bucket admitted it), and the bounds are checked on them exactly.

#![cfg(feature = "redis")]

mod support;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use sluice::jobs::{
    Done, Failure, Job, JobQueue, NewJob, Purge, QueueOptions, Worker, WorkerOptions,
};
use sluice::store::{OnError, RedisConfig, RedisStore, Store};
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::process::{helper, lines_with, role, unix_ns};
use support::redis::{RedisCluster, RedisServer};

/// Held by the tests that measure time, so that they do not load the machine together.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn gcra(capacity: u64, rate: &str) -> AnyAlgorithm {
    AnyAlgorithm::new(Kind::Gcra, Quota::parse(capacity, rate).unwrap())
}

async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

fn unique(label: &str) -> String {
    format!("{label}-{}", unix_ns())
}

/// Runs `worker` with `handler` until `done` says so (checked every 20 ms) or `limit` passes.
async fn run_until<H, F>(
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

fn workers(queue: &JobQueue, n: usize, slots: usize) -> Vec<Arc<Worker>> {
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
async fn admissions(url: &str, queue: &JobQueue, group: &str) -> Vec<(u64, u64)> {
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
fn worst_window(adm: &[(u64, u64)], capacity: u64, interval_ns: u64) -> i64 {
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

// === a worker killed mid-job ===

/// The helper: a worker process of `SLUICE_QUEUE` with 2 slots. Each job prints `START <id>`,
/// sleeps 150 ms, applies its effect once per idempotency key (`SET effect:<key> NX`, and
/// `INCR runs:<key>` every time), sleeps 150 ms, and completes.
#[test]
fn helper_jobs_worker() {
    let Some(_role) = role() else { return };
    let url = std::env::var("SLUICE_REDIS_URL").unwrap();
    let name = std::env::var("SLUICE_QUEUE").unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let queue = JobQueue::connect(&RedisConfig::new(url.clone()), &name, kill_options())
            .await
            .unwrap();
        let worker = Arc::new(
            Worker::new(
                queue,
                WorkerOptions::new()
                    .slots(2)
                    .poll(Duration::from_millis(20)),
            )
            .unwrap(),
        );
        println!();
        worker
            .run(effect_handler(url), std::future::pending())
            .await;
    });
}

fn kill_options() -> QueueOptions {
    QueueOptions::new().visibility(Duration::from_millis(1500))
}

/// A job's effect, made once per idempotency key.
fn effect_handler(
    url: String,
) -> impl Fn(Job) -> std::pin::Pin<Box<dyn Future<Output = Result<Done, Failure>> + Send>>
       + Clone
       + Send
       + Sync
       + 'static {
    move |job: Job| {
        let url = url.clone();
        Box::pin(async move {
            println!("START {} {} {}", job.id, job.attempt, job.reclaimed);
            let mut conn = raw(&url).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
            let key = job
                .idempotency_key
                .clone()
                .expect("every job here has a key");
            let _: () = conn.incr(format!("runs:{key}"), 1).await.unwrap();
            let first: bool = redis::cmd("SET")
                .arg(format!("effect:{key}"))
                .arg(&job.id)
                .arg("NX")
                .query_async::<Option<String>>(&mut conn)
                .await
                .unwrap()
                .is_some();
            if !first {
                let _: () = conn.incr("effects-refused", 1).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok(Done::new())
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_job_loses_none_and_keys_keep_each_effect_once() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("kill");
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, kill_options())
        .await
        .unwrap();
    let n = 40u64;
    for i in 0..n {
        let job =
            NewJob::new(format!("g{}", i % 4), format!("job {i}")).idempotency_key(format!("k{i}"));
        assert!(queue.enqueue(job.clone()).await.unwrap().added);
        // Enqueued again (a producer retrying): the key makes it one job.
        assert!(!queue.enqueue(job).await.unwrap().added);
    }
    let mut child = helper("helper_jobs_worker", "worker")
        .env("SLUICE_REDIS_URL", server.url())
        .env("SLUICE_QUEUE", &name)
        .spawn()
        .unwrap();
    // Killed 220 ms after its 6th start: that job has had its effect (at 150 ms) and is not
    // acknowledged (at 300 ms); another may be before its effect.
    let stdout = child.stdout.take().unwrap();
    let started = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut started = 0;
        while started < 6 {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("START ") => started += 1,
                Some(_) => {}
                None => break,
            }
        }
        started
    })
    .await
    .unwrap();
    assert_eq!(started, 6, "the worker process stopped early");
    tokio::time::sleep(Duration::from_millis(220)).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = Instant::now();
    // Another worker takes over: the dead worker's entries come back after the visibility
    // timeout.
    let groups = ["g0", "g1", "g2", "g3"];
    let all_done = {
        let queue = queue.clone();
        move || {
            let queue = queue.clone();
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let mut done = 0;
                    for g in ["g0", "g1", "g2", "g3"] {
                        done += queue.stats(g).await.unwrap().completed;
                    }
                    done
                })
            }) >= 40
        }
    };
    run_until(
        workers(&queue, 1, 4),
        effect_handler(server.url()),
        Duration::from_secs(30),
        all_done,
    )
    .await;
    let mut conn = raw(&server.url()).await;
    let (mut completed, mut reclaimed, mut left) = (0, 0, 0);
    for g in groups {
        let s = queue.stats(g).await.unwrap();
        completed += s.completed;
        reclaimed += s.reclaimed;
        left += s.waiting + s.delayed + s.active + s.dead;
    }
    let mut effects = 0u64;
    let mut ran_twice = 0u64;
    for i in 0..n {
        let e: Option<String> = conn.get(format!("effect:k{i}")).await.unwrap();
        effects += u64::from(e.is_some());
        let runs: u64 = conn.get(format!("runs:k{i}")).await.unwrap();
        ran_twice += u64::from(runs > 1);
    }
    let refused: Option<u64> = conn.get("effects-refused").await.unwrap();
    eprintln!(
        "killed after 6 starts; all done {:.1?} later: completed {completed}/{n}, reclaimed {reclaimed}, effects {effects}/{n}, jobs run twice {ran_twice}, second effects refused by their key {}",
        killed_at.elapsed(),
        refused.unwrap_or(0)
    );
    assert_eq!(completed, n, "a job was lost");
    assert_eq!(left, 0);
    assert_eq!(effects, n, "an effect is missing");
    assert!(
        reclaimed >= 1,
        "the killed worker's jobs were not claimed back"
    );
    // Only jobs the dead worker held ran again, and their keys refused any second effect.
    assert!(
        ran_twice <= reclaimed,
        "{ran_twice} jobs ran twice, only {reclaimed} were claimed back"
    );
    assert!(
        ran_twice >= 1,
        "the job killed after its effect did not run again"
    );
    assert!(
        (1..=ran_twice).contains(&refused.unwrap_or(0)),
        "its second effect was not refused by its key"
    );
}

// === the group bound across 4 worker processes ===

/// The helper: a worker process of `SLUICE_QUEUE` whose groups are limited by gcra
/// `SLUICE_CAPACITY` per `SLUICE_RATE` at `SLUICE_BUCKETS`, 3 slots, jobs of 5 ms, until
/// `SLUICE_RUN_MS` has passed.
#[test]
fn helper_jobs_bound() {
    let Some(_role) = role() else { return };
    let env = |k: &str| std::env::var(k).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let options = QueueOptions::new().limit(
            env("SLUICE_BUCKETS"),
            gcra(env("SLUICE_CAPACITY").parse().unwrap(), &env("SLUICE_RATE")),
        );
        let queue = JobQueue::connect(
            &RedisConfig::new(env("SLUICE_REDIS_URL")),
            &env("SLUICE_QUEUE"),
            options,
        )
        .await
        .unwrap();
        let worker = Arc::new(
            Worker::new(
                queue,
                WorkerOptions::new()
                    .slots(3)
                    .poll(Duration::from_millis(10)),
            )
            .unwrap(),
        );
        let run = Duration::from_millis(env("SLUICE_RUN_MS").parse().unwrap());
        let report = worker
            .run(
                |_job: Job| async {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    Ok(Done::new())
                },
                tokio::time::sleep(run),
            )
            .await;
        println!();
        println!("COMPLETED {}", report.completed);
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_bound_holds_in_every_window_across_4_worker_processes() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("bound");
    let (capacity, rate, interval_ns) = (10u64, "40/s", 25_000_000u64);
    let buckets = "gw:embed";
    let options = QueueOptions::new().limit(buckets, gcra(capacity, rate));
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, options)
        .await
        .unwrap();
    for i in 0..400 {
        queue
            .enqueue(NewJob::new(format!("key-{}", i % 2), "x"))
            .await
            .unwrap();
    }
    let run_ms = 4_000u64;
    let children: Vec<_> = (0..4)
        .map(|i| {
            helper("helper_jobs_bound", &format!("bound-{i}"))
                .env("SLUICE_REDIS_URL", server.url())
                .env("SLUICE_QUEUE", &name)
                .env("SLUICE_BUCKETS", buckets)
                .env("SLUICE_CAPACITY", capacity.to_string())
                .env("SLUICE_RATE", rate)
                .env("SLUICE_RUN_MS", run_ms.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut per_process = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a worker process failed");
        let out = String::from_utf8(out.stdout).unwrap();
        per_process.push(
            lines_with(&out, "COMPLETED ")
                .map(|n| n.parse::<u64>().unwrap())
                .sum::<u64>(),
        );
    }
    for group in ["key-0", "key-1"] {
        let adm = admissions(&server.url(), &queue, group).await;
        let span_ns = adm.last().unwrap().0 - adm[0].0;
        let bound = capacity + span_ns / interval_ns;
        let worst = worst_window(&adm, capacity, interval_ns);
        eprintln!(
            "{group}: {} jobs admitted over {:.2} s by 4 processes (completed per process {per_process:?}); bound over the whole span {bound}; worst window excess {worst} (<= 0 holds)",
            adm.len(),
            span_ns as f64 / 1e9
        );
        assert!(
            worst <= 0,
            "a window admitted {worst} tokens beyond the bound"
        );
        // And not starved: at least 90% of what the bucket allowed over the run.
        assert!(
            adm.len() as u64 * 10 >= bound * 9,
            "{} of {bound}: false waits",
            adm.len()
        );
    }
    assert!(
        per_process.iter().all(|&n| n > 0),
        "a process ran nothing: {per_process:?}"
    );
}

// === fairness ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_of_10_is_not_delayed_by_a_group_of_10000() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("fair");
    let options = QueueOptions::new().limit("gw:fair", gcra(5, "20/s"));
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, options)
        .await
        .unwrap();
    // 10,000 jobs for "big", enqueued first, in a pipeline of tasks.
    let mut tasks = Vec::new();
    for t in 0..8 {
        let queue = queue.clone();
        tasks.push(tokio::spawn(async move {
            for i in (t..10_000).step_by(8) {
                queue
                    .enqueue(NewJob::new("big", format!("{i}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for i in 0..10 {
        queue
            .enqueue(NewJob::new("small", format!("{i}")))
            .await
            .unwrap();
    }
    let started: Arc<parking_lot::Mutex<Vec<(String, Instant)>>> = Arc::default();
    let begin = Instant::now();
    let handler = {
        let started = started.clone();
        move |job: Job| {
            started.lock().push((job.group.clone(), Instant::now()));
            async { Ok::<_, Failure>(Done::new()) }
        }
    };
    let small_done = {
        let started = started.clone();
        move || started.lock().iter().filter(|(g, _)| g == "small").count() >= 10
    };
    run_until(
        workers(&queue, 4, 2),
        handler,
        Duration::from_secs(10),
        small_done,
    )
    .await;
    let started = started.lock().clone();
    let small: Vec<Duration> = started
        .iter()
        .filter(|(g, _)| g == "small")
        .map(|(_, t)| *t - begin)
        .collect();
    let big = started.iter().filter(|(g, _)| g == "big").count();
    let last_small = small.iter().max().copied().unwrap_or(Duration::MAX);
    // Its own rate: 5 at once, then one per 50 ms: the 10th at 250 ms.
    eprintln!(
        "10,000 jobs in 'big', 10 in 'small', each 5 + 20/s: 'small' all started within {last_small:.2?} (its own rate allows 250 ms), while 'big' started {big}"
    );
    assert_eq!(small.len(), 10);
    assert!(
        last_small < Duration::from_millis(1_500),
        "the small group waited {last_small:?}"
    );
    let stats = queue.stats("big").await.unwrap();
    assert!(
        stats.waiting > 9_900,
        "big still holds {} waiting",
        stats.waiting
    );
}

// === weighted and settled costs ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_costs_hold_the_token_bound_and_settled_costs_come_back() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("weighted");
    // 1,000 tokens, refilling 5,000/s: a tokens-per-minute quota, faster.
    let (capacity, interval_ns) = (1_000u64, 200_000u64);
    let options = QueueOptions::new().limit("gw:llm", gcra(capacity, "5000/s"));
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, options)
        .await
        .unwrap();
    let costs = [50u64, 400, 120, 800, 30, 250];
    let mut total = 0;
    for i in 0..60 {
        let cost = costs[i % costs.len()];
        total += cost;
        queue
            .enqueue(NewJob::new("tenant", "x").cost(cost))
            .await
            .unwrap();
    }
    let done = {
        let queue = queue.clone();
        move || {
            let queue = queue.clone();
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current()
                    .block_on(async { queue.stats("tenant").await.unwrap().completed >= 60 })
            })
        }
    };
    let begin = Instant::now();
    run_until(
        workers(&queue, 4, 2),
        |_job: Job| async { Ok::<_, Failure>(Done::new()) },
        Duration::from_secs(30),
        done,
    )
    .await;
    let took = begin.elapsed();
    let adm = admissions(&server.url(), &queue, "tenant").await;
    let worst = worst_window(&adm, capacity, interval_ns);
    eprintln!("60 jobs of weights {costs:?}, {total} tokens at 1000 + 5000/s: done in {took:.2?} (the bucket allows no sooner than {:.2} s); worst window excess {worst} tokens", (total - capacity) as f64 / 5000.0);
    assert_eq!(adm.len(), 60);
    assert!(
        worst <= 0,
        "a window admitted {worst} tokens beyond the bound"
    );
    assert!(took >= Duration::from_millis((total - capacity) / 5 * 95 / 100));

    // Settled: a job admitted at 1,000 tokens that used 100 gives 900 back at once.
    let name = unique("settle");
    let options = QueueOptions::new().limit("gw:settle", gcra(1_000, "1/s"));
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, options)
        .await
        .unwrap();
    let store = RedisStore::connect(
        gcra(1_000, "1/s"),
        RedisConfig::new(server.url()).prefix("gw:settle"),
    )
    .await
    .unwrap();
    queue
        .enqueue(NewJob::new("t", "x").cost(1_000))
        .await
        .unwrap();
    let done = {
        let queue = queue.clone();
        move || {
            let queue = queue.clone();
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current()
                    .block_on(async { queue.stats("t").await.unwrap().completed >= 1 })
            })
        }
    };
    run_until(
        workers(&queue, 1, 1),
        |_job: Job| async { Ok::<_, Failure>(Done::with_cost(100)) },
        Duration::from_secs(5),
        done,
    )
    .await;
    let d = store.check("t", 0).await.unwrap();
    eprintln!(
        "a job admitted at 1000 tokens settled at 100: the bucket has {} left",
        d.remaining
    );
    assert!(
        (899..=901).contains(&d.remaining),
        "remaining {}",
        d.remaining
    );
}

// === the gateway and the queue share one bucket ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_and_the_queue_share_one_bucket() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("shared");
    let (capacity, per_second) = (10u64, 50u64);
    let store = RedisStore::connect(
        gcra(capacity, "50/s"),
        RedisConfig::new(server.url())
            .prefix("gw:api")
            .on_error(OnError::Deny)
            .timeout(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    let queue = JobQueue::connect(
        &RedisConfig::new(server.url()),
        &name,
        QueueOptions::new().limit_of(&store),
    )
    .await
    .unwrap();
    for _ in 0..1_000 {
        queue.enqueue(NewJob::new("key-1", "x")).await.unwrap();
    }
    let secs = 3u64;
    let gateway_admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let gateway = {
        let store = store.clone();
        let admitted = gateway_admitted.clone();
        tokio::spawn(async move {
            while started.elapsed() < Duration::from_secs(secs) {
                match store.check("key-1", 1).await {
                    Ok(_) => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(2)).await,
                }
            }
        })
    };
    run_until(
        workers(&queue, 4, 2),
        |_job: Job| async { Ok::<_, Failure>(Done::new()) },
        Duration::from_secs(secs),
        || false,
    )
    .await;
    gateway.await.unwrap();
    let elapsed = started.elapsed();
    let jobs = queue.stats("key-1").await.unwrap().completed;
    let gw = gateway_admitted.load(Ordering::Relaxed);
    let bound = capacity + (elapsed.as_secs_f64() * per_second as f64) as u64;
    eprintln!("one bucket ({capacity} + {per_second}/s) over {elapsed:.2?}: the gateway admitted {gw}, the queue started {jobs}, together {} of at most {bound}", gw + jobs);
    assert!(gw + jobs <= bound, "{} above {bound}", gw + jobs);
    assert!(gw > 0 && jobs > 0, "both drew from the bucket");
    // Together they used the bucket: what one took, the other did not get.
    assert!(
        (gw + jobs) * 10 >= bound * 8,
        "{} of {bound}: false denials",
        gw + jobs
    );
}

// === Retry-After from a stand-in API, backoff, dead letters ===

/// A stand-in API on 127.0.0.1: `GET /<group>/<id>` answers 429 with `Retry-After: 1` to the
/// first request for group `api`, 500 to any request for group `broken`, else 200. It records
/// (path, when) of every request.
async fn stand_in_api() -> (u16, Arc<parking_lot::Mutex<Vec<(String, Instant)>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let log: Arc<parking_lot::Mutex<Vec<(String, Instant)>>> = Arc::default();
    let seen = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let log = seen.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf).into_owned();
                let path = head.split(' ').nth(1).unwrap_or("").to_string();
                let first = {
                    let mut log = log.lock();
                    log.push((path.clone(), Instant::now()));
                    path.starts_with("/api/")
                        && log.iter().filter(|(p, _)| p.starts_with("/api/")).count() == 1
                };
                let reply: &[u8] = if first {
                    b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else if path.starts_with("/broken/") {
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                };
                let _ = sock.write_all(reply).await;
            });
        }
    });
    (port, log)
}

/// Calls the stand-in API for `job`: a 429 or 500 is a failure, with the server's Retry-After.
async fn call_api(port: u16, job: Job) -> Result<Done, Failure> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut sock = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    let req = format!(
        "GET /{}/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
        job.group, job.id
    );
    sock.write_all(req.as_bytes())
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    let mut out = String::new();
    sock.read_to_string(&mut out)
        .await
        .map_err(|e| Failure::new(e.to_string()))?;
    let status = out.split(' ').nth(1).unwrap_or("");
    if status == "200" {
        return Ok(Done::new());
    }
    let failure = Failure::new(format!("status {status}"));
    match out.lines().find_map(|l| l.strip_prefix("Retry-After: ")) {
        Some(value) => Err(failure.retry_after_header(value.trim()).unwrap()),
        None => Err(failure),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_from_the_api_is_obeyed_and_slows_the_group_only() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let (port, log) = stand_in_api().await;
    let name = unique("hint");
    let options = QueueOptions::new().concurrency(1);
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, options)
        .await
        .unwrap();
    for i in 0..4 {
        queue
            .enqueue(NewJob::new("api", format!("{i}")))
            .await
            .unwrap();
    }
    queue
        .enqueue(NewJob::new("broken", "x").max_attempts(3))
        .await
        .unwrap();
    // Due while the api group is paused (its 429 comes at once).
    for i in 0..3 {
        queue
            .enqueue(NewJob::new("other", format!("{i}")).delay(Duration::from_millis(300)))
            .await
            .unwrap();
    }
    let done = {
        let queue = queue.clone();
        move || {
            let queue = queue.clone();
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    queue.stats("api").await.unwrap().completed >= 4
                        && queue.stats("broken").await.unwrap().dead >= 1
                        && queue.stats("other").await.unwrap().completed >= 3
                })
            })
        }
    };
    let backoff =
        sluice::retry::Backoff::new(Duration::from_millis(50), Duration::from_millis(200));
    let ws: Vec<Arc<Worker>> = (0..2)
        .map(|_| {
            Arc::new(
                Worker::new(
                    queue.clone(),
                    WorkerOptions::new()
                        .slots(2)
                        .poll(Duration::from_millis(20))
                        .backoff(backoff),
                )
                .unwrap(),
            )
        })
        .collect();
    run_until(
        ws,
        move |job: Job| call_api(port, job),
        Duration::from_secs(15),
        done,
    )
    .await;
    let log = log.lock().clone();
    let (first_path, t0) = log
        .iter()
        .find(|(p, _)| p.starts_with("/api/"))
        .cloned()
        .expect("the api group ran");
    let retried_at = log
        .iter()
        .filter(|(p, t)| *p == first_path && *t > t0)
        .map(|(_, t)| *t - t0)
        .next()
        .expect("the job was retried");
    let during_pause = |group: &str| {
        log.iter()
            .filter(|(p, t)| p.starts_with(group) && *t > t0 && *t - t0 < Duration::from_secs(1))
            .count()
    };
    let (api_during_pause, other_during_pause) = (during_pause("/api/"), during_pause("/other/"));
    let broken: Vec<Instant> = log
        .iter()
        .filter(|(p, _)| p.starts_with("/broken/"))
        .map(|(_, t)| *t)
        .collect();
    let gaps: Vec<Duration> = broken.windows(2).map(|w| w[1] - w[0]).collect();
    let dead = queue.dead_letters("broken", 10).await.unwrap();
    eprintln!(
        "429 Retry-After: 1 on {first_path}: retried {retried_at:.2?} later; during its group's pause, requests of its group {api_during_pause}, of another group {other_during_pause}; 'broken' (500, no hint) attempts {} with backoff gaps {gaps:.2?}, dead letter {:?}",
        broken.len(),
        dead.first().map(|d| (&d.error, d.attempts))
    );
    assert!(
        retried_at >= Duration::from_secs(1),
        "retried after {retried_at:?}"
    );
    assert!(
        retried_at < Duration::from_millis(2_500),
        "retried after {retried_at:?}"
    );
    assert_eq!(api_during_pause, 0, "the group was not paused");
    assert_eq!(other_during_pause, 3, "another group was slowed");
    assert_eq!(broken.len(), 3, "three attempts, then the dead letter");
    // Backoff from 50 ms, capped at 200 ms, full jitter (plus the time to come round).
    assert!(
        gaps.iter().all(|g| *g < Duration::from_millis(600)),
        "backoff gaps {gaps:?}"
    );
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 3);
    assert!(dead[0].error.contains("status 500"), "{}", dead[0].error);
    let api = queue.stats("api").await.unwrap();
    assert_eq!((api.completed, api.dead), (4, 0));
}

// === priorities, delays, dead letters back, purge, concurrency, bad input ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_delays_retries_of_the_dead_and_purge() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("order");
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, QueueOptions::new())
        .await
        .unwrap();
    let enqueued = Instant::now();
    queue
        .enqueue(
            NewJob::new("p", "late")
                .priority(1000)
                .delay(Duration::from_millis(600)),
        )
        .await
        .unwrap();
    for (payload, priority) in [("low", 1), ("high", 9), ("mid", 5), ("mid2", 5)] {
        queue
            .enqueue(NewJob::new("p", payload).priority(priority))
            .await
            .unwrap();
    }
    queue
        .enqueue(NewJob::new("p", "fails").priority(0).max_attempts(1))
        .await
        .unwrap();
    let order: Arc<parking_lot::Mutex<Vec<(String, Duration)>>> = Arc::default();
    let handler = {
        let order = order.clone();
        move |job: Job| {
            let payload = String::from_utf8(job.payload.clone()).unwrap();
            order.lock().push((payload.clone(), enqueued.elapsed()));
            let first_time = order.lock().iter().filter(|(n, _)| *n == payload).count() == 1;
            async move {
                if payload == "fails" && first_time {
                    Err(Failure::permanent("refused"))
                } else {
                    Ok(Done::new())
                }
            }
        }
    };
    let seen = order.clone();
    run_until(
        workers(&queue, 1, 1),
        handler.clone(),
        Duration::from_secs(5),
        move || seen.lock().len() >= 6,
    )
    .await;
    let names: Vec<String> = order.lock().iter().map(|(n, _)| n.clone()).collect();
    let late = order
        .lock()
        .iter()
        .find(|(n, _)| n == "late")
        .map(|(_, t)| *t)
        .unwrap();
    eprintln!("started in order {names:?}; the job delayed 600 ms started at {late:.2?}");
    assert_eq!(names, ["high", "mid", "mid2", "low", "fails", "late"]);
    assert!(late >= Duration::from_millis(600));
    let dead = queue.dead_letters("p", 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].error, "refused");
    // Back from the dead letters, it runs again (attempts counted afresh) and completes.
    assert_eq!(queue.retry_dead("p", 0).await.unwrap(), 1);
    let seen = order.clone();
    run_until(
        workers(&queue, 1, 1),
        handler,
        Duration::from_secs(5),
        move || seen.lock().len() >= 7,
    )
    .await;
    let s = queue.stats("p").await.unwrap();
    assert_eq!(
        (s.completed, s.dead, s.dead_lettered, s.waiting),
        (6, 0, 1, 0)
    );
    // Purge.
    for i in 0..5 {
        queue
            .enqueue(NewJob::new("q", format!("{i}")))
            .await
            .unwrap();
    }
    assert_eq!(queue.purge("q", Purge::Waiting).await.unwrap(), 5);
    assert_eq!(queue.stats("q").await.unwrap().waiting, 0);
    assert_eq!(queue.purge("q", Purge::All).await.unwrap(), 0);
    assert_eq!(queue.groups().await.unwrap(), ["p"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_is_held_across_workers_and_bad_input_is_refused() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let url = RedisConfig::new(server.url());
    let name = unique("conc");
    let queue = JobQueue::connect(
        &url,
        &name,
        QueueOptions::new()
            .concurrency(2)
            .limit("gw:c", gcra(5, "1/s")),
    )
    .await
    .unwrap();
    for i in 0..24 {
        queue
            .enqueue(NewJob::new("c", format!("{i}")).cost(0))
            .await
            .unwrap();
    }
    // Above the bucket's capacity: dead-lettered with the reason, never waited for.
    queue
        .enqueue(NewJob::new("c", "huge").cost(6))
        .await
        .unwrap();
    let running = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let handler = {
        let (running, most) = (running.clone(), most.clone());
        move |_job: Job| {
            let (running, most) = (running.clone(), most.clone());
            async move {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(30)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, Failure>(Done::new())
            }
        }
    };
    let done = {
        let queue = queue.clone();
        move || {
            let queue = queue.clone();
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let s = queue.stats("c").await.unwrap();
                    s.completed >= 24 && s.dead >= 1
                })
            })
        }
    };
    run_until(
        workers(&queue, 4, 3),
        handler,
        Duration::from_secs(20),
        done,
    )
    .await;
    let most = most.load(Ordering::SeqCst);
    let dead = queue.dead_letters("c", 10).await.unwrap();
    eprintln!(
        "concurrency 2, 4 workers of 3 slots: at most {most} jobs ran at once; dead letter {:?}",
        dead.first().map(|d| &d.error)
    );
    assert_eq!(most, 2);
    assert_eq!(dead.len(), 1);
    assert!(
        dead[0].error.contains("above the limit's capacity 5"),
        "{}",
        dead[0].error
    );

    let bad = [
        JobQueue::connect(&url, "a{b}", QueueOptions::new())
            .await
            .unwrap_err()
            .to_string(),
        JobQueue::connect(&url, "q", QueueOptions::new().prefix("x{"))
            .await
            .unwrap_err()
            .to_string(),
        JobQueue::connect(&url, "q", QueueOptions::new().visibility(Duration::ZERO))
            .await
            .unwrap_err()
            .to_string(),
        JobQueue::connect(
            &url,
            "q",
            QueueOptions::new().limit(
                "gw",
                AnyAlgorithm::new(Kind::SlidingLog, Quota::parse(5, "1/s").unwrap()),
            ),
        )
        .await
        .unwrap_err()
        .to_string(),
        queue
            .enqueue(NewJob::new("", "x"))
            .await
            .unwrap_err()
            .to_string(),
        queue
            .enqueue(NewJob::new("c", "x").priority(2000))
            .await
            .unwrap_err()
            .to_string(),
        queue.stats("").await.unwrap_err().to_string(),
    ];
    for (err, word) in bad.iter().zip([
        "brace",
        "brace",
        "visibility",
        "sliding_log",
        "empty",
        "priority",
        "empty",
    ]) {
        assert!(err.contains(word), "{err:?} should say {word}");
    }
    assert!(Worker::new(queue.clone(), WorkerOptions::new().consumer("")).is_err());
}

// === Redis Cluster ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_groups_keys_share_its_buckets_slot() {
    let _heavy = HEAVY.lock().await;
    let Some(cluster) = RedisCluster::start(3) else {
        return;
    };
    let name = unique("cluster");
    let config = RedisConfig::cluster(cluster.urls());
    let queue = JobQueue::connect(
        &config,
        &name,
        QueueOptions::new().limit("gw:c", gcra(5, "50/s")),
    )
    .await
    .unwrap();
    let groups: Vec<String> = (0..6).map(|i| format!("tenant-{i}")).collect();
    for i in 0..60 {
        queue
            .enqueue(NewJob::new(groups[i % 6].clone(), "x").idempotency_key(format!("k{i}")))
            .await
            .unwrap();
    }
    let done = {
        let (queue, groups) = (queue.clone(), groups.clone());
        move || {
            let (queue, groups) = (queue.clone(), groups.clone());
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let mut n = 0;
                    for g in &groups {
                        n += queue.stats(g).await.unwrap().completed;
                    }
                    n >= 60
                })
            })
        }
    };
    run_until(
        workers(&queue, 2, 2),
        |_job: Job| async { Ok::<_, Failure>(Done::new()) },
        Duration::from_secs(20),
        done,
    )
    .await;
    let slot = |key: &str| {
        cluster.nodes[0]
            .cli(&["CLUSTER", "KEYSLOT", key])
            .trim()
            .to_string()
    };
    let mut slots = Vec::new();
    for g in &groups {
        let s = queue.stats(g).await.unwrap();
        assert_eq!(s.completed, 10, "{g}");
        let keys = queue.group_keys(g);
        let bucket = slot(&keys[0]);
        for k in &keys {
            assert_eq!(slot(k), bucket, "{k} is not in the slot of {}", keys[0]);
        }
        slots.push(bucket);
    }
    let queue_slots: Vec<String> = queue.queue_keys().iter().map(|k| slot(k)).collect();
    eprintln!("6 groups on a 3-master Cluster, 60 jobs all completed; each group's 9 keys in its bucket's slot: {slots:?}; the queue's 5 keys in slot {}", queue_slots[0]);
    assert!(queue_slots.iter().all(|s| *s == queue_slots[0]));
    let distinct: std::collections::HashSet<_> = slots.iter().collect();
    assert!(distinct.len() > 1, "the groups all hashed to one slot");
}
