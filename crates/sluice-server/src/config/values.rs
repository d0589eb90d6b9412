//! The typed readers the sections share: durations, sizes and booleans taken from a table's
//! `Fields`, with an error naming the field when a value does not fit. The text forms are
//! `units`'s and the walk is `walk`'s; no section's own rules belong here.

use std::time::Duration;

use toml::de::DeValue;

use super::units;
use super::walk::{self, Errors, Fields};

/// A duration such as `10s`; `default` when the key is absent or its value unreadable.
pub(super) fn duration(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: Duration,
    errors: &mut Errors<'_>,
) -> Duration {
    match fields.str(key, errors) {
        Some((text, at)) => match units::parse_duration(text) {
            Ok(d) => d,
            Err(message) => {
                errors.at(at, &fields.path(key), message);
                default
            }
        },
        None => default,
    }
}

/// A duration that must be greater than zero.
pub(super) fn positive_duration(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: Duration,
    errors: &mut Errors<'_>,
) -> Duration {
    let at = fields.get(key).map_or(0, |v| v.span().start);
    let d = duration(fields, key, default, errors);
    if d.is_zero() {
        errors.at(at, &fields.path(key), "must be greater than zero");
        return default;
    }
    d
}

/// A size such as `64KiB`, or a whole number of bytes; `default` when the key is absent or
/// its value unreadable.
pub(super) fn size(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: u64,
    errors: &mut Errors<'_>,
) -> u64 {
    let Some(value) = fields.get(key) else {
        return default;
    };
    let field = fields.path(key);
    match value.get_ref() {
        DeValue::String(text) => units::parse_size(text).unwrap_or_else(|message| {
            errors.value(value, &field, message);
            default
        }),
        DeValue::Integer(_) => walk::uint_value(value, &field, errors).unwrap_or(default),
        other => {
            errors.value(
                value,
                &field,
                format!(
                    "expected a size such as `64KiB`, found {}",
                    other.type_str()
                ),
            );
            default
        }
    }
}

/// `true` or `false`.
pub(super) fn boolean(
    fields: &mut Fields<'_, '_>,
    key: &'static str,
    default: bool,
    errors: &mut Errors<'_>,
) -> bool {
    let field = fields.path(key);
    match fields.get(key) {
        None => default,
        Some(value) => match value.get_ref() {
            DeValue::Boolean(b) => *b,
            other => {
                errors.value(
                    value,
                    &field,
                    format!("expected true or false, found {}", other.type_str()),
                );
                default
            }
        },
    }
}
