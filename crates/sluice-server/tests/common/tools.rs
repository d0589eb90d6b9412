//! The outside clients some tests drive (curl, h2load), and whether they are installed:
//! without one a test fails under `CI=true`, and says `skipped: <tool> missing` otherwise.

use std::process::Command;

/// Whether `tool` can run; under `CI=true` a missing tool fails the test.
pub fn have(tool: &str) -> bool {
    let found = Command::new(tool).arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} missing: install it (scripts/test does)"
        );
        eprintln!("skipped: {tool} missing");
    }
    found
}

/// Runs curl with `args`; its stdout.
pub fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `n` requests to `url` on one curl (one connection, reused), each written as
/// `VERSION STATUS`.
pub fn curl_many(extra: &[&str], url: &str, n: usize) -> Vec<String> {
    let mut args: Vec<&str> = extra.to_vec();
    args.extend(["-w", "%{http_version} %{http_code}\\n"]);
    for _ in 0..n {
        args.extend(["-o", "/dev/null", url]);
    }
    curl(&args).lines().map(str::to_owned).collect()
}

/// `n` requests to `url`, one curl each (curl 7.88 fails the second request it sends on a
/// reused prior-knowledge HTTP/2 connection), each written as `VERSION STATUS`.
pub fn curl_each(extra: &[&str], url: &str, n: usize) -> Vec<String> {
    (0..n).flat_map(|_| curl_many(extra, url, 1)).collect()
}

/// How many of `lines` are exactly `line`.
pub fn count(lines: &[String], line: &str) -> usize {
    lines.iter().filter(|l| l.as_str() == line).count()
}

/// h2load's `status codes: N 2xx, N 3xx, N 4xx, N 5xx` line, as (2xx, 4xx, 5xx).
pub fn h2load(args: &[&str]) -> (u64, u64, u64, String) {
    let out = Command::new("h2load").args(args).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("status codes:"))
        .unwrap_or_else(|| panic!("no status codes line in h2load's output:\n{text}"))
        .to_owned();
    let n = |class: &str| -> u64 {
        let words: Vec<&str> = line.split([' ', ',']).filter(|w| !w.is_empty()).collect();
        let at = words.iter().position(|w| *w == class).unwrap();
        words[at - 1].parse().unwrap()
    };
    (n("2xx"), n("4xx"), n("5xx"), text)
}
