//! `[browser]`: the limiter the gateway ships to browsers (a Service Worker running sluice-core
//! compiled to WebAssembly, `web/`), read and checked like the rest of the file, and rendered
//! as the JSON object the worker reads (`web/README.md`, "Configuration").
//!
//! ```toml
//! [browser]
//! path_prefixes = ["/api/"]
//! capacity = 10
//! rate = "1/s"
//! queue = { depth = 100, max_wait = "10s" }
//! ```
//!
//! Every key is optional (an empty `[browser]` table turns the browser limiter on with the
//! defaults of [`BrowserConfig::default`]); the keys and their JSON names are listed in the
//! crate's README.

use std::time::Duration;

use serde_json::{json, Value};
use sluice_core::{Kind, Quota, Rate};
use toml::de::{DeTable, DeValue};

use super::values::{boolean, duration, size};
use super::walk::{Errors, Fields};

/// The largest whole number JavaScript holds exactly (`Number.MAX_SAFE_INTEGER`).
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The longest `queue.max_wait` and `telemetry.interval`.
const MAX_DURATION: Duration = Duration::from_secs(86_400);

/// The longest `persist_debounce` (the worker refuses more).
const MAX_DEBOUNCE: Duration = Duration::from_secs(10);

/// The shortest `telemetry.interval` (the worker refuses less).
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Paths the gateway answers itself when `[browser]` is set.
pub const RESERVED_PREFIX: &str = "/sluice/";

/// `[browser]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BrowserConfig {
    /// `path_prefixes`: same-origin requests under one of these are limited by the worker.
    pub path_prefixes: Vec<String>,
    /// `algorithm`.
    pub algorithm: Kind,
    /// `capacity` and `rate`, checked.
    pub quota: Quota,
    /// `rate` as written (the worker parses it again with the same sluice-core).
    pub rate: String,
    /// `queue.depth`: 0 means no queue.
    pub queue_depth: u64,
    /// `queue.max_wait`, whole milliseconds.
    pub queue_max_wait_ms: u64,
    /// `queue_max_body`: larger request bodies never wait.
    pub queue_max_body: u64,
    /// `persist`: keep the bucket in IndexedDB across worker restarts.
    pub persist: bool,
    /// `persist_debounce`, whole milliseconds.
    pub persist_debounce_ms: u64,
    /// `telemetry`; `None` when `telemetry = false`.
    pub telemetry: Option<TelemetryConfig>,
    /// `fail`: what the worker does once its wasm module has failed.
    pub fail: FailMode,
    /// `pace_from_server`: the worker also paces limited requests from the limit fields of
    /// their responses (`RateLimit`, `x-ratelimit-*`, `Retry-After`), shared by every tab.
    pub pace_from_server: bool,
}

/// `browser.fail`: what a worker whose wasm module did not load or trapped does with the
/// requests it limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// `"open"`: they go to the network untouched (the gateway still limits).
    #[default]
    Open,
    /// `"closed"`: they get 503 from the worker.
    Closed,
}

impl FailMode {
    /// The name in TOML and in the worker's JSON.
    pub fn name(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
        }
    }
}

/// `browser.telemetry`.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// `endpoint`: where the worker POSTs its batches, on the main listener.
    pub endpoint: String,
    /// `interval`, whole milliseconds: at most one batch per interval per worker.
    pub interval_ms: u64,
    /// `sample`: the probability that a batch is sent.
    pub sample: f64,
    /// `limit = { capacity, rate }`: how many batches one client address may send.
    pub limit: Quota,
}

impl Default for BrowserConfig {
    /// The defaults of every key: `web/sluice.config.json`.
    fn default() -> BrowserConfig {
        BrowserConfig {
            path_prefixes: vec!["/api/".to_owned()],
            algorithm: Kind::TokenBucket,
            quota: Quota::parse(10, "1/s").expect("a valid quota"),
            rate: "1/s".to_owned(),
            queue_depth: 100,
            queue_max_wait_ms: 10_000,
            queue_max_body: 64 * 1024,
            persist: true,
            persist_debounce_ms: 150,
            telemetry: Some(TelemetryConfig::default()),
            fail: FailMode::Open,
            pace_from_server: false,
        }
    }
}

impl Default for TelemetryConfig {
    fn default() -> TelemetryConfig {
        TelemetryConfig {
            endpoint: "/v1/telemetry".to_owned(),
            interval_ms: 5_000,
            sample: 1.0,
            limit: Quota::parse(50, "10/s").expect("a valid quota"),
        }
    }
}

impl BrowserConfig {
    /// The worker's configuration: `self.__SLUICE_CONFIG__` in `/sluice/sw.js`, and
    /// `/sluice/config.json`. Durations in milliseconds, sizes in bytes; the gateway-only
    /// `telemetry.limit` is left out.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice_server::config::BrowserConfig;
    ///
    /// let json = BrowserConfig::default().worker_json();
    /// assert_eq!(json["queue"]["max_wait_ms"], 10_000);
    /// assert_eq!(json["telemetry"]["endpoint"], "/v1/telemetry");
    /// ```
    pub fn worker_json(&self) -> Value {
        json!({
            "path_prefixes": self.path_prefixes,
            "algorithm": self.algorithm.name(),
            "capacity": self.quota.capacity(),
            "rate": self.rate,
            "queue": { "depth": self.queue_depth, "max_wait_ms": self.queue_max_wait_ms },
            "max_queued_body_bytes": self.queue_max_body,
            "persist": self.persist,
            "persist_debounce_ms": self.persist_debounce_ms,
            "telemetry": self.telemetry.as_ref().map(|t| json!({
                "endpoint": t.endpoint,
                "interval_ms": t.interval_ms,
                "sample": t.sample,
            })),
            "fail": self.fail.name(),
            "pace_from_server": self.pace_from_server,
        })
    }
}

/// Reads the `[browser]` table `t`, reporting every problem to `errors`.
pub(super) fn parse(t: &DeTable<'_>, errors: &mut Errors<'_>) -> BrowserConfig {
    let defaults = BrowserConfig::default();
    let mut f = Fields::new(t, "browser");
    let path_prefixes = match f.get("path_prefixes") {
        None => defaults.path_prefixes,
        Some(value) => {
            let list = f.strings("path_prefixes", errors).unwrap_or_default();
            if list.is_empty() && matches!(value.get_ref(), DeValue::Array(_)) {
                errors.value(
                    value,
                    "browser.path_prefixes",
                    "list at least one prefix, such as \"/api/\" (or leave out [browser])",
                );
            }
            for (p, at) in &list {
                if !p.starts_with('/') {
                    errors.at(
                        *at,
                        "browser.path_prefixes",
                        format!("`{p}` must start with `/`"),
                    );
                }
            }
            list.into_iter().map(|(p, _)| p.to_owned()).collect()
        }
    };
    let algorithm = match f.str("algorithm", errors) {
        None => defaults.algorithm,
        Some((text, at)) => text.parse::<Kind>().unwrap_or_else(|e| {
            errors.at(at, "browser.algorithm", e.to_string());
            defaults.algorithm
        }),
    };
    let capacity = match f.uint("capacity", errors) {
        None => Some((defaults.quota.capacity(), None)),
        Some((0, at)) => {
            errors.at(at, "browser.capacity", "capacity must be at least 1, got 0");
            None
        }
        Some((n, at)) if n > MAX_SAFE_INTEGER => {
            errors.at(
                at,
                "browser.capacity",
                format!("{n} is too large for the browser (at most {MAX_SAFE_INTEGER})"),
            );
            None
        }
        Some((n, at)) => Some((n, Some(at))),
    };
    let rate = match f.str("rate", errors) {
        None => Some((defaults.rate.clone(), defaults.quota.rate())),
        Some((text, at)) => match text.parse::<Rate>() {
            Ok(rate) => Some((text.trim().to_owned(), rate)),
            Err(e) => {
                errors.at(at, "browser.rate", e.to_string());
                None
            }
        },
    };
    let (quota, rate) = match (capacity, rate) {
        (Some((capacity, at)), Some((text, rate))) => match Quota::new(capacity, rate) {
            Ok(q) => (q, text),
            Err(e) => {
                let at = at.or_else(|| t.get("rate").map(|v| v.span().start));
                errors.at(at.unwrap_or(0), "browser.capacity", e.to_string());
                (defaults.quota, defaults.rate.clone())
            }
        },
        _ => (defaults.quota, defaults.rate.clone()),
    };
    let (queue_depth, queue_max_wait_ms) = match f.table("queue", errors) {
        None => (defaults.queue_depth, defaults.queue_max_wait_ms),
        Some((q, _)) => {
            let mut qf = Fields::new(q, "browser.queue");
            let depth = match qf.uint("depth", errors) {
                None => defaults.queue_depth,
                Some((n, at)) if n > u64::from(u32::MAX) => {
                    errors.at(
                        at,
                        "browser.queue.depth",
                        format!("{n} is too large (at most {})", u32::MAX),
                    );
                    defaults.queue_depth
                }
                Some((n, _)) => n,
            };
            let at = q.get("max_wait").map_or(0, |v| v.span().start);
            let max_wait = duration(
                &mut qf,
                "max_wait",
                Duration::from_millis(defaults.queue_max_wait_ms),
                errors,
            );
            if max_wait > MAX_DURATION {
                errors.at(at, "browser.queue.max_wait", "must be at most 1d");
            }
            qf.finish(errors);
            (depth, ceil_ms(max_wait))
        }
    };
    let at = t.get("queue_max_body").map_or(0, |v| v.span().start);
    let queue_max_body = size(&mut f, "queue_max_body", defaults.queue_max_body, errors);
    if queue_max_body > MAX_SAFE_INTEGER {
        errors.at(
            at,
            "browser.queue_max_body",
            format!("{queue_max_body} bytes is too large for the browser"),
        );
    }
    let persist = boolean(&mut f, "persist", defaults.persist, errors);
    let at = t.get("persist_debounce").map_or(0, |v| v.span().start);
    let debounce = duration(
        &mut f,
        "persist_debounce",
        Duration::from_millis(defaults.persist_debounce_ms),
        errors,
    );
    if debounce > MAX_DEBOUNCE {
        errors.at(at, "browser.persist_debounce", "must be at most 10s");
    }
    let telemetry = match f.get("telemetry") {
        None => defaults.telemetry,
        Some(value) => match value.get_ref() {
            DeValue::Boolean(false) => None,
            DeValue::Boolean(true) => Some(TelemetryConfig::default()),
            DeValue::Table(tt) => Some(telemetry(tt, errors)),
            other => {
                errors.value(
                    value,
                    "browser.telemetry",
                    format!(
                        "expected a table such as {{ interval = \"5s\" }} or false, found {}",
                        other.type_str()
                    ),
                );
                None
            }
        },
    };
    let fail = match f.str("fail", errors) {
        None => defaults.fail,
        Some(("open", _)) => FailMode::Open,
        Some(("closed", _)) => FailMode::Closed,
        Some((other, at)) => {
            errors.at(
                at,
                "browser.fail",
                format!("`{other}` is not a failure mode: expected \"open\" or \"closed\""),
            );
            defaults.fail
        }
    };
    let pace_from_server = boolean(
        &mut f,
        "pace_from_server",
        defaults.pace_from_server,
        errors,
    );
    f.finish(errors);
    BrowserConfig {
        path_prefixes,
        algorithm,
        quota,
        rate,
        queue_depth,
        queue_max_wait_ms,
        queue_max_body,
        persist,
        persist_debounce_ms: ceil_ms(debounce),
        telemetry,
        fail,
        pace_from_server,
    }
}

fn telemetry(t: &DeTable<'_>, errors: &mut Errors<'_>) -> TelemetryConfig {
    let defaults = TelemetryConfig::default();
    let mut f = Fields::new(t, "browser.telemetry");
    let endpoint = match f.str("endpoint", errors) {
        None => defaults.endpoint.clone(),
        Some((p, at)) => {
            let field = "browser.telemetry.endpoint";
            if !p.starts_with('/') {
                errors.at(at, field, format!("`{p}` must be a path starting with `/`"));
            } else if p.contains(['?', '#']) || p.bytes().any(|b| b <= b' ' || b >= 0x7f) {
                errors.at(
                    at,
                    field,
                    format!("`{p}` must be a plain path (no query, fragment, spaces or non-ASCII)"),
                );
            } else if p.starts_with(RESERVED_PREFIX) {
                errors.at(
                    at,
                    field,
                    format!("`{p}` is under {RESERVED_PREFIX}, which the browser assets use"),
                );
            }
            p.to_owned()
        }
    };
    let at = t.get("interval").map_or(0, |v| v.span().start);
    let interval = duration(
        &mut f,
        "interval",
        Duration::from_millis(defaults.interval_ms),
        errors,
    );
    if interval < MIN_INTERVAL {
        errors.at(at, "browser.telemetry.interval", "must be at least 1s");
    } else if interval > MAX_DURATION {
        errors.at(at, "browser.telemetry.interval", "must be at most 1d");
    }
    let sample = match f.get("sample") {
        None => defaults.sample,
        Some(value) => {
            let number = match value.get_ref() {
                DeValue::Float(x) => x.as_str().replace('_', "").parse::<f64>().ok(),
                DeValue::Integer(i) => i.as_str().replace('_', "").parse::<f64>().ok(),
                _ => None,
            };
            match number {
                Some(x) if (0.0..=1.0).contains(&x) => x,
                _ => {
                    errors.value(
                        value,
                        "browser.telemetry.sample",
                        "expected a number from 0 to 1 (the probability that a batch is sent)",
                    );
                    defaults.sample
                }
            }
        }
    };
    let limit = match f.table("limit", errors) {
        None => defaults.limit,
        Some((l, at)) => {
            let mut lf = Fields::new(l, "browser.telemetry.limit");
            let capacity = lf.uint("capacity", errors);
            let rate = match lf.str("rate", errors) {
                None => Some(defaults.limit.rate()),
                Some((text, at)) => text.parse::<Rate>().map_or_else(
                    |e| {
                        errors.at(at, "browser.telemetry.limit.rate", e.to_string());
                        None
                    },
                    Some,
                ),
            };
            lf.finish(errors);
            let (capacity, at) = capacity.unwrap_or((defaults.limit.capacity(), at));
            match rate.map(|r| Quota::new(capacity, r)) {
                Some(Ok(q)) => q,
                Some(Err(e)) => {
                    errors.at(at, "browser.telemetry.limit.capacity", e.to_string());
                    defaults.limit
                }
                None => defaults.limit,
            }
        }
    };
    f.finish(errors);
    TelemetryConfig {
        endpoint,
        interval_ms: ceil_ms(interval),
        sample,
        limit,
    }
}

/// Whole milliseconds, rounded up (a wait is never cut short by rounding).
fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse as parse_config;

    const ROUTE: &str = "[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n";

    fn browser(table: &str) -> Result<Option<BrowserConfig>, Vec<String>> {
        parse_config(&format!("{ROUTE}\n{table}"), "b.toml")
            .map(|c| c.browser)
            .map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn absent_means_off_and_empty_means_the_defaults() {
        assert_eq!(browser("").unwrap(), None);
        assert_eq!(
            browser("[browser]").unwrap(),
            Some(BrowserConfig::default())
        );
    }

    #[test]
    fn the_issue_table_and_every_extra_key() {
        let b = browser(
            r#"[browser]
path_prefixes = ["/api/", "/v2/"]
algorithm = "gcra"
capacity = 20
rate = "10 per 90s"
queue = { depth = 0, max_wait = "1.5ms" }
queue_max_body = "1KiB"
persist = false
persist_debounce = "0s"
telemetry = { endpoint = "/t", interval = "2s", sample = 0.25, limit = { capacity = 3, rate = "1/min" } }
fail = "closed"
pace_from_server = true
"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(b.path_prefixes, ["/api/", "/v2/"]);
        assert_eq!(b.algorithm, Kind::Gcra);
        assert_eq!(b.quota, Quota::parse(20, "10 per 90s").unwrap());
        assert_eq!((b.queue_depth, b.queue_max_wait_ms), (0, 2));
        assert_eq!(b.queue_max_body, 1024);
        assert!(!b.persist);
        assert_eq!(b.persist_debounce_ms, 0);
        assert_eq!(b.fail, FailMode::Closed);
        let t = b.telemetry.clone().unwrap();
        assert_eq!(
            (t.endpoint.as_str(), t.interval_ms, t.sample),
            ("/t", 2000, 0.25)
        );
        assert_eq!(t.limit, Quota::parse(3, "1/min").unwrap());
        let json = b.worker_json();
        assert_eq!(json["rate"], "10 per 90s");
        assert_eq!(json["algorithm"], "gcra");
        assert_eq!(json["queue"], json!({"depth": 0, "max_wait_ms": 2}));
        assert_eq!(json["max_queued_body_bytes"], 1024);
        assert_eq!(json["fail"], "closed");
        assert_eq!(json["pace_from_server"], true);
        assert_eq!(
            json["telemetry"],
            json!({"endpoint": "/t", "interval_ms": 2000, "sample": 0.25})
        );
        let off = browser("[browser]\ntelemetry = false\n").unwrap().unwrap();
        assert_eq!(off.telemetry, None);
        assert_eq!(off.worker_json()["telemetry"], Value::Null);
    }

    #[test]
    fn the_embedded_defaults_show_the_browser_demo() {
        let b = crate::config::defaults().browser.unwrap();
        assert_eq!(b.path_prefixes, ["/api/"]);
        assert_eq!(b.quota, Quota::parse(10, "1/s").unwrap());
        assert_eq!((b.queue_depth, b.queue_max_wait_ms), (100, 10_000));
    }

    #[test]
    fn the_default_json_is_web_sluice_config_json() {
        let shipped: Value =
            serde_json::from_str(include_str!("../../../../web/sluice.config.json")).unwrap();
        assert_eq!(BrowserConfig::default().worker_json(), shipped);
    }

    #[test]
    fn every_error_has_its_line_and_field() {
        let errors = browser(
            r#"[browser]
path_prefixes = ["api/"]
algorithm = "magic"
capacity = 0
rate = "fast"
queue = { depth = -1, max_wait = "2d", colour = 1 }
queue_max_body = "64 parsecs"
persist = "yes"
persist_debounce = "11s"
telemetry = { endpoint = "/sluice/t", interval = "500ms", sample = 1.5, limit = { rate = "0/s" } }
extra = 1
fail = "ajar"
"#,
        )
        .unwrap_err();
        let expect = [
            (6, "browser.path_prefixes"),
            (7, "browser.algorithm"),
            (8, "browser.capacity"),
            (9, "browser.rate"),
            (10, "browser.queue.depth"),
            (10, "browser.queue.max_wait"),
            (10, "browser.queue.colour"),
            (11, "browser.queue_max_body"),
            (12, "browser.persist"),
            (13, "browser.persist_debounce"),
            (14, "browser.telemetry.endpoint"),
            (14, "browser.telemetry.interval"),
            (14, "browser.telemetry.sample"),
            (14, "browser.telemetry.limit.rate"),
            (15, "browser.extra"),
            (16, "browser.fail"),
        ];
        assert_eq!(errors.len(), expect.len(), "{}", errors.join("\n"));
        for (line, field) in expect {
            let head = format!("b.toml:{line}:");
            assert!(
                errors
                    .iter()
                    .any(|e| e.starts_with(&head) && e.contains(&format!(" {field}: "))),
                "missing {head} {field} in\n{}",
                errors.join("\n")
            );
        }
        assert!(errors
            .iter()
            .any(|e| e.contains("`ajar` is not a failure mode")));
        let empty = browser("[browser]\npath_prefixes = []\ntelemetry = 3\n").unwrap_err();
        assert_eq!(empty.len(), 2, "{empty:?}");
        assert!(empty[0].contains("browser.path_prefixes: list at least one prefix"));
        assert!(empty[1].contains("browser.telemetry: expected a table"));
    }
}
