//! The gateway configuration: TOML with every error reported at once, with its line.
//!
//! [`parse`] reads the document with spans (`toml::de::DeTable`), walks it by hand and
//! collects every problem (unknown keys included, as `deny_unknown_fields` would, but all of
//! them rather than the first) before anything is built. The keys are documented in the
//! crate's README.
//!
//! This module holds the whole file ([`Config`]) and the order its sections are read in;
//! each section has a room of its own, with its types and its checks: `server`, `store`,
//! `policy`, `route`, `browser`, `rls`, `otlp` (`[telemetry]`) and `jobs`. Below them, `walk`
//! collects the errors and walks the tables, `values` reads durations, sizes and booleans
//! from them, `units` their text forms, `secret` what `env:` and `file:` name, and `tls` the
//! PEM files. Every public name is re-exported here: code outside reads `config::X`.

mod browser;
mod cost;
mod jobs;
pub mod lease;
mod otlp;
pub mod plan;
mod policy;
mod rls;
mod route;
mod secret;
mod server;
mod store;
pub mod tls;
pub mod units;
mod values;
mod walk;

use std::path::Path;

use toml::de::DeTable;

pub use browser::{
    BrowserConfig, FailMode, TelemetryConfig, RESERVED_PREFIX as BROWSER_RESERVED_PREFIX,
};
pub use jobs::{JobsConfig, DEFAULT_JOBS_INTERVAL, DEFAULT_JOBS_PREFIX, MAX_JOB_QUEUES};
pub use otlp::OtlpConfig;
pub use policy::PolicyConfig;
pub use rls::{RlsEntry, RlsRule};
pub use route::{RouteConfig, UpstreamConfig, MAX_POLICIES_PER_ROUTE};
pub use server::{
    default_max_connections, descriptors_needed, open_files_hard_limit, AdminToken, ServerConfig,
    DEFAULT_MAX_BODY, DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_REQUESTS_PER_CONNECTION,
    DEFAULT_MAX_UPSTREAM_PER_CONNECTION, DESCRIPTOR_RESERVE,
};
pub use store::{BackendKind, KeySalt, OnError, StoreConfig, DEFAULT_MAX_LOSS};
pub use tls::{ServerTls, UpstreamCa};
pub use walk::ConfigError;
use walk::{Errors, Fields};

/// The embedded defaults used by `sluice serve` without `--config`.
pub const DEFAULT_CONFIG: &str = include_str!("default.toml");

/// The name shown for the embedded defaults.
pub const DEFAULT_SOURCE: &str = "<embedded defaults>";

/// A valid configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from.
    pub source: String,
    /// `[server]`.
    pub server: ServerConfig,
    /// `[store]`.
    pub store: StoreConfig,
    /// `[[policy]]`, in file order.
    pub policies: Vec<PolicyConfig>,
    /// `[[route]]`, in file order.
    pub routes: Vec<RouteConfig>,
    /// `[browser]`: the browser limiter the gateway serves, if any.
    pub browser: Option<BrowserConfig>,
    /// `[[rls]]`: Envoy rate-limit descriptors to policies, in file order.
    pub rls: Vec<RlsRule>,
    /// `[telemetry]`: span export over OTLP, off by default.
    pub telemetry: OtlpConfig,
    /// `[jobs]`: the job queues the dashboard and `/metrics` show, if any.
    pub jobs: Option<JobsConfig>,
}

/// A configuration file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// It could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// It is invalid; every error is listed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<ConfigError>),
}

/// Reads and validates the file at `path`.
///
/// # Errors
///
/// [`LoadError::Read`], or [`LoadError::Invalid`] with every problem found.
pub fn load(path: &Path) -> Result<Config, LoadError> {
    load_as(path, Routes::Required)
}

/// Whether a file must have a `[[route]]`: the gateway's must; one read for `sluice bundle`
/// (whose `[browser]` table alone matters) may have none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// No `[[route]]` is an error.
    Required,
    /// No `[[route]]` is fine.
    Optional,
}

/// Reads and validates the file at `path` as [`load`] does, with or without its routes.
///
/// # Errors
///
/// [`LoadError::Read`], or [`LoadError::Invalid`] with every problem found.
pub fn load_as(path: &Path, routes: Routes) -> Result<Config, LoadError> {
    let shown = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
        path: shown.clone(),
        source,
    })?;
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let offset = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let mut errors = Errors::new(&shown, &text);
            errors.at(offset, "(file)", "the file is not valid UTF-8");
            return Err(LoadError::Invalid(errors.list));
        }
    };
    parse_as(&text, &shown, routes).map_err(LoadError::Invalid)
}

/// The embedded defaults.
pub fn defaults() -> Config {
    match parse(DEFAULT_CONFIG, DEFAULT_SOURCE) {
        Ok(config) => config,
        // A test checks the embedded file; this is unreachable in a tested build.
        Err(errors) => panic!("the embedded default config is invalid: {errors:?}"),
    }
}

/// Validates `text`, read from `file`.
///
/// # Errors
///
/// Every problem, in file order.
pub fn parse(text: &str, file: &str) -> Result<Config, Vec<ConfigError>> {
    parse_as(text, file, Routes::Required)
}

/// Validates `text`, read from `file`, with or without its routes.
///
/// # Errors
///
/// Every problem, in file order.
pub fn parse_as(text: &str, file: &str, need: Routes) -> Result<Config, Vec<ConfigError>> {
    let mut errors = Errors::new(file, text);
    let (document, syntax) = DeTable::parse_recoverable(text);
    for e in &syntax {
        let offset = e.span().map_or(0, |s| s.start);
        errors.at(offset, "(syntax)", e.message().trim().to_owned());
    }
    if !syntax.is_empty() {
        errors.list.sort_by_key(|e| (e.line, e.column));
        return Err(errors.list);
    }
    let root = document.get_ref();
    let mut top = Fields::new(root, "");
    let server = match top.table("server", &mut errors) {
        Some((t, _)) => server::parse(t, &mut errors),
        None => server::parse(&DeTable::default(), &mut errors),
    };
    let store = match top.table("store", &mut errors) {
        Some((t, at)) => store::parse(t, at, &mut errors),
        None => store::parse(&DeTable::default(), 0, &mut errors),
    };
    // Policies first: routes and `[[rls]]` rules name them.
    let (policies, names) = policy::parse(
        top.array("policy", &mut errors).unwrap_or_default(),
        &mut errors,
    );
    if store.backend != BackendKind::Redis {
        for (p, l) in policies.iter().filter_map(|p| p.lease.map(|l| (p, l))) {
            errors.at(
                l.at,
                &format!("policy {}.lease", p.name),
                "leases are slices of a bucket shared through Redis: they need store.backend = \"redis\"",
            );
        }
    }
    let routes = top
        .array("route", &mut errors)
        .map(|items| route::parse(items, &names, &mut errors))
        .unwrap_or_default();
    if routes.is_empty() && errors.list.is_empty() && need == Routes::Required {
        errors.at(
            0,
            "route",
            "no [[route]]: the gateway would answer 404 to everything",
        );
    }
    let browser = top
        .table("browser", &mut errors)
        .map(|(t, _)| browser::parse(t, &mut errors));
    let rls = top
        .array("rls", &mut errors)
        .map(|items| rls::parse(items, &names, &mut errors))
        .unwrap_or_default();
    let telemetry = top
        .table("telemetry", &mut errors)
        .map(|(t, _)| otlp::parse(t, &mut errors))
        .unwrap_or_default();
    let jobs = top
        .table("jobs", &mut errors)
        .and_then(|(t, at)| jobs::parse(t, at, &store, &mut errors));
    top.finish(&mut errors);
    if errors.list.is_empty() {
        Ok(Config {
            source: file.to_owned(),
            server,
            store,
            policies,
            routes,
            browser,
            rls,
            telemetry,
            jobs,
        })
    } else {
        errors.list.sort_by_key(|e| (e.line, e.column));
        Err(errors.list)
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::Quota;

    use super::*;

    #[test]
    fn the_embedded_defaults_are_valid() {
        let c = defaults();
        assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(c.policies[0].quota, Quota::parse(10, "5/s").unwrap());
        assert_eq!(c.routes[0].upstream, UpstreamConfig::BuiltinDemo);
    }

    #[test]
    fn every_error_is_listed_with_its_line() {
        let text = r#"
[server]
listen = "nowhere"
colour = "blue"

[[policy]]
name = "api"
capacity = 0
rate = "5/s"

[[policy]]
name = "api2"
capacity = 10
rate = "NaN/s"
key = "body:x"
queue = { depth = -1, max_wait = "forever" }

[[policy]]
name = "api2"
capacity = 1.5
rate = "1/s"

[[route]]
path_prefix = "api"
policies = ["api", "nope"]
upstream = "ftp://x"
queue_max_body = "64 parsecs"
"#;
        let errors = parse(text, "t.toml").unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let expect = [
            ("t.toml:3:", "server.listen"),
            ("t.toml:4:", "server.colour"),
            ("t.toml:8:", "policy[0].capacity"),
            ("t.toml:14:", "policy[1].rate"),
            ("t.toml:15:", "policy[1].key"),
            ("t.toml:16:", "policy[1].queue.depth"),
            ("t.toml:16:", "policy[1].queue.max_wait"),
            ("t.toml:19:", "policy[2].name"),
            ("t.toml:20:", "policy[2].capacity"),
            ("t.toml:24:", "route[0].path_prefix"),
            ("t.toml:25:", "route[0].policies"),
            ("t.toml:26:", "route[0].upstream"),
            ("t.toml:27:", "route[0].queue_max_body"),
        ];
        assert_eq!(shown.len(), expect.len(), "{}", shown.join("\n"));
        assert!(shown.iter().any(|s| s.contains("unknown policy `nope`")));
        assert!(!shown.iter().any(|s| s.contains("unknown policy `api`")));
        for (line, field) in expect {
            assert!(
                shown
                    .iter()
                    .any(|s| s.starts_with(line) && s.contains(&format!(" {field}: "))),
                "missing {line} {field} in\n{}",
                shown.join("\n")
            );
        }
    }

    #[test]
    fn duplicates_and_syntax() {
        let text = "[[policy]]\nname = \"a\"\ncapacity = 1\nrate = \"1/s\"\n[[policy]]\nname = \"a\"\ncapacity = 1\nrate = \"1/s\"\n[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:1\"\n";
        let errors = parse(text, "d.toml").unwrap_err();
        assert!(errors[0].to_string().starts_with("d.toml:6:"), "{errors:?}");
        assert!(errors[0].message.contains("first defined on line 2"));
        let errors = parse("[server\nlisten = 1", "s.toml").unwrap_err();
        assert_eq!(errors[0].line, 1);
    }
}
