//! Envoy's rate limit service on `server.rls_listen`, driven by a client no one here wrote:
//! Envoy's own messages from the Python `envoy-data-plane` package over grpcio
//! (`tests/py/rls_client.py`, run by `$SLUICE_PYTHON`), against the real binary.

mod common;

#[path = "../../sluice/tests/support/redis.rs"]
#[allow(dead_code)]
mod redis_support;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{bin, check_config_refuses, free_port, get, Gateway, TempDir, Upstream};
use serde_json::{json, Value};

/// The Python with envoy-data-plane and grpcio, or `None` (skipped) outside CI; under
/// `CI=true` its absence fails the test.
fn python() -> Option<String> {
    let python = std::env::var("SLUICE_PYTHON").ok();
    let usable = python.as_ref().is_some_and(|p| {
        Command::new(p)
            .args(["-c", "import envoy_data_plane, grpc, betterproto2"])
            .status()
            .is_ok_and(|s| s.success())
    });
    if usable {
        return python;
    }
    let what = "SLUICE_PYTHON (a Python with envoy-data-plane, betterproto2 and grpcio: scripts/test makes target/pyenv)";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{what} is missing or cannot import them; CI=true, so this fails");
    }
    eprintln!("skipped: {what} missing");
    None
}

/// Sends `plan` (see `tests/py/rls_client.py`) to the rate limit service on `port`; one
/// answer per line.
fn rls(python: &str, port: u16, plan: &Value) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/rls_client.py");
    let mut child = Command::new(python)
        .arg(script)
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(plan.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "rls_client.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A gateway with `rls_listen` on a free port; its port.
async fn start(rest: &str) -> (Gateway, u16) {
    let port = free_port();
    let gw = Gateway::start(&format!("rls_listen = \"127.0.0.1:{port}\""), rest).await;
    (gw, port)
}

async fn metrics(gw: &Gateway) -> String {
    String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

fn codes(answers: &[Value]) -> Vec<&str> {
    answers
        .iter()
        .map(|a| a["overall_code"].as_str().unwrap())
        .collect()
}

fn search(ip: &str) -> Value {
    json!([["remote_address", ip], ["path", "/api/search"]])
}

const SEARCH: &str = r#"
[[policy]]
name = "search"
capacity = 5
rate = "1/min"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["search"]
upstream = "UPSTREAM"

[[rls]]
domain = "edge"
match = [{ key = "remote_address" }, { key = "path", value = "/api/search" }]
policy = "search"
"#;

/// One descriptor, as Envoy's `remote_address` + `header_value_match` actions send it: five
/// admitted (1 per minute refills nothing meanwhile), then over the limit; every field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_descriptor_counts_exactly_with_every_field() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let (gw, port) = start(&SEARCH.replace("UPSTREAM", &up.url())).await;
    let answers = rls(
        &py,
        port,
        &json!([{"domain": "edge", "descriptors": [search("10.0.0.1")], "repeat": 8}]),
    );
    assert_eq!(
        codes(&answers),
        [
            "OK",
            "OK",
            "OK",
            "OK",
            "OK",
            "OVER_LIMIT",
            "OVER_LIMIT",
            "OVER_LIMIT"
        ]
    );
    for (i, a) in answers.iter().enumerate() {
        let s = &a["statuses"][0];
        let remaining = 4u64.saturating_sub(i as u64);
        assert_eq!(s["code"], a["overall_code"]);
        assert_eq!(
            s["limit"],
            json!({"name": "search", "requests_per_unit": 1, "unit": "MINUTE"})
        );
        assert_eq!(s["remaining"], remaining, "{a}");
        // Full again after one minute per token spent.
        let reset = s["reset_ms"].as_f64().unwrap();
        let spent = (5 - remaining) as f64;
        assert!(
            reset <= spent * 60_000.0 && reset > spent * 60_000.0 - 10_000.0,
            "{a}"
        );
        let h = &a["headers"];
        assert_eq!(h["ratelimit-policy"], "\"search\";q=5;w=300");
        let t = (reset / 1000.0).ceil() as u64;
        assert_eq!(
            h["ratelimit"],
            format!("\"search\";r={remaining};t={t}"),
            "{a}"
        );
        if i < 5 {
            assert!(h.get("retry-after").is_none(), "{a}");
        } else {
            let retry: u64 = h["retry-after"].as_str().unwrap().parse().unwrap();
            assert!((50..=60).contains(&retry), "{a}");
        }
    }
    // Another client address has a bucket of its own.
    let other = rls(
        &py,
        port,
        &json!([{"domain": "edge", "descriptors": [search("10.0.0.2")]}]),
    );
    assert_eq!(other[0]["statuses"][0]["remaining"], 4);
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "sluice_rls_requests_total{code=\"ok\"}"), 6.0);
    assert_eq!(
        metric(&m, "sluice_rls_requests_total{code=\"over_limit\"}"),
        3.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_policy_admitted_total{policy=\"search\",protocol=\"grpc\"}"
        ),
        6.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_policy_denied_total{policy=\"search\",reason=\"limit\",protocol=\"grpc\"}"
        ),
        3.0
    );
    assert!(gw.log_text().contains("rls_domain=edge"), "access log");
    assert_eq!(up.count(), 0, "no HTTP request was made");
}

/// Several descriptors in one request: each decided by its own policy, OVER_LIMIT when any
/// is, and then the others' tokens are given back (a denial spends nothing anywhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_descriptors_over_limit_when_any_is() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let rest = format!(
        r#"{}
[[policy]]
name = "everyone"
capacity = 10
rate = "1/min"

[[rls]]
domain = "edge"
match = [{{ key = "generic_key", value = "all" }}]
policy = "everyone"
"#,
        SEARCH.replace("capacity = 5", "capacity = 3")
    )
    .replace("UPSTREAM", &up.url());
    let (_gw, port) = start(&rest).await;
    let both = json!([search("10.0.0.1"), [["generic_key", "all"]]]);
    let answers = rls(
        &py,
        port,
        &json!([
            {"domain": "edge", "descriptors": both, "repeat": 5},
            {"domain": "edge", "descriptors": [[["generic_key", "all"]]]},
        ]),
    );
    assert_eq!(
        codes(&answers),
        ["OK", "OK", "OK", "OVER_LIMIT", "OVER_LIMIT", "OK"]
    );
    for a in &answers[3..5] {
        assert_eq!(a["statuses"][0]["code"], "OVER_LIMIT", "{a}");
        assert_eq!(a["statuses"][1]["code"], "OK", "{a}");
    }
    assert_eq!(answers[2]["statuses"][1]["remaining"], 7);
    // 10 - 3 admitted - this one: the two denied requests spent nothing of `everyone`.
    assert_eq!(answers[5]["statuses"][0]["remaining"], 6, "{}", answers[5]);
    let h = &answers[0]["headers"];
    assert_eq!(
        h["ratelimit-policy"],
        "\"search\";q=3;w=180, \"everyone\";q=10;w=600"
    );
    assert_eq!(h["ratelimit"], "\"search\";r=2;t=60, \"everyone\";r=9;t=60");
}

/// `hits_addend` is the cost (0 means 1), and a descriptor's own overrides the request's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_is_the_cost() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let rest = SEARCH
        .replace("capacity = 5", "capacity = 10")
        .replace("UPSTREAM", &up.url());
    let (_gw, port) = start(&rest).await;
    let answers = rls(
        &py,
        port,
        &json!([
            {"domain": "edge", "descriptors": [search("10.0.0.1")], "hits_addend": 3, "repeat": 4},
            {"domain": "edge", "descriptors": [search("10.0.0.1")], "hits_addend": 3, "descriptor_hits": [1]},
            {"domain": "edge", "descriptors": [search("10.0.0.1")], "hits_addend": 0},
        ]),
    );
    assert_eq!(
        codes(&answers),
        ["OK", "OK", "OK", "OVER_LIMIT", "OK", "OVER_LIMIT"]
    );
    let remaining: Vec<u64> = answers
        .iter()
        .map(|a| a["statuses"][0]["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(remaining, [7, 4, 1, 1, 0, 0]);
}

/// The descriptors Envoy sends once a stream is done (`apply_on_stream_done`), matched by an
/// `on_stream_done` rule, charge their `hits_addend` (what the request really cost, an LLM
/// answer's tokens) whatever the key has left, and are `OK`; the request path then sees the
/// debt. Here the request path reserves 1 per request on the same policy and key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_done_descriptor_charges_its_hits_and_the_next_request_sees_it() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let rest = format!(
        r#"
[[policy]]
name = "tokens"
algorithm = "gcra"
capacity = 1000
rate = "1000/day"
key = "header:x-api-key"

[[route]]
path_prefix = "/api/"
policies = ["tokens"]
upstream = "{}"

[[rls]]
domain = "llm"
match = [{{ key = "api_key" }}]
policy = "tokens"

[[rls]]
domain = "llm"
match = [{{ key = "usage", value = "done" }}, {{ key = "api_key" }}]
policy = "tokens"
on_stream_done = true
"#,
        up.url()
    );
    let (_gw, port) = start(&rest).await;
    let ask = json!([["api_key", "k1"]]);
    let done = json!([["usage", "done"], ["api_key", "k1"]]);
    let answers = rls(
        &py,
        port,
        &json!([
            {"domain": "llm", "descriptors": [ask]},
            {"domain": "llm", "descriptors": [done], "hits_addend": 700},
            {"domain": "llm", "descriptors": [ask]},
            {"domain": "llm", "descriptors": [done], "hits_addend": 900},
            {"domain": "llm", "descriptors": [ask]},
        ]),
    );
    println!("{answers:?}");
    assert_eq!(codes(&answers), ["OK", "OK", "OK", "OK", "OVER_LIMIT"]);
    let remaining: Vec<u64> = answers
        .iter()
        .map(|a| a["statuses"][0]["remaining"].as_u64().unwrap())
        .collect();
    // 1000 - 1, - 700, - 1, then 900 charged with 298 left: 602 owed beyond empty, so the
    // next request is over the limit.
    assert_eq!(remaining, [999, 299, 298, 0, 0]);
}

/// A domain or descriptor no rule matches is OK, has no limit, and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_descriptors_are_ok_and_counted() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let (gw, port) = start(&SEARCH.replace("UPSTREAM", &up.url())).await;
    let answers = rls(
        &py,
        port,
        &json!([
            {"domain": "other", "descriptors": [search("10.0.0.1")], "repeat": 7},
            {"domain": "edge", "descriptors": [[["remote_address", "10.0.0.1"], ["path", "/other"]]]},
            {"domain": "edge", "descriptors": [[["remote_address", "10.0.0.1"]]]},
        ]),
    );
    assert_eq!(codes(&answers), ["OK"; 9]);
    for a in &answers {
        assert_eq!(a["statuses"][0]["code"], "OK");
        assert_eq!(a["statuses"][0]["limit"], Value::Null, "{a}");
        assert_eq!(a["headers"], json!({}), "{a}");
    }
    let m = metrics(&gw).await;
    assert_eq!(metric(&m, "sluice_rls_descriptors_unmatched_total"), 9.0);
    // Nothing was spent: the matching descriptor still has the whole bucket.
    let a = rls(
        &py,
        port,
        &json!([{"domain": "edge", "descriptors": [search("10.0.0.1")]}]),
    );
    assert_eq!(a[0]["statuses"][0]["remaining"], 4);
}

/// An RLS decision and an HTTP request of the same client spend one bucket: the descriptor
/// `remote_address=127.0.0.1` under an `ip` policy is the HTTP client 127.0.0.1's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_and_http_share_one_bucket() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let (gw, port) = start(&SEARCH.replace("UPSTREAM", &up.url())).await;
    for _ in 0..2 {
        assert_eq!(get(&gw.url("/api/search")).await.unwrap().status, 200);
    }
    let answers = rls(
        &py,
        port,
        &json!([{"domain": "edge", "descriptors": [search("127.0.0.1")], "repeat": 4}]),
    );
    assert_eq!(codes(&answers), ["OK", "OK", "OK", "OVER_LIMIT"]);
    assert_eq!(answers[0]["statuses"][0]["remaining"], 2);
    let denied = get(&gw.url("/api/search")).await.unwrap();
    assert_eq!(denied.status, 429);
    let t: u64 = denied
        .header("ratelimit")
        .and_then(|v| v.strip_prefix("\"search\";r=0;t="))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("{denied:?}"));
    assert!((290..=300).contains(&t), "{denied:?}");
    assert_eq!(up.count(), 2);
}

/// A shadow policy answers OK with its real remaining where it would be over the limit,
/// counting the would-be denials; its log line says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_answers_ok_with_the_real_remaining() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let rest = SEARCH
        .replace("key = \"ip\"", "key = \"ip\"\nshadow = true")
        .replace("UPSTREAM", &up.url());
    let (gw, port) = start(&rest).await;
    let answers = rls(
        &py,
        port,
        &json!([{"domain": "edge", "descriptors": [search("10.0.0.1")], "repeat": 8}]),
    );
    assert_eq!(codes(&answers), ["OK"; 8]);
    let remaining: Vec<u64> = answers
        .iter()
        .map(|a| a["statuses"][0]["remaining"].as_u64().unwrap())
        .collect();
    assert_eq!(remaining, [4, 3, 2, 1, 0, 0, 0, 0]);
    assert!(answers[7]["headers"].get("retry-after").is_none());
    assert_eq!(
        answers[7]["headers"]["ratelimit"]
            .as_str()
            .unwrap()
            .split(';')
            .nth(1),
        Some("r=0")
    );
    let m = metrics(&gw).await;
    assert_eq!(
        metric(&m, "sluice_shadow_denied_total{policy=\"search\"}"),
        3.0
    );
    assert_eq!(
        metric(
            &m,
            "sluice_policy_admitted_total{policy=\"search\",protocol=\"grpc\"}"
        ),
        5.0
    );
    assert_eq!(metric(&m, "sluice_rls_requests_total{code=\"ok\"}"), 8.0);
    assert_eq!(
        gw.log_text().matches("decision=\"shadow-denied\"").count(),
        3,
        "{}",
        gw.log_text()
    );
}

/// `[[rls]]` and `rls_listen` errors name the file, line, field and value; `check-config`
/// lists them all.
#[test]
fn check_config_names_rls_errors() {
    let dir = TempDir::new();
    let path = dir.0.join("gw.toml");
    std::fs::write(
        &path,
        r#"[server]
rls_listen = "127.0.0.1:notaport"

[[policy]]
name = "search"
capacity = 5
rate = "1/s"

[[route]]
path_prefix = "/"
upstream = "http://127.0.0.1:9"

[[rls]]
domain = "edge"
match = [{ key = "remote_address" }]
policy = "serach"

[[rls]]
domain = "edge"
match = []
policy = "search"

[[rls]]
domain = "edge"
match = [{ value = "x" }]
policy = "search"
"#,
    )
    .unwrap();
    let stderr = check_config_refuses(&path);
    let file = path.display().to_string();
    for (line, field, says) in [
        (2, "server.rls_listen", "`127.0.0.1:notaport`"),
        (
            16,
            "rls[0].policy",
            "unknown policy `serach`; defined: search",
        ),
        (20, "rls[1].match", "`[]` is empty"),
        (25, "rls[2].match[0].key", "a match entry needs a key"),
    ] {
        let wanted = format!("{file}:{line}:");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&wanted) && l.contains(field) && l.contains(says)),
            "no `{wanted} ... {field}: ...{says}` in\n{stderr}"
        );
    }
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:8080\"\nrls_listen = \"127.0.0.1:8080\"\n[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "server.rls_listen: `127.0.0.1:8080` would take the same port as server.listen"
        ),
        "{stderr}"
    );
}

/// SIGHUP rebuilds the rules with the rest (build, then swap); `rls_listen` needs a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_rebuilds_the_rules() {
    let Some(py) = python() else { return };
    let up = Upstream::start().await;
    let rest = SEARCH.replace("UPSTREAM", &up.url());
    let (gw, port) = start(&rest).await;
    let plan = json!([
        {"domain": "edge", "descriptors": [search("10.0.0.1")]},
        {"domain": "edge2", "descriptors": [search("10.0.0.1")]},
    ]);
    let before = rls(&py, port, &plan);
    assert!(before[0]["statuses"][0]["limit"].is_object());
    assert_eq!(before[1]["statuses"][0]["limit"], Value::Null);
    gw.rewrite(
        &format!("rls_listen = \"127.0.0.1:{port}\""),
        &rest.replace("domain = \"edge\"", "domain = \"edge2\""),
    );
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(10))
        .await;
    assert!(
        gw.log_text().contains("rls (1 -> 1 rules)"),
        "{}",
        gw.log_text()
    );
    let after = rls(&py, port, &plan);
    assert_eq!(after[0]["statuses"][0]["limit"], Value::Null);
    // The policy did not change: its bucket is the same one, one token spent before.
    assert_eq!(after[1]["statuses"][0]["remaining"], 3, "{}", after[1]);
    gw.rewrite(
        &format!("rls_listen = \"127.0.0.1:{}\"", free_port()),
        &rest,
    );
    gw.signal("HUP");
    gw.wait_log("server.rls_listen needs a restart", Duration::from_secs(10))
        .await;
}

/// Two gateways on one Redis answer RLS for the same key: together they admit at most
/// capacity + rate·T over T, and one bucket's worth is really shared (neither admits alone
/// what the pair may).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_on_one_redis_share_the_limit() {
    let Some(py) = python() else { return };
    let Some(redis) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let (capacity, rate) = (20.0, 50.0);
    let rest = format!(
        r#"
[store]
backend = "redis"
url = "{}"
on_error = "deny"
timeout = "1s"

[[policy]]
name = "search"
capacity = 20
rate = "50/s"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["search"]
upstream = "{}"

[[rls]]
domain = "edge"
match = [{{ key = "remote_address" }}, {{ key = "path", value = "/api/search" }}]
policy = "search"
"#,
        redis.url(),
        up.url()
    );
    let (_a, port_a) = start(&rest).await;
    let (_b, port_b) = start(&rest).await;
    let plan = json!([{"domain": "edge", "descriptors": [search("10.9.9.9")], "for_seconds": 2.0, "summary": true}]);
    let (pa, pb) = (py.clone(), py.clone());
    let (plan_a, plan_b) = (plan.clone(), plan.clone());
    let a = std::thread::spawn(move || rls(&pa, port_a, &plan_a));
    let b = std::thread::spawn(move || rls(&pb, port_b, &plan_b));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    let (a, b) = (&a[0], &b[0]);
    let admitted = a["ok"].as_f64().unwrap() + b["ok"].as_f64().unwrap();
    let first = a["first_sent"]
        .as_f64()
        .unwrap()
        .min(b["first_sent"].as_f64().unwrap());
    let last = a["last_answered"]
        .as_f64()
        .unwrap()
        .max(b["last_answered"].as_f64().unwrap());
    let bound = capacity + rate * (last - first);
    assert!(
        admitted <= bound + 1.0,
        "admitted {admitted} > capacity + rate·T = {bound:.1}: {a} {b}"
    );
    // Both were asking far faster than the rate, and both were admitted some of the time.
    let asked = admitted + a["over_limit"].as_f64().unwrap() + b["over_limit"].as_f64().unwrap();
    assert!(
        asked > 2.0 * bound,
        "the load was too light to test anything: {a} {b}"
    );
    assert!(a["ok"].as_f64().unwrap() > 0.0 && b["ok"].as_f64().unwrap() > 0.0);
    assert!(
        admitted >= capacity + rate * 1.5,
        "the pair admitted {admitted}, far below the limit: {a} {b}"
    );
}

/// A store that does not answer follows `store.on_error`: `deny` makes the descriptor
/// OVER_LIMIT (counted as `unavailable`), `allow` answers OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_failure_follows_on_error() {
    let Some(py) = python() else { return };
    let Some(mut redis) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let config = |on_error: &str| {
        format!(
            "[store]\nbackend = \"redis\"\nurl = \"{}\"\non_error = \"{on_error}\"\ntimeout = \"50ms\"\n{}",
            redis.url(),
            SEARCH.replace("UPSTREAM", &up.url())
        )
    };
    let (deny, deny_port) = start(&config("deny")).await;
    let (_allow, allow_port) = start(&config("allow")).await;
    let plan = json!([{"domain": "edge", "descriptors": [search("10.0.0.1")]}]);
    assert_eq!(codes(&rls(&py, deny_port, &plan)), ["OK"]);
    redis.kill();
    let denied = rls(&py, deny_port, &plan);
    assert_eq!(codes(&denied), ["OVER_LIMIT"], "{denied:?}");
    assert_eq!(denied[0]["statuses"][0]["remaining"], 0);
    assert!(denied[0]["headers"].get("retry-after").is_some());
    assert_eq!(codes(&rls(&py, allow_port, &plan)), ["OK"]);
    let m = metrics(&deny).await;
    assert_eq!(
        metric(
            &m,
            "sluice_policy_denied_total{policy=\"search\",reason=\"unavailable\",protocol=\"grpc\"}"
        ),
        1.0
    );
}
