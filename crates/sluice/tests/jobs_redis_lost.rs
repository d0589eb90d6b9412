//! The job queue against a real redis-server, when a worker is paused mid-job: its entry
//! goes idle beyond the visibility timeout, another worker claims the job back and runs it,
//! and when the paused worker wakes and ends its attempt, the queue answers `lost` and its
//! result changes nothing: not the job, not its group's counters, not the bucket (no refund
//! of the settled cost). Both orders: the paused worker wakes after the second worker
//! completed the job, and while the second worker still runs it.

#![cfg(feature = "redis")]

mod support;

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::jobs::{
    Done, Failure, GroupStats, Job, JobQueue, NewJob, QueueOptions, Worker, WorkerOptions,
    WorkerReport,
};
use sluice::store::{RedisConfig, RedisStore, Store};
use support::jobs::{gcra, unique};
use support::redis::RedisServer;
use tokio::sync::{oneshot, Semaphore};

const VISIBILITY: Duration = Duration::from_millis(300);
/// The group's bucket: 10 tokens, refilling one an hour (nothing comes back during a test).
const CAPACITY: u64 = 10;
const COST: u64 = 4;

fn options(bucket_prefix: &str) -> QueueOptions {
    QueueOptions::new()
        .limit(bucket_prefix, gcra(CAPACITY, "1/h"))
        .visibility(VISIBILITY)
}

/// A worker on a thread and runtime of its own, like a process of its own: its handler
/// reports the job it was handed and then blocks the whole runtime (heartbeats included)
/// until it is told how the attempt ends, as a worker paused (SIGSTOP, a stalled VM, a
/// blocked thread) does.
struct PausedWorker {
    started: mpsc::Receiver<Job>,
    wake: mpsc::Sender<Result<Done, Failure>>,
    stop: oneshot::Sender<()>,
    thread: std::thread::JoinHandle<WorkerReport>,
}

impl PausedWorker {
    fn start(url: String, name: String, bucket_prefix: String) -> PausedWorker {
        let (started_tx, started) = mpsc::channel::<Job>();
        let (wake, wake_rx) = mpsc::channel::<Result<Done, Failure>>();
        let (stop, stop_rx) = oneshot::channel::<()>();
        let wake_rx = Arc::new(parking_lot::Mutex::new(wake_rx));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let queue =
                    JobQueue::connect(&RedisConfig::new(url), &name, options(&bucket_prefix))
                        .await
                        .unwrap();
                let options = WorkerOptions::new()
                    .consumer("paused")
                    .poll(Duration::from_millis(20));
                let worker = Arc::new(Worker::new(queue, options).unwrap());
                let started_tx = parking_lot::Mutex::new(started_tx);
                let handler = move |job: Job| {
                    started_tx.lock().send(job).unwrap();
                    // Blocks this runtime's only thread: nothing of this worker runs.
                    let end = wake_rx
                        .lock()
                        .recv_timeout(Duration::from_secs(30))
                        .expect("told how the attempt ends");
                    async move { end }
                };
                worker
                    .run(handler, async move {
                        let _ = stop_rx.await;
                    })
                    .await
            })
        });
        PausedWorker {
            started,
            wake,
            stop,
            thread,
        }
    }

    /// Wakes the worker with `end` as its attempt's result, stops it once that attempt is
    /// over, and returns what it counted.
    fn wake_and_stop(self, end: Result<Done, Failure>) -> WorkerReport {
        self.wake.send(end).unwrap();
        let _ = self.stop.send(());
        self.thread.join().unwrap()
    }
}

/// The second worker, on the test's runtime: it reports every job it is handed, completes
/// it at its cost, and holds the jobs of group `during` until a permit is given.
struct SecondWorker {
    seen: tokio::sync::mpsc::UnboundedReceiver<Job>,
    release: Arc<Semaphore>,
    stop: oneshot::Sender<()>,
    running: tokio::task::JoinHandle<WorkerReport>,
}

impl SecondWorker {
    fn start(queue: &JobQueue) -> SecondWorker {
        let options = WorkerOptions::new()
            .consumer("second")
            .poll(Duration::from_millis(20));
        let worker = Arc::new(Worker::new(queue.clone(), options).unwrap());
        let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let release = Arc::new(Semaphore::new(0));
        let handler = {
            let release = release.clone();
            move |job: Job| {
                let seen = seen_tx.clone();
                let release = release.clone();
                async move {
                    let hold = job.group == "during";
                    seen.send(job).unwrap();
                    if hold {
                        release.acquire().await.unwrap().forget();
                    }
                    Ok(Done::with_cost(COST))
                }
            }
        };
        let (stop, stop_rx) = oneshot::channel::<()>();
        let running = tokio::spawn(worker.run(handler, async move {
            let _ = stop_rx.await;
        }));
        SecondWorker {
            seen,
            release,
            stop,
            running,
        }
    }

    async fn stop(self) -> WorkerReport {
        let _ = self.stop.send(());
        self.running.await.unwrap()
    }
}

async fn tokens(store: &RedisStore, group: &str) -> u64 {
    store.check(group, 0).await.unwrap().remaining
}

/// Waits until `group`'s figures satisfy `ok`.
async fn wait_for(queue: &JobQueue, group: &str, ok: impl Fn(&GroupStats) -> bool) -> GroupStats {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let s = queue.stats(group).await.unwrap();
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "{group}: {s:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The figures that count outcomes and jobs, for comparing a group before and after.
fn outcomes(s: &GroupStats) -> [u64; 9] {
    [
        s.waiting,
        s.delayed,
        s.active,
        s.dead,
        s.completed,
        s.failed,
        s.retried,
        s.dead_lettered,
        s.reclaimed,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_workers_result_is_lost_and_changes_nothing() {
    let server = RedisServer::start().expect("redis-server is installed");
    let url = server.url();
    let name = unique("lost");
    let prefix = unique("lost:bucket");
    let queue = JobQueue::connect(&RedisConfig::new(url.clone()), &name, options(&prefix))
        .await
        .unwrap();
    let store = RedisStore::connect(
        gcra(CAPACITY, "1/h"),
        RedisConfig::new(url.clone()).prefix(prefix.clone()),
    )
    .await
    .unwrap();

    // 1. The paused worker wakes after the second worker completed the job.
    queue
        .enqueue(
            NewJob::new("after", "x")
                .cost(COST)
                .idempotency_key("mail-1"),
        )
        .await
        .unwrap();
    let paused = PausedWorker::start(url.clone(), name.clone(), prefix.clone());
    let first = paused
        .started
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!((first.attempt, first.reclaimed), (1, false));
    assert_eq!(tokens(&store, "after").await, CAPACITY - COST);

    let mut second = SecondWorker::start(&queue);
    let rerun = second.seen.recv().await.unwrap();
    assert_eq!(
        (rerun.id.as_str(), rerun.attempt, rerun.reclaimed),
        (first.id.as_str(), 2, true),
        "claimed back once the paused worker's entry was idle for {VISIBILITY:?}"
    );
    let before = wait_for(&queue, "after", |s| s.completed == 1).await;
    assert_eq!(outcomes(&before), [0, 0, 0, 0, 1, 0, 0, 0, 1]);
    // Claimed back, the job was charged again: 2 tokens left.
    assert_eq!(tokens(&store, "after").await, CAPACITY - 2 * COST);

    // The paused worker wakes and says the job cost nothing: lost, no refund, no second
    // completion.
    let report = paused.wake_and_stop(Ok(Done::with_cost(0)));
    assert_eq!(
        (report.lost, report.completed, report.retried, report.dead),
        (1, 0, 0, 0),
        "{report:?}"
    );
    let after = queue.stats("after").await.unwrap();
    assert_eq!(outcomes(&after), outcomes(&before), "{after:?}");
    assert_eq!(tokens(&store, "after").await, CAPACITY - 2 * COST);
    // The completed job still holds its idempotency key: enqueued again, nothing is added.
    let repeat = queue
        .enqueue(
            NewJob::new("after", "x")
                .cost(COST)
                .idempotency_key("mail-1"),
        )
        .await
        .unwrap();
    assert_eq!(
        (repeat.id.as_str(), repeat.added),
        (first.id.as_str(), false)
    );
    let report = second.stop().await;
    assert_eq!((report.completed, report.lost), (1, 0), "{report:?}");

    // 2. The paused worker wakes while the second worker runs the job it claimed back, and
    // says the job failed for good: lost, the job neither dead nor ended.
    queue
        .enqueue(NewJob::new("during", "y").cost(COST))
        .await
        .unwrap();
    let paused = PausedWorker::start(url.clone(), name.clone(), prefix.clone());
    let first = paused
        .started
        .recv_timeout(Duration::from_secs(10))
        .unwrap();
    assert_eq!((first.group.as_str(), first.attempt), ("during", 1));
    let mut second = SecondWorker::start(&queue);
    let rerun = second.seen.recv().await.unwrap();
    assert_eq!(
        (rerun.group.as_str(), rerun.attempt, rerun.reclaimed),
        ("during", 2, true)
    );
    let before = wait_for(&queue, "during", |s| s.active == 1 && s.reclaimed == 1).await;
    assert_eq!(outcomes(&before), [0, 0, 1, 0, 0, 0, 0, 0, 1]);
    let report = paused.wake_and_stop(Err(Failure::permanent("bounced").with_cost(0)));
    assert_eq!(
        (report.lost, report.completed, report.retried, report.dead),
        (1, 0, 0, 0),
        "{report:?}"
    );
    let after = queue.stats("during").await.unwrap();
    assert_eq!(outcomes(&after), outcomes(&before), "{after:?}");
    assert_eq!(tokens(&store, "during").await, CAPACITY - 2 * COST);
    assert!(queue.dead_letters("during", 10).await.unwrap().is_empty());

    // The second worker's attempt stands: it completes the job, once.
    second.release.add_permits(1);
    let done = wait_for(&queue, "during", |s| s.completed == 1).await;
    assert_eq!(outcomes(&done), [0, 0, 0, 0, 1, 0, 0, 0, 1]);
    let report = second.stop().await;
    assert_eq!(
        (report.completed, report.lost, report.dead),
        (1, 0, 0),
        "{report:?}"
    );
    assert_eq!(tokens(&store, "during").await, CAPACITY - 2 * COST);
}
