//! The committed browser module (`wasm/sluice_wasm.wasm`) is exactly what the current sources
//! build: the recorded digest matches sluice-core's and sluice-wasm's sources, and a fresh
//! release build for wasm32 is byte-identical to the committed file.
//!
//! `SLUICE_WASM_UPDATE=1` (what `scripts/wasm-module update` sets) rewrites the module and its
//! record from a fresh build instead of comparing.

#[path = "../wasm/digest.rs"]
mod digest;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

fn rustc_version() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let out = Command::new(rustc)
        .arg("--version")
        .output()
        .expect("rustc runs");
    String::from_utf8(out.stdout)
        .expect("rustc prints UTF-8")
        .trim()
        .to_owned()
}

/// A fresh `cargo build -p sluice-wasm --target wasm32-unknown-unknown --release` in a target
/// directory of its own, with none of the outer build's host flags.
fn fresh_module() -> Vec<u8> {
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-module");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build
        .current_dir(workspace())
        .args([
            "build",
            "--package",
            "sluice-wasm",
            "--release",
            "--target",
            TARGET,
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    for var in digest::HOST_BUILD_VARS {
        build.env_remove(var);
    }
    let out = build.output().expect("cargo runs");
    assert!(
        out.status.success(),
        "building sluice-wasm for {TARGET} failed (is the target installed? \
         `rustup target add {TARGET}`):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    fs::read(target_dir.join(TARGET).join("release/sluice_wasm.wasm"))
        .expect("the module was built")
}

#[test]
fn the_committed_module_is_a_fresh_build_of_the_current_sources() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("wasm");
    let committed_path = dir.join("sluice_wasm.wasm");
    let record_path = dir.join("sluice_wasm.sources");
    let sources = digest::source_digest(&workspace()).expect("the inputs can be read");
    let fresh = fresh_module();
    let rustc = rustc_version();

    if std::env::var_os("SLUICE_WASM_UPDATE").is_some_and(|v| v == "1") {
        fs::write(&committed_path, &fresh).expect("write the module");
        let record = format!(
            "# What sluice_wasm.wasm beside this file was built from: `cargo build -p sluice-wasm\n\
             # --target {TARGET} --release`. Written by scripts/wasm-module update, checked by\n\
             # crates/sluice-server/tests/wasm_module.rs; build.rs embeds the module while the\n\
             # sources still hash to this digest.\n\
             sources: {sources}\n\
             module: {}\n\
             rustc: {rustc}\n",
            digest::sha256_hex(&fresh)
        );
        fs::write(&record_path, record).expect("write the record");
        return;
    }

    let record = fs::read_to_string(&record_path).expect("the record is committed");
    let committed = fs::read(&committed_path).expect("the module is committed");
    let recorded_rustc = digest::recorded_field(&record, "rustc").unwrap_or("(none)");
    assert_eq!(
        recorded_rustc, rustc,
        "the committed module was built by another compiler: a byte comparison needs the same \
         one (install it with rustup, or run `scripts/wasm-module update` and commit)"
    );
    assert_eq!(
        digest::recorded_field(&record, "sources"),
        Some(sources.as_str()),
        "sluice-core or sluice-wasm changed since the committed module was built: run \
         `scripts/wasm-module update` and commit crates/sluice-server/wasm/"
    );
    assert_eq!(
        digest::recorded_field(&record, "module"),
        Some(digest::sha256_hex(&committed).as_str()),
        "the record's module digest does not match the committed module"
    );
    assert!(
        committed == fresh,
        "the committed module ({} bytes, sha256 {}) differs from a fresh build ({} bytes, \
         sha256 {}): run `scripts/wasm-module update` and commit crates/sluice-server/wasm/",
        committed.len(),
        digest::sha256_hex(&committed),
        fresh.len(),
        digest::sha256_hex(&fresh)
    );
}
