//! Live quotas on the admin listener: `GET /v1/policies` lists the policies in force, and
//! `PUT /v1/policies/NAME` with `{"capacity": .., "rate": "..", "shadow": ..}` (each member
//! optional) changes one at once.
//!
//! A change is a reload of the configuration in force with that policy changed: the whole new
//! runtime is built (the policy's keys carried over and converted as on SIGHUP, so that no
//! key gains tokens: in memory, in the file store and in Redis), then swapped in, before the
//! answer is sent. It is not written to the config file (`"persisted": false`): the next
//! reload reads the file again, and the file's values apply.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sluice_core::{Quota, Rate};

use crate::config::{Config, PolicyConfig};
use crate::runtime::build::build;
use crate::runtime::changes;
use crate::runtime::state::Shared;

/// `GET /v1/policies`: every policy in force, with its effective values.
pub async fn list(State(shared): State<&'static Shared>) -> Response {
    let runtime = shared.current();
    let policies: Vec<Value> = runtime.config.policies.iter().map(describe).collect();
    json_response(StatusCode::OK, &json!({ "policies": policies }))
}

/// `PUT /v1/policies/NAME`: changes the policy's capacity, rate or shadow mode now.
///
/// **200** with the policy's effective values, `"persisted": false` and what changed;
/// **400** a body that is not a JSON object, an unknown member, a bad value (each naming the
/// field and the value); **404** an unknown policy; **503** the new runtime could not be built
/// (a store refused it; the old one keeps serving).
pub async fn update(
    State(shared): State<&'static Shared>,
    Path(name): Path<String>,
    body: Bytes,
) -> Response {
    let change = match Change::parse(&body) {
        Ok(c) => c,
        Err(message) => return problem(StatusCode::BAD_REQUEST, &message),
    };
    let _one_at_a_time = shared.reconfigure.lock().await;
    let old = shared.current();
    let Some(index) = old.config.policies.iter().position(|p| p.name == name) else {
        let shown: String = name.chars().take(64).collect();
        return problem(StatusCode::NOT_FOUND, &format!("unknown policy `{shown}`"));
    };
    let mut config: Config = old.config.clone();
    let policy = &mut config.policies[index];
    if let Err(message) = change.apply(policy) {
        return problem(StatusCode::BAD_REQUEST, &message);
    }
    let described = describe(policy);
    let changed = changes::describe(&old.config, &config);
    let new = match build(config, Some(&old), shared.demo) {
        Ok(new) => Arc::new(new),
        Err(e) => {
            return problem(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("not applied, the policies in force keep serving: {e}"),
            )
        }
    };
    new.prepare().await;
    shared.runtime.store(Arc::clone(&new));
    new.take_over().await;
    tracing::info!(
        target: "sluice::reload",
        policy = %name,
        %changed,
        converted = ?new.carried,
        "PUT /v1/policies: applied, not persisted (the next reload reads the config file)"
    );
    json_response(
        StatusCode::OK,
        &json!({ "policy": described, "persisted": false, "changed": changed }),
    )
}

/// A policy's effective values, as JSON.
fn describe(p: &PolicyConfig) -> Value {
    json!({
        "name": p.name,
        "algorithm": p.algorithm.to_string(),
        "capacity": p.quota.capacity(),
        "rate": p.quota.rate().to_string(),
        "key": p.key.to_string(),
        "shadow": p.shadow,
        "cost": p.cost.as_ref().map(|c| json!({
            "reserve": c.reserve,
            "request": c.request.as_ref().map(ToString::to_string),
            "settle": c.settle.as_ref().map(ToString::to_string),
        })),
    })
}

/// What a `PUT` asks to change.
#[derive(Debug, Default)]
struct Change {
    capacity: Option<u64>,
    rate: Option<(String, Rate)>,
    shadow: Option<bool>,
}

impl Change {
    /// Reads `{"capacity": N, "rate": "R", "shadow": B}`, each member optional; the error
    /// names the member and its value.
    fn parse(body: &[u8]) -> Result<Change, String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("malformed JSON: {e}"))?;
        let Value::Object(members) = value else {
            return Err(format!(
                "expected a JSON object such as {{\"capacity\": 10, \"rate\": \"5/s\"}}, got {}",
                shown(&value)
            ));
        };
        let mut change = Change::default();
        for (key, value) in members {
            match key.as_str() {
                "capacity" => match value.as_u64() {
                    Some(n) if n >= 1 => change.capacity = Some(n),
                    _ => {
                        return Err(format!(
                            "capacity: expected a whole number of at least 1, got {}",
                            shown(&value)
                        ))
                    }
                },
                "rate" => match value.as_str() {
                    Some(text) => match text.parse::<Rate>() {
                        Ok(rate) => change.rate = Some((text.to_owned(), rate)),
                        Err(e) => return Err(format!("rate: `{text}`: {e}")),
                    },
                    None => {
                        return Err(format!(
                            "rate: expected a rate such as \"5/s\", got {}",
                            shown(&value)
                        ))
                    }
                },
                "shadow" => match value.as_bool() {
                    Some(b) => change.shadow = Some(b),
                    None => {
                        return Err(format!(
                            "shadow: expected true or false, got {}",
                            shown(&value)
                        ))
                    }
                },
                other => {
                    let other: String = other.chars().take(64).collect();
                    return Err(format!(
                        "unknown field `{other}`; expected capacity, rate, shadow"
                    ));
                }
            }
        }
        Ok(change)
    }

    /// Changes `policy`; the error names the field and value the quota refuses.
    fn apply(&self, policy: &mut PolicyConfig) -> Result<(), String> {
        let capacity = self.capacity.unwrap_or(policy.quota.capacity());
        let rate = self
            .rate
            .as_ref()
            .map_or(policy.quota.rate(), |(_, rate)| *rate);
        policy.quota = Quota::new(capacity, rate).map_err(|e| match &self.rate {
            Some((text, _)) => format!("capacity {capacity}, rate `{text}`: {e}"),
            None => format!("capacity {capacity}: {e}"),
        })?;
        if let Some(shadow) = self.shadow {
            policy.shadow = shadow;
        }
        Ok(())
    }
}

/// A value as it appeared, cut short.
pub(crate) fn shown(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 64 {
        format!("{}...", text.chars().take(64).collect::<String>())
    } else {
        text
    }
}

pub(crate) fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut response = (status, format!("{body}\n")).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(crate) fn problem(status: StatusCode, detail: &str) -> Response {
    sluice_http::headers::problem(status, detail).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_read_with_errors_naming_field_and_value() {
        let c = Change::parse(br#"{"capacity": 5, "rate": "2/s", "shadow": true}"#).unwrap();
        assert_eq!(c.capacity, Some(5));
        assert_eq!(c.rate.unwrap().0, "2/s");
        assert_eq!(c.shadow, Some(true));
        assert!(Change::parse(b"{}").unwrap().capacity.is_none());
        for (body, says) in [
            (
                &br#"{"capacity": 0}"#[..],
                "capacity: expected a whole number of at least 1, got 0",
            ),
            (
                br#"{"capacity": "10"}"#,
                "capacity: expected a whole number of at least 1, got \"10\"",
            ),
            (br#"{"rate": "fast"}"#, "rate: `fast`:"),
            (
                br#"{"rate": 5}"#,
                "rate: expected a rate such as \"5/s\", got 5",
            ),
            (
                br#"{"shadow": "yes"}"#,
                "shadow: expected true or false, got \"yes\"",
            ),
            (br#"{"burst": 3}"#, "unknown field `burst`"),
            (br#"[1]"#, "expected a JSON object"),
            (br#"{"#, "malformed JSON"),
        ] {
            let e = Change::parse(body).unwrap_err();
            assert!(e.contains(says), "{e} / {says}");
        }
    }
}
