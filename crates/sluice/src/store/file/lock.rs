//! One process per file: the exclusive lock on `<file>.lock` ([`Lock`]), holding the holder's
//! process id for the message of the process it turns away, shared by this process's stores on
//! the same file so that their writes never interleave.
//!
//! Owns the lock file only: never reads or writes the state file.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::store::file::FileStoreError;

/// The exclusive lock on a state file, held through `<file>.lock` (the state file itself is
/// replaced at every write, so a lock on it would not outlive the first write). The lock
/// file keeps the holder's process id, for the message of the process it turns away; it is
/// left in place when released (removing it would race with the next process locking it).
///
/// The operating system's lock (`flock`) excludes other processes. Within this process the
/// lock is shared by every store on the file (a reload opens the new store before it closes
/// the old one), and so is `writing`, so that their writes never interleave.
#[derive(Debug)]
pub(super) struct Lock {
    /// The lock file; closing it releases the lock.
    _file: File,
    pub(super) writing: Mutex<()>,
}

/// The locks this process holds, by canonical lock file path.
static HELD: Mutex<Vec<(PathBuf, Weak<Lock>)>> = Mutex::new(Vec::new());

impl Lock {
    /// Takes the lock on `path`, or shares the one this process holds already.
    pub(super) fn take(path: &Path) -> Result<Arc<Lock>, FileStoreError> {
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
