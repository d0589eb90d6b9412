//! Carrying a key's state over to a changed quota, so that no key gains tokens.
//!
//! When an operator changes a limit (a reload), each key keeps what it has left, never more
//! than the new capacity: **tokens after = min(tokens before, new capacity)**. A key that owes
//! time (more spent than its capacity, as a bucket with queued reservations can) keeps that
//! debt, expressed in the new rate's time. A loosened limit takes effect without a reset: the
//! key refills at the new rate, towards the new capacity.
//!
//! The conversion works on [`SavedState`], whose times are relative to the moment it was saved,
//! so it needs no clock: save under the old algorithm at `now`, convert, restore under the new
//! one at the same `now` with no time elapsed ([`AnyAlgorithm::convert_state`] does the three).

use crate::algorithm::{Algorithm, SavedState};
use crate::any::{AnyAlgorithm, AnyState};
use crate::quota::{Quota, MAX_SPAN_NS};

/// `a × b / c` rounded towards minus infinity, in i128 (the operands are below 2^64).
fn mul_div_floor(a: i128, b: i128, c: i128) -> i128 {
    (a * b).div_euclid(c)
}

fn clamp_u64(value: i128, max: u64) -> u64 {
    value.clamp(0, i128::from(max)) as u64
}

impl SavedState {
    /// This state, saved under quota `from`, converted for quota `to`: what it has left now
    /// becomes `min(left, to.capacity())`, debt is kept in the new rate's time, and the times
    /// at which spent cost comes back are kept (within the new window).
    ///
    /// Restoring the result under an algorithm of the same family with quota `to` (and no
    /// time elapsed) gives a state with at most `min(before, to.capacity())` tokens left,
    /// where `before` is what restoring `self` under `from` gives.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice_core::{Algorithm, Quota, SavedState, TokenBucket};
    ///
    /// let old = Quota::parse(100, "10/s").unwrap();
    /// let new = Quota::parse(50, "10/s").unwrap();
    /// // 5 of 100 tokens left: 95 intervals of 100 ms owed.
    /// let saved = SavedState::Debt { debt_ns: 9_500_000_000 };
    /// let converted = saved.convert(&old, &new);
    /// let bucket = TokenBucket::new(new);
    /// let mut state = bucket.restore(&converted, 0, 0).unwrap();
    /// assert_eq!(bucket.check(&mut state, 0, 0).unwrap().remaining, 5); // not 50
    /// ```
    pub fn convert(&self, from: &Quota, to: &Quota) -> SavedState {
        if from == to {
            return self.clone();
        }
        let (n, w) = (i128::from(from.capacity()), i128::from(from.window_ns()));
        let (n2, w2) = (i128::from(to.capacity()), i128::from(to.window_ns()));
        match self {
            SavedState::Debt { debt_ns } => {
                // The level (tokens × interval) may be negative: time owed beyond empty.
                let level = w - i128::from(*debt_ns);
                let scaled = mul_div_floor(
                    level,
                    i128::from(to.interval_ns()),
                    i128::from(from.interval_ns()),
                );
                let level2 = scaled.min(w2);
                SavedState::Debt {
                    debt_ns: clamp_u64(w2 - level2, MAX_SPAN_NS),
                }
            }
            SavedState::Window { ends_in_ns, count } => {
                // Used after = N' − min(N − count, N').
                let count2 = (i128::from(*count) + n2 - n).max(0);
                let ends_in = if *ends_in_ns == 0 && count2 > 0 {
                    // The old window is over: hold what is carried for a whole new one.
                    to.window_ns()
                } else {
                    *ends_in_ns
                };
                SavedState::Window {
                    ends_in_ns: ends_in.min(to.window_ns()),
                    count: clamp_u64(count2, MAX_SPAN_NS),
                }
            }
            SavedState::Sliding {
                ends_in_ns,
                previous,
                current,
            } => {
                // Normalise as the algorithm would: a window at its end has rolled over.
                let (left, previous, current) = if *ends_in_ns == 0 {
                    (from.window_ns(), *current, 0)
                } else {
                    ((*ends_in_ns).min(from.window_ns()), *previous, *current)
                };
                let left = i128::from(left);
                // Whole tokens before: floor((N·W − previous·left − current·W) / W).
                let before =
                    (n * w - i128::from(previous) * left - i128::from(current) * w).div_euclid(w);
                let target = before.min(n2);
                let left2 = left.min(w2);
                let previous2 = i128::from(previous).min(n2);
                // The previous window keeps its weight; the current count makes up the rest,
                // so that floor((N'·W' − previous'·left' − current'·W') / W') ≤ target.
                let current2 = (n2 - target - (previous2 * left2).div_euclid(w2)).max(0);
                SavedState::Sliding {
                    ends_in_ns: left2 as u64,
                    previous: previous2 as u64,
                    current: clamp_u64(current2, MAX_SPAN_NS),
                }
            }
            SavedState::Log { entries } => {
                let total: i128 = entries.iter().map(|&(_, c)| i128::from(c)).sum();
                let used2 = (total + n2 - n).max(0);
                let mut entries2 = entries.clone();
                if used2 < total {
                    // Fewer units in use: the oldest leave first, as they would have.
                    let mut excess = total - used2;
                    while excess > 0 && !entries2.is_empty() {
                        let cost = i128::from(entries2[0].1);
                        if cost > excess {
                            entries2[0].1 = (cost - excess) as u64;
                            excess = 0;
                        } else {
                            entries2.remove(0);
                            excess -= cost;
                        }
                    }
                } else if used2 > total {
                    // More units in use (a raised capacity): they come back with the newest
                    // admission, or, on a key with none, after the new refill time of the gap.
                    let extra = used2 - total;
                    // (The restore clamps every time to the new window.)
                    let leaves_in = entries.last().map_or_else(
                        || clamp_u64(extra * i128::from(to.interval_ns()), to.window_ns()),
                        |&(leaves, _)| leaves,
                    );
                    entries2.push((leaves_in, clamp_u64(extra, MAX_SPAN_NS)));
                }
                SavedState::Log { entries: entries2 }
            }
        }
    }
}

impl AnyAlgorithm {
    /// `state`, kept under `from`, converted for this algorithm at `now` by the rule of
    /// [`SavedState::convert`]: no key gains tokens. Between algorithms of different state
    /// forms (say `gcra` to `fixed_window`), the key starts with what it had left (at most
    /// the new capacity), spent at `now`.
    pub fn convert_state(&self, from: &AnyAlgorithm, state: &AnyState, now: u64) -> AnyState {
        let saved = from.save(state, now);
        let converted = saved.convert(&from.quota(), &self.quota());
        if let Ok(state) = self.restore(&converted, now, 0) {
            return state;
        }
        // Another form: spend, on a full key, what the new capacity exceeds the tokens left by.
        let left = from
            .check(&mut state.clone(), now, 0)
            .map_or(0, |d| d.remaining);
        let capacity = self.quota().capacity();
        let mut fresh = self.initial_state();
        // Cost ≤ capacity, so the check cannot fail.
        let _ = self.check(&mut fresh, now, capacity - left.min(capacity));
        fresh
    }
}

impl AnyAlgorithm {
    /// [`AnyAlgorithm::convert_state`] on a saved state: `saved`, saved under `from`,
    /// converted for this algorithm, still relative to the moment it was saved.
    ///
    /// # Errors
    ///
    /// As [`Algorithm::restore`] when `saved` is not a state `from` can hold.
    pub fn convert_saved(
        &self,
        from: &AnyAlgorithm,
        saved: &SavedState,
    ) -> Result<SavedState, crate::error::SnapshotError> {
        let state = from.restore(saved, 0, 0)?;
        Ok(self.save(&self.convert_state(from, &state, 0), 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Kind;
    use crate::quota::Rate;
    use alloc::vec::Vec;
    use proptest::prelude::*;

    const SEC: u64 = 1_000_000_000;

    fn quota(capacity: u64, interval: u64) -> Quota {
        Quota::new(capacity, Rate::from_interval_ns(interval).unwrap()).unwrap()
    }

    fn remaining(alg: &AnyAlgorithm, state: &AnyState, now: u64) -> u64 {
        alg.check(&mut state.clone(), now, 0).unwrap().remaining
    }

    #[test]
    fn a_tightened_bucket_keeps_what_it_had_left_and_refills_at_the_new_rate() {
        for kind in [Kind::TokenBucket, Kind::Gcra, Kind::LeakyBucket] {
            let old = AnyAlgorithm::new(kind, quota(100, SEC / 10));
            let new = AnyAlgorithm::new(kind, quota(50, SEC / 10));
            let mut state = old.initial_state();
            old.check(&mut state, 0, 95).unwrap();
            let mut converted = new.convert_state(&old, &state, 0);
            assert_eq!(remaining(&new, &converted, 0), 5, "{kind}");
            for _ in 0..5 {
                assert!(new.check(&mut converted, 0, 1).unwrap().allowed, "{kind}");
            }
            assert!(!new.check(&mut converted, 0, 1).unwrap().allowed, "{kind}");
            // One token per 100 ms from then on.
            assert!(
                new.check(&mut converted, SEC / 10, 1).unwrap().allowed,
                "{kind}"
            );
            assert!(
                !new.check(&mut converted, SEC / 10, 1).unwrap().allowed,
                "{kind}"
            );
        }
    }

    #[test]
    fn a_loosened_bucket_refills_towards_the_new_capacity_without_a_reset() {
        let old = AnyAlgorithm::new(Kind::Gcra, quota(10, SEC));
        let new = AnyAlgorithm::new(Kind::Gcra, quota(100, SEC / 10));
        let mut state = old.initial_state();
        old.check(&mut state, 0, 8).unwrap();
        let converted = new.convert_state(&old, &state, 0);
        assert_eq!(remaining(&new, &converted, 0), 2, "no reset");
        // The new rate: 10 per second.
        assert_eq!(remaining(&new, &converted, SEC), 12);
        assert_eq!(
            remaining(&new, &converted, 100 * SEC),
            100,
            "full in the end"
        );
    }

    #[test]
    fn debt_beyond_empty_is_kept_in_the_new_rate() {
        let old = quota(10, SEC);
        let new = quota(10, SEC / 2);
        // 10 tokens spent and 4 more owed: 14 s of debt.
        let saved = SavedState::Debt { debt_ns: 14 * SEC };
        // 14 tokens missing of 10, at 0.5 s each: 7 s.
        assert_eq!(
            saved.convert(&old, &new),
            SavedState::Debt { debt_ns: 7 * SEC }
        );
    }

    #[test]
    fn windows_keep_their_count_of_what_is_used() {
        let saved = SavedState::Window {
            ends_in_ns: SEC,
            count: 95,
        };
        let converted = saved.convert(&quota(100, SEC / 100), &quota(50, SEC / 50));
        assert_eq!(
            converted,
            SavedState::Window {
                ends_in_ns: SEC,
                count: 45
            }
        );
        let log = SavedState::Log {
            entries: Vec::from([(SEC / 2, 90), (SEC, 5)]),
        };
        let converted = log.convert(&quota(100, SEC / 100), &quota(50, SEC / 100));
        assert_eq!(
            converted,
            SavedState::Log {
                entries: Vec::from([(SEC / 2, 40), (SEC, 5)])
            }
        );
    }

    #[test]
    fn saved_states_convert_as_live_ones() {
        let old = AnyAlgorithm::new(Kind::SlidingWindow, quota(10, SEC));
        let new = AnyAlgorithm::new(Kind::Gcra, quota(4, SEC));
        let mut state = old.initial_state();
        old.check(&mut state, 0, 8).unwrap();
        let saved = new.convert_saved(&old, &old.save(&state, 0)).unwrap();
        let restored = new.restore(&saved, 7, 0).unwrap();
        assert_eq!(remaining(&new, &restored, 7), 2);
        assert!(new
            .convert_saved(&old, &SavedState::Debt { debt_ns: 1 })
            .is_err());
    }

    #[test]
    fn another_form_starts_with_what_was_left() {
        let old = AnyAlgorithm::new(Kind::Gcra, quota(10, SEC));
        let new = AnyAlgorithm::new(Kind::FixedWindow, quota(20, SEC));
        let mut state = old.initial_state();
        old.check(&mut state, 0, 7).unwrap();
        let converted = new.convert_state(&old, &state, 5);
        assert_eq!(remaining(&new, &converted, 5), 3);
    }

    fn any_quota() -> impl Strategy<Value = Quota> {
        (1u64..=200, prop_oneof![1u64..=1_000, SEC / 100..=SEC])
            .prop_map(|(capacity, interval)| quota(capacity, interval))
    }

    /// A state reached by a schedule of checks (and refunds) under `alg`, and the time after it.
    fn reached(alg: &AnyAlgorithm, ops: &[(u64, u64, bool)]) -> (AnyState, u64) {
        let capacity = alg.quota().capacity();
        let mut state = alg.initial_state();
        let mut now = 0u64;
        for &(gap, cost, refund) in ops {
            now += gap % (2 * alg.quota().window_ns().max(1));
            if refund {
                alg.refund(&mut state, now, now, cost % (capacity + 1));
            } else {
                let _ = alg.check(&mut state, now, cost % (capacity + 1));
            }
        }
        (state, now)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 4_000, ..ProptestConfig::default() })]

        /// For any algorithm, any state it can reach and any new quota, of any algorithm: the
        /// tokens left after the conversion are at most min(before, new capacity).
        #[test]
        fn no_key_gains_tokens(
            kind in prop::sample::select(Kind::ALL.to_vec()),
            new_kind in prop::sample::select(Kind::ALL.to_vec()),
            same_kind in any::<bool>(),
            from in any_quota(),
            to in any_quota(),
            ops in prop::collection::vec((any::<u64>(), any::<u64>(), prop::bool::weighted(0.1)), 0..40),
            later in 0u64..3,
        ) {
            let old = AnyAlgorithm::new(kind, from);
            let new = AnyAlgorithm::new(if same_kind { kind } else { new_kind }, to);
            let (state, now) = reached(&old, &ops);
            let now = now + later;
            let before = remaining(&old, &state, now);
            let converted = new.convert_state(&old, &state, now);
            let after = remaining(&new, &converted, now);
            prop_assert!(after <= before.min(to.capacity()), "{kind} -> {}: before {before}, after {after}", new.which());
        }

        /// The same, on saved forms of any value the restore accepts.
        #[test]
        fn no_saved_state_gains_tokens(
            kind in prop::sample::select(Kind::ALL.to_vec()),
            from in any_quota(),
            to in any_quota(),
            a in 0u64..=4_000_000_000_000,
            b in 0u64..=400,
            c in 0u64..=400,
        ) {
            let saved = match kind {
                Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => SavedState::Debt { debt_ns: a },
                Kind::FixedWindow => SavedState::Window { ends_in_ns: a, count: b },
                Kind::SlidingWindow => SavedState::Sliding { ends_in_ns: a, previous: b, current: c },
                Kind::SlidingLog => SavedState::Log {
                    entries: if b == 0 { Vec::new() } else { Vec::from([(a / 2, b), (a, c.max(1))]) },
                },
            };
            let old = AnyAlgorithm::new(kind, from);
            let new = AnyAlgorithm::new(kind, to);
            let before_state = old.restore(&saved, 0, 0).unwrap();
            let before = remaining(&old, &before_state, 0);
            let converted = saved.convert(&from, &to);
            let after_state = new.restore(&converted, 0, 0);
            prop_assert!(after_state.is_ok(), "{kind}: {converted:?} does not restore");
            let after = remaining(&new, &after_state.unwrap(), 0);
            prop_assert!(after <= before.min(to.capacity()), "{kind}: before {before}, after {after}");
        }
    }
}
