//! Errors of the core: bad quotas, impossible costs, unusable snapshots.
//!
//! Every error names the value that caused it, so that a configuration tool can
//! print it next to the file and line it came from.

use alloc::string::String;
use core::fmt;

/// A quota or rate could not be built from the given values.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuotaError {
    /// The capacity (burst) was zero; at least one token is needed.
    ZeroCapacity,
    /// The rate was zero or negative: `value` is what was given.
    NonPositiveRate {
        /// The rejected rate as written.
        value: String,
    },
    /// The rate was NaN or infinite.
    NotFinite {
        /// The rejected rate as written.
        value: String,
    },
    /// The rate asks for more than one token per nanosecond.
    RateTooHigh {
        /// The rejected rate as written.
        value: String,
    },
    /// The rate is so slow that one token would take longer than `u64::MAX` nanoseconds.
    RateTooLow {
        /// The rejected rate as written.
        value: String,
    },
    /// `capacity × interval` does not fit the time range the core supports (about 146 years).
    Overflow {
        /// The capacity that was given.
        capacity: u64,
        /// The interval between two tokens, in nanoseconds.
        interval_ns: u64,
    },
    /// The text could not be read as a rate such as `5/s`, `10/min` or `10 per 90s`.
    Syntax {
        /// The rejected text.
        value: String,
        /// What was expected instead.
        expected: &'static str,
    },
}

impl fmt::Display for QuotaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaError::ZeroCapacity => f.write_str("capacity must be at least 1, got 0"),
            QuotaError::NonPositiveRate { value } => {
                write!(f, "rate must be greater than zero, got `{value}`")
            }
            QuotaError::NotFinite { value } => write!(f, "rate must be a finite number, got `{value}`"),
            QuotaError::RateTooHigh { value } => write!(
                f,
                "rate `{value}` is too high: at most one token per nanosecond (1e9/s) is supported"
            ),
            QuotaError::RateTooLow { value } => write!(
                f,
                "rate `{value}` is too low: one token would take longer than 584 years"
            ),
            QuotaError::Overflow { capacity, interval_ns } => write!(
                f,
                "capacity {capacity} at one token every {interval_ns} ns needs more than 146 years to refill; lower the capacity or raise the rate"
            ),
            QuotaError::Syntax { value, expected } => {
                write!(f, "cannot read `{value}` as a rate: expected {expected}")
            }
        }
    }
}

/// A single check could not be decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckError {
    /// The cost is larger than the capacity, so no amount of waiting would admit it.
    InsufficientCapacity {
        /// The cost asked for.
        cost: u64,
        /// The largest cost this limiter can ever admit.
        capacity: u64,
    },
    /// The state handed in belongs to another algorithm (only possible with [`crate::AnyAlgorithm`]).
    StateMismatch,
}

impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::InsufficientCapacity { cost, capacity } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity}: it can never be admitted"
            ),
            CheckError::StateMismatch => {
                f.write_str("the limiter state belongs to a different algorithm")
            }
        }
    }
}

/// A snapshot could not be restored.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The snapshot was written by a format version this build does not read.
    UnsupportedVersion {
        /// The version found in the snapshot.
        found: u32,
        /// The version this build reads.
        supported: u32,
    },
    /// The snapshot was taken for another algorithm.
    AlgorithmMismatch {
        /// The algorithm named by the snapshot.
        found: &'static str,
        /// The algorithm of the limiter it was restored into.
        expected: &'static str,
    },
    /// A field holds a value the algorithm can never produce.
    Corrupt {
        /// The field that is out of range.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// The bytes could not be decoded at all.
    Malformed {
        /// What went wrong while decoding.
        reason: &'static str,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::UnsupportedVersion { found, supported } => write!(
                f,
                "snapshot format version {found} is not supported (this build reads version {supported})"
            ),
            SnapshotError::AlgorithmMismatch { found, expected } => write!(
                f,
                "snapshot was taken for algorithm `{found}` but the limiter uses `{expected}`"
            ),
            SnapshotError::Corrupt { field, value } => {
                write!(f, "snapshot field `{field}` has impossible value {value}")
            }
            SnapshotError::Malformed { reason } => write!(f, "snapshot is malformed: {reason}"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for QuotaError {}
#[cfg(feature = "std")]
impl std::error::Error for CheckError {}
#[cfg(feature = "std")]
impl std::error::Error for SnapshotError {}
