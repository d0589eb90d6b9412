//! Choosing an algorithm at run time, by its configuration name.

use crate::algorithm::{
    Algorithm, FixedWindow, FixedWindowState, Gcra, Kind, LeakyBucket, LeakyBucketState,
    SavedState, SlidingLog, SlidingLogState, SlidingWindow, SlidingWindowState, TokenBucket,
    TokenBucketState,
};
use crate::decision::Decision;
use crate::error::{CheckError, SnapshotError};
use crate::quota::Quota;

/// Any algorithm, chosen at run time.
///
/// # Examples
///
/// ```
/// use sluice_core::{Algorithm, AnyAlgorithm, Kind, Quota};
///
/// let alg = AnyAlgorithm::new("sliding_log".parse::<Kind>().unwrap(), Quota::parse(10, "10/min").unwrap());
/// let mut state = alg.initial_state();
/// assert!(alg.check(&mut state, 0, 10).unwrap().allowed);
/// assert!(!alg.check(&mut state, 59_000_000_000, 1).unwrap().allowed);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnyAlgorithm {
    /// See [`TokenBucket`].
    TokenBucket(TokenBucket),
    /// See [`Gcra`].
    Gcra(Gcra),
    /// See [`LeakyBucket`].
    LeakyBucket(LeakyBucket),
    /// See [`SlidingLog`].
    SlidingLog(SlidingLog),
    /// See [`SlidingWindow`].
    SlidingWindow(SlidingWindow),
    /// See [`FixedWindow`].
    FixedWindow(FixedWindow),
}

/// The state of any algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum AnyState {
    TokenBucket(TokenBucketState),
    Gcra(u64),
    LeakyBucket(LeakyBucketState),
    SlidingLog(SlidingLogState),
    SlidingWindow(SlidingWindowState),
    FixedWindow(FixedWindowState),
}

impl AnyAlgorithm {
    /// What a key whose check or query answered `decision` owes beyond an empty bucket, in
    /// nanoseconds of refill: the debt a settled charge left (see [`Algorithm::charge`]),
    /// paid when this much time has passed. Zero for a key not in debt, and for the window
    /// algorithms, which carry no debt.
    pub fn debt_ns(&self, decision: &Decision) -> u64 {
        match self.kind() {
            Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => decision
                .reset_after_ns
                .saturating_sub(self.quota().window_ns()),
            _ => 0,
        }
    }

    /// [`AnyAlgorithm::debt_ns`] in whole tokens, rounded up.
    pub fn debt_tokens(&self, decision: &Decision) -> u64 {
        self.debt_ns(decision).div_ceil(self.quota().interval_ns())
    }

    /// The algorithm `kind` over `quota`.
    pub const fn new(kind: Kind, quota: Quota) -> AnyAlgorithm {
        match kind {
            Kind::TokenBucket => AnyAlgorithm::TokenBucket(TokenBucket::new(quota)),
            Kind::Gcra => AnyAlgorithm::Gcra(Gcra::new(quota)),
            Kind::LeakyBucket => AnyAlgorithm::LeakyBucket(LeakyBucket::new(quota)),
            Kind::SlidingLog => AnyAlgorithm::SlidingLog(SlidingLog::new(quota)),
            Kind::SlidingWindow => AnyAlgorithm::SlidingWindow(SlidingWindow::new(quota)),
            Kind::FixedWindow => AnyAlgorithm::FixedWindow(FixedWindow::new(quota)),
        }
    }

    /// Which algorithm this is.
    pub const fn which(&self) -> Kind {
        match self {
            AnyAlgorithm::TokenBucket(_) => Kind::TokenBucket,
            AnyAlgorithm::Gcra(_) => Kind::Gcra,
            AnyAlgorithm::LeakyBucket(_) => Kind::LeakyBucket,
            AnyAlgorithm::SlidingLog(_) => Kind::SlidingLog,
            AnyAlgorithm::SlidingWindow(_) => Kind::SlidingWindow,
            AnyAlgorithm::FixedWindow(_) => Kind::FixedWindow,
        }
    }
}

/// Runs `$body` with `$a` bound to the concrete algorithm, and `$s` to its state if it matches.
macro_rules! dispatch {
    ($self:expr, $state:expr, |$a:ident, $s:ident| $body:expr, $mismatch:expr) => {
        match ($self, $state) {
            (AnyAlgorithm::TokenBucket($a), AnyState::TokenBucket($s)) => $body,
            (AnyAlgorithm::Gcra($a), AnyState::Gcra($s)) => $body,
            (AnyAlgorithm::LeakyBucket($a), AnyState::LeakyBucket($s)) => $body,
            (AnyAlgorithm::SlidingLog($a), AnyState::SlidingLog($s)) => $body,
            (AnyAlgorithm::SlidingWindow($a), AnyState::SlidingWindow($s)) => $body,
            (AnyAlgorithm::FixedWindow($a), AnyState::FixedWindow($s)) => $body,
            _ => $mismatch,
        }
    };
}

/// Runs `$body` with `$a` bound to the concrete algorithm.
macro_rules! each {
    ($self:expr, |$a:ident| $body:expr) => {
        match $self {
            AnyAlgorithm::TokenBucket($a) => $body,
            AnyAlgorithm::Gcra($a) => $body,
            AnyAlgorithm::LeakyBucket($a) => $body,
            AnyAlgorithm::SlidingLog($a) => $body,
            AnyAlgorithm::SlidingWindow($a) => $body,
            AnyAlgorithm::FixedWindow($a) => $body,
        }
    };
}

/// Runs `$body` (which returns a state) with `$a` bound to the concrete algorithm, wrapping the
/// state in the matching [`AnyState`] variant via `$wrap`.
macro_rules! wrap {
    ($self:expr, |$a:ident| $body:expr, $wrap:ident) => {
        match $self {
            AnyAlgorithm::TokenBucket($a) => $wrap!($body, AnyState::TokenBucket),
            AnyAlgorithm::Gcra($a) => $wrap!($body, AnyState::Gcra),
            AnyAlgorithm::LeakyBucket($a) => $wrap!($body, AnyState::LeakyBucket),
            AnyAlgorithm::SlidingLog($a) => $wrap!($body, AnyState::SlidingLog),
            AnyAlgorithm::SlidingWindow($a) => $wrap!($body, AnyState::SlidingWindow),
            AnyAlgorithm::FixedWindow($a) => $wrap!($body, AnyState::FixedWindow),
        }
    };
}

macro_rules! plain {
    ($body:expr, $variant:path) => {
        $variant($body)
    };
}

macro_rules! fallible {
    ($body:expr, $variant:path) => {
        $body.map($variant)
    };
}

impl Algorithm for AnyAlgorithm {
    type State = AnyState;

    fn kind(&self) -> Kind {
        self.which()
    }

    fn quota(&self) -> Quota {
        each!(self, |a| a.quota())
    }

    fn initial_state(&self) -> AnyState {
        wrap!(self, |a| a.initial_state(), plain)
    }

    fn exhausted_state(&self, now: u64) -> AnyState {
        wrap!(self, |a| a.exhausted_state(now), plain)
    }

    #[inline]
    fn check(&self, state: &mut AnyState, now: u64, cost: u64) -> Result<Decision, CheckError> {
        dispatch!(
            self,
            state,
            |a, s| a.check(s, now, cost),
            Err(CheckError::StateMismatch)
        )
    }

    fn refund(&self, state: &mut AnyState, admitted_at: u64, now: u64, cost: u64) {
        dispatch!(self, state, |a, s| a.refund(s, admitted_at, now, cost), ())
    }

    fn charge(&self, state: &mut AnyState, now: u64, cost: u64, max_debt: u64) -> u64 {
        // A mismatched state cannot be charged: the whole cost is forgiven.
        dispatch!(self, state, |a, s| a.charge(s, now, cost, max_debt), cost)
    }

    fn idle_at(&self, state: &AnyState) -> u64 {
        // A mismatched state is unusable; report it idle so it is replaced.
        dispatch!(self, state, |a, s| a.idle_at(s), 0)
    }

    fn save(&self, state: &AnyState, now: u64) -> SavedState {
        dispatch!(
            self,
            state,
            |a, s| a.save(s, now),
            SavedState::Debt {
                debt_ns: self.quota().window_ns()
            }
        )
    }

    fn restore(
        &self,
        saved: &SavedState,
        now: u64,
        elapsed_ns: u64,
    ) -> Result<AnyState, SnapshotError> {
        wrap!(self, |a| a.restore(saved, now, elapsed_ns), fallible)
    }
}
