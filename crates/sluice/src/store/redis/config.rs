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
/// let sentinel = RedisConfig::new("redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster");
/// assert!(sentinel.is_sentinel());
/// assert_eq!(sentinel, RedisConfig::sentinel(["10.0.0.1:26379", "10.0.0.2:26379"], "mymaster"));
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
    /// One Redis server, `redis://[user:password@]host:port[/db]`; or the master of a Redis
    /// Sentinel deployment, found through its Sentinels:
    ///
    /// `redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER_NAME[/DB][?wait=replicas|none&sentinel_username=U&sentinel_password=P]`
    ///
    /// The hosts are the Sentinels (port 26379 when not given); the user and password are
    /// the master's (and its replicas'); `sentinel_username` and `sentinel_password` those of
    /// the Sentinels, if they ask for one. The store asks the Sentinels which server is the
    /// master, and asks them again whenever the master stops answering or a decision fails,
    /// so that after a failover decisions go to the new master.
    ///
    /// `wait=replicas` (the default): an admission counts only once every replica that was
    /// connected to the master when the store found it has it (`WAIT`, one for all the
    /// admissions answered meanwhile on the connection), so that a failover, which promotes
    /// one of them, loses no admission, and the old master, whose replica was promoted, admits
    /// nothing more; one not acknowledged within the timeout follows [`OnError`]. `wait=none`
    /// does not wait: a failover may then lose the admissions not yet replicated, and those
    /// the old master made while it still answered after the promotion, giving their tokens
    /// back (at most a key's capacity). See the [module documentation](crate::store::redis).
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

    /// The master named `master_name` of a Redis Sentinel deployment, found through any of
    /// `sentinels` (`HOST[:PORT]`, port 26379 by default): the URL
    /// `redis+sentinel://HOST:PORT,.../MASTER_NAME` of [`RedisConfig::new`], which also takes
    /// passwords, a database and `wait=none`.
    pub fn sentinel<I, S>(sentinels: I, master_name: &str) -> RedisConfig
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let hosts: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_string())
            .collect();
        RedisConfig::new(format!(
            "{SENTINEL_SCHEME}{}/{}",
            hosts.join(","),
            encode(master_name)
        ))
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

    /// Whether this is the master of a Redis Sentinel deployment (a `redis+sentinel://` URL).
    pub fn is_sentinel(&self) -> bool {
        !self.cluster && self.urls.len() == 1 && is_sentinel_url(&self.urls[0])
    }

    /// Checks the URLs without connecting: what [`RedisStore::new`](super::RedisStore::new)
    /// would refuse them for.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::NoUrl`], or [`RedisStoreError::BadUrl`] with what is wrong.
    pub fn check(&self) -> Result<(), RedisStoreError> {
        super::link::validate(self)
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
        if let Some(Ok(sentinel)) = self
            .urls
            .first()
            .filter(|_| !self.cluster)
            .map(|u| SentinelUrl::parse(u))
        {
            return sentinel.to_string();
        }
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

/// The scheme of a Redis Sentinel URL.
pub(crate) const SENTINEL_SCHEME: &str = "redis+sentinel://";

/// The form of a Sentinel URL, for messages.
pub(crate) const SENTINEL_FORM: &str =
    "redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER_NAME[/DB][?wait=none]";

/// The port of a Sentinel whose URL names none.
const SENTINEL_PORT: u16 = 26379;

/// Whether `url` is a Sentinel URL (its scheme; the rest may still be wrong).
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    url.get(..SENTINEL_SCHEME.len())
        .is_some_and(|s| s.eq_ignore_ascii_case(SENTINEL_SCHEME))
}

/// A `redis+sentinel://` URL, read.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// The Sentinels: host, port.
    pub(crate) sentinels: Vec<(String, u16)>,
    /// The master's name, as the Sentinels monitor it.
    pub(crate) master: String,
    /// The database of the master.
    pub(crate) db: i64,
    /// The master's (and replicas') user and password.
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// The Sentinels' user and password.
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
    /// Whether an admission counts only once the replicas have it (`WAIT`).
    pub(crate) wait: bool,
}

/// Never shows the passwords.
impl fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let wait = if self.wait { "replicas" } else { "none" };
        write!(f, "{self} (wait {wait})")
    }
}

/// `sentinel master <name> via <host:port>, ...`, for logs (no password).
impl fmt::Display for SentinelUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sentinel master `{}` via ", self.master)?;
        for (i, (host, port)) in self.sentinels.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            if host.contains(':') {
                write!(f, "{sep}[{host}]:{port}")?;
            } else {
                write!(f, "{sep}{host}:{port}")?;
            }
        }
        Ok(())
    }
}

impl SentinelUrl {
    /// Reads `url`, a `redis+sentinel://` URL; the error says what is wrong with it.
    pub(crate) fn parse(url: &str) -> Result<SentinelUrl, String> {
        if !is_sentinel_url(url) {
            return Err(format!("expected {SENTINEL_FORM}"));
        }
        let rest = &url[SENTINEL_SCHEME.len()..];
        if rest.contains('#') {
            return Err(String::from(
                "a fragment (`#...`) is not part of a Sentinel URL",
            ));
        }
        let (rest, query) = match rest.split_once('?') {
            Some((rest, query)) => (rest, Some(query)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => {
                let Some((user, password)) = userinfo.split_once(':') else {
                    return Err(String::from(
                        "a user needs a password: USER:PASSWORD@ (or :PASSWORD@ for the default user)",
                    ));
                };
                let user = decode(user)?;
                let password = decode(password)?;
                if password.is_empty() {
                    return Err(String::from("the password after `:` is empty"));
                }
                ((!user.is_empty()).then_some(user), Some(password))
            }
        };
        if hosts.is_empty() {
            return Err(format!("no Sentinel given: expected {SENTINEL_FORM}"));
        }
        let sentinels = hosts
            .split(',')
            .map(host_port)
            .collect::<Result<Vec<_>, String>>()?;
        let mut segments = path.split('/');
        let master = decode(segments.next().unwrap_or(""))?;
        if master.is_empty() {
            return Err(format!(
                "no master name after the Sentinels: expected {SENTINEL_FORM}"
            ));
        }
        let db = match segments.next() {
            None => 0,
            Some(db) => db.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| {
                format!("the database `{db}` after the master name is not a number 0, 1, 2...")
            })?,
        };
        if let Some(extra) = segments.next() {
            return Err(format!(
                "unexpected `/{extra}` after the database: expected {SENTINEL_FORM}"
            ));
        }
        let mut parsed = SentinelUrl {
            sentinels,
            master,
            db,
            username,
            password,
            sentinel_username: None,
            sentinel_password: None,
            wait: true,
        };
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = decode(value)?;
            match key {
                "wait" => {
                    parsed.wait = match value.as_str() {
                        "replicas" => true,
                        "none" => false,
                        _ => {
                            return Err(format!(
                                "wait=`{value}`: expected replicas (an admission counts once the replicas have it) or none"
                            ))
                        }
                    }
                }
                "sentinel_username" => parsed.sentinel_username = Some(value),
                "sentinel_password" => parsed.sentinel_password = Some(value),
                other => {
                    return Err(format!(
                        "unknown parameter `{other}`: expected wait, sentinel_username or sentinel_password"
                    ))
                }
            }
        }
        if parsed.sentinel_username.is_some() && parsed.sentinel_password.is_none() {
            return Err(String::from("sentinel_username needs sentinel_password"));
        }
        Ok(parsed)
    }
}

/// `HOST[:PORT]` or `[IPV6][:PORT]`, the port 26379 when not given.
fn host_port(text: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(format!("Sentinel `{text}`: `[` without `]`"));
        };
        match after {
            "" => (host, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Err(format!("Sentinel `{text}`: expected `:PORT` after `]`")),
            },
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err(format!(
                    "Sentinel `{text}`: write an IPv6 address in brackets, [ADDRESS]:PORT"
                ))
            }
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    if host.is_empty() {
        return Err(if text.is_empty() {
            String::from("an empty Sentinel in the list (two commas, or one at an end)")
        } else {
            format!("Sentinel `{text}` has no host")
        });
    }
    let port = match port {
        None => SENTINEL_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("Sentinel `{text}`: `{p}` is not a port (1 to 65535)"))?,
    };
    Ok((host.to_string(), port))
}

/// Percent-decoding (`%40` is `@`), for the parts of a URL that may hold any character.
fn decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("`{text}`: `%` must be followed by two hex digits"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{text}` does not decode to UTF-8"))
}

/// Percent-encoding of what [`decode`] reads back (and `/`, `?`, `#`, `@`, `,`, `%`).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_master_and_the_database() {
        let s = SentinelUrl::parse(
            "redis+sentinel://:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:26381/my%20master/2?wait=none&sentinel_password=pw",
        )
        .unwrap();
        assert_eq!(
            s.sentinels,
            [
                ("10.0.0.1".to_string(), 26380),
                ("sentinel-b".to_string(), 26379),
                ("::1".to_string(), 26381)
            ]
        );
        assert_eq!(s.master, "my master");
        assert_eq!(s.db, 2);
        assert_eq!((s.username, s.password.as_deref()), (None, Some("s@cret")));
        assert_eq!(s.sentinel_password.as_deref(), Some("pw"));
        assert!(!s.wait);
        let plain = SentinelUrl::parse("redis+sentinel://h:1/m").unwrap();
        assert_eq!(
            (plain.db, plain.wait, plain.password.as_deref()),
            (0, true, None)
        );
        let user = SentinelUrl::parse("redis+sentinel://app:pw@h/m").unwrap();
        assert_eq!(user.username.as_deref(), Some("app"));
        assert_eq!(
            plain.to_string(),
            "sentinel master `m` via h:1",
            "logs name the master and the Sentinels"
        );
        assert!(!format!(
            "{:?}",
            SentinelUrl::parse("redis+sentinel://:pw@h/m").unwrap()
        )
        .contains("pw"));
    }

    #[test]
    fn a_malformed_sentinel_url_says_what_is_wrong() {
        for (url, says) in [
            ("redis+sentinel://", "no Sentinel"),
            ("redis+sentinel://h:26379", "no master name"),
            ("redis+sentinel://h:26379/", "no master name"),
            ("redis+sentinel://h:26379/m/x", "database `x`"),
            ("redis+sentinel://h:26379/m/1/2", "unexpected `/2`"),
            ("redis+sentinel://h:0/m", "not a port"),
            ("redis+sentinel://h:99999/m", "not a port"),
            ("redis+sentinel://h:1,,g:2/m", "empty Sentinel"),
            ("redis+sentinel://::1:5/m", "brackets"),
            ("redis+sentinel://[::1/m", "without `]`"),
            ("redis+sentinel://user@h/m", "needs a password"),
            ("redis+sentinel://h/m?wait=1", "wait=`1`"),
            (
                "redis+sentinel://h/m?replicas=1",
                "unknown parameter `replicas`",
            ),
            ("redis+sentinel://h/m%zz", "two hex digits"),
            ("redis+sentinel://h/m#x", "fragment"),
        ] {
            let err = SentinelUrl::parse(url).expect_err(url);
            assert!(err.contains(says), "{url}: {err}");
        }
    }

    #[test]
    fn the_sentinel_constructor_writes_the_url_new_reads() {
        let config = RedisConfig::sentinel(["a:1", "b"], "my/master");
        assert!(config.is_sentinel() && !config.is_cluster());
        let s = SentinelUrl::parse(&config.urls()[0]).unwrap();
        assert_eq!(s.master, "my/master");
        assert_eq!(
            s.sentinels,
            [("a".to_string(), 1), ("b".to_string(), 26379)]
        );
        assert!(config.check().is_ok());
        assert!(!RedisConfig::cluster(["redis+sentinel://a/m"]).is_sentinel());
        assert!(RedisConfig::cluster(["redis+sentinel://a/m"])
            .check()
            .is_err());
    }
}
