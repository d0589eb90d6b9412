//! Whose bucket a request spends: the key specs `global | ip | header:NAME | cookie:NAME |
//! query:NAME`, and how long keys are kept short.
//!
//! # Long and binary keys
//!
//! A key is at most [`MAX_KEY_LEN`] bytes of UTF-8. A longer value, or one that is not UTF-8
//! (header bytes are opaque), is replaced by `~` followed by 32 hex digits of its SHA-256
//! digest: the same value always maps to the same bucket (in every process, which a shared
//! Redis store needs), memory per key stays bounded, and long session tokens still get a
//! bucket of their own. A request without the header, cookie or query parameter is keyed by
//! the empty string: all such requests share one bucket, so leaving the key out is no way
//! around the limit.
//!
//! # Keys a client could spell two ways
//!
//! A key is what the upstream will read, or a client could get a fresh bucket per request
//! while the upstream sees one user:
//!
//! - A query parameter's name and value are percent-decoded (and `+` is a space), as every
//!   server framework decodes them: `?api_key=%61bc` and `?api_key=abc` are one key.
//! - A header or query parameter that appears more than once with different values has no
//!   key: frameworks disagree on which one they read (the first, the last, or all joined). So
//!   [`KeySpec::extract`] returns [`AmbiguousKey`], and the gateway answers 400. The same
//!   value repeated is one key.
//! - A cookie is the first one of that name. Browsers send one name more than once when
//!   cookies of several paths match, the most specific path first, and servers read that one.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use http::header::{HeaderName, COOKIE};
use http::{HeaderMap, Uri};
use sha2::{Digest, Sha256};

/// The longest key kept as it is, in bytes; longer keys are hashed.
pub const MAX_KEY_LEN: usize = 256;

/// What part of a request names its bucket.
///
/// # Examples
///
/// ```
/// use sluice_http::KeySpec;
///
/// let spec: KeySpec = "header:X-Api-Key".parse()?;
/// assert_eq!(spec.to_string(), "header:x-api-key");
/// assert!("header:".parse::<KeySpec>().is_err());
/// assert!("body:user".parse::<KeySpec>().is_err());
/// # Ok::<(), sluice_http::key::InvalidKeySpec>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum KeySpec {
    /// One bucket for everyone.
    #[default]
    Global,
    /// The client's IP address (see [`crate::TrustedProxies`] for `X-Forwarded-For`); an
    /// IPv6 client by its /64 prefix (see [`crate::client_ip::limit_address`]).
    Ip,
    /// The value of a request header.
    Header(HeaderName),
    /// The value of a cookie.
    Cookie(String),
    /// The value of a query parameter, percent-decoded.
    Query(String),
}

/// A key spec that is not one of `global | ip | header:NAME | cookie:NAME | query:NAME`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid key `{value}`: {reason}; expected one of global, ip, header:NAME, cookie:NAME, query:NAME")]
pub struct InvalidKeySpec {
    value: String,
    reason: &'static str,
}

impl FromStr for KeySpec {
    type Err = InvalidKeySpec;

    fn from_str(text: &str) -> Result<KeySpec, InvalidKeySpec> {
        let fail = |reason| InvalidKeySpec {
            value: text.to_owned(),
            reason,
        };
        match text {
            "global" => return Ok(KeySpec::Global),
            "ip" => return Ok(KeySpec::Ip),
            _ => {}
        }
        let Some((kind, name)) = text.split_once(':') else {
            return Err(fail("unknown key kind"));
        };
        if name.is_empty() {
            return Err(fail("the name after `:` is empty"));
        }
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes())
                .map(KeySpec::Header)
                .map_err(|_| fail("not a valid header name")),
            "cookie" => {
                let ok = name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b));
                if ok {
                    Ok(KeySpec::Cookie(name.to_owned()))
                } else {
                    Err(fail("not a valid cookie name"))
                }
            }
            "query" => {
                if name
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'&' && b != b'=')
                {
                    Ok(KeySpec::Query(name.to_owned()))
                } else {
                    Err(fail("not a valid query parameter name"))
                }
            }
            _ => Err(fail("unknown key kind")),
        }
    }
}

impl fmt::Display for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySpec::Global => f.write_str("global"),
            KeySpec::Ip => f.write_str("ip"),
            KeySpec::Header(name) => write!(f, "header:{name}"),
            KeySpec::Cookie(name) => write!(f, "cookie:{name}"),
            KeySpec::Query(name) => write!(f, "query:{name}"),
        }
    }
}

/// A header or query parameter that a request carries more than once, with different values:
/// which one would the upstream read? (See the [module docs](self).)
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key appears more than once with different values")]
pub struct AmbiguousKey;

impl KeySpec {
    /// The key of a request with these `headers` and `uri`, from a client at `client_ip`.
    ///
    /// A missing value is the empty key, a long or binary one is hashed (see the
    /// [module docs](self)). Without a client address, `ip` keys by the empty string. Never
    /// allocates but for hashed keys and percent-decoded query values.
    ///
    /// # Errors
    ///
    /// [`AmbiguousKey`] when the header or query parameter appears more than once with
    /// different values.
    pub fn extract<'a>(
        &self,
        headers: &'a HeaderMap,
        uri: &'a Uri,
        client_ip: Option<IpAddr>,
    ) -> Result<Key<'a>, AmbiguousKey> {
        Ok(match self {
            KeySpec::Global => Key::from(""),
            KeySpec::Ip => match client_ip {
                Some(ip) => Key::ip(ip),
                None => Key::from(""),
            },
            KeySpec::Header(name) => {
                let mut values = headers.get_all(name).iter();
                match values.next() {
                    None => Key::from(""),
                    Some(first) => {
                        if values.any(|v| v != first) {
                            return Err(AmbiguousKey);
                        }
                        normalize(first.as_bytes()).into()
                    }
                }
            }
            KeySpec::Cookie(name) => headers
                .get_all(COOKIE)
                .iter()
                .find_map(|value| cookie_value(value.as_bytes(), name.as_bytes()))
                .map_or(Key::from(""), |v| normalize(v).into()),
            KeySpec::Query(name) => match uri.query() {
                None => Key::from(""),
                Some(query) => match query_value(query, name)? {
                    None => Key::from(""),
                    Some(Cow::Borrowed(v)) => normalize(v).into(),
                    Some(Cow::Owned(v)) => Key::Owned(normalize(&v).into_owned()),
                },
            },
        })
    }
}

impl KeySpec {
    /// The key of a request whose key part (its address, header, cookie or decoded query
    /// parameter, as the spec says) is `value`: what [`KeySpec::extract`] gives such a request.
    /// For `ip`, a `value` that is an address gives that address's key (an IPv6 address its
    /// /64); one that is not is kept as text (normalized), so it matches no HTTP client. For
    /// `global`, the value is not looked at: everyone's key is the empty one. Used by
    /// decisions that arrive without an HTTP request (Envoy's rate limit service), so that
    /// they spend the same buckets as the requests they describe.
    ///
    /// # Examples
    ///
    /// ```
    /// use sluice_http::KeySpec;
    ///
    /// assert_eq!(&*KeySpec::Ip.key_of_value("1.2.3.4"), "1.2.3.4");
    /// assert_eq!(&*KeySpec::Ip.key_of_value("2001:db8:1:2::a"), "2001:db8:1:2::/64");
    /// let by_header: KeySpec = "header:x-api-key".parse()?;
    /// assert_eq!(&*by_header.key_of_value("user-42"), "user-42");
    /// assert_eq!(&*KeySpec::Global.key_of_value("anything"), "");
    /// # Ok::<(), sluice_http::key::InvalidKeySpec>(())
    /// ```
    pub fn key_of_value<'a>(&self, value: &'a str) -> Key<'a> {
        match self {
            KeySpec::Global => Key::from(""),
            KeySpec::Ip => match value.parse::<IpAddr>() {
                Ok(ip) => Key::ip(ip),
                Err(_) => normalize(value.as_bytes()).into(),
            },
            KeySpec::Header(_) | KeySpec::Cookie(_) | KeySpec::Query(_) => {
                normalize(value.as_bytes()).into()
            }
        }
    }
}

/// An extracted key: borrowed from the request, an IP address written in place, or a digest.
#[derive(Debug, Clone)]
pub enum Key<'a> {
    /// Part of the request, or the empty key.
    Borrowed(&'a str),
    /// An IP address, written without allocating (at most 45 bytes).
    Inline {
        /// The text's bytes.
        buf: [u8; 48],
        /// How many are used.
        len: u8,
    },
    /// A digest of a long or binary value.
    Owned(String),
}

impl Key<'_> {
    /// An IPv4 address, or an IPv6 /64 prefix written `2001:db8:1:2::/64` (see
    /// [`limit_address`](crate::client_ip::limit_address)).
    fn ip(ip: IpAddr) -> Key<'static> {
        let mut text = crate::client_ip::IpText::new(crate::client_ip::limit_address(ip));
        if ip.is_ipv6() {
            // At most 39 bytes of address and 4 of suffix: they fit in the 48.
            let mut digits = itoa::Buffer::new();
            let digits = digits
                .format(crate::client_ip::IPV6_CLIENT_PREFIX)
                .as_bytes();
            let at = usize::from(text.len);
            text.buf[at] = b'/';
            text.buf[at + 1..at + 1 + digits.len()].copy_from_slice(digits);
            text.len += 1 + digits.len() as u8;
        }
        Key::Inline {
            buf: text.buf,
            len: text.len,
        }
    }
}

impl std::ops::Deref for Key<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            Key::Borrowed(s) => s,
            Key::Inline { buf, len } => {
                std::str::from_utf8(&buf[..usize::from(*len)]).unwrap_or_default()
            }
            Key::Owned(s) => s,
        }
    }
}

impl<'a> From<&'a str> for Key<'a> {
    fn from(s: &'a str) -> Key<'a> {
        Key::Borrowed(s)
    }
}

impl<'a> From<Cow<'a, str>> for Key<'a> {
    fn from(s: Cow<'a, str>) -> Key<'a> {
        match s {
            Cow::Borrowed(s) => Key::Borrowed(s),
            Cow::Owned(s) => Key::Owned(s),
        }
    }
}

/// `bytes` as a key: itself when it is UTF-8 of at most [`MAX_KEY_LEN`] bytes, else its digest.
///
/// # Examples
///
/// ```
/// use sluice_http::key::normalize;
///
/// assert_eq!(normalize(b"user-42"), "user-42");
/// let long = normalize(&[b'a'; 1000]);
/// assert_eq!(long.len(), 33);
/// assert!(long.starts_with('~'));
/// assert_eq!(normalize(&[0xff, 0xfe]).len(), 33); // not UTF-8
/// ```
pub fn normalize(bytes: &[u8]) -> Cow<'_, str> {
    if bytes.len() <= MAX_KEY_LEN {
        if let Ok(text) = std::str::from_utf8(bytes) {
            return Cow::Borrowed(text);
        }
    }
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(33);
    out.push('~');
    for byte in &digest[..16] {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    Cow::Owned(out)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn cookie_value<'a>(header: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    header.split(|&b| b == b';').find_map(|pair| {
        let pair = trim(pair);
        let eq = pair.iter().position(|&b| b == b'=')?;
        let (k, v) = (trim(&pair[..eq]), trim(&pair[eq + 1..]));
        if k != name {
            return None;
        }
        let v = v
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(v);
        Some(v)
    })
}

/// The percent-decoded value of the query parameter `name` (also percent-decoded), if any.
fn query_value<'a>(query: &'a str, name: &str) -> Result<Option<Cow<'a, [u8]>>, AmbiguousKey> {
    let mut found: Option<Cow<'a, [u8]>> = None;
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if *form_decode(k.as_bytes()) != *name.as_bytes() {
            continue;
        }
        let v = form_decode(v.as_bytes());
        match &found {
            None => found = Some(v),
            Some(first) if *first == v => {}
            Some(_) => return Err(AmbiguousKey),
        }
    }
    Ok(found)
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; a `%` not
/// followed by two hex digits stays as it is. Borrows when there is nothing to decode.
fn form_decode(text: &[u8]) -> Cow<'_, [u8]> {
    if !text.iter().any(|&b| b == b'%' || b == b'+') {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if let Some(byte) = crate::path::escape_at(text, i) {
            out.push(byte);
            i += 3;
            continue;
        }
        out.push(if text[i] == b'+' { b' ' } else { text[i] });
        i += 1;
    }
    Cow::Owned(out)
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(spec: &str, headers: &[(&str, &[u8])], uri: &str, ip: Option<IpAddr>) -> String {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_bytes(v).unwrap(),
            );
        }
        let uri: Uri = uri.parse().unwrap();
        spec.parse::<KeySpec>()
            .unwrap()
            .extract(&map, &uri, ip)
            .map_or_else(|AmbiguousKey| "<ambiguous>".to_owned(), |k| k.to_string())
    }

    #[test]
    fn extracts_each_kind() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(key("global", &[], "/", Some(ip)), "");
        assert_eq!(key("ip", &[], "/", Some(ip)), "10.1.2.3");
        // IPv6 by its /64: a host picks any address of its /64 for each request.
        let long: IpAddr = "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"
            .parse()
            .unwrap();
        assert_eq!(key("ip", &[], "/", Some(long)), "ffff:ffff:ffff:ffff::/64");
        let a: IpAddr = "2001:db8:1:2::a".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::b".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::a".parse().unwrap();
        assert_eq!(key("ip", &[], "/", Some(a)), "2001:db8:1:2::/64");
        assert_eq!(key("ip", &[], "/", Some(a)), key("ip", &[], "/", Some(b)));
        assert_ne!(
            key("ip", &[], "/", Some(a)),
            key("ip", &[], "/", Some(other))
        );
        assert_eq!(key("ip", &[], "/", None), "");
        assert_eq!(
            key("header:x-user", &[("x-user", b"bob")], "/", None),
            "bob"
        );
        assert_eq!(key("header:x-user", &[], "/", None), "");
        assert_eq!(
            key(
                "cookie:sid",
                &[("cookie", b"a=1; sid=\"xyz\""), ("cookie", b"sid=later")],
                "/",
                None
            ),
            "xyz"
        );
        assert_eq!(key("cookie:sid", &[("cookie", b"sidx=1")], "/", None), "");
        assert_eq!(key("query:u", &[], "/p?a=1&u=7", None), "7");
        assert_eq!(key("query:u", &[], "/p?u", None), "");
        assert_eq!(key("query:u", &[], "/p", None), "");
    }

    /// One value the upstream reads one way is one key, however the client spells it.
    #[test]
    fn query_names_and_values_are_percent_decoded() {
        assert_eq!(key("query:api_key", &[], "/p?api_key=%61b%63", None), "abc");
        assert_eq!(key("query:api_key", &[], "/p?api%5Fkey=abc", None), "abc");
        assert_eq!(key("query:u", &[], "/p?u=a+b%20c", None), "a b c");
        assert_eq!(key("query:u", &[], "/p?u=100%", None), "100%");
        assert_eq!(key("query:u", &[], "/p?u=%zz", None), "%zz");
        // Decoding to bytes that are not UTF-8 gives the digest, like any binary key.
        assert_eq!(key("query:u", &[], "/p?u=%ff", None).len(), 33);
    }

    /// Which of two values would the upstream read? Refused, rather than guessed.
    #[test]
    fn different_repeated_values_are_ambiguous() {
        assert_eq!(key("query:u", &[], "/p?u=7&a=1&u=8", None), "<ambiguous>");
        assert_eq!(
            key("query:u", &[], "/p?u=7&u=%37", None),
            "7",
            "the same value"
        );
        assert_eq!(
            key(
                "header:x-user",
                &[("x-user", b"a"), ("x-user", b"b")],
                "/",
                None
            ),
            "<ambiguous>"
        );
        assert_eq!(
            key(
                "header:x-user",
                &[("x-user", b"a"), ("x-user", b"a")],
                "/",
                None
            ),
            "a"
        );
        // Cookies: browsers repeat a name for cookies of several paths, most specific first.
        assert_eq!(
            key("cookie:sid", &[("cookie", b"sid=a; sid=b")], "/", None),
            "a"
        );
    }

    #[test]
    fn long_and_binary_values_are_hashed_stably() {
        let long = vec![b'x'; MAX_KEY_LEN + 1];
        let a = key("header:k", &[("k", &long)], "/", None);
        let b = key("header:k", &[("k", &long)], "/", None);
        assert_eq!(a, b);
        assert_eq!(a.len(), 33);
        let exact = vec![b'x'; MAX_KEY_LEN];
        assert_eq!(
            key("header:k", &[("k", &exact)], "/", None).len(),
            MAX_KEY_LEN
        );
        assert_ne!(key("header:k", &[("k", &[0x80, 0x81])], "/", None), "");
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            "ip:",
            "header:",
            "header:bad name",
            "cookie:a;b",
            "query:a=b",
            "user",
        ] {
            assert!(bad.parse::<KeySpec>().is_err(), "{bad}");
        }
        for good in [
            "global",
            "ip",
            "header:x-api-key",
            "cookie:sid",
            "query:api_key",
        ] {
            assert_eq!(good.parse::<KeySpec>().unwrap().to_string(), good);
        }
    }
}
