//! Key extraction: `KeySpec::from_str` and `Display`, `KeySpec::extract` over arbitrary
//! headers, cookies, query strings and client addresses, and `key::normalize`.
//!
//! Properties: no panic; a spec prints as text that reads back as the same spec; a refused
//! spec quotes the text; an extracted key is at most `MAX_KEY_LEN` bytes and the same on every
//! call; a value is keyed the same whichever way the request spells it (a header value as
//! sent, a cookie among others, a query parameter with every byte percent-encoded); an IP key
//! is the address (an IPv6 client by its /64) as the standard library writes it.
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::header::{HeaderName, HeaderValue, COOKIE};
use http::{HeaderMap, Uri};
use libfuzzer_sys::fuzz_target;
use sluice_http::client_ip::limit_address;
use sluice_http::key::{normalize, MAX_KEY_LEN};
use sluice_http::KeySpec;

/// The input, one field a line: the key spec, the query string, a value, the client address
/// (as text, or 4 or 16 raw bytes; anything else is none), then headers as `name: value`.
struct Input<'a> {
    spec: &'a str,
    query: &'a str,
    value: &'a [u8],
    ip: Option<IpAddr>,
    headers: Vec<(&'a [u8], &'a [u8])>,
}

impl<'a> Input<'a> {
    fn read(data: &'a [u8]) -> Option<Input<'a>> {
        let mut lines = data.split(|&b| b == b'\n');
        let spec = std::str::from_utf8(lines.next()?).ok()?;
        let query = std::str::from_utf8(lines.next().unwrap_or_default()).ok()?;
        let value = lines.next().unwrap_or_default();
        let ip = lines.next().and_then(|raw| {
            if let Some(ip) = std::str::from_utf8(raw).ok().and_then(|t| t.parse().ok()) {
                return Some(ip);
            }
            match raw.len() {
                4 => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(raw).ok()?))),
                16 => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(raw).ok()?))),
                _ => None,
            }
        });
        let headers = lines
            .map(|line| {
                let colon = line.iter().position(|&b| b == b':').unwrap_or(line.len());
                let value = line.get(colon + 1..).unwrap_or_default();
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            })
            .collect();
        Some(Input {
            spec,
            query,
            value,
            ip,
            headers,
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = Input::read(data) else {
        return;
    };
    let ip = input.ip;
    let normalized = normalize(input.value);
    assert!(normalized.len() <= MAX_KEY_LEN);
    assert_eq!(normalized, normalize(input.value));

    let spec = match input.spec.parse::<KeySpec>() {
        Ok(spec) => spec,
        Err(e) => {
            assert!(
                e.to_string().contains(input.spec),
                "{e} quotes {:?}",
                input.spec
            );
            return;
        }
    };
    let shown = spec.to_string();
    assert_eq!(shown.parse::<KeySpec>().as_ref(), Ok(&spec), "{shown:?}");

    // Whatever the request, the key is bounded and the same on every call.
    let mut headers = HeaderMap::new();
    for (name, value) in &input.headers {
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    let uri = format!("/?{}", input.query)
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    let first = spec.extract(&headers, &uri, ip).map(|k| k.to_string());
    if let Ok(k) = &first {
        assert!(k.len() <= MAX_KEY_LEN, "{} bytes", k.len());
    }
    assert_eq!(
        first,
        spec.extract(&headers, &uri, ip).map(|k| k.to_string())
    );

    // The value, spelled as the spec reads it, keys as `normalize` says.
    match &spec {
        KeySpec::Global => assert_eq!(first.as_deref(), Ok("")),
        KeySpec::Ip => {
            let want = match ip.map(limit_address) {
                None => String::new(),
                Some(IpAddr::V4(v4)) => v4.to_string(),
                Some(IpAddr::V6(v6)) => format!("{v6}/64"),
            };
            assert_eq!(first.as_deref(), Ok(want.as_str()));
        }
        KeySpec::Header(name) => {
            let Ok(value) = HeaderValue::from_bytes(input.value) else {
                return;
            };
            let mut headers = HeaderMap::new();
            headers.append(name.clone(), value.clone());
            assert_eq!(key(&spec, &headers, &Uri::from_static("/")), normalized);
            // Sent twice, the same value is still one key.
            headers.append(name.clone(), value);
            assert_eq!(key(&spec, &headers, &Uri::from_static("/")), normalized);
        }
        KeySpec::Cookie(name) => {
            let v = input.value;
            let plain = !v.contains(&b';')
                && !v.starts_with(b"\"")
                && !v.starts_with(b" ")
                && !v.starts_with(b"\t")
                && !v.ends_with(b" ")
                && !v.ends_with(b"\t");
            // The first cookie of a name counts: this one comes first.
            let mut header = format!("{name}=").into_bytes();
            header.extend_from_slice(v);
            header.extend_from_slice(b"; other=1; ");
            header.extend_from_slice(name.as_bytes());
            header.extend_from_slice(b"=2");
            let (true, Ok(value)) = (plain, HeaderValue::from_bytes(&header)) else {
                return;
            };
            let mut headers = HeaderMap::new();
            headers.append(COOKIE, value);
            assert_eq!(key(&spec, &headers, &Uri::from_static("/")), normalized);
        }
        KeySpec::Query(name) => {
            if name == "a" || name == "b" {
                return;
            }
            let uri = format!(
                "/x?a=1&{}={}&b",
                encode(name.as_bytes()),
                encode(input.value)
            );
            let uri: Uri = uri.parse().expect("an all-escaped query is a valid URI");
            assert_eq!(key(&spec, &HeaderMap::new(), &uri), normalized);
        }
    }
});

fn key(spec: &KeySpec, headers: &HeaderMap, uri: &Uri) -> String {
    match spec.extract(headers, uri, None) {
        Ok(k) => k.to_string(),
        Err(e) => panic!("{spec}: one value, and yet {e}"),
    }
}

/// Every byte as `%XX`.
fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}
