//! [`FileStoreError`]: why a file store could not open or write its file, naming the file.

use std::io;
use std::path::PathBuf;

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
