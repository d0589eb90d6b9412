//! The job queue against real redis-server processes: a worker killed with SIGKILL mid-job
//! loses no job, and idempotency keys keep every effect once; a group's bound holds in every
//! window across 4 worker processes; fairness between a group of 10,000 jobs and one of 10;
//! weighted costs and settled costs; one bucket shared with `RedisStore` (the gateway's); a
//! job whose producer stopped before registering it is found by the workers' sweep.
//! Failures, priorities, concurrency and Redis Cluster: `jobs_redis_failures.rs`.
//!
//! Real time is needed here (Redis has its own clock): admission times are Redis's own (each
//! job keeps the time its bucket admitted it), and the bounds are checked on them exactly.

#![cfg(feature = "redis")]

mod support;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use sluice::jobs::{Done, Failure, Job, JobQueue, NewJob, QueueOptions, Worker, WorkerOptions};
use sluice::store::{OnError, RedisConfig, RedisStore, Store};
use support::process::{helper, lines_with, role};
use support::redis::RedisServer;

/// Held by the tests that measure time, so that they do not load the machine together.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

use support::jobs::{admissions, completed, gcra, raw, run_until, unique, workers, worst_window};

// === a worker killed mid-job ===

/// The helper: a worker process of `SLUICE_QUEUE` with 2 slots. Each job prints `START <id>`,
/// sleeps 150 ms, applies its effect once per idempotency key (`SET effect:<key> NX`, and
/// `INCR runs:<key>` every time), prints `EFFECT <id>`, sleeps 150 ms, and completes.
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
            println!("EFFECT {}", job.id);
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
    // Killed at once when its 6th effect is reported: that job has had its effect and is not
    // acknowledged (150 ms later); the job in its other slot may be before its effect.
    let stdout = child.stdout.take().unwrap();
    let effects_seen = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut effects = 0;
        while effects < 6 {
            match lines.next() {
                Some(Ok(l)) if l.starts_with("EFFECT ") => effects += 1,
                Some(_) => {}
                None => break,
            }
        }
        effects
    })
    .await
    .unwrap();
    assert_eq!(effects_seen, 6, "the worker process stopped early");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed_at = Instant::now();
    // Another worker takes over: the dead worker's entries come back after the visibility
    // timeout.
    let groups = ["g0", "g1", "g2", "g3"];
    let all_done = completed(&queue, &groups, n);
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
        "killed after 6 effects; all done {:.1?} later: completed {completed}/{n}, reclaimed {reclaimed}, effects {effects}/{n}, jobs run twice {ran_twice}, second effects refused by their key {}",
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
    let done = completed(&queue, &["tenant"], 60);
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
    let done = completed(&queue, &["t"], 1);
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

// === a producer that stops between enqueue and register ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_producer_stopped_before_registering_is_found_by_the_sweep() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("sweep");
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, QueueOptions::new())
        .await
        .unwrap();
    // The group's first job, enqueued whole, runs; the group is then dropped from the lists
    // as empty (the queue still knows it).
    queue.enqueue(NewJob::new("orphan", "first")).await.unwrap();
    let qkeys = queue.queue_keys();
    let dropped = {
        let (queue, url, qkeys) = (queue.clone(), server.url(), qkeys.clone());
        move || {
            tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async {
                    let mut conn = raw(&url).await;
                    let ready: Option<f64> = conn.zscore(&qkeys[0], "orphan").await.unwrap();
                    let later: Option<f64> = conn.zscore(&qkeys[1], "orphan").await.unwrap();
                    queue.stats("orphan").await.unwrap().completed == 1
                        && ready.is_none()
                        && later.is_none()
                })
            })
        }
    };
    run_until(
        workers(&queue, 1, 1),
        |_job: Job| async { Ok::<_, Failure>(Done::new()) },
        Duration::from_secs(10),
        dropped,
    )
    .await;
    // Its second: the producer's first call only (enqueue.lua), as one killed before
    // `register`.
    let enqueue = concat!(
        include_str!("../src/jobs/lua/now.lua"),
        include_str!("../src/jobs/lua/group.lua"),
        include_str!("../src/jobs/lua/enqueue.lua")
    );
    let mut conn = raw(&server.url()).await;
    let keys = queue.group_keys("orphan");
    let reply: Vec<String> = redis::Script::new(enqueue)
        .key(&keys[..])
        .arg("")
        .arg("orphan")
        .arg("second")
        .arg(1)
        .arg(0)
        .arg(0)
        .arg(3)
        .arg("")
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(reply[1], "1");
    let worker = Arc::new(
        Worker::new(
            queue.clone(),
            WorkerOptions::new()
                .poll(Duration::from_millis(20))
                .sweep(Duration::from_millis(200)),
        )
        .unwrap(),
    );
    let begin = Instant::now();
    run_until(
        vec![worker],
        |_job: Job| async { Ok::<_, Failure>(Done::new()) },
        Duration::from_secs(10),
        completed(&queue, &["orphan"], 2),
    )
    .await;
    let orphan = queue.stats("orphan").await.unwrap();
    eprintln!(
        "a job enqueued without its registration completed {:.2?} later (sweep every 200 ms)",
        begin.elapsed()
    );
    assert_eq!(orphan.completed, 2, "the job was never found");
}
