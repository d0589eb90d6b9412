//! `[store]` as the gateway reads it: a one-element `url` list is a Cluster, `max_loss` sets the
//! file store's D, a state file serves one process only, and a gateway on a file store that
//! was stopped for longer than D refuses none of its queued requests when it runs again.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{config_text, free_port, Gateway, TempDir, Upstream};
use sluice_http::Backend;
use sluice_server::config;
use sluice_server::runtime::build::build;

const POLICY: &str = r#"
[[policy]]
name = "api"
capacity = 10
rate = "5/s"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["api"]
upstream = "http://127.0.0.1:9"
"#;

#[tokio::test]
async fn a_url_list_is_a_cluster_even_of_one_and_a_string_is_one_server() {
    // Nothing listens on port 1: the stores connect in the background, and are not asked.
    for (url, cluster) in [
        (r#""redis://127.0.0.1:1""#, false),
        (r#"["redis://127.0.0.1:1"]"#, true),
        (r#"["redis://127.0.0.1:1", "redis://127.0.0.1:2"]"#, true),
    ] {
        let text = format!("[store]\nbackend = \"redis\"\nurl = {url}\n{POLICY}");
        let config = config::parse(&text, "t.toml").unwrap();
        assert_eq!(config.store.cluster, cluster, "url = {url}");
        let runtime = build(config, None, None).unwrap();
        let Backend::Redis(store) = runtime.policies["api"].backend() else {
            panic!("url = {url}: not a Redis store");
        };
        assert_eq!(store.config().is_cluster(), cluster, "url = {url}");
    }
}

#[test]
fn max_loss_is_read_checked_and_given_to_the_file_store() {
    let dir = TempDir::new();
    let path = dir.0.join("state");
    let with = |extra: &str| {
        format!(
            "[store]\nbackend = \"file\"\npath = \"{}\"\n{extra}\n{POLICY}",
            path.display()
        )
    };
    let default = config::parse(&with(""), "t.toml").unwrap();
    assert_eq!(default.store.max_loss, Duration::from_millis(100));
    let config = config::parse(&with("max_loss = \"300ms\""), "t.toml").unwrap();
    assert_eq!(config.store.max_loss, Duration::from_millis(300));
    let runtime = build(config, None, None).unwrap();
    let text = std::fs::read_to_string(dir.0.join("state.api")).unwrap();
    assert!(text.contains("\"write_interval_ms\":300"), "{text}");
    drop(runtime);
    for bad in ["\"5ms\"", "\"2m\"", "\"soon\"", "100"] {
        let errors = config::parse(&with(&format!("max_loss = {bad}")), "t.toml").unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let shown = shown.join("\n");
        assert!(
            shown.contains("t.toml:4:") && shown.contains("store.max_loss"),
            "max_loss = {bad}: {shown}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_the_same_state_file_exits_1_naming_the_file_and_the_holder() {
    let state = TempDir::new();
    let base = state.0.join("state");
    let store = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\n{POLICY}",
        base.display()
    );
    let first = Gateway::start("", &store).await;
    let file = state.0.join("state.api");

    let dir = TempDir::new();
    let config = dir.0.join("sluice.toml");
    std::fs::write(&config, config_text(free_port(), free_port(), "", &store)).unwrap();
    let errors = dir.0.join("stderr");
    let mut second = Command::new(common::bin())
        .args(["serve", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&errors).unwrap())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = second.kill();
            let _ = second.wait();
            panic!(
                "a second gateway on the same state file is still running after 10 s: {}",
                std::fs::read_to_string(&errors).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let stderr = std::fs::read_to_string(&errors).unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(file.to_str().unwrap()), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", first.child.id())),
        "{stderr}"
    );
    // The first one still serves.
    let admin = common::get(&first.admin("/healthz")).await.unwrap();
    assert_eq!(admin.status, http::StatusCode::OK);
    // And its file is its owner's only.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
}

/// A gateway on a file store stopped (SIGSTOP: a VM paused or migrated) for longer than
/// `max_loss` while requests wait in a policy's queue, then continued (SIGCONT). Its lease
/// has run out on the monotonic clock, but only because the process was not running: the
/// disk is fine. The requests whose turn comes first when it runs again are decided before the
/// store's writer has had its turn, and must wait for the writer's renewal, not be answered
/// 503. Three rounds of 16. `max_loss` is 1 s rather than the default 100 ms so that a write
/// slowed by other work on a shared machine's disk (a real stall, refused by design) does not
/// pass for the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_stopped_longer_than_max_loss_refuses_none_of_its_queued_requests() {
    let up = Upstream::start().await;
    let state = TempDir::new();
    let rest = format!(
        r#"
[store]
backend = "file"
path = "{}"
max_loss = "1s"

[[policy]]
name = "queued"
algorithm = "gcra"
capacity = 1
rate = "16/s"
key = "global"
queue = {{ depth = 64, max_wait = "10s" }}

[[route]]
path_prefix = "/q/"
policies = ["queued"]
upstream = "{}"
"#,
        state.0.join("state").display(),
        up.url()
    );
    let gw = Gateway::start("", &rest).await;
    let mut refused = Vec::new();
    for round in 0..3 {
        // The bucket full again, then spent: the 16 wait for a token each, 1/16 s apart, all
        // due when the stop ends.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let spend = common::get(&gw.url("/q/spend")).await.unwrap();
        assert_eq!(spend.status, http::StatusCode::OK);
        let waiting: Vec<_> = (0..16)
            .map(|i| {
                let url = gw.url(&format!("/q/{round}/{i}"));
                tokio::spawn(async move { common::get(&url).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        gw.signal("STOP");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        gw.signal("CONT");
        for (i, answer) in waiting.into_iter().enumerate() {
            let answer = answer.await.unwrap().unwrap();
            if answer.status != http::StatusCode::OK {
                refused.push((round, i, answer.status));
            }
        }
    }
    let log = gw.log_text();
    let store_lines: Vec<&str> = log.lines().filter(|l| l.contains("limit store")).collect();
    assert!(
        refused.is_empty(),
        "{} of 48 queued requests refused after a stop of 2.5 s (max_loss 1s): {refused:?}; the store said: {store_lines:#?}",
        refused.len()
    );
}
