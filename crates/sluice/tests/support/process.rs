//! Helper processes: the test binary runs itself again as a helper (one `#[test]` that does
//! nothing unless `SLUICE_HELPER` names it), so plain `cargo test` needs no extra binary.

use std::process::{Command, Stdio};

/// The environment variable that turns a helper test into a helper.
pub const ROLE: &str = "SLUICE_HELPER";

/// A command running the helper test `test_name` of this test binary as `role`.
pub fn helper(test_name: &str, role: &str) -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([test_name, "--exact", "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// This process's helper role, if it is a helper.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// The lines of `output` that start with `prefix`, without it.
pub fn lines_with<'a>(output: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> + 'a {
    output.lines().filter_map(move |l| l.strip_prefix(prefix))
}

/// Nanoseconds since the Unix epoch, from the wall clock.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
