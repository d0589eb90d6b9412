//! Path canonicalisation: `sluice_http::path::canonical_path` and `canonical_uri`.
//!
//! Properties: no panic; a canonical path is a fixed point (it canonicalises to itself), starts
//! with `/` and has no dot segment and no empty segment but a trailing slash; whatever is left
//! unchanged has none either; spelling an unreserved character as its escape does not change
//! the result; and `canonical_uri` agrees with `canonical_path` and always makes a URI again.
#![no_main]

use http::Uri;
use libfuzzer_sys::fuzz_target;
use sluice_http::path::{canonical_path, canonical_uri, Canonical};

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let result = canonical_path(path);
    match &result {
        Canonical::Changed(c) => {
            assert_ne!(c, path);
            assert!(c.starts_with('/'), "{path:?} -> {c:?}");
            assert!(!has_dot_or_empty_segment(c), "{path:?} -> {c:?}");
            assert_eq!(canonical_path(c), Canonical::Unchanged, "{path:?} -> {c:?}");
        }
        Canonical::Unchanged if path.starts_with('/') => {
            assert!(!has_dot_or_empty_segment(path), "{path:?} left unchanged");
        }
        Canonical::Unchanged | Canonical::Ambiguous => {}
    }
    escapes_do_not_matter(path, &result);
    through_a_uri(path, &result);
});

/// The same path with its first unreserved character (outside an escape) spelled `%XX`
/// canonicalises the same way.
fn escapes_do_not_matter(path: &str, result: &Canonical) {
    let bytes = path.as_bytes();
    let hex = |at: usize| bytes.get(at).is_some_and(u8::is_ascii_hexdigit);
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && hex(i + 1) && hex(i + 2) {
            i += 3;
            continue;
        }
        let b = bytes[i];
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            break;
        }
        i += 1;
    }
    if i >= bytes.len() || !path.starts_with('/') {
        return;
    }
    let spelled = format!("{}%{:02X}{}", &path[..i], bytes[i], &path[i + 1..]);
    let resolve = |q: &str, r: &Canonical| match r {
        Canonical::Unchanged => Some(q.to_owned()),
        Canonical::Changed(c) => Some(c.clone()),
        Canonical::Ambiguous => None,
    };
    assert_eq!(
        resolve(path, result),
        resolve(&spelled, &canonical_path(&spelled)),
        "{path:?} vs {spelled:?}"
    );
}

/// A path that makes a URI: `canonical_uri` gives the same answer, with the query kept.
fn through_a_uri(path: &str, result: &Canonical) {
    if !path.starts_with('/') {
        return;
    }
    let Ok(uri) = format!("{path}?q=1").parse::<Uri>() else {
        return;
    };
    // The URI parser may itself stop the path at `?` or `#`.
    let seen = uri.path().to_owned();
    let expected = if seen == path {
        result.clone()
    } else {
        canonical_path(&seen)
    };
    match (canonical_uri(&uri), expected) {
        (Ok(None), Canonical::Unchanged) => {}
        (Ok(Some(u)), Canonical::Changed(c)) => {
            assert_eq!(u.path(), c);
            assert_eq!(u.query(), uri.query());
        }
        (Err(_), Canonical::Ambiguous) => {}
        (got, want) => panic!("{path:?}: canonical_uri {got:?}, canonical_path {want:?}"),
    }
}

/// Whether a `/`-led path has a `.` or `..` segment, or an empty segment that is not the
/// trailing slash.
fn has_dot_or_empty_segment(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    segments.iter().enumerate().any(|(i, s)| {
        let last = i + 1 == segments.len();
        (s.is_empty() && !last) || *s == "." || *s == ".."
    })
}
