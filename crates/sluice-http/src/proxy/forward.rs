//! Header surgery for forwarding.

use std::net::IpAddr;

use http::header::Entry;
use http::header::{
    HeaderName, HeaderValue, CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};
use http::HeaderMap;
use smallvec::SmallVec;

use crate::client_ip::{IpText, X_FORWARDED_FOR};

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
    // One pass over the names, without hashing: most messages carry none of these, or only
    // `Connection`, and a `remove` per candidate name costs a hash and a probe each.
    let mut doomed: SmallVec<[HeaderName; 4]> = SmallVec::new();
    for name in headers.keys() {
        if is_hop_by_hop(name) {
            doomed.push(name.clone());
        }
    }
    if doomed.is_empty() {
        return;
    }
    if doomed.contains(&CONNECTION) {
        // The names `Connection` lists go too. Only those present matter, so each token is
        // looked for among the (few) names of the message, case-insensitively, rather than
        // parsed into a `HeaderName` of its own. `close` and `keep-alive`, nearly always the
        // only tokens, name no field to remove (a `Keep-Alive` field is doomed already).
        for value in headers.get_all(CONNECTION) {
            let Ok(value) = value.to_str() else {
                continue;
            };
            for token in value.split(',') {
                let token = token.trim();
                if token.is_empty()
                    || token.eq_ignore_ascii_case("close")
                    || token.eq_ignore_ascii_case("keep-alive")
                {
                    continue;
                }
                let present = headers
                    .keys()
                    .find(|name| name.as_str().eq_ignore_ascii_case(token));
                if let Some(name) = present {
                    if !doomed.contains(name) {
                        doomed.push(name.clone());
                    }
                }
            }
        }
    }
    for name in doomed {
        headers.remove(name);
    }
}

/// `Connection`, `Keep-Alive`, `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    // Standard names compare as an enum; only the others are compared as text.
    name == CONNECTION
        || name == TE
        || name == TRAILER
        || name == TRANSFER_ENCODING
        || name == UPGRADE
        || name == PROXY_AUTHENTICATE
        || name == PROXY_AUTHORIZATION
        || name == KEEP_ALIVE
        || name.as_str().starts_with("proxy-")
}

/// Whether a field named `name` (as it came on the wire, in any case) is hop-by-hop: one of
/// [`remove_hop_by_hop`]'s names, or one that a `Connection` value of its message lists
/// (`listed`: those values; one with bytes other than visible ASCII lists nothing, as
/// `HeaderValue::to_str` reads it).
pub(crate) fn is_hop_by_hop_bytes(name: &[u8], listed: &[&[u8]]) -> bool {
    const NAMES: [&[u8]; 8] = [
        b"connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"keep-alive",
    ];
    NAMES.iter().any(|n| name.eq_ignore_ascii_case(n))
        || name
            .get(..6)
            .is_some_and(|p| p.eq_ignore_ascii_case(b"proxy-"))
        || std::str::from_utf8(name).is_ok_and(|name| {
            listed
                .iter()
                .any(|value| crate::wire::has_token(value, name))
        })
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
    // One lookup of the name, for reading the lines there and for writing the new one.
    let entry = headers.entry(&X_FORWARDED_FOR);
    let mut value = String::with_capacity(48);
    if let Entry::Occupied(lines) = &entry {
        for line in lines.iter() {
            if let Ok(text) = line.to_str() {
                let text = text.trim();
                if !text.is_empty() {
                    value.push_str(text);
                    value.push_str(", ");
                }
            }
        }
    }
    value.push_str(IpText::new(peer.to_canonical()).as_str());
    // Visible text, commas and an address: always a valid value.
    let Ok(value) = HeaderValue::from_str(&value) else {
        return;
    };
    match entry {
        Entry::Occupied(mut lines) => {
            lines.insert(value);
        }
        Entry::Vacant(slot) => {
            slot.insert(value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(h: &HeaderMap) -> Vec<&str> {
        let mut v: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn plain_messages_are_untouched() {
        let mut h = HeaderMap::new();
        h.insert("host", "a".parse().unwrap());
        h.insert("content-length", "3".parse().unwrap());
        h.append("x-many", "1".parse().unwrap());
        h.append("x-many", "2".parse().unwrap());
        remove_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["content-length", "host", "x-many"]);
        assert_eq!(h.get_all("x-many").iter().count(), 2);
    }

    #[test]
    fn every_hop_by_hop_line_goes_with_what_connection_names() {
        let mut h = HeaderMap::new();
        h.append("connection", "close, X-A".parse().unwrap());
        h.append("connection", " x-b ,,".parse().unwrap());
        h.insert("x-a", "1".parse().unwrap());
        h.append("x-b", "1".parse().unwrap());
        h.append("x-b", "2".parse().unwrap());
        h.append("te", "trailers".parse().unwrap());
        h.append("te", "gzip".parse().unwrap());
        for n in ["trailer", "transfer-encoding", "upgrade", "keep-alive"] {
            h.insert(HeaderName::from_static(n), "x".parse().unwrap());
        }
        h.insert("proxy-authorization", "x".parse().unwrap());
        h.insert("proxy-authenticate", "x".parse().unwrap());
        h.insert("proxy-connection", "x".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        h.insert("proxyish", "1".parse().unwrap());
        remove_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["proxyish", "x-kept"]);
    }

    #[test]
    fn hop_by_hop_names_as_bytes_match_the_header_map_rule() {
        let listed: [&[u8]; 2] = [b"keep-alive, X-Secret", b"caf\xc3\xa9, x-other"];
        for name in [
            &b"Connection"[..],
            b"TE",
            b"trailer",
            b"Transfer-Encoding",
            b"upgrade",
            b"Proxy-Authenticate",
            b"proxy-authorization",
            b"Keep-Alive",
            b"Proxy-Connection",
            b"x-secret",
        ] {
            assert!(is_hop_by_hop_bytes(name, &listed), "{name:?}");
        }
        // A value that is not visible ASCII lists nothing.
        for name in [&b"x-other"[..], b"proxyish", b"x-kept", b"proxy"] {
            assert!(!is_hop_by_hop_bytes(name, &listed), "{name:?}");
        }
    }

    #[test]
    fn an_ipv4_mapped_peer_is_written_as_ipv4() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, "::ffff:10.1.2.3".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.1.2.3");
    }

    #[test]
    fn connection_tokens_match_names_in_any_case() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            "X-Secret ,  close, KEEP-ALIVE".parse().unwrap(),
        );
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-kept", "1".parse().unwrap());
        remove_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["x-kept"]);
    }

    #[test]
    fn a_connection_header_naming_nothing_present_is_removed_alone() {
        let mut h = HeaderMap::new();
        h.insert("connection", "keep-alive".parse().unwrap());
        h.insert("server", "up".parse().unwrap());
        remove_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["server"]);
    }
}
