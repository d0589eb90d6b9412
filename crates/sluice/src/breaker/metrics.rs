//! The metric handles of a [`CircuitBreaker`](super::CircuitBreaker), registered once through
//! the `metrics` facade; the names and labels are listed in the [module docs](super).

use metrics::{Counter, Gauge};

use super::machine::BreakerState;

/// The handles of one breaker.
#[derive(Debug)]
pub(crate) struct BreakerMetrics {
    state: Gauge,
    rejections: Counter,
    closed_to_open: Counter,
    open_to_half_open: Counter,
    half_open_to_closed: Counter,
    half_open_to_open: Counter,
    successes: Counter,
    failures: Counter,
    cancelled: Counter,
}

impl BreakerMetrics {
    pub(crate) fn new(name: &str) -> BreakerMetrics {
        let name = name.to_owned();
        let transition = |from: BreakerState, to: BreakerState| {
            metrics::counter!(
                "sluice_breaker_transitions_total",
                "breaker" => name.clone(),
                "from" => from.as_str(),
                "to" => to.as_str()
            )
        };
        let calls = |outcome: &'static str| metrics::counter!("sluice_breaker_calls_total", "breaker" => name.clone(), "outcome" => outcome);
        let metrics = BreakerMetrics {
            state: metrics::gauge!("sluice_breaker_state", "breaker" => name.clone()),
            rejections: metrics::counter!("sluice_breaker_rejections_total", "breaker" => name.clone()),
            closed_to_open: transition(BreakerState::Closed, BreakerState::Open),
            open_to_half_open: transition(BreakerState::Open, BreakerState::HalfOpen),
            half_open_to_closed: transition(BreakerState::HalfOpen, BreakerState::Closed),
            half_open_to_open: transition(BreakerState::HalfOpen, BreakerState::Open),
            successes: calls("success"),
            failures: calls("failure"),
            cancelled: calls("cancelled"),
        };
        metrics.state.set(gauge_value(BreakerState::Closed));
        metrics
    }

    /// The breaker went from `from` to `to`.
    pub(crate) fn transition(&self, from: BreakerState, to: BreakerState) {
        let counter = match (from, to) {
            (BreakerState::Closed, BreakerState::Open) => &self.closed_to_open,
            (BreakerState::Open, BreakerState::HalfOpen) => &self.open_to_half_open,
            (BreakerState::HalfOpen, BreakerState::Closed) => &self.half_open_to_closed,
            (BreakerState::HalfOpen, BreakerState::Open) => &self.half_open_to_open,
            // The machine makes no other move; a state that did not change is no transition.
            _ => return,
        };
        counter.increment(1);
        self.state.set(gauge_value(to));
    }

    pub(crate) fn rejected(&self) {
        self.rejections.increment(1);
    }

    pub(crate) fn recorded(&self, failed: bool) {
        if failed {
            self.failures.increment(1);
        } else {
            self.successes.increment(1);
        }
    }

    pub(crate) fn cancelled(&self) {
        self.cancelled.increment(1);
    }
}

/// `sluice_breaker_state`: 0 closed, 1 half-open, 2 open, so that higher is worse.
fn gauge_value(state: BreakerState) -> f64 {
    match state {
        BreakerState::Closed => 0.0,
        BreakerState::HalfOpen => 1.0,
        BreakerState::Open => 2.0,
    }
}
