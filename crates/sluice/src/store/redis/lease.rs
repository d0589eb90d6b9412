//! Leases: slices of a shared bucket that this process spends on its own.
//!
//! A leased key costs one round trip per slice rather than one per request. The slice's tokens
//! are withheld in Redis from every other gateway before any of them is spent, and debited
//! when the slice is given back (what was spent) or expires (all of it): see `lua/gcra_state.lua`
//! for why that never admits beyond the bound. Here:
//!
//! - one [`Slice`] per key this process holds a lease on, spent under a lock, no I/O;
//! - a slice is used only until its local deadline, `ttl` less a margin, measured from before
//!   the request that took it left: Redis counts the lease's `ttl` from when the script ran,
//!   later, so the slice is never spent after Redis has settled it;
//! - the next slice's size doubles (up to `max`) when one runs out before its deadline, and
//!   halves (down to `min`) when one expires unspent, so a cold key takes slices of `min` and a
//!   hot key few round trips;
//! - slices past their deadline with tokens left are given back by a sweeper (every `ttl`),
//!   and all of them when the store stops (`RedisStore::give_back_leases`); a slice spent
//!   whole is left to expire in Redis, which settles it as spent.
//!
//! Nothing here must touch Redis but through the store's round trip, which bounds it by the
//! timeout and follows `on_error` when Redis does not answer; a lease whose giving back goes
//! unanswered is forgotten here and settled by Redis when it expires (as all spent).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// How a policy leases: slices of at most `max` tokens (at least `min`) lasting `ttl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseConfig {
    /// The largest slice.
    pub max: LeaseSize,
    /// The smallest slice, and the first (default 1).
    pub min: u64,
    /// How long a slice lasts (default 100 ms).
    pub ttl: Duration,
}

/// A slice size: tokens, or a share of the capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseSize {
    /// This many tokens.
    Tokens(u64),
    /// This many hundredths of a percent of the capacity (`500`: 5%).
    Basis(u32),
}

impl LeaseSize {
    /// The size in tokens for `capacity`: at least one.
    pub fn tokens(self, capacity: u64) -> u64 {
        let n = match self {
            LeaseSize::Tokens(n) => n,
            LeaseSize::Basis(b) => {
                u64::try_from(u128::from(capacity) * u128::from(b) / 10_000).unwrap_or(u64::MAX)
            }
        };
        n.clamp(1, capacity.max(1))
    }
}

impl LeaseConfig {
    /// Slices of at most `max`, lasting `ttl`, starting at one token.
    pub fn new(max: LeaseSize, ttl: Duration) -> LeaseConfig {
        LeaseConfig { max, min: 1, ttl }
    }

    /// The local deadline of a slice whose request left at `sent`: `ttl` less a margin
    /// (1/50 of it, at least a millisecond) for clocks that do not run quite alike.
    pub(crate) fn deadline(&self, sent: Instant) -> Instant {
        let margin = (self.ttl / 50).max(Duration::from_millis(1));
        sent + self.ttl.saturating_sub(margin)
    }
}

/// The slice this process holds on one key.
#[derive(Debug)]
pub(crate) struct Slice {
    /// Tokens the lease in Redis holds for this process (0: none held).
    pub(crate) granted: u64,
    /// Of which not spent yet.
    pub(crate) left: u64,
    /// Spent only before this.
    pub(crate) deadline: Instant,
    /// What the next slice asks for.
    pub(crate) size: u64,
    /// The free tokens Redis reported when the slice was taken.
    pub(crate) free: u64,
    /// The generation of the lease held: it names the lease in Redis apart from this
    /// process's earlier and later slices of the key (see [`Leases::slice_id`]).
    pub(crate) generation: u64,
}

impl Slice {
    /// Takes `cost` from the slice if it is still good at `now`; the tokens left after.
    pub(crate) fn spend(&mut self, cost: u64, now: Instant) -> Option<u64> {
        if self.granted > 0 && now < self.deadline && self.left >= cost {
            self.left -= cost;
            return Some(self.left);
        }
        None
    }

    /// The lease to give back (what was spent of it), if one is held, and the size of the
    /// next slice, adapted to how the last one went.
    pub(crate) fn renewal(
        &mut self,
        now: Instant,
        min: u64,
        max: u64,
        cost: u64,
    ) -> (Option<u64>, u64) {
        let spent = (self.granted > 0).then(|| self.granted - self.left);
        if self.granted > 0 {
            if now < self.deadline {
                // Ran out early: the key is hotter than the slice.
                self.size = self.size.saturating_mul(2);
            } else if self.left > 0 {
                self.size /= 2;
            }
        }
        self.size = self.size.clamp(min.max(1), max.max(1));
        (spent, self.size.max(cost))
    }

    /// The lease is settled in Redis (or forgotten): nothing held.
    pub(crate) fn clear(&mut self) {
        self.granted = 0;
        self.left = 0;
    }
}

/// One key's slice and the lock that makes one request at a time renew it.
#[derive(Debug)]
pub(crate) struct KeyLease {
    pub(crate) slice: Mutex<Slice>,
    pub(crate) renewing: tokio::sync::Mutex<()>,
}

const SHARDS: usize = 16;

/// One shard of the slices: keys to their slice.
type Shard = Mutex<HashMap<Box<str>, Arc<KeyLease>>>;

/// Every slice this process holds, by key.
#[derive(Debug)]
pub(crate) struct Leases {
    /// Names this process's leases in Redis, with each slice's generation.
    pub(crate) id: String,
    /// The generation of the next slice taken.
    next: std::sync::atomic::AtomicU64,
    pub(crate) config: LeaseConfig,
    shards: Box<[Shard]>,
    pub(crate) metrics: LeaseMetrics,
}

/// Counts of what leases did.
#[derive(Debug)]
pub(crate) struct LeaseMetrics {
    pub(crate) taken: metrics::Counter,
    pub(crate) returned: metrics::Counter,
    pub(crate) expired: metrics::Counter,
    pub(crate) unspent: metrics::Counter,
    /// Unspent tokens of slices given back too late: Redis had settled them as spent.
    pub(crate) lost: metrics::Counter,
    pub(crate) local: metrics::Counter,
}

impl Leases {
    pub(crate) fn new(config: LeaseConfig, prefix: &str) -> Leases {
        let counter = |name: &'static str, event: &'static str| metrics::counter!(name, "prefix" => prefix.to_owned(), "event" => event);
        Leases {
            id: lease_id(),
            next: std::sync::atomic::AtomicU64::new(1),
            config,
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            metrics: LeaseMetrics {
                taken: counter("sluice_store_leases_total", "taken"),
                returned: counter("sluice_store_leases_total", "returned"),
                expired: counter("sluice_store_leases_total", "expired"),
                unspent: metrics::counter!("sluice_store_lease_tokens_unspent_total", "prefix" => prefix.to_owned()),
                lost: metrics::counter!("sluice_store_lease_tokens_lost_total", "prefix" => prefix.to_owned()),
                local: metrics::counter!("sluice_store_lease_admissions_total", "prefix" => prefix.to_owned()),
            },
        }
    }

    /// The name in Redis of this process's slice of `generation`: its id, `g`, the generation
    /// (letters and digits, as the scripts read ids).
    pub(crate) fn slice_id(&self, generation: u64) -> String {
        format!("{}g{generation}", self.id)
    }

    /// A generation no slice of this process had.
    pub(crate) fn next_generation(&self) -> u64 {
        self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    fn shard(&self, key: &str) -> &Shard {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.as_bytes() {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        &self.shards[(h % SHARDS as u64) as usize]
    }

    /// The slice of `key`, made empty if none is held.
    pub(crate) fn entry(&self, key: &str) -> Arc<KeyLease> {
        let mut shard = self.shard(key).lock();
        if let Some(entry) = shard.get(key) {
            return Arc::clone(entry);
        }
        let entry = Arc::new(KeyLease {
            slice: Mutex::new(Slice {
                granted: 0,
                left: 0,
                deadline: Instant::now(),
                size: self.config.min.max(1),
                free: 0,
                generation: 0,
            }),
            renewing: tokio::sync::Mutex::new(()),
        });
        shard.insert(key.into(), Arc::clone(&entry));
        entry
    }

    /// The keys whose slices are past their deadline at `now`, each with the slice's
    /// generation, what was spent of it and what was not, taken out of their slices (to be
    /// given back); keys with nothing held and idle are forgotten. With `all`, every slice
    /// held, past its deadline or not.
    pub(crate) fn due(&self, now: Instant, all: bool) -> Vec<(String, u64, u64, u64)> {
        let mut due = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.retain(|key, entry| {
                // A key being renewed is left to its renewal.
                let Ok(_renewing) = entry.renewing.try_lock() else {
                    return true;
                };
                let mut slice = entry.slice.lock();
                if slice.granted == 0 {
                    return now < slice.deadline + self.config.ttl;
                }
                // A slice spent whole needs no round trip: Redis settles it at its expiry as
                // all spent, which it was. So a cold key costs one script per request, as
                // without leases.
                if slice.left == 0 && now >= slice.deadline {
                    slice.clear();
                } else if all || now >= slice.deadline {
                    due.push((
                        key.to_string(),
                        slice.generation,
                        slice.granted - slice.left,
                        slice.left,
                    ));
                    slice.clear();
                }
                true
            });
        }
        due
    }
}

/// A random id for this process's leases (16 hex digits).
fn lease_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    format!("{:016x}", h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_tokens_or_a_share_of_the_capacity() {
        assert_eq!(LeaseSize::Basis(500).tokens(1000), 50);
        assert_eq!(LeaseSize::Basis(1).tokens(10), 1);
        assert_eq!(LeaseSize::Tokens(40).tokens(10), 10);
        assert_eq!(LeaseSize::Tokens(0).tokens(10), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_slice_grows_when_it_runs_out_early_and_shrinks_when_it_expires_unspent() {
        let now = Instant::now();
        let mut s = Slice {
            granted: 4,
            left: 0,
            deadline: now + Duration::from_millis(100),
            size: 4,
            free: 0,
            generation: 0,
        };
        assert_eq!(s.renewal(now, 1, 64, 1), (Some(4), 8));
        s.granted = 8;
        s.left = 5;
        let later = now + Duration::from_millis(200);
        assert_eq!(s.renewal(later, 1, 64, 1), (Some(3), 4));
        s.clear();
        assert_eq!(s.renewal(later, 1, 64, 6), (None, 6));
        assert_eq!(s.spend(1, later), None);
    }
}
