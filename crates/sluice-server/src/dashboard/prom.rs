//! Reading back the Prometheus text that `/metrics` serves, so the dashboard shows exactly
//! the figures a scraper sees, whoever registered them (the gateway, the stores, the browser
//! telemetry).

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name, with any `_sum` / `_count` suffix.
    pub name: String,
    /// The labels, in the order written.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Every sample of `text` (the exposition format, version 0.0.4). Comments, blank lines
/// and malformed lines are skipped.
///
/// # Examples
///
/// ```
/// use sluice_server::dashboard::prom::parse;
///
/// let s = parse("# TYPE x counter\nx{policy=\"api\",reason=\"a\\\"b\"} 3\ny 1.5\n");
/// assert_eq!(s[0].label("reason"), Some("a\"b"));
/// assert_eq!((s[1].name.as_str(), s[1].value), ("y", 1.5));
/// ```
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(line).collect()
}

fn line(l: &str) -> Option<Sample> {
    let l = l.trim();
    if l.is_empty() || l.starts_with('#') {
        return None;
    }
    let name_end = l.find(['{', ' ', '\t']).unwrap_or(l.len());
    let name = &l[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &l[name_end..];
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices().peekable();
        let end = loop {
            // Skip separators.
            while let Some(&(_, c)) = chars.peek() {
                if c == ',' || c == ' ' {
                    chars.next();
                } else {
                    break;
                }
            }
            let (start, c) = *chars.peek()?;
            if c == '}' {
                break start + 1;
            }
            let eq = inner[start..].find('=')? + start;
            let key = inner[start..eq].trim().to_owned();
            while chars.peek().is_some_and(|&(i, _)| i <= eq) {
                chars.next();
            }
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                let (_, c) = chars.next()?;
                match c {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    other => value.push(other),
                }
            }
            labels.push((key, value));
        };
        rest = &inner[end..];
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        let s = parse(
            "# HELP a b\n\
             sluice_policy_denied_total{policy=\"api\",reason=\"limit\"} 41\n\
             sluice_queue_wait_seconds{limiter=\"api\",quantile=\"0.99\"} 0.25\n\
             sluice_queue_wait_seconds_count{limiter=\"api\"} 7 1700000000000\n\
             up 1\n\
             weird{a=\"x,y}\", b=\"\\\\\"} +Inf\n\
             broken{a=\"x\" 1\n\
             {a=\"x\"} 1\n",
        );
        assert_eq!(s.len(), 5, "{s:?}");
        assert_eq!(s[0].label("policy"), Some("api"));
        assert_eq!(s[0].value, 41.0);
        assert_eq!(s[1].label("quantile"), Some("0.99"));
        assert_eq!(s[2].value, 7.0);
        assert_eq!(s[3].labels, vec![]);
        assert_eq!(s[4].label("a"), Some("x,y}"));
        assert_eq!(s[4].label("b"), Some("\\"));
        assert!(s[4].value.is_infinite());
    }
}
