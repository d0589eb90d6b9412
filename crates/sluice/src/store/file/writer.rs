//! The write-back: the writer thread, each write (a snapshot of the table replacing the file
//! atomically and durably) and the lease it renews, which every admission checks
//! ([`Inner::confirm`]) so that an admission is either in the next write or refused. A check
//! that finds the lease out while the writer is sound waits for its renewal ([`Renewed`]): the
//! process was not running, which is no reason to refuse.
//!
//! Writes the state file and nothing else; reads nothing back (a store never reads its own
//! file after it opened it).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use sluice_core::{Algorithm, SavedState};

use crate::error::Error;
use crate::store::file::image::{Entry, Image, FORMAT, VERSION};
use crate::store::file::{ms, nanos, unix_ms, FileStore, FileStoreError, Inner};

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
    /// Writes the file once (so that a crash right after this is a crash of this process)
    /// and starts the writer thread.
    pub(super) fn start(&self) -> Result<(), FileStoreError> {
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
        inner.renewed.wake();
    }
}

/// Wakes the checks that wait for the writer: after each write, whatever its outcome, and at
/// close. One signal for the checks that wait on their thread, one for those that await.
#[derive(Debug, Default)]
pub(super) struct Renewed {
    turn: Mutex<()>,
    threads: Condvar,
    tasks: tokio::sync::Notify,
}

impl Renewed {
    pub(super) fn wake(&self) {
        // Taken and let go, so that a thread that saw the old lease under it is waiting now.
        drop(self.turn.lock());
        self.threads.notify_all();
        self.tasks.notify_waiters();
    }
}

/// How a check that finds the lease out takes a failing disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Patience {
    /// Refused at once while the disk is known to fail (a write failed, or one was judged
    /// stalled): a request that was not going to wait.
    Now,
    /// Waits up to D for a write all the same: a queued request, whose refusal gives its token
    /// to the next in line. Refused at once, each would hand it on to the next, and the whole
    /// queue would be refused in a moment by a disk that may be back within D; waiting, the
    /// queue is refused at most one request per D while the disk fails.
    Queued,
}

impl Inner {
    /// After the table admitted `cost` for `key`: is this admission covered by the file?
    /// Checked after the update, so that an admission is either in the next write or refused;
    /// refused, it is given back. When the lease is out while the writer is sound (this
    /// process was not running), waits on this thread for its renewal, at most D.
    #[inline]
    pub(super) fn confirm(&self, key: &str, cost: u64) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let at = nanos(self.base.elapsed());
        match self.covers(at, Patience::Now) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(self.refused(key, cost, self.keyed.now_ns(), e)),
            None => self.wait_on_thread(key, cost, at),
        }
    }

    /// [`Inner::confirm`] for a task: the wait for the renewal does not block the thread.
    #[inline]
    pub(super) async fn confirm_async(
        &self,
        key: &str,
        cost: u64,
        patience: Patience,
    ) -> Result<(), Error> {
        if cost == 0 {
            return Ok(());
        }
        let at = nanos(self.base.elapsed());
        match self.covers(at, patience) {
            Some(Ok(())) => Ok(()),
            Some(Err(e)) => Err(self.refused(key, cost, self.keyed.now_ns(), e)),
            None => self.wait_in_task(key, cost, at, patience).await,
        }
    }

    /// The lease's answer for an admission made before `at`, once it has one: covered, or
    /// refused (a closed store; with [`Patience::Now`], a failing or stalled disk). `None`:
    /// the lease is out and the next write will tell; with no write failed, the writer may
    /// just not have run (this process was stopped). Closed is read first: an admission that
    /// finds the store open is in its clean file.
    #[inline]
    fn covers(&self, at: u64, patience: Patience) -> Option<Result<(), Error>> {
        if self.closed.load(Ordering::SeqCst) {
            return Some(Err(Error::Closed));
        }
        if at < self.lease_until_ns.load(Ordering::Acquire) {
            return Some(Ok(()));
        }
        if patience == Patience::Now && self.failing.load(Ordering::Relaxed) {
            return Some(Err(self.unavailable()));
        }
        None
    }

    fn unavailable(&self) -> Error {
        Error::Unavailable {
            retry_after: self.write_interval,
        }
    }

    #[cold]
    fn wait_on_thread(&self, key: &str, cost: u64, at: u64) -> Result<(), Error> {
        let taken = self.keyed.now_ns();
        let deadline = Instant::now() + self.write_interval;
        let mut turn = self.renewed.turn.lock();
        loop {
            if let Some(answer) = self.covers(at, Patience::Now) {
                drop(turn);
                return answer.map_err(|e| self.refused(key, cost, taken, e));
            }
            if self
                .renewed
                .threads
                .wait_until(&mut turn, deadline)
                .timed_out()
            {
                drop(turn);
                return self.waited_out(key, cost, at, taken);
            }
        }
    }

    #[cold]
    async fn wait_in_task(
        &self,
        key: &str,
        cost: u64,
        at: u64,
        patience: Patience,
    ) -> Result<(), Error> {
        let taken = self.keyed.now_ns();
        let deadline = tokio::time::Instant::now() + self.write_interval;
        loop {
            let renewed = self.renewed.tasks.notified();
            let mut renewed = std::pin::pin!(renewed);
            // Registered before the lease is read again: a write completing in between wakes it.
            renewed.as_mut().enable();
            if let Some(answer) = self.covers(at, patience) {
                return answer.map_err(|e| self.refused(key, cost, taken, e));
            }
            if tokio::time::timeout_at(deadline, renewed).await.is_err() {
                return self.waited_out(key, cost, at, taken);
            }
        }
    }

    /// D has passed without a write that covers the admission: the disk holds a write for
    /// longer than D (a writer that was only stopped would have written by now), or fails.
    /// Judged failing until a write completes (the writer's next success clears it, and says
    /// so), so that the checks after this one refuse at once instead of waiting.
    fn waited_out(&self, key: &str, cost: u64, at: u64, taken: u64) -> Result<(), Error> {
        if let Some(answer) = self.covers(at, Patience::Queued) {
            return answer.map_err(|e| self.refused(key, cost, taken, e));
        }
        if !self.failing.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                path = %self.path.display(),
                waited = ?self.write_interval,
                "limit store file write has not completed: refusing (503) until a write completes"
            );
        }
        Err(self.refused(key, cost, taken, self.unavailable()))
    }

    /// Gives back an admission the lease refused (taken at `taken` on the table's clock), so
    /// that a refused request spends nothing. A closed store keeps it: its clean file is
    /// written, or being written, with it.
    #[cold]
    fn refused(&self, key: &str, cost: u64, taken: u64, e: Error) -> Error {
        if matches!(e, Error::Unavailable { .. }) {
            let ago = Duration::from_nanos(self.keyed.now_ns().saturating_sub(taken));
            self.keyed.refund(key, cost, ago);
        }
        e
    }

    pub(super) fn write(&self, clean: bool) -> Result<(), FileStoreError> {
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
            overrides: saved
                .overrides
                .into_iter()
                .map(|(key, own, state)| super::image::OverrideEntry::of(key, own, state))
                .collect(),
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

    pub(super) fn close(&self) -> Result<(), FileStoreError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.renewed.wake();
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
