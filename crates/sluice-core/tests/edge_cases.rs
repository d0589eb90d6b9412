//! Edge cases: snapshots (exact round trips, long and short absences, corruption), clocks that
//! go backwards, bad quotas, impossible and zero costs, and times near `u64::MAX`.
//!
//! Every algorithm is driven through [`AnyAlgorithm`], which `tests/conformance.rs` checks to
//! decide exactly as the concrete types. The JSON tests need the `serde` feature
//! (`cargo test -p sluice-core --all-features`).

use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sluice_core::algorithm::MAX_TIME_NS;
use sluice_core::{
    Algorithm, AnyAlgorithm, AnyState, CheckError, Decision, Kind, Quota, QuotaError, Rate,
    SavedState, Snapshot, SnapshotError, TokenBucket, TokenBucketState, FORMAT_VERSION,
    MAX_SPAN_NS, NANOS_PER_SEC,
};

const MS: u64 = 1_000_000;

fn quota(capacity: u64, interval_ns: u64) -> Quota {
    Quota::new(capacity, Rate::from_interval_ns(interval_ns).unwrap()).unwrap()
}

fn every(quota: Quota) -> impl Iterator<Item = AnyAlgorithm> {
    Kind::ALL
        .into_iter()
        .map(move |kind| AnyAlgorithm::new(kind, quota))
}

fn check(
    alg: &AnyAlgorithm,
    state: &mut AnyState,
    now: u64,
    cost: u64,
) -> Result<Decision, TestCaseError> {
    alg.check(state, now, cost)
        .map_err(|e| TestCaseError::fail(format!("{}: check at {now} of {cost}: {e}", alg.which())))
}

/// Cost admitted by `tries` requests of cost one at the same instant.
fn burst(alg: &AnyAlgorithm, state: &mut AnyState, now: u64, tries: u64) -> u64 {
    (0..tries)
        .filter(|_| alg.check(state, now, 1).unwrap().allowed)
        .count() as u64
}

fn exhausted(alg: &AnyAlgorithm, now: u64) -> AnyState {
    let mut state = alg.initial_state();
    let n = alg.quota().capacity();
    assert!(alg.check(&mut state, now, n).unwrap().allowed);
    state
}

fn kind() -> impl Strategy<Value = Kind> {
    (0..Kind::ALL.len()).prop_map(|i| Kind::ALL[i])
}

/// Small capacities; intervals from nanoseconds to seconds.
fn small_quota() -> impl Strategy<Value = Quota> {
    (
        1u64..=20,
        prop_oneof![1u64..=1_000, 100_000u64..=1_000_000_000],
    )
        .prop_map(|(c, i)| quota(c, i))
}

/// The guarantee of the algorithm's family over admissions `(time, cost)` in time order,
/// checked on every window that starts and ends at an admission.
fn guarantee(kind: Kind, quota: Quota, admitted: &[(u64, u64)]) -> Result<(), TestCaseError> {
    let (n, interval, w) = (
        u128::from(quota.capacity()),
        u128::from(quota.interval_ns()),
        quota.window_ns(),
    );
    for i in 0..admitted.len() {
        let mut sum = 0u128;
        for j in i..admitted.len() {
            sum += u128::from(admitted[j].1);
            let span = admitted[j].0 - admitted[i].0;
            let same_window = admitted[i].0 / w == admitted[j].0 / w;
            let ok = match kind {
                Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => {
                    sum * interval <= n * interval + u128::from(span)
                }
                Kind::SlidingLog => span >= w || sum <= n,
                Kind::FixedWindow => (!same_window || sum <= n) && (span > w || sum <= 2 * n),
                Kind::SlidingWindow => (!same_window || sum <= n) && (span >= w || sum < 2 * n),
            };
            prop_assert!(
                ok,
                "{}: {} admitted in [{}, {}] with {}",
                kind,
                sum,
                admitted[i].0,
                admitted[j].0,
                quota
            );
        }
    }
    Ok(())
}

// === Snapshots ===

/// Random traffic, a snapshot, a restart some wall-clock milliseconds later on a monotonic
/// clock with another origin, and traffic after it.
#[derive(Debug, Clone)]
struct Restart {
    kind: Kind,
    quota: Quota,
    before: Vec<(u64, u64)>,
    snap_gap: u64,
    taken_at_unix_ms: u64,
    elapsed_ms: u64,
    restart_now: u64,
    after: Vec<(u64, u64)>,
}

fn restart() -> impl Strategy<Value = Restart> {
    (
        kind(),
        1u64..=20,
        prop_oneof![100_000u64..=1_000_000, 1_000_000u64..=1_000_000_000],
    )
        .prop_flat_map(|(kind, capacity, interval)| {
            let q = quota(capacity, interval);
            let w = q.window_ns();
            let steps = || {
                prop::collection::vec(
                    (prop_oneof![Just(0u64), 0..=w / 2, 0..=2 * w], 1..=capacity),
                    0..=20,
                )
            };
            (
                steps(),
                0..=w,
                0u64..1 << 42,
                prop_oneof![Just(0u64), 0..=2 * w / MS + 2],
                prop_oneof![Just(0u64), 0u64..1 << 50],
                steps(),
            )
                .prop_map(
                    move |(before, snap_gap, taken, elapsed_ms, restart_now, after)| Restart {
                        kind,
                        quota: q,
                        before,
                        snap_gap,
                        taken_at_unix_ms: taken,
                        elapsed_ms,
                        restart_now,
                        after,
                    },
                )
        })
}

#[cfg(feature = "serde")]
fn through_json(snapshot: &Snapshot) -> Result<Snapshot, TestCaseError> {
    let text = serde_json::to_string(snapshot).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: Snapshot =
        serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
    prop_assert_eq!(&back, snapshot);
    Ok(back)
}

#[cfg(not(feature = "serde"))]
fn through_json(snapshot: &Snapshot) -> Result<Snapshot, TestCaseError> {
    Ok(snapshot.clone())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    /// A restored limiter decides exactly as the original would have after the same wall-clock
    /// time, whatever the new monotonic origin (through JSON when `serde` is on).
    #[test]
    fn snapshot_restore_is_exact(r in restart()) {
        let alg = AnyAlgorithm::new(r.kind, r.quota);
        let mut original = alg.initial_state();
        let mut now = 0;
        for &(gap, cost) in &r.before {
            now += gap;
            check(&alg, &mut original, now, cost)?;
        }
        let snap_at = now + r.snap_gap;
        let snapshot = Snapshot::take(&alg, &original, snap_at, r.taken_at_unix_ms);
        let snapshot = through_json(&snapshot)?;
        let mut restored = snapshot
            .restore(&alg, r.restart_now, r.taken_at_unix_ms + r.elapsed_ms)
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let (mut then, mut now) = (snap_at + r.elapsed_ms * MS, r.restart_now);
        for (i, &(gap, cost)) in r.after.iter().enumerate() {
            then += gap;
            now += gap;
            prop_assert_eq!(
                check(&alg, &mut original, then, cost)?,
                check(&alg, &mut restored, now, cost)?,
                "step {} after the restart", i
            );
        }
    }
}

#[test]
fn long_absence_restores_full_and_never_more() {
    let q = quota(10, 100 * MS); // 10 per second
    let smaller = quota(4, 100 * MS);
    for alg in every(q) {
        let state = exhausted(&alg, 5 * NANOS_PER_SEC);
        let snap = Snapshot::take(&alg, &state, 5 * NANOS_PER_SEC, 1_000_000);
        // Long enough is the `reset_after` at the snapshot: one window for most, up to two for
        // the sliding window counter (its previous window still counts during the next one).
        let reset = alg
            .check(&mut state.clone(), 5 * NANOS_PER_SEC, 0)
            .unwrap()
            .reset_after_ns;
        assert!(
            reset == q.window_ns()
                || (alg.which() == Kind::SlidingWindow && reset == 2 * q.window_ns())
        );
        let reset_ms = reset / MS;
        let mut early = snap.restore(&alg, 7, 1_000_000 + reset_ms - 1).unwrap();
        assert!(
            alg.check(&mut early, 7, 0).unwrap().remaining < 10,
            "{}",
            alg.which()
        );
        for elapsed_ms in [reset_ms, reset_ms + 1, 3_600_000, u64::MAX - 1_000_000] {
            let mut restored = snap.restore(&alg, 7, 1_000_000 + elapsed_ms).unwrap();
            let query = alg.check(&mut restored, 7, 0).unwrap();
            assert_eq!(query.remaining, 10, "{} after {elapsed_ms} ms", alg.which());
            assert_eq!(query.reset_after_ns, 0, "{}", alg.which());
            assert_eq!(burst(&alg, &mut restored, 7, 11), 10, "{}", alg.which());
        }
        // Into a lowered quota: never more than the new capacity.
        let lower = AnyAlgorithm::new(alg.which(), smaller);
        let mut restored = snap.restore(&lower, 7, u64::MAX).unwrap();
        assert_eq!(burst(&lower, &mut restored, 7, 11), 4, "{}", alg.which());
        // A full limiter saved into a smaller one is full, not over-full.
        let full = Snapshot::take(&alg, &alg.initial_state(), 0, 0);
        let mut restored = full.restore(&lower, 0, 0).unwrap();
        assert_eq!(burst(&lower, &mut restored, 0, 11), 4, "{}", alg.which());
    }
}

#[test]
fn short_absence_gives_no_burst() {
    let q = quota(10, 100 * MS);
    for alg in every(q) {
        let t = 3 * NANOS_PER_SEC + 50 * MS;
        let state = exhausted(&alg, t);
        let snap = Snapshot::take(&alg, &state, t, 9_000);
        // A restart at once, on a clock with another origin: still empty.
        let mut restored = snap.restore(&alg, 12, 9_000).unwrap();
        let denied = alg.check(&mut restored, 12, 1).unwrap();
        assert!(!denied.allowed, "{}", alg.which());
        assert_eq!(denied.remaining, 0, "{}", alg.which());
        // 450 ms later: as much as the original would have after 450 ms, and no more.
        let mut restored = snap.restore(&alg, 12, 9_450).unwrap();
        let mut original = state.clone();
        let expected = burst(&alg, &mut original, t + 450 * MS, 11);
        assert!(expected < 10, "{}", alg.which());
        assert_eq!(
            burst(&alg, &mut restored, 12, 11),
            expected,
            "{}",
            alg.which()
        );
    }
}

#[test]
fn wall_clock_going_backwards_counts_as_no_time() {
    let q = quota(5, 200 * MS);
    for alg in every(q) {
        let state = exhausted(&alg, 0);
        let snap = Snapshot::take(&alg, &state, 0, 50_000);
        let at_once = snap.restore(&alg, 1_000, 50_000).unwrap();
        for earlier in [49_999, 10_000, 0] {
            let mut back = snap.restore(&alg, 1_000, earlier).unwrap();
            assert_eq!(back, at_once, "{} restored at {earlier} ms", alg.which());
            assert!(!alg.check(&mut back, 1_000, 1).unwrap().allowed);
        }
    }
}

#[test]
fn corrupt_snapshots_are_errors() {
    let q = quota(5, 200 * MS);
    let tb = AnyAlgorithm::new(Kind::TokenBucket, q);
    let good = Snapshot::take(&tb, &exhausted(&tb, 0), 0, 1_000);
    assert!(good.restore(&tb, 0, 1_000).is_ok());

    for version in [0, FORMAT_VERSION + 1, u32::MAX] {
        let snap = Snapshot {
            version,
            ..good.clone()
        };
        assert_eq!(
            snap.restore(&tb, 0, 1_000),
            Err(SnapshotError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION
            })
        );
    }

    // Another algorithm's snapshot, by name and by the form of its state.
    for alg in every(q) {
        for other in Kind::ALL.into_iter().filter(|&k| k != alg.which()) {
            let snap = Snapshot {
                algorithm: other,
                ..good.clone()
            };
            assert!(matches!(
                snap.restore(&alg, 0, 1_000),
                Err(SnapshotError::AlgorithmMismatch { .. })
            ));
        }
    }
    let forms = [
        SavedState::Debt { debt_ns: 0 },
        SavedState::Window {
            ends_in_ns: 1,
            count: 1,
        },
        SavedState::Sliding {
            ends_in_ns: 1,
            previous: 1,
            current: 1,
        },
        SavedState::Log {
            entries: vec![(1, 1)],
        },
    ];
    for alg in every(q) {
        let native = alg.save(&alg.initial_state(), 0);
        for form in &forms {
            let same = core::mem::discriminant(form) == core::mem::discriminant(&native);
            let result = alg.restore(form, 0, 0);
            if same {
                assert!(result.is_ok(), "{} {form:?}", alg.which());
            } else {
                assert!(
                    matches!(result, Err(SnapshotError::AlgorithmMismatch { .. })),
                    "{} {form:?}: {result:?}",
                    alg.which()
                );
            }
        }
    }

    // Values no state can hold.
    let impossible = [
        (Kind::TokenBucket, SavedState::Debt { debt_ns: u64::MAX }),
        (
            Kind::Gcra,
            SavedState::Debt {
                debt_ns: MAX_SPAN_NS + 1,
            },
        ),
        (Kind::LeakyBucket, SavedState::Debt { debt_ns: u64::MAX }),
        (
            Kind::FixedWindow,
            SavedState::Window {
                ends_in_ns: 1,
                count: u64::MAX,
            },
        ),
        (
            Kind::FixedWindow,
            SavedState::Window {
                ends_in_ns: u64::MAX,
                count: 1,
            },
        ),
        (
            Kind::SlidingWindow,
            SavedState::Sliding {
                ends_in_ns: 1,
                previous: u64::MAX,
                current: 0,
            },
        ),
        (
            Kind::SlidingWindow,
            SavedState::Sliding {
                ends_in_ns: u64::MAX,
                previous: 0,
                current: 0,
            },
        ),
        (
            Kind::SlidingLog,
            SavedState::Log {
                entries: vec![(5, 1), (4, 1)],
            },
        ),
        (
            Kind::SlidingLog,
            SavedState::Log {
                entries: vec![(5, 0)],
            },
        ),
        (
            Kind::SlidingLog,
            SavedState::Log {
                entries: vec![(5, u64::MAX)],
            },
        ),
        (
            Kind::SlidingLog,
            SavedState::Log {
                entries: vec![(5, MAX_SPAN_NS), (6, MAX_SPAN_NS)],
            },
        ),
    ];
    for (kind, state) in impossible {
        let alg = AnyAlgorithm::new(kind, q);
        let snap = Snapshot {
            algorithm: kind,
            state: state.clone(),
            ..good.clone()
        };
        let result = snap.restore(&alg, 0, 1_000);
        assert!(
            matches!(result, Err(SnapshotError::Corrupt { .. })),
            "{kind} {state:?}: {result:?}"
        );
        assert!(!result.unwrap_err().to_string().is_empty());
    }
}

#[cfg(feature = "serde")]
mod json {
    use super::*;

    fn valid_json(kind: Kind) -> String {
        let alg = AnyAlgorithm::new(kind, quota(5, 200 * MS));
        let mut state = alg.initial_state();
        for now in [0, 10, 10, 150 * MS] {
            alg.check(&mut state, now, 2).unwrap();
        }
        serde_json::to_string(&Snapshot::take(&alg, &state, 200 * MS, 1_700_000_000_000)).unwrap()
    }

    #[test]
    fn round_trip_through_json() {
        for kind in Kind::ALL {
            let text = valid_json(kind);
            let snap: Snapshot = serde_json::from_str(&text).unwrap();
            assert_eq!(serde_json::to_string(&snap).unwrap(), text);
            assert!(text.contains(&format!("\"algorithm\":\"{}\"", kind.name())));
        }
    }

    #[test]
    fn garbage_json_is_an_error() {
        let debt = r#""state":{"form":"debt","debt_ns":0}"#;
        let head = r#""version":1,"algorithm":"gcra","capacity":5,"interval_ns":1"#;
        let garbage = [
            String::new(),
            "null".into(),
            "{}".into(),
            "[]".into(),
            "not json".into(),
            "{\"version\":1}".into(),
            format!("{{{head},\"taken_at_unix_ms\":0}}"),
            format!("{{{head},\"taken_at_unix_ms\":0,{debt}}} trailing"),
            format!("{{{head},\"taken_at_unix_ms\":-1,{debt}}}"),
            format!("{{{head},\"taken_at_unix_ms\":18446744073709551616,{debt}}}"),
            format!("{{{head},\"taken_at_unix_ms\":1e3,{debt}}}"),
            format!("{{{head},\"taken_at_unix_ms\":\"0\",{debt}}}"),
            format!(
                "{{{},\"taken_at_unix_ms\":0,{debt}}}",
                head.replace("gcra", "nope")
            ),
            format!(
                "{{{head},\"taken_at_unix_ms\":0,{}}}",
                debt.replace("debt\"", "nope\"")
            ),
            format!(
                "{{{},\"taken_at_unix_ms\":0,{debt}}}",
                head.replace("\"version\":1", "\"version\":4294967296")
            ),
            "[".repeat(100_000),
        ];
        for text in &garbage {
            assert!(
                serde_json::from_str::<Snapshot>(text).is_err(),
                "{}",
                &text[..text.len().min(200)]
            );
        }
        // Well-formed JSON with impossible contents fails at restore, naming the problem.
        let gcra = AnyAlgorithm::new(Kind::Gcra, quota(5, 1));
        for (text, want) in [
            (
                format!("{{{},\"taken_at_unix_ms\":0,{debt}}}", head.replace(":1,", ":7,")),
                "version 7",
            ),
            (
                format!(
                    "{{{head},\"taken_at_unix_ms\":0,{}}}",
                    debt.replace(":0}", ":18446744073709551615}")
                ),
                "debt_ns",
            ),
            (
                format!(
                    "{{{head},\"taken_at_unix_ms\":0,\"state\":{{\"form\":\"log\",\"entries\":[[1,1]]}}}}"
                ),
                "sliding_log",
            ),
        ] {
            let snap: Snapshot = serde_json::from_str(&text).unwrap();
            let err = snap.restore(&gcra, 0, 0).unwrap_err().to_string();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

        /// Damaged JSON never panics; whatever still parses and restores never holds more than
        /// the capacity.
        #[test]
        fn damaged_json_never_panics_nor_overfills(
            kind in kind(),
            edits in prop::collection::vec(
                (any::<prop::sample::Index>(), prop::sample::select(
                    b"0123456789-.,:{}[]\"e abcdefghilmnorstuwxy".to_vec())),
                1..=4),
            now in any::<u64>(),
            unix_ms in any::<u64>(),
        ) {
            let mut bytes = valid_json(kind).into_bytes();
            for (at, byte) in edits {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            let alg = AnyAlgorithm::new(kind, quota(5, 200 * MS));
            if let Ok(snap) = serde_json::from_slice::<Snapshot>(&bytes) {
                if let Ok(mut state) = snap.restore(&alg, now, unix_ms) {
                    prop_assert!(burst(&alg, &mut state, now, 6) <= 5);
                }
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in ".{0,200}") {
            let _ = serde_json::from_str::<Snapshot>(&text);
        }
    }
}

// === Clocks ===

/// A monotonic clock that sometimes goes backwards, and the running maximum of it.
fn wobbly_times(window: u64) -> impl Strategy<Value = Vec<u64>> {
    let w = i128::from(window);
    prop::collection::vec(
        prop_oneof![
            2 => Just(0i128),
            1 => -3i128..=3,
            3 => 0..=w,
            2 => -2 * w..=0,
            1 => w..=2 * w,
        ],
        1..=40,
    )
    .prop_map(|deltas| {
        let mut t = 0i128;
        deltas
            .into_iter()
            .map(|d| {
                t = (t + d).max(0);
                t as u64
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

    /// A backward step of the clock never mints tokens: no step admits what the same state
    /// would deny at the latest time already seen; the admissions, dated at the running
    /// maximum, keep the algorithm's guarantee; and the algorithms that simply ignore a
    /// backward clock decide exactly as on the running maximum.
    #[test]
    fn backward_clock_never_mints(
        (kind, q, times, costs) in (kind(), small_quota()).prop_flat_map(|(kind, q)| {
            let n = q.capacity();
            (Just(kind), Just(q), wobbly_times(q.window_ns()),
             prop::collection::vec(1..=n, 40))
        })
    ) {
        let alg = AnyAlgorithm::new(kind, q);
        let (mut wobbly, mut steady) = (alg.initial_state(), alg.initial_state());
        let mut latest = 0;
        let mut admitted = Vec::new();
        for (i, (&t, &cost)) in times.iter().zip(&costs).enumerate() {
            latest = latest.max(t);
            let at_latest = check(&alg, &mut wobbly.clone(), latest, cost)?;
            let d = check(&alg, &mut wobbly, t, cost)?;
            prop_assert!(!d.allowed || at_latest.allowed, "{} minted at #{} ({} < {})", kind, i, t, latest);
            let s = check(&alg, &mut steady, latest, cost)?;
            if matches!(kind, Kind::TokenBucket | Kind::LeakyBucket | Kind::SlidingLog | Kind::FixedWindow) {
                prop_assert_eq!(d.allowed, s.allowed, "{} at #{} ({} < {})", kind, i, t, latest);
                prop_assert_eq!(d.remaining, s.remaining);
            }
            if d.allowed {
                admitted.push((latest, cost));
            }
        }
        guarantee(kind, q, &admitted)?;
    }
}

// === Charges ===

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// On a window algorithm a charge takes what is left, up to its cost, and forgives the
    /// rest: afterwards the key has `max(0, left - cost)` tokens, exactly what a check of that
    /// many would leave; and checks and charges together (each charge counted for what it
    /// took) keep the algorithm's guarantee.
    #[test]
    fn a_charge_on_a_window_takes_what_is_left_and_keeps_the_bound(
        (kind, q, steps) in (window_kind(), small_quota()).prop_flat_map(|(kind, q)| {
            let (n, w) = (q.capacity(), q.window_ns());
            (Just(kind), Just(q), prop::collection::vec(
                (0..=w / 2, 1..=n, any::<bool>(), 0..=3 * n), 1..40))
        })
    ) {
        let alg = AnyAlgorithm::new(kind, q);
        let mut state = alg.initial_state();
        let (mut now, mut admitted) = (0u64, Vec::new());
        for (i, &(gap, cost, charge, charged)) in steps.iter().enumerate() {
            now += gap;
            if !charge {
                if check(&alg, &mut state, now, cost)?.allowed {
                    admitted.push((now, cost));
                }
                continue;
            }
            let left = check(&alg, &mut state.clone(), now, 0)?.remaining;
            let forgiven = alg.charge(&mut state, now, charged, u64::MAX);
            prop_assert_eq!(forgiven, charged.saturating_sub(left), "{} step {}", kind, i);
            let after = check(&alg, &mut state.clone(), now, 0)?.remaining;
            prop_assert_eq!(after, left.saturating_sub(charged), "{} step {}", kind, i);
            if charged > forgiven {
                admitted.push((now, charged - forgiven));
            }
        }
        guarantee(kind, q, &admitted)?;
    }

    /// On a bucket a charge is taken whole, down to `max_debt` tokens beyond empty: the part
    /// beyond that cap, and nothing else, is forgiven; the key is refused until the refill
    /// has paid the debt (its `retry_after` covers it); and over every window `[t1, t2]` the
    /// cost admitted and charged is at most `capacity + rate × (t2 - t1)` plus the debt still
    /// owed at `t2`. Refunds, saves and restores in between keep all of it (a restore keeps
    /// the debt: no key gains tokens across a restart).
    #[test]
    fn a_charge_on_a_bucket_carries_its_debt_and_keeps_the_bound(
        (kind, q, max_debt, steps) in (bucket_kind(), small_quota()).prop_flat_map(|(kind, q)| {
            let (n, w) = (q.capacity(), q.window_ns());
            (Just(kind), Just(q),
             prop_oneof![Just(u64::MAX), 0..=3 * n],
             prop::collection::vec((0..=w, 1..=n, 0u8..4, 0..=5 * n), 1..40))
        })
    ) {
        let alg = AnyAlgorithm::new(kind, q);
        let (interval, tau) = (q.interval_ns(), q.window_ns());
        let owed_beyond = |state: &AnyState, now: u64| match alg.save(state, now) {
            SavedState::Debt { debt_ns } => debt_ns.saturating_sub(tau),
            other => panic!("{kind}: a bucket saved as {other:?}"),
        };
        let mut state = alg.initial_state();
        // (time, cost taken) of each admission and charge, and the debt owed after each.
        let (mut now, mut taken, mut debts) = (0u64, Vec::new(), Vec::new());
        for (i, &(gap, cost, op, amount)) in steps.iter().enumerate() {
            now += gap;
            match op {
                0 | 1 => {
                    let d = check(&alg, &mut state, now, cost)?;
                    let in_debt = owed_beyond(&state, now);
                    if d.allowed {
                        prop_assert_eq!(in_debt, 0, "{} step {}: admitted in debt", kind, i);
                        taken.push((now, cost));
                    } else {
                        // The wait covers the debt and the cost asked.
                        prop_assert!(
                            d.retry_after_ns >= in_debt,
                            "{} step {}: waits {} with {} owed", kind, i, d.retry_after_ns, in_debt
                        );
                        let mut later = state.clone();
                        prop_assert!(check(&alg, &mut later, now + d.retry_after_ns, cost)?.allowed,
                            "{} step {}: still refused after its retry_after", kind, i);
                    }
                }
                2 => {
                    let left = check(&alg, &mut state.clone(), now, 0)?.remaining;
                    let debt_before = owed_beyond(&state, now);
                    let forgiven = alg.charge(&mut state, now, amount, max_debt);
                    let debt_after = owed_beyond(&state, now);
                    prop_assert!(debt_after <= max_debt.saturating_mul(interval),
                        "{} step {}: owes {} ns beyond a cap of {} tokens", kind, i, debt_after, max_debt);
                    if debt_before == 0 {
                        prop_assert_eq!(forgiven, amount.saturating_sub(left.saturating_add(max_debt)),
                            "{} step {}: charge {} with {} left", kind, i, amount, left);
                    }
                    if max_debt == u64::MAX {
                        prop_assert_eq!(forgiven, 0, "{} step {}: forgave with no cap", kind, i);
                    }
                    taken.push((now, amount - forgiven));
                }
                _ => {
                    // Save and restore a moment later, as a restart of the file store does.
                    let saved = alg.save(&state, now);
                    now += gap / 2;
                    state = alg.restore(&saved, now, gap / 2).unwrap();
                }
            }
            debts.push((now, owed_beyond(&state, now)));
        }
        // The bound over every window that starts and ends at an event, in ns of refill.
        for i in 0..taken.len() {
            let mut sum = 0u128;
            for j in i..taken.len() {
                sum += u128::from(taken[j].1);
                let (t1, t2) = (taken[i].0, taken[j].0);
                let owed = debts.iter().rev().find(|&&(t, _)| t <= t2).map_or(0, |&(_, d)| d);
                let bound = u128::from(tau) + u128::from(t2 - t1) + u128::from(owed);
                prop_assert!(sum * u128::from(interval) < bound + u128::from(interval),
                    "{}: {} taken in [{}, {}], bound {} tokens", kind, sum, t1, t2,
                    bound / u128::from(interval));
            }
        }
    }
}

/// The kinds that carry a debt.
fn bucket_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::TokenBucket),
        Just(Kind::Gcra),
        Just(Kind::LeakyBucket)
    ]
}

/// The kinds that count per window and forgive a charge beyond a full window.
fn window_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::FixedWindow),
        Just(Kind::SlidingWindow),
        Just(Kind::SlidingLog)
    ]
}

// === Quotas ===

#[test]
fn quota_rejects_zero_huge_and_nan() {
    assert_eq!(
        Quota::new(0, Rate::from_interval_ns(1).unwrap()),
        Err(QuotaError::ZeroCapacity)
    );
    assert!(matches!(
        Rate::from_interval_ns(0),
        Err(QuotaError::RateTooHigh { .. })
    ));
    for bad in [f64::NAN, -f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(matches!(
            Rate::from_per_second_f64(bad),
            Err(QuotaError::NotFinite { .. })
        ));
    }
    for bad in [0.0, -0.0, -1.0, -f64::MIN_POSITIVE, f64::MIN] {
        assert!(matches!(
            Rate::from_per_second_f64(bad),
            Err(QuotaError::NonPositiveRate { .. })
        ));
    }
    for bad in [1e9 + 1.0, 1e300, f64::MAX] {
        assert!(matches!(
            Rate::from_per_second_f64(bad),
            Err(QuotaError::RateTooHigh { .. })
        ));
    }
    for bad in [f64::MIN_POSITIVE, 5e-324, 1e-11] {
        assert!(matches!(
            Rate::from_per_second_f64(bad),
            Err(QuotaError::RateTooLow { .. })
        ));
    }
    assert_eq!(Rate::from_per_second_f64(1e9).unwrap().interval_ns(), 1);
    assert_eq!(
        Rate::from_per_second_f64(3.0).unwrap().interval_ns(),
        333_333_334
    );

    let ns = Rate::from_interval_ns(1).unwrap();
    let slowest = Rate::from_interval_ns(u64::MAX).unwrap();
    assert!(Quota::new(MAX_SPAN_NS, ns).is_ok());
    assert!(matches!(
        Quota::new(MAX_SPAN_NS + 1, ns),
        Err(QuotaError::Overflow { .. })
    ));
    assert!(matches!(
        Quota::new(u64::MAX, ns),
        Err(QuotaError::Overflow { .. })
    ));
    assert!(matches!(
        Quota::new(1, slowest),
        Err(QuotaError::Overflow { .. })
    ));
    assert!(matches!(
        Quota::new(2, Rate::from_interval_ns(MAX_SPAN_NS).unwrap()),
        Err(QuotaError::Overflow { .. })
    ));
    for text in [
        "1e400/s",
        "99999999999999999999999999999/s",
        "1/99999999999999999999999999999d",
        "0.000000000000000000000000001/d",
        "1000000000.5/s",
        "/s",
        "5/",
        ".",
        "./s",
        "-0/s",
        "+/s",
        "2/ns",
        "5000/µs",
    ] {
        let parsed = text.parse::<Rate>();
        assert!(parsed.is_err(), "{text}: {parsed:?}");
        assert!(!parsed.unwrap_err().to_string().is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    #[test]
    fn any_f64_rate_is_a_rate_or_an_error(per_second in any::<f64>()) {
        if let Ok(rate) = Rate::from_per_second_f64(per_second) {
            prop_assert!(per_second.is_finite() && per_second > 0.0);
            prop_assert!(rate.interval_ns() >= 1);
            // Rounded up: never faster than asked.
            prop_assert!(rate.interval_ns() as f64 >= 1e9 / per_second * (1.0 - 1e-15));
        }
    }

    #[test]
    fn any_text_is_a_rate_or_an_error(
        text in prop_oneof![
            ".{0,40}",
            "[+-]?[0-9.]{0,35}(/| per )[0-9.]{0,35}(ns|us|µs|ms|s|m|min|h|d|x)?",
        ]
    ) {
        if let Ok(rate) = text.parse::<Rate>() {
            prop_assert!(rate.interval_ns() >= 1);
            prop_assert_eq!(rate.to_string().parse::<Rate>(), Ok(rate));
        }
    }

    #[test]
    fn any_quota_fits_or_is_refused(capacity in any::<u64>(), interval in any::<u64>()) {
        match Rate::from_interval_ns(interval) {
            Err(_) => prop_assert_eq!(interval, 0),
            Ok(rate) => {
                let fits = capacity > 0
                    && u128::from(capacity) * u128::from(interval) <= u128::from(MAX_SPAN_NS);
                let quota = Quota::new(capacity, rate);
                prop_assert_eq!(quota.is_ok(), fits);
                if let Ok(q) = quota {
                    prop_assert_eq!(
                        u128::from(q.window_ns()),
                        u128::from(capacity) * u128::from(interval)
                    );
                }
            }
        }
    }
}

// === Costs ===

#[test]
fn cost_above_capacity_is_insufficient_capacity() {
    let q = quota(7, 1_000);
    for alg in every(q) {
        let mut traffic = alg.initial_state();
        alg.check(&mut traffic, 10, 3).unwrap();
        for mut state in [alg.initial_state(), alg.exhausted_state(5), traffic] {
            for cost in [8, 100, u64::MAX] {
                let before = state.clone();
                assert_eq!(
                    alg.check(&mut state, 20, cost),
                    Err(CheckError::InsufficientCapacity { cost, capacity: 7 }),
                    "{}",
                    alg.which()
                );
                assert_eq!(
                    state,
                    before,
                    "{}: a refused cost changed the state",
                    alg.which()
                );
            }
            assert!(alg.check(&mut state, 20, 0).unwrap().allowed);
        }
    }
}

#[test]
fn a_state_of_another_algorithm_is_refused() {
    let q = quota(3, 1_000);
    for alg in every(q) {
        for other in every(q).filter(|o| o.which() != alg.which()) {
            let mut foreign = other.initial_state();
            assert_eq!(
                alg.check(&mut foreign, 0, 1),
                Err(CheckError::StateMismatch)
            );
            alg.refund(&mut foreign, 0, 0, 1);
            assert_eq!(foreign, other.initial_state());
            let _ = alg.idle_at(&foreign);
            let _ = alg.save(&foreign, 0);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// A check of cost 0 is always allowed and changes no later decision.
    #[test]
    fn cost_zero_is_a_pure_query(
        (kind, q, steps) in (kind(), small_quota()).prop_flat_map(|(kind, q)| {
            let w = q.window_ns();
            (Just(kind), Just(q), prop::collection::vec(
                (prop_oneof![Just(0u64), 0..=w / 2, 0..=2 * w], 1..=q.capacity(),
                 prop::option::of(0..=w)),
                1..=30))
        })
    ) {
        let alg = AnyAlgorithm::new(kind, q);
        let (mut queried, mut plain) = (alg.initial_state(), alg.initial_state());
        let mut now = 0;
        for (i, &(gap, cost, query)) in steps.iter().enumerate() {
            if let Some(before) = query {
                let at = now + before.min(gap);
                let d = check(&alg, &mut queried, at, 0)?;
                prop_assert!(d.allowed && d.retry_after_ns == 0);
                prop_assert!(d.remaining <= q.capacity());
            }
            now += gap;
            prop_assert_eq!(
                check(&alg, &mut queried, now, cost)?,
                check(&alg, &mut plain, now, cost)?,
                "{} at #{}", kind, i
            );
        }
    }
}

// === Hand-built states ===

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, ..ProptestConfig::default() })]

    /// The token bucket's check (written as debt, for speed) is the textbook step — refill by
    /// the elapsed time, cap at the capacity, take the cost — on any state a caller can build,
    /// including levels above the capacity and times past `MAX_TIME_NS`. A clock behind the
    /// last check (a key in debt keeps its last check in the future) counts as no time
    /// passing, and its waits count from the last check; a key in debt refuses even a query.
    #[test]
    fn token_bucket_check_is_refill_then_take_on_any_state(
        q in any_quota(),
        level in prop_oneof![any::<u64>(), 0u64..=1_000],
        last in any_time(),
        now in any_time(),
        raw_cost in any::<u64>(),
    ) {
        let tb = TokenBucket::new(q);
        let (n, interval, tau) = (q.capacity(), q.interval_ns(), q.window_ns());
        let cost = raw_cost % (n + 1);
        let mut state = TokenBucketState { level_ns: level, last_ns: last };
        let got = tb.check(&mut state, now, cost).unwrap();

        let behind = last.saturating_sub(now.min(MAX_TIME_NS));
        let now = now.min(MAX_TIME_NS).max(last);
        let level = level.saturating_add(now - last).min(tau);
        let need = cost * interval;
        // In debt (what is owed before the last check and after it exceeds the window), even
        // a query is refused.
        let in_debt = behind.saturating_add(tau - level) > tau;
        let (allowed, left) = if level >= need && !(cost == 0 && in_debt) {
            (true, level - need)
        } else {
            (false, level)
        };
        let want = Decision {
            allowed,
            limit: n,
            remaining: left / interval,
            retry_after_ns: if allowed { 0 } else { behind.saturating_add(tau - level) - (tau - need) },
            reset_after_ns: behind.saturating_add(tau - left),
        };
        prop_assert_eq!(got, want);
        prop_assert_eq!(state, TokenBucketState { level_ns: left, last_ns: now });
    }
}

// === Times near u64::MAX ===

/// Near `u64::MAX`: a GCRA that stored `now + cost × interval` saturating at `u64::MAX` would
/// stop its TAT growing within one window of `u64::MAX` and admit every request, and the
/// window algorithms and the sliding log would do the same at `u64::MAX` itself. Times past
/// `MAX_TIME_NS` count as `MAX_TIME_NS`: the clock stops, and a burst gets the capacity.
#[test]
fn near_u64_max_a_burst_gets_the_capacity_once() {
    assert_eq!(MAX_TIME_NS, i64::MAX as u64);
    let quotas = [
        quota(2, NANOS_PER_SEC),
        quota(3, 1),
        quota(2, MAX_SPAN_NS / 2),
        quota(MAX_SPAN_NS, 1),
    ];
    for q in quotas {
        for alg in every(q) {
            let (tries, n) = (51, q.capacity().min(51));
            for t in [
                MAX_TIME_NS - 1,
                MAX_TIME_NS,
                MAX_TIME_NS + 1,
                u64::MAX - q.window_ns(),
                u64::MAX - 5,
                u64::MAX,
            ] {
                let mut state = alg.initial_state();
                let admitted = burst(&alg, &mut state, t, tries);
                assert_eq!(admitted, n, "{} {q} at {t}", alg.which());
                if t >= MAX_TIME_NS && n < tries {
                    // The clock has stopped: nothing comes back later.
                    assert_eq!(
                        burst(&alg, &mut state, u64::MAX, 2),
                        0,
                        "{} {q}",
                        alg.which()
                    );
                }
            }
        }
    }
}

/// Times at or past the ceiling, in any order.
fn late_time() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(u64::MAX),
        Just(MAX_TIME_NS),
        (0u64..=1_000).prop_map(|d| u64::MAX - d),
        (0u64..=1_000).prop_map(|d| MAX_TIME_NS + d),
        MAX_TIME_NS..=u64::MAX,
    ]
}

/// Any time, weighted to the ends of the range.
fn any_time() -> impl Strategy<Value = u64> {
    prop_oneof![
        late_time(),
        (0u64..=1_000).prop_map(|d| MAX_TIME_NS - d),
        0u64..=1_000,
        any::<u64>(),
    ]
}

/// Quotas from tiny to the largest span.
fn any_quota() -> impl Strategy<Value = Quota> {
    prop_oneof![
        small_quota(),
        (1u64..=20, 1u64..=MAX_SPAN_NS / 20).prop_map(|(c, i)| quota(c, i)),
        (1u64..=4).prop_map(|c| quota(c, MAX_SPAN_NS / c)),
        (1u64..=MAX_SPAN_NS).prop_map(|c| quota(c, MAX_SPAN_NS / c)),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Check(u64, u64),
    Refund(u64, u64, u64),
    SaveRestore(u64, u64, u64, u64),
    Exhaust(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any_time(), any::<u64>()).prop_map(|(t, c)| Op::Check(t, c)),
        1 => (any_time(), any_time(), any::<u64>()).prop_map(|(a, t, c)| Op::Refund(a, t, c)),
        1 => (any_time(), any_time(), any::<u64>(), any::<u64>())
            .prop_map(|(t, u, r, v)| Op::SaveRestore(t, u, r, v)),
        1 => any_time().prop_map(Op::Exhaust),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3_000, ..ProptestConfig::default() })]

    /// Past `MAX_TIME_NS` the clock has stopped: a schedule there, in any order, gets at most
    /// the capacity in total.
    #[test]
    fn past_the_ceiling_at_most_the_capacity(
        kind in kind(),
        q in any_quota(),
        schedule in prop::collection::vec((late_time(), any::<u64>()), 1..=30),
    ) {
        let alg = AnyAlgorithm::new(kind, q);
        let n = q.capacity();
        let mut state = alg.initial_state();
        let mut total = 0u128;
        for (t, raw) in schedule {
            let cost = 1 + raw % n;
            if check(&alg, &mut state, t, cost)?.allowed {
                total += u128::from(cost);
            }
        }
        prop_assert!(total <= u128::from(n), "{} {}: {} admitted", kind, q, total);
    }

    /// Whatever the times, quotas and costs, no operation panics and every decision is sane.
    #[test]
    fn extreme_inputs_never_panic(
        kind in kind(),
        q in any_quota(),
        ops in prop::collection::vec(op(), 1..=30),
    ) {
        let alg = AnyAlgorithm::new(kind, q);
        let n = q.capacity();
        let mut state = alg.initial_state();
        for op in ops {
            match op {
                Op::Check(t, raw) => {
                    let cost = match raw % 4 {
                        0 => raw,
                        1 => 0,
                        _ => 1 + raw % n,
                    };
                    match alg.check(&mut state, t, cost) {
                        Ok(d) => {
                            prop_assert!(cost <= n);
                            prop_assert!(d.remaining <= n && d.limit == n);
                            prop_assert!(d.allowed == (d.retry_after_ns == 0));
                        }
                        Err(e) => prop_assert_eq!(
                            e,
                            CheckError::InsufficientCapacity { cost, capacity: n }
                        ),
                    }
                }
                Op::Refund(at, t, cost) => alg.refund(&mut state, at, t, cost),
                Op::SaveRestore(t, unix_then, restart, unix_now) => {
                    let snap = Snapshot::take(&alg, &state, t, unix_then);
                    let restored = snap.restore(&alg, restart, unix_now);
                    state = restored.map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                Op::Exhaust(t) => state = alg.exhausted_state(t),
            }
            let _ = alg.idle_at(&state);
        }
    }
}
