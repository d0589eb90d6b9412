//! `[store]`: where the limiters' state lives (memory, a file, Redis), how long Redis may
//! take and what a Redis store does when it does not answer, the key salt, and how much a
//! crash of a file store may lose.
//!
//! It only reads: opening the store and keeping its state are `serve::build`'s and the
//! `sluice` crate's.

use std::path::PathBuf;
use std::time::Duration;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::secret::read_secret;
use super::units;
use super::values::duration;
use super::walk::{Errors, Fields};

/// `store.backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// In memory.
    Memory,
    /// A local file.
    File,
    /// Redis.
    Redis,
}

/// `store.on_error`: what a Redis store does when Redis does not answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Admit.
    Allow,
    /// Deny (503).
    Deny,
    /// Decide with a local in-memory limit.
    Local,
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreConfig {
    /// `memory | file | redis`.
    pub backend: BackendKind,
    /// The state file (`file`).
    pub path: Option<PathBuf>,
    /// Redis URLs (`redis`).
    pub urls: Vec<String>,
    /// Whether `url` was given as a list: a Redis Cluster, reached through any of them.
    pub cluster: bool,
    /// What to do when Redis fails.
    pub on_error: OnError,
    /// How long to wait for Redis.
    pub timeout: Duration,
    /// Prefix of every Redis key.
    pub prefix: String,
    /// `key_salt`: the salt of the keyed hash under which keys from headers, cookies and query
    /// parameters are stored in a file or Redis store.
    pub key_salt: Option<KeySalt>,
    /// `file`: D, the most consumption a crash may lose (the file is written every D/2).
    pub max_loss: Duration,
}

/// `store.key_salt`, read from where it names: `env:NAME` or `file:/path`.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySalt {
    /// What the config says (`env:NAME`, `file:/path`), never the secret.
    pub source: String,
    /// The salt.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for KeySalt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySalt({})", self.source)
    }
}

impl KeySalt {
    /// Reads the salt named by `source`; a file's trailing newline is not part of it.
    ///
    /// # Errors
    ///
    /// What is wrong, for `store.key_salt`: another form, an unset variable, an unreadable
    /// file, an empty salt.
    pub fn read(source: &str) -> Result<KeySalt, String> {
        let bytes = read_secret(source, "the salt")?;
        Ok(KeySalt {
            source: source.to_owned(),
            bytes,
        })
    }
}

/// The default `store.max_loss`.
pub const DEFAULT_MAX_LOSS: Duration = Duration::from_millis(100);
/// The bounds of `store.max_loss`: below, the disk would be written too often; above, a
/// crash would leave every key spent for too long.
const MAX_LOSS_RANGE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(60));

/// Reads `[store]` (an empty table at offset 0 when the file has none).
pub(super) fn parse(t: &DeTable<'_>, table_at: usize, errors: &mut Errors<'_>) -> StoreConfig {
    let mut f = Fields::new(t, "store");
    let backend = match f.str("backend", errors) {
        None => BackendKind::Memory,
        Some(("memory", _)) => BackendKind::Memory,
        Some(("file", _)) => BackendKind::File,
        Some(("redis", _)) => BackendKind::Redis,
        Some((other, at)) => {
            errors.at(
                at,
                "store.backend",
                format!("unknown backend `{other}`: expected memory, file or redis"),
            );
            BackendKind::Memory
        }
    };
    let path = f.str("path", errors).map(|(p, at)| {
        if p.is_empty() {
            errors.at(at, "store.path", "must not be empty");
        }
        PathBuf::from(p)
    });
    let (urls, cluster) = match f.get("url") {
        Some(value) => redis_urls(value, "store.url", errors),
        None => (Vec::new(), false),
    };
    let on_error = match f.str("on_error", errors) {
        None | Some(("local", _)) => OnError::Local,
        Some(("allow", _)) => OnError::Allow,
        Some(("deny", _)) => OnError::Deny,
        Some((other, at)) => {
            errors.at(
                at,
                "store.on_error",
                format!("unknown on_error `{other}`: expected allow, deny or local"),
            );
            OnError::Local
        }
    };
    let timeout = duration(&mut f, "timeout", Duration::from_millis(50), errors);
    let max_loss = match f.str("max_loss", errors) {
        Some((text, at)) => match units::parse_duration(text) {
            Ok(d) if (MAX_LOSS_RANGE.0..=MAX_LOSS_RANGE.1).contains(&d) => d,
            Ok(_) => {
                errors.at(
                    at,
                    "store.max_loss",
                    format!("`{text}` is out of range: expected 10ms to 60s (the file is written every max_loss / 2)"),
                );
                DEFAULT_MAX_LOSS
            }
            Err(message) => {
                errors.at(at, "store.max_loss", message);
                DEFAULT_MAX_LOSS
            }
        },
        None => DEFAULT_MAX_LOSS,
    };
    let prefix = f
        .str("prefix", errors)
        .map_or("sluice", |(p, _)| p)
        .to_owned();
    let key_salt = f
        .str("key_salt", errors)
        .and_then(|(source, at)| match KeySalt::read(source) {
            Ok(salt) => Some(salt),
            Err(e) => {
                errors.at(at, "store.key_salt", e);
                None
            }
        });
    f.finish(errors);
    match backend {
        BackendKind::File if path.is_none() => {
            errors.at(table_at, "store.path", "backend = \"file\" needs a path")
        }
        BackendKind::Redis if urls.is_empty() => {
            errors.at(table_at, "store.url", "backend = \"redis\" needs a url")
        }
        _ => {}
    }
    StoreConfig {
        backend,
        path,
        urls,
        cluster,
        on_error,
        timeout,
        prefix,
        key_salt,
        max_loss,
    }
}

/// A Redis URL, or a list of URLs (a Redis Cluster, reached through any of them), for `field`
/// (`store.url`, `jobs.redis`): the URLs that can be read, and whether it is a list.
pub(super) fn redis_urls(
    value: &Spanned<DeValue<'_>>,
    field: &str,
    errors: &mut Errors<'_>,
) -> (Vec<String>, bool) {
    let mut urls = Vec::new();
    let cluster = matches!(value.get_ref(), DeValue::Array(_));
    let list: Vec<(&str, usize)> = match value.get_ref() {
        DeValue::String(s) => vec![(s.as_ref(), value.span().start)],
        DeValue::Array(items) => items
            .iter()
            .filter_map(|item| match item.get_ref() {
                DeValue::String(s) => Some((s.as_ref(), item.span().start)),
                other => {
                    errors.value(
                        item,
                        field,
                        format!("expected a string, found {}", other.type_str()),
                    );
                    None
                }
            })
            .collect(),
        other => {
            errors.value(
                value,
                field,
                format!(
                    "expected a URL or a list of URLs, found {}",
                    other.type_str()
                ),
            );
            Vec::new()
        }
    };
    for (url, at) in list {
        if sluice::store::RedisConfig::new(url).is_sentinel() {
            // Redis Sentinel: the URL names the Sentinels and the master itself.
            let problem = if cluster {
                Some(String::from("a Sentinel URL names every Sentinel itself: give it as one string, not in a list (a list is a Redis Cluster)"))
            } else {
                match sluice::store::RedisConfig::new(url).check() {
                    Ok(()) => None,
                    Err(sluice::store::RedisStoreError::BadUrl { reason, .. }) => Some(reason),
                    Err(e) => Some(e.to_string()),
                }
            };
            match problem {
                None => urls.push(url.to_owned()),
                Some(reason) => errors.at(
                    at,
                    field,
                    format!("cannot read `{url}` as a Redis Sentinel URL: {reason}"),
                ),
            }
            continue;
        }
        let rest = url
            .strip_prefix("redis://")
            .or_else(|| url.strip_prefix("rediss://"))
            .or_else(|| url.strip_prefix("redis+unix://"))
            .or_else(|| url.strip_prefix("unix://"));
        match rest {
            Some(rest) if !rest.is_empty() => urls.push(url.to_owned()),
            _ => errors.at(
                at,
                field,
                format!("cannot read `{url}` as a Redis URL: expected redis://HOST:PORT, or redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME for Redis Sentinel"),
            ),
        }
    }
    (urls, cluster)
}
