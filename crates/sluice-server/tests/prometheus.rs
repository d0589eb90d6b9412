//! `/metrics` of the real binary passes Prometheus's own linter, `promtool check metrics`:
//! every series has help text, and names, types and units follow Prometheus's conventions.
//! The gateway is driven first so that every kind of series it registers is present:
//! admissions, each kind of denial, queue waits, upstream responses and errors, a keyed
//! policy, the browser telemetry and a reload.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{closed_port, get, get_with, post, Gateway, Upstream};

const BATCH: &str = r#"{"v":1,"worker":"w1","seq":1,"sample":1,"window_ms":5000,"admitted":3,"queued":2,"rejected":{"queue_full":1,"timeout":0,"limit":1},"cancelled":0,"redispatched":0,"wait_ms":{"sum":640,"count":2,"max":400}}"#;

fn config(upstream: &str, dead: u16) -> String {
    format!(
        r#"
[[policy]]
name = "per-key"
algorithm = "token_bucket"
capacity = 2
rate = "1/min"
key = "header:X-Api-Key"
max_keys = 100

[[policy]]
name = "queued"
algorithm = "gcra"
capacity = 1
rate = "20/s"
key = "global"
queue = {{ depth = 1, max_wait = "1s" }}

[[route]]
path_prefix = "/api/"
policies = ["per-key"]
upstream = "{upstream}"

[[route]]
path_prefix = "/slow/"
policies = ["queued"]
upstream = "{upstream}"

[[route]]
path_prefix = "/dead/"
upstream = "http://127.0.0.1:{dead}"

[browser]
path_prefixes = ["/api/"]
capacity = 5
rate = "1/s"
telemetry = {{ endpoint = "/v1/telemetry", interval = "2s", sample = 1.0, limit = {{ capacity = 10, rate = "1/s" }} }}
"#
    )
}

/// `promtool check metrics` over `text`: its exit status and what it printed.
fn promtool(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool runs (Debian package `prometheus`; ./scripts/test installs it): this test \
             needs Prometheus's own linter",
        );
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())
        .expect("promtool reads its input");
    let out = child.wait_with_output().expect("promtool finishes");
    let mut said = String::from_utf8_lossy(&out.stdout).into_owned();
    said.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_pass_promtool_with_help_text_for_every_series() {
    let up = Upstream::start().await;
    let gw = Gateway::start(
        "max_body = \"1KiB\"\nheader_read_timeout = \"1s\"",
        &config(&up.url(), closed_port()),
    )
    .await;
    // A connection that never sends its head, closed at the header timeout.
    let mut silent = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .expect("connects");

    // Admitted, then denied by the per-key policy.
    for _ in 0..3 {
        get_with(&gw.url("/api/x"), &[("x-api-key", "k1")]).await;
    }
    // One admitted at once, one queued, the rest refused with a full queue.
    let slow = (0..4).map(|_| {
        let url = gw.url("/slow/x");
        tokio::spawn(async move { get(&url).await })
    });
    for request in slow.collect::<Vec<_>>() {
        request
            .await
            .expect("the request task ends")
            .expect("an answer");
    }
    // An upstream that refuses connections.
    let dead = get(&gw.url("/dead/x")).await.expect("an answer");
    assert_eq!(dead.status, 502);
    // A body over max_body.
    let big = post(&gw.url("/api/x"), &"x".repeat(2048)).await;
    assert_eq!(big.status, 413);
    // The silent connection is gone.
    let mut buf = [0u8; 16];
    let closed = tokio::time::timeout(
        Duration::from_secs(5),
        tokio::io::AsyncReadExt::read(&mut silent, &mut buf),
    )
    .await;
    assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
    // A telemetry batch from a Service Worker.
    let batch = post(&gw.url("/v1/telemetry"), BATCH).await;
    assert_eq!(batch.status, 204);
    // A reload of the unchanged file, counted by result.
    gw.signal("HUP");
    gw.wait_log("SIGHUP: reloaded", Duration::from_secs(10))
        .await;

    let text = String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec())
        .expect("/metrics is UTF-8");
    for family in [
        "sluice_admitted_total",
        "sluice_denied_total",
        "sluice_queue_wait_seconds",
        "sluice_policy_admitted_total",
        "sluice_policy_denied_total",
        "sluice_upstream_responses_total",
        "sluice_upstream_errors_total",
        "sluice_browser_admitted_total",
        "sluice_browser_queue_wait_seconds_total",
        "sluice_browser_queue_wait_max_seconds",
        "sluice_reloads_total",
        "sluice_connections_open",
        "sluice_connections_refused_total",
        "sluice_connection_timeouts_total",
        "sluice_request_body_refused_total",
        "sluice_upstream_pool_idle",
        "sluice_tunnels_open",
    ] {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no help text for {family} in\n{text}"
        );
    }
    assert!(
        text.contains("sluice_browser_queue_wait_seconds_total 0.64\n"),
        "{text}"
    );
    let (clean, said) = promtool(&text);
    assert!(
        clean && said.trim().is_empty(),
        "promtool check metrics:\n{said}\nover\n{text}"
    );
}
