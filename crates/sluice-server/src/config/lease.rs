//! `[[policy]] lease = { max = "5%", ttl = "100ms", min = 1 }`: the policy's keys are spent in
//! slices leased from Redis (see `sluice::store::RedisStore`'s leases), one round trip per
//! slice rather than per request.
//!
//! Owns the parsing and checks of the `lease` table; the policy decides whether one may be
//! given (a bucket algorithm) and the configuration whether the store can (Redis).

use std::time::Duration;

use sluice::store::{LeaseConfig, LeaseSize};
use toml::de::{DeTable, DeValue};

use crate::config::units;
use crate::config::walk::{Errors, Fields};

/// The bounds of `lease.ttl`: below, slices would be taken nearly per request; above, a
/// crashed gateway's slice would be lost to everyone for too long.
const TTL_RANGE: (Duration, Duration) = (Duration::from_millis(10), Duration::from_secs(60));

/// A policy's `lease`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSpec {
    /// The slices, as the store takes them.
    pub config: LeaseConfig,
    /// Where the table starts, for errors found later (the store is not Redis).
    pub at: usize,
}

/// Reads the `lease` table of a policy.
pub(crate) fn lease(
    t: &DeTable<'_>,
    at: usize,
    field: String,
    errors: &mut Errors<'_>,
) -> Option<LeaseSpec> {
    let before = errors.list.len();
    let mut f = Fields::new(t, field);
    let max = match f.get("max") {
        None => {
            errors.at(
                at,
                &f.path("max"),
                "a lease needs a max, as in lease = { max = \"5%\", ttl = \"100ms\" }",
            );
            None
        }
        Some(value) => {
            let path = f.path("max");
            match value.get_ref() {
                DeValue::Integer(i) => match i.as_str().replace('_', "").parse::<u64>() {
                    Ok(n) if n >= 1 => Some(LeaseSize::Tokens(n)),
                    _ => {
                        errors.value(value, &path, format!("expected a whole number of tokens of at least 1, or a share such as \"5%\", got {}", i.as_str()));
                        None
                    }
                },
                DeValue::String(s) => match percent(s) {
                    Some(basis) => Some(LeaseSize::Basis(basis)),
                    None => {
                        errors.value(value, &path, format!("expected a share of the capacity between 0.01% and 100%, such as \"5%\", got `{s}`"));
                        None
                    }
                },
                other => {
                    errors.value(
                        value,
                        &path,
                        format!(
                            "expected tokens (a number) or a share (\"5%\"), found {}",
                            other.type_str()
                        ),
                    );
                    None
                }
            }
        }
    };
    let ttl = match f.str("ttl", errors) {
        None => Duration::from_millis(100),
        Some((text, at)) => match units::parse_duration(text) {
            Ok(d) if d >= TTL_RANGE.0 && d <= TTL_RANGE.1 => d,
            Ok(d) => {
                errors.at(
                    at,
                    &f.path("ttl"),
                    format!("must be between 10ms and 60s, got {d:?}"),
                );
                Duration::from_millis(100)
            }
            Err(message) => {
                errors.at(at, &f.path("ttl"), message);
                Duration::from_millis(100)
            }
        },
    };
    let min = match f.uint("min", errors) {
        None => 1,
        Some((0, at)) => {
            errors.at(at, &f.path("min"), "must be at least 1");
            1
        }
        Some((n, at)) => {
            if let Some(LeaseSize::Tokens(max)) = max {
                if n > max {
                    errors.at(
                        at,
                        &f.path("min"),
                        format!("must be at most max ({max}), got {n}"),
                    );
                }
            }
            n
        }
    };
    f.finish(errors);
    if errors.list.len() > before {
        return None;
    }
    Some(LeaseSpec {
        config: LeaseConfig {
            max: max?,
            min,
            ttl,
        },
        at,
    })
}

/// `"5%"`, `"2.5%"`, `"0.01%"` in hundredths of a percent (1 to 10,000).
fn percent(text: &str) -> Option<u32> {
    let number = text.trim().strip_suffix('%')?.trim();
    let (whole, fraction) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if whole.is_empty()
        || fraction.len() > 2
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u32 = whole.parse().ok()?;
    let mut hundredths: u32 = if fraction.is_empty() {
        0
    } else {
        format!("{fraction:0<2}").parse().ok()?
    };
    hundredths += whole.checked_mul(100)?;
    (1..=10_000).contains(&hundredths).then_some(hundredths)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_read_and_one_the_store_or_algorithm_cannot_keep_is_named_with_its_line() {
        let redis = "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n";
        let policy = |algorithm: &str, lease: &str| {
            format!("[[policy]]\nname = \"p\"\nalgorithm = \"{algorithm}\"\ncapacity = 1000\nrate = \"100/s\"\nlease = {lease}\n[[route]]\npath_prefix = \"/\"\npolicies = [\"p\"]\nupstream = \"http://127.0.0.1:1\"\n")
        };
        let c = crate::config::parse(
            &format!(
                "{redis}{}",
                policy("gcra", "{ max = \"5%\", ttl = \"200ms\", min = 2 }")
            ),
            "t.toml",
        )
        .unwrap();
        let spec = c.policies[0].lease.unwrap();
        assert_eq!(spec.config.max.tokens(1000), 50);
        assert_eq!(
            (spec.config.min, spec.config.ttl),
            (2, Duration::from_millis(200))
        );
        let errors = |text: String| {
            crate::config::parse(&text, "t.toml")
                .unwrap_err()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n")
        };
        let e = errors(policy("gcra", "{ max = \"5%\" }"));
        assert!(
            e.contains(":6:") && e.contains("need store.backend = \"redis\""),
            "{e}"
        );
        let e = errors(format!("{redis}{}", policy("fixed_window", "{ max = 10 }")));
        assert!(
            e.contains(":9:") && e.contains("fixed_window keeps none"),
            "{e}"
        );
        let e = errors(format!(
            "{redis}{}",
            policy("gcra", "{ max = \"150%\", ttl = \"5ms\" }")
        ));
        assert!(
            e.contains("policy[0].lease.max") && e.contains("150%"),
            "{e}"
        );
        assert!(
            e.contains("policy[0].lease.ttl") && e.contains("between 10ms and 60s"),
            "{e}"
        );
        let e = errors(format!(
            "{redis}{}",
            policy("gcra", "{ ttl = \"1s\", size = 3 }")
        ));
        assert!(
            e.contains("a lease needs a max") && e.contains("unknown key `size`"),
            "{e}"
        );
    }

    #[test]
    fn shares_are_read_in_hundredths_of_a_percent() {
        assert_eq!(percent("5%"), Some(500));
        assert_eq!(percent("2.5%"), Some(250));
        assert_eq!(percent("0.01%"), Some(1));
        assert_eq!(percent("100%"), Some(10_000));
        for bad in ["0%", "101%", "5", "%", "1.234%", "-1%", "a%"] {
            assert_eq!(percent(bad), None, "{bad}");
        }
    }
}
