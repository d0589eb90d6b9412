//! Walking a parsed TOML document with spans, collecting every error with its line.

use std::borrow::Cow;
use std::fmt;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// One problem in a configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file name as given.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The field, as a path: `policy[1].rate`, `server.listen`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file, self.line, self.column, self.field, self.message
        )
    }
}

/// Collects errors while the document is walked.
pub(crate) struct Errors<'a> {
    file: &'a str,
    line_starts: Vec<usize>,
    pub(crate) list: Vec<ConfigError>,
}

impl<'a> Errors<'a> {
    pub(crate) fn new(file: &'a str, text: &str) -> Errors<'a> {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Errors {
            file,
            line_starts,
            list: Vec::new(),
        }
    }

    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.line_starts
            .partition_point(|&start| start <= offset)
            .max(1)
    }

    pub(crate) fn at(&mut self, offset: usize, field: &str, message: impl Into<String>) {
        let line = self.line_starts.partition_point(|&start| start <= offset);
        let column = offset - self.line_starts[line.saturating_sub(1)] + 1;
        self.list.push(ConfigError {
            file: self.file.to_owned(),
            line: line.max(1),
            column,
            field: field.to_owned(),
            message: message.into(),
        });
    }

    pub(crate) fn value<T>(&mut self, value: &Spanned<T>, field: &str, message: impl Into<String>) {
        self.at(value.span().start, field, message);
    }
}

/// A table being read: fields are taken one by one, and whatever is left is unknown.
pub(crate) struct Fields<'t, 'i> {
    table: &'t DeTable<'i>,
    path: String,
    taken: Vec<&'static str>,
}

/// The path of field `key` in table `path`. A key that is not bare (empty, or with a
/// character other than `A-Z a-z 0-9 _ -`) is quoted, as TOML writes it, so that the path
/// names it: `""`, `server."a b"`, `server."x.y"`.
pub(crate) fn join(path: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let key: Cow<'_, str> = if bare {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("{key:?}"))
    };
    if path.is_empty() {
        key.into_owned()
    } else {
        format!("{path}.{key}")
    }
}

impl<'t, 'i> Fields<'t, 'i> {
    pub(crate) fn new(table: &'t DeTable<'i>, path: impl Into<String>) -> Fields<'t, 'i> {
        Fields {
            table,
            path: path.into(),
            taken: Vec::new(),
        }
    }

    pub(crate) fn path(&self, key: &str) -> String {
        join(&self.path, key)
    }

    /// Takes `key`, if present.
    pub(crate) fn get(&mut self, key: &'static str) -> Option<&'t Spanned<DeValue<'i>>> {
        if !self.taken.contains(&key) {
            self.taken.push(key);
        }
        self.table.get(key)
    }

    /// Reports every key not taken, suggesting the known ones.
    pub(crate) fn finish(self, errors: &mut Errors<'_>) {
        for (key, _) in self.table.iter() {
            let name: &Cow<'_, str> = key.get_ref();
            if !self.taken.iter().any(|t| *t == name.as_ref()) {
                let known = self.taken.join(", ");
                errors.at(
                    key.span().start,
                    &join(&self.path, name),
                    format!("unknown key `{name}`; expected one of: {known}"),
                );
            }
        }
    }

    pub(crate) fn str(
        &mut self,
        key: &'static str,
        errors: &mut Errors<'_>,
    ) -> Option<(&'t str, usize)> {
        let value = self.get(key)?;
        match value.get_ref() {
            DeValue::String(s) => Some((s.as_ref(), value.span().start)),
            other => {
                errors.value(
                    value,
                    &self.path(key),
                    format!("expected a string, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// A non-negative whole number.
    pub(crate) fn uint(
        &mut self,
        key: &'static str,
        errors: &mut Errors<'_>,
    ) -> Option<(u64, usize)> {
        let value = self.get(key)?;
        let field = self.path(key);
        uint_value(value, &field, errors).map(|n| (n, value.span().start))
    }

    pub(crate) fn array(
        &mut self,
        key: &'static str,
        errors: &mut Errors<'_>,
    ) -> Option<Vec<&'t Spanned<DeValue<'i>>>> {
        let value = self.get(key)?;
        match value.get_ref() {
            DeValue::Array(items) => Some(items.iter().collect()),
            other => {
                errors.value(
                    value,
                    &self.path(key),
                    format!("expected an array, found {}", other.type_str()),
                );
                None
            }
        }
    }

    /// An array of strings, each with its offset.
    pub(crate) fn strings(
        &mut self,
        key: &'static str,
        errors: &mut Errors<'_>,
    ) -> Option<Vec<(&'t str, usize)>> {
        let items = self.array(key, errors)?;
        let field = self.path(key);
        let mut out = Vec::with_capacity(items.len());
        for (i, item) in items.into_iter().enumerate() {
            match item.get_ref() {
                DeValue::String(s) => out.push((s.as_ref(), item.span().start)),
                other => errors.value(
                    item,
                    &format!("{field}[{i}]"),
                    format!("expected a string, found {}", other.type_str()),
                ),
            }
        }
        Some(out)
    }

    pub(crate) fn table(
        &mut self,
        key: &'static str,
        errors: &mut Errors<'_>,
    ) -> Option<(&'t DeTable<'i>, usize)> {
        let value = self.get(key)?;
        match value.get_ref() {
            DeValue::Table(t) => Some((t, value.span().start)),
            other => {
                errors.value(
                    value,
                    &self.path(key),
                    format!("expected a table, found {}", other.type_str()),
                );
                None
            }
        }
    }
}

pub(crate) fn uint_value(
    value: &Spanned<DeValue<'_>>,
    field: &str,
    errors: &mut Errors<'_>,
) -> Option<u64> {
    match value.get_ref() {
        DeValue::Integer(i) => {
            let digits = i.as_str().replace('_', "");
            if digits.starts_with('-') {
                errors.value(value, field, format!("must not be negative, got {i}"));
                return None;
            }
            let digits = digits.trim_start_matches('+');
            match u64::from_str_radix(digits, i.radix()) {
                Ok(n) => Some(n),
                Err(_) => {
                    errors.value(value, field, format!("{i} is too large"));
                    None
                }
            }
        }
        DeValue::Float(f) => {
            errors.value(
                value,
                field,
                format!("expected a whole number, found the float {f}"),
            );
            None
        }
        other => {
            errors.value(
                value,
                field,
                format!("expected a whole number, found {}", other.type_str()),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    #[test]
    fn an_unknown_key_that_is_not_bare_is_named_as_toml_writes_it() {
        // An empty key, or one with a space or a dot, would make an empty or misleading field.
        let text = "\"\" = 1\n[server]\n\"a b\" = 2\n\"x.y\" = 3\nok_key-2 = 4\n";
        let errors = parse(text, "t.toml").unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "\"\"",
                "server.\"a b\"",
                "server.\"x.y\"",
                "server.ok_key-2"
            ],
            "{errors:?}"
        );
    }
}
