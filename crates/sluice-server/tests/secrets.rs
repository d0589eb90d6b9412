//! Keys taken from headers, cookies and query parameters are stored as a keyed hash under
//! `store.key_salt` (read from a file or the environment), in the file store and in Redis; IP
//! keys stay readable; the dashboard keeps masking.

mod common;
#[allow(dead_code)]
#[path = "../../sluice/tests/support/redis.rs"]
mod redis_support;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{bin, get, get_with, Gateway, TempDir, Upstream};
use http::StatusCode;
use sluice_http::KeyHasher;

const SECRET: &str = "sk-live-0123456789abcdef";

fn config(upstream: &str, store: &str) -> String {
    format!(
        r#"
{store}

[[policy]]
name = "bykey"
capacity = 5
rate = "1/min"
key = "header:x-api-key"

[[policy]]
name = "byip"
capacity = 5
rate = "1/min"
key = "ip"

[[route]]
path_prefix = "/api/"
policies = ["bykey", "byip"]
upstream = "{upstream}"
"#
    )
}

async fn spend(gw: &Gateway) {
    for _ in 0..2 {
        let r = get_with(&gw.url("/api/x"), &[("x-api-key", SECRET)]).await;
        assert_eq!(r.status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_store_holds_a_keyed_hash_of_secret_keys() {
    let up = Upstream::start().await;
    let dir = TempDir::new();
    let salt = dir.0.join("salt");
    std::fs::write(&salt, "pepper\n").unwrap();
    let state = dir.0.join("state");
    let store = format!(
        "[store]\nbackend = \"file\"\npath = \"{}\"\nkey_salt = \"file:{}\"",
        state.display(),
        salt.display()
    );
    let mut gw = Gateway::start("", &config(&up.url(), &store)).await;
    spend(&gw).await;
    let stats =
        String::from_utf8_lossy(&get(&gw.admin("/v1/stats")).await.unwrap().body).into_owned();
    assert!(
        !stats.contains("0123456789"),
        "the dashboard masks: {stats}"
    );
    gw.signal("TERM");
    assert!(gw.wait_exit(Duration::from_secs(10)).await.success());
    let by_key = std::fs::read_to_string(dir.0.join("state.bykey")).unwrap();
    assert!(!by_key.contains("0123456789"), "{by_key}");
    let hashed = KeyHasher::new(b"pepper").hash(SECRET);
    assert!(by_key.contains(&hashed), "salted from the file: {by_key}");
    let by_ip = std::fs::read_to_string(dir.0.join("state.byip")).unwrap();
    assert!(by_ip.contains("\"127.0.0.1\""), "IP keys readable: {by_ip}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_key_names_hold_a_keyed_hash_of_secret_keys() {
    let Some(server) = redis_support::RedisServer::start() else {
        return;
    };
    let up = Upstream::start().await;
    let dir = TempDir::new();
    let salt = dir.0.join("salt");
    std::fs::write(&salt, "pepper").unwrap();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\non_error = \"deny\"\nkey_salt = \"file:{}\"",
        server.url(),
        salt.display()
    );
    let gw = Gateway::start("", &config(&up.url(), &store)).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while get_with(&gw.url("/api/x"), &[("x-api-key", SECRET)])
        .await
        .status
        != StatusCode::OK
    {
        assert!(Instant::now() < deadline, "{}", gw.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "--scan"])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&out.stdout).into_owned();
    let hashed = KeyHasher::new(b"pepper").hash(SECRET);
    assert!(
        keys.contains(&format!("sluice:bykey:{{{hashed}}}")),
        "{keys}"
    );
    assert!(!keys.contains("0123456789"), "{keys}");
    assert!(keys.contains("sluice:byip:{127.0.0.1}"), "{keys}");
}

#[test]
fn a_salt_written_in_the_config_or_missing_is_an_error_naming_the_field() {
    for (salt, expected) in [
        ("pepper", "expected env:NAME or file:/path"),
        (
            "env:SLUICE_TEST_NO_SUCH_VARIABLE",
            "SLUICE_TEST_NO_SUCH_VARIABLE` is not set",
        ),
        ("file:/nonexistent/salt", "cannot read `/nonexistent/salt`"),
    ] {
        let dir = TempDir::new();
        let path = dir.0.join("gw.toml");
        std::fs::write(
            &path,
            format!("[store]\nbackend = \"memory\"\nkey_salt = \"{salt}\"\n"),
        )
        .unwrap();
        let out = Command::new(bin())
            .arg("check-config")
            .arg(&path)
            .env_remove("SLUICE_TEST_NO_SUCH_VARIABLE")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{text}");
        assert!(text.contains("store.key_salt"), "{text}");
        assert!(text.contains(expected), "{text}");
    }
}
