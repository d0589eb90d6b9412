//! `[jobs]`: the job queues the gateway watches. It connects to them on first use (and again
//! after a failure), reads their groups' figures for `GET /v1/jobs`, and every
//! `jobs.interval` records them on `/metrics` ([`JobQueue::report_metrics`]).
//!
//! It only reads: no job is enqueued, claimed or changed here.

use std::time::Duration;

use serde_json::{json, Value};
use sluice::jobs::{GroupStats, JobError, JobQueue, QueueOptions};
use sluice::store::RedisConfig;
use tokio::sync::OnceCell;

use crate::config::JobsConfig;

/// The most groups `GET /v1/jobs` lists per queue (by name); `groups_total` says how many
/// there are.
pub const MAX_GROUPS_SHOWN: usize = 200;

/// The queues of `[jobs]`.
#[derive(Debug)]
pub struct Jobs {
    config: JobsConfig,
    queues: OnceCell<Vec<JobQueue>>,
}

/// The metrics the queues' figures are recorded in, with their help text.
pub fn describe_metrics() {
    metrics::describe_gauge!(
        "sluice_jobs",
        metrics::Unit::Count,
        "Jobs of a `[jobs]` queue's group now, by `queue`, `group` and `state` (`waiting`, `delayed`, `active`, `dead`), read from Redis every jobs.interval."
    );
    metrics::describe_counter!(
        "sluice_jobs_total",
        metrics::Unit::Count,
        "What a `[jobs]` queue's group has done, by `queue`, `group` and `outcome` (`completed`, `failed`, `retried`, `dead`, `reclaimed`), read from Redis every jobs.interval."
    );
}

impl Jobs {
    /// The queues of `config`, not yet connected.
    pub fn new(config: JobsConfig) -> Jobs {
        Jobs {
            config,
            queues: OnceCell::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &JobsConfig {
        &self.config
    }

    /// The queues, connected on the first call that succeeds.
    async fn queues(&self) -> Result<&[JobQueue], JobError> {
        let queues = self
            .queues
            .get_or_try_init(|| async {
                let c = &self.config;
                let redis = if c.cluster {
                    RedisConfig::cluster(c.urls.clone())
                } else {
                    RedisConfig::new(c.urls.first().cloned().unwrap_or_default())
                };
                let mut queues = Vec::with_capacity(c.queues.len());
                for name in &c.queues {
                    let options = QueueOptions::new().prefix(c.prefix.clone());
                    queues.push(JobQueue::connect(&redis, name, options).await?);
                }
                Ok::<_, JobError>(queues)
            })
            .await?;
        Ok(queues)
    }

    /// Reads every queue's groups and records them on `/metrics`; the first error, if any
    /// (the queues that answered are recorded).
    pub async fn report(&self) -> Result<(), JobError> {
        let mut first = None;
        for queue in self.queues().await? {
            if let Err(e) = queue.report_metrics().await {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Records the figures every `jobs.interval`, for as long as the process runs. A failure
    /// is logged when it starts and when it ends, not at every tick.
    pub async fn report_every(&self) {
        let mut tick = tokio::time::interval(self.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.report().await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!(target: "sluice::jobs", "job queues read again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(target: "sluice::jobs", error = %e, "cannot read the job queues of [jobs]; retrying every jobs.interval");
                }
                Err(_) => {}
            }
        }
    }

    /// `GET /v1/jobs`: each queue's groups and their figures, read from Redis now.
    pub async fn snapshot(&self) -> Value {
        let queues = match self.queues().await {
            Ok(queues) => queues,
            Err(e) => {
                let error = e.to_string();
                let list: Vec<Value> = self
                    .config
                    .queues
                    .iter()
                    .map(|name| unread(name, &error))
                    .collect();
                return self.document(list);
            }
        };
        let mut list = Vec::with_capacity(queues.len());
        for queue in queues {
            list.push(match read(queue).await {
                Ok(v) => v,
                Err(e) => unread(queue.name(), &e.to_string()),
            });
        }
        self.document(list)
    }

    fn document(&self, queues: Vec<Value>) -> Value {
        json!({
            "v": 1,
            "prefix": self.config.prefix,
            "redis": if self.config.from_store { "store.url" } else { "jobs.redis" },
            "interval_ms": duration_ms(self.config.interval),
            "queues": queues,
        })
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A queue Redis did not answer for.
fn unread(name: &str, error: &str) -> Value {
    json!({ "name": name, "error": error, "groups_total": null, "groups": [], "total": null })
}

/// One queue: its first [`MAX_GROUPS_SHOWN`] groups and the sum over them.
async fn read(queue: &JobQueue) -> Result<Value, JobError> {
    let groups = queue.groups().await?;
    let mut total = GroupStats::default();
    let mut shown = Vec::with_capacity(groups.len().min(MAX_GROUPS_SHOWN));
    for group in groups.iter().take(MAX_GROUPS_SHOWN) {
        let s = queue.stats(group).await?;
        total.waiting += s.waiting;
        total.delayed += s.delayed;
        total.active += s.active;
        total.dead += s.dead;
        total.completed += s.completed;
        total.failed += s.failed;
        total.retried += s.retried;
        total.dead_lettered += s.dead_lettered;
        total.reclaimed += s.reclaimed;
        let mut row = figures(&s);
        row["group"] = json!(group);
        row["paused_ms"] = json!(duration_ms(s.paused));
        shown.push(row);
    }
    Ok(json!({
        "name": queue.name(),
        "error": null,
        "groups_total": groups.len(),
        "groups": shown,
        "total": figures(&total),
    }))
}

fn figures(s: &GroupStats) -> Value {
    json!({
        "waiting": s.waiting,
        "delayed": s.delayed,
        "active": s.active,
        "dead": s.dead,
        "completed": s.completed,
        "failed": s.failed,
        "retried": s.retried,
        "dead_lettered": s.dead_lettered,
        "reclaimed": s.reclaimed,
    })
}
