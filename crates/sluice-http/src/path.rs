//! The path a request is routed by and forwarded with.
//!
//! Routing on the path exactly as sent would let a client walk around a limit. The path
//! `/free/../api/x` starts with `/free/`, but an upstream that resolves dot segments serves
//! `/api/x`, without `/api/`'s limit. The same goes for `//api/x` and `/%61pi/x`. So the
//! gateway routes on the *canonical* path, and forwards that one, so that the upstream serves
//! exactly what was matched. To make a path canonical:
//!
//! - percent-encoded unreserved characters are decoded (`%61` is `a`, `%2E` is `.`), and the
//!   hex digits of every other escape are upper-cased (RFC 3986 §6.2.2.1 and §6.2.2.2); a `%`
//!   that starts no escape is written `%25`, so that no decoded digit can complete it;
//! - each run of `/` becomes one `/`;
//! - `.` and `..` segments are resolved (RFC 3986 §5.2.4); `..` stops at the root.
//!
//! An encoded slash or backslash (`%2F`, `%5C`) is data inside a segment, not a separator, and
//! it stays encoded. Some upstreams decode them, or read a raw `\` as `/`, before resolving
//! dot segments. For those, `/free/..%2Fapi/x` would mean `/api/x`. Java servlet containers
//! drop a segment's `;` parameters first, so to them `/free/..;/api/x` is `/api/x`. Such paths
//! are [`Canonical::Ambiguous`], and the gateway refuses them with 400.

use http::uri::PathAndQuery;
use http::Uri;

/// What [`canonical_path`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canonical {
    /// The path is canonical already (nearly every request: one scan, no allocation).
    Unchanged,
    /// The canonical form of the path.
    Changed(String),
    /// Encoded slashes or backslashes, or `;` parameters, next to dot segments or empty
    /// segments. The path would mean something else to an upstream that decodes the slashes
    /// or drops the parameters first.
    Ambiguous,
}

/// The canonical form of a request path (see the [module docs](self)). A path that does not
/// start with `/` (`*`, or an empty path) is left as it is.
///
/// # Examples
///
/// ```
/// use sluice_http::path::{canonical_path, Canonical};
///
/// assert_eq!(canonical_path("/api/x"), Canonical::Unchanged);
/// assert_eq!(canonical_path("/free/../api/x"), Canonical::Changed("/api/x".into()));
/// assert_eq!(canonical_path("//api//x/./"), Canonical::Changed("/api/x/".into()));
/// assert_eq!(canonical_path("/%61pi/%2e%2e/api/a%2fb"), Canonical::Changed("/api/a%2Fb".into()));
/// assert_eq!(canonical_path("/free/..%2Fapi/x"), Canonical::Ambiguous);
/// ```
pub fn canonical_path(path: &str) -> Canonical {
    if !path.starts_with('/') {
        return Canonical::Unchanged;
    }
    let bytes = path.as_bytes();
    if !may_change(bytes) {
        return Canonical::Unchanged;
    }
    let decoded = decode_unreserved(bytes);
    let resolved = resolve(&decoded);
    if read_otherwise(&resolved) {
        return Canonical::Ambiguous;
    }
    if resolved == path {
        Canonical::Unchanged
    } else {
        Canonical::Changed(resolved)
    }
}

/// A path that some upstreams would read as another path (see [`Canonical::Ambiguous`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the path has an encoded slash or backslash, or a `;` parameter, next to a dot segment or \
     an empty one: an upstream that decodes the slash or drops the parameter would read \
     another path"
)]
pub struct AmbiguousPath;

/// `uri` with its path made canonical, the query kept: `Ok(None)` when the path is canonical
/// already.
///
/// # Errors
///
/// [`AmbiguousPath`], or when the canonical path does not make a URI again (it always does:
/// it has only the characters of the path it came from).
///
/// # Examples
///
/// ```
/// use http::Uri;
/// use sluice_http::path::canonical_uri;
///
/// let uri: Uri = "/free/../api/x?k=1".parse()?;
/// assert_eq!(canonical_uri(&uri)?.unwrap(), "/api/x?k=1");
/// assert_eq!(canonical_uri(&"/api/x".parse()?)?, None);
/// assert!(canonical_uri(&"/free/..%2Fapi".parse()?).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn canonical_uri(uri: &Uri) -> Result<Option<Uri>, AmbiguousPath> {
    let path = match canonical_path(uri.path()) {
        Canonical::Unchanged => return Ok(None),
        Canonical::Changed(path) => path,
        Canonical::Ambiguous => return Err(AmbiguousPath),
    };
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(path_and_query).map_err(|_| AmbiguousPath)?);
    Uri::from_parts(parts).map(Some).map_err(|_| AmbiguousPath)
}

/// Whether a `/`-led path may not be canonical: it has an escape, a `;`, a `\\`, a `.` or
/// `..` segment, or two `/` in a row. One pass over the bytes: this runs on every request.
fn may_change(path: &[u8]) -> bool {
    let ends_segment = |at: usize| matches!(path.get(at), None | Some(b'/'));
    path.iter().enumerate().any(|(i, &b)| match b {
        b'%' | b';' | b'\\' => true,
        b'/' => match path.get(i + 1) {
            Some(b'/') => true,
            Some(b'.') => {
                ends_segment(i + 2) || (path.get(i + 2) == Some(&b'.') && ends_segment(i + 3))
            }
            _ => false,
        },
        _ => false,
    })
}

/// Whether a `/`-led path has a `.` or `..` segment, or two `/` in a row.
fn has_dot_or_empty_segment(path: &[u8]) -> bool {
    let mut segments = path.split(|&b| b == b'/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        // An empty last segment is a trailing slash, which is kept.
        let last = segments.peek().is_none();
        if (segment.is_empty() && !last) || segment == b"." || segment == b".." {
            return true;
        }
    }
    false
}

/// Whether some upstream would find a dot segment or an empty one in a resolved path that has
/// none. Two kinds of upstream would:
///
/// - one that decodes `%2F` and `%5C` into separators, or reads a raw `\` as one (as Windows
///   servers do);
/// - one that drops the `;` parameters of each segment before resolving dot segments, as Java
///   servlet containers do (`/free/..;/api` is `/api` to them).
fn read_otherwise(resolved: &str) -> bool {
    let separators =
        resolved.contains("%2F") || resolved.contains("%5C") || resolved.contains('\\');
    let parameters = resolved.contains(';') || resolved.contains("%3B");
    if !separators && !parameters {
        return false;
    }
    let decoded = resolved
        .replace("%2F", "/")
        .replace("%5C", "/")
        .replace('\\', "/")
        .replace("%3B", ";");
    let without_parameters: Vec<&str> = decoded
        .split('/')
        .map(|segment| segment.split(';').next().unwrap_or(""))
        .collect();
    has_dot_or_empty_segment(without_parameters.join("/").as_bytes())
}

/// Decodes the escapes of unreserved characters; upper-cases the hex of the others. A `%`
/// not followed by two hex digits becomes `%25`, the escape of `%`: kept bare, it could start
/// an escape with the digits a decoded escape puts after it (`%6%31` would become `%61`, which
/// an upstream decodes again to `a`). So every `%` of the result starts an escape, and the
/// result is a fixed point. An upstream that reads a bare `%` as itself reads the same path.
fn decode_unreserved(path: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.len());
    let mut i = 0;
    while i < path.len() {
        if let Some(value) = escape_at(path, i) {
            if is_unreserved(value) {
                out.push(value);
            } else {
                out.push(b'%');
                out.push(path[i + 1].to_ascii_uppercase());
                out.push(path[i + 2].to_ascii_uppercase());
            }
            i += 3;
            continue;
        }
        if path[i] == b'%' {
            out.extend_from_slice(b"%25");
        } else {
            out.push(path[i]);
        }
        i += 1;
    }
    out
}

/// The byte a `%XX` escape starting at `at` stands for; `None` when there is no `%` there or
/// it is not followed by two hex digits.
pub(crate) fn escape_at(text: &[u8], at: usize) -> Option<u8> {
    let hex = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    };
    if text.get(at) != Some(&b'%') {
        return None;
    }
    Some(hex(*text.get(at + 1)?)? << 4 | hex(*text.get(at + 2)?)?)
}

/// RFC 3986 §2.3.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// Merges runs of `/` and resolves `.` and `..` segments of a `/`-led path.
fn resolve(path: &[u8]) -> String {
    let mut segments: Vec<&[u8]> = Vec::new();
    // Whether the result ends with `/`: a trailing slash, or a last segment `.` or `..`.
    let mut trailing = false;
    for segment in path.split(|&b| b == b'/').skip(1) {
        trailing = false;
        match segment {
            b"" => trailing = true,
            b"." => trailing = true,
            b".." => {
                segments.pop();
                trailing = true;
            }
            s => segments.push(s),
        }
    }
    let mut out = String::with_capacity(path.len());
    for segment in &segments {
        out.push('/');
        // Only ASCII came in (a `&str` path with unreserved escapes decoded to ASCII).
        out.push_str(&String::from_utf8_lossy(segment));
    }
    if trailing || segments.is_empty() {
        out.push('/');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each input's canonical form is the expected one, which differs from it.
    fn assert_changed(cases: &[(&str, &str)]) {
        for (input, want) in cases {
            assert_eq!(
                canonical_path(input),
                Canonical::Changed((*want).to_owned()),
                "{input}"
            );
        }
    }

    #[test]
    fn canonical_paths_are_left_alone() {
        for p in [
            "/",
            "/api",
            "/api/",
            "/api/x",
            "/api/x.json",
            "/a/.well-known/b",
            "/a/..b/c",
            "/a/b../c",
            "/files/a%2Fb",
            "/app/x;jsessionid=0a1b",
            "/api/;v=2",
            "/q%20r",
            "*",
            "",
        ] {
            assert_eq!(canonical_path(p), Canonical::Unchanged, "{p}");
        }
    }

    #[test]
    fn dot_segments_and_slash_runs_resolve() {
        let cases = [
            ("/free/../api/x", "/api/x"),
            ("/free/./../api/x", "/api/x"),
            ("//api/x", "/api/x"),
            ("/api//x", "/api/x"),
            ("///", "/"),
            ("/..", "/"),
            ("/../../api/x", "/api/x"),
            ("/a/b/..", "/a/"),
            ("/a/b/.", "/a/b/"),
            ("/a/.", "/a/"),
            ("/a/b/../", "/a/"),
            ("/.", "/"),
            ("/a//", "/a/"),
        ];
        assert_changed(&cases);
    }

    #[test]
    fn unreserved_escapes_decode_and_others_upper_case() {
        let cases = [
            ("/%61pi/x", "/api/x"),
            ("/free/%2e%2e/api/x", "/api/x"),
            ("/free/%2E./api/x", "/api/x"),
            ("/a/%7e%5f%2d", "/a/~_-"),
            ("/a/b%2fc", "/a/b%2Fc"),
            ("/a/%c3%a9", "/a/%C3%A9"),
        ];
        assert_changed(&cases);
    }

    #[test]
    fn a_percent_that_starts_no_escape_is_encoded() {
        // Kept bare, the `%` of `/%6%31pi/x` would start an escape once `%31` is decoded: the
        // gateway would route `/%61pi/x` and the upstream serve `/api/x`.
        let cases = [
            ("/%6%31pi/x", "/%2561pi/x"),
            ("/%%36%31pi/x", "/%2561pi/x"),
            ("/%6%61p", "/%256ap"),
            ("/a/%%41", "/a/%25A"),
            ("/a/%zz", "/a/%25zz"),
            ("/a/%4", "/a/%254"),
            ("/a/%", "/a/%25"),
            ("/100%/x", "/100%25/x"),
        ];
        assert_changed(&cases);
        for (_, canonical) in cases {
            assert_eq!(
                canonical_path(canonical),
                Canonical::Unchanged,
                "{canonical}"
            );
        }
    }

    #[test]
    fn separators_and_parameters_next_to_dots_are_ambiguous() {
        for p in [
            "/free/..%2Fapi/x",
            "/free/..%2fapi/x",
            "/free/%2E%2E%2Fapi/x",
            "/free/..%5Capi/x",
            "/free%2F..%2F..%2Fapi",
            "/a/%2F%2Fb",
            "/a/%2F/b",
            "/free/..;/api/x",
            "/free\\..\\api/x",
            "/free/..\\api/x",
            "/free/..;x=1/api/x",
            "/free/.;/api/x",
            "/free/..%3B/api/x",
            "/free/..%3b/api/x",
            "/a/;x/b",
        ] {
            assert_eq!(canonical_path(p), Canonical::Ambiguous, "{p}");
        }
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;

        /// Paths of short segments drawn from letters, dots, slashes and a few escapes.
        fn path() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("a"),
                Just("b"),
                Just("."),
                Just(".."),
                Just(""),
                Just("%2e"),
                Just("%2E%2e"),
                Just("%61"),
                Just("%2F"),
                Just("%20"),
                Just("x.y"),
                Just("x;p=1"),
                Just("..;"),
                Just("%"),
                Just("%6"),
                Just("%36"),
            ];
            proptest::collection::vec(piece, 0..8)
                .prop_map(|pieces| format!("/{}", pieces.join("/")))
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 5_000, ..ProptestConfig::default() })]

            /// The result is canonical: again it is unchanged, it starts with `/`, and it has no
            /// dot segment and no empty segment but a trailing slash.
            #[test]
            fn the_result_is_a_fixed_point(p in path()) {
                if let Canonical::Changed(c) = canonical_path(&p) {
                    prop_assert_eq!(canonical_path(&c), Canonical::Unchanged, "{} -> {}", p, c);
                    prop_assert!(c.starts_with('/'));
                    prop_assert!(!has_dot_or_empty_segment(c.as_bytes()), "{} -> {}", p, c);
                }
            }

            /// The one-pass check agrees with the segment-by-segment definition.
            #[test]
            fn the_quick_check_is_the_definition(p in path()) {
                let special = p.bytes().any(|b| matches!(b, b'%' | b';' | b'\\'));
                prop_assert_eq!(
                    may_change(p.as_bytes()),
                    special || has_dot_or_empty_segment(p.as_bytes()),
                    "{}", p
                );
            }

            /// Spelling a letter or a dot as its escape does not change the canonical path.
            #[test]
            fn escapes_of_unreserved_characters_do_not_matter(p in path(), at in any::<prop::sample::Index>()) {
                // Letters, digits and dots outside escapes (`%2e`'s digits are not candidates).
                let bytes = p.as_bytes();
                let mut candidates = Vec::new();
                let mut j = 0;
                while j < bytes.len() {
                    if escape_at(bytes, j).is_some() {
                        j += 3;
                        continue;
                    }
                    if bytes[j].is_ascii_alphanumeric() || bytes[j] == b'.' {
                        candidates.push(j);
                    }
                    j += 1;
                }
                if candidates.is_empty() {
                    return Ok(());
                }
                let i = candidates[at.index(candidates.len())];
                let c = p.as_bytes()[i];
                let spelled = format!("{}%{:02X}{}", &p[..i], c, &p[i + 1..]);
                let resolve = |q: &str| match canonical_path(q) {
                    Canonical::Unchanged => Some(q.to_owned()),
                    Canonical::Changed(c) => Some(c),
                    Canonical::Ambiguous => None,
                };
                prop_assert_eq!(resolve(&p), resolve(&spelled), "{} vs {}", p, spelled);
            }
        }
    }
}
