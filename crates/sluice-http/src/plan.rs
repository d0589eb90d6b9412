//! A policy's plans: each plan a quota and a store of its own, chosen per request by a header
//! or query parameter that an authenticating proxy sets (`plan = "header:x-plan"`).
//!
//! # Separate buckets, not converted ones
//!
//! Each plan keeps its keys in a store of its own (`POLICY@PLAN`: its own table, state file
//! or Redis prefix), so a key's bucket under one plan is a different bucket from the same
//! key's under another. The alternative, one bucket per key converted whenever a request
//! names another plan, was not taken: the plan comes with each request, so two requests of
//! one key under two plans (a proxy in the middle of an upgrade, two proxies with different
//! caches) would convert the key back and forth on every request, each conversion costing a
//! store write and leaving the key at the smaller of the two. Separate buckets cost nothing
//! per request, and a key that changes plan does not gain in the bucket it had: going back
//! finds that bucket as it was left, and the new plan's bucket is the new plan's quota,
//! which its holder was granted. The plan name is set by the proxy that authenticated the
//! client, never by the client (a gateway reached directly must not be given this header).
//!
//! A request without a plan, or naming one the policy does not list, is decided by the
//! policy's own quota and store; unknown names are counted in
//! `sluice_policy_unknown_plan_total{policy}`.
//!
//! # Tagged keys
//!
//! [`Policy::request_key`](crate::Policy::request_key) gives the key of a request to a
//! policy with plans tagged with the plan: `"\0" PLAN "\0" KEY` (an empty PLAN for the
//! policy's own quota). Every key of such a policy from a request is tagged, so a client
//! whose key itself starts with a NUL (a query parameter `%00pro%00...`) cannot choose a
//! plan: its NULs are after the tag. An untagged key (the decision API's, Envoy's) is
//! decided by the policy's own quota.

use std::collections::HashMap;
use std::sync::Arc;

use crate::key::KeySpec;
use crate::policy::Policy;

/// What marks a tagged key.
pub(crate) const TAG: char = '\0';

/// A policy's plans: where the name comes from, and each plan's policy (same name, key and
/// queue; its own quota and store).
#[derive(Debug, Clone)]
pub struct Plans {
    pub(crate) source: KeySpec,
    pub(crate) tiers: HashMap<String, Arc<Policy>>,
    pub(crate) unknown: metrics::Counter,
}

impl Plans {
    /// Plans named by `source`, each with the policy deciding it.
    pub fn new(policy: &str, source: KeySpec, tiers: Vec<(String, Arc<Policy>)>) -> Plans {
        Plans {
            source,
            tiers: tiers.into_iter().collect(),
            unknown: metrics::counter!("sluice_policy_unknown_plan_total", "policy" => policy.to_owned()),
        }
    }

    /// Where the plan name comes from.
    pub fn source(&self) -> &KeySpec {
        &self.source
    }

    /// The plan named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Policy>> {
        self.tiers.get(name)
    }

    /// Every plan, by name (in no particular order).
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<Policy>)> {
        self.tiers.iter().map(|(n, p)| (n.as_str(), p))
    }
}

/// `key` tagged with `plan` (empty: the policy's own quota).
pub(crate) fn tag(plan: &str, key: &str) -> String {
    let mut out = String::with_capacity(plan.len() + key.len() + 2);
    out.push(TAG);
    out.push_str(plan);
    out.push(TAG);
    out.push_str(key);
    out
}

/// The plan and the key of a tagged key; `None` for an untagged one.
pub(crate) fn split(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(TAG)?.split_once(TAG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_is_read_back_and_a_key_cannot_forge_one() {
        assert_eq!(split(&tag("pro", "k")), Some(("pro", "k")));
        assert_eq!(split(&tag("", "k")), Some(("", "k")));
        // A client key that looks tagged stays the key of the tag around it.
        let forged = "\0pro\0k";
        assert_eq!(split(&tag("", forged)), Some(("", forged)));
        assert_eq!(split("plain"), None);
    }
}
