//! A policy's `plan` and `plans`: where a request's plan name comes from, and each plan's
//! quota, read and checked.
//!
//! ```toml
//! plan = "header:x-plan"
//! plans = { pro = { capacity = 1000, rate = "1000/min" }, enterprise = { capacity = 10000 } }
//! ```
//!
//! A plan that leaves out `capacity` or `rate` takes the policy's. It does not build the
//! stores: `runtime::build` gives each plan a store of its own (`POLICY@PLAN`).

use sluice_core::{Quota, Rate};
use sluice_http::policy::is_valid_name;
use sluice_http::KeySpec;
use toml::de::{DeTable, DeValue};

use super::walk::{join, uint_value, Errors};

/// The most plans one policy may have: each is a store of its own.
pub const MAX_PLANS: usize = 64;

/// One entry of `plans`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanConfig {
    /// The plan's name, as the `plan` header or query parameter carries it.
    pub name: String,
    /// Its quota.
    pub quota: Quota,
}

/// Reads `plan` (its text and offset) against the policy's quota; the errors name
/// `FIELD.plan`.
pub(super) fn source(
    text: &str,
    at: usize,
    field: &str,
    errors: &mut Errors<'_>,
) -> Option<KeySpec> {
    match text.parse::<KeySpec>() {
        Ok(spec @ (KeySpec::Header(_) | KeySpec::Query(_))) => Some(spec),
        Ok(other) => {
            errors.at(
                at,
                &join(field, "plan"),
                format!("`{other}`: a plan comes from header:NAME or query:NAME (set by the proxy that authenticated the client)"),
            );
            None
        }
        Err(e) => {
            errors.at(at, &join(field, "plan"), e.to_string());
            None
        }
    }
}

/// Reads the `plans` table; `base` is the policy's quota (a plan may leave out `capacity` or
/// `rate`), `None` when the policy's own is invalid (then only the plans' own values are
/// checked).
pub(super) fn plans(
    table: &DeTable<'_>,
    field: &str,
    base: Option<Quota>,
    errors: &mut Errors<'_>,
) -> Vec<PlanConfig> {
    let field = join(field, "plans");
    let mut out = Vec::new();
    if table.len() > MAX_PLANS {
        let at = table.iter().next().map_or(0, |(k, _)| k.span().start);
        errors.at(
            at,
            &field,
            format!("{} plans; at most {MAX_PLANS}", table.len()),
        );
    }
    for (name, value) in table.iter() {
        let plan_field = join(&field, name.get_ref());
        let name_at = name.span().start;
        let name = name.get_ref().as_ref();
        if !is_valid_name(name) {
            errors.at(
                name_at,
                &plan_field,
                format!("invalid plan name `{name}`: use 1 to 64 of A-Z a-z 0-9 _ - ."),
            );
            continue;
        }
        let DeValue::Table(t) = value.get_ref() else {
            errors.value(
                value,
                &plan_field,
                format!(
                    "expected a table such as {{ capacity = 1000, rate = \"1000/min\" }}, found {}",
                    value.get_ref().type_str()
                ),
            );
            continue;
        };
        let mut capacity = None;
        let mut rate = None;
        let mut bad = false;
        for (key, v) in t.iter() {
            let key_field = join(&plan_field, key.get_ref());
            match key.get_ref().as_ref() {
                "capacity" => match uint_value(v, &key_field, errors) {
                    Some(0) => {
                        errors.value(v, &key_field, "capacity must be at least 1, got 0");
                        bad = true;
                    }
                    Some(n) => capacity = Some((n, v.span().start)),
                    None => bad = true,
                },
                "rate" => match v.get_ref() {
                    DeValue::String(text) => match text.parse::<Rate>() {
                        Ok(r) => rate = Some((r, text.to_string(), v.span().start)),
                        Err(e) => {
                            errors.value(v, &key_field, format!("`{text}`: {e}"));
                            bad = true;
                        }
                    },
                    other => {
                        errors.value(
                            v,
                            &key_field,
                            format!(
                                "expected a rate such as \"1000/min\", found {}",
                                other.type_str()
                            ),
                        );
                        bad = true;
                    }
                },
                other => {
                    errors.at(
                        key.span().start,
                        &key_field,
                        format!("unknown key `{other}`; expected one of: capacity, rate"),
                    );
                    bad = true;
                }
            }
        }
        if capacity.is_none() && rate.is_none() && !bad {
            errors.value(
                value,
                &plan_field,
                "a plan needs a capacity or a rate (the other is the policy's)",
            );
            continue;
        }
        let (Some(base), false) = (base, bad) else {
            continue;
        };
        let n = capacity.map_or(base.capacity(), |(n, _)| n);
        let r = rate.as_ref().map_or(base.rate(), |(r, _, _)| *r);
        match Quota::new(n, r) {
            Ok(quota) => out.push(PlanConfig {
                name: name.to_owned(),
                quota,
            }),
            Err(e) => {
                let (at, what) = match (&capacity, &rate) {
                    (Some((_, at)), _) => (*at, "capacity"),
                    (None, Some((_, _, at))) => (*at, "rate"),
                    (None, None) => (name_at, "capacity"),
                };
                let shown = match &rate {
                    Some((_, text, _)) => format!("capacity {n}, rate `{text}`: {e}"),
                    None => format!("capacity {n}: {e}"),
                };
                errors.at(at, &join(&plan_field, what), shown);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn config(policy_tail: &str) -> String {
        format!(
            "[[policy]]\nname = \"api\"\nalgorithm = \"gcra\"\ncapacity = 100\nrate = \"100/min\"\nkey = \"header:x-api-key\"\n{policy_tail}\n[[route]]\npath_prefix = \"/\"\npolicies = [\"api\"]\nupstream = \"http://127.0.0.1:1\"\n"
        )
    }

    fn errors(text: &str) -> Vec<String> {
        parse(text, "t.toml")
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn plans_are_read_with_what_they_leave_out_taken_from_the_policy() {
        let c = parse(
            &config("plan = \"header:x-plan\"\nplans = { pro = { capacity = 1000, rate = \"1000/min\" }, team = { capacity = 300 } }"),
            "t.toml",
        )
        .unwrap();
        let p = &c.policies[0];
        assert_eq!(p.plan.as_ref().unwrap().to_string(), "header:x-plan");
        let names: Vec<(&str, u64, String)> = p
            .plans
            .iter()
            .map(|pl| {
                (
                    pl.name.as_str(),
                    pl.quota.capacity(),
                    pl.quota.rate().to_string(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("pro", 1000, String::from("1000/min")),
                ("team", 300, String::from("100/min"))
            ]
        );
        // The table form reads the same.
        let c = parse(
            &config("plan = \"query:plan\"\n[policy.plans.pro]\ncapacity = 7"),
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.policies[0].plans[0].quota.capacity(), 7);
    }

    #[test]
    fn plan_errors_name_the_line_the_field_and_the_value() {
        let e = errors(&config(
            "plan = \"header:x-plan\"\nplans = { pro = { capacity = 0 } }",
        ));
        assert!(
            e.iter().any(|e| e.starts_with("t.toml:8:")
                && e.contains("policy[0].plans.pro.capacity")
                && e.contains("got 0")),
            "{e:?}"
        );
        let e = errors(&config(
            "plan = \"header:x-plan\"\nplans = { pro = { rate = \"fast\" } }",
        ));
        assert!(
            e.iter().any(|e| e.starts_with("t.toml:8:")
                && e.contains("policy[0].plans.pro.rate")
                && e.contains("`fast`")),
            "{e:?}"
        );
        let e = errors(&config(
            "plan = \"header:x-plan\"\nplans = { \"a b\" = { capacity = 5 } }",
        ));
        assert!(
            e.iter()
                .any(|e| e.contains(":8:") && e.contains("invalid plan name `a b`")),
            "{e:?}"
        );
        let e = errors(&config(
            "plan = \"header:x-plan\"\nplans = { pro = { capacity = 5, burst = 2 } }",
        ));
        assert!(
            e.iter()
                .any(|e| e.contains("policy[0].plans.pro.burst")
                    && e.contains("unknown key `burst`")),
            "{e:?}"
        );
        let e = errors(&config("plan = \"ip\"\nplans = { pro = { capacity = 5 } }"));
        assert!(
            e.iter().any(|e| e.starts_with("t.toml:7:")
                && e.contains("policy[0].plan")
                && e.contains("`ip`")),
            "{e:?}"
        );
        let e = errors(&config("plans = { pro = { capacity = 5 } }"));
        assert!(
            e.iter().any(|e| e.starts_with("t.toml:7:")
                && e.contains("policy[0].plans")
                && e.contains("needs `plan`")),
            "{e:?}"
        );
        let e = errors(&config("plan = \"header:x-plan\""));
        assert!(
            e.iter().any(|e| e.starts_with("t.toml:7:")
                && e.contains("policy[0].plan")
                && e.contains("needs `plans`")),
            "{e:?}"
        );
        let e = errors(&config("plan = \"header:x-plan\"\nplans = { pro = 5 }"));
        assert!(
            e.iter().any(|e| e.contains("policy[0].plans.pro")
                && e.contains("expected a table")
                && e.contains("integer")),
            "{e:?}"
        );
    }
}
