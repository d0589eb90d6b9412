//! `sluice jobs`: the real binary against a real redis-server holding a queue that the library
//! filled and ran: inspect every group and one group's dead letters, put the dead letters back,
//! purge; bad arguments exit 2, an unreachable Redis exits 1.

mod common;

#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::bin;

use sluice::jobs::{Done, Failure, Job, JobQueue, NewJob, QueueOptions, Worker, WorkerOptions};
use sluice::store::RedisConfig;

fn jobs(url: &str, args: &[&str]) -> (i32, String, String) {
    jobs_of(url, "mail", args)
}

fn jobs_of(url: &str, queue: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("jobs")
        .args(["--redis", url, "--queue", queue])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_retry_and_purge_a_queue() {
    let redis = redis_support::RedisServer::start().expect("redis-server is installed");
    let url = redis.url();
    let queue = JobQueue::connect(&RedisConfig::new(url.clone()), "mail", QueueOptions::new())
        .await
        .unwrap();
    // "acme": 3 jobs, one of which fails for good; "zeta": 4 jobs left waiting (delayed).
    for i in 0..3 {
        queue
            .enqueue(NewJob::new("acme", format!("{i}")))
            .await
            .unwrap();
    }
    for i in 0..4 {
        queue
            .enqueue(NewJob::new("zeta", format!("{i}")).delay(Duration::from_secs(3600)))
            .await
            .unwrap();
    }
    let worker = Arc::new(Worker::new(queue.clone(), WorkerOptions::new()).unwrap());
    let done = {
        let queue = queue.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let s = queue.stats("acme").await.unwrap();
                if s.completed == 2 && s.dead == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    worker
        .run(
            |job: Job| async move {
                if job.payload == b"1" {
                    Err(Failure::permanent("mailbox does not exist"))
                } else {
                    Ok(Done::new())
                }
            },
            done,
        )
        .await;

    let (code, out, err) = jobs(&url, &["inspect"]);
    eprintln!("{out}");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("queue mail: 2 groups"), "{out}");
    let row = |name: &str| -> Vec<u64> {
        out.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name} in {out}"))
            .split_whitespace()
            .skip(1)
            .map(|n| n.parse().unwrap())
            .collect()
    };
    // waiting delayed active dead completed failed retried reclaimed
    assert_eq!(row("acme"), [0, 0, 0, 1, 2, 1, 0, 0]);
    assert_eq!(row("zeta"), [0, 4, 0, 0, 0, 0, 0, 0]);

    let (code, out, _) = jobs(&url, &["inspect", "--group", "acme"]);
    eprintln!("{out}");
    assert_eq!(code, 0);
    assert!(out.contains("  2  1  mailbox does not exist"), "{out}");

    let (code, out, _) = jobs(&url, &["retry", "--group", "acme"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "1 dead letters of acme back to wait in mail\n")
    );
    let s = queue.stats("acme").await.unwrap();
    assert_eq!((s.waiting, s.dead), (1, 0));

    let (code, out, _) = jobs(&url, &["purge", "--group", "zeta", "--what", "waiting"]);
    assert_eq!(
        (code, out.as_str()),
        (0, "4 jobs of zeta purged (waiting) from mail\n")
    );
    assert_eq!(queue.stats("zeta").await.unwrap().delayed, 0);
    let (code, _, _) = jobs(&url, &["purge", "--group", "zeta", "--what", "all"]);
    assert_eq!(code, 0);
    assert_eq!(queue.groups().await.unwrap(), ["acme"]);

    // Bad arguments exit 2 with the reason; an unreachable Redis exits 1.
    let (code, _, err) = jobs(&url, &["purge", "--group", "acme", "--what", "everything"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = jobs(&url, &["inspect", "--group", ""]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("may not be empty"), "{err}");
    let (code, _, err) = jobs_of(&url, "a{b}", &["inspect"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("brace"), "{err}");
    let dead_url = format!("redis://127.0.0.1:{}", common::closed_port());
    let (code, _, err) = jobs(&dead_url, &["inspect"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("redis"), "{err}");
}
