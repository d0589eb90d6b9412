//! The committed browser module (`wasm/sluice_wasm.wasm`) is exactly what the current sources
//! build: the recorded digest matches the sources of sluice-core, sluice-wasm-rt and
//! sluice-wasm, and a fresh release build for wasm32 is byte-identical to the committed file.
//!
//! `SLUICE_WASM_UPDATE=1` (what `scripts/wasm-module update` sets) rewrites the module and its
//! record from a fresh build instead of comparing.

#[path = "../wasm/digest.rs"]
mod digest;

use std::path::Path;

use digest::{Committed, TARGET};

#[test]
fn the_committed_module_is_a_fresh_build_of_the_current_sources() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists");
    let committed = Committed {
        package: "sluice-wasm",
        inputs: digest::INPUTS,
        module: manifest.join("wasm/sluice_wasm.wasm"),
        record: manifest.join("wasm/sluice_wasm.sources"),
        record_header: format!(
            "# What sluice_wasm.wasm beside this file was built from: `cargo build -p sluice-wasm\n\
             # --target {TARGET} --release`. Written by scripts/wasm-module update, checked by\n\
             # crates/sluice-server/tests/wasm_module.rs; build.rs embeds the module while the\n\
             # sources still hash to this digest.\n"
        ),
        generated: None,
        update: "scripts/wasm-module update",
    };
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("wasm-module");
    let update = std::env::var_os("SLUICE_WASM_UPDATE").is_some_and(|v| v == "1");
    digest::check_or_update(&workspace, &committed, &target_dir, update);
}
