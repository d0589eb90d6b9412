//! Versioned snapshots of a limiter's state, restorable after a restart without a burst.
//!
//! A snapshot stores every time relative to the moment it was taken, plus the wall-clock time
//! (supplied by the caller: the core has no clock). Restoring subtracts the wall-clock time
//! that passed, so a limiter that was empty at shutdown is still empty after a quick restart,
//! and one that was away long enough is full, never more. A wall clock that went backwards
//! counts as no time passing.

use crate::algorithm::{Algorithm, Kind, SavedState};
use crate::error::SnapshotError;

/// The snapshot format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// A limiter's state, saved.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, Gcra, Quota, Snapshot};
///
/// let gcra = Gcra::new(Quota::parse(10, "1/s").unwrap());
/// let mut state = gcra.initial_state();
/// gcra.check(&mut state, 0, 10).unwrap(); // empty the bucket
///
/// // Saved at wall-clock 1_000_000 ms; the process restarts, its monotonic clock at 5 ns,
/// // 3 s of wall-clock time later.
/// let snap = Snapshot::take(&gcra, &state, 0, 1_000_000);
/// let restored = snap.restore(&gcra, 5, 1_003_000).unwrap();
/// assert_eq!(gcra.check(&mut restored.clone(), 5, 0).unwrap().remaining, 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Snapshot {
    /// [`FORMAT_VERSION`] of the writer.
    pub version: u32,
    /// The algorithm it was taken from.
    pub algorithm: Kind,
    /// The capacity at the time (informational; restore clamps to the current quota).
    pub capacity: u64,
    /// The interval at the time, in nanoseconds (informational).
    pub interval_ns: u64,
    /// Wall-clock time of the snapshot, in milliseconds since the Unix epoch.
    pub taken_at_unix_ms: u64,
    /// The state, times relative to `taken_at_unix_ms`.
    pub state: SavedState,
}

impl Snapshot {
    /// Saves `state` as of monotonic time `now`, stamped with the wall-clock `unix_ms`.
    pub fn take<A: Algorithm>(algorithm: &A, state: &A::State, now: u64, unix_ms: u64) -> Snapshot {
        let quota = algorithm.quota();
        Snapshot {
            version: FORMAT_VERSION,
            algorithm: algorithm.kind(),
            capacity: quota.capacity(),
            interval_ns: quota.interval_ns(),
            taken_at_unix_ms: unix_ms,
            state: algorithm.save(state, now),
        }
    }

    /// Rebuilds the state at monotonic time `now`, wall-clock `unix_ms_now`.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::UnsupportedVersion`], [`SnapshotError::AlgorithmMismatch`] when the
    /// snapshot is of another algorithm, and [`SnapshotError::Corrupt`] for impossible values.
    /// Callers that cannot use the snapshot should fall back to
    /// [`Algorithm::exhausted_state`], never to a full bucket.
    pub fn restore<A: Algorithm>(
        &self,
        algorithm: &A,
        now: u64,
        unix_ms_now: u64,
    ) -> Result<A::State, SnapshotError> {
        if self.version != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion {
                found: self.version,
                supported: FORMAT_VERSION,
            });
        }
        if self.algorithm != algorithm.kind() {
            return Err(SnapshotError::AlgorithmMismatch {
                found: self.algorithm.name(),
                expected: algorithm.name(),
            });
        }
        let elapsed_ns = unix_ms_now
            .saturating_sub(self.taken_at_unix_ms)
            .saturating_mul(1_000_000);
        algorithm.restore(&self.state, now, elapsed_ns)
    }
}
