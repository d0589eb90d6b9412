//! `sluice simulate` matches the hand-computed examples of
//! docs/simulate.md exactly, its SVG rasterises to a real picture, and bad arguments, traces
//! and patterns get clear errors with their line (or column) and exit status 2.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sluice")
}

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs/examples")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-simulate-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn simulate(args: &[&str]) -> Output {
    Command::new(bin())
        .arg("simulate")
        .args(args)
        .output()
        .unwrap()
}

fn json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let out = simulate(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn config() -> String {
    example("simulate.toml").display().to_string()
}

/// docs/simulate.md, example 1: capacity 2 at 1/s, 2 may wait up to 3 s; bursts of 5 at 0 s
/// and 4 s. Each burst: 2 pass, 2 wait 1 s and 2 s, 1 finds the queue full.
#[test]
fn bursts_through_a_queue_match_the_hand_computation() {
    let r = json(&[
        "--config",
        &config(),
        "--policy",
        "api",
        "--pattern",
        "bursts 5 every 4s for 8s",
    ]);
    assert_eq!(r["offered"], 10);
    assert_eq!(r["admitted"], 8);
    assert_eq!(r["denied"], 2);
    assert_eq!(r["denied_by_reason"]["queue_full"], 2);
    assert_eq!(r["denied_by_reason"]["limit"], 0);
    assert_eq!(r["denied_by_reason"]["timeout"], 0);
    assert_eq!(r["waited"], 4);
    assert_eq!(r["queue_wait_ms"]["p50"], 0.0);
    assert_eq!(r["queue_wait_ms"]["p90"], 2000.0);
    assert_eq!(r["queue_wait_ms"]["p99"], 2000.0);
    assert_eq!(r["queue_wait_ms"]["max"], 2000.0);
    assert_eq!(r["span_s"], 8.0);
    assert_eq!(r["admitted_per_s"], 1.0);
    assert_eq!(r["offered_per_s"], 1.25);
}

/// docs/simulate.md, example 2: the trace file, with two keys and a cost of 2.
#[test]
fn the_trace_matches_the_hand_computation_per_key() {
    let trace = example("simulate.trace").display().to_string();
    let r = json(&["-c", &config(), "-p", "api", "--trace", &trace]);
    assert_eq!(
        (&r["offered"], &r["admitted"], &r["denied"]),
        (&12.into(), &10.into(), &2.into())
    );
    assert_eq!(r["denied_by_reason"]["queue_full"], 2);
    assert_eq!(r["waited"], 5);
    assert_eq!(r["queue_wait_ms"]["p50"], 0.0);
    assert_eq!(r["queue_wait_ms"]["p90"], 2000.0);
    assert_eq!(r["queue_wait_ms"]["max"], 2000.0);
    assert_eq!(r["span_s"], 6.0);
    let keys = r["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(
        (&keys[0]["key"], &keys[0]["offered"], &keys[0]["admitted"]),
        (&"alice".into(), &10.into(), &8.into())
    );
    assert_eq!(
        (&keys[1]["key"], &keys[1]["offered"], &keys[1]["admitted"]),
        (&"bob".into(), &2.into(), &2.into())
    );
}

/// docs/simulate.md, example 3: no queue, capacity 10 at 5/s, 10 requests a second for 10 s:
/// 10 + 5 × 9.9 = 59.5, so 59 admitted, 41 denied for `limit`.
#[test]
fn a_steady_overload_without_a_queue() {
    let r = json(&[
        "-c",
        &config(),
        "-p",
        "strict",
        "--pattern",
        "constant 10/s for 10s",
    ]);
    assert_eq!(r["offered"], 100);
    assert_eq!(r["admitted"], 59);
    assert_eq!(r["denied_by_reason"]["limit"], 41);
    assert_eq!(r["waited"], 0);
    assert_eq!(r["queue_wait_ms"]["max"], 0.0);
    assert_eq!(r["admitted_per_s"], 5.9);
}

#[test]
fn the_text_report_names_everything() {
    let out = simulate(&[
        "-c",
        &config(),
        "-p",
        "api",
        "--pattern",
        "bursts 5 every 4s for 8s",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "policy `api`: token_bucket, capacity 2 at 1/s",
        "queue 2 waiting at most 3s",
        "10 requests over 8 s",
        "admitted         8",
        "1.00/s effective",
        "queue_full 2",
        "(4 of 8 waited)",
        "p50 0 ms   p90 2000 ms   p99 2000 ms   max 2000 ms",
    ] {
        assert!(text.contains(needle), "no `{needle}` in\n{text}");
    }
}

#[test]
fn poisson_is_reproducible_with_a_seed_and_the_defaults_need_no_config() {
    let a = json(&["--pattern", "poisson 20/s for 30s", "--seed", "7"]);
    let b = json(&["--pattern", "poisson 20/s for 30s", "--seed", "7"]);
    assert_eq!(a, b);
    let offered = a["offered"].as_u64().unwrap();
    assert!((480..720).contains(&offered), "{offered}");
    // The embedded defaults: capacity 10 at 5/s per IP, 20 may wait 2 s.
    assert_eq!(a["policy"]["name"], "api");
    // Overloaded all along: the bucket's bound, capacity + rate × span, give or take the
    // token in refill at the end; the queue lets the last waiters in after the load ends.
    let admitted = a["admitted"].as_f64().unwrap();
    let bound = 10.0 + 5.0 * a["span_s"].as_f64().unwrap();
    assert!(a["span_s"].as_f64().unwrap() <= 32.0, "{a}");
    assert!(
        admitted <= bound && admitted >= bound - 1.0,
        "{admitted} vs {bound}"
    );
}

/// The SVG rasterises (resvg, pure Rust) to a picture with the level line and the bars.
#[test]
fn the_svg_is_a_real_picture() {
    let svg = scratch("example.svg");
    let out = simulate(&[
        "-c",
        &config(),
        "-p",
        "api",
        "--pattern",
        "bursts 5 every 4s for 8s",
        "--svg",
        &svg.display().to_string(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    let tree = resvg::usvg::Tree::from_str(&text, &resvg::usvg::Options::default()).unwrap();
    let size = tree.size().to_int_size();
    assert!(size.width() >= 800 && size.height() >= 500, "{size:?}");
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let (mut ink, mut blue, mut green) = (0usize, 0usize, 0usize);
    for p in pixmap.pixels() {
        let (r, g, b) = (p.red(), p.green(), p.blue());
        if (r, g, b) != (255, 255, 255) {
            ink += 1;
        }
        if b > 200 && r < 80 && g < 140 {
            blue += 1; // the level line (#2563eb)
        }
        if g > 140 && r < 60 && b < 100 {
            green += 1; // admitted bars (#16a34a)
        }
    }
    let total = pixmap.pixels().len();
    assert!(
        ink > total / 50,
        "nearly blank: {ink} of {total} pixels drawn"
    );
    assert!(blue > 500, "no level line: {blue} blue pixels");
    assert!(green > 200, "no admitted bars: {green} green pixels");
    let _ = std::fs::remove_file(&svg);
}

fn failure(args: &[&str]) -> (i32, String) {
    let out = simulate(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_traces_name_their_line_and_exit_2() {
    let cases = [
        (
            "0\n1\n# comment\n0.5\n",
            4,
            "before line 2's 1 s: a trace must be sorted by time",
        ),
        ("0\n1,5\n", 2, "cannot read `1,5` as a time"),
        ("0 k 2\n0.1 k zero\n", 2, "cannot read `zero` as a cost"),
        ("0 k 0\n", 1, "at least 1"),
        ("0\n\n-3\n", 3, "must not be negative"),
        ("0 k 1 extra\n", 1, "unexpected `extra`"),
        ("0.5\n2024-05-01T12:00:00Z\n", 2, "use one kind of time"),
    ];
    for (i, (text, line, message)) in cases.into_iter().enumerate() {
        let path = scratch(&format!("bad-{i}.trace"));
        std::fs::write(&path, text).unwrap();
        let shown = path.display().to_string();
        let (code, err) = failure(&["-c", &config(), "-p", "api", "--trace", &shown]);
        assert_eq!(code, 2, "{text:?}: {err}");
        assert!(
            err.contains(&format!("{shown}:{line}: ")),
            "{text:?}: no line {line} in {err}"
        );
        assert!(err.contains(message), "{text:?}: no `{message}` in {err}");
        let _ = std::fs::remove_file(&path);
    }
    let path = scratch("empty.trace");
    std::fs::write(&path, "# nothing\n").unwrap();
    let (code, err) = failure(&[
        "-c",
        &config(),
        "-p",
        "api",
        "--trace",
        &path.display().to_string(),
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("no requests"), "{err}");
    let (code, err) = failure(&[
        "-c",
        &config(),
        "-p",
        "api",
        "--trace",
        "/nonexistent/x.trace",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("cannot read /nonexistent/x.trace"), "{err}");
}

#[test]
fn bad_patterns_point_at_the_word_and_exit_2() {
    for (pattern, column, message) in [
        ("constant 5 for 10s", 10, "cannot read `5` as a rate"),
        ("poisson 4/s during 30s", 13, "expected `for`"),
        ("bursts 20 every 5 for 60s", 17, "has no unit"),
        ("fast 4/s for 30s", 1, "unknown shape `fast`"),
        ("poisson -4/s for 30s", 9, "cannot read `-4/s` as a rate"),
    ] {
        let (code, err) = failure(&["-c", &config(), "-p", "api", "--pattern", pattern]);
        assert_eq!(code, 2, "{pattern}: {err}");
        assert!(
            err.contains(&format!("--pattern: column {column}: ")),
            "{pattern}: {err}"
        );
        assert!(err.contains(message), "{pattern}: no `{message}` in {err}");
        // A caret under the column.
        assert!(
            err.contains(&format!("\n  {}^", " ".repeat(column - 1))),
            "{pattern}: {err}"
        );
    }
}

#[test]
fn bad_arguments_exit_2() {
    // Neither or both of --trace and --pattern (clap).
    let (code, err) = failure(&["-c", &config(), "-p", "api"]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = failure(&["-c", &config(), "--trace", "x", "--pattern", "idle 1s"]);
    assert_eq!(code, 2, "{err}");
    let (code, err) = failure(&["-c", &config(), "--pattern", "idle 1s", "--seed", "x"]);
    assert_eq!(code, 2, "{err}");
    // Several policies and none chosen, or an unknown one.
    let (code, err) = failure(&["-c", &config(), "--pattern", "constant 1/s for 1s"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("choose one with --policy: api, strict"),
        "{err}"
    );
    let (code, err) = failure(&["-c", &config(), "-p", "nope", "--pattern", "idle 1s"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no policy `nope`") && err.contains("defined: api, strict"),
        "{err}"
    );
    // An invalid config lists its errors with their lines.
    let bad = scratch("bad.toml");
    std::fs::write(
        &bad,
        "[[policy]]\nname = \"a\"\ncapacity = 0\nrate = \"1/s\"\n",
    )
    .unwrap();
    let (code, err) = failure(&["-c", &bad.display().to_string(), "--pattern", "idle 1s"]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.toml:3:"), "{err}");
    let _ = std::fs::remove_file(&bad);
}
