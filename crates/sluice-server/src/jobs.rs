//! `sluice jobs`: inspect a job queue in Redis, put its dead letters back, purge it.

use std::process::ExitCode;

use sluice::jobs::{GroupStats, JobError, JobQueue, Purge, QueueOptions};
use sluice::store::RedisConfig;

const AFTER_HELP: &str = "\
The queue is the one Rust and Node workers share (docs/jobs.md): QUEUE under PREFIX in the
Redis at --redis (repeat --redis with --cluster for the seeds of a Redis Cluster).

Exit status: 0 done, 1 Redis failed, 2 invalid arguments.";

/// The arguments of `sluice jobs`.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct Args {
    /// The Redis URL (repeatable with --cluster), e.g. redis://127.0.0.1:6379.
    #[arg(long, value_name = "URL", required = true)]
    pub redis: Vec<String>,
    /// The URLs are seeds of a Redis Cluster.
    #[arg(long)]
    pub cluster: bool,
    /// The prefix of the queue's keys.
    #[arg(long, value_name = "PREFIX", default_value = "sluice:jobs")]
    pub prefix: String,
    /// The queue's name.
    #[arg(long, short = 'q', value_name = "QUEUE", required = true)]
    pub queue: String,
    /// What to do.
    #[command(subcommand)]
    pub action: Action,
}

/// What `sluice jobs` does.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Print each group's figures (or one group's, with its dead letters).
    Inspect {
        /// Only this group, with its first dead letters.
        #[arg(long, short = 'g', value_name = "GROUP")]
        group: Option<String>,
        /// How many dead letters to print with --group.
        #[arg(long, value_name = "N", default_value_t = 10)]
        dead: usize,
    },
    /// Put a group's dead letters back to wait, their attempts counted afresh.
    Retry {
        /// The group.
        #[arg(long, short = 'g', value_name = "GROUP")]
        group: String,
        /// At most this many (0: all).
        #[arg(long, value_name = "N", default_value_t = 0)]
        count: u64,
    },
    /// Delete a group's jobs: waiting (and delayed), dead, completed, or all (the group
    /// leaves the queue; its bucket stays).
    Purge {
        /// The group.
        #[arg(long, short = 'g', value_name = "GROUP")]
        group: String,
        /// What to delete.
        #[arg(long, value_name = "WHAT", value_parser = ["waiting", "dead", "completed", "all"])]
        what: String,
    },
}

/// Runs `sluice jobs`.
pub fn run(args: Args) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(act(args)) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(JobError::Invalid(e)) => {
            eprintln!("sluice jobs: {e}");
            ExitCode::from(2)
        }
        Err(e @ JobError::Config(_)) => {
            eprintln!("sluice {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("sluice {e}");
            ExitCode::FAILURE
        }
    }
}

async fn act(args: Args) -> Result<String, JobError> {
    let redis = if args.cluster {
        RedisConfig::cluster(args.redis.clone())
    } else if args.redis.len() == 1 {
        RedisConfig::new(args.redis[0].clone())
    } else {
        return Err(JobError::Invalid(String::from(
            "several --redis URLs are the seeds of a Cluster: add --cluster",
        )));
    };
    let options = QueueOptions::new().prefix(args.prefix.clone());
    let queue = JobQueue::connect(&redis, &args.queue, options).await?;
    match args.action {
        Action::Inspect { group: None, .. } => {
            let groups = queue.groups().await?;
            let mut rows = Vec::with_capacity(groups.len());
            for g in groups {
                let s = queue.stats(&g).await?;
                rows.push((g, s));
            }
            Ok(table(&args.queue, &rows))
        }
        Action::Inspect {
            group: Some(group),
            dead,
        } => {
            let s = queue.stats(&group).await?;
            let mut out = table(&args.queue, &[(group.clone(), s)]);
            if s.paused > std::time::Duration::ZERO {
                out.push_str(&format!("paused for {:?}\n", s.paused));
            }
            let letters = queue.dead_letters(&group, dead).await?;
            if !letters.is_empty() {
                out.push_str("dead letters (job, attempts, error):\n");
                for d in letters {
                    out.push_str(&format!("  {}  {}  {}\n", d.id, d.attempts, d.error));
                }
            }
            Ok(out)
        }
        Action::Retry { group, count } => {
            let moved = queue.retry_dead(&group, count).await?;
            Ok(format!(
                "{moved} dead letters of {group} back to wait in {}\n",
                args.queue
            ))
        }
        Action::Purge { group, what } => {
            let purge = match what.as_str() {
                "waiting" => Purge::Waiting,
                "dead" => Purge::Dead,
                "completed" => Purge::Completed,
                _ => Purge::All,
            };
            let n = queue.purge(&group, purge).await?;
            Ok(format!(
                "{n} jobs of {group} purged ({what}) from {}\n",
                args.queue
            ))
        }
    }
}

/// The figures of each group, one row each.
fn table(queue: &str, rows: &[(String, GroupStats)]) -> String {
    let width = rows.iter().map(|(g, _)| g.len()).max().unwrap_or(5).max(5);
    let mut out = format!(
        "queue {queue}: {} groups\n{:<width$}  {:>8} {:>8} {:>7} {:>6} {:>10} {:>7} {:>8} {:>9}\n",
        rows.len(),
        "group",
        "waiting",
        "delayed",
        "active",
        "dead",
        "completed",
        "failed",
        "retried",
        "reclaimed"
    );
    for (g, s) in rows {
        out.push_str(&format!(
            "{g:<width$}  {:>8} {:>8} {:>7} {:>6} {:>10} {:>7} {:>8} {:>9}\n",
            s.waiting, s.delayed, s.active, s.dead, s.completed, s.failed, s.retried, s.reclaimed
        ));
    }
    out
}
