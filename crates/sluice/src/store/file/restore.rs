//! Opening a store: the restore rule applied to what the file holds ([`Restored`]): a fresh
//! start, a clean file restored exactly, or after a crash every key spent at the lease end.
//!
//! Decides what the table starts from, from the file and the wall clock alone. Reading the
//! file is `image`'s, locking it `lock`'s, and the writes from then on `writer`'s.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use sluice_core::AnyAlgorithm;

use crate::keyed::Keyed;
use crate::store::file::image::{read, Image};
use crate::store::file::lock::Lock;
use crate::store::file::writer::Renewed;
use crate::store::file::{unix_ms, FileStore, FileStoreError, FileStoreOptions, Inner};

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
            renewed: Renewed::default(),
            restored,
            lock,
            stop: Arc::clone(&stop),
            writer: Mutex::new(None),
            last_error: Mutex::new(None),
            before_write: options.before_write.clone(),
        });
        // Keys with a quota of their own, saved under another algorithm kind: under this one.
        crate::store::own_quota::follow_kind(&inner.keyed);
        let store = FileStore::from_inner(inner);
        store.start()?;
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota};

    use super::*;
    use crate::store::file::image::{Image, FORMAT, VERSION};

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
            overrides: Vec::new(),
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
