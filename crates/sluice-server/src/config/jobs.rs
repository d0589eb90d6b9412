//! `[jobs]`: the job queues (`sluice::jobs`, `docs/jobs.md`) the gateway watches: it lists
//! each queue's groups on the dashboard (`GET /v1/jobs`) and exports their figures on
//! `/metrics`. It only reads them; it runs no job.
//!
//! It only reads the table: connecting and reading the queues are `runtime::jobs`'s.

use std::time::Duration;

use toml::de::DeTable;

use super::store::{redis_urls, BackendKind, StoreConfig};
use super::values::duration;
use super::walk::{Errors, Fields};

/// The default `jobs.prefix`, the library's.
pub const DEFAULT_JOBS_PREFIX: &str = "sluice:jobs";
/// The default `jobs.interval`.
pub const DEFAULT_JOBS_INTERVAL: Duration = Duration::from_secs(5);
/// The bounds of `jobs.interval`: below, Redis would be read for every group too often;
/// above, the figures would be too old to watch.
const INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(3600));
/// The most queues one gateway watches.
pub const MAX_JOB_QUEUES: usize = 64;

/// `[jobs]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobsConfig {
    /// The Redis URLs of the queues: `jobs.redis`, or the Redis store's `store.url`.
    pub urls: Vec<String>,
    /// Whether the URLs are nodes of a Redis Cluster (given as a list).
    pub cluster: bool,
    /// Whether the URLs are the store's (`jobs.redis` was not given).
    pub from_store: bool,
    /// The queues' names, in file order.
    pub queues: Vec<String>,
    /// The prefix of the queues' keys.
    pub prefix: String,
    /// How often their figures are read into `/metrics`.
    pub interval: Duration,
}

/// Braces are Redis Cluster hash tags: a queue name or prefix may not hold one (the library
/// refuses it too).
fn braces_or_empty(text: &str) -> Option<&'static str> {
    if text.is_empty() {
        Some("must not be empty")
    } else if text.contains(['{', '}']) {
        Some("must hold no brace (braces are Redis Cluster hash tags)")
    } else {
        None
    }
}

/// Reads `[jobs]`, found at `table_at`; `store` is the `[store]` already read, whose Redis
/// the queues share when `jobs.redis` is not given.
pub(super) fn parse(
    t: &DeTable<'_>,
    table_at: usize,
    store: &StoreConfig,
    errors: &mut Errors<'_>,
) -> Option<JobsConfig> {
    let mut f = Fields::new(t, "jobs");
    let before = errors.list.len();
    let given = f
        .get("redis")
        .map(|value| redis_urls(value, "jobs.redis", errors));
    let queues_at = f.get("queues").map(|v| v.span().start);
    let listed = f.strings("queues", errors);
    let mut queues: Vec<String> = Vec::new();
    for (i, (name, at)) in listed.iter().flatten().enumerate() {
        if let Some(why) = braces_or_empty(name) {
            errors.at(*at, &format!("jobs.queues[{i}]"), format!("`{name}` {why}"));
        } else if queues.iter().any(|q| q == name) {
            errors.at(
                *at,
                &format!("jobs.queues[{i}]"),
                format!("`{name}` is listed twice"),
            );
        } else {
            queues.push((*name).to_owned());
        }
    }
    match (&listed, queues_at) {
        (None, None) => errors.at(
            table_at,
            "jobs.queues",
            "[jobs] needs queues, the names of the queues to show: queues = [\"mail\"]",
        ),
        (Some(list), Some(at)) if list.is_empty() => errors.at(
            at,
            "jobs.queues",
            "is empty: name at least one queue, or leave [jobs] out",
        ),
        (Some(list), Some(at)) if list.len() > MAX_JOB_QUEUES => errors.at(
            at,
            "jobs.queues",
            format!(
                "{} queues: at most {MAX_JOB_QUEUES} may be watched",
                list.len()
            ),
        ),
        _ => {}
    }
    let prefix = match f.str("prefix", errors) {
        Some((p, at)) => {
            if let Some(why) = braces_or_empty(p) {
                errors.at(at, "jobs.prefix", format!("`{p}` {why}"));
            }
            p.to_owned()
        }
        None => DEFAULT_JOBS_PREFIX.to_owned(),
    };
    let interval_at = f.get("interval").map(|v| v.span().start);
    let interval = duration(&mut f, "interval", DEFAULT_JOBS_INTERVAL, errors);
    if let Some(at) = interval_at {
        if !(INTERVAL_RANGE.0..=INTERVAL_RANGE.1).contains(&interval) {
            errors.at(
                at,
                "jobs.interval",
                format!(
                    "{interval:?} is out of range: expected 100ms to 1h (how often each queue's figures are read from Redis)"
                ),
            );
        }
    }
    f.finish(errors);
    let (urls, cluster, from_store) = match given {
        Some((urls, cluster)) => (urls, cluster, false),
        None if store.backend == BackendKind::Redis => (store.urls.clone(), store.cluster, true),
        None => {
            errors.at(
                table_at,
                "jobs.redis",
                "no Redis to read the queues from: give redis = \"redis://HOST:PORT\", or use store.backend = \"redis\" (whose url the queues then share)",
            );
            (Vec::new(), false, false)
        }
    };
    (errors.list.len() == before).then_some(JobsConfig {
        urls,
        cluster,
        from_store,
        queues,
        prefix,
        interval,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::parse;

    const ROUTE: &str = "[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n";

    #[test]
    fn a_jobs_table_names_its_redis_or_shares_the_stores() {
        let c = parse(
            &format!("{ROUTE}[jobs]\nredis = \"redis://127.0.0.1:6400\"\nqueues = [\"mail\", \"embed\"]\nprefix = \"acme:jobs\"\ninterval = \"2s\"\n"),
            "t.toml",
        )
        .unwrap();
        let jobs = c.jobs.unwrap();
        assert_eq!(jobs.urls, ["redis://127.0.0.1:6400"]);
        assert!(!jobs.cluster && !jobs.from_store);
        assert_eq!(jobs.queues, ["mail", "embed"]);
        assert_eq!(jobs.prefix, "acme:jobs");
        assert_eq!(jobs.interval, Duration::from_secs(2));

        let c = parse(
            &format!("[store]\nbackend = \"redis\"\nurl = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\n{ROUTE}[jobs]\nqueues = [\"mail\"]\n"),
            "t.toml",
        )
        .unwrap();
        let jobs = c.jobs.unwrap();
        assert_eq!(jobs.urls.len(), 2);
        assert!(jobs.cluster && jobs.from_store);
        assert_eq!(jobs.prefix, "sluice:jobs");
        assert_eq!(jobs.interval, Duration::from_secs(5));
        assert!(parse(ROUTE, "t.toml").unwrap().jobs.is_none());
    }

    #[test]
    fn bad_jobs_tables_name_line_field_and_value() {
        let text = format!(
            "{ROUTE}[jobs]\nredis = \"http://127.0.0.1:6379\"\nqueues = [\"mail\", \"a{{b}}\", \"mail\", \"\", 7]\nprefix = \"x}}\"\ninterval = \"10ms\"\ncolour = 1\n"
        );
        let errors = parse(&text, "j.toml").unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let expect = [
            ("j.toml:5:", "jobs.redis", "http://127.0.0.1:6379"),
            ("j.toml:6:", "jobs.queues[1]", "`a{b}`"),
            ("j.toml:6:", "jobs.queues[2]", "`mail` is listed twice"),
            ("j.toml:6:", "jobs.queues[3]", "must not be empty"),
            (
                "j.toml:6:",
                "jobs.queues[4]",
                "expected a string, found integer",
            ),
            ("j.toml:7:", "jobs.prefix", "`x}`"),
            ("j.toml:8:", "jobs.interval", "out of range"),
            ("j.toml:9:", "jobs.colour", "unknown key"),
        ];
        assert_eq!(shown.len(), expect.len(), "{}", shown.join("\n"));
        for (line, field, words) in expect {
            assert!(
                shown.iter().any(|s| s.starts_with(line)
                    && s.contains(&format!(" {field}: "))
                    && s.contains(words)),
                "missing {line} {field} {words} in\n{}",
                shown.join("\n")
            );
        }

        for (text, line, field, words) in [
            ("[jobs]\nqueues = [\"mail\"]\n", 4, "jobs.redis", "no Redis"),
            (
                "[jobs]\nredis = \"redis://h:1\"\n",
                4,
                "jobs.queues",
                "needs queues",
            ),
            (
                "[jobs]\nredis = \"redis://h:1\"\nqueues = []\n",
                6,
                "jobs.queues",
                "is empty",
            ),
        ] {
            let errors = parse(&format!("{ROUTE}{text}"), "k.toml").unwrap_err();
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert_eq!(errors[0].field, field);
            assert_eq!(errors[0].line, line, "{errors:?}");
            assert!(errors[0].message.contains(words), "{errors:?}");
        }
    }
}
