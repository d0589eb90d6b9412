//! Who the client is: the peer address, or the address a trusted proxy saw.
//!
//! `X-Forwarded-For` is a list each proxy appends its peer to, so only its right end is
//! written by proxies we know; anything to the left of an untrusted hop may be invented by
//! the client. [`TrustedProxies::client_ip`] therefore believes the header only when the peer
//! is trusted, and walks it from the right past trusted hops: the first untrusted address is
//! the client. `Forwarded` (RFC 7239) is read the same way, by the `for=` of its elements,
//! when a request from a trusted peer carries no `X-Forwarded-For`.

use std::net::IpAddr;

use http::header::HeaderName;
use http::HeaderMap;
use ipnet::IpNet;

/// `X-Forwarded-For`.
pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// `Forwarded` (RFC 7239).
pub static FORWARDED: HeaderName = HeaderName::from_static("forwarded");

/// How long an IPv6 prefix a limit counts as one client: the /64 of one network segment,
/// the smallest block a site is given.
pub const IPV6_CLIENT_PREFIX: u8 = 64;

/// The address a limit counts a client by: an IPv4 address as it is, an IPv6 address with all
/// but its first [`IPV6_CLIENT_PREFIX`] bits cleared. A host on IPv6 usually has a whole /64
/// to itself and can pick a new address for every request, so per-address buckets would not
/// limit it.
///
/// # Examples
///
/// ```
/// use sluice_http::client_ip::limit_address;
///
/// assert_eq!(limit_address("203.0.113.7".parse()?), "203.0.113.7".parse::<std::net::IpAddr>()?);
/// assert_eq!(limit_address("2001:db8:1:2:a:b:c:d".parse()?), "2001:db8:1:2::".parse::<std::net::IpAddr>()?);
/// # Ok::<(), std::net::AddrParseError>(())
/// ```
pub fn limit_address(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let keep = u128::MAX << (128 - u32::from(IPV6_CLIENT_PREFIX));
            IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & keep))
        }
    }
}

/// An IP address as `Display` writes it, in a buffer of its own. IPv4, which a gateway writes
/// for most requests (the `ip` key, `X-Forwarded-For`), is written digit by digit rather than
/// through the formatter, which costs about a thousand instructions per address (callgrind:
/// the `ip` key took 1,150 instructions through the formatter, 147 this way;
/// BENCHMARKS-history.md, "What sets the gateway's figures").
#[derive(Clone, Copy)]
pub(crate) struct IpText {
    pub(crate) buf: [u8; 48],
    pub(crate) len: u8,
}

impl IpText {
    pub(crate) fn new(ip: IpAddr) -> IpText {
        let mut text = IpText {
            buf: [0; 48],
            len: 0,
        };
        match ip {
            IpAddr::V4(v4) => {
                let mut at = 0;
                for (i, octet) in v4.octets().into_iter().enumerate() {
                    if i > 0 {
                        text.buf[at] = b'.';
                        at += 1;
                    }
                    if octet >= 100 {
                        text.buf[at] = b'0' + octet / 100;
                        at += 1;
                    }
                    if octet >= 10 {
                        text.buf[at] = b'0' + octet / 10 % 10;
                        at += 1;
                    }
                    text.buf[at] = b'0' + octet % 10;
                    at += 1;
                }
                // At most 15 bytes.
                text.len = at as u8;
            }
            IpAddr::V6(v6) => {
                use std::io::Write as _;
                let mut cursor = std::io::Cursor::new(&mut text.buf[..]);
                // At most 45 bytes (with an embedded IPv4): always fits.
                let _ = write!(cursor, "{v6}");
                text.len = cursor.position() as u8;
            }
        }
        text
    }

    pub(crate) fn as_str(&self) -> &str {
        // Digits, dots, hex and colons only.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or_default()
    }
}

/// The client address of a request, put in its extensions by the server (the tower
/// [`RateLimit`](crate::RateLimit) reads it for `key = "ip"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientIp(pub IpAddr);

/// The networks whose `X-Forwarded-For` is believed.
///
/// # Examples
///
/// ```
/// use http::HeaderMap;
/// use sluice_http::TrustedProxies;
///
/// let trusted = TrustedProxies::new(["10.0.0.0/8".parse()?]);
/// let mut headers = HeaderMap::new();
/// headers.insert("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.0.0.2".parse()?);
/// // From a trusted peer: walk left past 10.0.0.2 (trusted) to 203.0.113.9.
/// assert_eq!(trusted.client_ip("10.0.0.1".parse()?, &headers), "203.0.113.9".parse::<std::net::IpAddr>()?);
/// // From anyone else: the header is ignored.
/// assert_eq!(trusted.client_ip("198.51.100.1".parse()?, &headers), "198.51.100.1".parse::<std::net::IpAddr>()?);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

impl TrustedProxies {
    /// Trusts the given networks.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> TrustedProxies {
        TrustedProxies {
            nets: nets.into_iter().collect(),
        }
    }

    /// Trusts no one: the client is always the peer.
    pub fn none() -> TrustedProxies {
        TrustedProxies::default()
    }

    /// The networks.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Whether `ip` is a trusted proxy.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.nets.iter().any(|net| net.contains(&ip))
    }

    /// The client address of a request from `peer` with `headers`.
    ///
    /// From a trusted peer, `X-Forwarded-For` is walked from the right; without it,
    /// `Forwarded`'s `for=` values are. An entry that is not an IP address (`unknown`, an
    /// obfuscated `_name`) stops the walk at the trusted hop that wrote it.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = peer.to_canonical();
        if self.nets.is_empty() || !self.contains(peer) {
            return peer;
        }
        if !headers.contains_key(&X_FORWARDED_FOR) {
            return self.walk_forwarded(peer, headers);
        }
        let mut client = peer;
        // Several header lines form one list, in order; walk them all from the right.
        let lines: Vec<&[u8]> = headers
            .get_all(&X_FORWARDED_FOR)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        for line in lines.iter().rev() {
            for entry in line.rsplit(|&b| b == b',') {
                let Some(ip) = parse_entry(entry) else {
                    return client;
                };
                client = ip;
                if !self.contains(ip) {
                    return ip;
                }
            }
        }
        client
    }
}

impl TrustedProxies {
    fn walk_forwarded(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut client = peer;
        let lines: Vec<&[u8]> = headers
            .get_all(&FORWARDED)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        for line in lines.iter().rev() {
            for element in line.rsplit(|&b| b == b',') {
                let Some(ip) = forwarded_for(element) else {
                    return client;
                };
                client = ip;
                if !self.contains(ip) {
                    return ip;
                }
            }
        }
        client
    }
}

/// The address in the `for=` pair of one `Forwarded` element (`for=192.0.2.60`,
/// `For="[2001:db8::1]:4711"`), if it has one that is an address.
fn forwarded_for(element: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(element).ok()?;
    let value = text.split(';').find_map(|pair| {
        let (name, value) = pair.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("for")
            .then(|| value.trim())
    })?;
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value);
    if let Some(bracketed) = value.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        let (v6, _) = bracketed.split_once(']')?;
        return v6
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|ip| IpAddr::V6(ip).to_canonical());
    }
    parse_entry(value.as_bytes())
}

fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let text = std::str::from_utf8(entry).ok()?.trim();
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Some(ip.to_canonical());
    }
    // `1.2.3.4:5678` and `[::1]:5678`, which some proxies write.
    text.parse::<std::net::SocketAddr>()
        .ok()
        .map(|addr| addr.ip().to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_text_is_what_display_writes() {
        let ips = [
            "0.0.0.0",
            "9.10.99.100",
            "255.255.255.255",
            "127.0.0.1",
            "::",
            "::1",
            "::ffff:1.2.3.4",
            "2001:db8::8a2e:370:7334",
            "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255",
            "1111:2222:3333:4444:5555:6666:7777:8888",
        ];
        for ip in ips {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
        for octet in 0..=255u8 {
            let ip = IpAddr::from([octet, 0, 10, octet]);
            assert_eq!(IpText::new(ip).as_str(), ip.to_string());
        }
    }

    fn walk(trusted: &[&str], peer: &str, xff: &[&str]) -> String {
        let trusted = TrustedProxies::new(trusted.iter().map(|n| n.parse().unwrap()));
        let mut headers = HeaderMap::new();
        for line in xff {
            headers.append(&X_FORWARDED_FOR, line.parse().unwrap());
        }
        trusted
            .client_ip(peer.parse().unwrap(), &headers)
            .to_string()
    }

    #[test]
    fn believes_only_trusted_peers() {
        assert_eq!(walk(&[], "1.1.1.1", &["2.2.2.2"]), "1.1.1.1");
        assert_eq!(walk(&["10.0.0.0/8"], "1.1.1.1", &["2.2.2.2"]), "1.1.1.1");
        assert_eq!(walk(&["10.0.0.0/8"], "10.0.0.1", &["2.2.2.2"]), "2.2.2.2");
        assert_eq!(walk(&["10.0.0.0/8"], "10.0.0.1", &[]), "10.0.0.1");
    }

    fn walk_forwarded(trusted: &[&str], peer: &str, lines: &[&str]) -> String {
        let trusted = TrustedProxies::new(trusted.iter().map(|n| n.parse().unwrap()));
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(&FORWARDED, line.parse().unwrap());
        }
        trusted
            .client_ip(peer.parse().unwrap(), &headers)
            .to_string()
    }

    #[test]
    fn forwarded_is_read_like_x_forwarded_for() {
        let t = &["10.0.0.0/8"];
        assert_eq!(walk_forwarded(&[], "1.1.1.1", &["for=2.2.2.2"]), "1.1.1.1");
        assert_eq!(walk_forwarded(t, "1.1.1.1", &["for=2.2.2.2"]), "1.1.1.1");
        assert_eq!(walk_forwarded(t, "10.0.0.1", &["for=2.2.2.2"]), "2.2.2.2");
        assert_eq!(
            walk_forwarded(
                t,
                "10.0.0.1",
                &[
                    "for=9.9.9.9;proto=http, For=\"3.3.3.3:80\";by=10.0.0.1",
                    "for=10.0.0.5"
                ]
            ),
            "3.3.3.3"
        );
        assert_eq!(
            walk_forwarded(t, "10.0.0.1", &["for=\"[2001:db8:cafe::17]:4711\""]),
            "2001:db8:cafe::17"
        );
        assert_eq!(
            walk_forwarded(t, "10.0.0.1", &["for=unknown, for=10.0.0.9"]),
            "10.0.0.9"
        );
        assert_eq!(walk_forwarded(t, "10.0.0.1", &["for=_hidden"]), "10.0.0.1");
        assert_eq!(walk_forwarded(t, "10.0.0.1", &["proto=https"]), "10.0.0.1");
        // X-Forwarded-For, when present, is the one read.
        let trusted = TrustedProxies::new(["10.0.0.0/8".parse().unwrap()]);
        let mut headers = HeaderMap::new();
        headers.insert(&FORWARDED, "for=6.6.6.6".parse().unwrap());
        headers.insert(&X_FORWARDED_FOR, "4.4.4.4".parse().unwrap());
        assert_eq!(
            trusted.client_ip("10.0.0.1".parse().unwrap(), &headers),
            "4.4.4.4".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn walks_from_the_right_past_trusted_hops() {
        let t = &["10.0.0.0/8"];
        assert_eq!(
            walk(t, "10.0.0.1", &["9.9.9.9, 3.3.3.3, 10.0.0.5"]),
            "3.3.3.3"
        );
        assert_eq!(
            walk(t, "10.0.0.1", &["9.9.9.9", "3.3.3.3, 10.0.0.5"]),
            "3.3.3.3"
        );
        assert_eq!(walk(t, "10.0.0.1", &["10.0.0.7, 10.0.0.5"]), "10.0.0.7");
        assert_eq!(walk(t, "10.0.0.1", &["garbage, 10.0.0.5"]), "10.0.0.5");
        assert_eq!(walk(t, "10.0.0.1", &["3.3.3.3:443"]), "3.3.3.3");
        assert_eq!(
            walk(t, "::ffff:10.0.0.1", &["[2001:db8::1]:80"]),
            "2001:db8::1"
        );
    }
}
