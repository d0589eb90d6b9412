//! What a run comes to: counts, denials by reason, queue-wait percentiles, rates, per key.
//!
//! Percentiles are nearest-rank over every admitted request (those admitted at once wait
//! 0): p50 is the smallest wait that at least half of them did not exceed. Rates are over
//! the run's span: from time 0 to the end of the load (a pattern's duration, or a trace's
//! last request) or the last admission or timeout, whichever is later.

use std::fmt::Write as _;

use serde_json::{json, Value};
use sluice_http::admit::Reason;

use crate::simulate::arrival::{secs, Arrival};
use crate::simulate::engine::{Fate, Run};

/// Keys listed in the text report (the JSON lists them all).
pub const KEYS_SHOWN: usize = 20;

/// Counts for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySummary {
    /// The key (empty: no key).
    pub key: String,
    /// Requests offered.
    pub offered: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied.
    pub denied: u64,
}

/// The figures of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Requests offered.
    pub offered: u64,
    /// Requests admitted (at once or after waiting).
    pub admitted: u64,
    /// Denials by reason, indexed like [`Reason::ALL`].
    pub denied: [u64; Reason::ALL.len()],
    /// Admitted requests that waited at all.
    pub waited: u64,
    /// Queue-wait percentiles of admitted requests, in nanoseconds: p50, p90, p99, max.
    pub wait_ns: [u64; 4],
    /// The span rates are taken over.
    pub span_ns: u64,
    /// Per key, most offered first.
    pub keys: Vec<KeySummary>,
}

/// The `p`-th percentile (0 < p <= 100) of `sorted` by nearest rank; 0 when empty.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Summary {
    /// Sums up `run` of `arrivals`, whose load lasted `horizon_ns`.
    pub fn new(run: &Run, arrivals: &[Arrival], horizon_ns: u64) -> Summary {
        let mut denied = [0u64; Reason::ALL.len()];
        let mut waits = Vec::new();
        let mut keys: Vec<KeySummary> = run
            .keys
            .iter()
            .map(|k| KeySummary {
                key: k.clone(),
                offered: 0,
                admitted: 0,
                denied: 0,
            })
            .collect();
        for (i, fate) in run.fates.iter().enumerate() {
            let key = &mut keys[run.key_of[i]];
            key.offered += 1;
            match *fate {
                Fate::Admitted { wait_ns, .. } => {
                    waits.push(wait_ns);
                    key.admitted += 1;
                }
                Fate::Denied { reason, .. } => {
                    denied[reason as usize] += 1;
                    key.denied += 1;
                }
            }
        }
        waits.sort_unstable();
        let last_arrival = arrivals.last().map_or(0, |a| a.at_ns);
        keys.sort_by(|a, b| b.offered.cmp(&a.offered).then_with(|| a.key.cmp(&b.key)));
        Summary {
            offered: run.fates.len() as u64,
            admitted: waits.len() as u64,
            denied,
            waited: waits.iter().filter(|&&w| w > 0).count() as u64,
            wait_ns: [
                percentile(&waits, 50.0),
                percentile(&waits, 90.0),
                percentile(&waits, 99.0),
                waits.last().copied().unwrap_or(0),
            ],
            span_ns: horizon_ns.max(last_arrival).max(run.last_event_ns),
            keys,
        }
    }

    /// Denials of every reason.
    pub fn denied_total(&self) -> u64 {
        self.denied.iter().sum()
    }

    /// `n` per second over the span, if it is not empty.
    pub fn rate(&self, n: u64) -> Option<f64> {
        (self.span_ns > 0).then(|| n as f64 / secs(self.span_ns))
    }

    /// The report for a terminal. `title` names the policy, `load` the trace or pattern; a
    /// `keyed` policy with more than one key gets a table per key.
    pub fn text(&self, title: &str, load: &str, keyed: bool) -> String {
        let mut out = String::new();
        let pct = |n: u64| {
            if self.offered == 0 {
                0.0
            } else {
                100.0 * n as f64 / self.offered as f64
            }
        };
        let rate = |n: u64| self.rate(n).map_or("-".to_owned(), |r| format!("{r:.2}/s"));
        let _ = writeln!(out, "{title}");
        let _ = writeln!(
            out,
            "load: {load}: {} requests over {} s ({} offered)\n",
            self.offered,
            trim(secs(self.span_ns)),
            rate(self.offered)
        );
        let _ = writeln!(out, "offered   {:>8}", self.offered);
        let _ = writeln!(
            out,
            "admitted  {:>8}  {:5.1}%  {} effective",
            self.admitted,
            pct(self.admitted),
            rate(self.admitted)
        );
        let reasons: Vec<String> = Reason::ALL
            .iter()
            .filter(|r| {
                !matches!(r, Reason::Unavailable | Reason::AmbiguousKey)
                    || self.denied[**r as usize] > 0
            })
            .map(|r| format!("{} {}", r.as_str(), self.denied[*r as usize]))
            .collect();
        let _ = writeln!(
            out,
            "denied    {:>8}  {:5.1}%  {}",
            self.denied_total(),
            pct(self.denied_total()),
            reasons.join(", ")
        );
        let [p50, p90, p99, max] = self.wait_ns.map(ms);
        let _ = writeln!(
            out,
            "\nqueue wait of admitted requests ({} of {} waited):\n  p50 {p50}   p90 {p90}   p99 {p99}   max {max}",
            self.waited, self.admitted
        );
        if keyed && self.keys.len() > 1 {
            let keys = match self.keys.len() {
                1 => "1 key".to_owned(),
                n => format!("{n} keys"),
            };
            let _ = writeln!(out, "\nper key ({keys}, most requests first):");
            let width = self
                .keys
                .iter()
                .take(KEYS_SHOWN)
                .map(|k| shown_key(&k.key).chars().count())
                .max()
                .unwrap_or(3)
                .max(3);
            let _ = writeln!(
                out,
                "  {:<width$}  {:>8}  {:>8}  {:>8}  {:>10}",
                "key", "offered", "admitted", "denied", "admitted/s"
            );
            for k in self.keys.iter().take(KEYS_SHOWN) {
                let _ = writeln!(
                    out,
                    "  {:<width$}  {:>8}  {:>8}  {:>8}  {:>10}",
                    shown_key(&k.key),
                    k.offered,
                    k.admitted,
                    k.denied,
                    self.rate(k.admitted)
                        .map_or("-".to_owned(), |r| format!("{r:.2}"))
                );
            }
            if self.keys.len() > KEYS_SHOWN {
                let _ = writeln!(
                    out,
                    "  ... and {} more (see --json)",
                    self.keys.len() - KEYS_SHOWN
                );
            }
        }
        out
    }

    /// The report as JSON (`policy` and `load` are passed through).
    pub fn json(&self, policy: Value, load: Value) -> Value {
        let denied: serde_json::Map<String, Value> = Reason::ALL
            .iter()
            .map(|r| (r.as_str().to_owned(), json!(self.denied[*r as usize])))
            .collect();
        let ms = |ns: u64| ns as f64 / 1e6;
        json!({
            "policy": policy,
            "load": load,
            "offered": self.offered,
            "admitted": self.admitted,
            "denied": self.denied_total(),
            "denied_by_reason": denied,
            "waited": self.waited,
            "queue_wait_ms": {
                "p50": ms(self.wait_ns[0]),
                "p90": ms(self.wait_ns[1]),
                "p99": ms(self.wait_ns[2]),
                "max": ms(self.wait_ns[3]),
            },
            "span_s": secs(self.span_ns),
            "offered_per_s": self.rate(self.offered),
            "admitted_per_s": self.rate(self.admitted),
            "keys": self.keys.iter().map(|k| json!({
                "key": k.key,
                "offered": k.offered,
                "admitted": k.admitted,
                "denied": k.denied,
                "admitted_per_s": self.rate(k.admitted),
            })).collect::<Vec<_>>(),
        })
    }
}

fn shown_key(key: &str) -> &str {
    if key.is_empty() {
        "(none)"
    } else {
        key
    }
}

/// A number of seconds without useless decimals: `8`, `2.5`, `0.125`.
fn trim(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_owned()
}

/// Nanoseconds as milliseconds for a person: `0 ms`, `12.5 ms`, `2000 ms`.
fn ms(ns: u64) -> String {
    let v = ns as f64 / 1e6;
    if v >= 100.0 {
        let s = format!("{v:.1}");
        format!("{} ms", s.trim_end_matches('0').trim_end_matches('.'))
    } else {
        format!("{} ms", trim(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v = [0, 0, 0, 0, 1, 1, 2, 2];
        assert_eq!(percentile(&v, 50.0), 0);
        assert_eq!(percentile(&v, 90.0), 2);
        assert_eq!(percentile(&v, 99.0), 2);
        assert_eq!(percentile(&[5], 50.0), 5);
        assert_eq!(percentile(&[], 50.0), 0);
        let hundred: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&hundred, 50.0), 50);
        assert_eq!(percentile(&hundred, 90.0), 90);
        assert_eq!(percentile(&hundred, 99.0), 99);
        assert_eq!(trim(8.0), "8");
        assert_eq!(trim(0.125), "0.125");
        assert_eq!(ms(12_500_000), "12.5 ms");
    }
}
