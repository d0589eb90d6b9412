//! What a reload changes: the settings that need a restart, and a one-line summary of the rest.

use crate::config::{Config, PolicyConfig};

/// The settings a running gateway cannot change: `[server]`'s that shape its sockets and
/// threads, `telemetry.otlp_endpoint` (the span exporter is built at start),
/// `store.key_salt` (the keys stored under the old salt would all be forgotten),
/// `store.backend` (each policy's store owns its keys' state; a reload would start them
/// afresh in another kind of store), and for the file store `store.path` and
/// `store.max_loss` (the store owns its file and its write schedule), and `[jobs]` (its
/// queues are connected and read from start).
/// The first one changed, by its config name.
pub fn needs_restart(old: &Config, new: &Config) -> Option<&'static str> {
    use crate::config::BackendKind;
    let file = old.store.backend == BackendKind::File;
    if old.store.backend != new.store.backend {
        return Some("store.backend");
    }
    if file && old.store.path != new.store.path {
        return Some("store.path");
    }
    if file && old.store.max_loss != new.store.max_loss {
        return Some("store.max_loss");
    }
    let (a, b) = (&old.server, &new.server);
    if a.listen != b.listen {
        Some("server.listen")
    } else if a.admin_listen != b.admin_listen {
        Some("server.admin_listen")
    } else if a.rls_listen != b.rls_listen {
        Some("server.rls_listen")
    } else if a.workers != b.workers {
        Some("server.workers")
    } else if old.telemetry != new.telemetry {
        // The exporter is built once, at start.
        Some("telemetry.otlp_endpoint")
    } else if old.store.key_salt != new.store.key_salt {
        // Every key stored under the old salt would be forgotten: a burst.
        Some("store.key_salt")
    } else if old.jobs != new.jobs {
        Some("[jobs]")
    } else {
        None
    }
}

/// Pushes `PREFIX` + `FIELD` onto `out` for each field that differs between `a` and `b`; the
/// field names are the config keys.
macro_rules! push_changed {
    ($out:expr, $prefix:literal, $a:expr, $b:expr, [$($field:ident),* $(,)?]) => {
        $(
            if $a.$field != $b.$field {
                $out.push(concat!($prefix, stringify!($field)).to_owned());
            }
        )*
    };
}

/// What changed from `old` to `new`, comma-separated, or `nothing`.
pub fn describe(old: &Config, new: &Config) -> String {
    let mut out: Vec<String> = Vec::new();
    let (a, b) = (&old.server, &new.server);
    push_changed!(
        out,
        "server.",
        a,
        b,
        [
            trusted_proxies,
            shutdown_timeout,
            header_read_timeout,
            max_header_bytes,
            max_body,
            request_id,
            send_timeout,
            keep_alive_timeout,
            upstream_connect_timeout,
            upstream_idle_timeout,
            upstream_read_timeout,
            max_connections,
            max_upstream_connections,
            max_upstream_per_connection,
            max_requests_per_connection,
            admin_token,
            client_body_timeout,
            h2c,
            byte_path,
        ]
    );
    // A certificate re-read from the same files counts when its chain changed.
    if a.tls != b.tls {
        out.push("server.tls".to_owned());
    }
    let (a, b) = (&old.store, &new.store);
    push_changed!(out, "store.", a, b, [backend, path]);
    // The key is `url`, a list or a single address.
    if a.urls != b.urls {
        out.push("store.url".to_owned());
    }
    push_changed!(out, "store.", a, b, [on_error, timeout, prefix]);
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
    if old.rls != new.rls {
        out.push(format!(
            "rls ({} -> {} rules)",
            old.rls.len(),
            new.rls.len()
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
    push_changed!(
        fields,
        "",
        o,
        p,
        [key, max_keys, queue, concurrency, shadow, lease, cost, plan]
    );
    plan_changes(o, p, &mut fields);
    fields
}

/// What a reload does with plans: each plan is a store of its own (`NAME@PLAN`), carried
/// over like a policy. A plan whose quota changed keeps its keys, converted in place as a
/// policy's are (memory, file) or on read (Redis): no key gains tokens. A plan added starts
/// full; a plan removed is dropped (its keys go back to the policy's own quota and bucket; in
/// the file store its file `PATH.NAME@PLAN` is closed clean and left on disk, in Redis its
/// keys expire). A change of `plan` (where the name comes from) keeps every plan's keys.
/// Per-key quotas set through the admin API (`PUT /v1/policies/NAME/keys/KEY`) are the
/// store's, not the file's: a reload keeps them, converted with their keys when the
/// algorithm changes.
fn plan_changes(o: &PolicyConfig, p: &PolicyConfig, fields: &mut Vec<String>) {
    for plan in &p.plans {
        match o.plans.iter().find(|x| x.name == plan.name) {
            None => fields.push(format!("plan {} added", plan.name)),
            Some(old) if old.quota != plan.quota => fields.push(format!(
                "plan {} {}/{} -> {}/{}",
                plan.name,
                old.quota.capacity(),
                old.quota.rate(),
                plan.quota.capacity(),
                plan.quota.rate()
            )),
            Some(_) => {}
        }
    }
    for plan in &o.plans {
        if !p.plans.iter().any(|x| x.name == plan.name) {
            fields.push(format!("plan {} removed", plan.name));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::needs_restart;
    use crate::config::parse;

    #[test]
    fn a_change_of_jobs_needs_a_restart() {
        let route = "[[route]]\npath_prefix = \"/\"\nupstream = \"http://127.0.0.1:9\"\n";
        let with = |jobs: &str| parse(&format!("{route}{jobs}"), "t.toml").unwrap();
        let mail = with("[jobs]\nredis = \"redis://127.0.0.1:6400\"\nqueues = [\"mail\"]\n");
        assert_eq!(needs_restart(&mail, &mail.clone()), None);
        for other in [
            with(""),
            with("[jobs]\nredis = \"redis://127.0.0.1:6400\"\nqueues = [\"mail\", \"embed\"]\n"),
            with("[jobs]\nredis = \"redis://127.0.0.1:6401\"\nqueues = [\"mail\"]\n"),
            with("[jobs]\nredis = \"redis://127.0.0.1:6400\"\nqueues = [\"mail\"]\ninterval = \"1s\"\n"),
        ] {
            assert_eq!(needs_restart(&mail, &other), Some("[jobs]"));
            assert_eq!(needs_restart(&other, &mail), Some("[jobs]"));
        }
    }
}
