//! `[[policy]] cost = { reserve = 1000, request = "body_bytes", settle = "openai",
//! max_debt = "50%" }`: what a request costs the policy, where its real cost is read when the
//! response ends, and how far a settled charge may take a key beyond empty (see
//! `sluice_http::cost`).
//!
//! Owns the parsing and checks of the `cost` table; the policy checks it against its
//! capacity.

use sluice_http::cost::{BodyReserve, CostSpec, RequestCost, Settle};
use toml::de::{DeTable, DeValue};

use crate::config::walk::{uint_value, Errors, Fields};

/// Reads the `cost` table of a policy whose capacity is `capacity` (when known).
pub(crate) fn cost(
    t: &DeTable<'_>,
    at: usize,
    field: String,
    capacity: Option<u64>,
    errors: &mut Errors<'_>,
) -> Option<CostSpec> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let (reserve, from_body) = reserve(&mut f, capacity, errors);
    let request = f.str("request", errors).and_then(|(text, at)| {
        RequestCost::parse(text)
            .map_err(|e| errors.at(at, &f.path("request"), e))
            .ok()
    });
    let settle = f.str("settle", errors).and_then(|(text, at)| {
        Settle::parse(text)
            .map_err(|e| errors.at(at, &f.path("settle"), e))
            .ok()
    });
    let max_debt = max_debt(&mut f, capacity, errors);
    if t.is_empty() {
        errors.at(
            at,
            &f.path("reserve"),
            "an empty cost: give a reserve, a request cost or a settle source, as in cost = { reserve = 500, settle = \"openai\" }",
        );
    }
    f.finish(errors);
    (errors.list.len() == before).then_some(CostSpec {
        reserve,
        request,
        settle,
        from_body,
        max_debt: max_debt.unwrap_or(u64::MAX),
    })
}

/// `reserve`: a whole number of tokens (≥ 1, ≤ `capacity`, default 1), or `"openai"`: read from
/// an OpenAI-compatible request body, with `max_tokens` the answer's budget for a request
/// that gives none. A request whose body is not read then takes the capacity.
fn reserve(
    f: &mut Fields<'_, '_>,
    capacity: Option<u64>,
    errors: &mut Errors<'_>,
) -> (u64, Option<BodyReserve>) {
    let Some(value) = f.get("reserve") else {
        if let Some((_, at)) = f.uint("max_tokens", errors) {
            errors.at(
                at,
                &f.path("max_tokens"),
                "max_tokens is the answer's budget of reserve = \"openai\": give that, or drop max_tokens",
            );
        }
        return (1, None);
    };
    let field = f.path("reserve");
    if let DeValue::String(text) = value.get_ref() {
        if text.as_ref() != "openai" {
            errors.value(
                value,
                &field,
                format!("`{text}` is not a reserve: give tokens (reserve = 1000) or \"openai\" (read from the request body)"),
            );
            return (1, None);
        }
        let default_max_tokens = match f.uint("max_tokens", errors) {
            None => {
                errors.value(
                    value,
                    &field,
                    "reserve = \"openai\" needs max_tokens: the most tokens an answer may have when its request does not say",
                );
                return (1, None);
            }
            Some((n, at)) => {
                if let Some(capacity) = capacity.filter(|&c| n >= c) {
                    errors.at(
                        at,
                        &f.path("max_tokens"),
                        format!("{n} is not below the policy's capacity {capacity}: a request that gives no max_tokens would be refused (422)"),
                    );
                }
                n
            }
        };
        return (
            capacity.unwrap_or(1),
            Some(BodyReserve::OpenAi { default_max_tokens }),
        );
    }
    let Some(n) = uint_value(value, &field, errors) else {
        return (1, None);
    };
    let at = value.span().start;
    if n == 0 {
        errors.at(
            at,
            &field,
            "must be at least 1: a request that takes nothing is never refused, even by a key in debt",
        );
        return (1, None);
    }
    if let Some(capacity) = capacity.filter(|&c| n > c) {
        errors.at(
            at,
            &field,
            format!("{n} is above the policy's capacity {capacity}: every request would be refused (422)"),
        );
    }
    if let Some((_, at)) = f.uint("max_tokens", errors) {
        errors.at(
            at,
            &f.path("max_tokens"),
            "max_tokens is the answer's budget of reserve = \"openai\": give that, or drop max_tokens",
        );
    }
    (n, None)
}

/// `max_debt`: a whole number of tokens, or a share of the policy's capacity as `"150%"`.
/// Absent, a key may owe any amount (`u64::MAX`).
fn max_debt(f: &mut Fields<'_, '_>, capacity: Option<u64>, errors: &mut Errors<'_>) -> Option<u64> {
    let value = f.get("max_debt")?;
    let field = f.path("max_debt");
    match value.get_ref() {
        DeValue::String(text) => {
            let share = text
                .strip_suffix('%')
                .and_then(|n| n.trim().parse::<u64>().ok());
            match (share, capacity) {
                (Some(percent), Some(capacity)) => Some(
                    u64::try_from(u128::from(capacity) * u128::from(percent) / 100)
                        .unwrap_or(u64::MAX),
                ),
                // The capacity is reported wrong where it is read.
                (Some(_), None) => None,
                (None, _) => {
                    errors.value(
                        value,
                        &field,
                        format!("`{text}` is not a share of the capacity: write tokens (max_debt = 50000) or a percentage (max_debt = \"150%\")"),
                    );
                    None
                }
            }
        }
        _ => uint_value(value, &field, errors),
    }
}

#[cfg(test)]
mod tests {
    fn policy(cost: &str) -> String {
        format!("[[policy]]\nname = \"p\"\nalgorithm = \"gcra\"\ncapacity = 1000\nrate = \"1000/min\"\ncost = {cost}\n[[route]]\npath_prefix = \"/\"\npolicies = [\"p\"]\nupstream = \"http://127.0.0.1:1\"\n")
    }

    fn errors(text: &str) -> String {
        crate::config::parse(text, "t.toml")
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_cost_is_read_and_a_bad_one_named_with_its_line_field_and_value() {
        let c = crate::config::parse(
            &policy("{ reserve = 500, request = \"body_bytes\", settle = \"openai:completion_tokens\" }"),
            "t.toml",
        )
        .unwrap();
        let spec = c.policies[0].cost.clone().unwrap();
        assert_eq!(spec.reserve, 500);
        assert_eq!(spec.request.unwrap().to_string(), "body_bytes");
        assert_eq!(spec.settle.unwrap().to_string(), "openai:completion_tokens");
        assert_eq!(spec.max_debt, u64::MAX, "no cap unless one is set");
        let c = crate::config::parse(
            &policy("{ reserve = \"openai\", max_tokens = 500, settle = \"openai\" }"),
            "t.toml",
        )
        .unwrap();
        let spec = c.policies[0].cost.clone().unwrap();
        assert_eq!(
            spec.from_body,
            Some(sluice_http::cost::BodyReserve::OpenAi {
                default_max_tokens: 500
            })
        );
        assert_eq!(spec.reserve, 1000, "a body not read takes the capacity");
        for (cost, max_debt) in [
            ("{ settle = \"openai\", max_debt = 2500 }", 2500),
            ("{ settle = \"openai\", max_debt = \"150%\" }", 1500),
            ("{ settle = \"openai\", max_debt = 0 }", 0),
        ] {
            let c = crate::config::parse(&policy(cost), "t.toml").unwrap();
            assert_eq!(
                c.policies[0].cost.clone().unwrap().max_debt,
                max_debt,
                "{cost}"
            );
        }
        for (cost, expected) in [
            (
                "{ reserve = \"openai\" }",
                "reserve = \"openai\" needs max_tokens",
            ),
            ("{ reserve = \"lots\" }", "`lots` is not a reserve"),
            (
                "{ reserve = 5, max_tokens = 3 }",
                "max_tokens is the answer's budget",
            ),
            (
                "{ reserve = \"openai\", max_tokens = 1000 }",
                "is not below the policy's capacity 1000",
            ),
            (
                "{ settle = \"openai\", max_debt = \"lots\" }",
                "`lots` is not a share of the capacity",
            ),
            (
                "{ settle = \"openai\", max_debt = -5 }",
                "must not be negative",
            ),
            ("{ reserve = 0 }", "policy[0].cost.reserve"),
            ("{ reserve = 1001 }", "above the policy's capacity 1000"),
            ("{ settle = \"usage\" }", "`usage`: use header:NAME"),
            ("{ settle = \"trailer:bad name\" }", "not a header name"),
            ("{ request = \"bytes\" }", "use body_bytes or header:NAME"),
            ("{ reserve = 5, refund = true }", "refund"),
            ("{}", "an empty cost"),
        ] {
            let e = errors(&policy(cost));
            assert!(
                e.contains("t.toml:6:") && e.contains(expected),
                "{cost}: {e}"
            );
        }
    }

    #[test]
    fn on_stream_done_is_a_boolean() {
        let rls = |value: &str| {
            format!("{}[[rls]]\ndomain = \"d\"\nmatch = [{{ key = \"k\" }}]\npolicy = \"p\"\non_stream_done = {value}\n", policy("{ reserve = 1 }"))
        };
        let c = crate::config::parse(&rls("true"), "t.toml").unwrap();
        assert!(c.rls[0].on_stream_done);
        let e = errors(&rls("\"yes\""));
        assert!(
            e.contains("t.toml:15:")
                && e.contains("rls[0].on_stream_done")
                && e.contains("expected true or false"),
            "{e}"
        );
    }
}
