//! Keyed limits in Redis, shared by every server that uses the same Redis (single, Cluster,
//! or the master of a Sentinel deployment).
//!
//! # How a decision is made
//!
//! One round trip: `EVALSHA` of an atomic Lua script. When Redis answers `NOSCRIPT` (after a
//! restart or a failover) the script is loaded with `SCRIPT LOAD` and run again: it did not
//! run. No other decision is ever sent twice: one whose answer is lost (the connection drops
//! after it left, or the answer does not come within the timeout) may have been made, so
//! sending it again could spend (or refund) twice; it follows [`OnError`] instead. The script
//! reads the time from Redis itself (`TIME`), so servers with skewed clocks agree, and makes
//! exactly the decision the Rust core would make at that time:
//!
//! | algorithm                                  | script               | Redis calls (allowed / denied) |
//! |--------------------------------------------|----------------------|--------------------------------|
//! | `gcra`, `token_bucket`, `leaky_bucket`     | `lua/debt.lua`       | TIME, GET, PTTL, SET / TIME, GET |
//! | `sliding_window`                           | `lua/sliding_window.lua` | TIME, GET, PTTL, SET / TIME, GET |
//! | `fixed_window`                             | `lua/fixed_window.lua`   | TIME, GET, PTTL, SET / TIME, GET |
//! | `sliding_log`                              | not offered: one entry per admission does not fit one lean script; use `sliding_window` or `gcra` |
//!
//! Each script is sent with `lua/time.lua` (reading now, writing times and TTLs) and
//! `lua/stamp.lua` (its stamp, and converting a value another quota wrote) in front, and the
//! window scripts with `lua/window_prelude.lua` after them (window alignment).
//!
//! The three bucket algorithms admit exactly alike (the core documents it), so they share the
//! GCRA script and its one value per key. Every write keeps the key until the limit is full
//! again, and never less long than it already lived, so idle keys vanish by themselves; a
//! denial writes nothing (unless it converted the key, below). (Plus one second: Redis sets
//! expiries from a cached clock that was measured to lag by several milliseconds, and a key
//! that vanished while it still held debt would give tokens away.)
//!
//! Times inside the scripts are (seconds, nanoseconds) pairs, because a Lua number holds
//! integers exactly only below 2^53; the scripts therefore take windows up to 2^52 ns (52 days)
//! and, for the window algorithms, capacities up to 94 million ([`RedisStoreError::Unsupported`]
//! otherwise). The tests run random schedules through the core and through Redis, with the
//! script's clock overridden (the optional third argument, which only tests send), and compare
//! every decision field by field.
//!
//! # Keys and values
//!
//! One key per limit and key, whatever the algorithm: `<prefix>:{<key>}`. The braces are a
//! Redis Cluster hash tag, so every script touches one slot. Give each limit that shares a
//! Redis its own prefix. (Keys named by the older layout, `<prefix>:<family>:{<key>}`, are not
//! read: after that upgrade every key starts full, and the old keys expire by themselves.)
//!
//! Every value says under which quota it was written: `<stamp>|<state>`. The stamp is
//! `<family>:<capacity>:<interval_ns>`, the family `gcra` (the three bucket algorithms), `fw`
//! or `sw`; the state is the family's: `gcra` "full again at", `fw` "window end, count", `sw`
//! "window end, previous count, current count" (times in nanoseconds since the Unix epoch).
//! Each script is sent its own stamp. A value with no stamp, or one that cannot be read, is
//! taken as the worst case: everything spent now (and written so, so that it heals).
//!
//! # A changed quota or algorithm: converted on read
//!
//! A script that reads a value stamped with another quota, or another family, converts it to
//! its own first, atomically, writes it back under its own stamp (whatever it then decides),
//! and only then decides. The rule is
//! [`SavedState::convert`](sluice_core::SavedState::convert)'s: no key has more whole tokens
//! than it had under the quota it was written with, and at most the new capacity.
//!
//! - Within a family the conversion is exactly the core's
//!   ([`AnyAlgorithm::convert_saved`](sluice_core::AnyAlgorithm::convert_saved)), debt kept in
//!   the new rate's time; products that do not fit a Lua number are computed in parts, exact
//!   (the tests compare thousands of random states with the core's).
//! - From another family (say `gcra` to `fixed_window`), the key keeps what it has left now,
//!   at most the new capacity, and the rest counts as spent now: a bucket owes it at the new
//!   rate; a window counts it in a whole window of its own starting now, which gives it back
//!   no sooner than the core's conversion (a fresh aligned window) would, often later: rounded
//!   towards fewer tokens.
//! - A refund of a key another quota wrote is converted first, then given back under this one.
//!
//! Nothing is converted ahead: a reload, [`RedisStore::reconfigure`] or a new store changes
//! only what the scripts are sent. So gateways sharing a Redis need not reload together: one
//! that has not reloaded converts each key back to its own quota when it reads it, by the same
//! rule, and keys going back and forth between two quotas can only lose tokens, never gain. A
//! key switched to another family and back is the one key, converted twice: no stale state
//! revives. As a value must outlive whatever a quota that reads it counts on, a write never
//! shortens a key's TTL, and a bucket that is full again is written as such rather than
//! deleted (a deleted key is full under every quota).
//!
//! # When Redis is down or slow
//!
//! Every call is bounded by [`RedisConfig::timeout`] (default 50 ms). A call that fails or times
//! out applies [`OnError`]: `allow`, `deny` ([`Error::Unavailable`](crate::Error::Unavailable)) or
//! `local` (an in-process [`MemoryStore`](crate::store::MemoryStore) with the same quota, one per
//! process). Redis is then left alone for [`RedisConfig::retry_interval`] (default 250 ms); the
//! first request after that is a probe, and when it succeeds decisions go back to Redis by
//! themselves. No manual reset. A probe to one server sends `PING` first (again at once if the
//! old connection turns out broken: `PING` decides nothing), so that a server that came back
//! gets the probe's decision over a fresh connection.
//!
//! A connection that breaks under a request (cut by a proxy, a firewall, `CLIENT KILL`) is
//! not an outage: that request, whose decision may have been made, follows [`OnError`], and
//! `PING` goes at once over a new connection; when Redis answers, it stays in use and the
//! next request goes to it (logged as `redis store reconnected`, info). Only a Redis that does
//! not answer that `PING` either is left alone for the retry interval.
//!
//! So a Redis that stops answering (a hung or `SIGSTOP`ped server, whose connections stay
//! open) costs each request in flight at most the timeout, later requests nothing until the
//! next probe; when it answers again, decisions are back on it within the retry interval and
//! a timeout. Each change is logged once, however many requests fail: `redis store down`
//! (warn, with the error and the `on_error` policy now deciding), `redis store recovered`
//! (info); before the first connection, `redis store cannot connect` (warn) and
//! `redis store connected` (info).
//!
//! # Redis Sentinel
//!
//! With a `redis+sentinel://` URL (see [`RedisConfig::new`]) the store asks the Sentinels
//! which server is the master: all of them at once, the highest configuration epoch winning,
//! and the server must answer `ROLE` with `master`. It asks them again on every probe and
//! whenever a connection breaks under a request, so after a failover the first probe that
//! finds the new master brings decisions back (scripts are loaded there on `NOSCRIPT`).
//!
//! A failover promotes a replica, which has only what was replicated to it; the old master
//! keeps answering, as a master, until the Sentinels turn it into a replica (about 10 s after
//! the promotion), and any other replica follows it until the Sentinels point it at the new
//! master: everything written on the old master after the promotion is lost. So by default an
//! admission counts only once every replica that was connected to the master when the store
//! connected to it (`ROLE`) has it: `WAIT <n> <timeout>`, sent once for all the admissions
//! answered meanwhile on the connection. Whichever replica is promoted then has every
//! admission that counted, and the old master, whose promoted replica is gone, gets no more
//! through: an admission not acknowledged in time follows [`OnError`] like a lost answer
//! (never sent again) and marks Redis down until a probe finds, through the Sentinels, a
//! master that acknowledges. A master found without replicas (the new master, before the
//! others follow it) waits for none: those that join it copy everything first. Denials,
//! refunds and conversions are not waited for: losing one never gives a token. So a failover
//! loses no admission and the limit holds across it (as far as the servers' clocks agree);
//! the cost is one more round trip per admission, shared by the admissions in flight
//! together. Decisions follow `on_error` from the promotion until the Sentinels name the new
//! master (about a second), then go to it. `wait=none` in the URL waits for nothing: faster,
//! but a failover then gives back the tokens of the admissions made on the old master after
//! the promotion (and of any not yet replicated), up to a key's capacity.
//!
//! # The local denial cache
//!
//! Only time adds tokens, so a denial "cost c is refused until T" stays true until T for any
//! cost of at least c. Such denials are answered locally until T (measured from when the
//! request was sent, so never later than Redis would allow), and a hot key that is being denied
//! costs no round trip. The cache is exact: it never denies what Redis would admit, as long
//! as every store of the prefix has one quota (a faster-refilling quota that another gateway
//! converts the key to may make Redis admit sooner); [`RedisStore::reconfigure`] clears it.
//!
//! # Leases: exact at local speed
//!
//! With [`RedisConfig::lease`] (the bucket algorithms), a key costs one round trip per *slice*
//! rather than per request. The lease script (`lua/lease.lua`) gives back this process's
//! previous slice of the key and takes the next, in one call; the slice is then spent in this
//! process, under a lock, with no I/O, until it runs out or its local deadline (the lease's
//! `ttl` less a margin, counted from before the call left: Redis counts it from later) passes.
//! Slices are sized between [`LeaseConfig::min`] and the ceiling: doubled when one runs out
//! early, halved when one expires unspent. A sweeper gives back slices past their deadline, and
//! [`RedisStore::give_back_leases`] all of them when the gateway stops: the slices of every
//! key due at once go in one pipeline, one round trip however many keys.
//!
//! In Redis a key's value carries its leases beside its debt (`lua/gcra_state.lua`). The rule
//! that makes leases exact: **a slice's tokens are withheld from everyone else when it is taken,
//! but debited only when it is given back (what was spent, as spent now) or when it expires
//! (all of it, as spent now).** Per-request decisions on the key count the held tokens as
//! taken.
//!
//! *Why nothing is ever admitted beyond `capacity + rate·T` over any window of length T.* Write
//! G for the bucket's level (capacity less the debt), H for the tokens all leases hold, S for
//! those their holders have not spent. The free tokens are `G − H`, and the tokens anyone could
//! still admit without waiting for time are `X = (G − H) + S ≤ G ≤ capacity`, since `S ≤ H`.
//! Taking a slice moves tokens from free to S; spending one lowers S; giving a slice back
//! debits what was spent (G falls by it) and frees what was not (H falls by the whole slice):
//! X is unchanged, or falls. A lease that expires (its holder crashed, or lost the answer) is
//! debited whole: G and H fall alike, X falls by what its holder had left. So X rises only as
//! G refills, at the rate, and every admission lowers it by one: the admissions in `[a, b]`
//! are at most `X(a) + rate·(b − a) ≤ capacity + rate·(b − a)`. Had the slice been debited
//! when taken, the bucket would refill behind a slice that is still to be spent, and a
//! gateway spending its slice late, next to another taking the refilled bucket, would exceed
//! the bound by the slice: the property test `tests/lease_redis.rs` catches exactly that.
//!
//! The price is under-admission: tokens held and not yet spent are free to nobody else, and a
//! crashed gateway's slice is lost until it expires. At any moment it is at most the slices
//! held (gateways × the ceiling), and it is recovered when they are given back or expire.
//! The window algorithms keep no bucket to slice, and refuse leases.
//!
//! On a leased key, a decision's `remaining` is this process's unspent slice plus the free
//! tokens Redis reported when the slice was taken: an estimate, never a promise. A denial comes
//! from Redis (no slice could be had), with the time until one token is free were every lease
//! to stay held.
//!
//! # Waiting
//!
//! [`Store::acquire`](crate::store::Store::acquire) waits in a per-key FIFO queue of this process
//! (depth and maximum wait from the config, or from the latest
//! [`RedisStore::reconfigure`]), re-asking Redis when the `retry_after` it returned
//! has passed. The order is first come, first served within one process, not across processes:
//! waiters of several servers compete for the same tokens when they come back.

mod at;
mod cache;
mod config;
mod deferred;
mod lease;
mod leased;
mod link;
mod overrides;
mod queue;
mod script;
mod sentinel;
mod settle;
mod store;

pub use config::{OnError, RedisConfig, RedisStoreError};
pub use lease::{LeaseConfig, LeaseSize};
pub(crate) use link::{validate, Conn};
pub(crate) use script::Program;
pub use store::RedisStore;
