//! Secrets the configuration names rather than holds: `env:NAME` or `file:/path`, read when
//! the file is loaded. `server.admin_token` and `store.key_salt` come through here; what they
//! may contain is checked by their own sections.

/// Reads a secret named `env:NAME` or `file:/path` (a file's trailing newline is not part
/// of it); `what` names it in the errors.
pub(super) fn read_secret(source: &str, what: &str) -> Result<Vec<u8>, String> {
    let bytes = if let Some(name) = source.strip_prefix("env:") {
        std::env::var_os(name)
            .ok_or_else(|| format!("environment variable `{name}` is not set"))?
            .into_encoded_bytes()
    } else if let Some(path) = source.strip_prefix("file:") {
        let mut bytes = std::fs::read(path).map_err(|e| format!("cannot read `{path}`: {e}"))?;
        while bytes.last().is_some_and(|b| matches!(b, b'\n' | b'\r')) {
            bytes.pop();
        }
        bytes
    } else {
        return Err(format!(
            "expected env:NAME or file:/path ({what} itself does not belong in the config file)"
        ));
    };
    if bytes.is_empty() {
        return Err(format!("`{source}` is empty"));
    }
    Ok(bytes)
}
