//! The Python side of the protocol tests: scripts under `tests/py/` run with the venv's
//! interpreter (`SLUICE_PYTHON`, made by scripts/test with grpcio and websockets).
#![allow(dead_code)]

use std::io::{BufRead as _, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The venv's Python, or `None` (the test then returns) when `SLUICE_PYTHON` is unset and
/// `CI` is not `true`; with `CI=true` a missing interpreter fails the test.
pub fn python() -> Option<String> {
    let found = std::env::var("SLUICE_PYTHON")
        .ok()
        .filter(|p| !p.is_empty() && std::path::Path::new(p).exists());
    if found.is_none() {
        let why = "SLUICE_PYTHON (the venv python with grpcio and websockets) missing";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{why}; CI=true, so this fails instead of skipping");
        }
        eprintln!("skipped: {why}");
    }
    found
}

/// The path of `tests/py/<name>`.
pub fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

/// Runs `tests/py/<name> args...` to its end (at most `limit`) and returns the JSON of the
/// last line it printed.
pub fn run(python: &str, name: &str, args: &[&str], limit: Duration) -> serde_json::Value {
    let mut child = Command::new(python)
        .arg(script(name))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{name} {args:?} ran longer than {limit:?}\nstdout: {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
    match last.map(serde_json::from_str::<serde_json::Value>) {
        Some(Ok(v)) => v,
        _ => panic!(
            "{name} {args:?} printed no JSON ({})\nstdout: {stdout}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// A Python server script running until dropped, its stdout read line by line.
pub struct Server {
    child: Child,
    lines: mpsc::Receiver<String>,
    pub port: u16,
}

impl Server {
    /// Starts `tests/py/<name> args...` and waits for its `PORT <n>` line.
    pub fn start(python: &str, name: &str, args: &[&str]) -> Server {
        let mut child = Command::new(python)
            .arg(script(name))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            lines,
            port: 0,
        };
        let line = server.wait_line("PORT ", Duration::from_secs(30));
        server.port = line["PORT ".len()..].trim().parse().unwrap();
        server
    }

    /// The next line that starts with `prefix`, within `limit`.
    pub fn wait_line(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line starting with {prefix:?} within {limit:?}"),
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
