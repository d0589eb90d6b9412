//! `[telemetry]`: where the gateway exports its request spans (OTLP/HTTP), off by default.

use toml::de::DeTable;

use super::walk::{Errors, Fields};

/// `[telemetry]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtlpConfig {
    /// `otlp_endpoint`: the base URL of an OTLP/HTTP collector (`http://` or `https://`, no
    /// query); spans are POSTed to `<endpoint>/v1/traces`. `None`: nothing is exported.
    pub otlp_endpoint: Option<String>,
}

impl OtlpConfig {
    /// The URL spans are POSTed to: the endpoint with `/v1/traces` after its path.
    pub fn traces_url(&self) -> Option<String> {
        self.otlp_endpoint
            .as_deref()
            .map(|e| format!("{}/v1/traces", e.trim_end_matches('/')))
    }
}

pub(super) fn parse(t: &DeTable<'_>, errors: &mut Errors<'_>) -> OtlpConfig {
    let mut f = Fields::new(t, "telemetry");
    let otlp_endpoint = f
        .str("otlp_endpoint", errors)
        .and_then(|(text, at)| match check_endpoint(text) {
            Ok(()) => Some(text.to_owned()),
            Err(why) => {
                errors.at(at, "telemetry.otlp_endpoint", format!("`{text}` {why}"));
                None
            }
        });
    f.finish(errors);
    OtlpConfig { otlp_endpoint }
}

/// An `http://` or `https://` URL with a host, and no query or fragment (the exporter adds
/// `/v1/traces` after its path).
fn check_endpoint(text: &str) -> Result<(), &'static str> {
    let Ok(uri) = text.parse::<http::Uri>() else {
        return Err(
            "is not a URL: expected the collector's base URL, such as `http://127.0.0.1:4318`",
        );
    };
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(_) => return Err("has a scheme other than http:// or https:// (OTLP/HTTP only)"),
        None => {
            return Err(
                "has no scheme: expected http:// or https://, such as `http://127.0.0.1:4318`",
            )
        }
    }
    match uri.authority() {
        Some(a) if !a.host().is_empty() => {}
        _ => return Err("has no host"),
    }
    if uri.query().is_some() || text.contains('#') {
        return Err("has a query or fragment: give the base URL only");
    }
    if text.contains('@') {
        return Err("carries user information: give the base URL only");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_endpoint;

    #[test]
    fn endpoints() {
        for ok in [
            "http://127.0.0.1:4318",
            "https://collector.example:4318",
            "http://[::1]:4318/",
            "http://otel/base",
        ] {
            assert_eq!(check_endpoint(ok), Ok(()), "{ok}");
        }
        for bad in [
            "127.0.0.1:4318",
            "grpc://127.0.0.1:4317",
            "http://",
            "http://h:4318/?x=1",
            "http://h:4318/#x",
            "http://u:p@h:4318",
            "not a url",
            "",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
    }
}
