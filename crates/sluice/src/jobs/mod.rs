//! Durable jobs under shared limits: a work queue on Redis Streams whose jobs are handed out
//! only when their group's limit and concurrency allow it.
//!
//! - [`JobQueue`]: enqueue ([`NewJob`]: group, cost, priority, delay, idempotency key, maximum
//!   attempts), inspect ([`GroupStats`], dead letters), retry the dead, purge.
//! - [`Worker`]: takes groups round robin, claims a job when the group's bucket (the very
//!   bucket `RedisStore` and the gateway use for the same prefix and key) and concurrency
//!   allow it, heartbeats it, and finishes it: completed (its actual cost settled on the
//!   bucket), retried after the server's `Retry-After` or after exponential backoff with
//!   jitter, or dead-lettered after its last attempt. A breaker per group.
//!
//! Delivery is at least once: a worker killed mid-job leaves its stream entry pending, and
//! the entry is claimed back once idle beyond the visibility timeout. A job that must have
//! its effect once carries an idempotency key: enqueued twice it is one job, and its handler
//! is handed the key to make its effect conditional on it.
//!
//! The keys and scripts, shared with the npm package, are in `docs/jobs.md` ("Redis layout").
//!
//! # Metrics
//!
//! [`JobQueue::report_metrics`] reads every group's figures from Redis
//! ([`JobQueue::all_stats`]) and records them ([`JobQueue::record_metrics`]), labelled `queue`
//! and `group`:
//!
//! | name | kind | labels |
//! |------|------|--------|
//! | `sluice_jobs` | gauge | `queue`, `group`, `state` (`waiting`, `delayed`, `active`, `dead`) |
//! | `sluice_jobs_total` | counter | `queue`, `group`, `outcome` (`completed`, `failed`, `retried`, `dead`, `reclaimed`) |
//!
//! A [`Worker`] counts what it does itself in `sluice_job_attempts_total` (counter, `queue`,
//! `outcome`: `completed`, `retried`, `dead`, `lost`).

mod queue;
mod script;
mod worker;

use std::fmt;
use std::time::Duration;

pub use queue::{DeadLetter, Enqueued, GroupStats, JobQueue, Purge, QueueOptions};
pub use worker::{Worker, WorkerOptions, WorkerReport};

/// What can go wrong with a queue: bad input, or Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// An argument the queue cannot take (an empty group, a priority above 1000, ...).
    #[error("jobs: {0}")]
    Invalid(String),
    /// The Redis configuration or the limit cannot be used.
    #[error("jobs: {0}")]
    Config(String),
    /// Redis failed or did not answer in time.
    #[error("jobs: redis: {0}")]
    Redis(String),
}

/// A job to enqueue.
///
/// ```
/// use std::time::Duration;
/// use sluice::jobs::NewJob;
///
/// let job = NewJob::new("key-7", b"{\"text\": \"...\"}".to_vec())
///     .cost(8_000)
///     .priority(10)
///     .delay(Duration::from_secs(5))
///     .max_attempts(5)
///     .idempotency_key("doc-4711");
/// assert_eq!(job.group(), "key-7");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub(crate) group: String,
    pub(crate) payload: Vec<u8>,
    pub(crate) cost: u64,
    pub(crate) priority: u16,
    pub(crate) delay: Duration,
    pub(crate) max_attempts: u32,
    pub(crate) idempotency_key: Option<String>,
}

/// The largest cost a job may have (the scripts keep every sum exact).
pub const MAX_COST: u64 = 1 << 32;
/// The highest priority.
pub const MAX_PRIORITY: u16 = 1000;
/// The most attempts a job may have.
pub const MAX_ATTEMPTS: u32 = 1000;

impl NewJob {
    /// A job of `group` (a tenant, an API key: the key of its bucket) with `payload`; cost 1,
    /// priority 0, no delay, 3 attempts, no idempotency key.
    pub fn new(group: impl Into<String>, payload: impl Into<Vec<u8>>) -> NewJob {
        NewJob {
            group: group.into(),
            payload: payload.into(),
            cost: 1,
            priority: 0,
            delay: Duration::ZERO,
            max_attempts: 3,
            idempotency_key: None,
        }
    }

    /// The tokens of the group's limit the job takes when it starts (0 to [`MAX_COST`]; it may
    /// settle its actual cost when it ends).
    pub fn cost(mut self, cost: u64) -> NewJob {
        self.cost = cost;
        self
    }

    /// Its priority within its group, 0 to [`MAX_PRIORITY`], higher first.
    pub fn priority(mut self, priority: u16) -> NewJob {
        self.priority = priority;
        self
    }

    /// Not started before this delay.
    pub fn delay(mut self, delay: Duration) -> NewJob {
        self.delay = delay;
        self
    }

    /// At most this many attempts (1 to [`MAX_ATTEMPTS`]), then the dead-letter stream.
    pub fn max_attempts(mut self, attempts: u32) -> NewJob {
        self.max_attempts = attempts;
        self
    }

    /// A key that makes the job once: enqueued again while the group still holds a job with
    /// it (waiting, running, dead, or completed and kept), nothing is added.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> NewJob {
        self.idempotency_key = Some(key.into());
        self
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    pub(crate) fn validate(&self) -> Result<(), JobError> {
        validate_group(&self.group)?;
        if self.cost > MAX_COST {
            return Err(JobError::Invalid(format!(
                "cost {} is above the most a job may cost, {MAX_COST}",
                self.cost
            )));
        }
        if self.priority > MAX_PRIORITY {
            return Err(JobError::Invalid(format!(
                "priority {} is above {MAX_PRIORITY}",
                self.priority
            )));
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(JobError::Invalid(format!(
                "max attempts {} is not between 1 and {MAX_ATTEMPTS}",
                self.max_attempts
            )));
        }
        if self.delay > Duration::from_secs(365 * 86_400) {
            return Err(JobError::Invalid(format!(
                "a delay of {:?} is above a year",
                self.delay
            )));
        }
        Ok(())
    }
}

/// A group names a bucket key and the hash tag of its keys: not empty, no braces.
pub(crate) fn validate_group(group: &str) -> Result<(), JobError> {
    if group.is_empty() {
        return Err(JobError::Invalid(String::from("a group may not be empty")));
    }
    if group.contains(['{', '}']) {
        return Err(JobError::Invalid(format!(
            "group {group:?} holds a brace, which would change its Redis Cluster hash tag"
        )));
    }
    Ok(())
}

/// A job handed to a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    /// Its group.
    pub group: String,
    /// Its id within the group (the group's enqueue count at its enqueue).
    pub id: String,
    /// What was enqueued.
    pub payload: Vec<u8>,
    /// The tokens it was admitted with.
    pub cost: u64,
    /// Its priority.
    pub priority: u16,
    /// This attempt, from 1.
    pub attempt: u32,
    /// The most attempts it has.
    pub max_attempts: u32,
    /// Its idempotency key, if it was given one.
    pub idempotency_key: Option<String>,
    /// Whether this attempt follows one whose worker stopped (claimed back after the
    /// visibility timeout): its effect may have happened.
    pub reclaimed: bool,
}

/// A job that succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Done {
    pub(crate) actual_cost: Option<u64>,
}

impl Done {
    /// Succeeded at the cost it was admitted with.
    pub fn new() -> Done {
        Done::default()
    }

    /// Succeeded, having cost `cost` tokens (an LLM call's tokens, known at its end): the
    /// difference is given back to the group's bucket, or charged into debt.
    pub fn with_cost(cost: u64) -> Done {
        Done {
            actual_cost: Some(cost),
        }
    }
}

/// A job that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub(crate) message: String,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) slow_group: Option<bool>,
    pub(crate) permanent: bool,
    pub(crate) actual_cost: Option<u64>,
}

impl Failure {
    /// A failure worth retrying (after backoff with jitter, unless a server said when).
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            retry_after: None,
            slow_group: None,
            permanent: false,
            actual_cost: None,
        }
    }

    /// A failure not worth retrying: the job goes to the dead-letter stream now.
    pub fn permanent(message: impl Into<String>) -> Failure {
        Failure {
            permanent: true,
            ..Failure::new(message)
        }
    }

    /// The server said when to come back: the job is retried after `after` exactly (and,
    /// unless [`Failure::slow_group`] says otherwise, its whole group pauses that long).
    pub fn retry_after(mut self, after: Duration) -> Failure {
        self.retry_after = Some(after);
        self
    }

    /// The server's `Retry-After` header (delay-seconds or an HTTP date), as
    /// [`Failure::retry_after`].
    ///
    /// # Errors
    ///
    /// A value that is neither: [`JobError::Invalid`].
    pub fn retry_after_header(self, value: &str) -> Result<Failure, JobError> {
        let after = crate::retry::RetryAfter::parse(value)
            .map_err(|e| JobError::Invalid(format!("Retry-After {value:?}: {e}")))?;
        Ok(self.retry_after(after.delay_from(std::time::SystemTime::now())))
    }

    /// Whether the server's wait pauses the job's whole group (default: yes, as the paced
    /// clients slow down for a `Retry-After`).
    pub fn slow_group(mut self, slow: bool) -> Failure {
        self.slow_group = Some(slow);
        self
    }

    /// What the failed attempt actually cost (settled as [`Done::with_cost`]).
    pub fn with_cost(mut self, cost: u64) -> Failure {
        self.actual_cost = Some(cost);
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_jobs_get_clear_errors() {
        let ok = NewJob::new("g", "x");
        assert!(ok.validate().is_ok());
        let cases = [
            (NewJob::new("", "x"), "empty"),
            (NewJob::new("a{b}", "x"), "brace"),
            (ok.clone().cost(MAX_COST + 1), "cost"),
            (ok.clone().priority(1001), "priority"),
            (ok.clone().max_attempts(0), "max attempts"),
            (ok.clone().delay(Duration::from_secs(400 * 86_400)), "year"),
        ];
        for (job, word) in cases {
            let err = job.validate().unwrap_err().to_string();
            assert!(err.contains(word), "{err}");
        }
    }

    #[test]
    fn retry_after_headers_are_read_or_refused() {
        let f = Failure::new("429").retry_after_header("7").unwrap();
        assert_eq!(f.retry_after, Some(Duration::from_secs(7)));
        assert!(Failure::new("429").retry_after_header("soon").is_err());
    }
}
