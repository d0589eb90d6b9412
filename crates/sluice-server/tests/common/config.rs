//! Policies and routes in TOML, as several suites write them (the `[server]` table of a
//! gateway's ports is `config_text`, beside `Gateway`).

/// Two routes in front of `up`: `/api/` with the server's limits, `/upload/` with
/// `upload_extra` lines.
pub fn two_routes(up: &str, upload_extra: &str) -> String {
    format!(
        "[[route]]\npath_prefix = \"/api/\"\nupstream = \"{up}\"\n\n\
         [[route]]\npath_prefix = \"/upload/\"\nupstream = \"{up}\"\n{upload_extra}\n"
    )
}

/// A policy that admits `capacity` and then (in a test's time) nothing more.
pub fn policy(name: &str, capacity: u32) -> String {
    format!("[[policy]]\nname = \"{name}\"\ncapacity = {capacity}\nrate = \"1/h\"\n")
}

/// A route on `prefix` through `policies` (by name) to `upstream`.
pub fn route(prefix: &str, policies: &[&str], upstream: &str) -> String {
    let policies: Vec<String> = policies.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        "[[route]]\npath_prefix = \"{prefix}\"\npolicies = [{}]\nupstream = \"{upstream}\"\n",
        policies.join(", ")
    )
}
