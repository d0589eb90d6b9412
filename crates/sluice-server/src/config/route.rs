//! `[[route]]`: which requests each route takes (path prefix, methods), the policies it
//! applies by name, and its upstream, with the TLS client config of an `https://` upstream
//! built now so that a trust store that cannot be made is an error of the file.
//!
//! Policies are known here by name only (the names `policy` found); routing requests is
//! `serve`'s.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use http::Method;
use sluice_http::path::{canonical_path, Canonical};
use sluice_http::{Protocol, Upstream};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::server::DEFAULT_MAX_BODY;
use super::tls::UpstreamCa;
use super::values::{duration, size};
use super::walk::{Errors, Fields};

/// The most policies one route may name.
pub const MAX_POLICIES_PER_ROUTE: usize = 16;

/// `route.upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamConfig {
    /// An `http://` URL.
    Url(Upstream),
    /// `builtin:demo`: the in-process demo upstream.
    BuiltinDemo,
}

/// `[[route]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    /// `path_prefix`.
    pub path_prefix: String,
    /// `methods` (empty: any).
    pub methods: Vec<Method>,
    /// `policies`, by name.
    pub policies: Vec<String>,
    /// `upstream`.
    pub upstream: UpstreamConfig,
    /// `queue_max_body`.
    pub queue_max_body: u64,
    /// `upstream_timeout`.
    pub upstream_timeout: Duration,
    /// `max_body`: this route's own limit, or `server.max_body`.
    pub max_body: Option<u64>,
    /// `upstream_ca`: the CA an `https://` upstream is verified against (else the system's).
    pub upstream_ca: Option<UpstreamCa>,
}

/// Reads the `[[route]]` array: the valid routes in file order, without two for the same
/// prefix and methods; `names` are the policies defined.
pub(super) fn parse(
    items: Vec<&Spanned<DeValue<'_>>>,
    names: &HashMap<String, usize>,
    errors: &mut Errors<'_>,
) -> Vec<RouteConfig> {
    let mut routes: Vec<(RouteConfig, usize)> = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let field = format!("route[{i}]");
        let DeValue::Table(t) = item.get_ref() else {
            errors.value(item, &field, "expected a table ([[route]])");
            continue;
        };
        if let Some((r, at)) = route(t, &field, names, errors) {
            let clash = routes.iter().find(|(other, _)| {
                other.path_prefix == r.path_prefix
                    && (other.methods.is_empty()
                        || r.methods.is_empty()
                        || other.methods.iter().any(|m| r.methods.contains(m)))
            });
            if let Some((_, first)) = clash {
                let first_line = errors.line_of(*first);
                errors.at(at, &format!("{field}.path_prefix"), format!("duplicate route for `{}` and the same methods (first defined on line {first_line})", r.path_prefix));
            } else {
                routes.push((r, at));
            }
        }
    }
    routes.into_iter().map(|(r, _)| r).collect()
}

fn route(
    t: &DeTable<'_>,
    field: &str,
    names: &HashMap<String, usize>,
    errors: &mut Errors<'_>,
) -> Option<(RouteConfig, usize)> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let table_at = t.iter().next().map_or(0, |(k, _)| k.span().start);
    let prefix = f.str("path_prefix", errors);
    if let Some((p, at)) = prefix {
        if !p.starts_with('/') {
            errors.at(
                at,
                &f.path("path_prefix"),
                format!("`{p}` must start with `/`"),
            );
        } else {
            // Requests are routed by their canonical path: a prefix in another form would
            // never match.
            match canonical_path(p) {
                Canonical::Unchanged => {}
                Canonical::Changed(c) => errors.at(
                    at,
                    &f.path("path_prefix"),
                    format!(
                        "`{p}` would never match: requests are routed by their canonical \
                         path, so write `{c}`"
                    ),
                ),
                Canonical::Ambiguous => errors.at(
                    at,
                    &f.path("path_prefix"),
                    format!(
                        "`{p}` would never match: a request path with an encoded slash or a \
                         `;` parameter next to a dot segment or another slash is refused"
                    ),
                ),
            }
        }
    } else if !t.contains_key("path_prefix") {
        errors.at(
            table_at,
            &f.path("path_prefix"),
            "a route needs a path_prefix, such as \"/api/\"",
        );
    }
    let mut methods = Vec::new();
    for (text, at) in f.strings("methods", errors).unwrap_or_default() {
        let upper = text.to_ascii_uppercase();
        if text != upper && Method::from_bytes(upper.as_bytes()).is_ok() {
            errors.at(
                at,
                &f.path("methods"),
                format!("methods are case-sensitive: `{text}` (did you mean `{upper}`?)"),
            );
            continue;
        }
        match Method::from_bytes(text.as_bytes()) {
            Ok(m) => methods.push(m),
            Err(_) => errors.at(
                at,
                &f.path("methods"),
                format!("`{text}` is not an HTTP method"),
            ),
        }
    }
    let mut policies: Vec<String> = Vec::new();
    for (name, at) in f.strings("policies", errors).unwrap_or_default() {
        if !names.contains_key(name) {
            let known: Vec<&str> = names.keys().map(String::as_str).collect();
            errors.at(
                at,
                &f.path("policies"),
                format!(
                    "unknown policy `{name}`; defined: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            );
        } else if policies.iter().any(|p| p == name) {
            errors.at(
                at,
                &f.path("policies"),
                format!("policy `{name}` is listed twice"),
            );
        } else {
            policies.push(name.to_owned());
        }
    }
    if policies.len() > MAX_POLICIES_PER_ROUTE {
        errors.at(
            table_at,
            &f.path("policies"),
            format!("at most {MAX_POLICIES_PER_ROUTE} policies per route"),
        );
    }
    let upstream = match f.str("upstream", errors) {
        Some(("builtin:demo", _)) => Some(UpstreamConfig::BuiltinDemo),
        Some((url, at)) => match url.parse::<Upstream>() {
            Ok(u) => Some(UpstreamConfig::Url(u)),
            Err(e) => {
                errors.at(
                    at,
                    &f.path("upstream"),
                    format!("{e} (or use \"builtin:demo\")"),
                );
                None
            }
        },
        None => {
            if !t.contains_key("upstream") {
                errors.at(
                    table_at,
                    &f.path("upstream"),
                    "a route needs an upstream, such as \"http://127.0.0.1:9000\"",
                );
            }
            None
        }
    };
    let upstream_ca = match f.str("upstream_ca", errors) {
        None => None,
        Some((path, at)) => match &upstream {
            Some(UpstreamConfig::Url(u)) if u.protocol() != Protocol::Https => {
                errors.at(
                    at,
                    &f.path("upstream_ca"),
                    format!(
                        "`{path}`: upstream_ca applies to https:// upstreams only, and this \
                         route's upstream is `{u}`"
                    ),
                );
                None
            }
            Some(UpstreamConfig::BuiltinDemo) => {
                errors.at(
                    at,
                    &f.path("upstream_ca"),
                    format!("`{path}`: upstream_ca applies to https:// upstreams only, and this route's upstream is builtin:demo"),
                );
                None
            }
            _ => match UpstreamCa::load(Path::new(path)) {
                Ok(ca) => Some(ca),
                Err(message) => {
                    errors.at(at, &f.path("upstream_ca"), message);
                    None
                }
            },
        },
    };
    // An https:// upstream gets its TLS config now: a trust store that cannot be made is
    // an error of this configuration.
    let upstream = match upstream {
        Some(UpstreamConfig::Url(u)) if u.protocol() == Protocol::Https => {
            let roots = upstream_ca.as_ref().map(|ca| ca.certs.as_slice());
            match sluice_http::proxy::client_config(roots) {
                Ok(tls) => Some(UpstreamConfig::Url(u.with_tls(tls))),
                Err(e) => {
                    let at = t.get("upstream").map_or(table_at, |v| v.span().start);
                    errors.at(at, &f.path("upstream"), format!("`{u}`: {e}"));
                    None
                }
            }
        }
        other => other,
    };
    let queue_max_body = size(&mut f, "queue_max_body", 64 * 1024, errors);
    let max_body = f
        .get("max_body")
        .is_some()
        .then(|| size(&mut f, "max_body", DEFAULT_MAX_BODY, errors));
    let upstream_timeout = duration(&mut f, "upstream_timeout", Duration::from_secs(30), errors);
    if upstream_timeout.is_zero() {
        errors.at(
            table_at,
            &f.path("upstream_timeout"),
            "must be greater than zero",
        );
    }
    f.finish(errors);
    if errors.list.len() > before {
        return None;
    }
    let (prefix, at) = prefix?;
    Some((
        RouteConfig {
            path_prefix: prefix.to_owned(),
            methods,
            policies,
            upstream: upstream?,
            queue_max_body,
            upstream_timeout,
            max_body,
            upstream_ca,
        },
        at,
    ))
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    /// Requests are routed by their canonical path, so a prefix in another form is refused
    /// with the form to write.
    #[test]
    fn path_prefixes_must_be_canonical() {
        let route = |prefix: &str| {
            format!("[[route]]\npath_prefix = \"{prefix}\"\nupstream = \"http://127.0.0.1:1\"\n")
        };
        for ok in ["/", "/api/", "/api", "/files/a%2Fb/"] {
            assert!(parse(&route(ok), "p.toml").is_ok(), "{ok}");
        }
        for (bad, hint) in [
            ("/api//", "write `/api/`"),
            ("/./api/", "write `/api/`"),
            ("/%61pi/", "write `/api/`"),
            ("/v1/../api/", "write `/api/`"),
            ("/a/..%2F", "encoded slash"),
        ] {
            let errors = parse(&route(bad), "p.toml").unwrap_err();
            assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
            let shown = errors[0].to_string();
            assert!(
                shown.starts_with("p.toml:2:") && shown.contains("route[0].path_prefix"),
                "{shown}"
            );
            assert!(shown.contains(hint), "{bad}: {shown}");
        }
    }
}
