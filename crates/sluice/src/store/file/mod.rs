//! [`FileStore`]: keyed limits in memory, written back to a local file, restored at start
//! without a burst.
//!
//! # Write-back and D
//!
//! The limits live in an in-memory [`Keyed`] table, exactly as in the
//! [`MemoryStore`](crate::store::MemoryStore). A writer thread replaces the file every D/2
//! (D = [`FileStoreOptions::write_interval`], default **100 ms**) with a snapshot of every key
//! that is not idle, atomically: write `<file>.tmp`, fsync it, rename it over the file, fsync
//! the directory. Each write also renews a **lease**: the store admits only while less than D
//! has passed since the start of the last completed write; past that (a stalled disk, a full
//! disk) it refuses with [`Error::Unavailable`] until a write succeeds, and a refused request
//! spends no token (its admission is given back). Writes start every D/2 counted from the start
//! of the previous one (not from its end), so the lease holds as long as each write takes less
//! than D/2: a disk that cannot replace a small file in D/2 (50 ms by default) needs a larger
//! D. A failed write is logged once (warn), and so is the first write that succeeds after it
//! (info).
//!
//! A lease can also run out because the process itself was not running: stopped (SIGSTOP),
//! its VM paused or migrated, starved of CPU. When it runs again its requests may be decided
//! before its writer has had a turn, and the disk is fine. So a check that finds the lease out
//! while no write has failed waits for the writer's renewal: a writer that was merely not
//! running renews within D of running again (the write in progress, then the one it owes, each
//! under D/2). The check waits at most D, without blocking its thread ([`FileStore::check_now`]
//! blocks); a write still unfinished then is a stalled disk, logged once (warn), and every
//! check refuses at once until a write completes, except a queued request's
//! ([`Store::acquire`]), which waits up to D for a write whatever the disk's state: refused at
//! once, each would hand its token to the next in line and the whole queue would be refused in
//! a moment. Nothing is admitted outside a lease: an admission made while the lease was out
//! stands only once a write whose lease covers it (one started after it, or less than D before
//! it) has completed.
//!
//! The file records the lease end as `written_at + 2D` (one D of margin for the last in-flight
//! decision and for the wall clock against the monotonic one). So a crash loses at most the
//! last D of consumption, and no admission is ever later than the lease end in the file.
//!
//! # The restore rule
//!
//! At [`FileStore::open`], with `r` the wall-clock time now:
//!
//! - **No file**: a fresh start, every key full.
//! - **Clean file** (written by [`FileStore::close`], or by dropping the last handle): nothing
//!   was admitted after it was written, so every saved key is restored exactly, its time
//!   counted from `written_at` to `r`; keys not in it were idle, hence full, unless they were
//!   evicted busy at the key cap: the file keeps those keys with the emptiest state each may
//!   come back with, and the next table remembers them again.
//! - **Any other file** (the process died): every key, **whether in the file or not**, starts
//!   as if it had spent everything at `e = min(lease_end, r)`, i.e.
//!   [`Algorithm::exhausted_state`](sluice_core::Algorithm::exhausted_state) at `e`, advanced
//!   to now: a floor under every key of the table ([`Keyed::set_floor`]), which holds for keys
//!   evicted and brought back as for any other. This lasts until `e + W` (W = capacity ×
//!   interval), after which every key is full anyway.
//!
//! Why every key: the lost consumption (after the last write) can be any key's, including
//! keys the file has never seen, and it can be a whole burst in a microsecond. Only the
//! worst case is safe, and it is the same for all keys. After a crash the saved states add
//! nothing to it; they are what makes a clean restart exact.
//!
//! **The bound.** For the bucket algorithms (token bucket, GCRA, leaky bucket): any window
//! `[t - T, t]` spanning the restart admits at most `capacity + rate·T`. Before the crash the
//! algorithm itself admitted at most `capacity + rate·(c - (t - T))` in `[t - T, c]`, where `c ≤
//! e` is the last admission. After the restart the key starts empty at `e` and admits at most
//! `rate·(t - e)`. The sum is `capacity + rate·(T - (e - c)) ≤ capacity + rate·T`. For the
//! window algorithms: nothing is admitted after the restart until the restored window from `e`
//! drains (sliding log: until `e + W`, so no window of length W holds admissions from both
//! sides of the crash; fixed and sliding window: their usual bound over any window W, N and
//! below 2N, with the windows restarted at `e`). A wall clock that jumps forward while the
//! process is down shortens the wait, as for any snapshot; one that goes back lengthens it.
//!
//! A file written under another quota or algorithm is converted key by key so that no key
//! gains tokens ([`sluice_core::SavedState::convert`]), its records and floor too.
//!
//! # Reloads
//!
//! The store is the one owner of its keys' state: [`FileStore::reconfigure`] converts every
//! key, record and floor in place under each shard's lock, the requests waiting stay queued,
//! and the next write records the new quota with the converted states. No second store ever
//! writes the file or admits beside this one. The file's path and the write interval D are
//! fixed for the store's life.
//!
//! # A corrupt or foreign file
//!
//! A file that exists but cannot be read (not JSON, another format or version, impossible
//! values) makes [`FileStore::open`] fail with [`FileStoreError::Corrupt`], naming the file and
//! the problem: starting full would allow a burst, and starting empty would hide the problem
//! until someone asks why everything is refused. To start anyway, move the file away: that is a
//! fresh start (and so, knowingly, a possible burst).
//!
//! # One process per file, its owner's only
//!
//! Two processes would overwrite each other's writes, so [`FileStore::open`] takes an exclusive
//! lock (`flock`) on `<file>.lock`, where it writes its process id, and a second process is
//! refused with [`FileStoreError::Locked`], naming the file and the holder's pid. The lock is
//! released when the process's last store on the file is gone (or the process dies); stores of
//! one process share it. The file, its temporary file and the lock file are created with mode
//! 0600: the keys may be client addresses or credentials.
//!
//! # Format
//!
//! JSON: `{"format": "sluice-file-store", "version": 2, "algorithm", "capacity",
//! "interval_ns", "write_interval_ms", "written_at_unix_ms", "lease_until_unix_ms", "clean",
//! "keys": [{"key", "state": <sluice_core::SavedState>}], "evicted": [{"key", "state"}],
//! "floor": <SavedState> or null}`, every state under the file's own algorithm and quota.
//! Version 1 (without `evicted` and `floor`) is still read; an older build refuses version 2
//! as a foreign format rather than lose the records.

// The rooms: the options (`options`) and errors (`error`) callers see, the file's format and
// how it is read back (`image`), the lock that keeps one process per file (`lock`), what an
// open restores (`restore`), and the writer thread with the lease it renews (`writer`). The
// handle, the state its clones share and the checks live here.

mod error;
mod image;
mod lock;
mod options;
mod restore;
mod writer;

pub use error::FileStoreError;
pub use options::{FileStoreOptions, DEFAULT_WRITE_INTERVAL};
pub use restore::Restored;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use sluice_core::{AnyAlgorithm, Decision};

use crate::error::Error;
use crate::keyed::{queue_limits, Keyed};
use crate::limiter::AcquireOptions;
use crate::store::Store;

use lock::Lock;
use options::Hook;
use writer::{Patience, Renewed};

/// Keyed limits that survive a restart: in memory, written back to a local file every D/2.
/// Clones share the table and the file.
///
/// See the [module documentation](crate::store::file) for D, the restore rule and its bound.
///
/// # Examples
///
/// ```
/// use sluice::store::{FileStore, FileStoreOptions, Store};
/// use sluice_core::{AnyAlgorithm, Kind, Quota};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("sluice-doc-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let path = dir.join("limits.json");
/// let alg = AnyAlgorithm::new(Kind::Gcra, Quota::parse(2, "1/min")?);
/// let store = FileStore::open(&path, alg, FileStoreOptions::default())?;
/// assert!(store.check("alice", 2).await.is_ok());
/// store.close()?; // a clean file: the next open restores alice exactly
///
/// let store = FileStore::open(&path, alg, FileStoreOptions::default())?;
/// assert!(store.check("alice", 1).await.is_err()); // still spent: no burst after a restart
/// # store.close()?;
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FileStore {
    inner: Arc<Inner>,
    /// Held by the handles only. The writer thread holds the store weakly but upgrades it
    /// for each write, so the last `Arc<Inner>` may be the writer's; the last handle closes
    /// the store on its own thread instead, so that the clean file is written before its
    /// drop returns.
    _handles: Arc<LastHandle>,
}

#[derive(Debug)]
struct LastHandle(Arc<Inner>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        let _ = self.0.close();
    }
}

impl FileStore {
    fn from_inner(inner: Arc<Inner>) -> FileStore {
        let _handles = Arc::new(LastHandle(Arc::clone(&inner)));
        FileStore { inner, _handles }
    }
}

#[derive(Debug)]
struct Inner {
    /// The one owner of the state: a reload changes it in place ([`FileStore::reconfigure`]).
    keyed: Keyed<String, AnyAlgorithm>,
    path: PathBuf,
    write_interval: Duration,
    /// Real time, for the lease: admissions are allowed while `base.elapsed() < lease_until`.
    base: Instant,
    lease_until_ns: AtomicU64,
    /// When the last write started (as `lease_until_ns`): the writer's schedule.
    last_write_ns: AtomicU64,
    /// Whether the last write failed, or one was judged stalled (health changes are logged
    /// once each).
    failing: AtomicBool,
    closed: AtomicBool,
    /// Wakes the checks waiting for the writer ([`Inner::confirm`]) after each write.
    renewed: Renewed,
    restored: Restored,
    /// This process's lock on the file; one write at a time through it, and none after the
    /// clean one.
    lock: Arc<Lock>,
    stop: Arc<(Mutex<bool>, Condvar)>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    last_error: Mutex<Option<String>>,
    before_write: Option<Hook>,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl FileStore {
    /// Changes the algorithm (its quota, or another algorithm), the key cap and the queue in
    /// place ([`Keyed::reconfigure`]): every key, every record of an evicted key and the
    /// floor are converted under their shard's lock so that none gains tokens, requests
    /// waiting stay queued and are admitted under the new quota, and the next write records
    /// the new quota with the converted states. The write interval D stays as opened.
    /// Returns the keys converted.
    pub fn reconfigure(&self, algorithm: AnyAlgorithm, options: &FileStoreOptions) -> usize {
        let converted = self.inner.keyed.reconfigure(
            algorithm,
            options.max_keys,
            queue_limits(options.queue_depth, options.max_wait),
        );
        crate::store::own_quota::follow_kind(&self.inner.keyed);
        converted
    }

    /// Gives `key` a quota of its own (`None`: the store's again), converting its state in
    /// place so that it gains no tokens. Written to the file with the key's state (the next
    /// write, within D/2), so it survives a restart. Returns the key's previous quota.
    pub fn set_override(
        &self,
        key: &str,
        quota: Option<sluice_core::Quota>,
    ) -> Option<sluice_core::Quota> {
        crate::store::own_quota::set(&self.inner.keyed, key, quota)
    }

    /// Every key with a quota of its own, sorted by key.
    pub fn overrides(&self) -> Vec<(String, sluice_core::Quota)> {
        crate::store::own_quota::list(&self.inner.keyed)
    }

    /// What the open found.
    pub fn restored(&self) -> Restored {
        self.inner.restored
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The table.
    pub fn keyed(&self) -> &Keyed<String, AnyAlgorithm> {
        &self.inner.keyed
    }

    /// Why the last write failed, if it did (the store refuses while its lease is out).
    pub fn last_error(&self) -> Option<String> {
        self.inner.last_error.lock().clone()
    }

    /// Writes the file now (and renews the lease).
    ///
    /// # Errors
    ///
    /// [`FileStoreError::Io`].
    pub fn flush(&self) -> Result<(), FileStoreError> {
        let result = self.inner.write(false);
        self.inner.renewed.wake();
        result
    }

    /// Stops admitting ([`Error::Closed`] from now on), stops the writer and writes the final,
    /// clean file that the next open restores exactly. Idempotent. Dropping the last handle
    /// does the same, ignoring errors.
    ///
    /// # Errors
    ///
    /// [`FileStoreError::Io`]: the file then stays as last written, unclean, and the next open
    /// applies the crash rule.
    pub fn close(&self) -> Result<(), FileStoreError> {
        self.inner.close()
    }

    /// The same check, without the future: when the lease has run out while the writer is
    /// sound (this process was stopped), it waits on this thread for the writer's renewal, at
    /// most D ([`Store::check`] waits without blocking the thread).
    ///
    /// # Errors
    ///
    /// As [`Store::check`], and [`Error::Unavailable`] while the file cannot be written (a
    /// refused check spends no token), [`Error::Closed`] after [`FileStore::close`].
    pub fn check_now(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let decision = inner.keyed.try_acquire(key, cost)?;
        inner.confirm(key, cost)?;
        Ok(decision)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Store for FileStore {
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let decision = inner.keyed.try_acquire(key, cost)?;
        inner.confirm_async(key, cost, Patience::Now).await?;
        Ok(decision)
    }

    async fn acquire(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<Decision, Error> {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let decision = inner.keyed.acquire(key, cost, options).await?;
        inner.confirm_async(key, cost, Patience::Queued).await?;
        Ok(decision)
    }

    async fn peek(&self, key: &str) -> Result<Decision, Error> {
        Ok(self.inner.keyed.peek(key))
    }

    async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        self.inner.keyed.refund(key, cost, ago);
    }

    async fn charge(&self, key: &str, cost: u64, max_debt: u64) -> u64 {
        // Taken like an admission: a crash loses at most what `max_loss` allows, and the
        // next snapshot carries it.
        let inner = &*self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return cost;
        }
        inner.keyed.charge(key, cost, max_debt)
    }

    fn hottest(&self, n: usize) -> Vec<(String, Decision)> {
        self.inner.keyed.hottest(n)
    }
}
