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
    sweep: Duration,
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
            sweep: Duration::from_secs(5),
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

    /// How often the worker sweeps a page of 100 groups for one holding jobs but off the
    /// queue's lists (a producer stopped between its two calls; see [`JobQueue::sweep`]).
    /// Default 5 s.
    pub fn sweep(mut self, every: Duration) -> WorkerOptions {
        self.sweep = every.max(Duration::from_millis(10));
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

/// The worker's `sluice_job_attempts_total` handles, taken when it is built.
struct AttemptMetrics {
    completed: metrics::Counter,
    retried: metrics::Counter,
    dead: metrics::Counter,
    lost: metrics::Counter,
}

impl AttemptMetrics {
    fn new(queue: &str) -> AttemptMetrics {
        let counter = |outcome: &'static str| metrics::counter!("sluice_job_attempts_total", "queue" => queue.to_string(), "outcome" => outcome);
        AttemptMetrics {
            completed: counter("completed"),
            retried: counter("retried"),
            dead: counter("dead"),
            lost: counter("lost"),
        }
    }
}

/// A worker of a [`JobQueue`].
pub struct Worker {
    queue: JobQueue,
    options: WorkerOptions,
    consumer: String,
    breakers: Mutex<HashMap<String, CircuitBreaker>>,
    rng: Mutex<StdRng>,
    counts: Counts,
    metrics: AttemptMetrics,
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
            metrics: AttemptMetrics::new(queue.name()),
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
        let sweeper = {
            let worker = self.clone();
            let mut stop = stop_rx.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = stop.changed() => return,
                        _ = tokio::time::sleep(worker.options.sweep) => {}
                    }
                    if let Err(e) = worker.queue.sweep(100).await {
                        let _ = worker.error(&e);
                    }
                }
            })
        };
        shutdown.await;
        let _ = stop_tx.send(true);
        let _ = sweeper.await;
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
        let plan = plan(
            &result,
            (attempt, max_attempts),
            &self.options,
            &mut *self.rng.lock(),
        );
        let (outcome, actual, delay, pause, error) = (
            plan.outcome,
            plan.actual_cost,
            plan.delay,
            plan.pause,
            plan.error,
        );
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
        let (count, metric) = match result.as_str() {
            "done" => (&self.counts.completed, &self.metrics.completed),
            "retry" => (&self.counts.retried, &self.metrics.retried),
            "dead" => (&self.counts.dead, &self.metrics.dead),
            _ => (&self.counts.lost, &self.metrics.lost),
        };
        count.fetch_add(1, Ordering::Relaxed);
        metric.increment(1);
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

/// How an attempt ends, as the worker tells finish.lua.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Plan {
    /// `done`, `retry` or `dead`.
    outcome: &'static str,
    actual_cost: Option<u64>,
    /// Before the retry.
    delay: Duration,
    /// Of the whole group.
    pause: Option<Duration>,
    error: String,
}

/// The end of attempt `attempt` of `max_attempts` with `result`: a server's hint is waited
/// exactly (and pauses the group unless the failure or the options say not); otherwise the
/// backoff's jittered delay for retry `attempt - 1`; permanent failures and the last attempt
/// are dead.
fn plan<R: rand::RngCore + ?Sized>(
    result: &Result<Done, Failure>,
    (attempt, max_attempts): (u32, u32),
    options: &WorkerOptions,
    rng: &mut R,
) -> Plan {
    let f = match result {
        Ok(done) => {
            return Plan {
                outcome: "done",
                actual_cost: done.actual_cost,
                delay: Duration::ZERO,
                pause: None,
                error: String::new(),
            }
        }
        Err(f) => f,
    };
    let (delay, pause) = match f.retry_after {
        _ if f.permanent => (Duration::ZERO, None),
        Some(after) => {
            let slow = f.slow_group.unwrap_or(options.slow_group_on_hint);
            (after, slow.then_some(after))
        }
        None => (options.backoff.delay(attempt.saturating_sub(1), rng), None),
    };
    let outcome = if f.permanent || attempt >= max_attempts {
        "dead"
    } else {
        "retry"
    };
    Plan {
        outcome,
        actual_cost: f.actual_cost,
        delay,
        pause,
        error: f.message.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_ends_as_the_server_or_the_backoff_says() {
        let options = WorkerOptions::new().backoff(Backoff::new(
            Duration::from_millis(100),
            Duration::from_secs(1),
        ));
        let mut rng = StdRng::seed_from_u64(7);
        let hinted = Failure::new("429").retry_after(Duration::from_secs(3));
        let p = plan(&Err(hinted.clone()), (1, 5), &options, &mut rng);
        assert_eq!(
            (p.outcome, p.delay, p.pause),
            (
                "retry",
                Duration::from_secs(3),
                Some(Duration::from_secs(3))
            )
        );
        let p = plan(
            &Err(hinted.clone().slow_group(false)),
            (1, 5),
            &options,
            &mut rng,
        );
        assert_eq!(p.pause, None);
        let quiet = options.clone().slow_group_on_hint(false);
        assert_eq!(
            plan(&Err(hinted.clone()), (1, 5), &quiet, &mut rng).pause,
            None
        );
        // Without a hint: the backoff's own draw for retry n - 1, within [0, min(cap, base 2^n)].
        for attempt in 1..=6u32 {
            let mut a = StdRng::seed_from_u64(u64::from(attempt));
            let mut b = StdRng::seed_from_u64(u64::from(attempt));
            let p = plan(&Err(Failure::new("500")), (attempt, 10), &options, &mut a);
            assert_eq!(p.delay, options.backoff.delay(attempt - 1, &mut b));
            assert!(p.delay <= options.backoff.ceiling(attempt - 1));
            assert_eq!((p.outcome, p.pause), ("retry", None));
        }
        assert_eq!(
            plan(&Err(Failure::new("500")), (5, 5), &options, &mut rng).outcome,
            "dead"
        );
        assert_eq!(
            plan(&Err(hinted), (5, 5), &options, &mut rng).outcome,
            "dead"
        );
        let p = plan(
            &Err(Failure::permanent("400").with_cost(3)),
            (1, 5),
            &options,
            &mut rng,
        );
        assert_eq!(
            (p.outcome, p.actual_cost, p.error.as_str()),
            ("dead", Some(3), "400")
        );
        let p = plan(&Ok(Done::with_cost(9)), (1, 5), &options, &mut rng);
        assert_eq!((p.outcome, p.actual_cost), ("done", Some(9)));
    }
}
