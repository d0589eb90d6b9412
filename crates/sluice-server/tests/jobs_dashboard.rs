//! `[jobs]`: the real gateway watching a queue in a real redis-server (the Redis of its
//! `[store]`), which the library fills and runs: two groups, one with jobs completed, retried,
//! dead-lettered and delayed, the other with one job running and two waiting behind its
//! concurrency. `GET /v1/jobs` lists each group's figures as Redis holds them, `/metrics`
//! carries them (recorded every `jobs.interval`), and `/v1/stats` and the page say there are
//! queues to show.

mod common;

#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{get, Gateway};
use serde_json::{json, Value};
use sluice::jobs::{Done, Failure, Job, JobQueue, NewJob, QueueOptions, Worker, WorkerOptions};
use sluice::store::RedisConfig;
use tokio::sync::{oneshot, Semaphore};

/// The value of the `/metrics` sample `name{labels}` (every label given must match).
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (inside, value) = rest.split_once("} ")?;
        let all = labels
            .iter()
            .all(|(k, v)| inside.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        all.then(|| value.trim().parse().ok())?
    })
}

/// The figures the dashboard shows for a group, in its column order.
const FIGURES: [&str; 7] = [
    "waiting",
    "delayed",
    "active",
    "dead",
    "completed",
    "failed",
    "retried",
];

/// What `/metrics` says of `group` of queue `mail`, in the order of [`FIGURES`].
fn exported(text: &str, group: &str) -> Vec<Option<f64>> {
    let state = |s| {
        sample(
            text,
            "sluice_jobs",
            &[("queue", "mail"), ("group", group), ("state", s)],
        )
    };
    let outcome = |o| {
        sample(
            text,
            "sluice_jobs_total",
            &[("queue", "mail"), ("group", group), ("outcome", o)],
        )
    };
    vec![
        state("waiting"),
        state("delayed"),
        state("active"),
        state("dead"),
        outcome("completed"),
        outcome("failed"),
        outcome("retried"),
    ]
}

fn row(doc: &Value, queue: &str, group: &str) -> Vec<u64> {
    let q = doc["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == queue)
        .unwrap_or_else(|| panic!("no queue {queue} in {doc}"));
    let g = q["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["group"] == group)
        .unwrap_or_else(|| panic!("no group {group} in {doc}"));
    FIGURES.iter().map(|f| g[f].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_metrics_show_each_groups_jobs() {
    let redis = redis_support::RedisServer::start().expect("redis-server is installed");
    let url = redis.url();
    // One job of a group at a time: zeta's second and third jobs wait behind its first.
    let queue = JobQueue::connect(
        &RedisConfig::new(url.clone()),
        "mail",
        QueueOptions::new().concurrency(1),
    )
    .await
    .unwrap();
    for payload in ["ok", "bad", "flaky"] {
        queue.enqueue(NewJob::new("acme", payload)).await.unwrap();
    }
    queue
        .enqueue(NewJob::new("acme", "later").delay(Duration::from_secs(3600)))
        .await
        .unwrap();
    queue
        .enqueue(NewJob::new("zeta", "hold").priority(10))
        .await
        .unwrap();
    for payload in ["z1", "z2"] {
        queue.enqueue(NewJob::new("zeta", payload)).await.unwrap();
    }

    // "hold" runs until a permit is given; "bad" fails for good; "flaky" fails once.
    let release = Arc::new(Semaphore::new(0));
    let handler = {
        let release = release.clone();
        move |job: Job| {
            let release = release.clone();
            async move {
                match (job.payload.as_slice(), job.attempt) {
                    (b"hold", _) => {
                        release.acquire().await.unwrap().forget();
                        Ok(Done::new())
                    }
                    (b"bad", _) => Err(Failure::permanent("no such mailbox")),
                    (b"flaky", 1) => Err(Failure::new("try again")
                        .retry_after(Duration::from_millis(1))
                        .slow_group(false)),
                    _ => Ok(Done::new()),
                }
            }
        }
    };
    let worker = Arc::new(Worker::new(queue.clone(), WorkerOptions::new().slots(3)).unwrap());
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let running = tokio::spawn(worker.run(handler, async move {
        let _ = stop_rx.await;
    }));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (a, z) = (
            queue.stats("acme").await.unwrap(),
            queue.stats("zeta").await.unwrap(),
        );
        if a.completed == 2 && a.dead == 1 && z.active == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the worker is stuck: {a:?} {z:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let gw = Gateway::start(
        "",
        &format!(
            r#"
[store]
backend = "redis"
url = "{url}"

[[policy]]
name = "api"
capacity = 10
rate = "5/s"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "http://127.0.0.1:9"

[jobs]
queues = ["mail", "quiet"]
interval = "200ms"
"#
        ),
    )
    .await;

    // waiting, delayed, active, dead, completed, failed, retried.
    let acme = [0, 1, 0, 1, 2, 2, 1];
    let zeta = [2, 0, 1, 0, 0, 0, 0];
    let as_metrics = |figures: [u64; 7]| -> Vec<Option<f64>> {
        figures.iter().map(|&n| Some(n as f64)).collect()
    };

    // /metrics: recorded by the gateway on its own, every jobs.interval.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text =
            String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap();
        if exported(&text, "acme") == as_metrics(acme)
            && exported(&text, "zeta") == as_metrics(zeta)
        {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "acme {:?}, zeta {:?} on /metrics:\n{}\n{}",
            exported(&text, "acme"),
            exported(&text, "zeta"),
            text.lines()
                .filter(|l| l.contains("sluice_jobs"))
                .collect::<Vec<_>>()
                .join("\n"),
            gw.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(text.contains("# HELP sluice_jobs "), "described");
    assert_eq!(
        sample(
            &text,
            "sluice_jobs_total",
            &[("group", "acme"), ("outcome", "dead")]
        ),
        Some(1.0)
    );

    // GET /v1/jobs: read from Redis as it is now.
    let answer = get(&gw.admin("/v1/jobs")).await.unwrap();
    assert_eq!(answer.status, 200);
    let doc = answer.json();
    eprintln!("{doc:#}");
    assert_eq!(row(&doc, "mail", "acme"), acme);
    assert_eq!(row(&doc, "mail", "zeta"), zeta);
    assert_eq!(doc["redis"], "store.url");
    assert_eq!(doc["prefix"], "sluice:jobs");
    assert_eq!(doc["interval_ms"], 200);
    let mail = &doc["queues"][0];
    assert_eq!(mail["name"], "mail");
    assert_eq!(mail["error"], Value::Null);
    assert_eq!(mail["groups_total"], 2);
    assert_eq!(mail["groups"][0]["group"], "acme", "sorted by name");
    assert_eq!(mail["groups"][0]["dead_lettered"], 1);
    assert_eq!(
        mail["total"],
        json!({"waiting": 2, "delayed": 1, "active": 1, "dead": 1, "completed": 2,
               "failed": 2, "retried": 1, "dead_lettered": 1, "reclaimed": 0})
    );
    assert_eq!(
        doc["queues"][1],
        json!({"name": "quiet", "error": null, "groups_total": 0, "groups": [],
               "total": {"waiting": 0, "delayed": 0, "active": 0, "dead": 0, "completed": 0,
                         "failed": 0, "retried": 0, "dead_lettered": 0, "reclaimed": 0}})
    );

    // The page learns from /v1/stats that there are queues, and has their section.
    let stats = get(&gw.admin("/v1/stats")).await.unwrap().json();
    assert_eq!(
        stats["jobs"],
        json!({"queues": ["mail", "quiet"], "interval_ms": 200})
    );
    let page =
        String::from_utf8(get(&gw.admin("/dashboard")).await.unwrap().body.to_vec()).unwrap();
    assert!(page.contains("id=\"jobs\"") && page.contains("v1/jobs"));

    // zeta's first job ends: the next two run, and both the endpoint and /metrics follow.
    release.add_permits(3);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let doc = get(&gw.admin("/v1/jobs")).await.unwrap().json();
        let text =
            String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap();
        let done = [0, 0, 0, 0, 3, 0, 0];
        if row(&doc, "mail", "zeta") == done && exported(&text, "zeta") == as_metrics(done) {
            break;
        }
        assert!(Instant::now() < deadline, "zeta: {doc}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_tx.send(());
    running.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_jobs_there_is_no_endpoint_and_an_unreachable_redis_is_said() {
    let gw = Gateway::start("", &common::api_10_at_5("http://127.0.0.1:9")).await;
    assert_eq!(get(&gw.admin("/v1/jobs")).await.unwrap().status, 404);
    let stats = get(&gw.admin("/v1/stats")).await.unwrap().json();
    assert_eq!(stats["jobs"], Value::Null);

    // Nothing listens on the queues' Redis: the gateway serves, and says so per queue.
    let port = common::closed_port();
    let gw = Gateway::start(
        "",
        &format!(
            "{}\n[jobs]\nredis = \"redis://127.0.0.1:{port}\"\nqueues = [\"mail\"]\ninterval = \"100ms\"\n",
            common::api_10_at_5("http://127.0.0.1:9")
        ),
    )
    .await;
    let doc = get(&gw.admin("/v1/jobs")).await.unwrap().json();
    assert_eq!(doc["redis"], "jobs.redis");
    let mail = &doc["queues"][0];
    assert_eq!(mail["name"], "mail");
    assert!(mail["error"].as_str().unwrap().contains("redis"), "{doc}");
    assert_eq!(mail["groups_total"], Value::Null);
    gw.wait_log(
        "cannot read the job queues of [jobs]",
        Duration::from_secs(5),
    )
    .await;
}
