//! Metric handles, registered once through the `metrics` facade and kept.
//!
//! Install the recorder (e.g. `metrics-exporter-prometheus`) before building limiters and pools:
//! handles taken before a recorder exists stay no-ops, which is also what makes them free when
//! no one is listening.
//!
//! | name | kind | labels |
//! |------|------|--------|
//! | `sluice_admitted_total` | counter | `limiter` |
//! | `sluice_denied_total` | counter | `limiter`, `reason` (`limit`, `queue_full`, `timeout`, `closed`, `no_runtime`) |
//! | `sluice_queued` | gauge | `limiter` (every key's queue of a keyed limiter, summed), or `pool` |
//! | `sluice_queue_wait_seconds` | histogram | `limiter` |
//! | `sluice_in_flight` | gauge | `pool` |

use std::sync::atomic::{AtomicUsize, Ordering};

use metrics::{Counter, Gauge, Histogram};

/// The handles of one limiter.
#[derive(Debug, Clone)]
pub(crate) struct LimiterMetrics {
    pub(crate) admitted: Counter,
    pub(crate) limited: Counter,
    pub(crate) queue_full: Counter,
    pub(crate) timeout: Counter,
    pub(crate) closed: Counter,
    pub(crate) no_runtime: Counter,
    pub(crate) queued: QueuedGauge,
    pub(crate) queue_wait: Histogram,
}

impl LimiterMetrics {
    pub(crate) fn new(name: &str) -> LimiterMetrics {
        let name = name.to_owned();
        let denied = |reason: &'static str| metrics::counter!("sluice_denied_total", "limiter" => name.clone(), "reason" => reason);
        LimiterMetrics {
            admitted: metrics::counter!("sluice_admitted_total", "limiter" => name.clone()),
            limited: denied("limit"),
            queue_full: denied("queue_full"),
            timeout: denied("timeout"),
            closed: denied("closed"),
            no_runtime: denied("no_runtime"),
            queued: QueuedGauge::new(metrics::gauge!("sluice_queued", "limiter" => name.clone())),
            queue_wait: metrics::histogram!("sluice_queue_wait_seconds", "limiter" => name),
        }
    }

    pub(crate) fn denied(&self, error: &crate::error::Error) {
        match error {
            crate::error::Error::Limited { .. } => self.limited.increment(1),
            crate::error::Error::QueueFull { .. } => self.queue_full.increment(1),
            crate::error::Error::Timeout { .. } => self.timeout.increment(1),
            crate::error::Error::NoRuntime => self.no_runtime.increment(1),
            _ => self.closed.increment(1),
        }
    }
}

/// One limiter's share of the `sluice_queued` gauge.
///
/// The queues of a keyed limiter's keys all report into one gauge, so a queue does not set
/// it: it adds the change since its last report. The gauge then holds the sum over the
/// queues that share it. A clone is another queue's share (it starts at zero), and a share
/// dropped takes its last report back out.
#[derive(Debug)]
pub(crate) struct QueuedGauge {
    gauge: Gauge,
    /// The length this queue last reported.
    reported: AtomicUsize,
}

impl QueuedGauge {
    fn new(gauge: Gauge) -> QueuedGauge {
        QueuedGauge {
            gauge,
            reported: AtomicUsize::new(0),
        }
    }

    /// Reports this queue's length now.
    pub(crate) fn set(&self, len: f64) {
        // Lengths are whole numbers well below 2^53, so the cast is exact.
        let len = len as usize;
        let before = self.reported.swap(len, Ordering::AcqRel);
        if len > before {
            self.gauge.increment((len - before) as f64);
        } else if len < before {
            self.gauge.decrement((before - len) as f64);
        }
    }
}

impl Clone for QueuedGauge {
    fn clone(&self) -> Self {
        QueuedGauge::new(self.gauge.clone())
    }
}

impl Drop for QueuedGauge {
    fn drop(&mut self) {
        self.set(0.0);
    }
}

/// The handles of one pool.
#[derive(Debug, Clone)]
pub(crate) struct PoolMetrics {
    pub(crate) in_flight: Gauge,
    pub(crate) queued: Gauge,
    pub(crate) admitted: Counter,
    pub(crate) queue_full: Counter,
    pub(crate) timeout: Counter,
    pub(crate) queue_wait: Histogram,
}

impl PoolMetrics {
    pub(crate) fn new(name: &str) -> PoolMetrics {
        let name = name.to_owned();
        PoolMetrics {
            in_flight: metrics::gauge!("sluice_in_flight", "pool" => name.clone()),
            queued: metrics::gauge!("sluice_queued", "pool" => name.clone()),
            admitted: metrics::counter!("sluice_admitted_total", "pool" => name.clone()),
            queue_full: metrics::counter!("sluice_denied_total", "pool" => name.clone(), "reason" => "queue_full"),
            timeout: metrics::counter!("sluice_denied_total", "pool" => name.clone(), "reason" => "timeout"),
            queue_wait: metrics::histogram!("sluice_queue_wait_seconds", "pool" => name),
        }
    }
}

/// Gives every metric this crate registers its help text and unit, for the installed recorder
/// (Prometheus renders them as `# HELP` lines). Call it once, after installing the recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

    describe_counter!(
        "sluice_admitted_total",
        Unit::Count,
        "Acquisitions admitted, by `limiter` (a rate limiter's name) or `pool` (a pool's name)."
    );
    describe_counter!(
        "sluice_denied_total",
        Unit::Count,
        "Acquisitions refused, by `limiter` or `pool` and `reason`: `limit` (no token and no queue), \
         `queue_full`, `timeout` (the wait would pass or passed max_wait), `closed`, `no_runtime` (no \
         tokio runtime with timers to wait on)."
    );
    describe_gauge!(
        "sluice_queued",
        Unit::Count,
        "Acquisitions waiting in the queue now, by `limiter` or `pool`."
    );
    describe_histogram!(
        "sluice_queue_wait_seconds",
        Unit::Seconds,
        "Time admitted acquisitions spent queued, in seconds, by `limiter` or `pool`."
    );
    describe_gauge!(
        "sluice_in_flight",
        Unit::Count,
        "Tasks holding a pool permit now, by `pool`."
    );
    describe_counter!(
        "sluice_keys_evicted_total",
        Unit::Count,
        "Keys a keyed limiter forgot to stay within max_keys, by `limiter`."
    );
    describe_counter!(
        "sluice_retries_total",
        Unit::Count,
        "Retries scheduled or given up, by `retry` (the policy's name) and `outcome`."
    );
    describe_counter!(
        "sluice_retry_runs_total",
        Unit::Count,
        "Retried operations finished, by `retry` and `outcome`."
    );
    describe_histogram!(
        "sluice_retry_delay_seconds",
        Unit::Seconds,
        "Delays slept before retries, in seconds, by `retry`."
    );
    describe_gauge!(
        "sluice_breaker_state",
        Unit::Count,
        "A circuit breaker's state, by `breaker`: 0 closed, 1 half-open, 2 open (higher is worse)."
    );
    describe_counter!(
        "sluice_breaker_calls_total",
        Unit::Count,
        "Calls through a circuit breaker, by `breaker` and `outcome`."
    );
    describe_counter!(
        "sluice_breaker_rejections_total",
        Unit::Count,
        "Calls a circuit breaker refused without running them, by `breaker`."
    );
    describe_counter!(
        "sluice_breaker_transitions_total",
        Unit::Count,
        "Circuit breaker state changes, by `breaker`, `from` and `to`."
    );
    describe_counter!(
        "sluice_store_round_trips_total",
        Unit::Count,
        "Decisions sent to a shared store, by `store` and `prefix`."
    );
    describe_counter!(
        "sluice_store_leases_total",
        Unit::Count,
        "Leased slices of a Redis store, by `prefix` and `event`: `taken`, `returned` (given back spent), `expired` (given back with tokens unspent, past their deadline)."
    );
    describe_counter!(
        "sluice_store_lease_tokens_unspent_total",
        Unit::Count,
        "Tokens of leased slices given back unspent, by `prefix`: held from every gateway while the slice lasted (the under-admission leases cost)."
    );
    describe_counter!(
        "sluice_store_lease_tokens_lost_total",
        Unit::Count,
        "Unspent tokens of leased slices whose give-back reached Redis after it had settled them as spent (more than 10 s after their expiry), by `prefix`: lost to every gateway until the refill."
    );
    describe_counter!(
        "sluice_store_lease_admissions_total",
        Unit::Count,
        "Admissions answered from a leased slice in this process, without a round trip, by `prefix`."
    );
    describe_counter!(
        "sluice_store_cached_denials_total",
        Unit::Count,
        "Denials answered from the local cache of a shared store's recent denials, without a \
         round trip, by `store` and `prefix`."
    );
    describe_counter!(
        "sluice_store_fallbacks_total",
        Unit::Count,
        "Decisions made by the store's on_error rule because the store could not answer, by \
         `store` and `prefix`."
    );
    describe_counter!(
        "sluice_store_errors_total",
        Unit::Count,
        "Failed round trips to a shared store, by `store` and `prefix`."
    );
    describe_counter!(
        "sluice_store_unsettled_tokens_total",
        Unit::Count,
        "Tokens of refunds and settled charges not applied because the store that granted \
         the admission (Redis, or the local store of on_error = local) could not be reached; \
         never applied to the other one. By `store` and `prefix`."
    );
}
