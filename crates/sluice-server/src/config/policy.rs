//! `[[policy]]`: each limit's name, algorithm, quota, key, queue, concurrency, shadow flag,
//! lease and cost, read and checked, with every name defined once.
//!
//! It does not know the routes (they name policies, and `route` checks those names) and
//! builds no limiter: that is `serve::policies`'s.

use std::collections::HashMap;
use std::time::Duration;

use sluice_core::{Kind, Quota, Rate};
use sluice_http::policy::{is_valid_name, QueueSpec};
use sluice_http::KeySpec;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::values::duration;
use super::walk::{Errors, Fields};

/// `[[policy]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// `name`.
    pub name: String,
    /// `algorithm`.
    pub algorithm: Kind,
    /// `capacity` and `rate`.
    pub quota: Quota,
    /// `key`.
    pub key: KeySpec,
    /// `max_keys`.
    pub max_keys: usize,
    /// `queue`.
    pub queue: Option<QueueSpec>,
    /// `concurrency`.
    pub concurrency: Option<usize>,
    /// `shadow`: decide, count, log and send headers as usual, never deny or queue.
    pub shadow: bool,
    /// `lease`: the keys are spent in slices leased from Redis.
    pub lease: Option<super::lease::LeaseSpec>,
    /// `cost`: what a request costs, and where its real cost is read when the response ends.
    pub cost: Option<sluice_http::cost::CostSpec>,
    /// `plan`: where a request's plan name comes from (with `plans`).
    pub plan: Option<KeySpec>,
    /// `plans`: each plan's quota, in file order.
    pub plans: Vec<super::plan::PlanConfig>,
    /// The line of its `name`, for errors found when it is built.
    pub line: usize,
}

/// Reads the `[[policy]]` array: the valid policies in file order, and every name defined
/// with the offset of its first definition (routes and `[[rls]]` rules name policies).
pub(super) fn parse(
    items: Vec<&Spanned<DeValue<'_>>>,
    errors: &mut Errors<'_>,
) -> (Vec<PolicyConfig>, HashMap<String, usize>) {
    let mut policies = Vec::new();
    // Names first, so that a route naming a policy with an error elsewhere is not also
    // told the policy does not exist.
    let mut names: HashMap<String, usize> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let Some(DeValue::String(name)) = item.get_ref().get("name").map(|v| v.get_ref()) else {
            continue;
        };
        let at = item.get_ref().get("name").map_or(0, |v| v.span().start);
        match names.get(name.as_ref()) {
            Some(first) => {
                let first_line = errors.line_of(*first);
                errors.at(
                    at,
                    &format!("policy[{i}].name"),
                    format!("duplicate policy name `{name}` (first defined on line {first_line})"),
                );
            }
            None => {
                names.insert(name.to_string(), at);
            }
        }
    }
    for (i, item) in items.into_iter().enumerate() {
        let field = format!("policy[{i}]");
        let DeValue::Table(t) = item.get_ref() else {
            errors.value(item, &field, "expected a table ([[policy]])");
            continue;
        };
        if let Some((p, at)) = policy(t, &field, errors) {
            if names.get(&p.name) == Some(&at) {
                policies.push(p);
            }
        }
    }
    (policies, names)
}

fn policy(t: &DeTable<'_>, field: &str, errors: &mut Errors<'_>) -> Option<(PolicyConfig, usize)> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let name = f.str("name", errors);
    if let Some((n, at)) = name {
        if !is_valid_name(n) {
            errors.at(
                at,
                &f.path("name"),
                format!("invalid policy name `{n}`: use 1 to 64 of A-Z a-z 0-9 _ - ."),
            );
        }
    }
    let algorithm = match f.str("algorithm", errors) {
        None => Some(Kind::TokenBucket),
        Some((text, at)) => match text.parse::<Kind>() {
            Ok(kind) => Some(kind),
            Err(e) => {
                errors.at(at, &f.path("algorithm"), e.to_string());
                None
            }
        },
    };
    let capacity = f.uint("capacity", errors);
    let rate = match f.str("rate", errors) {
        Some((text, at)) => match text.parse::<Rate>() {
            Ok(rate) => Some(rate),
            Err(e) => {
                errors.at(at, &f.path("rate"), e.to_string());
                None
            }
        },
        None => None,
    };
    let quota = match (capacity, rate) {
        (Some((capacity, at)), Some(rate)) => match Quota::new(capacity, rate) {
            Ok(q) => Some(q),
            Err(e) => {
                errors.at(at, &f.path("capacity"), e.to_string());
                None
            }
        },
        (Some((0, at)), None) => {
            errors.at(
                at,
                &f.path("capacity"),
                "capacity must be at least 1, got 0",
            );
            None
        }
        _ => None,
    };
    let key = match f.str("key", errors) {
        None => Some(KeySpec::Global),
        Some((text, at)) => match text.parse::<KeySpec>() {
            Ok(k) => Some(k),
            Err(e) => {
                errors.at(at, &f.path("key"), e.to_string());
                None
            }
        },
    };
    let max_keys = match f.uint("max_keys", errors) {
        None => 100_000,
        Some((0, at)) => {
            errors.at(at, &f.path("max_keys"), "must be at least 1");
            1
        }
        Some((n, at)) => usize::try_from(n).unwrap_or_else(|_| {
            errors.at(at, &f.path("max_keys"), "is too large");
            1
        }),
    };
    let queue = match f.table("queue", errors) {
        None => None,
        Some((q, _)) => {
            let mut qf = Fields::new(q, f.path("queue"));
            let depth = qf.uint("depth", errors);
            let max_wait = duration(&mut qf, "max_wait", Duration::from_secs(10), errors);
            qf.finish(errors);
            match depth {
                Some((depth, at)) => Some(QueueSpec {
                    depth: usize::try_from(depth).unwrap_or_else(|_| {
                        errors.at(at, &format!("{field}.queue.depth"), "is too large");
                        0
                    }),
                    max_wait,
                }),
                None => {
                    if !q.contains_key("depth") {
                        errors.at(q.iter().next().map_or(0, |(k, _)| k.span().start), &format!("{field}.queue.depth"), "a queue needs a depth, as in queue = { depth = 100, max_wait = \"10s\" }");
                    }
                    None
                }
            }
        }
    };
    let concurrency = match f.uint("concurrency", errors) {
        None => None,
        Some((0, at)) => {
            errors.at(
                at,
                &f.path("concurrency"),
                "must be at least 1 (omit it for no limit)",
            );
            None
        }
        Some((n, _)) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let shadow = super::values::boolean(&mut f, "shadow", false, errors);
    let lease = f.table("lease", errors).and_then(|(l, at)| {
        let spec = super::lease::lease(l, at, f.path("lease"), errors)?;
        if algorithm.is_some_and(|k| !matches!(k, Kind::Gcra | Kind::TokenBucket | Kind::LeakyBucket)) {
            errors.at(at, &f.path("lease"), format!("leases slice a bucket: {} keeps none; use gcra, token_bucket or leaky_bucket, or no lease", algorithm.map_or("", |k| k.name())));
        }
        Some(spec)
    });
    let cost = f.table("cost", errors).and_then(|(c, at)| {
        super::cost::cost(c, at, f.path("cost"), capacity.map(|(c, _)| c), errors)
    });
    let (plan, plans) = plan_and_plans(&mut f, field, quota, errors);
    let table_at = t.iter().next().map_or(0, |(k, _)| k.span().start);
    if name.is_none() {
        errors.at(table_at, &f.path("name"), "a policy needs a name");
    }
    if capacity.is_none() && !t.contains_key("capacity") {
        errors.at(table_at, &f.path("capacity"), "a policy needs a capacity");
    }
    if rate.is_none() && !t.contains_key("rate") {
        errors.at(
            table_at,
            &f.path("rate"),
            "a policy needs a rate, such as \"5/s\"",
        );
    }
    f.finish(errors);
    if errors.list.len() > before {
        return None;
    }
    let (name, at) = name?;
    Some((
        PolicyConfig {
            name: name.to_owned(),
            algorithm: algorithm?,
            quota: quota?,
            key: key?,
            max_keys,
            queue,
            concurrency,
            shadow,
            lease,
            cost,
            plan,
            plans,
            line: errors.line_of(at),
        },
        at,
    ))
}

/// `plan` and `plans`, which come together (see `config::plan`).
fn plan_and_plans(
    f: &mut Fields<'_, '_>,
    field: &str,
    quota: Option<Quota>,
    errors: &mut Errors<'_>,
) -> (Option<KeySpec>, Vec<super::plan::PlanConfig>) {
    let source = f
        .str("plan", errors)
        .map(|(text, at)| (super::plan::source(text, at, field, errors), at));
    let table = f.table("plans", errors);
    let plans = table.map_or_else(Vec::new, |(t, _)| {
        super::plan::plans(t, field, quota, errors)
    });
    match (&source, &table) {
        (Some(_), None) => {
            let at = source.as_ref().map_or(0, |(_, at)| *at);
            errors.at(at, &f.path("plan"), "`plan` needs `plans`, as in plans = { pro = { capacity = 1000, rate = \"1000/min\" } }");
        }
        (None, Some((_, at))) => {
            errors.at(*at, &f.path("plans"), "`plans` needs `plan`, where the plan name comes from: plan = \"header:x-plan\" or \"query:plan\"");
        }
        _ => {}
    }
    (source.and_then(|(s, _)| s), plans)
}
