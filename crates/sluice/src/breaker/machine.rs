//! The breaker's state machine as pure steps: each takes the time as an argument and changes
//! only the machine, so that tests can drive it without a clock and the caller adds the lock,
//! the clock and the metrics.

use std::time::Duration;

use tokio::time::Instant;

use super::config::Config;
use super::window::{Call, CallWindow, WindowStats};

/// Far enough away to mean "never" (tokio's own choice for its far future).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The state of a circuit breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BreakerState {
    /// Calls go through and are recorded; enough failures or slow calls open the breaker.
    Closed,
    /// Calls are rejected until the wait is over.
    Open,
    /// A bounded number of probe calls go through: all succeeding closes the breaker, one
    /// failing (or slow) opens it again.
    HalfOpen,
}

/// The state with its data.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        /// Probes admitted and not yet recorded or cancelled.
        in_flight: u32,
        /// Probes that succeeded.
        succeeded: u32,
    },
}

/// Proof of admission, handed back when the call is recorded or cancelled. A ticket from an
/// earlier epoch (the state changed since it was issued) is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    epoch: u64,
}

/// The breaker's state machine.
#[derive(Debug)]
pub(crate) struct Machine {
    config: Config,
    phase: Phase,
    window: CallWindow,
    /// Bumped on every state change, so that calls admitted before it are not counted after.
    epoch: u64,
}

// === impl BreakerState ===

impl BreakerState {
    /// `closed`, `open` or `half_open`, as in the metrics.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

// === impl Machine ===

impl Machine {
    pub(crate) fn new(config: Config, now: Instant) -> Machine {
        Machine {
            window: CallWindow::new(config.window, now),
            config,
            phase: Phase::Closed,
            epoch: 0,
        }
    }

    /// The state as it stands, without applying the end of an open wait.
    pub(crate) fn current(&self) -> BreakerState {
        match self.phase {
            Phase::Closed => BreakerState::Closed,
            Phase::Open { .. } => BreakerState::Open,
            Phase::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The state a call arriving at `now` would meet: an open breaker whose wait is over is
    /// half-open, and becomes so here.
    pub(crate) fn state(&mut self, now: Instant) -> BreakerState {
        self.wake(now);
        self.current()
    }

    /// The counts of the current window. It is emptied on every state change.
    pub(crate) fn stats(&mut self, now: Instant) -> WindowStats {
        self.window.stats(now)
    }

    /// Admits a call, or says how long to wait.
    pub(crate) fn try_acquire(&mut self, now: Instant) -> Result<Ticket, Duration> {
        self.wake(now);
        let ticket = Ticket { epoch: self.epoch };
        match &mut self.phase {
            Phase::Closed => Ok(ticket),
            Phase::Open { until } => Err(until.saturating_duration_since(now)),
            Phase::HalfOpen {
                in_flight,
                succeeded,
            } => {
                if in_flight.saturating_add(*succeeded) < self.config.half_open_probes {
                    *in_flight += 1;
                    Ok(ticket)
                } else {
                    // Every probe is out; if they fail the breaker opens for this long, and if
                    // they succeed a caller that came back sooner would have been admitted.
                    Err(self.config.open_for)
                }
            }
        }
    }

    /// Records how an admitted call went: it failed or not, and took `elapsed`.
    pub(crate) fn record(&mut self, ticket: Ticket, now: Instant, failed: bool, elapsed: Duration) {
        if ticket.epoch != self.epoch {
            return;
        }
        let slow = self
            .config
            .slow
            .is_some_and(|slow| elapsed >= slow.threshold);
        match &mut self.phase {
            Phase::Closed => {
                self.window.record(now, Call { failed, slow });
                if self.should_trip(now) {
                    self.open(now);
                }
            }
            // Not reachable with a current ticket: nothing is admitted while open.
            Phase::Open { .. } => {}
            Phase::HalfOpen {
                in_flight,
                succeeded,
            } => {
                *in_flight = in_flight.saturating_sub(1);
                if failed || slow {
                    self.open(now);
                } else {
                    *succeeded += 1;
                    if *succeeded >= self.config.half_open_probes {
                        self.close(now);
                    }
                }
            }
        }
    }

    /// Forgets an admitted call that ended without a verdict. A half-open probe slot is freed.
    pub(crate) fn cancel(&mut self, ticket: Ticket) {
        if ticket.epoch != self.epoch {
            return;
        }
        if let Phase::HalfOpen { in_flight, .. } = &mut self.phase {
            *in_flight = in_flight.saturating_sub(1);
        }
    }

    fn should_trip(&mut self, now: Instant) -> bool {
        let stats = self.window.stats(now);
        if stats.calls < u64::from(self.config.min_calls) {
            return false;
        }
        stats.failure_rate() >= self.config.failure_rate
            || self
                .config
                .slow
                .is_some_and(|slow| stats.slow_call_rate() >= slow.rate)
    }

    /// Open → half-open once the wait is over.
    fn wake(&mut self, now: Instant) {
        if let Phase::Open { until } = self.phase {
            if now >= until {
                self.enter(
                    Phase::HalfOpen {
                        in_flight: 0,
                        succeeded: 0,
                    },
                    now,
                );
            }
        }
    }

    fn open(&mut self, now: Instant) {
        let until = now
            .checked_add(self.config.open_for)
            .or_else(|| now.checked_add(FAR_FUTURE))
            .unwrap_or(now);
        self.enter(Phase::Open { until }, now);
    }

    fn close(&mut self, now: Instant) {
        self.enter(Phase::Closed, now);
    }

    fn enter(&mut self, phase: Phase, now: Instant) {
        self.phase = phase;
        self.epoch += 1;
        self.window.clear(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::config::BreakerBuilder;

    const MS: Duration = Duration::from_millis(1);

    fn machine(builder: BreakerBuilder, now: Instant) -> Machine {
        Machine::new(builder.validate().unwrap(), now)
    }

    fn call(m: &mut Machine, now: Instant, failed: bool) -> Result<(), Duration> {
        let ticket = m.try_acquire(now)?;
        m.record(ticket, now, failed, Duration::ZERO);
        Ok(())
    }

    #[test]
    fn a_stale_ticket_changes_nothing() {
        let t0 = Instant::now();
        let b = BreakerBuilder::new()
            .count_window(2)
            .min_calls(2)
            .half_open_probes(1)
            .open_for(10 * MS);
        let mut m = machine(b, t0);
        let early = m.try_acquire(t0).unwrap();
        call(&mut m, t0, true).unwrap();
        call(&mut m, t0, true).unwrap();
        assert_eq!(m.state(t0), BreakerState::Open);
        // Half-open: the only probe slot is free; a pre-open call's verdict must not take it,
        // nor close the breaker.
        let t1 = t0 + 10 * MS;
        assert_eq!(m.state(t1), BreakerState::HalfOpen);
        m.record(early, t1, false, Duration::ZERO);
        assert_eq!(m.state(t1), BreakerState::HalfOpen);
        m.cancel(early);
        let probe = m.try_acquire(t1).unwrap();
        assert_eq!(m.try_acquire(t1), Err(10 * MS), "one probe only");
        m.record(probe, t1, false, Duration::ZERO);
        assert_eq!(m.state(t1), BreakerState::Closed);
    }

    #[test]
    fn slow_failures_count_as_both() {
        let t0 = Instant::now();
        let b = BreakerBuilder::new()
            .count_window(4)
            .min_calls(4)
            .failure_rate(1.0)
            .slow_calls(100 * MS, 0.5);
        let mut m = machine(b, t0);
        for (failed, took) in [(true, 100 * MS), (false, 99 * MS), (false, Duration::ZERO)] {
            let t = m.try_acquire(t0).unwrap();
            m.record(t, t0, failed, took);
        }
        assert_eq!(
            m.stats(t0),
            WindowStats {
                calls: 3,
                failures: 1,
                slow_calls: 1
            }
        );
        let t = m.try_acquire(t0).unwrap();
        m.record(t, t0, false, 250 * MS);
        assert_eq!(m.state(t0), BreakerState::Open, "2 of 4 slow");
    }

    #[test]
    fn a_huge_wait_does_not_overflow() {
        let t0 = Instant::now();
        let b = BreakerBuilder::new()
            .count_window(1)
            .min_calls(1)
            .open_for(Duration::MAX);
        let mut m = machine(b, t0);
        call(&mut m, t0, true).unwrap();
        let wait = m.try_acquire(t0).unwrap_err();
        assert!(wait >= FAR_FUTURE, "{wait:?}");
    }
}
