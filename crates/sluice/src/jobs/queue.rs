//! The queue: its Redis connection, its options, and every script call.
//!
//! One file, past 700 lines: each public call is one script call whose KEYS and ARGV must
//! match `docs/jobs.md` and the npm package's copy; keeping them side by side is how the two
//! layouts are kept equal. The worker's loop is in `worker.rs`, the scripts in `script.rs`.

use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, Script, Value};
use sluice_core::AnyAlgorithm;

use super::script::{group_keys, queue_keys, Scripts};
use super::{validate_group, JobError, NewJob};
use crate::store::redis::{validate, Conn, Program};
use crate::store::{RedisConfig, RedisStore};

/// How a queue keeps its jobs.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    prefix: String,
    limit: Option<(String, AnyAlgorithm)>,
    pub(crate) concurrency: u32,
    pub(crate) visibility: Duration,
    keep_completed: Duration,
    max_debt: u64,
    timeout: Duration,
}

impl Default for QueueOptions {
    fn default() -> QueueOptions {
        QueueOptions {
            prefix: String::from("sluice:jobs"),
            limit: None,
            concurrency: 0,
            visibility: Duration::from_secs(30),
            keep_completed: Duration::from_secs(86_400),
            max_debt: 0,
            timeout: Duration::from_secs(2),
        }
    }
}

impl QueueOptions {
    /// Default options: prefix `sluice:jobs`, no limit, no concurrency bound, a visibility
    /// timeout of 30 s, completed jobs (and their idempotency keys) kept a day.
    pub fn new() -> QueueOptions {
        QueueOptions::default()
    }

    /// The prefix of the queue's keys (default `sluice:jobs`; no braces).
    pub fn prefix(mut self, prefix: impl Into<String>) -> QueueOptions {
        self.prefix = prefix.into();
        self
    }

    /// Each group's limit: the bucket `<bucket_prefix>:{<group>}` under `algorithm`, the key a
    /// [`RedisStore`] with that prefix and algorithm decides for key `<group>` (for a gateway
    /// policy the prefix is `<store prefix>:<policy name>`).
    pub fn limit(
        mut self,
        bucket_prefix: impl Into<String>,
        algorithm: AnyAlgorithm,
    ) -> QueueOptions {
        self.limit = Some((bucket_prefix.into(), algorithm));
        self
    }

    /// Each group's limit is `store`'s: the same prefix, algorithm and quota.
    pub fn limit_of(self, store: &RedisStore) -> QueueOptions {
        let prefix = store.config().prefix.clone();
        self.limit(prefix, store.algorithm())
    }

    /// At most this many jobs of one group run at once, across every worker (0: no bound).
    pub fn concurrency(mut self, jobs: u32) -> QueueOptions {
        self.concurrency = jobs;
        self
    }

    /// A running job whose worker has not heartbeated it for this long is claimed back and
    /// run again (default 30 s; workers heartbeat every third of it).
    pub fn visibility(mut self, timeout: Duration) -> QueueOptions {
        self.visibility = timeout;
        self
    }

    /// How long a completed job, and its idempotency key, is kept (default a day; zero:
    /// deleted when it completes).
    pub fn keep_completed(mut self, keep: Duration) -> QueueOptions {
        self.keep_completed = keep;
        self
    }

    /// How many tokens beyond empty a group's bucket may owe when a job settles a cost above
    /// its admission (default 0: the excess beyond empty is forgiven).
    pub fn max_debt(mut self, tokens: u64) -> QueueOptions {
        self.max_debt = tokens;
        self
    }

    /// The longest a call to Redis may take (default 2 s).
    pub fn timeout(mut self, timeout: Duration) -> QueueOptions {
        self.timeout = timeout;
        self
    }
}

/// The figures of one group, read at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupStats {
    /// Jobs waiting for their turn.
    pub waiting: u64,
    /// Jobs not due yet (delayed, or waiting to be retried).
    pub delayed: u64,
    /// Jobs running (or whose worker stopped, until they are claimed back).
    pub active: u64,
    /// Jobs in the dead-letter stream.
    pub dead: u64,
    /// Jobs completed, ever.
    pub completed: u64,
    /// Attempts that failed, ever.
    pub failed: u64,
    /// Attempts retried, ever.
    pub retried: u64,
    /// Jobs dead-lettered, ever.
    pub dead_lettered: u64,
    /// Jobs claimed back from a stopped worker, ever.
    pub reclaimed: u64,
    /// How long the group stays paused by a server's hint.
    pub paused: Duration,
    /// Jobs enqueued, ever.
    pub enqueued: u64,
}

/// What [`JobQueue::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id within its group.
    pub id: String,
    /// False when its idempotency key named a job the group holds: that job's id.
    pub added: bool,
}

/// A job in the dead-letter stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The job's id within its group.
    pub id: String,
    /// Why it died.
    pub error: String,
    /// The attempts it had.
    pub attempts: u32,
}

/// What [`JobQueue::purge`] deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purge {
    /// Waiting and delayed jobs.
    Waiting,
    /// The dead letters.
    Dead,
    /// Completed jobs kept.
    Completed,
    /// Everything of the group but its bucket; running jobs' results come back lost.
    All,
}

impl Purge {
    fn word(self) -> &'static str {
        match self {
            Purge::Waiting => "waiting",
            Purge::Dead => "dead",
            Purge::Completed => "done",
            Purge::All => "all",
        }
    }
}

/// What claim answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Claim {
    Job {
        job: super::Job,
        entry: String,
    },
    /// Park the group this long (bucket, pause, delayed jobs, concurrency or only active jobs).
    Park {
        wait: Duration,
        version: String,
    },
    /// The group holds nothing: drop it.
    Empty {
        version: String,
    },
    /// Claim again.
    Skip,
}

pub(crate) struct Inner {
    conn: Conn,
    pub(crate) scripts: Scripts,
    pub(crate) name: String,
    prefix: String,
    bucket_prefix: String,
    /// The bucket's stamp (`''` without a limit) and capacity.
    pub(crate) stamp: String,
    pub(crate) options: QueueOptions,
    queue_keys: [String; 6],
}

/// A job queue in Redis (one server, a Cluster or the master of Sentinels). Cloning is cheap:
/// clones share the connection.
#[derive(Clone)]
pub struct JobQueue {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue")
            .field("name", &self.inner.name)
            .field("prefix", &self.inner.prefix)
            .field("stamp", &self.inner.stamp)
            .finish()
    }
}

fn no_braces(what: &str, text: &str) -> Result<(), JobError> {
    if text.is_empty() || text.contains(['{', '}']) {
        return Err(JobError::Invalid(format!(
            "{what} {text:?} must be non-empty and hold no brace (braces are Redis Cluster hash tags)"
        )));
    }
    Ok(())
}

fn redis_error(e: redis::RedisError) -> JobError {
    JobError::Redis(e.to_string())
}

impl JobQueue {
    /// Connects to the queue `name` in the Redis of `redis` (its URLs and Cluster flag; its
    /// prefix is the store's, not the queue's: see [`QueueOptions::prefix`]).
    ///
    /// # Errors
    ///
    /// [`JobError::Invalid`] for a name, prefix or bucket prefix with braces, or a zero
    /// visibility timeout; [`JobError::Config`] for bad URLs or a limit the store's scripts
    /// do not take; [`JobError::Redis`] when Redis cannot be reached.
    pub async fn connect(
        redis: &RedisConfig,
        name: &str,
        options: QueueOptions,
    ) -> Result<JobQueue, JobError> {
        no_braces("queue name", name)?;
        no_braces("prefix", &options.prefix)?;
        if options.visibility < Duration::from_millis(10) {
            return Err(JobError::Invalid(String::from(
                "the visibility timeout must be at least 10 ms",
            )));
        }
        let (bucket_prefix, stamp) = match &options.limit {
            Some((prefix, algorithm)) => {
                no_braces("bucket prefix", prefix)?;
                let program =
                    Program::new(algorithm).map_err(|e| JobError::Config(e.to_string()))?;
                (prefix.clone(), program.stamp().to_string())
            }
            None => (format!("{}:{name}:nolimit", options.prefix), String::new()),
        };
        validate(redis).map_err(|e| JobError::Config(e.to_string()))?;
        let conn = tokio::time::timeout(
            options.timeout.max(Duration::from_secs(5)),
            Conn::open(redis),
        )
        .await
        .map_err(|_| JobError::Redis(String::from("connecting timed out")))?
        .map_err(redis_error)?;
        let inner = Inner {
            conn,
            scripts: Scripts::new(),
            name: name.to_string(),
            queue_keys: queue_keys(&options.prefix, name),
            prefix: options.prefix.clone(),
            bucket_prefix,
            stamp,
            options,
        };
        Ok(JobQueue {
            inner: Arc::new(inner),
        })
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The keys of `group`, in the order the group scripts take them (`docs/jobs.md`).
    pub fn group_keys(&self, group: &str) -> Vec<String> {
        let i = &self.inner;
        group_keys(&i.prefix, &i.name, &i.bucket_prefix, group).to_vec()
    }

    /// The keys of the queue's group list, and the sweep's cursor (`docs/jobs.md`).
    pub fn queue_keys(&self) -> Vec<String> {
        self.inner.queue_keys.to_vec()
    }

    /// Runs `script` on `keys` with `args` (after `ARGV[1]`, Redis's time), within the timeout.
    pub(crate) async fn call(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&[u8]],
    ) -> Result<Value, JobError> {
        let mut cmd = Cmd::new();
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        cmd.arg("");
        for a in args {
            cmd.arg(*a);
        }
        tokio::time::timeout(
            self.inner.options.timeout,
            self.inner.conn.run(&cmd, script, false),
        )
        .await
        .map_err(|_| JobError::Redis(String::from("no answer within the timeout")))?
        .map_err(redis_error)
    }

    async fn call_group(
        &self,
        script: &Script,
        group: &str,
        args: &[&[u8]],
    ) -> Result<Value, JobError> {
        let i = &self.inner;
        let keys = group_keys(&i.prefix, &i.name, &i.bucket_prefix, group);
        self.call(script, &keys, args).await
    }

    async fn call_queue(&self, script: &Script, args: &[&[u8]]) -> Result<Value, JobError> {
        self.call(script, &self.inner.queue_keys[..5], args).await
    }

    /// Adds `job`, and its group to the queue's list.
    ///
    /// # Errors
    ///
    /// [`JobError::Invalid`] for a bad job; [`JobError::Redis`] (the job may or may not have
    /// been added: an idempotency key makes enqueuing again safe).
    pub async fn enqueue(&self, job: NewJob) -> Result<Enqueued, JobError> {
        job.validate()?;
        let delay_ms = job.delay.as_millis().to_string();
        let reply = self
            .call_group(
                &self.inner.scripts.enqueue,
                &job.group,
                &[
                    job.group.as_bytes(),
                    &job.payload,
                    job.cost.to_string().as_bytes(),
                    job.priority.to_string().as_bytes(),
                    delay_ms.as_bytes(),
                    job.max_attempts.to_string().as_bytes(),
                    job.idempotency_key.as_deref().unwrap_or("").as_bytes(),
                ],
            )
            .await?;
        let r = strings(&reply)?;
        let [id, added, version, due] = &r[..] else {
            return Err(unexpected("enqueue", &reply));
        };
        self.register(&job.group, Some(version), due).await?;
        Ok(Enqueued {
            id: id.clone(),
            added: added == "1",
        })
    }

    /// Puts `group` on the queue's list, due at `due_ms` (`"0"`: now), with the group's
    /// `version` if it changed. Safe to repeat.
    pub(crate) async fn register(
        &self,
        group: &str,
        version: Option<&str>,
        due_ms: &str,
    ) -> Result<(), JobError> {
        let mut last = None;
        for _ in 0..3 {
            match self
                .call_queue(
                    &self.inner.scripts.register,
                    &[
                        group.as_bytes(),
                        version.unwrap_or("").as_bytes(),
                        due_ms.as_bytes(),
                    ],
                )
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(last.unwrap_or_else(|| JobError::Redis(String::from("register failed"))))
    }

    /// The group whose turn it is, or how long until one is due (`None`: none is).
    pub(crate) async fn pick(&self) -> Result<Result<String, Option<Duration>>, JobError> {
        let reply = self.call_queue(&self.inner.scripts.pick, &[]).await?;
        let r = strings(&reply)?;
        match &r[..] {
            [g, _] if !g.is_empty() => Ok(Ok(g.clone())),
            [_, ms] if ms.is_empty() => Ok(Err(None)),
            [_, ms] => Ok(Err(Some(Duration::from_millis(parse_u64(ms)?)))),
            _ => Err(unexpected("pick", &reply)),
        }
    }

    /// Parks (`wait: Some`) or drops (`None`) `group`, unless a version newer than `version` was
    /// registered.
    pub(crate) async fn park(
        &self,
        group: &str,
        version: &str,
        wait: Option<Duration>,
    ) -> Result<(), JobError> {
        let (mode, ms) = match wait {
            Some(w) => ("park", w.as_millis().max(1).to_string()),
            None => ("drop", String::from("0")),
        };
        self.call_queue(
            &self.inner.scripts.park,
            &[
                group.as_bytes(),
                mode.as_bytes(),
                version.as_bytes(),
                ms.as_bytes(),
            ],
        )
        .await
        .map(drop)
    }

    /// Claims `group`'s next job for `consumer`.
    pub(crate) async fn claim(&self, group: &str, consumer: &str) -> Result<Claim, JobError> {
        let o = &self.inner.options;
        let reply = self
            .call_group(
                &self.inner.scripts.claim,
                group,
                &[
                    self.inner.stamp.as_bytes(),
                    consumer.as_bytes(),
                    o.concurrency.to_string().as_bytes(),
                    o.visibility.as_millis().to_string().as_bytes(),
                ],
            )
            .await?;
        let items = bytes(&reply)?;
        let text = |i: usize| String::from_utf8_lossy(&items[i]).into_owned();
        let kind = if items.is_empty() {
            String::new()
        } else {
            text(0)
        };
        match (kind.as_str(), items.len()) {
            ("job", 11) => {
                let key = text(8);
                let job = super::Job {
                    group: group.to_string(),
                    id: text(1),
                    payload: items[3].clone(),
                    cost: parse_u64(&text(4))?,
                    attempt: parse_u64(&text(5))? as u32,
                    max_attempts: parse_u64(&text(6))? as u32,
                    priority: parse_u64(&text(7))? as u16,
                    idempotency_key: (!key.is_empty()).then_some(key),
                    reclaimed: text(9) == "1",
                };
                Ok(Claim::Job {
                    job,
                    entry: text(2),
                })
            }
            ("wait" | "paused" | "delayed", 3) => Ok(Claim::Park {
                wait: Duration::from_millis(parse_u64(&text(1))?),
                version: text(2),
            }),
            // Only active jobs, or the concurrency taken: come back when one could have gone
            // stale (a finish wakes the group sooner).
            ("busy" | "idle", 3) => Ok(Claim::Park {
                wait: o.visibility,
                version: text(2),
            }),
            ("empty", 3) => Ok(Claim::Empty { version: text(2) }),
            ("skip", 3) => Ok(Claim::Skip),
            _ => Err(unexpected("claim", &reply)),
        }
    }

    /// Resets the idle time of `entry`; false if `consumer` holds it no more.
    pub(crate) async fn touch(
        &self,
        group: &str,
        consumer: &str,
        id: &str,
        entry: &str,
    ) -> Result<bool, JobError> {
        let reply = self
            .call_group(
                &self.inner.scripts.touch,
                group,
                &[consumer.as_bytes(), id.as_bytes(), entry.as_bytes()],
            )
            .await?;
        Ok(matches!(reply, Value::Int(1)))
    }

    /// Ends an attempt: `outcome` `done`, `retry` (after `delay`) or `dead`. Returns the
    /// script's result word, the retry's due time (ms) and the group's version. Safe to
    /// repeat: a repeat finds the entry gone and answers `lost`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn finish(
        &self,
        group: &str,
        consumer: &str,
        (id, entry): (&str, &str),
        outcome: &str,
        actual_cost: Option<u64>,
        delay: Duration,
        pause: Option<Duration>,
        error: &str,
    ) -> Result<(String, String, String), JobError> {
        let o = &self.inner.options;
        let reply = self
            .call_group(
                &self.inner.scripts.finish,
                group,
                &[
                    self.inner.stamp.as_bytes(),
                    consumer.as_bytes(),
                    id.as_bytes(),
                    entry.as_bytes(),
                    outcome.as_bytes(),
                    actual_cost
                        .map(|c| c.to_string())
                        .unwrap_or_default()
                        .as_bytes(),
                    o.max_debt.to_string().as_bytes(),
                    delay.as_millis().to_string().as_bytes(),
                    pause
                        .map(|p| p.as_millis().to_string())
                        .unwrap_or_default()
                        .as_bytes(),
                    error.as_bytes(),
                    o.keep_completed.as_millis().to_string().as_bytes(),
                ],
            )
            .await?;
        let r = strings(&reply)?;
        match &r[..] {
            [result, _settled, due, version] => Ok((result.clone(), due.clone(), version.clone())),
            _ => Err(unexpected("finish", &reply)),
        }
    }

    /// The figures of `group`.
    ///
    /// # Errors
    ///
    /// [`JobError::Invalid`] for a bad group; [`JobError::Redis`].
    pub async fn stats(&self, group: &str) -> Result<GroupStats, JobError> {
        validate_group(group)?;
        let reply = self
            .call_group(&self.inner.scripts.stats, group, &[])
            .await?;
        let n: Vec<u64> = match &reply {
            Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    Value::Int(n) => u64::try_from(*n).map_err(|_| unexpected("stats", &reply)),
                    _ => Err(unexpected("stats", &reply)),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(unexpected("stats", &reply)),
        };
        let [waiting, delayed, active, dead, completed, failed, retried, dead_lettered, reclaimed, paused, enqueued] =
            n[..]
        else {
            return Err(unexpected("stats", &reply));
        };
        Ok(GroupStats {
            waiting,
            delayed,
            active,
            dead,
            completed,
            failed,
            retried,
            dead_lettered,
            reclaimed,
            paused: Duration::from_millis(paused),
            enqueued,
        })
    }

    /// Every group the queue has had (until purged with [`Purge::All`]), sorted.
    pub async fn groups(&self) -> Result<Vec<String>, JobError> {
        let mut cmd = redis::cmd("SMEMBERS");
        cmd.arg(&self.inner.queue_keys[4]);
        let reply = tokio::time::timeout(self.inner.options.timeout, self.inner.conn.query(&cmd))
            .await
            .map_err(|_| JobError::Redis(String::from("no answer within the timeout")))?
            .map_err(redis_error)?;
        let mut groups = strings(&reply)?;
        groups.sort();
        Ok(groups)
    }

    /// The first `count` dead letters of `group`.
    pub async fn dead_letters(
        &self,
        group: &str,
        count: usize,
    ) -> Result<Vec<DeadLetter>, JobError> {
        validate_group(group)?;
        let keys = self.group_keys(group);
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(&keys[5])
            .arg("-")
            .arg("+")
            .arg("COUNT")
            .arg(count.max(1));
        let reply = tokio::time::timeout(self.inner.options.timeout, self.inner.conn.query(&cmd))
            .await
            .map_err(|_| JobError::Redis(String::from("no answer within the timeout")))?
            .map_err(redis_error)?;
        let Value::Array(entries) = &reply else {
            return Err(unexpected("XRANGE", &reply));
        };
        let mut out = Vec::new();
        for e in entries.iter().take(count) {
            let Value::Array(parts) = e else { continue };
            let Some(fields) = parts.get(1) else { continue };
            let f = strings(fields)?;
            let get = |name: &str| {
                f.chunks(2)
                    .find(|c| c[0] == name)
                    .and_then(|c| c.get(1).cloned())
                    .unwrap_or_default()
            };
            out.push(DeadLetter {
                id: get("job"),
                error: get("error"),
                attempts: get("attempts").parse().unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Puts up to `most` (0: all) dead letters of `group` back to wait, their attempts counted
    /// afresh. Returns how many.
    pub async fn retry_dead(&self, group: &str, most: u64) -> Result<u64, JobError> {
        validate_group(group)?;
        let reply = self
            .call_group(
                &self.inner.scripts.retry_dead,
                group,
                &[most.to_string().as_bytes()],
            )
            .await?;
        let (moved, version) = match &reply {
            Value::Array(v) => match v[..] {
                [Value::Int(m), Value::Int(v)] => (m, v),
                _ => return Err(unexpected("retry_dead", &reply)),
            },
            _ => return Err(unexpected("retry_dead", &reply)),
        };
        if moved > 0 {
            self.register(group, Some(&version.to_string()), "0")
                .await?;
        }
        Ok(moved as u64)
    }

    /// Deletes `what` of `group`; [`Purge::All`] also takes the group off the queue's lists.
    /// Returns how many jobs were deleted.
    pub async fn purge(&self, group: &str, what: Purge) -> Result<u64, JobError> {
        validate_group(group)?;
        let reply = self
            .call_group(&self.inner.scripts.purge, group, &[what.word().as_bytes()])
            .await?;
        let Value::Int(n) = reply else {
            return Err(unexpected("purge", &reply));
        };
        if what == Purge::All {
            self.call_queue(
                &self.inner.scripts.park,
                &[group.as_bytes(), b"forget", b"0", b"0"],
            )
            .await?;
        }
        Ok(n as u64)
    }

    /// Looks at the next `count` groups of the queue's group list (the workers walk it
    /// together) and puts back on the ready list each that holds jobs but is on neither list:
    /// a producer stopped between its enqueue and its registration. Returns how many.
    pub async fn sweep(&self, count: u64) -> Result<u64, JobError> {
        let reply = self
            .call(
                &self.inner.scripts.sweep,
                &self.inner.queue_keys,
                &[count.max(1).to_string().as_bytes()],
            )
            .await?;
        let mut put_back = 0;
        for group in strings(&reply)? {
            let s = self.stats(&group).await?;
            if s.waiting + s.delayed + s.active > 0 {
                self.register(&group, None, "0").await?;
                put_back += 1;
            }
        }
        Ok(put_back)
    }

    /// Every group's figures, read from Redis.
    pub async fn all_stats(&self) -> Result<Vec<(String, GroupStats)>, JobError> {
        let mut all = Vec::new();
        for group in self.groups().await? {
            let s = self.stats(&group).await?;
            all.push((group, s));
        }
        Ok(all)
    }

    /// Sets the `sluice_jobs` gauges and `sluice_jobs_total` counters (see the module's
    /// documentation) to `stats`, as [`JobQueue::all_stats`] read them.
    pub fn record_metrics(&self, stats: &[(String, GroupStats)]) {
        let queue = &self.inner.name;
        for (group, s) in stats {
            let gauge = |state: &'static str, v: u64| {
                metrics::gauge!("sluice_jobs", "queue" => queue.clone(), "group" => group.clone(), "state" => state).set(v as f64);
            };
            gauge("waiting", s.waiting);
            gauge("delayed", s.delayed);
            gauge("active", s.active);
            gauge("dead", s.dead);
            let total = |outcome: &'static str, v: u64| {
                metrics::counter!("sluice_jobs_total", "queue" => queue.clone(), "group" => group.clone(), "outcome" => outcome).absolute(v);
            };
            total("completed", s.completed);
            total("failed", s.failed);
            total("retried", s.retried);
            total("dead", s.dead_lettered);
            total("reclaimed", s.reclaimed);
        }
    }

    /// Reads every group's figures and records them ([`JobQueue::record_metrics`]); returns
    /// them. Call it periodically where the metrics are exported.
    pub async fn report_metrics(&self) -> Result<Vec<(String, GroupStats)>, JobError> {
        let all = self.all_stats().await?;
        self.record_metrics(&all);
        Ok(all)
    }
}

fn unexpected(script: &str, reply: &Value) -> JobError {
    JobError::Redis(format!("unexpected reply to {script}: {reply:?}"))
}

fn parse_u64(text: &str) -> Result<u64, JobError> {
    text.parse()
        .map_err(|_| JobError::Redis(format!("a number was expected, not {text:?}")))
}

/// The bulk strings of an array reply (integers as their decimal text).
fn bytes(reply: &Value) -> Result<Vec<Vec<u8>>, JobError> {
    let Value::Array(items) = reply else {
        return Err(unexpected("a script", reply));
    };
    items
        .iter()
        .map(|v| match v {
            Value::BulkString(b) => Ok(b.clone()),
            Value::SimpleString(s) => Ok(s.clone().into_bytes()),
            Value::Int(n) => Ok(n.to_string().into_bytes()),
            _ => Err(unexpected("a script", reply)),
        })
        .collect()
}

fn strings(reply: &Value) -> Result<Vec<String>, JobError> {
    Ok(bytes(reply)?
        .into_iter()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .collect())
}
