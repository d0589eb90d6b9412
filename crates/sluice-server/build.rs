//! Provides the three things the `sluice` binary embeds from outside its own sources:
//!
//! - **The browser limiter's WebAssembly module** at `$OUT_DIR/sluice_wasm.wasm`, which
//!   `src/browser/assets.rs` embeds with `include_bytes!` to serve inside `/sluice/sw.js`.
//! - **The Service Worker** at `$OUT_DIR/sw.js`: the ES modules of `web/sw/` bundled into one
//!   classic script by `build/sw_bundle.rs` (no JavaScript tooling), which `assets.rs` serves
//!   after the generated prefix. `tests/sw_bundle.rs` checks that the committed `web/sw.js` is
//!   the same bytes; `scripts/sw-bundle update` rewrites it.
//! - **The version line** (`SLUICE_VERSION_LINE`): the crate version, the commit and its date,
//!   which `sluice --version` prints.
//!
//! # The module: committed, checked, rebuilt only when its sources change
//!
//! The module is committed at `wasm/sluice_wasm.wasm`, beside `wasm/sluice_wasm.sources`, which
//! records the SHA-256 of every input it was built from (sluice-core's and sluice-wasm's
//! sources and manifests, the workspace manifest and lock file) and the compiler that built it.
//!
//! - When the inputs hash to the recorded digest, the committed module is embedded as it is:
//!   no nested cargo, no wasm32 target, no network. `cargo run`, `cargo install --path`, a
//!   packager's offline build and docs.rs all take this path.
//! - When they differ (someone changed the core), the committed module no longer matches its
//!   sources, and shipping it would put an old core in the browser. Then, with the wasm32
//!   target installed, the module is rebuilt from the current sources (a nested
//!   `cargo build -p sluice-wasm --target wasm32-unknown-unknown --release` in a target
//!   directory of its own under `OUT_DIR`) and a warning asks to refresh the committed copy;
//!   without the target, the build stops and says how to rebuild it.
//! - `SLUICE_WASM=/path/to/sluice_wasm.wasm` embeds that file instead (a packager's own build).
//!
//! `tests/wasm_module.rs`, run by the test command, builds the module afresh and fails unless
//! the committed one is byte-identical and the recorded digest matches the sources, so the
//! committed module can never drift from the core. `scripts/wasm-module update` refreshes
//! both files.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "wasm/digest.rs"]
mod digest;
#[path = "build/sw_bundle.rs"]
mod sw_bundle;

use digest::TARGET;

fn main() {
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest_dir =
        PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    version_line(&manifest_dir);
    module(&manifest_dir, &out_dir);
    service_worker(&manifest_dir, &out_dir);
}

// === the Service Worker ===

fn service_worker(manifest_dir: &Path, out_dir: &Path) {
    let dir = manifest_dir.join("../../web/sw");
    // A folder: cargo reruns the script when any file below it changes.
    println!("cargo:rerun-if-changed={}", dir.display());
    let script = sw_bundle::bundle_dir(&dir).unwrap_or_else(|e| {
        fail(format!(
            "the Service Worker's modules ({}) cannot be bundled: {e}",
            dir.display()
        ))
    });
    let to = out_dir.join("sw.js");
    fs::write(&to, script).unwrap_or_else(|e| fail(format!("cannot write {}: {e}", to.display())));
}

// === the module ===

fn module(manifest_dir: &Path, out_dir: &Path) {
    let embedded = out_dir.join("sluice_wasm.wasm");
    let committed = manifest_dir.join("wasm").join("sluice_wasm.wasm");
    let record = manifest_dir.join("wasm").join("sluice_wasm.sources");

    println!("cargo:rerun-if-env-changed=SLUICE_WASM");
    if let Some(prebuilt) = env::var_os("SLUICE_WASM").filter(|p| !p.is_empty()) {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy_checked(&prebuilt, &embedded);
        return;
    }
    println!("cargo:rerun-if-changed={}", committed.display());
    println!("cargo:rerun-if-changed={}", record.display());

    // The workspace around this crate: absent when the crate is built from a package alone,
    // where the committed module is all there is.
    let workspace = manifest_dir
        .parent()
        .and_then(Path::parent)
        .filter(|w| w.join("crates/sluice-core/src").is_dir())
        .map(Path::to_path_buf);
    let Some(workspace) = workspace else {
        copy_checked(&committed, &embedded);
        return;
    };
    for input in digest::INPUTS {
        println!("cargo:rerun-if-changed={}", workspace.join(input).display());
    }

    let recorded = fs::read_to_string(&record).unwrap_or_else(|e| {
        fail(format!(
            "cannot read {}: {e}\nIt records what the committed module was built from; \
             `scripts/wasm-module update` writes it.",
            record.display()
        ))
    });
    let sources = digest::source_digest(&workspace, digest::INPUTS).unwrap_or_else(|e| fail(e));
    if digest::recorded_field(&recorded, "sources") == Some(sources.as_str()) {
        // The committed file must also be the one the record describes (not a checkout that
        // converted its bytes, or a Git LFS pointer).
        let bytes = fs::read(&committed)
            .unwrap_or_else(|e| fail(format!("cannot read {}: {e}", committed.display())));
        if digest::recorded_field(&recorded, "module") != Some(digest::sha256_hex(&bytes).as_str())
        {
            fail(format!(
                "{} is not the module its record ({}) describes: restore it with                  `git checkout -- crates/sluice-server/wasm/`",
                committed.display(),
                record.display()
            ));
        }
        copy_checked(&committed, &embedded);
        return;
    }

    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    if !wasm_target_installed(&rustc) {
        fail(format!(
            "sluice-core, sluice-wasm-rt or sluice-wasm changed since the committed browser module \
             ({}) was built, and rebuilding it needs the {TARGET} target.\nRun:\n\n    \
             rustup target add {TARGET}\n    scripts/wasm-module update\n\n\
             (or set SLUICE_WASM=/path/to/sluice_wasm.wasm to embed a module built elsewhere)",
            committed.display()
        ));
    }
    println!(
        "cargo:warning=the committed browser module is older than its sources; embedding a \
         fresh build (run `scripts/wasm-module update` to refresh crates/sluice-server/wasm/)"
    );
    let built = nested_build(&workspace, out_dir, &rustc);
    copy_checked(&built, &embedded);
}

/// Builds `sluice-wasm` for wasm32 into a target directory of its own under `OUT_DIR`, so it
/// never waits for the build-directory lock the outer cargo holds. The outer build's compiler
/// flags and wrappers are removed from the nested one's environment: they are for the host
/// (`-C target-cpu=native`, coverage, clippy's `RUSTC_WORKSPACE_WRAPPER`), not for wasm32.
fn nested_build(workspace: &Path, out_dir: &Path, rustc: &std::ffi::OsStr) -> PathBuf {
    let target_dir = out_dir.join("wasm");
    let output = digest::release_build(workspace, "sluice-wasm", &target_dir)
        .env("RUSTC", rustc)
        .output()
        .unwrap_or_else(|e| fail(format!("could not run cargo to build sluice-wasm: {e}")));
    if !output.status.success() {
        fail(format!(
            "building the browser module failed: `cargo build -p sluice-wasm --target {TARGET} --release` exited with {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    digest::built_module(&target_dir, "sluice_wasm")
}

/// Whether the wasm32 standard library is installed for this compiler (without it a nested
/// cargo fails with `can't find crate for core`).
fn wasm_target_installed(rustc: &std::ffi::OsStr) -> bool {
    let libdir = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    libdir.as_deref().is_some_and(|dir| {
        fs::read_dir(dir).is_ok_and(|mut entries| {
            entries
                .any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore-")))
        })
    })
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

// === the version line ===

/// Sets `SLUICE_VERSION_LINE` to `0.1.0 (commit 1a2b3c4d5e6f, 2026-12-01)`.
///
/// The commit comes from `SLUICE_COMMIT` when set (a packager building from a tarball), else
/// from git when the crate is built inside its repository, else it reads `commit unknown`.
fn version_line(manifest_dir: &Path) {
    println!("cargo:rerun-if-env-changed=SLUICE_COMMIT");
    let version = env::var("CARGO_PKG_VERSION").expect("cargo sets CARGO_PKG_VERSION");
    let commit = match env::var("SLUICE_COMMIT").ok().filter(|c| !c.is_empty()) {
        Some(commit) => format!("commit {commit}"),
        None => git_commit(manifest_dir).unwrap_or_else(|| "commit unknown".to_owned()),
    };
    println!("cargo:rustc-env=SLUICE_VERSION_LINE={version} ({commit})");
}

/// `commit <12 hex digits>, <commit date>` from git, and the files whose change means a new
/// commit (HEAD, the branch's ref, packed refs) for cargo to watch.
fn git_commit(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .current_dir(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let head = git(&["log", "-1", "--format=%H %cs"])?;
    let (hash, date) = head.split_once(' ')?;
    let git_dir = PathBuf::from(git(&["rev-parse", "--absolute-git-dir"])?);
    let common_dir = git(&["rev-parse", "--git-common-dir"])
        .map(|d| dir.join(d))
        .unwrap_or_else(|| git_dir.clone());
    println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
    println!(
        "cargo:rerun-if-changed={}",
        common_dir.join("packed-refs").display()
    );
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        println!(
            "cargo:rerun-if-changed={}",
            common_dir.join(branch).display()
        );
    }
    Some(format!("commit {}, {date}", &hash[..hash.len().min(12)]))
}

/// Stops the build with `message` (cargo shows a failed build script's output), without a
/// panic's backtrace in the way.
fn fail(message: String) -> ! {
    eprintln!("\nerror: {message}\n");
    std::process::exit(1)
}
