//! The Service Worker ships as its ES modules bundled: the committed `web/sw.js` (what the node
//! tests, `web/build-sw.mjs` and a reader see) is byte for byte the bundle of `web/sw/*.js`, and
//! so is the script the gateway embeds and serves after the prefix (`build.rs` bundles it).
//!
//! `SLUICE_SW_UPDATE=1` (what `scripts/sw-bundle update` sets) rewrites `web/sw.js` from the
//! modules instead of comparing.

#[path = "../build/sw_bundle.rs"]
mod sw_bundle;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use sluice_server::browser::assets;

fn web() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web")
}

fn modules() -> BTreeMap<String, String> {
    let mut sources = BTreeMap::new();
    for entry in fs::read_dir(web().join("sw")).expect("web/sw/ exists") {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.ends_with(".js") {
            sources.insert(name, fs::read_to_string(&path).unwrap());
        }
    }
    sources
}

#[test]
fn the_committed_and_the_served_worker_are_the_modules_bundled() {
    let bundled = sw_bundle::bundle_dir(&web().join("sw")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        assets::SW_SOURCE == bundled,
        "the embedded worker is not the modules bundled: rebuild (cargo reruns build.rs when web/sw/ changes)"
    );
    let path = web().join("sw.js");
    if std::env::var_os("SLUICE_SW_UPDATE").is_some_and(|v| v == "1") {
        fs::write(&path, &bundled).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = fs::read_to_string(&path).unwrap();
    assert!(
        committed == bundled,
        "web/sw.js is not the bundle of web/sw/*.js: run `scripts/sw-bundle update` and commit it"
    );
}

#[test]
fn the_modules_in_their_order_each_with_what_it_owns_and_under_400_lines() {
    let sources = modules();
    let order = sw_bundle::order(&sources).unwrap_or_else(|e| panic!("{e}"));
    // Each after what it imports; the first three also run outside a Service Worker.
    assert_eq!(
        order,
        [
            "config.js",
            "limiter.js",
            "internals.js",
            "worker.js",
            "instance.js",
            "db.js",
            "journal.js",
            "record.js",
            "queue.js",
            "telemetry.js",
            "failure.js",
            "requests.js",
            "headers.generated.js",
            "pacing.generated.js",
            "pace.js",
            "state.js",
            "upstream.js",
            "fetch.js",
            "main.js",
        ]
    );
    let main = &sources["main.js"];
    for (name, text) in &sources {
        assert!(text.lines().count() <= 400, "web/sw/{name}: over 400 lines");
        assert!(
            text.contains("// Owns: ") && text.contains("// Must not touch: "),
            "web/sw/{name}: its header says what it owns and what it must not touch"
        );
        assert!(
            main.contains(&format!(" *   {name} ")),
            "web/sw/main.js lists {name} among the rooms"
        );
    }
}
