//! Plans: a policy's key decided by the quota of the plan its request names (a header set by
//! an authenticating proxy), each plan's keys in buckets of their own, and the RateLimit
//! headers showing the plan's quota.

mod common;

use common::{get_with, Gateway, Upstream};
use http::StatusCode;

fn config(upstream: &str) -> String {
    format!(
        r#"
[[policy]]
name = "api"
algorithm = "gcra"
capacity = 2
rate = "1/h"
key = "header:x-api-key"
plan = "header:x-plan"
plans = {{ pro = {{ capacity = 5, rate = "2/h" }}, team = {{ capacity = 3 }} }}

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "{upstream}"
"#
    )
}

/// How many requests of `key` under `plan` are admitted in a row, and the headers of the
/// first answer.
async fn admitted(
    gw: &Gateway,
    key: &str,
    plan: Option<&str>,
) -> (u32, Option<String>, Option<String>) {
    let mut headers = vec![("x-api-key", key)];
    if let Some(plan) = plan {
        headers.push(("x-plan", plan));
    }
    let mut n = 0;
    let mut first = None;
    for _ in 0..20 {
        let a = get_with(&gw.url("/api/x"), &headers).await;
        if first.is_none() {
            first = Some((
                a.header("ratelimit-policy").map(str::to_owned),
                a.header("ratelimit").map(str::to_owned),
            ));
        }
        if a.status != StatusCode::OK {
            assert_eq!(a.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(
                a.header("ratelimit-policy").map(str::to_owned),
                first.as_ref().unwrap().0,
                "a denial shows the same quota"
            );
            break;
        }
        n += 1;
    }
    let (policy, limit) = first.unwrap();
    (n, policy, limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_plan_gives_its_keys_its_own_quota_and_headers() {
    let up = Upstream::start().await;
    let gw = Gateway::start("", &config(&up.url())).await;

    let (n, policy, limit) = admitted(&gw, "alice", Some("pro")).await;
    assert_eq!(n, 5, "pro: capacity 5");
    assert_eq!(policy.as_deref(), Some("\"api\";q=5;w=9000"));
    assert_eq!(limit.as_deref(), Some("\"api\";r=4;t=1800"));

    let (n, policy, _) = admitted(&gw, "bob", Some("team")).await;
    assert_eq!(n, 3, "team: capacity 3, the policy's rate");
    assert_eq!(policy.as_deref(), Some("\"api\";q=3;w=10800"));

    // No plan, and a plan the policy does not list: the policy's own quota.
    let (n, policy, _) = admitted(&gw, "carol", None).await;
    assert_eq!(n, 2);
    assert_eq!(policy.as_deref(), Some("\"api\";q=2;w=7200"));
    let (n, policy, _) = admitted(&gw, "dave", Some("platinum")).await;
    assert_eq!(n, 2);
    assert_eq!(policy.as_deref(), Some("\"api\";q=2;w=7200"));

    // alice spent pro's bucket; under her old plan (none) she has the policy's bucket,
    // which she has not touched, and going back to pro finds pro's bucket as she left it.
    let (n, _, _) = admitted(&gw, "alice", None).await;
    assert_eq!(n, 2);
    let (n, _, _) = admitted(&gw, "alice", Some("pro")).await;
    assert_eq!(n, 0, "the pro bucket is still spent");

    let metrics = common::get(&gw.admin("/metrics")).await.unwrap();
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.lines().any(
            |l| l.starts_with("sluice_policy_unknown_plan_total{policy=\"api\"}")
                && l.ends_with(" 3")
        ),
        "the unknown plan counted once per request (2 admitted, 1 denied): {text}"
    );
}
