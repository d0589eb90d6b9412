//! Builds the browser limiter's WebAssembly module (`sluice-wasm`, release, wasm32) and leaves
//! it at `$OUT_DIR/sluice_wasm.wasm`, where `src/browser/assets.rs` embeds it with
//! `include_bytes!` to serve it inside `/sluice/sw.js`.
//!
//! Why at build time rather than loading a file at run time: `sluice serve` stays one file that
//! works from `cargo run` on a fresh machine (issue 6: the embedded defaults show the browser
//! demo), there is no path to configure or to get wrong in a deployment, and the module served
//! is always built from the same sluice-core source as the gateway's own limiter, so the
//! browser and the gateway cannot drift apart.
//!
//! How: a nested `cargo build -p sluice-wasm --target wasm32-unknown-unknown --release` into
//! a target directory of its own under `OUT_DIR`. Its own directory means it never waits for
//! the build-directory lock the outer cargo holds (and a `cargo clippy` or `cargo test` run
//! builds the same module again in its own `OUT_DIR`, which costs seconds). The outer build's
//! compiler flags and wrappers are removed from the nested one's environment: they are for the
//! host (`-C target-cpu=native`, coverage, clippy's `RUSTC_WORKSPACE_WRAPPER`), not for wasm32.
//!
//! `SLUICE_WASM=/path/to/sluice_wasm.wasm` skips the nested build and embeds that file
//! (packagers, offline builds). Without it the wasm32 target must be installed:
//! `rustup target add wasm32-unknown-unknown`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-unknown-unknown";

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("crates/sluice-server lives two levels below the workspace root")
        .to_path_buf();
    let embedded = out_dir.join("sluice_wasm.wasm");

    println!("cargo:rerun-if-env-changed=SLUICE_WASM");
    if let Some(prebuilt) = env::var_os("SLUICE_WASM").filter(|p| !p.is_empty()) {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy_checked(&prebuilt, &embedded);
        return;
    }
    for path in [
        "crates/sluice-wasm/src",
        "crates/sluice-wasm/Cargo.toml",
        "crates/sluice-core/src",
        "crates/sluice-core/Cargo.toml",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(path).display());
    }

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    require_wasm_target(&rustc);

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = out_dir.join("wasm");
    let mut build = Command::new(cargo);
    build
        .current_dir(&workspace)
        .args([
            "build",
            "--package",
            "sluice-wasm",
            "--release",
            "--target",
            TARGET,
        ])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTC", &rustc);
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_LLVM_COV",
        "RUSTDOCFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
    ] {
        build.env_remove(var);
    }
    let output = build
        .output()
        .unwrap_or_else(|e| fail(format!("could not run cargo to build sluice-wasm: {e}")));
    if !output.status.success() {
        fail(format!(
            "building the browser module failed: `cargo build -p sluice-wasm --target {TARGET} --release` exited with {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let built = target_dir
        .join(TARGET)
        .join("release")
        .join("sluice_wasm.wasm");
    copy_checked(&built, &embedded);
}

/// Stops the build with the one command that fixes it when the wasm32 standard library is
/// missing (a nested cargo would otherwise fail with `can't find crate for core`).
fn require_wasm_target(rustc: &std::ffi::OsStr) {
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = libdir.as_deref().is_some_and(|dir| {
        fs::read_dir(dir).is_ok_and(|mut entries| {
            entries
                .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore-")))
        })
    });
    if !installed {
        fail(format!(
            "sluice-server embeds the browser limiter (crates/sluice-wasm) compiled for {TARGET}, \
             and that target is not installed.\nRun:\n\n    rustup target add {TARGET}\n\n\
             (or set SLUICE_WASM=/path/to/sluice_wasm.wasm to embed a module built elsewhere)"
        ));
    }
}

fn copy_checked(from: &Path, to: &Path) {
    let bytes = fs::read(from).unwrap_or_else(|e| {
        fail(format!(
            "cannot read the browser module {}: {e}",
            from.display()
        ))
    });
    if !bytes.starts_with(b"\0asm\x01\0\0\0") {
        fail(format!(
            "{} is not a WebAssembly module (version 1)",
            from.display()
        ));
    }
    fs::write(to, &bytes).unwrap_or_else(|e| fail(format!("cannot write {}: {e}", to.display())));
}

/// Stops the build with `message` (cargo shows a failed build script's output), without a
/// panic's backtrace in the way.
fn fail(message: String) -> ! {
    eprintln!("\nerror: {message}\n");
    std::process::exit(1)
}
