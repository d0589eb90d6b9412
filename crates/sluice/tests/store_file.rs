//! The file store: a clean restart restores exactly, a kill -9 restarts without a burst above
//! the documented bound, a corrupt file is refused with the file and the problem named, a
//! store that cannot write its file stops admitting (a stalled write within D, spending no
//! token), and a process that was stopped for longer than D admits again when it runs.

#![cfg(feature = "file")]

mod support;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use sluice::store::{FileStore, FileStoreOptions, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::process::{helper, lines_with, role, unix_ns};
use support::redis::TempDir;

fn gcra(capacity: u64, rate: &str) -> AnyAlgorithm {
    AnyAlgorithm::new(Kind::Gcra, Quota::parse(capacity, rate).unwrap())
}

fn options() -> FileStoreOptions {
    FileStoreOptions::default()
}

#[tokio::test]
async fn a_clean_restart_restores_every_key_exactly() {
    let dir = TempDir::new("file-clean");
    let path = dir.path().join("limits.json");
    let alg = gcra(5, "1/min");
    let store = FileStore::open(&path, alg, options()).unwrap();
    assert_eq!(store.restored(), sluice::store::file::Restored::Fresh);
    store.check("alice", 5).await.unwrap();
    store.check("bob", 2).await.unwrap();
    store.close().unwrap();
    assert!(matches!(store.check("carol", 1).await, Err(Error::Closed)));

    let store = FileStore::open(&path, alg, options()).unwrap();
    assert_eq!(
        store.restored(),
        sluice::store::file::Restored::Clean { keys: 2 }
    );
    assert!(
        store.check("alice", 1).await.is_err(),
        "alice is still spent"
    );
    assert_eq!(store.peek("bob").await.unwrap().remaining, 3);
    assert_eq!(
        store.peek("carol").await.unwrap().remaining,
        5,
        "unknown keys are full"
    );
    // The open already marked the file unclean: a crash now is a crash of this process.
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"clean\":false"), "{text}");
    drop(store); // dropping the last handle closes cleanly too
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"clean\":true"), "{text}");
}

#[tokio::test]
async fn a_changed_quota_keeps_what_each_key_had_left() {
    let dir = TempDir::new("file-quota");
    let path = dir.path().join("limits.json");
    let store = FileStore::open(&path, gcra(100, "1/min"), options()).unwrap();
    store.check("alice", 95).await.unwrap();
    store.check("bob", 10).await.unwrap();
    store.close().unwrap();
    // Restarted with a lower capacity: 5 left, not 0 and not 50.
    let store = FileStore::open(&path, gcra(50, "1/min"), options()).unwrap();
    assert_eq!(store.peek("alice").await.unwrap().remaining, 5);
    assert_eq!(store.peek("bob").await.unwrap().remaining, 50);

    // A reload converts the live keys in place: the same store admits on at once, and its
    // next write records the new quota.
    store.check("bob", 45).await.unwrap();
    store.reconfigure(gcra(10, "1/min"), &options());
    assert_eq!(store.peek("alice").await.unwrap().remaining, 5);
    assert_eq!(store.peek("bob").await.unwrap().remaining, 5);
    assert_eq!(store.peek("carol").await.unwrap().remaining, 10);
    store.check("alice", 5).await.unwrap();
    assert!(store.check("alice", 1).await.is_err());
    store.close().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"capacity\":10"), "{text}");
    let again = FileStore::open(&path, gcra(10, "1/min"), options()).unwrap();
    assert_eq!(again.peek("alice").await.unwrap().remaining, 0);
    // Opened with yet another algorithm and quota: converted, never fuller.
    again.close().unwrap();
    let other = AnyAlgorithm::new(Kind::FixedWindow, Quota::parse(20, "1/min").unwrap());
    let last = FileStore::open(&path, other, options()).unwrap();
    assert_eq!(last.peek("alice").await.unwrap().remaining, 0);
    assert!(last.peek("bob").await.unwrap().remaining <= 5);
}

#[tokio::test]
async fn after_an_unclean_stop_every_key_starts_spent() {
    let dir = TempDir::new("file-unclean");
    let path = dir.path().join("limits.json");
    let alg = gcra(3, "1/min");
    let store = FileStore::open(&path, alg, options()).unwrap();
    store.check("known", 1).await.unwrap();
    store.flush().unwrap();
    // Simulate the crash: keep the unclean file, and forget the store without closing it.
    let unclean = std::fs::read(&path).unwrap();
    std::mem::forget(store);
    std::fs::write(&path, &unclean).unwrap();

    let store = FileStore::open(&path, alg, options()).unwrap();
    assert!(matches!(
        store.restored(),
        sluice::store::file::Restored::Crash { .. }
    ));
    for key in ["known", "never-seen"] {
        let err = store.check(key, 1).await.unwrap_err();
        let Error::Limited { retry_after, .. } = err else {
            panic!("{key}: {err:?}")
        };
        // Spent at most 2D ago: a token is 20 s away, less what passed since.
        assert!(
            retry_after > Duration::from_secs(19),
            "{key}: {retry_after:?}"
        );
    }
    // A reload within the crash's window: keys not seen yet still start spent.
    store.reconfigure(gcra(6, "1/min"), &options());
    assert!(
        store.check("seen-after-the-reload", 1).await.is_err(),
        "no full bucket within the crash's window"
    );
    store.close().unwrap();
}

#[tokio::test]
async fn a_corrupt_file_is_refused_naming_the_file_and_the_problem() {
    let dir = TempDir::new("file-corrupt");
    let path = dir.path().join("limits.json");
    for (content, problem) in [
        ("{not json", "not a snapshot"),
        (
            r#"{"format":"other","version":1,"algorithm":"gcra","capacity":1,"interval_ns":1,"write_interval_ms":100,"written_at_unix_ms":1,"lease_until_unix_ms":2,"clean":true,"keys":[]}"#,
            "format `other`",
        ),
        (
            r#"{"format":"sluice-file-store","version":9,"algorithm":"gcra","capacity":1,"interval_ns":1,"write_interval_ms":100,"written_at_unix_ms":1,"lease_until_unix_ms":2,"clean":true,"keys":[]}"#,
            "version 9",
        ),
        (
            r#"{"format":"sluice-file-store","version":1,"algorithm":"gcra","capacity":1,"interval_ns":1000,"write_interval_ms":100,"written_at_unix_ms":1,"lease_until_unix_ms":2,"clean":true,"keys":[{"key":"k","state":{"form":"window","ends_in_ns":1,"count":1}}]}"#,
            "key `k`",
        ),
    ] {
        std::fs::write(&path, content).unwrap();
        let err = FileStore::open(&path, gcra(1, "1/s"), options()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains(path.to_str().unwrap()), "{text}");
        assert!(text.contains(problem), "{text}");
    }
}

/// Everything logged in this test binary (the file store logs from its writer thread, so a
/// thread's own subscriber would not see it).
fn logs() -> &'static std::sync::Mutex<Vec<u8>> {
    static LOGS: std::sync::OnceLock<&'static std::sync::Mutex<Vec<u8>>> =
        std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let logs: &'static std::sync::Mutex<Vec<u8>> =
            Box::leak(Box::new(std::sync::Mutex::new(Vec::new())));
        tracing_subscriber::fmt()
            .with_writer(move || LogWriter(logs))
            .with_ansi(false)
            .init();
        logs
    })
}

struct LogWriter(&'static std::sync::Mutex<Vec<u8>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_store_that_cannot_write_its_file_stops_admitting() {
    let logs = logs();
    let dir = TempDir::new("file-unwritable");
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let path = sub.join("limits.json");
    // Short enough for a quick test, long enough for a writer thread on a loaded machine.
    let d = Duration::from_millis(200);
    let store = FileStore::open(&path, gcra(1000, "1000/s"), options().write_interval(d)).unwrap();
    store.check("k", 1).await.unwrap();
    std::fs::remove_dir_all(&sub).unwrap();
    tokio::time::sleep(4 * d).await;
    assert!(matches!(
        store.check("k", 1).await,
        Err(Error::Unavailable { .. })
    ));
    assert!(store.last_error().unwrap().contains("limits.json"));
    // Writes succeed again: the next one renews the lease.
    std::fs::create_dir(&sub).unwrap();
    let back = Instant::now();
    while store.check("k", 1).await.is_err() {
        assert!(
            back.elapsed() < Duration::from_secs(2),
            "admitting again once the file is written"
        );
        tokio::time::sleep(d).await;
    }
    store.close().unwrap();
    // One line when the writes start failing, one when they succeed again: not one per write.
    let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let ours: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(path.to_str().unwrap()))
        .collect();
    assert_eq!(ours.len(), 2, "{text}");
    assert!(
        ours[0].contains("WARN") && ours[0].contains("cannot be written"),
        "{text}"
    );
    assert!(
        ours[1].contains("INFO") && ours[1].contains("written again"),
        "{text}"
    );
}

#[test]
fn dropping_the_last_handle_mid_write_closes_before_the_drop_returns() {
    // The writer thread holds the store while it writes. A drop of the last handle at that
    // moment must still stop the writer and leave the clean file before it returns, so that a
    // process exiting right after the drop restores exactly, not by the crash rule.
    let dir = TempDir::new("file-drop-mid-write");
    let path = dir.path().join("limits.json");
    let (entered, writing) = std::sync::mpsc::channel::<()>();
    let entered = std::sync::Mutex::new(entered);
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let arm = std::sync::Arc::clone(&armed);
    // Only the writer thread's writes after the check are slowed, not the open's own.
    let slow = options()
        .write_interval(Duration::from_millis(50))
        .before_write(move || {
            if arm.load(std::sync::atomic::Ordering::SeqCst) {
                let _ = entered.lock().unwrap().send(());
                std::thread::sleep(Duration::from_millis(200));
            }
        });
    let store = FileStore::open(&path, gcra(5, "1/min"), slow).unwrap();
    store.check_now("alice", 2).unwrap();
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    writing
        .recv_timeout(Duration::from_secs(10))
        .expect("the writer starts a write");
    drop(store);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"clean\":true"), "{text}");
}

#[test]
fn writes_slower_than_a_quarter_of_d_keep_the_lease() {
    // Every write takes 0.35 D (a sleep in the writer, as a slow but working disk would): the
    // writer must still renew the lease before it runs out, so nothing is refused. The margin
    // is 0.15 D = 150 ms for the writer thread's wake-ups on a loaded machine.
    let dir = TempDir::new("file-slow-disk");
    let path = dir.path().join("limits.json");
    let d = Duration::from_secs(1);
    let slow = options()
        .write_interval(d)
        .before_write(move || std::thread::sleep(d * 35 / 100));
    let store = FileStore::open(&path, gcra(100_000, "100000/s"), slow).unwrap();
    let start = Instant::now();
    let mut refused = Vec::new();
    let mut admitted = 0;
    while start.elapsed() < Duration::from_millis(3_500) {
        match store.check_now("k", 1) {
            Ok(_) => admitted += 1,
            Err(e) => refused.push((start.elapsed(), e)),
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        refused.is_empty(),
        "{} of {} checks refused on a healthy (slow) disk, first at {:?}: {:?}",
        refused.len(),
        refused.len() + admitted,
        refused[0].0,
        refused[0].1
    );
    store.close().unwrap();
}

/// The writer thread stopped at the start of a write while `held`, as a process stopped
/// mid-write (SIGSTOP, a paused VM) or a disk that keeps the write would stop it.
#[derive(Default)]
struct Freeze {
    held: std::sync::Mutex<bool>,
    thaw: std::sync::Condvar,
    /// The writer is waiting in the hook.
    parked: std::sync::atomic::AtomicBool,
    /// Writes that went past the hook.
    writes: std::sync::atomic::AtomicUsize,
}

impl Freeze {
    fn options(self: &std::sync::Arc<Self>, d: Duration) -> FileStoreOptions {
        let me = std::sync::Arc::clone(self);
        options().write_interval(d).before_write(move || {
            let mut held = me.held.lock().unwrap();
            while *held {
                me.parked.store(true, std::sync::atomic::Ordering::SeqCst);
                held = me.thaw.wait(held).unwrap();
            }
            me.parked.store(false, std::sync::atomic::Ordering::SeqCst);
            me.writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
    }

    /// Holds the writer at its next write and returns once it waits there (this thread, the
    /// test's runtime, is blocked meanwhile, as the whole process would be).
    fn hold(&self) {
        *self.held.lock().unwrap() = true;
        let since = Instant::now();
        while !self.parked.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "the writer never wrote"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lets the writer go, and returns once it has completed a write started after that (the
    /// write after it has started): the lease is renewed.
    fn release_and_renew(&self) {
        let before = self.writes.load(std::sync::atomic::Ordering::SeqCst);
        *self.held.lock().unwrap() = false;
        self.thaw.notify_all();
        let since = Instant::now();
        // The held write, the one it owes (started now), then the next: the second is done.
        while self.writes.load(std::sync::atomic::Ordering::SeqCst) < before + 3 {
            assert!(
                since.elapsed() < Duration::from_secs(10),
                "the writer did not write again"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Lets the writer go when dropped, before the store it holds: a failed assertion must not
/// leave the store's last drop waiting for a held writer.
struct Thaw(std::sync::Arc<Freeze>);

impl Drop for Thaw {
    fn drop(&mut self) {
        *self.0.held.lock().unwrap_or_else(|e| e.into_inner()) = false;
        self.0.thaw.notify_all();
    }
}

/// A process stopped for longer than D (SIGSTOP, a paused VM) finds its lease out on the
/// monotonic clock when it runs again, before its writer has had a turn to renew it: the
/// disk is fine, the process was not running. The requests that queued before the stop get
/// their tokens at once when it ends, and none may be refused for it. The stop is staged
/// within the process: the writer is held at a write and the runtime (tokio's paused clock)
/// is blocked while real time runs past the lease; then tokio's clock jumps as it would, every
/// waiter's token comes due, and they run before the writer is let go, the worst order.
#[tokio::test(start_paused = true)]
async fn a_process_stopped_for_longer_than_d_admits_its_queued_requests_when_it_runs_again() {
    let dir = TempDir::new("file-stopped");
    let path = dir.path().join("limits.json");
    let d = Duration::from_millis(200);
    let freeze = std::sync::Arc::new(Freeze::default());
    let opened = freeze.options(d).queue(16, Duration::from_secs(30));
    let store = FileStore::open(&path, gcra(1, "16/s"), opened).unwrap();
    let _thaw = Thaw(std::sync::Arc::clone(&freeze));
    store.check("k", 1).await.unwrap();
    // 16 waiters for the key's next tokens, due every 1/16 s, and a check on another key.
    let waiters: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .acquire("k", 1, sluice::AcquireOptions::default())
                    .await
            })
        })
        .collect();
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // The stop.
    freeze.hold();
    std::thread::sleep(3 * d);
    // It ends: tokio's clock has moved on as the real one did.
    tokio::time::advance(Duration::from_secs(2)).await;
    let other = {
        let store = store.clone();
        tokio::spawn(async move { store.check("other", 1).await })
    };
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    freeze.release_and_renew();
    let mut refused = Vec::new();
    for (i, waiter) in waiters.into_iter().enumerate() {
        if let Err(e) = waiter.await.unwrap() {
            refused.push((i, e));
        }
    }
    let other = other.await.unwrap();
    assert!(
        refused.is_empty() && other.is_ok(),
        "{} of 16 queued requests refused after the stop: {refused:?}; a check on another key: {other:?}",
        refused.len()
    );
    store.close().unwrap();
}

/// A disk that keeps a write for longer than D is stalled (not a process that was stopped):
/// the store waits at most D for the write, then refuses with `Unavailable` (503), and the
/// refused request spends no token. The checks after it refuse at once until a write
/// completes; then the store admits again.
#[tokio::test]
async fn a_stalled_write_is_refused_within_d_without_spending_a_token() {
    let dir = TempDir::new("file-stalled");
    let path = dir.path().join("limits.json");
    let d = Duration::from_millis(200);
    let freeze = std::sync::Arc::new(Freeze::default());
    let store = FileStore::open(&path, gcra(5, "1/min"), freeze.options(d)).unwrap();
    let _thaw = Thaw(std::sync::Arc::clone(&freeze));
    store.check("k", 1).await.unwrap();
    // The write stalls; its lease (from the write before it) runs out.
    freeze.hold();
    std::thread::sleep(d);
    let start = Instant::now();
    let first = store.check("k", 1).await;
    let waited = start.elapsed();
    let left = store.peek("k").await.unwrap().remaining;
    assert!(matches!(first, Err(Error::Unavailable { .. })), "{first:?}");
    assert_eq!(left, 4, "the refused check spent a token: {left} of 5 left");
    assert!(
        waited >= d * 9 / 10 && waited < 5 * d,
        "refused after {waited:?}: not after waiting D ({d:?}) for the write"
    );
    // Known stalled: the next checks, sync or not, refuse at once, and spend nothing either.
    let start = Instant::now();
    assert!(matches!(
        store.check("k", 1).await,
        Err(Error::Unavailable { .. })
    ));
    assert!(matches!(
        store.check_now("k", 1),
        Err(Error::Unavailable { .. })
    ));
    assert!(start.elapsed() < d / 2, "{:?}", start.elapsed());
    assert_eq!(store.peek("k").await.unwrap().remaining, 4);
    // The disk comes back: the next write renews the lease.
    freeze.release_and_renew();
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 3);
    store.close().unwrap();
}

/// A queued request refused for a stalled write gives its token back, which goes to the next
/// in line: refused at once in turn, the whole queue would be refused in a moment by a disk
/// that is back a little later. Each queued request waits up to D for the write instead, so a
/// stall of about 3 D costs the queue about 3 requests, and the rest are admitted after it.
#[tokio::test]
async fn a_stalled_write_refuses_a_queue_one_request_per_d_not_all_at_once() {
    let dir = TempDir::new("file-stalled-queue");
    let path = dir.path().join("limits.json");
    let d = Duration::from_millis(200);
    let freeze = std::sync::Arc::new(Freeze::default());
    let opened = freeze.options(d).queue(8, Duration::from_secs(30));
    // A token every D: the queue's turns come no faster than its refusals.
    let store = FileStore::open(&path, gcra(1, "5/s"), opened).unwrap();
    let _thaw = Thaw(std::sync::Arc::clone(&freeze));
    store.check("k", 1).await.unwrap();
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .acquire("k", 1, sluice::AcquireOptions::default())
                    .await
            })
        })
        .collect();
    tokio::task::spawn_blocking({
        let freeze = std::sync::Arc::clone(&freeze);
        move || freeze.hold()
    })
    .await
    .unwrap();
    tokio::time::sleep(4 * d).await;
    tokio::task::spawn_blocking({
        let freeze = std::sync::Arc::clone(&freeze);
        move || freeze.release_and_renew()
    })
    .await
    .unwrap();
    let mut refused = 0;
    for waiter in waiters {
        match waiter.await.unwrap() {
            Ok(_) => {}
            Err(Error::Unavailable { .. }) => refused += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(
        (1..=5).contains(&refused),
        "{refused} of 8 queued requests refused by a stall of about 4 D (one per D expected)"
    );
    store.close().unwrap();
}

/// The helper: opens the store at `SLUICE_FILE` and prints `OPENED` or `REFUSED <error>`.
#[test]
fn helper_file_open() {
    if role().is_none() {
        return;
    }
    let path = std::env::var("SLUICE_FILE").unwrap();
    match FileStore::open(&path, gcra(5, "1/s"), options()) {
        Ok(store) => {
            println!("\nOPENED");
            store.close().unwrap();
        }
        Err(e) => println!("\nREFUSED {e}"),
    }
}

#[test]
fn a_second_process_on_the_same_file_is_refused_naming_the_file_and_the_holder() {
    let dir = TempDir::new("file-lock");
    let path = dir.path().join("limits.json");
    let store = FileStore::open(&path, gcra(5, "1/s"), options()).unwrap();
    let second = |role: &str| {
        let out = helper("helper_file_open", role)
            .env("SLUICE_FILE", &path)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let out = second("while-held");
    let refused = lines_with(&out, "REFUSED ")
        .next()
        .unwrap_or_else(|| panic!("the second process opened a file in use: {out}"));
    assert!(refused.contains(path.to_str().unwrap()), "{refused}");
    assert!(
        refused.contains(&format!("pid {}", std::process::id())),
        "{refused}"
    );
    // The same process may open it again (a reload hands a policy over to a new store).
    let again = FileStore::open(&path, gcra(5, "1/s"), options()).unwrap();
    drop(again);
    let out = second("still-held");
    assert!(out.contains("REFUSED "), "{out}");
    // Released with the last store of this process: the next process opens it.
    store.close().unwrap();
    drop(store);
    let out = second("after-close");
    assert!(out.contains("OPENED"), "{out}");
}

#[cfg(unix)]
#[tokio::test]
async fn the_state_file_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("file-mode");
    let path = dir.path().join("limits.json");
    // A file left by an older build with mode 0644 is tightened by the first write.
    let store = FileStore::open(&path, gcra(5, "1/s"), options()).unwrap();
    store.close().unwrap();
    drop(store);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = FileStore::open(&path, gcra(5, "1/s"), options()).unwrap();
    store.check("k", 1).await.unwrap();
    store.flush().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600, "{}", path.display());
    store.close().unwrap();
    assert_eq!(mode(&path), 0o600, "after the clean write");
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let p = entry.unwrap().path();
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
}

// === kill -9 ===

const CAPACITY: u64 = 20;
const RATE: &str = "10/s";
const INTERVAL_NS: u64 = 100_000_000;

/// The helper: opens the store at `SLUICE_FILE`, hammers key `a` (and, on cue, bursts `b`),
/// printing every admission as `ADMIT <key> <unix ns>`.
#[test]
fn helper_file_hammer() {
    let Some(role) = role() else {
        return;
    };
    let path = std::env::var("SLUICE_FILE").unwrap();
    let run_ms: u64 = std::env::var("SLUICE_RUN_MS").unwrap().parse().unwrap();
    let burst_at_ms: Option<u64> = std::env::var("SLUICE_BURST_AT_MS")
        .ok()
        .map(|v| v.parse().unwrap());
    let store = FileStore::open(&path, gcra(CAPACITY, RATE), options()).unwrap();
    // A line of its own: libtest prints the test's name without a line break.
    println!("\nRESTORED {:?}", store.restored());
    let start = Instant::now();
    let mut burst_done = false;
    let mut out = std::io::stdout().lock();
    use std::io::Write;
    while start.elapsed() < Duration::from_millis(run_ms) {
        for key in ["a", "b"] {
            if key == "b" && role == "first" {
                // The first process touches `b` once, with a whole burst, then gets killed.
                match burst_at_ms {
                    Some(at) if !burst_done && start.elapsed() >= Duration::from_millis(at) => {}
                    _ => continue,
                }
                burst_done = true;
                let mut n = 0;
                loop {
                    match store.check_now("b", 1) {
                        Ok(_) => {
                            writeln!(out, "ADMIT b {}", unix_ns()).unwrap();
                            n += 1;
                        }
                        Err(Error::Limited { .. }) => break,
                        // The lease ran out on a loaded machine: the writer catches up.
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                }
                writeln!(out, "BURST {n}").unwrap();
                out.flush().unwrap();
                continue;
            }
            if store.check_now(key, 1).is_ok() {
                writeln!(out, "ADMIT {key} {}", unix_ns()).unwrap();
                out.flush().unwrap();
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    store.close().unwrap();
}

/// Every window between two admissions of one key holds at most capacity + rate·T (+1 for
/// timestamps taken just after the decisions, on another process's clock).
fn assert_bound(key: &str, times: &mut [u64]) {
    times.sort_unstable();
    for i in 0..times.len() {
        for j in i..times.len() {
            let span = times[j] - times[i];
            let count = (j - i + 1) as u64;
            let bound = CAPACITY + span / INTERVAL_NS + 1;
            assert!(
                count <= bound,
                "key {key}: {count} admissions within {span} ns, above the bound {bound}"
            );
        }
    }
}

#[test]
fn kill_9_then_restart_admits_no_burst_above_the_bound() {
    let dir = TempDir::new("file-kill");
    let path = dir.path().join("limits.json");
    let mut first = helper("helper_file_hammer", "first")
        .env("SLUICE_FILE", &path)
        .env("SLUICE_RUN_MS", "60000")
        .env("SLUICE_BURST_AT_MS", "1500")
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let reader = BufReader::new(first.stdout.take().unwrap());
    for line in reader.lines() {
        let line = line.unwrap();
        let burst = line.starts_with("BURST");
        lines.push(line);
        if burst {
            // SIGKILL right after `b`'s burst, before the next write can record it.
            first.kill().unwrap();
            break;
        }
    }
    let _ = first.wait();
    let second = helper("helper_file_hammer", "second")
        .env("SLUICE_FILE", &path)
        .env("SLUICE_RUN_MS", "3000")
        .output()
        .unwrap();
    assert!(second.status.success());
    let second = String::from_utf8(second.stdout).unwrap();
    assert!(second.contains("RESTORED Crash"), "{second}");
    let all: Vec<String> = lines
        .iter()
        .map(String::as_str)
        .chain(second.lines())
        .map(String::from)
        .collect();
    let text = all.join("\n");
    for key in ["a", "b"] {
        let mut times: Vec<u64> = lines_with(&text, &format!("ADMIT {key} "))
            .map(|t| t.parse().unwrap())
            .collect();
        let after: usize = lines_with(&second, &format!("ADMIT {key} ")).count();
        assert!(
            after >= 5,
            "key {key}: the restarted process admitted only {after} in 3 s"
        );
        assert_bound(key, &mut times);
    }
    let burst: u64 = lines_with(&text, "BURST ").next().unwrap().parse().unwrap();
    assert_eq!(burst, CAPACITY, "the first process spent all of b at once");
}
