//! What a [`RedisStore`](super::RedisStore) needs to know: where Redis is, how long to wait for
//! it, and what to decide without it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sluice_core::Kind;

use crate::store::redis::lease::LeaseConfig;

/// What a Redis store decides when Redis does not answer within the timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OnError {
    /// Admit everything until Redis answers again (availability first).
    Allow,
    /// Refuse everything with [`Error::Unavailable`](crate::Error::Unavailable) (the limit first).
    Deny,
    /// Decide in this process with the same quota (a [`MemoryStore`](crate::store::MemoryStore)),
    /// so each server enforces the limit on its own share of the traffic. The default.
    #[default]
    Local,
}

impl OnError {
    /// The configuration name: `allow`, `deny` or `local`.
    pub const fn name(self) -> &'static str {
        match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        }
    }
}

impl fmt::Display for OnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for OnError {
    type Err = RedisStoreError;

    fn from_str(s: &str) -> Result<OnError, RedisStoreError> {
        match s {
            "allow" => Ok(OnError::Allow),
            "deny" => Ok(OnError::Deny),
            "local" => Ok(OnError::Local),
            other => Err(RedisStoreError::UnknownPolicy(other.to_string())),
        }
    }
}

/// Where Redis is and how to use it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use sluice::store::{OnError, RedisConfig};
///
/// let single = RedisConfig::new("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(20))
///     .on_error(OnError::Deny)
///     .prefix("api");
/// let cluster = RedisConfig::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
/// assert!(cluster.is_cluster() && !single.is_cluster());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub(crate) urls: Vec<String>,
    pub(crate) cluster: bool,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) retry_interval: Duration,
    pub(crate) on_error: OnError,
    pub(crate) prefix: String,
    pub(crate) max_keys: usize,
    pub(crate) queue_depth: usize,
    pub(crate) max_wait: Duration,
    pub(crate) lease: Option<LeaseConfig>,
}

/// The default time one decision may take before [`OnError`] applies.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);

impl RedisConfig {
    /// One Redis server, `redis://[user:password@]host:port[/db]`.
    pub fn new(url: impl Into<String>) -> RedisConfig {
        RedisConfig {
            urls: vec![url.into()],
            cluster: false,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_millis(500),
            retry_interval: Duration::from_millis(250),
            on_error: OnError::default(),
            prefix: String::from("sluice"),
            max_keys: 100_000,
            queue_depth: 0,
            max_wait: Duration::ZERO,
            lease: None,
        }
    }

    /// A Redis Cluster, reached through any of `urls` (the others are found from it).
    pub fn cluster<I, S>(urls: I) -> RedisConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisConfig {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: true,
            ..RedisConfig::new("")
        }
    }

    /// The most one decision may take, connection included, before [`OnError`] applies
    /// (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> RedisConfig {
        self.timeout = timeout;
        self
    }

    /// The most one attempt to connect may take (default 500 ms).
    pub fn connect_timeout(mut self, timeout: Duration) -> RedisConfig {
        self.connect_timeout = timeout;
        self
    }

    /// How long Redis is left alone after a failure before a request probes it again
    /// (default 250 ms): decisions go back to Redis at most this long after it answers again.
    pub fn retry_interval(mut self, interval: Duration) -> RedisConfig {
        self.retry_interval = interval;
        self
    }

    /// What to decide while Redis does not answer (default [`OnError::Local`]).
    pub fn on_error(mut self, on_error: OnError) -> RedisConfig {
        self.on_error = on_error;
        self
    }

    /// The first part of every Redis key (default `sluice`); one per limit sharing a Redis.
    pub fn prefix(mut self, prefix: impl Into<String>) -> RedisConfig {
        self.prefix = prefix.into();
        self
    }

    /// The most keys held in this process: by the denial cache and by the local fallback
    /// (default 100,000).
    pub fn max_keys(mut self, max_keys: usize) -> RedisConfig {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Up to `depth` waiters per key in this process, each waiting at most `max_wait`, for
    /// [`Store::acquire`](crate::store::Store::acquire). Without it `acquire` does not wait.
    pub fn queue(mut self, depth: usize, max_wait: Duration) -> RedisConfig {
        self.queue_depth = depth;
        self.max_wait = max_wait;
        self
    }

    /// Spends each key in slices leased from Redis rather than one round trip per request
    /// (the bucket algorithms only; see [`LeaseConfig`] and the module documentation).
    pub fn lease(mut self, lease: LeaseConfig) -> RedisConfig {
        self.lease = Some(lease);
        self
    }

    /// How keys are leased, if they are.
    pub fn leasing(&self) -> Option<&LeaseConfig> {
        self.lease.as_ref()
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// What is done while Redis does not answer.
    pub fn policy(&self) -> OnError {
        self.on_error
    }

    /// For messages: the URL, or the cluster's seed URLs.
    pub(crate) fn target(&self) -> String {
        if self.cluster {
            format!("cluster {}", self.urls.join(", "))
        } else {
            self.urls.join(", ")
        }
    }
}

/// A Redis store could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedisStoreError {
    /// No URL was given.
    #[error("redis store: no URL given")]
    NoUrl,
    /// A URL could not be read.
    #[error("redis store: cannot use `{url}`: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The algorithm or quota cannot be run by the Redis scripts.
    #[error("redis store: {algorithm} is not available on Redis: {reason}")]
    Unsupported {
        /// The algorithm configured.
        algorithm: Kind,
        /// Why, and what to use instead.
        reason: String,
    },
    /// An `on_error` value other than `allow`, `deny` or `local`.
    #[error("unknown on_error policy `{0}`: expected allow, deny or local")]
    UnknownPolicy(String),
    /// Redis could not be reached (only from [`RedisStore::connect`](super::RedisStore::connect)).
    #[error("redis store: cannot reach {target}: {reason}")]
    Connect {
        /// The URL or cluster.
        target: String,
        /// What went wrong.
        reason: String,
    },
    /// The store was created outside a tokio runtime.
    #[error("redis store: must be created inside a tokio runtime")]
    NoRuntime,
}
