//! The Lua scripts, and the arguments and replies that go with them.

use redis::Script;
use sluice_core::{Algorithm, AnyAlgorithm, Decision, Kind};

use crate::store::redis::config::RedisStoreError;

/// The largest window the scripts take: twice it must stay an exact Lua number (below 2^53).
const MAX_WINDOW_NS: u64 = 1 << 52;
/// The most a bucket key may owe on Redis, its window and its debt included (2^53 ns, about
/// 104 days of refill): every sum the scripts make of it stays an exact Lua number.
const MAX_OWED_NS: u64 = 1 << 53;
/// The largest capacity of the window scripts: its square must stay exact.
const MAX_WINDOW_CAPACITY: u64 = 94_906_265;

const DEBT: &str = concat!(
    include_str!("../lua/time.lua"),
    include_str!("../lua/stamp.lua"),
    include_str!("../lua/gcra_state.lua"),
    include_str!("../lua/debt.lua")
);
const LEASE: &str = concat!(
    include_str!("../lua/time.lua"),
    include_str!("../lua/stamp.lua"),
    include_str!("../lua/gcra_state.lua"),
    include_str!("../lua/lease.lua")
);
const SLIDING_WINDOW: &str = concat!(
    include_str!("../lua/time.lua"),
    include_str!("../lua/stamp.lua"),
    include_str!("../lua/window_prelude.lua"),
    include_str!("../lua/sliding_window.lua")
);
const FIXED_WINDOW: &str = concat!(
    include_str!("../lua/time.lua"),
    include_str!("../lua/stamp.lua"),
    include_str!("../lua/window_prelude.lua"),
    include_str!("../lua/fixed_window.lua")
);

/// What the lease script answers: the tokens granted, those free after, and (when none
/// were granted) how long until one is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Granted {
    pub(crate) granted: u64,
    pub(crate) free: u64,
    pub(crate) retry_after_ns: u64,
    pub(crate) reset_after_ns: u64,
    /// Whether the lease given back was found (held, or settled within its grace): if not,
    /// Redis had settled it as all spent, and its unspent tokens were lost.
    pub(crate) found: bool,
}

/// One algorithm's script with its stamp.
#[derive(Clone)]
pub(crate) struct Program {
    script: Script,
    /// The lease script, for the bucket algorithms (`None` for the windows).
    lease: Option<Script>,
    algorithm: AnyAlgorithm,
    /// ARGV[1]: `<family>:<capacity>:<interval_ns>`, which every value written starts with.
    stamp: String,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("stamp", &self.stamp)
            .field("sha1", &self.script.get_hash())
            .finish()
    }
}

/// The state family of `kind` (its part of the stamp): the bucket algorithms admit alike and
/// share one.
fn family(kind: Kind) -> Option<&'static str> {
    match kind {
        Kind::Gcra | Kind::TokenBucket | Kind::LeakyBucket => Some("gcra"),
        Kind::SlidingWindow => Some("sw"),
        Kind::FixedWindow => Some("fw"),
        Kind::SlidingLog => None,
    }
}

impl Program {
    /// The script for `algorithm`.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for `sliding_log`, and for quotas whose numbers would not
    /// stay exact in Lua (a window above 2^52 ns, about 52 days; a window capacity above 94
    /// million).
    pub(crate) fn new(algorithm: &AnyAlgorithm) -> Result<Program, RedisStoreError> {
        let kind = algorithm.kind();
        let quota = algorithm.quota();
        let unsupported = |reason: String| RedisStoreError::Unsupported {
            algorithm: kind,
            reason,
        };
        if quota.window_ns() > MAX_WINDOW_NS {
            return Err(unsupported(format!(
                "its window (capacity x interval) is {}, above the 52 days (2^52 ns) the scripts compute exactly",
                sluice_core::format_duration_ns(quota.window_ns())
            )));
        }
        let Some(family) = family(kind) else {
            return Err(unsupported(String::from(
                "it keeps one entry per admission, which one lean script cannot; use sliding_window (same window, O(1)) or gcra",
            )));
        };
        let source = match family {
            "gcra" => DEBT,
            _ if quota.capacity() > MAX_WINDOW_CAPACITY => {
                return Err(unsupported(format!(
                "capacity {} is above the {MAX_WINDOW_CAPACITY} the window scripts compute exactly",
                quota.capacity()
            )))
            }
            "sw" => SLIDING_WINDOW,
            _ => FIXED_WINDOW,
        };
        Ok(Program {
            script: Script::new(source),
            lease: (family == "gcra").then(|| Script::new(LEASE)),
            algorithm: *algorithm,
            stamp: format!("{family}:{}:{}", quota.capacity(), quota.interval_ns()),
        })
    }

    /// The algorithm and quota.
    pub(crate) fn algorithm(&self) -> AnyAlgorithm {
        self.algorithm
    }

    /// The stamp of the values this program writes: `<family>:<capacity>:<interval_ns>`.
    pub(crate) fn stamp(&self) -> &str {
        &self.stamp
    }

    /// The Redis key of `key`: `<prefix>:{<key>}`, the braces a Cluster hash tag. The same
    /// whatever the algorithm: the value's stamp says which wrote it.
    pub(crate) fn redis_key(prefix: &str, key: &str) -> String {
        let mut k = String::with_capacity(prefix.len() + key.len() + 3);
        k.push_str(prefix);
        k.push_str(":{");
        k.push_str(key);
        k.push('}');
        k
    }

    /// The script.
    pub(crate) fn script(&self) -> &Script {
        &self.script
    }

    /// `EVALSHA <sha1> 1 <prefix>:{<key>} <stamp> <cost> [<now>]`: the decision of `cost` for
    /// `key`, at Redis's time or at `now_unix_ns`. Built directly (not through
    /// `redis::ScriptInvocation`), which saves an allocation per argument on the hot path.
    pub(crate) fn command(
        &self,
        prefix: &str,
        key: &str,
        cost: u64,
        now_unix_ns: Option<u64>,
    ) -> redis::Cmd {
        let mut cmd = redis::Cmd::with_capacity(
            6,
            56 + prefix.len() + key.len() + 3 + self.stamp.len() + 3 * 20,
        );
        cmd.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(1)
            .arg(Program::redis_key(prefix, key))
            .arg(&self.stamp)
            .arg(cost);
        if let Some(now) = now_unix_ns {
            cmd.arg(now);
        }
        cmd
    }

    /// `EVALSHA ... <cost> '' <ago>`: gives back `cost` admitted `ago_ns` before Redis's now
    /// (the script's refund; its reply carries no decision).
    pub(crate) fn refund_command(
        &self,
        prefix: &str,
        key: &str,
        cost: u64,
        ago_ns: u64,
        now_unix_ns: Option<u64>,
    ) -> redis::Cmd {
        self.command_in_mode(prefix, key, cost, now_unix_ns, ago_ns)
    }

    /// The decision command with ARGV[3] (the time, `''` for Redis's) and ARGV[4], the
    /// script's mode: a refund's `ago_ns`, or `c` for a charge.
    fn command_in_mode(
        &self,
        prefix: &str,
        key: &str,
        cost: u64,
        now_unix_ns: Option<u64>,
        mode: impl redis::ToRedisArgs,
    ) -> redis::Cmd {
        let mut cmd = self.command(prefix, key, cost, None);
        match now_unix_ns {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(mode);
        cmd
    }

    /// `EVALSHA ... <cost> '' c <most_ns>`: takes `cost` for `key` without asking (the
    /// script's charge; see [`Program::charged`] for its reply). A bucket goes into debt, down
    /// to `max_debt` tokens beyond empty: ARGV[5] is the most the key may owe, in ns of refill
    /// with its window, at most [`MAX_OWED_NS`] so that Lua computes it exactly. The windows
    /// take what they have left and ignore it.
    pub(crate) fn charge_command(
        &self,
        prefix: &str,
        key: &str,
        cost: u64,
        max_debt: u64,
        now_unix_ns: Option<u64>,
    ) -> redis::Cmd {
        let quota = self.algorithm.quota();
        let most = quota
            .window_ns()
            .saturating_add(max_debt.saturating_mul(quota.interval_ns()))
            .min(MAX_OWED_NS);
        let mut cmd = self.command_in_mode(prefix, key, cost, now_unix_ns, "c");
        cmd.arg(most);
        cmd
    }

    /// What a charge's reply `{1, remaining, 0, reset_after_ns, taken}` took.
    pub(crate) fn charged(reply: &redis::Value) -> Option<u64> {
        match reply {
            redis::Value::Array(items) if items.len() == 5 => match items[4] {
                redis::Value::Int(v) => u64::try_from(v).ok(),
                _ => None,
            },
            _ => None,
        }
    }

    /// The lease script, if this algorithm's keys can be leased (the bucket algorithms).
    pub(crate) fn lease_script(&self) -> Option<&Script> {
        self.lease.as_ref()
    }

    /// `EVALSHA <lease sha1> 1 <key> <stamp> 0 <now|''> <id> <spent|''> <want> <ttl_ns>
    /// <at_least> [<new id>]`: gives back the lease named `id` on `key` (having spent `spent`
    /// of it), and takes a new one, named `new_id` (else `id`), of up to `want` tokens for
    /// `ttl_ns`, if at least `at_least` are free. `None` for an algorithm without leases.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lease_command(
        &self,
        prefix: &str,
        key: &str,
        (id, new_id): (&str, Option<&str>),
        spent: Option<u64>,
        (want, at_least): (u64, u64),
        ttl_ns: u64,
        now_unix_ns: Option<u64>,
    ) -> Option<redis::Cmd> {
        let script = self.lease.as_ref()?;
        let mut cmd = redis::Cmd::with_capacity(
            12,
            56 + prefix.len() + key.len() + 3 + self.stamp.len() + id.len() + 6 * 20,
        );
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(1)
            .arg(Program::redis_key(prefix, key))
            .arg(&self.stamp)
            .arg(0);
        match now_unix_ns {
            Some(now) => cmd.arg(now),
            None => cmd.arg(""),
        };
        cmd.arg(id);
        match spent {
            Some(spent) => cmd.arg(spent),
            None => cmd.arg(""),
        };
        cmd.arg(want).arg(ttl_ns).arg(at_least);
        if let Some(new_id) = new_id {
            cmd.arg(new_id);
        }
        Some(cmd)
    }

    /// The lease script's reply `{granted, free, retry_after_ns, reset_after_ns}`.
    pub(crate) fn granted(reply: &redis::Value) -> Option<Granted> {
        let redis::Value::Array(items) = reply else {
            return None;
        };
        let n = |i: usize| match items.get(i) {
            Some(redis::Value::Int(v)) => u64::try_from(*v).ok(),
            _ => None,
        };
        if items.len() != 5 {
            return None;
        }
        Some(Granted {
            granted: n(0)?,
            free: n(1)?,
            retry_after_ns: n(2)?,
            reset_after_ns: n(3)?,
            found: n(4)? == 1,
        })
    }

    /// The decision in a script's reply `{allowed, remaining, retry_after_ns, reset_after_ns}`.
    pub(crate) fn decision(&self, reply: &redis::Value) -> Option<Decision> {
        let redis::Value::Array(items) = reply else {
            return None;
        };
        let n = |i: usize| match items.get(i) {
            Some(redis::Value::Int(v)) => u64::try_from(*v).ok(),
            _ => None,
        };
        if items.len() != 4 {
            return None;
        }
        Some(Decision {
            allowed: n(0)? == 1,
            limit: self.algorithm.quota().capacity(),
            remaining: n(1)?,
            retry_after_ns: n(2)?,
            reset_after_ns: n(3)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Quota;

    #[test]
    fn refuses_what_lua_cannot_compute_exactly() {
        let log = AnyAlgorithm::new(Kind::SlidingLog, Quota::parse(10, "1/s").unwrap());
        let err = Program::new(&log).unwrap_err().to_string();
        assert!(
            err.contains("sliding_log") && err.contains("sliding_window"),
            "{err}"
        );
        let long = AnyAlgorithm::new(Kind::Gcra, Quota::parse(100, "1/d").unwrap());
        let err = Program::new(&long).unwrap_err().to_string();
        assert!(err.contains("52 days"), "{err}");
        let wide = AnyAlgorithm::new(
            Kind::SlidingWindow,
            Quota::parse(100_000_000, "1000000000/s").unwrap(),
        );
        assert!(Program::new(&wide).is_err());
        for kind in [
            Kind::Gcra,
            Kind::TokenBucket,
            Kind::LeakyBucket,
            Kind::FixedWindow,
        ] {
            assert!(
                Program::new(&AnyAlgorithm::new(kind, Quota::parse(10, "1/s").unwrap())).is_ok()
            );
        }
    }

    #[test]
    fn keys_carry_a_hash_tag_and_values_a_stamp() {
        let p = Program::new(&AnyAlgorithm::new(
            Kind::Gcra,
            Quota::parse(1, "1/s").unwrap(),
        ))
        .unwrap();
        assert_eq!(Program::redis_key("api", "10.0.0.1"), "api:{10.0.0.1}");
        assert_eq!(p.stamp(), "gcra:1:1000000000");
        let packed = p.command("api", "10.0.0.1", 1, None).get_packed_command();
        let text = String::from_utf8_lossy(&packed);
        assert!(
            text.contains("EVALSHA")
                && text.contains("api:{10.0.0.1}")
                && text.contains("gcra:1:1000000000"),
            "{text}"
        );
    }

    #[test]
    fn the_stamp_reader_takes_the_limits_of_program_new() {
        assert_eq!(MAX_WINDOW_NS, 4_503_599_627_370_496);
        for script in [DEBT, SLIDING_WINDOW, FIXED_WINDOW] {
            assert!(script.contains("TWO52, TWO53 = 4503599627370496, 9007199254740992"));
            assert!(script.contains(&format!("n > {MAX_WINDOW_CAPACITY}")));
        }
    }

    #[test]
    fn one_in_binary_is_what_the_prelude_says() {
        assert_eq!(
            format!("{:b}", 1_000_000_000u64),
            "111011100110101100101000000000"
        );
        assert!(SLIDING_WINDOW.contains("111011100110101100101000000000"));
        assert!((MAX_WINDOW_CAPACITY as u128).pow(2) < 1 << 53);
        assert!(((MAX_WINDOW_CAPACITY + 1) as u128).pow(2) >= 1 << 53);
    }
}
