//! The write-back: the writer thread, each write (a snapshot of the table replacing the file
//! atomically and durably) and the lease it renews, which every admission checks
//! ([`Inner::confirm`]) so that an admission is either in the next write or refused.
//!
//! Writes the state file and nothing else; reads nothing back (a store never reads its own
//! file after it opened it).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

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
    }
}

impl Inner {
    /// After the table admitted `cost`: is this admission covered by the file? Checked after
    /// the update, so that an admission is either in the next write or refused.
    #[inline]
    pub(super) fn confirm(&self, cost: u64) -> Result<(), Error> {
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
