//! The permit of one admitted call: it records how the call went, or cancels it when dropped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::machine::Ticket;
use super::shared::Shared;

/// Leave to make one call through a [`CircuitBreaker`](super::CircuitBreaker), from
/// [`try_acquire`](super::CircuitBreaker::try_acquire).
///
/// Record the call with [`record_success`](Self::record_success) or
/// [`record_failure`](Self::record_failure); the time since the permit was issued decides
/// whether it was slow. A permit dropped without a record is a **cancelled** call: it is not
/// counted as a failure, nor as a success, and a half-open probe slot it held is freed for
/// another probe. A cancelled call says nothing about the service's health (the caller gave up,
/// or lost interest), and counting it as a failure would let a client's own cancellations open
/// the breaker. To count timeouts, put the timeout inside: time the call out and record the
/// failure, as [`call`](super::CircuitBreaker::call) over `tokio::time::timeout(..)` does.
///
/// Verdicts on calls admitted before the breaker last changed state are ignored.
///
/// # Examples
///
/// ```
/// use sluice::breaker::CircuitBreaker;
///
/// let breaker = CircuitBreaker::builder().build()?;
/// let permit = breaker.try_acquire()?;
/// let ok = true; // ...make the call...
/// if ok { permit.record_success() } else { permit.record_failure() }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a permit dropped without a record counts as a cancelled call"]
pub struct BreakerPermit {
    shared: Arc<Shared>,
    ticket: Ticket,
    started: Instant,
    recorded: bool,
}

impl BreakerPermit {
    pub(crate) fn new(shared: Arc<Shared>, ticket: Ticket) -> BreakerPermit {
        BreakerPermit {
            shared,
            ticket,
            started: Instant::now(),
            recorded: false,
        }
    }

    /// The call succeeded. It counts as slow if it took at least the slow-call threshold.
    pub fn record_success(self) {
        self.record(false);
    }

    /// The call failed. It also counts as slow if it took at least the slow-call threshold.
    pub fn record_failure(self) {
        self.record(true);
    }

    /// Records a failure if `failed`, else a success.
    pub fn record(mut self, failed: bool) {
        self.recorded = true;
        self.shared
            .record(self.ticket, failed, self.started.elapsed());
    }

    /// How long since the permit was issued.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for BreakerPermit {
    fn drop(&mut self) {
        if !self.recorded {
            self.shared.cancel(self.ticket);
        }
    }
}

impl fmt::Debug for BreakerPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerPermit")
            .field("breaker", &self.shared.name())
            .field("started", &self.started)
            .finish_non_exhaustive()
    }
}
