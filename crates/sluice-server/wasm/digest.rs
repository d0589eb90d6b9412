//! The committed WebAssembly modules and what they were built from: the digest of a module's
//! inputs, the nested wasm32 build, and the check that a committed module is a fresh build of
//! the current sources.
//!
//! Included by `build.rs` (which embeds the committed browser module only while its inputs
//! still hash to the recorded digest), by `tests/wasm_module.rs` (the browser module) and by
//! `crates/sluice-js-wasm/tests/module.rs` (the npm package's module). Each uses a part.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// What the modules are built for.
pub const TARGET: &str = "wasm32-unknown-unknown";

/// The inputs of the browser module, relative to the workspace root; directories are walked in
/// full.
pub const INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "crates/sluice-core/Cargo.toml",
    "crates/sluice-core/src",
    "crates/sluice-wasm-rt/Cargo.toml",
    "crates/sluice-wasm-rt/src",
    "crates/sluice-wasm/Cargo.toml",
    "crates/sluice-wasm/src",
];

/// The outer build's variables a nested wasm32 build must not inherit: its compiler flags and
/// wrappers are for the host (`-C target-cpu=native`, coverage, clippy's wrapper), and its
/// target directory and target are the outer build's.
pub const HOST_BUILD_VARS: &[&str] = &[
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
];

/// SHA-256 over a module's `inputs`, as lowercase hex: each file's path relative to the
/// workspace, a NUL, its length, a NUL and its bytes, in sorted path order. Paths use `/` on
/// every platform, so the digest is the same in every checkout.
///
/// # Errors
///
/// A file or directory that cannot be read, named with the I/O error.
pub fn source_digest(workspace: &Path, inputs: &[&str]) -> Result<String, String> {
    let mut files = Vec::new();
    for input in inputs {
        collect(workspace, &workspace.join(input), &mut files)?;
    }
    files.sort();
    let mut hash = Sha256::new();
    for relative in &files {
        let bytes = fs::read(workspace.join(relative))
            .map_err(|e| format!("cannot read {relative}: {e}"))?;
        hash.update(relative.as_bytes());
        hash.update([0]);
        hash.update(bytes.len().to_string().as_bytes());
        hash.update([0]);
        hash.update(&bytes);
    }
    Ok(hex(&hash.finalize()))
}

/// SHA-256 of `bytes` as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// The value of the `name: value` line in a record file.
pub fn recorded_field<'a>(record: &'a str, name: &str) -> Option<&'a str> {
    record.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key.trim() == name).then(|| value.trim())
    })
}

fn collect(workspace: &Path, path: &Path, files: &mut Vec<String>) -> Result<(), String> {
    if path.is_dir() {
        let entries =
            fs::read_dir(path).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", path.display()))?;
            collect(workspace, &entry.path(), files)?;
        }
    } else if path.is_file() {
        let relative = path
            .strip_prefix(workspace)
            .map_err(|_| format!("{} lies outside the workspace", path.display()))?;
        let parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        files.push(parts.join("/"));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `cargo build -p <package> --target wasm32-unknown-unknown --release` in `target_dir`, a
/// target directory of its own (so that it never waits for the lock an outer build holds),
/// without the outer build's host flags and wrappers ([`HOST_BUILD_VARS`]). The module is then
/// at [`built_module`].
pub fn release_build(workspace: &Path, package: &str, target_dir: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(workspace)
        .args([
            "build",
            "--package",
            package,
            "--release",
            "--target",
            TARGET,
        ])
        .arg("--manifest-path")
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir);
    for var in HOST_BUILD_VARS {
        build.env_remove(var);
    }
    build
}

/// Where [`release_build`] puts the module of the library `lib` (`sluice_wasm`).
pub fn built_module(target_dir: &Path, lib: &str) -> PathBuf {
    target_dir
        .join(TARGET)
        .join("release")
        .join(format!("{lib}.wasm"))
}

/// Writes a file generated from a module: from its bytes and its source digest.
pub type Generate = fn(&[u8], &str) -> String;

/// A committed module, its record, and how to refresh them.
pub struct Committed<'a> {
    /// The package that builds it (`sluice-wasm`).
    pub package: &'a str,
    /// Its inputs (see [`source_digest`]).
    pub inputs: &'a [&'a str],
    /// The committed module.
    pub module: PathBuf,
    /// The committed record of what it was built from.
    pub record: PathBuf,
    /// The comment lines at the top of the record.
    pub record_header: String,
    /// A file generated from the module (the npm package embeds it as base64), and how.
    pub generated: Option<(PathBuf, Generate)>,
    /// The command that refreshes everything, for the messages.
    pub update: &'a str,
}

/// In a test: with `update`, writes the module, its record and any generated file from a fresh
/// build in `target_dir`; otherwise asserts that the committed ones are exactly what a fresh
/// build of the current sources gives, built by the recorded compiler.
pub fn check_or_update(
    workspace: &Path,
    committed: &Committed<'_>,
    target_dir: &Path,
    update: bool,
) {
    let sources = source_digest(workspace, committed.inputs).expect("the inputs can be read");
    let out = release_build(workspace, committed.package, target_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building {} for {TARGET} failed (is the target installed? `rustup target add \
         {TARGET}`):\n{}",
        committed.package,
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = committed.package.replace('-', "_");
    let fresh = fs::read(built_module(target_dir, &lib)).expect("the module was built");
    let rustc = rustc_version();

    if update {
        fs::create_dir_all(committed.module.parent().expect("a folder")).expect("mkdir");
        fs::write(&committed.module, &fresh).expect("write the module");
        let record = format!(
            "{}sources: {sources}\nmodule: {}\nrustc: {rustc}\n",
            committed.record_header,
            sha256_hex(&fresh)
        );
        fs::write(&committed.record, record).expect("write the record");
        if let Some((path, generate)) = &committed.generated {
            fs::write(path, generate(&fresh, &sources)).expect("write the generated file");
        }
        return;
    }

    let stale = format!("run `{}` and commit what it writes", committed.update);
    let record = fs::read_to_string(&committed.record).expect("the record is committed");
    let module = fs::read(&committed.module).expect("the module is committed");
    assert_eq!(
        recorded_field(&record, "rustc").unwrap_or("(none)"),
        rustc,
        "the committed module was built by another compiler: a byte comparison needs the same \
         one (install it with rustup, or {stale})"
    );
    assert_eq!(
        recorded_field(&record, "sources"),
        Some(sources.as_str()),
        "{}'s sources changed since the committed module was built: {stale}",
        committed.package
    );
    assert_eq!(
        recorded_field(&record, "module"),
        Some(sha256_hex(&module).as_str()),
        "the record's module digest does not match the committed module: {stale}"
    );
    assert!(
        module == fresh,
        "the committed module ({} bytes, sha256 {}) differs from a fresh build ({} bytes, \
         sha256 {}): {stale}",
        module.len(),
        sha256_hex(&module),
        fresh.len(),
        sha256_hex(&fresh)
    );
    if let Some((path, generate)) = &committed.generated {
        assert!(
            fs::read_to_string(path).expect("the generated file is committed")
                == generate(&module, &sources),
            "{} does not embed the committed module: {stale}",
            path.display()
        );
    }
}

/// `rustc --version` of the compiler cargo uses.
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
