//! The `[[rls]]` rules of one runtime: which policy decides a descriptor, and with which key.
//!
//! # Keys
//!
//! A rule's `match` entries without a `value` are the variable ones; the descriptor's values
//! for them make the key, interpreted by the policy's `key` the way the HTTP gateway reads a
//! request (see [`KeySpec::key_of_value`]):
//!
//! - no variable entry: the empty key (one bucket for every such descriptor);
//! - one: the key an HTTP request gets when its key part is that value. Under `key = "ip"` a
//!   value that is an address is that client's key (an IPv6 address its /64); under
//!   `header:`, `cookie:` and `query:` the value itself (hashed alike in file and Redis stores);
//!   under `global`, the empty key;
//! - several: `~` and 32 hex digits of the SHA-256 of the values (each preceded by its length),
//!   a key no HTTP request gets.

use std::collections::HashMap;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use sha2::{Digest as _, Sha256};
use sluice_http::{KeySpec, Policy};

use crate::config::RlsRule;

/// The rules, in file order.
#[derive(Debug, Default)]
pub struct RlsTable {
    rules: Vec<Rule>,
}

#[derive(Debug)]
struct Rule {
    domain: String,
    entries: Vec<(String, Option<String>)>,
    policy: Arc<Policy>,
    on_stream_done: bool,
}

/// A descriptor's policy and the key it spends.
#[derive(Debug)]
pub struct Matched<'a> {
    /// The policy of the first rule that matched.
    pub policy: &'a Arc<Policy>,
    /// The key, as the HTTP gateway would give it to the policy (before any hashing of the
    /// store).
    pub key: String,
    /// The rule charges what a finished stream cost rather than deciding (`on_stream_done`).
    pub on_stream_done: bool,
}

impl RlsTable {
    /// The table of `rules` over `policies` (a rule naming a policy that is not there, which a
    /// valid configuration never has, is left out).
    pub fn new(rules: &[RlsRule], policies: &HashMap<String, Arc<Policy>>) -> RlsTable {
        RlsTable {
            rules: rules
                .iter()
                .filter_map(|r| {
                    Some(Rule {
                        domain: r.domain.clone(),
                        entries: r
                            .entries
                            .iter()
                            .map(|e| (e.key.clone(), e.value.clone()))
                            .collect(),
                        policy: Arc::clone(policies.get(&r.policy)?),
                        on_stream_done: r.on_stream_done,
                    })
                })
                .collect(),
        }
    }

    /// Whether there is no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The policy and key of `descriptor` in `domain`: the first rule of that domain whose
    /// entries are the descriptor's, in order and as many, with the same keys and the same
    /// values where the rule fixes one.
    pub fn find(&self, domain: &str, descriptor: &RateLimitDescriptor) -> Option<Matched<'_>> {
        let entries = &descriptor.entries;
        let rule = self.rules.iter().find(|r| {
            r.domain == domain
                && r.entries.len() == entries.len()
                && r.entries.iter().zip(entries).all(|((key, value), e)| {
                    *key == e.key && value.as_ref().is_none_or(|v| *v == e.value)
                })
        })?;
        let mut variable = rule
            .entries
            .iter()
            .zip(entries)
            .filter(|((_, fixed), _)| fixed.is_none())
            .map(|(_, e)| e.value.as_str());
        let key = match (variable.next(), variable.next()) {
            (None, _) => String::new(),
            (Some(value), None) => String::from(&*rule.policy.key_spec().key_of_value(value)),
            (Some(_), Some(_)) if *rule.policy.key_spec() == KeySpec::Global => String::new(),
            (Some(_), Some(_)) => digest(
                rule.entries
                    .iter()
                    .zip(entries)
                    .filter(|((_, fixed), _)| fixed.is_none())
                    .map(|(_, e)| e.value.as_str()),
            ),
        };
        Some(Matched {
            policy: &rule.policy,
            key,
            on_stream_done: rule.on_stream_done,
        })
    }
}

/// `~` and the first 16 bytes, in hex, of the SHA-256 of `values`, each preceded by its
/// length (so that no two lists of values give the same input).
fn digest<'a>(values: impl Iterator<Item = &'a str>) -> String {
    let mut hash = Sha256::new();
    for v in values {
        hash.update((v.len() as u64).to_be_bytes());
        hash.update(v.as_bytes());
    }
    let digest = hash.finalize();
    let mut out = String::with_capacity(33);
    out.push('~');
    for byte in &digest[..16] {
        out.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
    }
    out
}

/// A policy's rate as Envoy's `RateLimit` (`requests_per_unit`, `unit`): the first of
/// second, minute, hour and day in which the rate is a whole number of requests; otherwise
/// per day, rounded down (at least 1). `5/s` is 5 per second, `100/min` 100 per minute,
/// `0.5/s` 30 per minute, `10 per 90s` 400 per hour. The capacity (burst) is not part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Per second.
    Second,
    /// Per minute.
    Minute,
    /// Per hour.
    Hour,
    /// Per day.
    Day,
}

impl Unit {
    /// `(requests_per_unit, unit)` of a rate of one request per `interval_ns`.
    pub fn of_interval(interval_ns: u64) -> (u32, Unit) {
        const UNITS: [(u64, Unit); 4] = [
            (1_000_000_000, Unit::Second),
            (60_000_000_000, Unit::Minute),
            (3_600_000_000_000, Unit::Hour),
            (86_400_000_000_000, Unit::Day),
        ];
        let interval = interval_ns.max(1);
        let whole = UNITS
            .iter()
            .find(|(ns, _)| ns % interval == 0)
            .copied()
            .unwrap_or(UNITS[3]);
        let per = (whole.0 / interval).max(1);
        (u32::try_from(per).unwrap_or(u32::MAX), whole.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RlsEntry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use sluice_core::{AnyAlgorithm, Kind, Quota};

    fn policy(name: &str, key: &str) -> Arc<Policy> {
        let alg = AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(10, "5/s").unwrap());
        Arc::new(
            Policy::builder(name, alg)
                .key(key.parse().unwrap())
                .build()
                .unwrap(),
        )
    }

    fn rule(domain: &str, entries: &[(&str, Option<&str>)], policy: &str) -> RlsRule {
        RlsRule {
            domain: domain.into(),
            entries: entries
                .iter()
                .map(|(k, v)| RlsEntry {
                    key: (*k).into(),
                    value: v.map(Into::into),
                })
                .collect(),
            policy: policy.into(),
            on_stream_done: false,
        }
    }

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn first_exact_match_wins_and_keys_follow_the_policy() {
        let policies: HashMap<String, Arc<Policy>> = [
            ("search".to_owned(), policy("search", "ip")),
            ("user".to_owned(), policy("user", "header:x-user")),
            ("all".to_owned(), policy("all", "global")),
        ]
        .into();
        let table = RlsTable::new(
            &[
                rule(
                    "edge",
                    &[("remote_address", None), ("path", Some("/api/search"))],
                    "search",
                ),
                rule("edge", &[("user", None)], "user"),
                rule("edge", &[("remote_address", None)], "all"),
                rule("edge", &[("a", None), ("b", None)], "user"),
            ],
            &policies,
        );
        let m = table
            .find(
                "edge",
                &descriptor(&[("remote_address", "1.2.3.4"), ("path", "/api/search")]),
            )
            .unwrap();
        assert_eq!((m.policy.name(), m.key.as_str()), ("search", "1.2.3.4"));
        let m = table
            .find(
                "edge",
                &descriptor(&[
                    ("remote_address", "2001:db8:1:2::9"),
                    ("path", "/api/search"),
                ]),
            )
            .unwrap();
        assert_eq!(m.key, "2001:db8:1:2::/64");
        // Another path: the fixed value does not match, the later rule does.
        assert!(table
            .find(
                "edge",
                &descriptor(&[("remote_address", "1.2.3.4"), ("path", "/other")])
            )
            .is_none());
        let m = table
            .find("edge", &descriptor(&[("remote_address", "1.2.3.4")]))
            .unwrap();
        assert_eq!((m.policy.name(), m.key.as_str()), ("all", ""));
        let m = table.find("edge", &descriptor(&[("user", "bob")])).unwrap();
        assert_eq!((m.policy.name(), m.key.as_str()), ("user", "bob"));
        assert!(table
            .find("other", &descriptor(&[("user", "bob")]))
            .is_none());
        // Several values: one digest, distinct for distinct lists.
        let ab = table
            .find("edge", &descriptor(&[("a", "x"), ("b", "yz")]))
            .unwrap()
            .key;
        let ab2 = table
            .find("edge", &descriptor(&[("a", "xy"), ("b", "z")]))
            .unwrap()
            .key;
        assert_eq!(ab.len(), 33);
        assert!(ab.starts_with('~'));
        assert_ne!(ab, ab2);
        // Keys in another order are another descriptor.
        assert!(table
            .find("edge", &descriptor(&[("b", "x"), ("a", "y")]))
            .is_none());
    }

    #[test]
    fn units() {
        let per = |rate: &str| Unit::of_interval(Quota::parse(1, rate).unwrap().interval_ns());
        assert_eq!(per("5/s"), (5, Unit::Second));
        assert_eq!(per("100/min"), (100, Unit::Minute));
        assert_eq!(per("0.5/s"), (30, Unit::Minute));
        assert_eq!(per("10 per 90s"), (400, Unit::Hour));
        assert_eq!(per("1000/h"), (1000, Unit::Hour));
        assert_eq!(per("1/d"), (1, Unit::Day));
    }
}
