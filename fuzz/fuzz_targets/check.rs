//! The decision API's request body: `POST /v1/check` through the admin router
//! (`sluice_server::serve::admin::router`), over policies of every algorithm on the memory store.
//!
//! Properties: no panic; the status is one the API documents; a body that is not a JSON
//! object `{"policy": string, "key"?: string, "cost"?: u64}` (or serde's array form of it) is
//! 400; 404 exactly for an
//! unknown policy and 422 exactly for a cost above the capacity; a decision's answer is JSON
//! whose `allowed` matches the status, whose `limit` is the policy's capacity and whose
//! `remaining` is at most that.
#![no_main]

use std::sync::OnceLock;

use axum::body::Body;
use axum::Router;
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use metrics_exporter_prometheus::PrometheusBuilder;
use serde_json::Value;
use sluice_server::config;
use sluice_server::serve::admin::{router, MAX_CHECK_BODY};
use sluice_server::runtime::build::build;
use sluice_server::runtime::state::Shared;
use tower_service::Service;

/// One policy per algorithm, and one whose capacity is far above any small cost.
const CONFIG: &str = r#"
[[policy]]
name = "tb"
algorithm = "token_bucket"
capacity = 10
rate = "5/s"
max_keys = 1000

[[policy]]
name = "gcra"
algorithm = "gcra"
capacity = 3
rate = "1/min"
key = "ip"
max_keys = 1000

[[policy]]
name = "leaky"
algorithm = "leaky_bucket"
capacity = 5
rate = "100/s"
max_keys = 1000

[[policy]]
name = "log"
algorithm = "sliding_log"
capacity = 4
rate = "2/s"
max_keys = 1000

[[policy]]
name = "window"
algorithm = "sliding_window"
capacity = 20
rate = "10/s"
max_keys = 1000

[[policy]]
name = "fixed"
algorithm = "fixed_window"
capacity = 2
rate = "1/h"
max_keys = 1000

[[policy]]
name = "huge"
capacity = 1000000000000
rate = "1000000/s"
max_keys = 1000

[[route]]
path_prefix = "/"
policies = ["tb"]
upstream = "http://127.0.0.1:9"
"#;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    router: Router,
    capacities: Vec<(String, u64)>,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        let config = config::parse(CONFIG, "check.toml").expect("the fixture config is valid");
        let capacities = config
            .policies
            .iter()
            .map(|p| (p.name.clone(), p.quota.capacity()))
            .collect();
        let built = {
            let _enter = runtime.enter();
            build(config, None, None).expect("the fixture config builds")
        };
        let shared: &'static Shared = Box::leak(Box::new(Shared::new(
            built,
            PrometheusBuilder::new().build_recorder().handle(),
            None,
            None,
        )));
        Fixture {
            runtime,
            router: router(shared),
            capacities,
        }
    })
}

/// What the body asks for, read independently of the server: `None` when it is not a JSON
/// object of the documented shape.
fn expected(body: &[u8]) -> Option<(String, u64)> {
    let map = match serde_json::from_slice::<Value>(body).ok()? {
        Value::Object(map) => map,
        // serde's derived `Deserialize` also reads a struct from a sequence of its fields in
        // order (`["api", "k", 1]`), the fields with defaults optional.
        Value::Array(items) if (1..=3).contains(&items.len()) => items
            .into_iter()
            .zip(["policy", "key", "cost"])
            .map(|(v, k)| (k.to_owned(), v))
            .collect(),
        _ => return None,
    };
    if map
        .keys()
        .any(|k| !matches!(k.as_str(), "policy" | "key" | "cost"))
    {
        return None;
    }
    let policy = map.get("policy")?.as_str()?.to_owned();
    if let Some(key) = map.get("key") {
        key.as_str()?;
    }
    let cost = match map.get("cost") {
        Some(c) => c.as_u64()?,
        None => 1,
    };
    Some((policy, cost))
}

/// Whether the body is a JSON object with some key twice (however it is escaped).
fn has_a_repeated_key(body: &[u8]) -> bool {
    struct Keys(Vec<String>);
    impl<'de> serde::Deserialize<'de> for Keys {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Keys, D::Error> {
            struct Visitor;
            impl<'de> serde::de::Visitor<'de> for Visitor {
                type Value = Keys;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Keys, A::Error> {
                    let mut keys = Vec::new();
                    while let Some((k, serde::de::IgnoredAny)) = map.next_entry::<String, _>()? {
                        keys.push(k);
                    }
                    Ok(Keys(keys))
                }
            }
            d.deserialize_map(Visitor)
        }
    }
    let Ok(Keys(mut keys)) = serde_json::from_slice::<Keys>(body) else {
        return false;
    };
    let n = keys.len();
    keys.sort();
    keys.dedup();
    keys.len() < n
}

fuzz_target!(|body: &[u8]| {
    if body.len() > MAX_CHECK_BODY {
        return;
    }
    let f = fixture();
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/check")
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a valid request");
    let (status, answer) = f.runtime.block_on(async {
        let response = f.router.clone().call(request).await.expect("infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a body in memory")
            .to_bytes();
        (status, bytes)
    });
    let Some((policy, cost)) = expected(body) else {
        assert_eq!(
            status,
            StatusCode::BAD_REQUEST,
            "{:?}",
            String::from_utf8_lossy(body)
        );
        assert!(String::from_utf8_lossy(&answer).contains("malformed JSON"));
        return;
    };
    let capacity = f
        .capacities
        .iter()
        .find(|(name, _)| *name == policy)
        .map(|(_, c)| *c);
    match status {
        // A field given twice is refused by the server (at the first bad or repeated value)
        // and kept once, the last, by `Value`.
        StatusCode::BAD_REQUEST => {
            assert!(has_a_repeated_key(body), "{answer:?}");
        }
        StatusCode::NOT_FOUND => assert_eq!(capacity, None, "{policy:?} exists"),
        StatusCode::UNPROCESSABLE_ENTITY => {
            assert!(
                capacity.is_some_and(|c| cost > c),
                "cost {cost} of {policy}"
            )
        }
        StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
            let capacity = capacity.expect("a decision comes from a known policy");
            assert!(cost <= capacity);
            let v: Value = serde_json::from_slice(&answer).expect("the answer is JSON");
            assert_eq!(
                v["allowed"].as_bool(),
                Some(status == StatusCode::OK),
                "{v}"
            );
            assert_eq!(v["limit"].as_u64(), Some(capacity), "{v}");
            let remaining = v["remaining"].as_u64().expect("remaining is a count");
            assert!(remaining <= capacity, "{v}");
            assert!(
                v["retry_after_ms"].is_u64() && v["reset_after_ms"].is_u64(),
                "{v}"
            );
        }
        other => panic!("{other} for {:?}", String::from_utf8_lossy(body)),
    }
});
