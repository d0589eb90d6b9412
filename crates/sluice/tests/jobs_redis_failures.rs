//! The job queue against real redis-server processes, when jobs fail and beyond: a stand-in
//! API's Retry-After (the job and its group wait what the server said), backoff with jitter
//! and the dead-letter stream; priorities, delays, dead letters put back, purge; a group's
//! concurrency across workers; bad input refused; Redis Cluster, with each group's keys in
//! its bucket's slot.

#![cfg(feature = "redis")]

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::jobs::{
    Done, Failure, Job, JobQueue, NewJob, Purge, QueueOptions, Worker, WorkerOptions,
};
use sluice::store::RedisConfig;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::jobs::{completed, gcra, run_until, unique, workers};
use support::redis::{RedisCluster, RedisServer};

/// Held by the tests that measure time, so that they do not load the machine together.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let names: Vec<&str> = groups.iter().map(String::as_str).collect();
    let done = completed(&queue, &names, 60);
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
    eprintln!("6 groups on a 3-master Cluster, 60 jobs all completed; each group's 9 keys in its bucket's slot: {slots:?}; the queue's {} keys in slot {}", queue_slots.len(), queue_slots[0]);
    assert!(queue_slots.iter().all(|s| *s == queue_slots[0]));
    let distinct: std::collections::HashSet<_> = slots.iter().collect();
    assert!(distinct.len() > 1, "the groups all hashed to one slot");
}

// === metrics ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_per_group_and_per_worker() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("metrics");
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, QueueOptions::new())
        .await
        .unwrap();
    for payload in ["ok", "ok", "refused"] {
        queue.enqueue(NewJob::new("m", payload)).await.unwrap();
    }
    queue
        .enqueue(NewJob::new("later", "x").delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let worker = metrics::with_local_recorder(&recorder, || {
        Arc::new(
            Worker::new(
                queue.clone(),
                WorkerOptions::new().poll(Duration::from_millis(20)),
            )
            .unwrap(),
        )
    });
    let stats = queue.clone();
    let done = move || {
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                let s = stats.stats("m").await.unwrap();
                s.completed == 2 && s.dead == 1
            })
        })
    };
    let handler = |job: Job| async move {
        if job.payload == b"refused" {
            Err(Failure::permanent("refused"))
        } else {
            Ok(Done::new())
        }
    };
    run_until(vec![worker], handler, Duration::from_secs(10), done).await;
    let all = queue.all_stats().await.unwrap();
    metrics::with_local_recorder(&recorder, || queue.record_metrics(&all));
    let value = |metric: &str, labels: &[(&str, &str)]| -> Option<f64> {
        snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .find_map(|(key, _, _, v)| {
                let k = key.key();
                let matches = k.name() == metric
                    && labels
                        .iter()
                        .all(|(n, want)| k.labels().any(|l| l.key() == *n && l.value() == *want));
                match v {
                    DebugValue::Counter(c) if matches => Some(c as f64),
                    DebugValue::Gauge(g) if matches => Some(g.into_inner()),
                    _ => None,
                }
            })
    };
    let q = name.as_str();
    let got = [
        value(
            "sluice_jobs_total",
            &[("queue", q), ("group", "m"), ("outcome", "completed")],
        ),
        value(
            "sluice_jobs_total",
            &[("queue", q), ("group", "m"), ("outcome", "failed")],
        ),
        value(
            "sluice_jobs_total",
            &[("queue", q), ("group", "m"), ("outcome", "dead")],
        ),
        value(
            "sluice_jobs",
            &[("queue", q), ("group", "m"), ("state", "dead")],
        ),
        value(
            "sluice_jobs",
            &[("queue", q), ("group", "later"), ("state", "delayed")],
        ),
        value(
            "sluice_jobs",
            &[("queue", q), ("group", "m"), ("state", "waiting")],
        ),
        value(
            "sluice_job_attempts_total",
            &[("queue", q), ("outcome", "completed")],
        ),
        value(
            "sluice_job_attempts_total",
            &[("queue", q), ("outcome", "dead")],
        ),
    ];
    eprintln!("metrics: group m completed/failed/dead-lettered totals, dead gauge; later delayed; m waiting; worker completed, dead: {got:?}");
    let want = [2.0, 1.0, 1.0, 1.0, 1.0, 0.0, 2.0, 1.0].map(Some);
    assert_eq!(got, want);
}

// === a breaker per group; payloads are bytes ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_breaker_holds_its_group_and_not_the_others() {
    let _heavy = HEAVY.lock().await;
    let Some(server) = RedisServer::start() else {
        return;
    };
    let name = unique("breaker");
    let queue = JobQueue::connect(&RedisConfig::new(server.url()), &name, QueueOptions::new())
        .await
        .unwrap();
    for i in 0..6 {
        queue
            .enqueue(NewJob::new("flaky", format!("{i}")).max_attempts(1))
            .await
            .unwrap();
    }
    // Due while the flaky group's breaker is open; and every byte value, as one payload.
    let bytes: Vec<u8> = (0..=255u8).collect();
    queue
        .enqueue(NewJob::new("fine", bytes.clone()).delay(Duration::from_millis(300)))
        .await
        .unwrap();
    let breaker = sluice::breaker::CircuitBreaker::builder()
        .count_window(3)
        .min_calls(3)
        .failure_rate(0.5)
        .open_for(Duration::from_secs(1))
        .half_open_probes(1);
    let options = WorkerOptions::new()
        .poll(Duration::from_millis(20))
        .breaker(breaker);
    let worker = Arc::new(Worker::new(queue.clone(), options).unwrap());
    type Seen = Vec<(String, Instant, Vec<u8>)>;
    let seen: Arc<parking_lot::Mutex<Seen>> = Arc::default();
    let handler = {
        let seen = seen.clone();
        move |job: Job| {
            seen.lock()
                .push((job.group.clone(), Instant::now(), job.payload.clone()));
            let flaky = job.group == "flaky";
            async move {
                if flaky {
                    Err(Failure::new("upstream down"))
                } else {
                    Ok(Done::new())
                }
            }
        }
    };
    let stop = seen.clone();
    run_until(vec![worker], handler, Duration::from_secs(10), move || {
        stop.lock().len() >= 7
    })
    .await;
    let seen = seen.lock().clone();
    let flaky: Vec<Instant> = seen
        .iter()
        .filter(|(g, ..)| g == "flaky")
        .map(|(_, t, _)| *t)
        .collect();
    let gaps: Vec<Duration> = flaky.windows(2).map(|w| w[1] - w[0]).collect();
    let (_, fine_at, payload) = seen.iter().find(|(g, ..)| g == "fine").unwrap().clone();
    eprintln!(
        "breaker (3 calls, 50%, open 1 s): gaps between the flaky group's attempts {gaps:.2?}; the other group ran {:.2?} after the breaker opened",
        fine_at - flaky[2]
    );
    assert!(gaps[2] >= Duration::from_millis(900), "not held: {gaps:?}");
    assert!(fine_at < flaky[3], "the other group waited for the breaker");
    assert_eq!(payload, bytes, "the payload's bytes changed");
}
