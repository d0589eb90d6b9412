//! Every TOML example of the crate README that says it is accepted by `sluice check-config`
//! is: each is written to a file and checked by the binary, which must exit 0.

use std::process::Command;

#[test]
fn the_readme_examples_said_to_pass_check_config_pass_it() {
    let readme = include_str!("../README.md");
    let dir = std::env::temp_dir().join(format!("sluice-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin =
        std::env::var("SLUICE_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_sluice").to_owned());
    let mut checked = 0;
    for (i, block) in readme.split("```toml\n").skip(1).enumerate() {
        let block = &block[..block.find("```").expect("a closed code block")];
        if !block.contains("accepted by sluice check-config") {
            continue;
        }
        let path = dir.join(format!("example-{i}.toml"));
        std::fs::write(&path, block).unwrap();
        let out = Command::new(&bin)
            .arg("check-config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "README example {i} refused:\n{block}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        checked >= 2,
        "only {checked} examples said to pass check-config"
    );
}
