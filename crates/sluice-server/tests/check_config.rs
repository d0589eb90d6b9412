//! `sluice check-config`: exit 0, or exit 2 listing every error with file, line and field.

mod common;

use std::process::Command;

use common::{bin, TempDir};

fn check(text: &str) -> (i32, String, String, String) {
    let dir = TempDir::new();
    let path = dir.0.join("gw.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        path.display().to_string(),
    )
}

#[test]
fn a_valid_config_exits_0() {
    let (code, stdout, stderr, _) = check(
        r#"
[server]
listen = "127.0.0.1:18080"
admin_listen = "127.0.0.1:18081"
trusted_proxies = ["10.0.0.0/8", "::1"]

[store]
backend = "memory"

[[policy]]
name = "api"
algorithm = "gcra"
capacity = 10
rate = "5/s"
key = "cookie:session"
max_keys = 1000
queue = { depth = 100, max_wait = "10s" }
concurrency = 8

[[route]]
path_prefix = "/api/"
methods = ["GET", "POST"]
policies = ["api"]
upstream = "http://127.0.0.1:9000"
queue_max_body = "64KiB"
"#,
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("ok (1 policies, 1 routes)"), "{stdout}");
}

#[test]
fn an_invalid_config_lists_every_error_and_exits_2() {
    let (code, _, stderr, path) = check(
        r#"[server]
listen = "8080"
trusted_proxies = ["10.0.0.0/33"]
typo = 1

[store]
backend = "etcd"
timeout = "-5ms"

[[policy]]
name = "api"
algorithm = "magic"
capacity = 18446744073709551615
rate = "5/s"

[[policy]]
name = "api"
capacity = 1
rate = "1/fortnight"
key = "header:"
queue = { depth = 1, max_wait = "10s", colour = "red" }

[[route]]
path_prefix = "/api/"
methods = ["get", "FETCH?"]
policies = ["missing"]
upstream = "ftp://example"
queue_max_body = "64 KiB please"
"#,
    );
    assert_eq!(code, 2, "{stderr}");
    let expected = [
        (2, "server.listen"),
        (3, "server.trusted_proxies"),
        (4, "server.typo"),
        (7, "store.backend"),
        (8, "store.timeout"),
        (12, "policy[0].algorithm"),
        (13, "policy[0].capacity"),
        (17, "policy[1].name"),
        (19, "policy[1].rate"),
        (20, "policy[1].key"),
        (21, "policy[1].queue.colour"),
        (25, "route[0].methods"),
        (26, "route[0].policies"),
        (27, "route[0].upstream"),
        (28, "route[0].queue_max_body"),
    ];
    let lines: Vec<&str> = stderr.lines().collect();
    for (line, field) in expected {
        let prefix = format!("{path}:{line}:");
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&prefix) && l.contains(&format!(" {field}: "))),
            "missing {prefix} {field} in:\n{stderr}"
        );
    }
    // `get` is flagged as case-sensitive; `FETCH?` as not a method: both on line 25.
    assert_eq!(
        lines
            .iter()
            .filter(|l| l.contains("route[0].methods"))
            .count(),
        2,
        "{stderr}"
    );
}

#[test]
fn unparsable_toml_and_missing_files_exit_2() {
    let (code, _, stderr, path) = check("[server\nlisten = ");
    assert_eq!(code, 2);
    assert!(stderr.starts_with(&format!("{path}:1:")), "{stderr}");
    let out = Command::new(bin())
        .args(["check-config", "/nonexistent/sluice.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

#[test]
fn serve_refuses_an_invalid_config_with_exit_2() {
    let dir = TempDir::new();
    let path = dir.0.join("bad.toml");
    std::fs::write(&path, "[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\npolicies = [\"ghost\"]\n").unwrap();
    let out = Command::new(bin())
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("route[0].policies: unknown policy `ghost`")
    );
}

#[test]
fn the_default_config_is_printed_and_valid() {
    let out = Command::new(bin()).arg("default-config").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("builtin:demo"));
    let (code, _, stderr, _) = check(&text);
    assert_eq!(code, 0, "{stderr}");
}

/// The workspace's `docs/examples/`.
fn examples() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples")
}

#[test]
fn every_example_config_passes_check_config() {
    let mut checked = Vec::new();
    for entry in std::fs::read_dir(examples()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = Command::new(bin())
                .arg("check-config")
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}{}",
                path.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            checked.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    assert!(
        checked.iter().any(|n| n == "gateway.toml"),
        "the production example is checked: {checked:?}"
    );
}

#[test]
fn the_systemd_unit_passes_systemd_analyze_and_reloads_with_sighup() {
    let unit = std::fs::read_to_string(examples().join("sluice.service")).unwrap();
    assert!(
        unit.lines()
            .any(|l| l == "ExecReload=/bin/kill -HUP $MAINPID"),
        "reload sends SIGHUP:\n{unit}"
    );
    // systemd checks that each command exists: point them at the binary under test.
    let dir = TempDir::new();
    let path = dir.0.join("sluice.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/sluice", bin())).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze runs (Debian package `systemd`; ./scripts/test installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "systemd-analyze verify: {said}"
    );
}

/// The limits of the main listener: each invalid value is named with its line and field.
#[test]
fn the_edge_settings_are_validated() {
    let (code, _, stderr, path) = check(
        r#"[server]
max_body = "lots"
client_body_timeout = "0s"
request_id = "no"
max_connections = 0
upstream_connect_timeout = "soon"
upstream_idle_timeout = "0ms"
send_timeout = 30
keep_alive_timeout = "0s"

[[route]]
path_prefix = "/"
upstream = "http://127.0.0.1:9000"
max_body = -1
"#,
    );
    assert_eq!(code, 2, "{stderr}");
    for (line, field) in [
        (2, "server.max_body"),
        (3, "server.client_body_timeout"),
        (4, "server.request_id"),
        (5, "server.max_connections"),
        (6, "server.upstream_connect_timeout"),
        (7, "server.upstream_idle_timeout"),
        (8, "server.send_timeout"),
        (9, "server.keep_alive_timeout"),
        (14, "route[0].max_body"),
    ] {
        let prefix = format!("{path}:{line}:");
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&prefix) && l.contains(&format!(" {field}: "))),
            "missing {prefix} {field} in:\n{stderr}"
        );
    }
    let (code, _, stderr, _) = check(
        r#"[server]
max_body = "10MiB"
client_body_timeout = "30s"
request_id = false
max_connections = 50000

[[route]]
path_prefix = "/"
upstream = "http://127.0.0.1:9000"
max_body = 0
"#,
    );
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn an_admin_token_is_read_from_the_environment_or_a_file_only() {
    for (value, message) in [
        ("s3cret", "expected env:NAME or file:/path"),
        ("env:SLUICE_TEST_UNSET_TOKEN_VARIABLE", "is not set"),
        ("file:/nonexistent/token", "cannot read"),
    ] {
        let (code, _, stderr, path) = check(&format!(
            "[server]\nadmin_token = \"{value}\"\n\n[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9000\"\n"
        ));
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.starts_with(&format!("{path}:2:"))
                && stderr.contains("server.admin_token")
                && stderr.contains(message),
            "{value}: {stderr}"
        );
        assert!(!stderr.contains("s3cret") || value == "s3cret");
    }
}

#[test]
fn a_redis_sentinel_url_is_read_and_a_malformed_one_named_with_its_line() {
    let valid = |url: &str| {
        format!(
            "[store]\nbackend = \"redis\"\nurl = {url}\non_error = \"deny\"\n\n[[policy]]\nname = \"api\"\ncapacity = 10\nrate = \"5/s\"\n\n[[route]]\npath_prefix = \"/\"\npolicies = [\"api\"]\nupstream = \"http://127.0.0.1:9000\"\n"
        )
    };
    for url in [
        r#""redis+sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3/mymaster""#,
        r#""redis+sentinel://:s%40cret@[::1]:26379/mymaster/2?wait=none&sentinel_password=pw""#,
    ] {
        let (code, stdout, stderr, _) = check(&valid(url));
        assert_eq!(code, 0, "{url}: {stderr}");
        assert!(stdout.contains("ok (1 policies"), "{stdout}");
    }
    for (url, says) in [
        (
            r#""redis+sentinel://10.0.0.1:26379""#,
            "no master name after the Sentinels",
        ),
        (
            r#""redis+sentinel://10.0.0.1:26379,/mymaster""#,
            "an empty Sentinel in the list",
        ),
        (
            r#""redis+sentinel://10.0.0.1:7o00/mymaster""#,
            "`7o00` is not a port",
        ),
        (
            r#""redis+sentinel://10.0.0.1/mymaster/zero""#,
            "the database `zero`",
        ),
        (
            r#""redis+sentinel://10.0.0.1/mymaster?wait=all""#,
            "wait=`all`",
        ),
        (r#"["redis+sentinel://10.0.0.1/mymaster"]"#, "not in a list"),
    ] {
        let (code, _, stderr, path) = check(&valid(url));
        assert_eq!(code, 2, "{url}: {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("{path}:3:")))
            .unwrap_or_else(|| panic!("{url}: no error on line 3 in:\n{stderr}"));
        assert!(
            line.contains(" store.url: cannot read `redis+sentinel://")
                && line.contains("as a Redis Sentinel URL")
                && line.contains(says),
            "{url}: {line}"
        );
    }
}

#[test]
fn a_jobs_table_is_accepted_or_refused_naming_file_line_field_and_value() {
    let route = "[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9000\"\n";
    let (code, stdout, stderr, _) = check(&format!(
        "{route}\n[jobs]\nredis = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001\"]\nqueues = [\"mail\", \"embed\"]\nprefix = \"acme:jobs\"\ninterval = \"1s\"\n"
    ));
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(": ok ("), "{stdout}");
    let (code, _, stderr, _) = check(&format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n{route}\n[jobs]\nqueues = [\"mail\"]\n"
    ));
    assert_eq!(code, 0, "the store's Redis: {stderr}");

    let (code, _, stderr, path) = check(&format!(
        "{route}\n[jobs]\nredis = \"127.0.0.1:6379\"\nqueues = [\"mail\", \"mail\", \"a}}b\"]\ninterval = \"2h\"\n"
    ));
    assert_eq!(code, 2, "{stderr}");
    for (line, field, value) in [
        (6, "jobs.redis", "`127.0.0.1:6379`"),
        (7, "jobs.queues[1]", "`mail` is listed twice"),
        (7, "jobs.queues[2]", "`a}b`"),
        (8, "jobs.interval", "7200s"),
    ] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("{path}:{line}:"))
                    && l.contains(&format!(" {field}: "))
                    && l.contains(value)),
            "no {line} {field} {value} in\n{stderr}"
        );
    }
    assert_eq!(stderr.lines().count(), 4, "{stderr}");
    let (code, _, stderr, path) = check(&format!("{route}\n[jobs]\nqueues = [\"mail\"]\n"));
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with(&format!("{path}:5:")) && stderr.contains("jobs.redis: no Redis"),
        "{stderr}"
    );
}
