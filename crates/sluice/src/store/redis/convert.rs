//! Converting the keys of a store in Redis to a changed quota, so that no key gains tokens.
//!
//! A reload that changes a policy's quota leaves its keys in Redis as the old quota wrote
//! them. Read under the new quota as they are, a tightened bucket would show the wrong number
//! of tokens left. [`RedisStore::convert_from`] rewrites each key by
//! [`SavedState::convert`](sluice_core::SavedState::convert): read with Redis's time, converted
//! here (exactly, in integers), written back only if the key did not change in between.
//!
//! Gateways sharing a Redis may reload at different moments: a marker key
//! `<prefix>:quota:<family>` records the quota the keys are in, and a gateway converts only when
//! it can move the marker to its quota, so each change is converted once.

use sluice_core::{Algorithm, AnyAlgorithm, Kind, SavedState};

use crate::store::redis::config::{RedisConfig, RedisStoreError};
use crate::store::redis::link::Conn;
use crate::store::redis::RedisStore;

/// Reads `{TIME seconds, TIME microseconds, value or false}` of one key.
const READ: &str = "local t = redis.call('TIME') return {t[1], t[2], redis.call('GET', KEYS[1])}";

/// If KEYS[1] still holds ARGV[1]: sets KEYS[2] (the same key, or the key of another state
/// family, which is then left alone if it exists) to ARGV[2] with a TTL of ARGV[3] ms, or
/// deletes it if ARGV[2] is empty. Returns 1 unless KEYS[1] changed.
const SWAP: &str = "
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if KEYS[2] ~= KEYS[1] and redis.call('EXISTS', KEYS[2]) == 1 then return 1 end
if ARGV[2] == '' then redis.call('DEL', KEYS[2]) else redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3]) end
return 1";

/// Moves the marker KEYS[1] to ARGV[1] and returns 1, or returns 0 if it already is there.
const MARK: &str = "
if redis.call('GET', KEYS[1]) == ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1";

fn family(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Gcra | Kind::TokenBucket | Kind::LeakyBucket => Some("gcra"),
        Kind::SlidingWindow => Some("sw"),
        Kind::FixedWindow => Some("fw"),
        Kind::SlidingLog => None,
    }
}

/// `*`, `?`, `[`, `]` and `\` of a prefix, escaped for `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The TTL the scripts give a key idle in `ns`: that in milliseconds, rounded up, plus 1 s.
fn ttl_ms(ns: u128) -> u128 {
    ns.div_ceil(1_000_000) + 1000
}

/// A stored value under `from`, read at `now` (ns since the Unix epoch), converted for `to`:
/// `Some((value, ttl_ms))` to write (an empty value deletes the key), `None` to leave it.
pub(crate) fn convert_value(
    from: &AnyAlgorithm,
    to: &AnyAlgorithm,
    value: &str,
    now: u128,
) -> Option<(String, u128)> {
    let mut parts = value.split(' ').map(str::parse::<u128>);
    let end = parts.next()?.ok()?;
    let w_old = u128::from(from.quota().window_ns());
    let w_new = u128::from(to.quota().window_ns());
    let rel = |t: u128| u64::try_from(t).unwrap_or(u64::MAX);
    let saved = match family(from.kind())? {
        "gcra" => SavedState::Debt {
            debt_ns: rel(end.saturating_sub(now)),
        },
        "fw" => {
            if end <= now {
                // The window is over: the next check starts a new one.
                return None;
            }
            SavedState::Window {
                ends_in_ns: rel(end - now),
                count: rel(parts.next()?.ok()?),
            }
        }
        _ => {
            let (p, c) = (parts.next()?.ok()?, parts.next()?.ok()?);
            // Roll as the script does: past its end, the current window is the previous one.
            let (ends_in, p, c) = if end > now {
                (end - now, p, c)
            } else if now - end < w_old {
                (end + w_old - now, c, 0)
            } else {
                return None;
            };
            SavedState::Sliding {
                ends_in_ns: rel(ends_in),
                previous: rel(p),
                current: rel(c),
            }
        }
    };
    let converted = to.convert_saved(from, &saved).ok()?;
    Some(match converted {
        SavedState::Debt { debt_ns: 0 } => (String::new(), 0),
        SavedState::Debt { debt_ns } => {
            let debt = u128::from(debt_ns);
            ((now + debt).to_string(), ttl_ms(debt))
        }
        SavedState::Window { ends_in_ns, count } => {
            let left = u128::from(ends_in_ns);
            (format!("{} {count}", now + left), ttl_ms(left))
        }
        SavedState::Sliding {
            ends_in_ns,
            previous,
            current,
        } => {
            let left = u128::from(ends_in_ns);
            (
                format!("{} {previous} {current}", now + left),
                ttl_ms(left + w_new),
            )
        }
        SavedState::Log { .. } => return None,
    })
}

impl RedisStore {
    /// Converts every key of this store's prefix in Redis from `from` (the quota the keys were
    /// written under) to this store's algorithm, so that no key gains tokens
    /// ([`SavedState::convert`]): each key is read with Redis's time, converted here, and
    /// written back only if it did not change in between. A marker key
    /// `<prefix>:quota:<family>` records the quota the keys are in, so that of several
    /// gateways sharing the Redis only the first to reload converts. Returns the keys
    /// rewritten; zero when another gateway already converted them. Between algorithms of
    /// different state families (say `gcra` to `fixed_window`) each key is written under the
    /// new family's name with what it had left, unless that key already exists. Call it once the new quota is in use if it shrinks the window (unconverted
    /// keys then read as fuller debt), before if it grows it.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Connect`] when Redis cannot be reached or fails mid-way (keys not
    /// reached yet keep the old form). On a Cluster every master is walked in turn.
    ///
    /// Afterwards this store forgets the denials it remembers: answered while keys were still
    /// in the old form (read as more debt than they hold once converted), they would go on
    /// refusing, without asking Redis, keys that conversion emptied or relieved.
    pub async fn convert_from(&self, from: &AnyAlgorithm) -> Result<usize, RedisStoreError> {
        let converted = self.convert_keys(from).await;
        self.forget_denials();
        converted
    }

    async fn convert_keys(&self, from: &AnyAlgorithm) -> Result<usize, RedisStoreError> {
        let to = *self.algorithm();
        let config = self.config().clone();
        let (Some(family), Some(new_family)) = (family(from.kind()), family(to.kind())) else {
            return Ok(0);
        };
        if from == &to {
            return Ok(0);
        }
        let failed = |e: redis::RedisError| RedisStoreError::Connect {
            target: config.target(),
            reason: e.to_string(),
        };
        let conn = tokio::time::timeout(config.connect_timeout, Conn::open(&config))
            .await
            .map_err(|_| RedisStoreError::Connect {
                target: config.target(),
                reason: format!("no answer within {:?}", config.connect_timeout),
            })?
            .map_err(failed)?;
        let prefix = &config.prefix;
        let quota = to.quota();
        let marker = format!("{prefix}:quota:{new_family}");
        let mark = format!("{} {} {}", to.kind(), quota.capacity(), quota.interval_ns());
        let script = redis::Script::new(MARK);
        let mut invocation = script.key(&marker);
        invocation.arg(&mark);
        let moved: i64 = match &conn {
            Conn::Single(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
        .map_err(failed)?;
        if moved == 0 {
            return Ok(0);
        }
        let pattern = format!("{}:{family}:*", glob_escape(prefix));
        match conn {
            Conn::Single(mut c) => convert_node(&mut c, &pattern, new_family, from, &to)
                .await
                .map_err(failed),
            Conn::Cluster(_) => {
                // SCAN sees one node's keys: walk every master, each on its own connection.
                let mut total = 0;
                for info in masters(&config).await.map_err(failed)? {
                    let client = redis::Client::open(info).map_err(failed)?;
                    let mut c = client
                        .get_multiplexed_async_connection()
                        .await
                        .map_err(failed)?;
                    total += convert_node(&mut c, &pattern, new_family, from, &to)
                        .await
                        .map_err(failed)?;
                }
                Ok(total)
            }
        }
    }
}

/// The masters of the Cluster of `config`, as connection settings (those of its first URL,
/// each with a master's address), from `CLUSTER SLOTS` on the first seed that answers.
async fn masters(config: &RedisConfig) -> redis::RedisResult<Vec<redis::ConnectionInfo>> {
    use redis::IntoConnectionInfo as _;
    let mut last = None;
    for url in &config.urls {
        let seed = url.as_str().into_connection_info()?;
        let slots: redis::RedisResult<redis::Value> = async {
            let client = redis::Client::open(seed.clone())?;
            let mut c = client.get_multiplexed_async_connection().await?;
            redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await
        }
        .await;
        let slots = match slots {
            Ok(slots) => slots,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        let mut out: Vec<redis::ConnectionInfo> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        if let redis::Value::Array(ranges) = slots {
            for range in ranges {
                let redis::Value::Array(parts) = range else {
                    continue;
                };
                // [start, end, [host, port, id, ...], replicas...]
                let Some(redis::Value::Array(master)) = parts.get(2) else {
                    continue;
                };
                let host = match master.first() {
                    Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    Some(redis::Value::SimpleString(s)) => s.clone(),
                    _ => continue,
                };
                let Some(redis::Value::Int(port)) = master.get(1) else {
                    continue;
                };
                let Ok(port) = u16::try_from(*port) else {
                    continue;
                };
                if seen.insert((host.clone(), port)) {
                    let mut info = seed.clone();
                    info.addr = redis::ConnectionAddr::Tcp(host, port);
                    out.push(info);
                }
            }
        }
        return Ok(out);
    }
    Err(last.unwrap_or_else(|| {
        redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no seed URL"))
    }))
}

/// Converts the keys matching `pattern` on one server (see [`RedisStore::convert_from`]).
async fn convert_node<C: redis::aio::ConnectionLike>(
    c: &mut C,
    pattern: &str,
    new_family: &str,
    from: &AnyAlgorithm,
    to: &AnyAlgorithm,
) -> redis::RedisResult<usize> {
    let (read, swap) = (redis::Script::new(READ), redis::Script::new(SWAP));
    let mut cursor: u64 = 0;
    let mut converted = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500)
            .query_async(c)
            .await?;
        for key in keys {
            // `<prefix>:<family>:{k}` → `<prefix>:<new family>:{k}`: the same slot.
            let Some(brace) = key.find(":{") else {
                continue;
            };
            let Some(colon) = key[..brace].rfind(':') else {
                continue;
            };
            let target = format!("{}:{new_family}{}", &key[..colon], &key[brace..]);
            // A key that changes between the read and the swap is read again.
            for _ in 0..5 {
                let (secs, micros, value): (u64, u64, Option<String>) =
                    read.key(&key).invoke_async(c).await?;
                let Some(value) = value else { break };
                let now = u128::from(secs) * 1_000_000_000 + u128::from(micros) * 1_000;
                let Some((new_value, ttl)) = convert_value(from, to, &value, now) else {
                    break;
                };
                let done: i64 = swap
                    .key(&key)
                    .key(&target)
                    .arg(&value)
                    .arg(&new_value)
                    .arg(ttl.max(1).to_string())
                    .invoke_async(c)
                    .await?;
                if done == 1 {
                    converted += 1;
                    break;
                }
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(converted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Quota;

    #[test]
    fn a_tightened_bucket_keeps_what_it_had_left() {
        let from = AnyAlgorithm::new(Kind::Gcra, Quota::parse(100, "10/s").unwrap());
        let to = AnyAlgorithm::new(Kind::Gcra, Quota::parse(50, "10/s").unwrap());
        let now = 1_700_000_000_000_000_000u128;
        // 95 of 100 spent: full again in 9.5 s.
        let (value, ttl) =
            convert_value(&from, &to, &(now + 9_500_000_000).to_string(), now).unwrap();
        // 5 left of 50: full again in 4.5 s.
        assert_eq!(value, (now + 4_500_000_000).to_string());
        assert_eq!(ttl, 5_500);
        // A full key is deleted (it would be full anyway).
        let (value, _) = convert_value(&from, &to, &(now - 1).to_string(), now).unwrap();
        assert_eq!(value, "");
    }

    #[test]
    fn windows_keep_their_count_of_what_is_used() {
        let from = AnyAlgorithm::new(Kind::FixedWindow, Quota::parse(100, "100/s").unwrap());
        let to = AnyAlgorithm::new(Kind::FixedWindow, Quota::parse(50, "100/s").unwrap());
        let now = 5_000_000_000u128;
        let (value, _) =
            convert_value(&from, &to, &format!("{} 95", now + 300_000_000), now).unwrap();
        assert_eq!(value, format!("{} 45", now + 300_000_000));
        assert_eq!(convert_value(&from, &to, &format!("{} 95", now), now), None);
        let from = AnyAlgorithm::new(Kind::SlidingWindow, Quota::parse(100, "100/s").unwrap());
        let to = AnyAlgorithm::new(Kind::SlidingWindow, Quota::parse(100, "100/s").unwrap());
        let (value, _) = convert_value(&from, &to, &format!("{} 10 20", now + 1), now).unwrap();
        assert_eq!(
            value,
            format!("{} 10 20", now + 1),
            "same quota, same state"
        );
    }

    #[test]
    fn another_family_gets_what_was_left() {
        let from = AnyAlgorithm::new(Kind::Gcra, Quota::parse(100, "1/s").unwrap());
        let to = AnyAlgorithm::new(Kind::FixedWindow, Quota::parse(50, "1/s").unwrap());
        let now = 7_000_000_000_000u128;
        // 95 of 100 spent: 5 left, so 45 of 50 used in a window starting now.
        let (value, _) =
            convert_value(&from, &to, &(now + 95_000_000_000).to_string(), now).unwrap();
        assert_eq!(value, format!("{} 45", now + 50_000_000_000));
    }

    #[test]
    fn prefixes_are_matched_literally() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
