//! The summary of a run: status codes, errors, latency percentiles, the admitted rate.
//!
//! Latency runs from when a request was due to the end of its response body. Percentiles
//! are nearest-rank. The admitted (2xx) rate is over the planned duration: the offered load
//! lasts that long, and a gateway's quota is over time, not over the tail of slow answers.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::stress::plan::Plan;
use crate::stress::run::{Answer, ErrorKind, Recorded};

/// Latency percentiles of one class of answers, in nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Latency {
    /// Answers counted.
    pub count: u64,
    /// p50, p90, p99, max.
    pub ns: [u64; 4],
}

impl Latency {
    fn of(mut values: Vec<u64>) -> Latency {
        values.sort_unstable();
        let p = |q: f64| {
            if values.is_empty() {
                return 0;
            }
            let rank = (q / 100.0 * values.len() as f64).ceil() as usize;
            values[rank.clamp(1, values.len()) - 1]
        };
        Latency {
            count: values.len() as u64,
            ns: [
                p(50.0),
                p(90.0),
                p(99.0),
                values.last().copied().unwrap_or(0),
            ],
        }
    }
}

/// The figures of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Requests sent.
    pub sent: u64,
    /// Responses by status code.
    pub statuses: BTreeMap<u16, u64>,
    /// Requests without a response, by kind.
    pub errors: BTreeMap<ErrorKind, u64>,
    /// 2xx responses.
    pub admitted: u64,
    /// Over every answer, errors included (at their time of failure).
    pub all: Latency,
    /// Over 2xx responses.
    pub ok: Latency,
    /// Over 429 responses.
    pub limited: Latency,
    /// Late starts (the concurrency bound was reached).
    pub late: u64,
    /// The latest start behind schedule, in nanoseconds.
    pub max_late_ns: u64,
    /// The planned duration, in seconds.
    pub duration_s: f64,
    /// From the first send to the last answer, in seconds.
    pub elapsed_s: f64,
}

impl Summary {
    /// Sums up `recorded` for `plan`.
    pub fn new(plan: &Plan, recorded: &Recorded) -> Summary {
        let mut statuses = BTreeMap::new();
        let mut errors = BTreeMap::new();
        let (mut all, mut ok, mut limited) = (Vec::new(), Vec::new(), Vec::new());
        for s in &recorded.samples {
            all.push(s.latency_ns);
            match s.answer {
                Answer::Status(code) => {
                    *statuses.entry(code).or_insert(0) += 1;
                    if (200..300).contains(&code) {
                        ok.push(s.latency_ns);
                    } else if code == 429 {
                        limited.push(s.latency_ns);
                    }
                }
                Answer::Error(kind) => *errors.entry(kind).or_insert(0) += 1,
            }
        }
        Summary {
            sent: recorded.samples.len() as u64,
            admitted: ok.len() as u64,
            statuses,
            errors,
            all: Latency::of(all),
            ok: Latency::of(ok),
            limited: Latency::of(limited),
            late: recorded.late,
            max_late_ns: recorded.max_late_ns,
            duration_s: plan.duration.as_secs_f64(),
            elapsed_s: recorded.elapsed.as_secs_f64(),
        }
    }

    /// 2xx responses per second of the planned duration.
    pub fn admitted_per_s(&self) -> f64 {
        self.admitted as f64 / self.duration_s.max(1e-9)
    }

    /// Whether every request failed to connect.
    pub fn nothing_connected(&self) -> bool {
        self.sent > 0 && self.errors.get(&ErrorKind::Connect) == Some(&self.sent)
    }

    /// The report for a terminal.
    pub fn text(&self, plan: &Plan) -> String {
        let mut out = String::new();
        let pct = |n: u64| 100.0 * n as f64 / self.sent.max(1) as f64;
        let _ = writeln!(
            out,
            "sluice stress: {} {} at {} for {}, at most {} in flight",
            plan.method,
            plan.url,
            plan.rate_text(),
            secs(self.duration_s),
            plan.concurrency
        );
        let _ = writeln!(
            out,
            "sent {} in {} ({:.1}/s); the last answer after {}\n",
            self.sent,
            secs(self.duration_s),
            self.sent as f64 / self.duration_s.max(1e-9),
            secs(self.elapsed_s)
        );
        let _ = writeln!(out, "status       count");
        for (code, n) in &self.statuses {
            let _ = writeln!(out, "  {code:<7} {n:>8}  {:5.1}%", pct(*n));
        }
        for (kind, n) in &self.errors {
            let _ = writeln!(
                out,
                "  {:<7} {n:>8}  {:5.1}%  (no response)",
                kind.as_str(),
                pct(*n)
            );
        }
        if self.sent == 0 {
            let _ = writeln!(out, "  (none)");
        }
        let _ = writeln!(
            out,
            "\nlatency, from when each request was due to the end of its body:"
        );
        let _ = writeln!(
            out,
            "  {:<8} {:>7} {:>10} {:>10} {:>10} {:>10}",
            "", "count", "p50", "p90", "p99", "max"
        );
        for (name, l) in [
            ("all", &self.all),
            ("2xx", &self.ok),
            ("429", &self.limited),
        ] {
            if l.count == 0 && name != "all" {
                continue;
            }
            let [p50, p90, p99, max] = l.ns.map(ms);
            let _ = writeln!(
                out,
                "  {name:<8} {:>7} {p50:>10} {p90:>10} {p99:>10} {max:>10}",
                l.count
            );
        }
        let _ = writeln!(
            out,
            "\nadmitted (2xx): {} of {} ({:.1}%), {:.2}/s over {}",
            self.admitted,
            self.sent,
            pct(self.admitted),
            self.admitted_per_s(),
            secs(self.duration_s)
        );
        if self.late > 0 {
            let _ = writeln!(
                out,
                "late starts: {} waited for one of the {} slots (at most {} behind schedule); raise --concurrency for a truer open loop",
                self.late,
                plan.concurrency,
                ms(self.max_late_ns)
            );
        }
        out
    }

    /// The report as JSON.
    pub fn json(&self, plan: &Plan) -> Value {
        let latency = |l: &Latency| {
            let ms = |ns: u64| ns as f64 / 1e6;
            json!({ "count": l.count, "p50": ms(l.ns[0]), "p90": ms(l.ns[1]), "p99": ms(l.ns[2]), "max": ms(l.ns[3]) })
        };
        json!({
            "url": plan.url.to_string(),
            "method": plan.method.as_str(),
            "rate_per_s": 1e9 / plan.interval_ns as f64,
            "duration_s": self.duration_s,
            "concurrency": plan.concurrency,
            "sent": self.sent,
            "elapsed_s": self.elapsed_s,
            "statuses": self.statuses.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "errors": self.errors.iter().map(|(k, v)| (k.as_str().to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "admitted": self.admitted,
            "admitted_per_s": self.admitted_per_s(),
            "latency_ms": { "all": latency(&self.all), "2xx": latency(&self.ok), "429": latency(&self.limited) },
            "late_starts": self.late,
            "max_late_ms": self.max_late_ns as f64 / 1e6,
        })
    }
}

fn secs(s: f64) -> String {
    let t = format!("{s:.3}");
    format!("{} s", t.trim_end_matches('0').trim_end_matches('.'))
}

fn ms(ns: u64) -> String {
    let v = ns as f64 / 1e6;
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.2} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stress::plan::parse_url;
    use crate::stress::run::Sample;
    use std::time::Duration;

    #[test]
    fn sums_up() {
        let plan = Plan {
            url: parse_url("http://127.0.0.1:1/x").unwrap(),
            method: http::Method::GET,
            headers: http::HeaderMap::new(),
            interval_ns: 250_000_000,
            duration: Duration::from_secs(1),
            concurrency: 2,
            timeout: Duration::from_secs(1),
        };
        let sample = |answer, ms: u64| Sample {
            answer,
            latency_ns: ms * 1_000_000,
        };
        let recorded = Recorded {
            samples: vec![
                sample(Answer::Status(200), 1),
                sample(Answer::Status(200), 3),
                sample(Answer::Status(429), 2),
                sample(Answer::Error(ErrorKind::Connect), 5),
            ],
            late: 0,
            max_late_ns: 0,
            elapsed: Duration::from_millis(1010),
        };
        let s = Summary::new(&plan, &recorded);
        assert_eq!(s.sent, 4);
        assert_eq!(s.admitted, 2);
        assert_eq!(s.statuses[&200], 2);
        assert_eq!(s.errors[&ErrorKind::Connect], 1);
        assert_eq!(s.ok.ns, [1_000_000, 3_000_000, 3_000_000, 3_000_000]);
        assert_eq!(s.all.ns[3], 5_000_000);
        assert_eq!(s.admitted_per_s(), 2.0);
        assert!(!s.nothing_connected());
        let text = s.text(&plan);
        assert!(
            text.contains("admitted (2xx): 2 of 4 (50.0%), 2.00/s over 1 s"),
            "{text}"
        );
        assert!(text.contains("connect"), "{text}");
        let j = s.json(&plan);
        assert_eq!(j["statuses"]["429"], 1);
        assert_eq!(j["errors"]["connect"], 1);
    }
}
