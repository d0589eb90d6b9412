//! The metric handles of a [`Retry`](super::Retry), registered once through the `metrics`
//! facade; the names and labels are listed in the [module docs](super).

use std::time::Duration;

use metrics::{Counter, Histogram};

use super::report::Stop;

/// The handles of one named `Retry`.
#[derive(Debug)]
pub(crate) struct RetryMetrics {
    retried: Counter,
    /// `sluice_retries_total{outcome = stop}`, by [`Stop::index`].
    declined: [Counter; Stop::ALL.len()],
    /// `sluice_retry_runs_total{outcome = stop}`, by [`Stop::index`].
    runs: [Counter; Stop::ALL.len()],
    delay: Histogram,
}

impl RetryMetrics {
    pub(crate) fn new(name: &str) -> RetryMetrics {
        let name = name.to_owned();
        let retries = |outcome: &'static str| metrics::counter!("sluice_retries_total", "retry" => name.clone(), "outcome" => outcome);
        let runs = |outcome: &'static str| metrics::counter!("sluice_retry_runs_total", "retry" => name.clone(), "outcome" => outcome);
        RetryMetrics {
            retried: retries("retried"),
            declined: Stop::ALL.map(|stop| retries(stop.as_str())),
            runs: Stop::ALL.map(|stop| runs(stop.as_str())),
            delay: metrics::histogram!("sluice_retry_delay_seconds", "retry" => name.clone()),
        }
    }

    /// A retry is about to sleep `delay`.
    pub(crate) fn retried(&self, delay: Duration) {
        self.retried.increment(1);
        self.delay.record(delay.as_secs_f64());
    }

    /// A retry the classifier asked for was not made, for `stop`.
    pub(crate) fn declined(&self, stop: Stop) {
        self.declined[stop.index()].increment(1);
    }

    /// A run ended with `stop`.
    pub(crate) fn finished(&self, stop: Stop) {
        self.runs[stop.index()].increment(1);
    }
}
