//! How a [`FileStore`](super::FileStore) is set up: the write interval D, the key cap and the
//! queue, as [`FileStoreOptions`].
//!
//! Plain values: nothing here opens, reads or writes a file.

use std::sync::Arc;
use std::time::Duration;

/// The default write interval D: a crash loses at most this much consumption.
pub const DEFAULT_WRITE_INTERVAL: Duration = Duration::from_millis(100);

/// Something run by the writer before each write (see [`FileStoreOptions::before_write`]).
#[derive(Clone)]
pub(super) struct Hook(pub(super) Arc<dyn Fn() + Send + Sync>);

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

/// How a [`FileStore`](super::FileStore) keeps its table and its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStoreOptions {
    pub(super) write_interval: Duration,
    pub(super) max_keys: usize,
    pub(super) queue_depth: usize,
    pub(super) max_wait: Duration,
    pub(super) before_write: Option<Hook>,
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
    /// [`Store::acquire`](crate::store::Store::acquire). Without it `acquire` does not wait.
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
