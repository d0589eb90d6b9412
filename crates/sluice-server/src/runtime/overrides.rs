//! The keys of a policy with a quota of their own, as the admin API (`GET
//! /v1/policies/NAME/keys`) and the dashboard (`GET /v1/stats`) list them.

use serde_json::{json, Value};
use sluice_http::Policy;

/// Every key of `policy` with a quota of its own, by its stored form, as
/// `{"key", "capacity", "rate"}`, in the store's order (sorted by key).
///
/// # Errors
///
/// The store's, when it did not answer (Redis).
pub async fn list(policy: &Policy) -> Result<Vec<Value>, sluice::Error> {
    let all = policy.backend().overrides().await?;
    Ok(all
        .into_iter()
        .map(|(key, q)| json!({ "key": key, "capacity": q.capacity(), "rate": q.rate().to_string() }))
        .collect())
}
