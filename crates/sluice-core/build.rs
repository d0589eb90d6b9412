//! Enables `core::hint::select_unpredictable` (Rust 1.88) when the compiler has it; the crate's
//! minimum Rust version is older, and there a plain `if` is used instead.

use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(sluice_select_unpredictable)");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=RUSTC");
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(out) = Command::new(rustc).arg("--version").output() else {
        return;
    };
    let version = String::from_utf8_lossy(&out.stdout);
    // "rustc 1.95.0 (59807616e 2026-..)"
    let minor = version
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    if minor.is_some_and(|m| m >= 88) {
        println!("cargo:rustc-cfg=sluice_select_unpredictable");
    }
}
