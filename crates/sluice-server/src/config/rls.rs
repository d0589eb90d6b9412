//! `[[rls]]`: which policy decides an Envoy rate-limit descriptor (see `crate::rls`).
//!
//! ```toml
//! [[rls]]
//! domain = "edge"
//! match = [{ key = "remote_address" }, { key = "path", value = "/api/search" }]
//! policy = "search"
//! ```
//!
//! A rule matches a descriptor of its `domain` whose entries are, in order and as many, the
//! `match` entries: the same keys, and the same values where a `value` is given. The values
//! of the entries without one make the policy's key. Rules are tried in file order.
//!
//! With `on_stream_done = true`, the rule's descriptors are the ones Envoy sends once a
//! stream is done (`apply_on_stream_done`), carrying what the request really cost in
//! `hits_addend` (an LLM answer's tokens, say): they are charged, never refused.

use std::collections::HashMap;

use toml::de::{DeTable, DeValue};

use super::walk::{Errors, Fields};

/// One `match` entry: a descriptor entry's key, and its value when fixed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsEntry {
    /// `key`.
    pub key: String,
    /// `value`: `None` matches any value, which then goes into the policy's key.
    pub value: Option<String>,
}

/// `[[rls]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RlsRule {
    /// `domain`.
    pub domain: String,
    /// `match`, in order.
    pub entries: Vec<RlsEntry>,
    /// `policy`, by name.
    pub policy: String,
    /// `on_stream_done`: the rule matches the descriptors Envoy sends when a stream is done
    /// (`apply_on_stream_done`), whose `hits_addend` is what the request really cost: they
    /// are charged whatever the key has left, never refused.
    pub on_stream_done: bool,
}

/// Reads the `[[rls]]` array; `names` are the policies defined.
pub(crate) fn parse(
    items: Vec<&toml::Spanned<DeValue<'_>>>,
    names: &HashMap<String, usize>,
    errors: &mut Errors<'_>,
) -> Vec<RlsRule> {
    let mut rules = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let field = format!("rls[{i}]");
        let DeValue::Table(t) = item.get_ref() else {
            errors.value(item, &field, "expected a table ([[rls]])");
            continue;
        };
        if let Some(rule) = rule(t, item.span().start, &field, names, errors) {
            rules.push(rule);
        }
    }
    rules
}

fn rule(
    t: &DeTable<'_>,
    table_at: usize,
    field: &str,
    names: &HashMap<String, usize>,
    errors: &mut Errors<'_>,
) -> Option<RlsRule> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let domain = match f.str("domain", errors) {
        Some(("", at)) => {
            errors.at(at, &f.path("domain"), "must not be empty");
            None
        }
        Some((d, _)) => Some(d.to_owned()),
        None => {
            if !t.contains_key("domain") {
                errors.at(
                    table_at,
                    &f.path("domain"),
                    "an rls rule needs a domain, as Envoy's rate_limit filter sends it",
                );
            }
            None
        }
    };
    let mut entries = Vec::new();
    let match_at = f.get("match").map_or(table_at, |v| v.span().start);
    match f.array("match", errors) {
        Some(items) if items.is_empty() => errors.at(
            match_at,
            &f.path("match"),
            "`[]` is empty: list the descriptor's entries, as in match = [{ key = \"remote_address\" }]",
        ),
        Some(items) => {
            for (j, item) in items.into_iter().enumerate() {
                let path = format!("{field}.match[{j}]");
                let DeValue::Table(e) = item.get_ref() else {
                    errors.value(
                        item,
                        &path,
                        format!(
                            "expected a table such as {{ key = \"remote_address\" }}, found {}",
                            item.get_ref().type_str()
                        ),
                    );
                    continue;
                };
                let mut ef = Fields::new(e, path.clone());
                let key = match ef.str("key", errors) {
                    Some(("", at)) => {
                        errors.at(at, &ef.path("key"), "must not be empty");
                        None
                    }
                    Some((k, _)) => Some(k.to_owned()),
                    None => {
                        if !e.contains_key("key") {
                            errors.value(item, &ef.path("key"), "a match entry needs a key");
                        }
                        None
                    }
                };
                let value = ef.str("value", errors).map(|(v, _)| v.to_owned());
                ef.finish(errors);
                if let Some(key) = key {
                    entries.push(RlsEntry { key, value });
                }
            }
        }
        None => {
            if !t.contains_key("match") {
                errors.at(
                    table_at,
                    &f.path("match"),
                    "an rls rule needs a match, as in match = [{ key = \"remote_address\" }]",
                );
            }
        }
    }
    let policy = match f.str("policy", errors) {
        Some((name, at)) if !names.contains_key(name) => {
            let mut known: Vec<&str> = names.keys().map(String::as_str).collect();
            known.sort_unstable();
            errors.at(
                at,
                &f.path("policy"),
                format!(
                    "unknown policy `{name}`; defined: {}",
                    if known.is_empty() {
                        "none".to_owned()
                    } else {
                        known.join(", ")
                    }
                ),
            );
            None
        }
        Some((name, _)) => Some(name.to_owned()),
        None => {
            if !t.contains_key("policy") {
                errors.at(table_at, &f.path("policy"), "an rls rule needs a policy");
            }
            None
        }
    };
    let on_stream_done = super::values::boolean(&mut f, "on_stream_done", false, errors);
    f.finish(errors);
    if errors.list.len() > before {
        return None;
    }
    Some(RlsRule {
        domain: domain?,
        entries,
        policy: policy?,
        on_stream_done,
    })
}
