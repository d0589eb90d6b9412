//! The Service Worker's telemetry: batches of counters (`web/README.md`, "Telemetry") read,
//! checked and added to the `sluice_browser_*` metrics.
//!
//! | name | kind | what |
//! |---|---|---|
//! | `sluice_browser_telemetry_batches_total` | counter | batches accepted |
//! | `sluice_browser_admitted_total` | counter | requests the workers admitted |
//! | `sluice_browser_queued_total` | counter | requests that waited in a worker's queue |
//! | `sluice_browser_rejected_total` | counter | `reason`: `queue_full`, `timeout`, `limit` (the workers' 429s) |
//! | `sluice_browser_cancelled_total` | counter | waiters whose page went away |
//! | `sluice_browser_redispatched_total` | counter | re-dispatched copies refused after a worker restart |
//! | `sluice_browser_limiter_failures_total` | counter | workers whose wasm module failed (did not load, or trapped) |
//! | `sluice_browser_failed_requests_total` | counter | requests a failed worker passed (`fail = "open"`) or refused with 503 (`"closed"`) |
//! | `sluice_browser_queue_wait_seconds_total` | counter | the waits of requests admitted after waiting, summed |
//! | `sluice_browser_queue_waits_total` | counter | how many such waits were reported |
//! | `sluice_browser_queue_wait_max_seconds` | gauge | the longest such wait reported since the gateway started |
//! | `sluice_browser_telemetry_refused_total` | counter | `reason`: `malformed` (400), `too_large` (413), `limit` (429), `method` (405) |
//!
//! Counters are summed as received: a sampled batch (`sample` < 1) is not scaled up.
//!
//! The three wait series carry seconds with a fractional part, which the `metrics` facade's
//! integer counters cannot hold, so [`render_waits`] writes them in the exposition format
//! after the recorder's own output.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use metrics::Counter;
use serde::Deserialize;
use serde_json::Value;

/// The largest batch accepted, in bytes (a real one is under 400).
pub const MAX_BATCH_BYTES: usize = 1024;

/// The largest value of one counter in one batch.
const MAX_COUNT: u64 = u32::MAX as u64;

/// The largest `wait_ms.sum` or `wait_ms.max` in one batch (about 35 years of waiting).
const MAX_WAIT_MS: u64 = 1 << 40;

/// One batch, as the worker sends it (schema version 1).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Batch {
    /// Schema version: 1.
    pub v: u64,
    /// The worker instance.
    pub worker: String,
    /// Batch number within the instance.
    pub seq: u64,
    /// The sampling probability.
    pub sample: f64,
    /// The time the batch covers.
    pub window_ms: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests that entered the queue.
    pub queued: u64,
    /// 429s by reason.
    pub rejected: Rejected,
    /// Waiters whose page went away.
    pub cancelled: u64,
    /// Re-dispatched copies refused.
    pub redispatched: u64,
    /// Module failures (0 or 1 per worker instance); absent from older workers' batches.
    #[serde(default)]
    pub failures: u64,
    /// Requests handled without the limiter after its module failed; absent from older
    /// workers' batches.
    #[serde(default)]
    pub failed: u64,
    /// Waits of requests admitted after waiting.
    pub wait_ms: Wait,
}

/// `rejected`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Rejected {
    /// The queue was full.
    pub queue_full: u64,
    /// The wait would have exceeded the maximum.
    pub timeout: u64,
    /// No queue, or a body too large to wait.
    pub limit: u64,
}

/// `wait_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Wait {
    /// Sum of the waits.
    pub sum: u64,
    /// Number of waits.
    pub count: u64,
    /// The longest.
    pub max: u64,
}

/// Why a body is not a batch (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    /// Not JSON, or not the schema.
    #[error("malformed telemetry batch: {0}")]
    Malformed(String),
    /// A schema version this gateway does not know.
    #[error("unknown telemetry schema version {0} (this gateway reads version 1)")]
    Version(String),
    /// A value out of range.
    #[error("telemetry batch field `{0}` is out of range")]
    Range(&'static str),
}

impl Batch {
    /// Reads and checks one batch.
    ///
    /// # Errors
    ///
    /// [`BatchError`] for anything but a version-1 batch of non-negative whole counters in
    /// range, a `sample` from 0 to 1 and a `worker` of at most 64 bytes.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice_server::browser::telemetry::Batch;
    ///
    /// let b = Batch::parse(br#"{"v":1,"worker":"k3j2h1q9","seq":3,"sample":1,"window_ms":5003,
    ///     "admitted":12,"queued":4,"rejected":{"queue_full":0,"timeout":1,"limit":0},
    ///     "cancelled":0,"redispatched":0,"wait_ms":{"sum":1830,"count":3,"max":950}}"#).unwrap();
    /// assert_eq!((b.admitted, b.rejected.timeout, b.wait_ms.max), (12, 1, 950));
    /// assert!(Batch::parse(br#"{"v":2}"#).is_err());
    /// ```
    pub fn parse(body: &[u8]) -> Result<Batch, BatchError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| BatchError::Malformed(e.to_string()))?;
        match value.get("v") {
            Some(v) if v.as_u64() == Some(1) => {}
            Some(v) => {
                return Err(BatchError::Version(
                    v.to_string().chars().take(32).collect(),
                ))
            }
            None => return Err(BatchError::Malformed("missing field `v`".to_owned())),
        }
        let batch: Batch =
            serde_json::from_value(value).map_err(|e| BatchError::Malformed(e.to_string()))?;
        batch.check()?;
        Ok(batch)
    }

    fn check(&self) -> Result<(), BatchError> {
        if self.worker.len() > 64 {
            return Err(BatchError::Range("worker"));
        }
        if !(0.0..=1.0).contains(&self.sample) {
            return Err(BatchError::Range("sample"));
        }
        let counts = [
            ("admitted", self.admitted),
            ("queued", self.queued),
            ("rejected.queue_full", self.rejected.queue_full),
            ("rejected.timeout", self.rejected.timeout),
            ("rejected.limit", self.rejected.limit),
            ("cancelled", self.cancelled),
            ("redispatched", self.redispatched),
            ("failures", self.failures),
            ("failed", self.failed),
            ("wait_ms.count", self.wait_ms.count),
        ];
        for (name, n) in counts {
            if n > MAX_COUNT {
                return Err(BatchError::Range(name));
            }
        }
        if self.wait_ms.sum > MAX_WAIT_MS {
            return Err(BatchError::Range("wait_ms.sum"));
        }
        if self.wait_ms.max > MAX_WAIT_MS || self.wait_ms.max > self.wait_ms.sum {
            return Err(BatchError::Range("wait_ms.max"));
        }
        Ok(())
    }
}

/// Why a telemetry request was refused, for `sluice_browser_telemetry_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 400.
    Malformed,
    /// 413.
    TooLarge,
    /// 429.
    Limit,
    /// 405.
    Method,
}

/// The waits reported since the process started, in milliseconds: their sum, their count and
/// the longest (process-wide, so a reload, which makes new handles, never resets them).
static WAIT_SUM_MS: AtomicU64 = AtomicU64::new(0);
static WAIT_COUNT: AtomicU64 = AtomicU64::new(0);
static WAIT_MAX_MS: AtomicU64 = AtomicU64::new(0);
/// Whether a gateway with a `[browser]` table registered the telemetry metrics.
static REGISTERED: AtomicBool = AtomicBool::new(false);

/// Appends the wait series to `out` in the Prometheus exposition format (version 0.0.4),
/// when the browser telemetry is on.
pub fn render_waits(out: &mut String) {
    use std::fmt::Write;
    if !REGISTERED.load(Ordering::Relaxed) {
        return;
    }
    let seconds = |ms: u64| ms as f64 / 1000.0;
    let series = [
        (
            "sluice_browser_queue_wait_seconds_total",
            "counter",
            "Time requests waited in the Service Workers' queues before admission, summed over every admitted request that waited (seconds, as the workers report it).",
            seconds(WAIT_SUM_MS.load(Ordering::Relaxed)),
        ),
        (
            "sluice_browser_queue_waits_total",
            "counter",
            "Requests the Service Workers admitted after waiting in their queues.",
            WAIT_COUNT.load(Ordering::Relaxed) as f64,
        ),
        (
            "sluice_browser_queue_wait_max_seconds",
            "gauge",
            "The longest wait in a Service Worker's queue reported since the gateway started (seconds).",
            seconds(WAIT_MAX_MS.load(Ordering::Relaxed)),
        ),
    ];
    for (name, kind, help, value) in series {
        let _ = write!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
        );
    }
}

/// Gives every `sluice_browser_*` metric the recorder renders its help text.
pub fn describe() {
    use metrics::{describe_counter, Unit};
    describe_counter!(
        "sluice_browser_telemetry_batches_total",
        Unit::Count,
        "Telemetry batches from Service Workers accepted on POST /v1/telemetry."
    );
    describe_counter!(
        "sluice_browser_admitted_total",
        Unit::Count,
        "Requests the Service Workers admitted, as they reported them."
    );
    describe_counter!(
        "sluice_browser_queued_total",
        Unit::Count,
        "Requests that waited in a Service Worker's queue."
    );
    describe_counter!(
        "sluice_browser_rejected_total",
        Unit::Count,
        "Requests the Service Workers answered with 429, by `reason`: `queue_full`, `timeout`, `limit`."
    );
    describe_counter!(
        "sluice_browser_cancelled_total",
        Unit::Count,
        "Queued requests whose page went away before their turn."
    );
    describe_counter!(
        "sluice_browser_redispatched_total",
        Unit::Count,
        "Re-dispatched copies of requests refused after a Service Worker restart."
    );
    describe_counter!(
        "sluice_browser_limiter_failures_total",
        Unit::Count,
        "Service Workers whose wasm limiter failed: it did not load, or it trapped."
    );
    describe_counter!(
        "sluice_browser_failed_requests_total",
        Unit::Count,
        "Requests a Service Worker with a failed limiter passed to the network (fail = \"open\") or refused with 503 (fail = \"closed\")."
    );
    describe_counter!(
        "sluice_browser_telemetry_refused_total",
        Unit::Count,
        "Telemetry requests refused, by `reason`: `malformed` (400), `too_large` (413), `limit` (429), `method` (405)."
    );
}

/// The `sluice_browser_*` handles.
#[derive(Debug, Clone)]
pub struct Metrics {
    batches: Counter,
    admitted: Counter,
    queued: Counter,
    queue_full: Counter,
    timeout: Counter,
    limit: Counter,
    cancelled: Counter,
    redispatched: Counter,
    failures: Counter,
    failed: Counter,
    refused: [Counter; 4],
}

impl Metrics {
    /// Registers the handles (every series shows in `/metrics` at once, at 0).
    pub fn new() -> Metrics {
        const REJECTED: &str = "sluice_browser_rejected_total";
        const REFUSED: &str = "sluice_browser_telemetry_refused_total";
        let rejected = |reason: &'static str| metrics::counter!(REJECTED, "reason" => reason);
        let refused = |reason: &'static str| metrics::counter!(REFUSED, "reason" => reason);
        let m = Metrics {
            batches: metrics::counter!("sluice_browser_telemetry_batches_total"),
            admitted: metrics::counter!("sluice_browser_admitted_total"),
            queued: metrics::counter!("sluice_browser_queued_total"),
            queue_full: rejected("queue_full"),
            timeout: rejected("timeout"),
            limit: rejected("limit"),
            cancelled: metrics::counter!("sluice_browser_cancelled_total"),
            redispatched: metrics::counter!("sluice_browser_redispatched_total"),
            failures: metrics::counter!("sluice_browser_limiter_failures_total"),
            failed: metrics::counter!("sluice_browser_failed_requests_total"),
            refused: [
                refused("malformed"),
                refused("too_large"),
                refused("limit"),
                refused("method"),
            ],
        };
        // Touch every handle so that each series is rendered from the start.
        for c in [
            &m.batches,
            &m.admitted,
            &m.queued,
            &m.queue_full,
            &m.timeout,
            &m.limit,
            &m.cancelled,
            &m.redispatched,
            &m.failures,
            &m.failed,
        ]
        .into_iter()
        .chain(&m.refused)
        {
            c.increment(0);
        }
        REGISTERED.store(true, Ordering::Relaxed);
        m
    }

    /// Adds an accepted batch.
    pub fn record(&self, b: &Batch) {
        self.batches.increment(1);
        self.admitted.increment(b.admitted);
        self.queued.increment(b.queued);
        self.queue_full.increment(b.rejected.queue_full);
        self.timeout.increment(b.rejected.timeout);
        self.limit.increment(b.rejected.limit);
        self.cancelled.increment(b.cancelled);
        self.redispatched.increment(b.redispatched);
        self.failures.increment(b.failures);
        self.failed.increment(b.failed);
        WAIT_SUM_MS.fetch_add(b.wait_ms.sum, Ordering::Relaxed);
        WAIT_COUNT.fetch_add(b.wait_ms.count, Ordering::Relaxed);
        WAIT_MAX_MS.fetch_max(b.wait_ms.max, Ordering::Relaxed);
    }

    /// Counts a refused request.
    pub fn refused(&self, why: Refusal) {
        self.refused[why as usize].increment(1);
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"v":1,"worker":"abc","seq":1,"sample":0.5,"window_ms":1000,"admitted":2,"queued":1,"rejected":{"queue_full":0,"timeout":1,"limit":0},"cancelled":0,"redispatched":0,"wait_ms":{"sum":30,"count":1,"max":30}}"#;

    fn with(field: &str, value: &str) -> String {
        let mut v: Value = serde_json::from_str(GOOD).unwrap();
        let new: Value = serde_json::from_str(value).unwrap();
        let mut at = &mut v;
        let parts: Vec<&str> = field.split('.').collect();
        for p in &parts[..parts.len() - 1] {
            at = &mut at[*p];
        }
        if new.is_null() {
            at.as_object_mut().unwrap().remove(parts[parts.len() - 1]);
        } else {
            at[parts[parts.len() - 1]] = new;
        }
        v.to_string()
    }

    #[test]
    fn a_good_batch_and_extra_fields() {
        let b = Batch::parse(GOOD.as_bytes()).unwrap();
        assert_eq!(b.sample, 0.5);
        assert!(Batch::parse(with("future", "[1]").as_bytes()).is_ok());
        assert_eq!((b.failures, b.failed), (0, 0));
        let failed = Batch::parse(with("failed", "7").as_bytes()).unwrap();
        assert_eq!(failed.failed, 7);
        let failures = Batch::parse(with("failures", "1").as_bytes()).unwrap();
        assert_eq!(failures.failures, 1);
    }

    #[test]
    fn bad_batches() {
        let bad = [
            ("v", "2", "version"),
            ("v", "\"1\"", "version"),
            ("v", "null", "missing field `v`"),
            ("admitted", "-1", "invalid value"),
            ("admitted", "1.5", "invalid type"),
            ("admitted", "null", "missing field `admitted`"),
            ("rejected.timeout", "\"x\"", "invalid type"),
            ("sample", "1.01", "sample"),
            ("wait_ms.max", "31", "wait_ms.max"),
            ("queued", "4294967296", "queued"),
            ("failed", "4294967296", "failed"),
            ("failures", "-1", "invalid value"),
            (
                "worker",
                "\"0123456789012345678901234567890123456789012345678901234567890123456789\"",
                "worker",
            ),
        ];
        for (field, value, says) in bad {
            let body = with(field, value);
            let e = Batch::parse(body.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(says), "{field}={value}: {e}");
        }
        for junk in ["", "[]", "{", "null", "{\"v\":1}"] {
            assert!(Batch::parse(junk.as_bytes()).is_err(), "{junk}");
        }
    }
}
