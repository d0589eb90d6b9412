//! The gateway's TOML configuration: `sluice_server::config::parse`, the units it reads
//! (`parse_duration`, `parse_size`), and building a runtime from whatever it accepts.
//!
//! Properties: no panic; every error names its file, a field and a line of the input, and
//! the list is in file order; an accepted config keeps the promises the reference makes (rates
//! that print and read back the same, canonical route prefixes, key specs that read back) and
//! builds (with `dry`, so no file is created, and a memory store standing in for Redis).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use sluice_core::{format_duration_ns, Rate};
use sluice_http::path::{canonical_path, Canonical};
use sluice_http::KeySpec;
use sluice_server::config::units::{parse_duration, parse_size};
use sluice_server::config::{self, BackendKind};
use sluice_server::runtime::build::build_with;

const FILE: &str = "fuzz.toml";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    units(text);
    match config::parse(text, FILE) {
        Ok(config) => accepted(config),
        Err(errors) => refused(text, &errors),
    }
});

/// A duration or size read back from its own rendering is the same value.
fn units(text: &str) {
    if let Ok(d) = parse_duration(text) {
        if let Ok(ns) = u64::try_from(d.as_nanos()) {
            let shown = format_duration_ns(ns);
            assert_eq!(parse_duration(&shown), Ok(d), "{text:?} -> {shown:?}");
        }
    }
    if let Ok(n) = parse_size(text) {
        assert_eq!(parse_size(&n.to_string()), Ok(n), "{text:?}");
    }
}

fn refused(text: &str, errors: &[config::ConfigError]) {
    assert!(
        !errors.is_empty(),
        "a refused config names at least one error"
    );
    let lines = text.matches('\n').count() + 1;
    for e in errors {
        assert_eq!(e.file, FILE);
        assert!(!e.field.is_empty(), "an error names its field: {e:?}");
        assert!(
            !e.message.trim().is_empty(),
            "an error says what is wrong: {e:?}"
        );
        assert!(
            (1..=lines).contains(&e.line),
            "line {} of {lines}: {e:?}",
            e.line
        );
        assert!(e.column >= 1, "{e:?}");
        let shown = e.to_string();
        let head = format!("{FILE}:{}:{}: {}: ", e.line, e.column, e.field);
        assert!(shown.starts_with(&head), "{shown:?}");
    }
    assert!(
        errors
            .windows(2)
            .all(|w| (w[0].line, w[0].column) <= (w[1].line, w[1].column)),
        "errors are in file order: {errors:?}"
    );
}

fn accepted(mut config: config::Config) {
    assert_eq!(config.source, FILE);
    assert_ne!(config.server.listen, config.server.admin_listen);
    assert!(!config.routes.is_empty());
    for p in &config.policies {
        assert!(p.quota.capacity() >= 1);
        let rate = p.quota.rate();
        assert_eq!(
            rate.to_string().parse::<Rate>(),
            Ok(rate),
            "policy {}",
            p.name
        );
        let spec = p.key.to_string();
        assert_eq!(spec.parse::<KeySpec>().as_ref(), Ok(&p.key), "{spec}");
        assert!((1..=64).contains(&p.name.len()), "{:?}", p.name);
    }
    for r in &config.routes {
        assert_eq!(
            canonical_path(&r.path_prefix),
            Canonical::Unchanged,
            "route prefixes are canonical: {:?}",
            r.path_prefix
        );
        for name in &r.policies {
            assert!(
                config.policies.iter().any(|p| &p.name == name),
                "a route names only policies that exist: {name:?}"
            );
        }
    }
    // Redis would be dialled; the policies are built the same way over memory.
    if config.store.backend == BackendKind::Redis {
        config.store.backend = BackendKind::Memory;
    }
    let _enter = runtime().enter();
    if let Err(e) = build_with(config, None, None, true) {
        panic!("a config that parses must build: {e}");
    }
}
