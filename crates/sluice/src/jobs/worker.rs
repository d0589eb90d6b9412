//! The worker: takes groups round robin, claims, runs, heartbeats and finishes jobs.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::queue::Claim;
use super::{Done, Failure, Job, JobError, JobQueue};
use crate::breaker::{BreakerBuilder, BreakerPermit, CircuitBreaker};
use crate::retry::Backoff;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    consumer: Option<String>,
    slots: usize,
    backoff: Backoff,
    poll: Duration,
    slow_group_on_hint: bool,
    breaker: Option<BreakerBuilder>,
    seed: Option<u64>,
}

impl Default for WorkerOptions {
    fn default() -> WorkerOptions {
        WorkerOptions {
            consumer: None,
            slots: 1,
            backoff: Backoff::new(Duration::from_millis(100), Duration::from_secs(60)),
            poll: Duration::from_millis(200),
            slow_group_on_hint: true,
            breaker: None,
            seed: None,
        }
    }
}

impl WorkerOptions {
    /// One job at a time, a random consumer name, backoff from 100 ms to 60 s with full
    /// jitter, idle polls at most 200 ms apart, a server's `Retry-After` pausing the group.
    pub fn new() -> WorkerOptions {
        WorkerOptions::default()
    }

    /// The worker's consumer name in the streams' consumer group (default `w-<pid>-<random>`):
    /// unique among live workers.
    pub fn consumer(mut self, name: impl Into<String>) -> WorkerOptions {
        self.consumer = Some(name.into());
        self
    }

    /// How many jobs this worker runs at once (at least 1).
    pub fn slots(mut self, slots: usize) -> WorkerOptions {
        self.slots = slots.max(1);
        self
    }

    /// The backoff of a failure without a server's hint: retry `n` after a delay drawn from
    /// `[0, min(cap, base × 2^n)]` (the backoff's jitter; its attempt limits are the job's).
    pub fn backoff(mut self, backoff: Backoff) -> WorkerOptions {
        self.backoff = backoff;
        self
    }

    /// The longest the worker sleeps when no group is ready.
    pub fn poll(mut self, poll: Duration) -> WorkerOptions {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }

    /// Whether a failure with a server's `Retry-After` pauses the job's whole group (default
    /// yes; a [`Failure::slow_group`] decides for itself).
    pub fn slow_group_on_hint(mut self, slow: bool) -> WorkerOptions {
        self.slow_group_on_hint = slow;
        self
    }

    /// A circuit breaker per group, built from `breaker` (named `<queue>:<group>`): while a
    /// group's is open the worker skips the group until it may admit again.
    pub fn breaker(mut self, breaker: BreakerBuilder) -> WorkerOptions {
        self.breaker = Some(breaker);
        self
    }

    /// Seeds the backoff's jitter (a schedule known in advance, for tests).
    pub fn seed(mut self, seed: u64) -> WorkerOptions {
        self.seed = Some(seed);
        self
    }
}

/// What a worker did until it stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerReport {
    /// Jobs completed.
    pub completed: u64,
    /// Attempts that failed and were retried.
    pub retried: u64,
    /// Jobs dead-lettered.
    pub dead: u64,
    /// Results refused because the job had been claimed back (the worker was too slow).
    pub lost: u64,
    /// Calls to Redis that failed (the worker went on).
    pub errors: u64,
}

/// What a turn found.
enum Next {
    /// A job to run, with its stream entry and its group's breaker permit.
    Run(Job, String, Option<BreakerPermit>),
    /// Nothing to run from this group: take the next turn at once.
    Again,
    /// No group is ready (or Redis failed): sleep this long.
    Sleep(Duration),
}

#[derive(Default)]
struct Counts {
    completed: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    lost: AtomicU64,
    errors: AtomicU64,
}

/// A worker of a [`JobQueue`].
pub struct Worker {
    queue: JobQueue,
    options: WorkerOptions,
    consumer: String,
    breakers: Mutex<HashMap<String, CircuitBreaker>>,
    rng: Mutex<StdRng>,
    counts: Counts,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("queue", &self.queue.name())
            .field("consumer", &self.consumer)
            .finish()
    }
}

impl Worker {
    /// A worker of `queue`.
    ///
    /// # Errors
    ///
    /// [`JobError::Invalid`] for an empty consumer name, or a breaker configuration the
    /// breaker refuses.
    pub fn new(queue: JobQueue, options: WorkerOptions) -> Result<Worker, JobError> {
        let consumer = match &options.consumer {
            Some(name) if name.is_empty() => {
                return Err(JobError::Invalid(String::from(
                    "a consumer name may not be empty",
                )))
            }
            Some(name) => name.clone(),
            None => format!(
                "w-{}-{:08x}",
                std::process::id(),
                rand::rng().random::<u32>()
            ),
        };
        if let Some(b) = &options.breaker {
            b.clone()
                .build()
                .map_err(|e| JobError::Invalid(format!("breaker: {e}")))?;
        }
        let rng = match options.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        Ok(Worker {
            queue,
            options,
            consumer,
            breakers: Mutex::new(HashMap::new()),
            rng: Mutex::new(rng),
            counts: Counts::default(),
        })
    }

    /// The worker's consumer name.
    pub fn consumer(&self) -> &str {
        &self.consumer
    }

    /// Runs jobs with `handler`, [`slots`](WorkerOptions::slots) at once, until `shutdown`
    /// completes; then lets the jobs running end and returns. A Redis error does not stop the
    /// worker: it is counted, and the worker tries again after its poll interval.
    pub async fn run<H, F>(
        self: Arc<Self>,
        handler: H,
        shutdown: impl Future<Output = ()>,
    ) -> WorkerReport
    where
        H: Fn(Job) -> F + Send + Sync + 'static,
        F: Future<Output = Result<Done, Failure>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut slots = Vec::new();
        for _ in 0..self.options.slots {
            let worker = self.clone();
            let handler = handler.clone();
            let mut stop = stop_rx.clone();
            slots.push(tokio::spawn(async move {
                while !*stop.borrow() {
                    // Only picking and claiming is cut short by a stop: a claim whose reply is
                    // lost leaves its job to be claimed back after the visibility timeout. A
                    // job claimed runs to its end.
                    let next = tokio::select! {
                        biased;
                        _ = stop.changed() => break,
                        next = worker.next() => next,
                    };
                    match next {
                        Next::Run(job, entry, permit) => {
                            worker.run_job(&*handler, job, entry, permit).await;
                        }
                        Next::Again => {}
                        Next::Sleep(wait) => {
                            tokio::select! {
                                _ = stop.changed() => {}
                                _ = tokio::time::sleep(wait) => {}
                            }
                        }
                    }
                }
            }));
        }
        shutdown.await;
        let _ = stop_tx.send(true);
        for slot in slots {
            let _ = slot.await;
        }
        self.report()
    }

    /// What the worker did so far.
    pub fn report(&self) -> WorkerReport {
        let c = &self.counts;
        WorkerReport {
            completed: c.completed.load(Ordering::Relaxed),
            retried: c.retried.load(Ordering::Relaxed),
            dead: c.dead.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            errors: c.errors.load(Ordering::Relaxed),
        }
    }

    fn error(&self, e: &JobError) -> Next {
        self.counts.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(queue = self.queue.name(), error = %e, "jobs: worker step failed");
        Next::Sleep(self.options.poll)
    }

    /// One turn: picks a group and claims from it.
    async fn next(&self) -> Next {
        let group = match self.queue.pick().await {
            Ok(Ok(group)) => group,
            Ok(Err(due)) => {
                return Next::Sleep(due.map_or(self.options.poll, |d| d.min(self.options.poll)))
            }
            Err(e) => return self.error(&e),
        };
        let permit = match self.breaker(&group) {
            Some(Ok(permit)) => Some(permit),
            Some(Err(open)) => {
                // Whatever was enqueued since: the breaker holds the group.
                return match self
                    .queue
                    .park(&group, "9007199254740991", Some(open))
                    .await
                {
                    Ok(()) => Next::Again,
                    Err(e) => self.error(&e),
                };
            }
            None => None,
        };
        let parked = match self.queue.claim(&group, &self.consumer).await {
            Ok(Claim::Job { job, entry }) => return Next::Run(job, entry, permit),
            Ok(Claim::Park { wait, version }) => {
                self.queue.park(&group, &version, Some(wait)).await
            }
            Ok(Claim::Empty { version }) => self.queue.park(&group, &version, None).await,
            Ok(Claim::Skip) => Ok(()),
            Err(e) => Err(e),
        };
        match parked {
            Ok(()) => Next::Again,
            Err(e) => self.error(&e),
        }
    }

    /// The group's breaker permit: `None` without breakers, `Some(Err(wait))` while open.
    fn breaker(&self, group: &str) -> Option<Result<BreakerPermit, Duration>> {
        let template = self.options.breaker.as_ref()?;
        let mut breakers = self.breakers.lock();
        let breaker = breakers.entry(group.to_string()).or_insert_with(|| {
            template
                .clone()
                .name(format!("{}:{group}", self.queue.name()))
                .build()
                .expect("the configuration was checked in Worker::new")
        });
        Some(
            breaker
                .try_acquire()
                .map_err(|open| open.retry_after.max(Duration::from_millis(1))),
        )
    }

    /// Runs a claimed job with `handler`, heartbeating it, and finishes it.
    async fn run_job<H, F>(
        &self,
        handler: &H,
        job: Job,
        entry: String,
        permit: Option<BreakerPermit>,
    ) where
        H: Fn(Job) -> F,
        F: Future<Output = Result<Done, Failure>> + Send + 'static,
    {
        let group = job.group.clone();
        let id = job.id.clone();
        let attempt = job.attempt;
        let max_attempts = job.max_attempts;
        // Heartbeats every third of the visibility timeout while the handler runs.
        let beat = self.queue.inner.options.visibility / 3;
        let heartbeat = {
            let queue = self.queue.clone();
            let (group, consumer, id, entry) = (
                group.clone(),
                self.consumer.clone(),
                id.clone(),
                entry.clone(),
            );
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(beat).await;
                    // Claimed back by another worker: nothing more to keep alive. (A failed
                    // heartbeat is tried again at the next beat.)
                    if let Ok(false) = queue.touch(&group, &consumer, &id, &entry).await {
                        break;
                    }
                }
            })
        };
        let result = handler(job).await;
        heartbeat.abort();
        let (outcome, actual, delay, pause, error) = match &result {
            Ok(done) => (
                "done",
                done.actual_cost,
                Duration::ZERO,
                None,
                String::new(),
            ),
            Err(f) if f.permanent => (
                "dead",
                f.actual_cost,
                Duration::ZERO,
                None,
                f.message.clone(),
            ),
            Err(f) => {
                let (delay, pause) = match f.retry_after {
                    Some(after) => {
                        let slow = f.slow_group.unwrap_or(self.options.slow_group_on_hint);
                        (after, slow.then_some(after))
                    }
                    None => (
                        self.options
                            .backoff
                            .delay(attempt.saturating_sub(1), &mut *self.rng.lock()),
                        None,
                    ),
                };
                let outcome = if attempt >= max_attempts {
                    "dead"
                } else {
                    "retry"
                };
                (outcome, f.actual_cost, delay, pause, f.message.clone())
            }
        };
        if let Some(permit) = permit {
            permit.record(result.is_err());
        }
        // Finish is safe to repeat (a repeat answers `lost`), so a failed call is sent again.
        let mut finished = None;
        for attempt in 0..5u32 {
            match self
                .queue
                .finish(
                    &group,
                    &self.consumer,
                    (&id, &entry),
                    outcome,
                    actual,
                    delay,
                    pause,
                    &error,
                )
                .await
            {
                Ok(r) => {
                    finished = Some(r);
                    break;
                }
                Err(e) => {
                    let _ = self.error(&e);
                    tokio::time::sleep(Duration::from_millis(100) * (attempt + 1)).await;
                }
            }
        }
        let Some((result, due, version)) = finished else {
            return;
        };
        let counter = |outcome: &'static str| {
            metrics::counter!("sluice_job_attempts_total", "queue" => self.queue.name().to_string(), "outcome" => outcome).increment(1);
        };
        match result.as_str() {
            "done" => {
                self.counts.completed.fetch_add(1, Ordering::Relaxed);
                counter("completed");
            }
            "retry" => {
                self.counts.retried.fetch_add(1, Ordering::Relaxed);
                counter("retried");
            }
            "dead" => {
                self.counts.dead.fetch_add(1, Ordering::Relaxed);
                counter("dead");
            }
            _ => {
                self.counts.lost.fetch_add(1, Ordering::Relaxed);
                counter("lost");
            }
        }
        // A retry is due later; with a concurrency bound, a group parked as busy may run now.
        let wake = match result.as_str() {
            "retry" => Some(due.as_str()),
            "done" | "dead" if self.queue.inner.options.concurrency > 0 => Some("0"),
            _ => None,
        };
        if let Some(due) = wake {
            if let Err(e) = self.queue.register(&group, Some(&version), due).await {
                let _ = self.error(&e);
            }
        }
    }
}
