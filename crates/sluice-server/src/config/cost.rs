//! `[[policy]] cost = { reserve = 1000, request = "body_bytes", settle = "openai" }`: what a
//! request costs the policy, and where its real cost is read when the response ends (see
//! `sluice_http::cost`).
//!
//! Owns the parsing and checks of the `cost` table; the policy checks it against its
//! capacity.

use sluice_http::cost::{CostSpec, RequestCost, Settle};
use toml::de::DeTable;

use crate::config::walk::{Errors, Fields};

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
    let reserve = match f.uint("reserve", errors) {
        None => 1,
        Some((0, at)) => {
            errors.at(
                at,
                &f.path("reserve"),
                "must be at least 1: a request that takes nothing is never refused, even by a key in debt",
            );
            1
        }
        Some((n, at)) => {
            if let Some(capacity) = capacity.filter(|&c| n > c) {
                errors.at(
                    at,
                    &f.path("reserve"),
                    format!("{n} is above the policy's capacity {capacity}: every request would be refused (422)"),
                );
            }
            n
        }
    };
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
    })
}
