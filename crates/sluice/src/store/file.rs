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
//! disk) it refuses with [`Error::Unavailable`] until a write succeeds. Writes start every D/2
//! counted from the start of the previous one (not from its end), so the lease holds as long
//! as each write takes less than D/2: a disk that cannot replace a small file in D/2 (50 ms
//! by default) needs a larger D. A failed write is logged once (warn), and so is the first
//! write that succeeds after it (info). The file records the
//! lease end as `written_at + 2D` (one D of margin for the last in-flight decision and for the
//! wall clock against the monotonic one). So a crash loses at most the last D of consumption,
//! and no admission is ever later than the lease end in the file.
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
//!   [`Algorithm::exhausted_state`] at `e`, advanced to now: a floor under every key of the
//!   table ([`Keyed::set_floor`]), which holds for keys evicted and brought back as for any
//!   other. This lasts until `e + W` (W = capacity × interval), after which every key is full
//!   anyway.
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

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use sluice_core::{Algorithm, AnyAlgorithm, Decision, Kind, Quota, Rate, SavedState};

use crate::error::Error;
use crate::keyed::{queue_limits, Keyed, Saved};
use crate::limiter::AcquireOptions;
use crate::store::Store;

const FORMAT: &str = "sluice-file-store";
const VERSION: u32 = 2;
/// The first format, without the records of evicted keys and the floor: still read.
const VERSION_1: u32 = 1;

/// The default write interval D: a crash loses at most this much consumption.
pub const DEFAULT_WRITE_INTERVAL: Duration = Duration::from_millis(100);

/// Something run by the writer before each write (see [`FileStoreOptions::before_write`]).
#[derive(Clone)]
struct Hook(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl PartialEq for Hook {
    fn eq(&self, other: &Hook) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Hook {}

/// How a [`FileStore`] keeps its table and its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStoreOptions {
    write_interval: Duration,
    max_keys: usize,
    queue_depth: usize,
    max_wait: Duration,
    before_write: Option<Hook>,
}

impl Default for FileStoreOptions {
    fn default() -> FileStoreOptions {
        FileStoreOptions {
            write_interval: DEFAULT_WRITE_INTERVAL,
            max_keys: 100_000,
            queue_depth: 0,
            max_wait: Duration::ZERO,
            before_write: None,
        }
    }
}

impl FileStoreOptions {
    /// D: the file is rewritten every D/2, and a crash loses at most D of consumption
    /// (default 100 ms, at least 2 ms).
    pub fn write_interval(mut self, d: Duration) -> FileStoreOptions {
        self.write_interval = d.max(Duration::from_millis(2));
        self
    }

    /// The most keys held (default 100,000).
    pub fn max_keys(mut self, max_keys: usize) -> FileStoreOptions {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Up to `depth` waiters per key, each waiting at most `max_wait`, for
    /// [`Store::acquire`]. Without it `acquire` does not wait.
    pub fn queue(mut self, depth: usize, max_wait: Duration) -> FileStoreOptions {
        self.queue_depth = depth;
        self.max_wait = max_wait;
        self
    }

    /// Runs `hook` at the start of each write, once its time is taken and before the file is
    /// touched: a test stands in for a slow disk with it (a sleep), to check that the
    /// schedule keeps the lease.
    #[doc(hidden)]
    pub fn before_write(mut self, hook: impl Fn() + Send + Sync + 'static) -> FileStoreOptions {
        self.before_write = Some(Hook(Arc::new(hook)));
        self
    }
}

/// A file store could not open or write its file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileStoreError {
    /// Reading, writing or renaming the file failed.
    #[error("limit store file {path}: cannot {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// Another process has the file open: two would overwrite each other's writes.
    #[error("limit store file {path} is in use by {}: it holds the lock {}; one process per file (stop it, or give this one another path)", holder.map_or_else(|| String::from("another process"), |pid| format!("another process, pid {pid}")), lock.display())]
    Locked {
        /// The file.
        path: PathBuf,
        /// The lock file, `<file>.lock`.
        lock: PathBuf,
        /// The holder's process id, as it wrote it into the lock file.
        holder: Option<u32>,
    },
    /// The file exists but is not a snapshot this build can use.
    #[error("limit store file {path} is unusable: {reason}; move it away to start afresh (every key full)")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// What [`FileStore::open`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// No file: every key full.
    Fresh,
    /// A clean file: `keys` keys restored exactly.
    Clean {
        /// Keys restored.
        keys: usize,
    },
    /// The last process died: every key starts as spent at this wall-clock time.
    Crash {
        /// `e`, in milliseconds since the Unix epoch.
        exhausted_at_unix_ms: u64,
    },
}

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct Image {
    format: String,
    version: u32,
    algorithm: Kind,
    capacity: u64,
    interval_ns: u64,
    write_interval_ms: u64,
    written_at_unix_ms: u64,
    lease_until_unix_ms: u64,
    clean: bool,
    keys: Vec<Entry>,
    /// Busy keys evicted for room, each with the emptiest state it may come back with.
    #[serde(default)]
    evicted: Vec<Entry>,
    /// A bound on every key not in `keys` (after a crash, or merged eviction records).
    #[serde(default)]
    floor: Option<SavedState>,
}

impl Image {
    /// The algorithm and quota its states were written under (`read` checked that it is one).
    fn algorithm(&self) -> Option<AnyAlgorithm> {
        let quota = Rate::from_interval_ns(self.interval_ns)
            .and_then(|rate| Quota::new(self.capacity, rate))
            .ok()?;
        Some(AnyAlgorithm::new(self.algorithm, quota))
    }

    /// What it holds, as the table exports it.
    fn saved(&self, algorithm: AnyAlgorithm) -> Saved<String, AnyAlgorithm> {
        let entries = |list: &[Entry]| {
            list.iter()
                .map(|e| (e.key.clone(), e.state.clone()))
                .collect::<Vec<_>>()
        };
        Saved {
            algorithm,
            keys: entries(&self.keys),
            evicted: entries(&self.evicted),
            floor: self.floor.clone(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    key: String,
    state: SavedState,
}

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
    /// Whether the last write failed (health changes are logged once each).
    failing: AtomicBool,
    closed: AtomicBool,
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

/// What to restore, decided from the file (if any) and the wall clock alone.
#[derive(Debug, PartialEq)]
enum Plan {
    Fresh,
    Clean { elapsed_ms: u64 },
    Crash { e_unix_ms: u64 },
}

fn plan(image: Option<&Image>, now_unix_ms: u64) -> Plan {
    match image {
        None => Plan::Fresh,
        // Written under this or another algorithm and quota: each key is converted so that it
        // gains nothing.
        Some(image) if image.clean => Plan::Clean {
            elapsed_ms: now_unix_ms.saturating_sub(image.written_at_unix_ms),
        },
        Some(image) => Plan::Crash {
            e_unix_ms: image.lease_until_unix_ms.min(now_unix_ms),
        },
    }
}

/// Reads and checks the file; `Ok(None)` if there is none.
fn read(path: &Path) -> Result<Option<Image>, FileStoreError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(FileStoreError::Io {
                path: path.to_owned(),
                action: "read it",
                source,
            })
        }
    };
    let corrupt = |reason: String| FileStoreError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    let image: Image =
        serde_json::from_slice(&bytes).map_err(|e| corrupt(format!("not a snapshot: {e}")))?;
    if image.format != FORMAT {
        return Err(corrupt(format!(
            "format `{}`, expected `{FORMAT}`",
            image.format
        )));
    }
    if image.version != VERSION && image.version != VERSION_1 {
        return Err(corrupt(format!(
            "format version {} (this build reads {VERSION_1} and {VERSION})",
            image.version
        )));
    }
    if image.lease_until_unix_ms < image.written_at_unix_ms {
        return Err(corrupt(String::from(
            "its lease ends before it was written",
        )));
    }
    let quota = Rate::from_interval_ns(image.interval_ns)
        .and_then(|rate| Quota::new(image.capacity, rate))
        .map_err(|e| corrupt(format!("its quota: {e}")))?;
    let its_algorithm = AnyAlgorithm::new(image.algorithm, quota);
    for entry in image.keys.iter().chain(&image.evicted) {
        its_algorithm
            .restore(&entry.state, 0, 0)
            .map_err(|e| corrupt(format!("key `{}`: {e}", entry.key)))?;
    }
    if let Some(floor) = &image.floor {
        its_algorithm
            .restore(floor, 0, 0)
            .map_err(|e| corrupt(format!("its floor: {e}")))?;
    }
    Ok(Some(image))
}

/// The exclusive lock on a state file, held through `<file>.lock` (the state file itself is
/// replaced at every write, so a lock on it would not outlive the first write). The lock
/// file keeps the holder's process id, for the message of the process it turns away; it is
/// left in place when released (removing it would race with the next process locking it).
///
/// The operating system's lock (`flock`) excludes other processes. Within this process the
/// lock is shared by every store on the file (a reload opens the new store before it closes
/// the old one), and so is `writing`, so that their writes never interleave.
#[derive(Debug)]
struct Lock {
    /// The lock file; closing it releases the lock.
    _file: File,
    writing: Mutex<()>,
}

/// The locks this process holds, by canonical lock file path.
static HELD: Mutex<Vec<(PathBuf, Weak<Lock>)>> = Mutex::new(Vec::new());

impl Lock {
    /// Takes the lock on `path`, or shares the one this process holds already.
    fn take(path: &Path) -> Result<Arc<Lock>, FileStoreError> {
        let mut lock_path = path.as_os_str().to_owned();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let io = |action: &'static str| {
            move |source| FileStoreError::Io {
                path: path.to_owned(),
                action,
                source,
            }
        };
        let mut open = fs::OpenOptions::new();
        open.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        let mut file = open
            .open(&lock_path)
            .map_err(io("open its lock file (<file>.lock)"))?;
        let key = fs::canonicalize(&lock_path).unwrap_or_else(|_| lock_path.clone());
        let mut held = HELD.lock();
        held.retain(|(_, lock)| lock.strong_count() > 0);
        if let Some(lock) = held
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, lock)| lock.upgrade())
        {
            return Ok(lock);
        }
        #[cfg(unix)]
        {
            use rustix::fs::{flock, FlockOperation};
            let mut tries = 0;
            loop {
                match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => break,
                    Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                        let mut text = String::new();
                        let _ = io::Read::read_to_string(&mut file, &mut text);
                        let holder: Option<u32> = text.trim().parse().ok();
                        // This process's own last store on the file may be closing its lock
                        // file right now: give it a moment.
                        if holder == Some(std::process::id()) && tries < 100 {
                            tries += 1;
                            io::Seek::rewind(&mut file).map_err(io("read its lock file"))?;
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        return Err(FileStoreError::Locked {
                            path: path.to_owned(),
                            lock: lock_path,
                            holder,
                        });
                    }
                    Err(e) => return Err(io("lock its lock file")(io::Error::from(e))),
                }
            }
        }
        file.set_len(0).map_err(io("write its lock file"))?;
        writeln!(file, "{}", std::process::id()).map_err(io("write its lock file"))?;
        let lock = Arc::new(Lock {
            _file: file,
            writing: Mutex::new(()),
        });
        held.push((key, Arc::downgrade(&lock)));
        Ok(lock)
    }
}

/// Replaces `path` by `bytes` atomically and durably.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), FileStoreError> {
    let io = |action: &'static str| {
        move |source| FileStoreError::Io {
            path: path.to_owned(),
            action,
            source,
        }
    };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut open = fs::OpenOptions::new();
    open.write(true).create(true).truncate(true);
    // The file names keys, which may be client addresses or tokens: its owner's only.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
    let mut file = open.open(&tmp).map_err(io("create its temporary file"))?;
    // A temporary file left by an older process keeps its mode through `open`.
    #[cfg(unix)]
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io("restrict its temporary file to its owner"))?;
    file.write_all(bytes)
        .map_err(io("write its temporary file"))?;
    file.sync_all().map_err(io("fsync its temporary file"))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io("rename the temporary file over it"))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync its directory"))?;
    Ok(())
}

impl FileStore {
    /// Opens (or creates) the file at `path` and restores from it by the rule in the
    /// [module documentation](crate::store::file), then writes it once (so that a crash right
    /// after this is a crash of this process) and starts the writer thread.
    ///
    /// # Errors
    ///
    /// [`FileStoreError::Corrupt`] for a file that exists but cannot be used,
    /// [`FileStoreError::Locked`] when another process has it open,
    /// [`FileStoreError::Io`] when it cannot be read or written.
    pub fn open(
        path: impl AsRef<Path>,
        algorithm: AnyAlgorithm,
        options: FileStoreOptions,
    ) -> Result<FileStore, FileStoreError> {
        let path = path.as_ref().to_owned();
        let lock = Lock::take(&path)?;
        let image = read(&path)?;
        let now_unix_ms = unix_ms();
        let keyed: Keyed<String, AnyAlgorithm> = Keyed::builder(algorithm)
            .max_keys(options.max_keys)
            .queue(options.queue_depth, options.max_wait)
            .build();
        let corrupt = |reason: String| FileStoreError::Corrupt {
            path: path.clone(),
            reason,
        };
        // Every state of the file, converted from the quota it was written under (`read`
        // checked it is one) so that a changed quota gives no key more than it had left.
        let import = |image: &Image| -> Result<usize, FileStoreError> {
            let written_under = image
                .algorithm()
                .ok_or_else(|| corrupt(String::from("its quota")))?;
            let elapsed = now_unix_ms
                .saturating_sub(image.written_at_unix_ms)
                .saturating_mul(1_000_000);
            keyed
                .import_saved(&image.saved(written_under), elapsed)
                .map_err(|e| corrupt(e.to_string()))
        };
        let restored = match (plan(image.as_ref(), now_unix_ms), &image) {
            (Plan::Clean { .. }, Some(image)) => {
                import(image)?;
                Restored::Clean {
                    keys: image.keys.len(),
                }
            }
            (Plan::Crash { e_unix_ms }, Some(image)) => {
                // The lost consumption may be any key's, seen or not: every key starts as
                // spent at `e`. What the file holds can only be emptier still.
                import(image)?;
                let since_e = (now_unix_ms - e_unix_ms).saturating_mul(1_000_000);
                keyed.set_floor(since_e);
                Restored::Crash {
                    exhausted_at_unix_ms: e_unix_ms,
                }
            }
            _ => Restored::Fresh,
        };
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let inner = Arc::new(Inner {
            keyed,
            path,
            write_interval: options.write_interval,
            base: Instant::now(),
            lease_until_ns: AtomicU64::new(0),
            last_write_ns: AtomicU64::new(0),
            failing: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            restored,
            lock,
            stop: Arc::clone(&stop),
            writer: Mutex::new(None),
            last_error: Mutex::new(None),
            before_write: options.before_write.clone(),
        });
        let store = FileStore::from_inner(inner);
        store.start()?;
        Ok(store)
    }

    /// Writes the file once (so that a crash right after this is a crash of this process)
    /// and starts the writer thread.
    fn start(&self) -> Result<(), FileStoreError> {
        let inner = &self.inner;
        inner.write(false)?;
        let weak = Arc::downgrade(inner);
        let stop = Arc::clone(&inner.stop);
        let every = inner.write_interval / 2;
        let handle = std::thread::Builder::new()
            .name(String::from("sluice-file-store"))
            .spawn(move || write_back(weak, stop, every))
            .map_err(|source| FileStoreError::Io {
                path: inner.path.clone(),
                action: "start its writer thread",
                source,
            })?;
        *inner.writer.lock() = Some(handle);
        Ok(())
    }

    /// Changes the algorithm (its quota, or another algorithm), the key cap and the queue in
    /// place ([`Keyed::reconfigure`]): every key, every record of an evicted key and the
    /// floor are converted under their shard's lock so that none gains tokens, requests
    /// waiting stay queued and are admitted under the new quota, and the next write records
    /// the new quota with the converted states. The write interval D stays as opened.
    /// Returns the keys converted.
    pub fn reconfigure(&self, algorithm: AnyAlgorithm, options: &FileStoreOptions) -> usize {
        self.inner.keyed.reconfigure(
            algorithm,
            options.max_keys,
            queue_limits(options.queue_depth, options.max_wait),
        )
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
        self.inner.write(false)
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

    /// The same check, without the future.
    ///
    /// # Errors
    ///
    /// As [`Store::check`], and [`Error::Unavailable`] while the file cannot be written,
    /// [`Error::Closed`] after [`FileStore::close`].
    pub fn check_now(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        let inner = &*self.inner;
        if inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let decision = inner.keyed.try_acquire(key, cost)?;
        inner.confirm(cost)?;
        Ok(decision)
    }
}

/// The writer thread: a write starting every `every` (counted from the start of the last
/// one, so that a slow write does not push the next one back) until stopped or the store is
/// gone. A write that overran its slot is followed at once by the next.
fn write_back(inner: Weak<Inner>, stop: Arc<(Mutex<bool>, Condvar)>, every: Duration) {
    loop {
        let wait = match inner.upgrade() {
            Some(inner) => inner.until_next_write(every),
            None => return,
        };
        {
            let (stopped, wake) = &*stop;
            let mut stopped = stopped.lock();
            if !*stopped && !wait.is_zero() {
                wake.wait_for(&mut stopped, wait);
            }
            if *stopped {
                return;
            }
        }
        let Some(inner) = inner.upgrade() else {
            return;
        };
        // Woken early (a flush moved the schedule): wait for the rest.
        if !inner.until_next_write(every).is_zero() {
            continue;
        }
        let result = inner.write(false);
        inner.record(result);
    }
}

impl Inner {
    /// After the table admitted `cost`: is this admission covered by the file? Checked after
    /// the update, so that an admission is either in the next write or refused.
    #[inline]
    fn confirm(&self, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        if self.closed.load(Ordering::SeqCst) {
            return Err(Error::Closed);
        }
        let now = nanos(self.base.elapsed());
        if now >= self.lease_until_ns.load(Ordering::Acquire) {
            return Err(Error::Unavailable {
                retry_after: self.write_interval,
            });
        }
        Ok(())
    }

    fn write(&self, clean: bool) -> Result<(), FileStoreError> {
        let _one = self.lock.writing.lock();
        if self.closed.load(Ordering::SeqCst) && !clean {
            return Ok(());
        }
        let started = nanos(self.base.elapsed());
        self.last_write_ns.store(started, Ordering::Relaxed);
        let written_at_unix_ms = unix_ms();
        if let Some(hook) = &self.before_write {
            (hook.0)();
        }
        let d = ms(self.write_interval);
        let saved = self.keyed.export();
        let quota = saved.algorithm.quota();
        let entries = |list: Vec<(String, SavedState)>| {
            list.into_iter()
                .map(|(key, state)| Entry { key, state })
                .collect()
        };
        let image = Image {
            format: String::from(FORMAT),
            version: VERSION,
            algorithm: saved.algorithm.kind(),
            capacity: quota.capacity(),
            interval_ns: quota.interval_ns(),
            write_interval_ms: d,
            written_at_unix_ms,
            lease_until_unix_ms: if clean {
                written_at_unix_ms
            } else {
                written_at_unix_ms.saturating_add(2 * d)
            },
            clean,
            keys: entries(saved.keys),
            evicted: entries(saved.evicted),
            floor: saved.floor,
        };
        let bytes = serde_json::to_vec(&image).map_err(|e| FileStoreError::Io {
            path: self.path.clone(),
            action: "encode it",
            source: io::Error::other(e),
        })?;
        write_atomic(&self.path, &bytes)?;
        if !clean {
            self.lease_until_ns.store(
                started.saturating_add(nanos(self.write_interval)),
                Ordering::Release,
            );
        }
        Ok(())
    }

    /// How long until the next periodic write is due.
    fn until_next_write(&self, every: Duration) -> Duration {
        let due = self
            .last_write_ns
            .load(Ordering::Relaxed)
            .saturating_add(nanos(every));
        Duration::from_nanos(due.saturating_sub(nanos(self.base.elapsed())))
    }

    /// Keeps the outcome of a periodic write, logging a change of health once: the first
    /// failure (from then on the store refuses once its lease runs out) and the first success
    /// after failures.
    fn record(&self, result: Result<(), FileStoreError>) {
        match result {
            Ok(()) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        path = %self.path.display(),
                        "limit store file written again: admitting"
                    );
                }
            }
            Err(e) => {
                let message = e.to_string();
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        path = %self.path.display(),
                        error = %message,
                        "limit store file cannot be written: refusing (503) from the end of its lease until a write succeeds"
                    );
                }
                *self.last_error.lock() = Some(message);
            }
        }
    }

    fn close(&self) -> Result<(), FileStoreError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_writer();
        self.write(true)
    }

    fn stop_writer(&self) {
        {
            let (stopped, wake) = &*self.stop;
            *stopped.lock() = true;
            wake.notify_all();
        }
        if let Some(handle) = self.writer.lock().take() {
            if handle.thread().id() != std::thread::current().id() {
                let _ = handle.join();
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Store for FileStore {
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_now(key, cost)
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
        inner.confirm(cost)?;
        Ok(decision)
    }

    async fn peek(&self, key: &str) -> Result<Decision, Error> {
        Ok(self.inner.keyed.peek(key))
    }

    async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        self.inner.keyed.refund(key, cost, ago);
    }

    fn hottest(&self, n: usize) -> Vec<(String, Decision)> {
        self.inner.keyed.hottest(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(clean: bool, kind: Kind) -> Image {
        Image {
            format: String::from(FORMAT),
            version: VERSION,
            algorithm: kind,
            capacity: 10,
            interval_ns: 1_000_000_000,
            write_interval_ms: 100,
            written_at_unix_ms: 1_000_000,
            lease_until_unix_ms: 1_000_200,
            clean,
            keys: Vec::new(),
            evicted: Vec::new(),
            floor: None,
        }
    }

    #[test]
    fn the_plan_follows_the_documented_rule() {
        assert_eq!(plan(None, 5), Plan::Fresh);
        assert_eq!(
            plan(Some(&image(true, Kind::Gcra)), 1_003_000),
            Plan::Clean { elapsed_ms: 3_000 }
        );
        // A clean file of another algorithm is converted key by key too.
        assert_eq!(
            plan(Some(&image(true, Kind::SlidingWindow)), 1_003_000),
            Plan::Clean { elapsed_ms: 3_000 }
        );
        // A crash: spent at the lease end, or now if that is earlier.
        assert_eq!(
            plan(Some(&image(false, Kind::Gcra)), 1_003_000),
            Plan::Crash {
                e_unix_ms: 1_000_200
            }
        );
        assert_eq!(
            plan(Some(&image(false, Kind::Gcra)), 1_000_050),
            Plan::Crash {
                e_unix_ms: 1_000_050
            }
        );
    }

    #[test]
    fn the_worst_case_of_every_algorithm_restores_to_spent() {
        for kind in Kind::ALL {
            let alg = AnyAlgorithm::new(kind, Quota::parse(4, "2/s").unwrap());
            let worst = alg.save(&alg.exhausted_state(0), 0);
            let mut state = alg.restore(&worst, 5_000, 0).unwrap();
            let d = alg.check(&mut state, 5_000, 1).unwrap();
            assert!(!d.allowed, "{kind}: spent at e admits nothing at e");
            let mut later = alg.restore(&worst, 5_000, 2_000_000_000).unwrap();
            assert!(
                alg.check(&mut later, 5_000, 4).unwrap().allowed,
                "{kind}: full one window after e"
            );
        }
    }
}
