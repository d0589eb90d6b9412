//! `GET /v1/stats`: one JSON snapshot of everything the dashboard shows.
//!
//! Counters are cumulative (the page takes rates from two snapshots), read back from the
//! same Prometheus text `/metrics` serves. Bucket levels come from the stores
//! ([`Store::hottest`]), and each policy's keys with a quota of their own from its store
//! ([`crate::runtime::overrides::list`], as `GET /v1/policies/NAME/keys` lists them; `null`
//! when the store did not answer); keys that may be secrets (header, cookie and query keys)
//! are shown masked.
//!
//! ```json
//! {
//!   "v": 1, "now_ms": 1732950000000, "config": "sluice.toml",
//!   "policies": [{
//!     "name": "api", "algorithm": "token_bucket", "capacity": 10, "rate": "5/s",
//!     "rate_per_s": 5.0, "key": "ip", "store": "memory",
//!     "queue": {"depth": 20, "max_wait_ms": 2000}, "concurrency": null, "in_flight": null,
//!     "admitted": 59, "denied": {"limit": 41, "queue_full": 0, "timeout": 0, "capacity": 0, "unavailable": 0, "ambiguous_key": 0},
//!     "waiting": 0, "queue_wait_ms": {"p50": 0.0, "p99": 180.0, "count": 12},
//!     "hottest": [{"key": "127.0.0.1", "tokens": 0.4, "remaining": 0, "limit": 10,
//!                  "level": 0.04, "reset_after_ms": 1920, "retry_after_ms": 120}],
//!     "overrides": [{"key": "sk-l…#3fa2c1", "capacity": 100, "rate": "50/s"}]
//!   }],
//!   "routes": [{"route": "/api/", "responses": {"2xx": 59}, "errors": {}}],
//!   "browser": [{"name": "sluice_browser_admitted_total", "labels": {}, "value": 12}]
//! }
//! ```

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use serde_json::{json, Map, Value};
use sluice::store::Store;
use sluice_core::{Algorithm, Decision, Kind};
use sluice_http::admit::Reason;
use sluice_http::{KeySpec, Policy};

use crate::dashboard::prom::{self, Sample};
use crate::runtime::build::Runtime;
use crate::runtime::overrides;

/// Keys listed per policy.
pub const HOTTEST: usize = 10;

/// The snapshot of `runtime`, with the counters of `metrics` (Prometheus text).
pub async fn snapshot(runtime: &Runtime, metrics: &str, now_ms: u64) -> Value {
    let mut own = BTreeMap::new();
    for policy in runtime.policies.values() {
        own.insert(policy.name().to_owned(), overrides(policy).await);
    }
    let samples = prom::parse(metrics);
    // The sum over the samples that match, so a label left out (`protocol`) is summed over.
    let find = |name: &str, labels: &[(&str, &str)]| -> Option<f64> {
        samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(v)))
            .map(|s| s.value)
            .reduce(|a, b| a + b)
    };
    let policies: Vec<Value> = runtime
        .config
        .policies
        .iter()
        .filter_map(|p| runtime.policies.get(&p.name))
        .map(|policy| {
            let name = policy.name();
            let denied: Map<String, Value> = Reason::ALL
                .iter()
                .map(|r| {
                    let n = find(
                        "sluice_policy_denied_total",
                        &[("policy", name), ("reason", r.as_str())],
                    );
                    (r.as_str().to_owned(), json!(n.unwrap_or(0.0)))
                })
                .collect();
            let quantile = |q: &str| {
                find(
                    "sluice_queue_wait_seconds",
                    &[("limiter", name), ("quantile", q)],
                )
                .filter(|v| v.is_finite())
                .map(|v| v * 1e3)
            };
            let wait_count = find("sluice_queue_wait_seconds_count", &[("limiter", name)]);
            let queue_wait = wait_count.map(|count| {
                json!({ "p50": quantile("0.5"), "p99": quantile("0.99"), "count": count })
            });
            let quota = policy.quota();
            json!({
                "name": name,
                "algorithm": policy.algorithm().which().name(),
                "capacity": quota.capacity(),
                "rate": quota.rate().to_string(),
                "rate_per_s": quota.rate().per_second_f64(),
                "key": policy.key_spec().to_string(),
                "store": policy.backend().kind(),
                "queue": policy.queue().map(|q| json!({
                    "depth": q.depth,
                    "max_wait_ms": q.max_wait.as_secs_f64() * 1e3,
                })),
                "concurrency": policy.concurrency().map(|p| p.size()),
                "in_flight": policy.concurrency().map(|p| p.in_flight()),
                "admitted": find("sluice_policy_admitted_total", &[("policy", name)]).unwrap_or(0.0),
                "denied": denied,
                "waiting": find("sluice_policy_waiting", &[("policy", name)]).unwrap_or(0.0),
                "queue_wait_ms": queue_wait,
                "hottest": hottest(policy),
                "overrides": own.remove(name).unwrap_or(Value::Null),
            })
        })
        .collect();
    let mut routes: Vec<Value> = Vec::new();
    for r in &runtime.config.routes {
        let route = r.path_prefix.as_str();
        // Summed over the other labels (`protocol`).
        let by = |metric: &str, label: &str| -> Map<String, Value> {
            let mut sums: BTreeMap<&str, f64> = BTreeMap::new();
            for s in samples
                .iter()
                .filter(|s| s.name == metric && s.label("route") == Some(route))
            {
                if let Some(key) = s.label(label) {
                    *sums.entry(key).or_default() += s.value;
                }
            }
            sums.into_iter()
                .map(|(k, v)| (k.to_owned(), json!(v)))
                .collect()
        };
        routes.push(json!({
            "route": route,
            "policies": r.policies,
            "responses": by("sluice_upstream_responses_total", "status"),
            "errors": by("sluice_upstream_errors_total", "error"),
        }));
    }
    let browser: Vec<Value> = samples
        .iter()
        .filter(|s| s.name.starts_with("sluice_browser_"))
        .map(|s: &Sample| {
            let labels: BTreeMap<&str, &str> = s
                .labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            json!({ "name": s.name, "labels": labels, "value": finite(s.value) })
        })
        .collect();
    json!({
        "v": 1,
        "now_ms": now_ms,
        "config": runtime.config.source,
        "policies": policies,
        "routes": routes,
        "browser": browser,
    })
}

fn finite(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        Value::Null
    }
}

/// The keys with the fewest tokens, with their levels.
fn hottest(policy: &Policy) -> Vec<Value> {
    let algorithm = policy.algorithm();
    let quota = algorithm.quota();
    policy
        .backend()
        .hottest(HOTTEST)
        .into_iter()
        .map(|(key, d)| {
            let tokens = tokens(algorithm.which(), &quota, &d);
            json!({
                "key": shown_key(policy.key_spec(), &key),
                "tokens": (tokens * 100.0).round() / 100.0,
                "remaining": d.remaining,
                "limit": d.limit,
                "level": if d.limit == 0 { 0.0 } else { tokens / d.limit as f64 },
                "reset_after_ms": d.reset_after_ms_ceil(),
                "retry_after_ms": d.retry_after_ms_ceil(),
            })
        })
        .collect()
}

/// The keys with a quota of their own, masked as the hottest are; `null` when the store did
/// not answer.
async fn overrides(policy: &Policy) -> Value {
    match overrides::list(policy).await {
        Ok(all) => all
            .into_iter()
            .map(|mut o| {
                if let Some(key) = o["key"].as_str() {
                    o["key"] = json!(shown_key(policy.key_spec(), key));
                }
                o
            })
            .collect(),
        Err(_) => Value::Null,
    }
}

/// Tokens available: fractional for the bucket algorithms (`capacity - reset_after / interval`),
/// whole for the window ones.
fn tokens(kind: Kind, quota: &sluice_core::Quota, d: &Decision) -> f64 {
    let cap = quota.capacity() as f64;
    match kind {
        Kind::TokenBucket | Kind::Gcra | Kind::LeakyBucket => {
            (cap - d.reset_after_ns as f64 / quota.interval_ns() as f64).clamp(0.0, cap)
        }
        _ => d.remaining as f64,
    }
}

/// A key as the dashboard shows it: IPs whole; header, cookie and query values (often API
/// keys or session ids) as their first few characters and a fingerprint, so that a
/// screenshot does not leak them.
pub fn shown_key(spec: &KeySpec, key: &str) -> String {
    match spec {
        KeySpec::Global => "(global)".to_owned(),
        _ if key.is_empty() => "(none)".to_owned(),
        KeySpec::Ip => key.to_owned(),
        // Already a digest (a long or binary value).
        _ if key.starts_with('~') => key.to_owned(),
        _ => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            key.hash(&mut h);
            let shown: String = key.chars().take((key.chars().count() / 3).min(4)).collect();
            format!("{shown}…#{:06x}", h.finish() & 0xff_ffff)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counters_and_browser_telemetry_come_from_the_metrics_text() {
        let config = crate::config::parse(
            "[[policy]]\nname = \"api\"\ncapacity = 2\nrate = \"1/s\"\nkey = \"ip\"\n\n[[route]]\npath_prefix = \"/api/\"\npolicies = [\"api\"]\nupstream = \"http://127.0.0.1:9\"\n",
            "t.toml",
        )
        .unwrap();
        let runtime = crate::runtime::dry_run(config).unwrap();
        runtime.policies["api"].check("10.0.0.1", 2).await.unwrap();
        let metrics = "\
sluice_policy_admitted_total{policy=\"api\",protocol=\"http1\"} 5
sluice_policy_admitted_total{policy=\"api\",protocol=\"grpc\"} 2
sluice_policy_denied_total{policy=\"api\",reason=\"timeout\",protocol=\"http1\"} 1
sluice_policy_denied_total{policy=\"api\",reason=\"timeout\",protocol=\"ws\"} 2
sluice_policy_waiting{policy=\"api\"} 1
sluice_queue_wait_seconds{limiter=\"api\",quantile=\"0.5\"} 0.25
sluice_queue_wait_seconds{limiter=\"api\",quantile=\"0.99\"} 1.5
sluice_queue_wait_seconds_count{limiter=\"api\"} 4
sluice_upstream_responses_total{route=\"/api/\",status=\"2xx\",protocol=\"http1\"} 4
sluice_upstream_responses_total{route=\"/api/\",status=\"2xx\",protocol=\"h2\"} 3
sluice_upstream_errors_total{route=\"/api/\",error=\"refused\"} 1
sluice_browser_admitted_total 12
sluice_browser_rejected_total{reason=\"limit\"} 3
";
        let s = snapshot(&runtime, metrics, 42).await;
        assert_eq!(s["now_ms"], 42);
        let p = &s["policies"][0];
        assert_eq!(p["admitted"], 7.0);
        assert_eq!(p["denied"]["timeout"], 3.0);
        assert_eq!(p["denied"]["limit"], 0.0);
        assert_eq!(p["waiting"], 1.0);
        assert_eq!(p["queue_wait_ms"]["p50"], 250.0);
        assert_eq!(p["queue_wait_ms"]["p99"], 1500.0);
        assert_eq!(p["queue_wait_ms"]["count"], 4.0);
        assert_eq!(p["hottest"][0]["key"], "10.0.0.1");
        assert_eq!(p["hottest"][0]["remaining"], 0);
        assert_eq!(p["overrides"], json!([]));
        assert_eq!(s["routes"][0]["responses"]["2xx"], 7.0);
        assert_eq!(s["routes"][0]["errors"]["refused"], 1.0);
        let browser = s["browser"].as_array().unwrap();
        assert_eq!(browser.len(), 2);
        assert_eq!(browser[0]["name"], "sluice_browser_admitted_total");
        assert_eq!(browser[0]["value"], 12.0);
        assert_eq!(browser[1]["labels"]["reason"], "limit");
    }

    #[test]
    fn keys_are_masked_unless_ips() {
        assert_eq!(shown_key(&KeySpec::Ip, "10.0.0.1"), "10.0.0.1");
        assert_eq!(shown_key(&KeySpec::Global, ""), "(global)");
        let spec: KeySpec = "header:X-Api-Key".parse().unwrap();
        assert_eq!(shown_key(&spec, ""), "(none)");
        let masked = shown_key(&spec, "sk-live-0123456789");
        assert!(masked.starts_with("sk-l…#"), "{masked}");
        assert!(!masked.contains("0123"));
        assert_eq!(masked, shown_key(&spec, "sk-live-0123456789"), "stable");
        assert_ne!(masked, shown_key(&spec, "sk-live-0123456780"));
        assert!(shown_key(&spec, "k1").starts_with("…#"));
        assert_eq!(shown_key(&spec, "~00ff"), "~00ff");
    }
}
