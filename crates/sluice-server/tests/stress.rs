//! `sluice stress` and the access log: `sluice stress` against the real
//! `sluice serve` and a real upstream on 127.0.0.1 reports exactly the admitted counts of the
//! gateway's /metrics (and of the upstream), close to what `sluice simulate` predicts; the
//! access log has a request id and the decision for every request; bad arguments exit 2.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{api_10_at_5, bin, get, get_with, Gateway, TempDir, Upstream};
use serde_json::Value;

async fn run(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || Command::new(bin()).args(args).output().unwrap())
        .await
        .unwrap()
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stress_reports_what_the_gateway_counted() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &api_10_at_5(&upstream.url())).await;
    let out = run(vec![
        "stress".into(),
        gw.url("/api/load"),
        "--rate".into(),
        "100".into(),
        "--duration".into(),
        "2s".into(),
        "--concurrency".into(),
        "50".into(),
        "--json".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let admitted = report["admitted"].as_u64().unwrap();
    let limited = report["statuses"]["429"].as_u64().unwrap_or(0);
    assert_eq!(report["sent"], 200, "{report:#}");
    assert_eq!(admitted + limited, 200, "only 200s and 429s: {report:#}");
    assert!(
        report["errors"].as_object().unwrap().is_empty(),
        "{report:#}"
    );

    // The gateway's own counts.
    let metrics =
        String::from_utf8(get(&gw.admin("/metrics")).await.unwrap().body.to_vec()).unwrap();
    let counted = metric(
        &metrics,
        "sluice_policy_admitted_total{policy=\"api\",protocol=\"http1\"}",
    );
    let denied = metric(
        &metrics,
        "sluice_policy_denied_total{policy=\"api\",reason=\"limit\",protocol=\"http1\"}",
    );
    assert_eq!(
        counted, admitted as f64,
        "stress vs /metrics admitted\n{metrics}"
    );
    assert_eq!(
        denied, limited as f64,
        "stress vs /metrics denied\n{metrics}"
    );
    assert_eq!(
        upstream.count(),
        admitted,
        "the upstream saw the admitted requests"
    );

    // What `sluice simulate` predicts for the same load: 10 + 5 × 1.99 s = 19.95, so 19.
    // Real timers jitter, and a loaded machine stretches or squeezes the 2 s of load a
    // little: allow two tokens either way (the counts above are exact in any case).
    let sim = run(vec![
        "simulate".into(),
        "--config".into(),
        gw.config.display().to_string(),
        "--pattern".into(),
        "constant 100/s for 2s".into(),
        "--json".into(),
    ])
    .await;
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let sim: Value = serde_json::from_slice(&sim.stdout).unwrap();
    assert_eq!(sim["admitted"], 19);
    assert!(
        (17..=22).contains(&admitted),
        "the gateway admitted {admitted}, the simulation predicts 19"
    );

    // The access log: every request, with its id and decision.
    let deadline = Instant::now() + Duration::from_secs(5);
    let lines = loop {
        let log = gw.log_text();
        let lines: Vec<String> = log
            .lines()
            .filter(|l| l.contains("sluice::access") && l.contains("path=/api/load"))
            .map(str::to_owned)
            .collect();
        if lines.len() >= 200 || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(lines.len(), 200, "one access line per request");
    let admitted_lines = lines
        .iter()
        .filter(|l| l.contains("decision=admitted"))
        .count();
    let denied_lines = lines
        .iter()
        .filter(|l| l.contains("decision=denied:limit") && l.contains("policy=\"api\""))
        .count();
    assert_eq!(admitted_lines as u64, admitted);
    assert_eq!(denied_lines as u64, limited);
    let mut ids: Vec<&str> = lines
        .iter()
        .filter_map(|l| l.split("request_id=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(ids.len(), 200);
    assert!(
        ids.iter()
            .all(|id| id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit())),
        "{ids:?}"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 200, "request ids are unique");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_request_id_is_logged_with_the_decision() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start("", &api_10_at_5(&upstream.url())).await;
    let mut last = None;
    for i in 0..12 {
        let id = format!("trace-{i}");
        let r = get_with(&gw.url("/api/x"), &[("x-request-id", &id)]).await;
        assert_eq!(r.header("x-request-id"), Some(id.as_str()));
        last = Some((id, r.status));
    }
    let (id, status) = last.unwrap();
    assert_eq!(status, 429, "12 at once exceed the capacity of 10");
    gw.wait_log(&format!("request_id=\"{id}\""), Duration::from_secs(5))
        .await;
    let log = gw.log_text();
    let line = log
        .lines()
        .find(|l| l.contains(&format!("request_id=\"{id}\"")))
        .unwrap();
    for field in [
        "sluice::access",
        "method=GET",
        "path=/api/x",
        "status=429",
        "decision=denied:limit",
        "policy=\"api\"",
        "reason=\"limit\"",
    ] {
        assert!(line.contains(field), "no {field} in {line}");
    }
    let first = log
        .lines()
        .find(|l| l.contains("request_id=\"trace-0\""))
        .unwrap();
    assert!(
        first.contains("decision=admitted") && first.contains("status=200"),
        "{first}"
    );
}

fn stress(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin())
        .arg("stress")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_exit_2_with_a_clear_message() {
    let url = "http://127.0.0.1:9/";
    for (args, message) in [
        (vec![url, "--rate", "fast"], "--rate `fast`"),
        (vec![url, "--rate", "0"], "--rate `0`"),
        (
            vec![url, "--duration", "10"],
            "--duration: duration `10` has no unit",
        ),
        (vec![url, "--duration", "0s"], "must be longer than zero"),
        (vec![url, "--concurrency", "0"], "--concurrency 0"),
        (vec![url, "-H", "X-Api-Key"], "expected `Name: value`"),
        (vec![url, "-H", "bad name: v"], "is not a header name"),
        (vec![url, "--method", "GE T"], "is not an HTTP method"),
        (vec!["https://127.0.0.1/"], "https is not supported"),
        (vec!["127.0.0.1:8080"], "is not an http:// URL"),
        (
            vec![url, "--rate", "1000000/s", "--duration", "1h"],
            "at most 10000000",
        ),
    ] {
        let (code, _, err) = stress(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(message), "{args:?}: no `{message}` in {err}");
    }
    // clap's own usage errors exit 2 as well.
    let (code, _, err) = stress(&[]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = stress(&[url, "--concurrency", "many"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn nothing_listening_exits_1_with_connect_errors() {
    let port = common::closed_port();
    let (code, out, err) = stress(&[
        &format!("http://127.0.0.1:{port}/"),
        "--rate",
        "20",
        "--duration",
        "200ms",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("  connect        4  100.0%  (no response)"),
        "{out}"
    );
    assert!(err.contains("no connection"), "{err}");
}

/// The progress line appears on a terminal (a pty from `script`), and never in a pipe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_progress_line_only_on_a_terminal() {
    let upstream = Upstream::start().await;
    let url = format!("{}/x", upstream.url());
    let piped = run(vec![
        "stress".into(),
        url.clone(),
        "--rate".into(),
        "20".into(),
        "--duration".into(),
        "1s".into(),
    ])
    .await;
    let text = String::from_utf8_lossy(&piped.stdout);
    assert!(!text.contains('\r') && !text.contains('\x1b'), "{text:?}");
    assert!(text.contains("admitted (2xx): 20 of 20"), "{text}");
    if !std::path::Path::new("/usr/bin/script").exists() {
        eprintln!("no /usr/bin/script: the terminal half is not run");
        return;
    }
    let dir = TempDir::new();
    let typescript = dir.0.join("typescript");
    let command = format!("{} stress {url} --rate 20 --duration 1s", bin());
    let status = tokio::task::spawn_blocking({
        let typescript = typescript.clone();
        move || {
            Command::new("/usr/bin/script")
                .args(["-q", "-e", "-c", &command])
                .arg(&typescript)
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(status.status.success(), "{status:?}");
    let screen = String::from_utf8_lossy(&std::fs::read(&typescript).unwrap()).into_owned();
    assert!(screen.contains("\r\x1b[2K"), "{screen:?}");
    assert!(screen.contains("/20 sent  2xx "), "{screen:?}");
    assert!(screen.contains("admitted (2xx): 20 of 20"), "{screen:?}");
}
