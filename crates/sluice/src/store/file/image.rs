//! The file's contents ([`Image`], format version 2; version 1 is still read) and reading it
//! back: [`read`] refuses a file that is not a snapshot this build can use, naming what is
//! wrong, rather than start full (a burst) or empty (a hidden fault).
//!
//! Owns the format. Decides nothing about restoring (that is `restore`'s) and writes nothing
//! (that is `writer`'s).

use std::fs;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota, Rate, SavedState};

use crate::keyed::Saved;
use crate::store::file::FileStoreError;

pub(super) const FORMAT: &str = "sluice-file-store";
pub(super) const VERSION: u32 = 2;
/// The first format, without the records of evicted keys and the floor: still read.
const VERSION_1: u32 = 1;

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Image {
    pub(super) format: String,
    pub(super) version: u32,
    pub(super) algorithm: Kind,
    pub(super) capacity: u64,
    pub(super) interval_ns: u64,
    pub(super) write_interval_ms: u64,
    pub(super) written_at_unix_ms: u64,
    pub(super) lease_until_unix_ms: u64,
    pub(super) clean: bool,
    pub(super) keys: Vec<Entry>,
    /// Busy keys evicted for room, each with the emptiest state it may come back with.
    #[serde(default)]
    pub(super) evicted: Vec<Entry>,
    /// A bound on every key not in `keys` (after a crash, or merged eviction records).
    #[serde(default)]
    pub(super) floor: Option<SavedState>,
    /// Keys with a quota of their own (set through [`FileStore::set_override`]), each with
    /// its state under that quota when it is not idle. Read by older builds as absent.
    ///
    /// [`FileStore::set_override`]: crate::store::FileStore::set_override
    #[serde(default)]
    pub(super) overrides: Vec<OverrideEntry>,
}

/// A key's own quota, and its state under it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct OverrideEntry {
    pub(super) key: String,
    pub(super) algorithm: Kind,
    pub(super) capacity: u64,
    pub(super) interval_ns: u64,
    #[serde(default)]
    pub(super) state: Option<SavedState>,
}

impl OverrideEntry {
    pub(super) fn algorithm(&self) -> Option<AnyAlgorithm> {
        let quota = Rate::from_interval_ns(self.interval_ns)
            .and_then(|rate| Quota::new(self.capacity, rate))
            .ok()?;
        Some(AnyAlgorithm::new(self.algorithm, quota))
    }

    pub(super) fn of(key: String, algorithm: AnyAlgorithm, state: Option<SavedState>) -> Self {
        let quota = algorithm.quota();
        OverrideEntry {
            key,
            algorithm: algorithm.kind(),
            capacity: quota.capacity(),
            interval_ns: quota.interval_ns(),
            state,
        }
    }
}

impl Image {
    /// The algorithm and quota its states were written under (`read` checked that it is one).
    pub(super) fn algorithm(&self) -> Option<AnyAlgorithm> {
        let quota = Rate::from_interval_ns(self.interval_ns)
            .and_then(|rate| Quota::new(self.capacity, rate))
            .ok()?;
        Some(AnyAlgorithm::new(self.algorithm, quota))
    }

    /// What it holds, as the table exports it.
    pub(super) fn saved(&self, algorithm: AnyAlgorithm) -> Saved<String, AnyAlgorithm> {
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
            // `read` checked every one.
            overrides: self
                .overrides
                .iter()
                .filter_map(|o| Some((o.key.clone(), o.algorithm()?, o.state.clone())))
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Entry {
    pub(super) key: String,
    pub(super) state: SavedState,
}

/// Reads and checks the file; `Ok(None)` if there is none.
pub(super) fn read(path: &Path) -> Result<Option<Image>, FileStoreError> {
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
    for o in &image.overrides {
        let Some(own) = o.algorithm() else {
            return Err(corrupt(format!(
                "key `{}`: its own quota (capacity {}, interval {} ns) is not one",
                o.key, o.capacity, o.interval_ns
            )));
        };
        if let Some(state) = &o.state {
            own.restore(state, 0, 0)
                .map_err(|e| corrupt(format!("key `{}`: {e}", o.key)))?;
        }
    }
    if let Some(floor) = &image.floor {
        its_algorithm
            .restore(floor, 0, 0)
            .map_err(|e| corrupt(format!("its floor: {e}")))?;
    }
    Ok(Some(image))
}
