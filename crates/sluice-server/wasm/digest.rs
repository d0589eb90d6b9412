//! The digest of the browser module's inputs, shared by `build.rs` (which embeds the committed
//! module only while its inputs still hash to the recorded digest) and `tests/wasm_module.rs`
//! (which checks the committed module against a fresh build and rewrites the record on
//! `scripts/wasm-module update`).

use std::fs;
use std::path::Path;

use sha2::{Digest, Sha256};

/// The inputs of the module, relative to the workspace root; directories are walked in full.
pub const INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "crates/sluice-core/Cargo.toml",
    "crates/sluice-core/src",
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

/// SHA-256 over the module's inputs, as lowercase hex: each file's path relative to the
/// workspace, a NUL, its length, a NUL and its bytes, in sorted path order. Paths use `/` on
/// every platform, so the digest is the same in every checkout.
///
/// # Errors
///
/// A file or directory that cannot be read, named with the I/O error.
pub fn source_digest(workspace: &Path) -> Result<String, String> {
    let mut files = Vec::new();
    for input in INPUTS {
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
