//! The state every clone of a breaker shares: the machine under a lock, the clock, the metrics.

use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use super::config::Config;
use super::error::Open;
use super::machine::{BreakerState, Machine, Ticket};
use super::metrics::BreakerMetrics;
use super::window::WindowStats;

/// A breaker's shared state.
#[derive(Debug)]
pub(crate) struct Shared {
    name: String,
    machine: Mutex<Machine>,
    metrics: BreakerMetrics,
}

impl Shared {
    pub(crate) fn new(config: Config) -> Shared {
        Shared {
            name: config.name.clone(),
            metrics: BreakerMetrics::new(&config.name),
            machine: Mutex::new(Machine::new(config, Instant::now())),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn try_acquire(&self) -> Result<Ticket, Open> {
        let admitted = self.step(|machine, now| machine.try_acquire(now));
        admitted.map_err(|retry_after| {
            self.metrics.rejected();
            Open { retry_after }
        })
    }

    pub(crate) fn record(&self, ticket: Ticket, failed: bool, elapsed: Duration) {
        self.metrics.recorded(failed);
        self.step(|machine, now| machine.record(ticket, now, failed, elapsed));
    }

    pub(crate) fn cancel(&self, ticket: Ticket) {
        self.metrics.cancelled();
        self.step(|machine, _| machine.cancel(ticket));
    }

    pub(crate) fn state(&self) -> BreakerState {
        self.step(|machine, now| machine.state(now))
    }

    pub(crate) fn stats(&self) -> WindowStats {
        self.step(|machine, now| machine.stats(now))
    }

    /// Runs one step of the machine at the current time, reporting any change of state. The
    /// report is made under the lock, so that the state gauge ends on the latest state.
    fn step<T>(&self, f: impl FnOnce(&mut Machine, Instant) -> T) -> T {
        let now = Instant::now();
        let mut machine = self.machine.lock();
        let before = machine.current();
        let out = f(&mut machine, now);
        let after = machine.current();
        if before != after {
            self.metrics.transition(before, after);
        }
        out
    }
}
