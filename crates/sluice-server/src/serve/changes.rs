//! What a reload changes: the settings that need a restart, and a one-line summary of the rest.

use crate::config::{Config, PolicyConfig};

/// The settings a running gateway cannot change: `[server]`'s that shape its sockets and
/// threads, and `store.key_salt` (the keys stored under the old salt would all be forgotten).
/// The first one changed, by its config name.
pub fn needs_restart(old: &Config, new: &Config) -> Option<&'static str> {
    let (a, b) = (&old.server, &new.server);
    if a.listen != b.listen {
        Some("server.listen")
    } else if a.admin_listen != b.admin_listen {
        Some("server.admin_listen")
    } else if a.workers != b.workers {
        Some("server.workers")
    } else if old.store.key_salt != new.store.key_salt {
        // Every key stored under the old salt would be forgotten: a burst.
        Some("store.key_salt")
    } else {
        None
    }
}

/// What changed from `old` to `new`, comma-separated, or `nothing`.
pub fn describe(old: &Config, new: &Config) -> String {
    let mut out: Vec<String> = Vec::new();
    let (a, b) = (&old.server, &new.server);
    for (changed, name) in [
        (
            a.trusted_proxies != b.trusted_proxies,
            "server.trusted_proxies",
        ),
        (
            a.shutdown_timeout != b.shutdown_timeout,
            "server.shutdown_timeout",
        ),
        (
            a.header_read_timeout != b.header_read_timeout,
            "server.header_read_timeout",
        ),
        (
            a.max_header_bytes != b.max_header_bytes,
            "server.max_header_bytes",
        ),
        (a.max_body != b.max_body, "server.max_body"),
        (a.request_id != b.request_id, "server.request_id"),
        (a.send_timeout != b.send_timeout, "server.send_timeout"),
        (
            a.keep_alive_timeout != b.keep_alive_timeout,
            "server.keep_alive_timeout",
        ),
        (
            a.upstream_connect_timeout != b.upstream_connect_timeout,
            "server.upstream_connect_timeout",
        ),
        (
            a.upstream_idle_timeout != b.upstream_idle_timeout,
            "server.upstream_idle_timeout",
        ),
        (
            a.max_connections != b.max_connections,
            "server.max_connections",
        ),
        (a.admin_token != b.admin_token, "server.admin_token"),
        (
            a.client_body_timeout != b.client_body_timeout,
            "server.client_body_timeout",
        ),
    ] {
        if changed {
            out.push(name.to_owned());
        }
    }
    let (a, b) = (&old.store, &new.store);
    for (changed, name) in [
        (a.backend != b.backend, "store.backend"),
        (a.path != b.path, "store.path"),
        (a.urls != b.urls, "store.url"),
        (a.on_error != b.on_error, "store.on_error"),
        (a.timeout != b.timeout, "store.timeout"),
        (a.prefix != b.prefix, "store.prefix"),
    ] {
        if changed {
            out.push(name.to_owned());
        }
    }
    for p in &new.policies {
        match old.policies.iter().find(|o| o.name == p.name) {
            None => out.push(format!("policy {} added", p.name)),
            Some(o) => {
                let fields = policy_changes(o, p);
                if !fields.is_empty() {
                    out.push(format!("policy {} ({})", p.name, fields.join("; ")));
                }
            }
        }
    }
    for o in &old.policies {
        if !new.policies.iter().any(|p| p.name == o.name) {
            out.push(format!("policy {} removed", o.name));
        }
    }
    if old.routes != new.routes {
        out.push(format!(
            "routes ({} -> {})",
            old.routes.len(),
            new.routes.len()
        ));
    }
    if old.browser != new.browser {
        out.push(String::from("browser"));
    }
    if out.is_empty() {
        String::from("nothing")
    } else {
        out.join(", ")
    }
}

fn policy_changes(o: &PolicyConfig, p: &PolicyConfig) -> Vec<String> {
    let mut fields = Vec::new();
    if o.algorithm != p.algorithm {
        fields.push(format!("algorithm {} -> {}", o.algorithm, p.algorithm));
    }
    if o.quota.capacity() != p.quota.capacity() {
        fields.push(format!(
            "capacity {} -> {}",
            o.quota.capacity(),
            p.quota.capacity()
        ));
    }
    if o.quota.rate() != p.quota.rate() {
        fields.push(format!("rate {} -> {}", o.quota.rate(), p.quota.rate()));
    }
    for (changed, name) in [
        (o.key != p.key, "key"),
        (o.max_keys != p.max_keys, "max_keys"),
        (o.queue != p.queue, "queue"),
        (o.concurrency != p.concurrency, "concurrency"),
    ] {
        if changed {
            fields.push(name.to_owned());
        }
    }
    fields
}
