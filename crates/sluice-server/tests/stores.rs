//! `[store]` as the gateway reads it: a one-element `url` list is a Cluster, `max_loss` sets the
//! file store's D, and a state file serves one process only.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{config_text, free_port, Gateway, TempDir};
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
