//! Per-key quotas on the admin listener:
//!
//! | method and path | answer |
//! |---|---|
//! | `GET /v1/policies/NAME/keys` | `{"policy", "overrides": [{"key", "capacity", "rate"}]}`: every key with a quota of its own, by its stored form |
//! | `GET /v1/policies/NAME/keys/KEY` | `{"policy", "key", "stored_key", "override", "quota", "state"}`: the key's own quota (or `null`), the quota in force and its source, and its bucket now (consuming nothing) |
//! | `PUT /v1/policies/NAME/keys/KEY` | body `{"capacity": N, "rate": "R"}` (either may be left out: the policy's); sets the key's own quota |
//! | `DELETE /v1/policies/NAME/keys/KEY` | removes it: the key goes back to its plan's or the policy's quota |
//!
//! KEY is the key as a request presents it (the header's, cookie's or query parameter's value,
//! the client address): the policy keys it as the gateway would (an IPv6 address by its /64, a
//! long value by its digest) and hashes it as the store holds it (`stored_key`). The quota is
//! kept with the key's state, by the policy's store: in memory (this process: across reloads
//! and `PUT /v1/policies`, not across a restart), in the state file (across restarts), in
//! Redis (shared by every gateway on the prefix, seen by the others within a second, across
//! restarts). Setting, changing or removing it converts the key's state as a quota change
//! does: no key gains tokens. A key's own quota beats its plan.
//!
//! Errors: 400 a body that is not `{"capacity", "rate"}` (naming the field and value), 404 an
//! unknown policy (or, for `DELETE`, a key without a quota of its own), 422 a quota that
//! cannot be built (a rate too fine for the capacity, a window Redis cannot compute, a leased
//! policy), 503 the store did not answer.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};
use sluice_core::{Quota, Rate};
use sluice_http::{Backend, Policy};

use crate::runtime::state::Shared;
use crate::serve::policies::{json_response, problem, shown};

fn policy(shared: &Shared, name: &str) -> Result<std::sync::Arc<Policy>, Box<Response>> {
    shared.current().policies.get(name).cloned().ok_or_else(|| {
        let shown: String = name.chars().take(64).collect();
        Box::new(problem(
            StatusCode::NOT_FOUND,
            &format!("unknown policy `{shown}`"),
        ))
    })
}

fn quota_json(quota: Quota) -> Value {
    json!({ "capacity": quota.capacity(), "rate": quota.rate().to_string() })
}

fn unavailable() -> Response {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        "the policy's store did not answer; nothing changed, or the change was lost with the answer",
    )
}

/// `GET /v1/policies/NAME/keys`.
pub async fn list(State(shared): State<&'static Shared>, Path(name): Path<String>) -> Response {
    let p = match policy(shared, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    match crate::runtime::overrides::list(&p).await {
        Ok(overrides) => json_response(
            StatusCode::OK,
            &json!({ "policy": name, "overrides": overrides }),
        ),
        Err(_) => unavailable(),
    }
}

/// `GET /v1/policies/NAME/keys/KEY`.
pub async fn show(
    State(shared): State<&'static Shared>,
    Path((name, key)): Path<(String, String)>,
) -> Response {
    let p = match policy(shared, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let key = p.key_spec().key_of_value(&key);
    let stored = p.stored_key(&key).into_owned();
    let own = match p.backend() {
        // What Redis holds now, not this gateway's copy.
        Backend::Redis(s) => match s.overrides().await {
            Ok(all) => all.into_iter().find(|(k, _)| *k == stored).map(|(_, q)| q),
            Err(_) => return unavailable(),
        },
        other => other.override_of(&stored),
    };
    let (quota, source) = match own {
        Some(q) => (q, "override"),
        None => (p.quota(), "policy"),
    };
    let state = match p.peek(&key).await {
        Ok(d) => json!({
            "remaining": d.remaining,
            "limit": d.limit,
            "reset_after_ms": d.reset_after_ns.div_ceil(1_000_000),
        }),
        Err(_) => return unavailable(),
    };
    json_response(
        StatusCode::OK,
        &json!({
            "policy": name,
            "key": &*key,
            "stored_key": stored,
            "override": own.map(quota_json),
            "quota": { "capacity": quota.capacity(), "rate": quota.rate().to_string(), "source": source },
            "state": state,
        }),
    )
}

/// `PUT /v1/policies/NAME/keys/KEY`.
pub async fn set(
    State(shared): State<&'static Shared>,
    Path((name, key)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let p = match policy(shared, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let (capacity, rate) = match parse(&body) {
        Ok(v) => v,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let capacity = capacity.unwrap_or(p.quota().capacity());
    let (rate_text, rate) =
        rate.unwrap_or_else(|| (p.quota().rate().to_string(), p.quota().rate()));
    let quota = match Quota::new(capacity, rate) {
        Ok(q) => q,
        Err(e) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("capacity {capacity}, rate `{rate_text}`: {e}"),
            )
        }
    };
    // A leased policy's key takes its slices on its own quota (the store's leases follow it).
    if let Backend::Redis(s) = p.backend() {
        if let Err(e) = s.supports_quota(quota) {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("capacity {capacity}, rate `{rate_text}`: {e}"),
            );
        }
    }
    let key = p.key_spec().key_of_value(&key);
    let stored = p.stored_key(&key).into_owned();
    match p.backend().set_override(&stored, Some(quota)).await {
        Ok(previous) => {
            tracing::info!(target: "sluice::reload", policy = %name, key = %stored, capacity, rate = %quota.rate(), "per-key quota set, the key's state converted");
            json_response(
                StatusCode::OK,
                &json!({
                    "policy": name,
                    "stored_key": stored,
                    "override": quota_json(quota),
                    "previous": previous.map(quota_json),
                }),
            )
        }
        Err(_) => unavailable(),
    }
}

/// `DELETE /v1/policies/NAME/keys/KEY`.
pub async fn remove(
    State(shared): State<&'static Shared>,
    Path((name, key)): Path<(String, String)>,
) -> Response {
    let p = match policy(shared, &name) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let key = p.key_spec().key_of_value(&key);
    let stored = p.stored_key(&key).into_owned();
    match p.backend().set_override(&stored, None).await {
        Ok(Some(previous)) => {
            tracing::info!(target: "sluice::reload", policy = %name, key = %stored, "per-key quota removed, the key's state converted");
            json_response(
                StatusCode::OK,
                &json!({ "policy": name, "stored_key": stored, "removed": quota_json(previous) }),
            )
        }
        Ok(None) => problem(
            StatusCode::NOT_FOUND,
            &format!("key `{stored}` of policy `{name}` has no quota of its own"),
        ),
        Err(_) => unavailable(),
    }
}

/// A `PUT`'s capacity and rate (its text and value), each optional.
type Asked = (Option<u64>, Option<(String, Rate)>);

/// `{"capacity": N, "rate": "R"}`, each optional; the error names the field and the value.
fn parse(body: &[u8]) -> Result<Asked, String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("malformed JSON: {e}"))?;
    let Value::Object(members) = value else {
        return Err(format!(
            "expected a JSON object such as {{\"capacity\": 1000, \"rate\": \"1000/min\"}}, got {}",
            shown(&value)
        ));
    };
    let (mut capacity, mut rate) = (None, None);
    for (key, value) in members {
        match key.as_str() {
            "capacity" => match value.as_u64() {
                Some(n) if n >= 1 => capacity = Some(n),
                _ => {
                    return Err(format!(
                        "capacity: expected a whole number of at least 1, got {}",
                        shown(&value)
                    ))
                }
            },
            "rate" => match value.as_str() {
                Some(text) => match text.parse::<Rate>() {
                    Ok(r) => rate = Some((text.to_owned(), r)),
                    Err(e) => return Err(format!("rate: `{text}`: {e}")),
                },
                None => {
                    return Err(format!(
                        "rate: expected a rate such as \"1000/min\", got {}",
                        shown(&value)
                    ))
                }
            },
            other => {
                let other: String = other.chars().take(64).collect();
                return Err(format!("unknown field `{other}`; expected capacity, rate"));
            }
        }
    }
    if capacity.is_none() && rate.is_none() {
        return Err(String::from(
            "expected capacity, rate or both, as in {\"capacity\": 1000, \"rate\": \"1000/min\"}",
        ));
    }
    Ok((capacity, rate))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn bodies_are_read_with_errors_naming_field_and_value() {
        let (c, r) = parse(br#"{"capacity": 5, "rate": "2/s"}"#).unwrap();
        assert_eq!((c, r.unwrap().0.as_str()), (Some(5), "2/s"));
        for (body, says) in [
            (
                &br#"{"capacity": 0}"#[..],
                "capacity: expected a whole number of at least 1, got 0",
            ),
            (br#"{"capacity": "9"}"#, "got \"9\""),
            (br#"{"rate": "fast"}"#, "rate: `fast`:"),
            (br#"{"burst": 1}"#, "unknown field `burst`"),
            (br#"{}"#, "expected capacity, rate or both"),
            (br#"[]"#, "expected a JSON object"),
            (br#"{"#, "malformed JSON"),
        ] {
            let e = parse(body).unwrap_err();
            assert!(e.contains(says), "{e} / {says}");
        }
    }
}
