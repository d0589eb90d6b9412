//! A [`Snapshot`] as a flat list of numbers, the form the Service Worker stores in IndexedDB.
//!
//! | index | meaning |
//! |-------|---------|
//! | 0 | [`RECORD_VERSION`], the layout of this list |
//! | 1 | the core's snapshot [`FORMAT_VERSION`](sluice_core::FORMAT_VERSION) |
//! | 2 | algorithm code (see [`kind_code`]) |
//! | 3 | capacity when taken (informational: restore clamps to the current quota) |
//! | 4 | interval in ns when taken (informational) |
//! | 5 | wall-clock time of the snapshot, ms since the Unix epoch (`Date.now()`) |
//! | 6 | form: 0 debt, 1 window, 2 sliding, 3 log |
//! | 7.. | debt: `debt_ns`; window: `ends_in_ns, count`; sliding: `ends_in_ns, previous, current`; log: `n`, then `n` pairs `ends_in_ns, cost` |
//!
//! Every value is a whole number. Values above 2^53 are written rounded **up** (see
//! [`up_f64`]), so a debt read back is never smaller than the one written. Anything else in the
//! list, such as a fraction, a negative, a wrong length or an unknown code, is rejected, and the
//! caller falls back to an exhausted bucket.

use alloc::vec::Vec;

use sluice_core::{SavedState, Snapshot, SnapshotError};

use crate::codes::{kind_code, kind_from_code, up_f64, whole};

/// The layout version of the list this build writes and reads.
pub const RECORD_VERSION: u64 = 1;

/// Fields before the form-specific ones.
const HEADER: usize = 7;

/// Writes `snapshot` as numbers into `out` (cleared first).
pub fn encode(snapshot: &Snapshot, out: &mut Vec<f64>) {
    out.clear();
    out.extend([
        RECORD_VERSION as f64,
        f64::from(snapshot.version),
        f64::from(kind_code(snapshot.algorithm)),
        up_f64(snapshot.capacity),
        up_f64(snapshot.interval_ns),
        up_f64(snapshot.taken_at_unix_ms),
    ]);
    match &snapshot.state {
        SavedState::Debt { debt_ns } => out.extend([0.0, up_f64(*debt_ns)]),
        SavedState::Window { ends_in_ns, count } => {
            out.extend([1.0, up_f64(*ends_in_ns), up_f64(*count)])
        }
        SavedState::Sliding {
            ends_in_ns,
            previous,
            current,
        } => out.extend([
            2.0,
            up_f64(*ends_in_ns),
            up_f64(*previous),
            up_f64(*current),
        ]),
        SavedState::Log { entries } => {
            out.extend([3.0, entries.len() as f64]);
            for &(ends_in_ns, cost) in entries {
                out.extend([up_f64(ends_in_ns), up_f64(cost)]);
            }
        }
    }
}

/// Reads a list written by [`encode`].
///
/// # Errors
///
/// [`SnapshotError::Malformed`] for a list of the wrong shape or with a value that is not a
/// whole number, [`SnapshotError::UnsupportedVersion`] for another layout version. The values
/// themselves are validated by the core when the snapshot is restored.
pub fn decode(values: &[f64]) -> Result<Snapshot, SnapshotError> {
    let malformed = |reason| SnapshotError::Malformed { reason };
    if values.len() < HEADER + 1 {
        return Err(malformed("too short"));
    }
    let mut n = Vec::with_capacity(values.len());
    for &v in values {
        n.push(whole(v).ok_or(malformed("a value is not a whole number"))?);
    }
    if n[0] != RECORD_VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            found: u32::try_from(n[0]).unwrap_or(u32::MAX),
            supported: RECORD_VERSION as u32,
        });
    }
    let version = u32::try_from(n[1]).map_err(|_| malformed("version out of range"))?;
    let algorithm = u32::try_from(n[2])
        .ok()
        .and_then(kind_from_code)
        .ok_or(malformed("unknown algorithm code"))?;
    let body = &n[HEADER..];
    let state = match (n[6], body) {
        (0, &[debt_ns]) => SavedState::Debt { debt_ns },
        (1, &[ends_in_ns, count]) => SavedState::Window { ends_in_ns, count },
        (2, &[ends_in_ns, previous, current]) => SavedState::Sliding {
            ends_in_ns,
            previous,
            current,
        },
        (3, [len, rest @ ..]) => {
            if usize::try_from(*len).ok().and_then(|l| l.checked_mul(2)) != Some(rest.len()) {
                return Err(malformed("log length does not match its entries"));
            }
            SavedState::Log {
                entries: rest.chunks_exact(2).map(|p| (p[0], p[1])).collect(),
            }
        }
        (0..=3, _) => return Err(malformed("wrong number of values for its form")),
        _ => return Err(malformed("unknown form")),
    };
    Ok(Snapshot {
        version,
        algorithm,
        capacity: n[3],
        interval_ns: n[4],
        taken_at_unix_ms: n[5],
        state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota};

    fn round_trip(snapshot: &Snapshot) -> Snapshot {
        let mut out = Vec::new();
        encode(snapshot, &mut out);
        decode(&out).unwrap()
    }

    #[test]
    fn every_algorithm_round_trips() {
        let quota = Quota::parse(5, "1/s").unwrap();
        for kind in Kind::ALL {
            let alg = AnyAlgorithm::new(kind, quota);
            let mut state = alg.initial_state();
            for t in 0..3u64 {
                alg.check(&mut state, t * 300_000_000, 1).unwrap();
            }
            let snap = Snapshot::take(&alg, &state, 1_000_000_000, 1_700_000_000_000);
            assert_eq!(round_trip(&snap), snap, "{kind}");
        }
    }

    #[test]
    fn debt_layout_is_as_documented() {
        let snap = Snapshot {
            version: 1,
            algorithm: Kind::Gcra,
            capacity: 10,
            interval_ns: 1_000_000_000,
            taken_at_unix_ms: 1_700_000_000_000,
            state: SavedState::Debt {
                debt_ns: 9_000_000_000,
            },
        };
        let mut out = Vec::new();
        encode(&snap, &mut out);
        assert_eq!(
            out,
            vec![1.0, 1.0, 1.0, 10.0, 1e9, 1.7e12, 0.0, 9e9],
            "the README documents this list"
        );
    }

    #[test]
    fn huge_debts_never_shrink() {
        let snap = Snapshot {
            version: 1,
            algorithm: Kind::TokenBucket,
            capacity: 1,
            interval_ns: 1 << 61,
            taken_at_unix_ms: 0,
            state: SavedState::Debt {
                debt_ns: (1 << 61) - 1,
            },
        };
        let back = round_trip(&snap);
        let SavedState::Debt { debt_ns } = back.state else {
            panic!()
        };
        assert!(debt_ns >= (1 << 61) - 1);
    }

    #[test]
    fn garbage_is_rejected_not_trusted() {
        let good = [1.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 0.0, 5e9];
        assert!(decode(&good).is_ok());
        let cases: &[&[f64]] = &[
            &[],
            &good[..7],
            &[2.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 0.0, 5e9],
            &[1.0, 1.0, 9.0, 10.0, 1e9, 1.7e12, 0.0, 5e9],
            &[1.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 7.0, 5e9],
            &[1.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 0.0, -5e9],
            &[1.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 0.0, 0.5],
            &[1.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 0.0, f64::NAN],
            &[1.0, 1.0, 0.0, 10.0, 1e9, 1.7e12, 0.0, 5e9, 1.0],
            &[1.0, 1.0, 3.0, 10.0, 1e9, 1.7e12, 3.0, 2.0, 1.0, 1.0],
            &[1.0, 1.0, 3.0, 10.0, 1e9, 1.7e12, 3.0, 1e300],
        ];
        for case in cases {
            assert!(decode(case).is_err(), "{case:?}");
        }
    }
}
