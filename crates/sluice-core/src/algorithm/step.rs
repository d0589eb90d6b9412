//! The contract every algorithm meets, and the time-relative form its state is saved in.

use alloc::vec::Vec;
use core::fmt::Debug;

use crate::algorithm::kind::Kind;
use crate::decision::Decision;
use crate::error::{CheckError, SnapshotError};
use crate::quota::{Quota, MAX_SPAN_NS};

/// The latest time the algorithms tell apart; later times count as this one.
///
/// It is `u64::MAX − 2 × MAX_SPAN_NS` (= `i64::MAX`, the year 2262 for a Unix-epoch origin), so
/// that a stored time, at most `now + 2 × window` even after a backward clock, cannot overflow.
pub const MAX_TIME_NS: u64 = u64::MAX - 2 * MAX_SPAN_NS;

/// `now`, or [`MAX_TIME_NS`] if later.
#[inline]
pub(crate) fn clamp_time(now: u64) -> u64 {
    if now > MAX_TIME_NS {
        MAX_TIME_NS
    } else {
        now
    }
}

/// The most refill time a bucket may owe, its debt included (2^62 ns, about 146 years),
/// whatever `max_debt` allows: it keeps every time a bucket stores representable, and every
/// saved state readable.
pub const MAX_DEBT_NS: u64 = MAX_SPAN_NS;

/// `if condition { a } else { b }`, asking the compiler for a conditional move
/// (`core::hint::select_unpredictable`, the reason the minimum Rust version is 1.88).
///
/// Used where a check's arithmetic on the clock reading would otherwise be split by a branch
/// that LLVM's x86 cmov-to-branch heuristic inserts when the step is inlined into a caller's
/// loop: the branch is well predicted, yet the core bench measured the branchy token bucket
/// 0.6 to 1.3 ns slower per check than the same code with a conditional move (the GCRA step,
/// whose `max` keeps its conditional move, does not have the problem). The figures are in
/// BENCHMARKS-history.md, section "Core: what the figures rest on".
#[inline(always)]
pub(crate) fn select_unpredictable(condition: bool, a: u64, b: u64) -> u64 {
    core::hint::select_unpredictable(condition, a, b)
}

/// A rate-limiting algorithm as a pure step over caller-held state.
///
/// The algorithm holds only its configuration; the caller keeps one [`Algorithm::State`] per
/// limited thing (per key) and supplies the time. This is what lets the same step run in a
/// compare-and-swap loop, in a sharded map, in a Redis script's twin, or in a browser.
///
/// Time is a monotonic count of nanoseconds from any origin the caller likes. If it goes
/// backwards, the step treats it as not having moved (or, for GCRA, as a later moment of the
/// same debt): no tokens are ever minted by a backward clock, and nothing panics. Times after
/// [`MAX_TIME_NS`] (about 292 years from the origin) count as [`MAX_TIME_NS`], as if the clock
/// had stopped there: that keeps `now + window` representable, so a full limiter never looks
/// empty because a time saturated.
pub trait Algorithm {
    /// Everything the algorithm remembers about one key.
    type State: Clone + Debug + PartialEq;

    /// Which algorithm this is.
    fn kind(&self) -> Kind;

    /// The configuration name (`token_bucket`, `gcra`, ...).
    fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Capacity and rate.
    fn quota(&self) -> Quota;

    /// The state of a key never seen: full (every algorithm starts able to admit `capacity`).
    fn initial_state(&self) -> Self::State;

    /// The state of a key that just spent everything at `now`: the worst case a restore assumes
    /// when it cannot trust what it read.
    fn exhausted_state(&self, now: u64) -> Self::State;

    /// Decides whether `cost` tokens may be taken at `now` and, if so, takes them.
    ///
    /// A cost of zero is a query: always allowed, nothing consumed. A denial leaves the state
    /// equivalent to what it was (it may be normalised, e.g. a window rolled forward).
    ///
    /// # Errors
    ///
    /// [`CheckError::InsufficientCapacity`] when `cost` exceeds the capacity: no wait could
    /// ever admit it, so none should be attempted.
    fn check(&self, state: &mut Self::State, now: u64, cost: u64) -> Result<Decision, CheckError>;

    /// Gives back `cost` that was admitted at `admitted_at` but never used (its caller went
    /// away before it could run), as of `now`. The result never holds more than the initial
    /// state: a refund can undo a consumption, never add capacity.
    fn refund(&self, state: &mut Self::State, admitted_at: u64, now: u64, cost: u64);

    /// Takes `cost` at `now` without asking: for a cost learnt only once the work was done
    /// (the tokens an LLM answer used, the bytes a download sent), which must be paid
    /// whatever is left.
    ///
    /// The bucket algorithms (token bucket, GCRA, leaky bucket) take all of it: what the key
    /// has left, then up to `max_debt` tokens beyond empty. A key in debt is refused (its
    /// `retry_after` covers the debt) until the refill has paid the debt and refilled the cost
    /// asked, so over any window of length T a key is charged at most `capacity + rate × T`
    /// plus what it still owes at the window's end. `u64::MAX` sets no cap beyond what the
    /// state can count ([`MAX_DEBT_NS`] of refill in all).
    ///
    /// The window algorithms (fixed window, sliding window, sliding log) count admissions
    /// per window and cannot carry a debt into the next one: they take what is left, up to
    /// `cost`, and ignore `max_debt`.
    ///
    /// Returns the part of `cost` that was not taken, which is forgiven (0 when all was).
    fn charge(&self, state: &mut Self::State, now: u64, cost: u64, max_debt: u64) -> u64;

    /// The earliest time at which `state` is equivalent to [`Algorithm::initial_state`], so an
    /// idle key can be dropped and a store entry can expire. Zero if it already is.
    fn idle_at(&self, state: &Self::State) -> u64;

    /// The state with every time expressed relative to `now`, for a snapshot.
    fn save(&self, state: &Self::State, now: u64) -> SavedState;

    /// Rebuilds a state from [`Algorithm::save`]'s output at the new `now`, after `elapsed_ns`
    /// of wall-clock time passed. Values beyond this quota (it may have changed) are clamped to
    /// it, so a restored state never holds more than the capacity.
    ///
    /// # Errors
    ///
    /// [`SnapshotError::Corrupt`] for values no state of this algorithm can hold, and
    /// [`SnapshotError::AlgorithmMismatch`] for another algorithm's saved form.
    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<Self::State, SnapshotError>;
}

/// An algorithm's state with its times made relative to the moment it was saved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(tag = "form", rename_all = "snake_case"))]
pub enum SavedState {
    /// Token bucket, GCRA and leaky bucket: how long until the bucket is full again.
    Debt {
        /// Nanoseconds of refill still owed.
        debt_ns: u64,
    },
    /// Fixed window: the current window's count and the time left in it.
    Window {
        /// Nanoseconds until the current window ends.
        ends_in_ns: u64,
        /// Cost admitted in the current window.
        count: u64,
    },
    /// Sliding window counter: the previous and current windows' counts.
    Sliding {
        /// Nanoseconds until the current window ends.
        ends_in_ns: u64,
        /// Cost admitted in the previous window.
        previous: u64,
        /// Cost admitted in the current window.
        current: u64,
    },
    /// Sliding log: each admission still in the window, oldest first.
    Log {
        /// `(nanoseconds until it leaves the window, cost)`.
        entries: Vec<(u64, u64)>,
    },
}

impl SavedState {
    /// The algorithm family of this form, for error messages.
    pub(crate) fn form(&self) -> &'static str {
        match self {
            SavedState::Debt { .. } => "token_bucket/gcra/leaky_bucket",
            SavedState::Window { .. } => "fixed_window",
            SavedState::Sliding { .. } => "sliding_window",
            SavedState::Log { .. } => "sliding_log",
        }
    }
}

/// Rejects costs that can never be admitted.
pub(crate) fn ensure_cost(quota: &Quota, cost: u64) -> Result<(), CheckError> {
    if cost > quota.capacity() {
        Err(CheckError::InsufficientCapacity {
            cost,
            capacity: quota.capacity(),
        })
    } else {
        Ok(())
    }
}

/// A charge on a bucket held as the time it is full again (GCRA's TAT): `cost` is taken in
/// whole tokens, down to `max_debt` tokens beyond empty at `now`. Returns the new TAT and the
/// tokens forgiven.
#[inline]
pub(crate) fn charge_tat(
    tat: u64,
    now: u64,
    cost: u64,
    interval: u64,
    tau: u64,
    max_debt: u64,
) -> (u64, u64) {
    let now = clamp_time(now);
    let base = tat.max(now);
    // now ≤ MAX_TIME_NS = u64::MAX − 2^63 and the span ≤ 2^62: no overflow.
    let floor = now
        + tau
            .saturating_add(max_debt.saturating_mul(interval))
            .min(MAX_DEBT_NS);
    let room = floor.saturating_sub(base) / interval;
    let taken = cost.min(room);
    (base + taken * interval, cost - taken)
}

/// A charge on a window algorithm: what is left, up to `cost`, taken as a check takes it.
/// Returns the part not taken.
pub(crate) fn charge_within<A: Algorithm + ?Sized>(
    algorithm: &A,
    state: &mut A::State,
    now: u64,
    cost: u64,
) -> u64 {
    let left = match algorithm.check(state, now, 0) {
        Ok(d) => d.remaining,
        Err(_) => 0,
    };
    let take = cost.min(left).min(algorithm.quota().capacity());
    if take == 0 {
        return cost;
    }
    match algorithm.check(state, now, take) {
        Ok(d) if d.allowed => cost - take,
        _ => cost,
    }
}

/// Restores a debt-shaped state: validates it, then subtracts the time that passed.
pub(crate) fn restore_debt(
    saved: &SavedState,
    expected: &'static str,
    elapsed_ns: u64,
) -> Result<u64, SnapshotError> {
    match saved {
        SavedState::Debt { debt_ns } => {
            if *debt_ns > MAX_SPAN_NS {
                return Err(SnapshotError::Corrupt {
                    field: "debt_ns",
                    value: *debt_ns,
                });
            }
            // A debt beyond the window (a settled charge, see `Algorithm::charge`) is kept:
            // forgiving it on a restart would give the key tokens.
            Ok((*debt_ns).saturating_sub(elapsed_ns))
        }
        other => Err(SnapshotError::AlgorithmMismatch {
            found: other.form(),
            expected,
        }),
    }
}
