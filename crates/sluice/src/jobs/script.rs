//! The job scripts, assembled from the files in `lua/` and the store's own Lua, and the names
//! of the keys they touch. `docs/jobs.md` ("Redis layout") lists both; the npm package
//! assembles the same files in the same order, so Rust and Node workers share one queue.

use redis::Script;

/// The store's three decisions, each wrapped as a function of its own `KEYS` and `ARGV`
/// (`bucket_gcra`, `bucket_sw`, `bucket_fw`): the group's bucket is decided by the very
/// scripts `RedisStore` runs, so a group's key is one bucket with the gateway's.
macro_rules! buckets {
    () => {
        concat!(
            include_str!("lua/open_gcra.lua"),
            include_str!("../store/lua/time.lua"),
            include_str!("../store/lua/stamp.lua"),
            include_str!("../store/lua/gcra_state.lua"),
            include_str!("../store/lua/debt.lua"),
            include_str!("lua/close.lua"),
            include_str!("lua/open_sw.lua"),
            include_str!("../store/lua/time.lua"),
            include_str!("../store/lua/stamp.lua"),
            include_str!("../store/lua/window_prelude.lua"),
            include_str!("../store/lua/sliding_window.lua"),
            include_str!("lua/close.lua"),
            include_str!("lua/open_fw.lua"),
            include_str!("../store/lua/time.lua"),
            include_str!("../store/lua/stamp.lua"),
            include_str!("../store/lua/window_prelude.lua"),
            include_str!("../store/lua/fixed_window.lua"),
            include_str!("lua/close.lua"),
        )
    };
}

/// A group script that decides on the bucket: the buckets, `now.lua`, `group.lua`,
/// `decide.lua`, then its own file.
macro_rules! deciding {
    ($file:literal) => {
        concat!(
            buckets!(),
            include_str!("lua/now.lua"),
            include_str!("lua/group.lua"),
            include_str!("lua/decide.lua"),
            include_str!($file)
        )
    };
}

/// A group script that does not touch the bucket: `now.lua`, `group.lua`, its own file.
macro_rules! group {
    ($file:literal) => {
        concat!(
            include_str!("lua/now.lua"),
            include_str!("lua/group.lua"),
            include_str!($file)
        )
    };
}

/// A script of the queue's group list: `now.lua`, `queue.lua`, its own file.
macro_rules! queue {
    ($file:literal) => {
        concat!(
            include_str!("lua/now.lua"),
            include_str!("lua/queue.lua"),
            include_str!($file)
        )
    };
}

pub(crate) const CLAIM: &str = deciding!("lua/claim.lua");
pub(crate) const FINISH: &str = deciding!("lua/finish.lua");
pub(crate) const ENQUEUE: &str = group!("lua/enqueue.lua");
pub(crate) const TOUCH: &str = group!("lua/touch.lua");
pub(crate) const STATS: &str = group!("lua/stats.lua");
pub(crate) const RETRY_DEAD: &str = group!("lua/retry_dead.lua");
pub(crate) const PURGE: &str = group!("lua/purge.lua");
pub(crate) const REGISTER: &str = queue!("lua/register.lua");
pub(crate) const PICK: &str = queue!("lua/pick.lua");
pub(crate) const PARK: &str = queue!("lua/park.lua");
pub(crate) const SWEEP: &str = queue!("lua/sweep.lua");

/// Every job script, loaded once per queue handle.
#[derive(Debug, Clone)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) finish: Script,
    pub(crate) enqueue: Script,
    pub(crate) touch: Script,
    pub(crate) stats: Script,
    pub(crate) retry_dead: Script,
    pub(crate) purge: Script,
    pub(crate) register: Script,
    pub(crate) pick: Script,
    pub(crate) park: Script,
    pub(crate) sweep: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            claim: Script::new(CLAIM),
            finish: Script::new(FINISH),
            enqueue: Script::new(ENQUEUE),
            touch: Script::new(TOUCH),
            stats: Script::new(STATS),
            retry_dead: Script::new(RETRY_DEAD),
            purge: Script::new(PURGE),
            register: Script::new(REGISTER),
            pick: Script::new(PICK),
            park: Script::new(PARK),
            sweep: Script::new(SWEEP),
        }
    }
}

/// The keys of one group, in the order every group script takes them (`KEYS[1..9]`), all with
/// the hash tag `{<group>}`: the group's bucket (`<bucket prefix>:{<group>}`, the key of
/// `RedisStore` and the gateway) and `<prefix>:<queue>:{<group>}:<name>`.
pub(crate) fn group_keys(
    prefix: &str,
    queue: &str,
    bucket_prefix: &str,
    group: &str,
) -> [String; 9] {
    let base = format!("{prefix}:{queue}:{{{group}}}:");
    [
        format!("{bucket_prefix}:{{{group}}}"),
        format!("{base}jobs"),
        format!("{base}wait"),
        format!("{base}delayed"),
        format!("{base}active"),
        format!("{base}dead"),
        format!("{base}meta"),
        format!("{base}done"),
        format!("{base}idem"),
    ]
}

/// The keys of the queue's group list (`KEYS[1..5]` of the queue scripts, and `KEYS[6]` of
/// the sweep), all with the hash tag `{<queue>}`.
pub(crate) fn queue_keys(prefix: &str, queue: &str) -> [String; 6] {
    let base = format!("{prefix}:{{{queue}}}:");
    [
        format!("{base}ready"),
        format!("{base}later"),
        format!("{base}marks"),
        format!("{base}turn"),
        format!("{base}groups"),
        format!("{base}sweep"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_is_the_stores_own_script() {
        for script in [CLAIM, FINISH] {
            assert!(script.contains(include_str!("../store/lua/debt.lua")));
            assert!(script.contains(include_str!("../store/lua/sliding_window.lua")));
            assert!(script.contains(include_str!("../store/lua/fixed_window.lua")));
            assert!(script.contains("local function bucket_gcra(KEYS, ARGV)"));
        }
        assert!(!ENQUEUE.contains("bucket_gcra"));
    }

    /// `lua/scripts.txt`, which the npm package follows, says what the constants are.
    #[test]
    fn the_manifest_assembles_the_same_scripts() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let constants = [
            ("claim", CLAIM),
            ("finish", FINISH),
            ("enqueue", ENQUEUE),
            ("touch", TOUCH),
            ("stats", STATS),
            ("retry_dead", RETRY_DEAD),
            ("purge", PURGE),
            ("register", REGISTER),
            ("pick", PICK),
            ("park", PARK),
            ("sweep", SWEEP),
        ];
        let manifest = include_str!("lua/scripts.txt");
        let mut named = 0;
        for line in manifest
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (name, files) = line.split_once(": ").expect("name: files");
            let assembled: String = files
                .split(' ')
                .map(|f| std::fs::read_to_string(src.join(f)).expect(f))
                .collect();
            let (_, constant) = constants
                .iter()
                .find(|(n, _)| *n == name)
                .unwrap_or_else(|| panic!("{name} has no constant"));
            assert_eq!(&assembled, constant, "{name}");
            named += 1;
        }
        assert_eq!(named, constants.len());
    }

    #[test]
    fn a_groups_keys_share_the_bucket_keys_slot() {
        let keys = group_keys("sluice:jobs", "mail", "sluice:api", "key-7");
        assert_eq!(keys[0], "sluice:api:{key-7}");
        assert_eq!(keys[4], "sluice:jobs:mail:{key-7}:active");
        for k in &keys {
            assert!(k.contains("{key-7}"), "{k}");
        }
        assert_eq!(
            queue_keys("sluice:jobs", "mail")[0],
            "sluice:jobs:{mail}:ready"
        );
    }
}
