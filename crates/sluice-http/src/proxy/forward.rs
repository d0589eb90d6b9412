//! Header surgery for forwarding.

use std::net::IpAddr;

use http::header::{
    HeaderName, HeaderValue, CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};
use http::HeaderMap;

use crate::client_ip::X_FORWARDED_FOR;

static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");

/// Removes the hop-by-hop headers: `Connection` and the headers it lists, `Keep-Alive`,
/// `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding` and `Upgrade`.
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use sluice_http::proxy::remove_hop_by_hop;
///
/// let mut h = HeaderMap::new();
/// h.insert("connection", "keep-alive, x-secret".parse()?);
/// h.insert("x-secret", "1".parse()?);
/// h.insert("proxy-connection", "close".parse()?);
/// h.insert("x-kept", "1".parse()?);
/// remove_hop_by_hop(&mut h);
/// assert_eq!(h.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["x-kept"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(CONNECTION) {
        let listed: Vec<HeaderName> = headers
            .get_all(CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in listed {
            headers.remove(name);
        }
        headers.remove(CONNECTION);
    }
    for name in [&TE, &TRAILER, &TRANSFER_ENCODING, &UPGRADE, &KEEP_ALIVE] {
        headers.remove(name);
    }
    headers.remove(PROXY_AUTHENTICATE);
    headers.remove(PROXY_AUTHORIZATION);
    if headers.keys().any(|k| k.as_str().starts_with("proxy-")) {
        let proxy: Vec<HeaderName> = headers
            .keys()
            .filter(|k| k.as_str().starts_with("proxy-"))
            .cloned()
            .collect();
        for name in proxy {
            headers.remove(name);
        }
    }
}

/// Appends `peer` to `X-Forwarded-For`, joining several header lines into one.
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use sluice_http::proxy::append_forwarded_for;
///
/// let mut h = HeaderMap::new();
/// append_forwarded_for(&mut h, "10.0.0.1".parse()?);
/// assert_eq!(h["x-forwarded-for"], "10.0.0.1");
/// h.append("x-forwarded-for", "10.0.0.2".parse()?);
/// append_forwarded_for(&mut h, "::1".parse()?);
/// assert_eq!(h["x-forwarded-for"], "10.0.0.1, 10.0.0.2, ::1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: IpAddr) {
    let peer = peer.to_canonical();
    let mut value = String::new();
    for line in headers.get_all(&X_FORWARDED_FOR) {
        if let Ok(text) = line.to_str() {
            let text = text.trim();
            if !text.is_empty() {
                value.push_str(text);
                value.push_str(", ");
            }
        }
    }
    use std::fmt::Write as _;
    let _ = write!(value, "{peer}");
    if let Ok(v) = HeaderValue::from_str(&value) {
        headers.insert(X_FORWARDED_FOR.clone(), v);
    }
}
