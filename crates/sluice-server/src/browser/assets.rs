//! The embedded browser files, and the served `/sluice/sw.js`: a generated prefix (the
//! worker's configuration and the module) followed by `web/sw.js`, byte for byte as
//! `web/build-sw.mjs` writes it.

/// The browser limiter: `sluice-wasm` built for `wasm32-unknown-unknown` in release by this
/// crate's `build.rs` (or the file named by `SLUICE_WASM` at build time).
pub static WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice_wasm.wasm"));

/// `web/sw.js`: the Service Worker, served after the prefix, unchanged.
pub static SW_SOURCE: &str = include_str!("../../../../web/sw.js");

/// `web/client.js`: `register()` and `politeFetch()`.
pub static CLIENT_JS: &str = include_str!("../../../../web/client.js");

/// `web/demo.html`: the demo page.
pub static DEMO_HTML: &str = include_str!("../../../../web/demo.html");

/// `web/demo.js`: the demo page's script.
pub static DEMO_JS: &str = include_str!("../../../../web/demo.js");

/// The first line of the prefix.
pub const PREFIX_COMMENT: &str =
    "// sluice: generated prefix (configuration and module); web/sw.js follows\n";

/// The third line of the prefix up to the base64 text.
const WASM_LINE_HEAD: &str = "self.__SLUICE_WASM__ = (function (s) { var b = atob(s), u = new Uint8Array(b.length); for (var i = 0; i < b.length; i++) u[i] = b.charCodeAt(i); return u; })(\"";

/// The generated prefix: exactly three lines (`web/README.md`, "The sw.js contract").
///
/// # Examples
///
/// ```
/// use sluice_server::browser::assets::prefix;
///
/// let p = prefix(r#"{"capacity":10}"#, b"\0asm");
/// let lines: Vec<&str> = p.lines().collect();
/// assert_eq!(lines.len(), 3);
/// assert_eq!(lines[1], r#"self.__SLUICE_CONFIG__ = {"capacity":10};"#);
/// assert!(lines[2].ends_with(r#"("AGFzbQ==");"#));
/// ```
pub fn prefix(config_json: &str, wasm: &[u8]) -> String {
    let mut out = String::with_capacity(
        PREFIX_COMMENT.len() + config_json.len() + WASM_LINE_HEAD.len() + wasm.len() * 4 / 3 + 64,
    );
    out.push_str(PREFIX_COMMENT);
    out.push_str("self.__SLUICE_CONFIG__ = ");
    out.push_str(config_json);
    out.push_str(";\n");
    out.push_str(WASM_LINE_HEAD);
    base64(wasm, &mut out);
    out.push_str("\");\n");
    out
}

/// The whole served script for the worker configuration `config_json` (one JSON object).
pub fn service_worker(config_json: &str) -> String {
    let mut script = prefix(config_json, WASM);
    script.push_str(SW_SOURCE);
    script
}

/// Appends `bytes` to `out` in standard base64 (RFC 4648 alphabet, `=` padding, no line
/// breaks), as `atob` reads it.
pub fn base64(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sextet = |n: u32, shift: u32| char::from(ALPHABET[((n >> shift) & 63) as usize]);
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let n = u32::from(c[0]) << 16 | u32::from(c[1]) << 8 | u32::from(c[2]);
        out.extend([sextet(n, 18), sextet(n, 12), sextet(n, 6), sextet(n, 0)]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend([sextet(n, 18), sextet(n, 12), '=', '=']);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend([sextet(n, 18), sextet(n, 12), sextet(n, 6), '=']);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(bytes: &[u8]) -> String {
        let mut s = String::new();
        base64(bytes, &mut s);
        s
    }

    #[test]
    fn base64_matches_rfc_4648() {
        // RFC 4648, section 10.
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(b64(plain.as_bytes()), encoded);
        }
        assert_eq!(b64(&[0xfb, 0xff, 0xbf]), "+/+/");
    }

    #[test]
    fn the_embedded_module_and_script() {
        assert!(WASM.starts_with(b"\0asm\x01\0\0\0"), "not a wasm module");
        let script = service_worker("{}");
        assert!(script.starts_with(PREFIX_COMMENT));
        assert!(script.ends_with(SW_SOURCE));
        let third = script.lines().nth(2).unwrap();
        assert_eq!(
            third.len(),
            WASM_LINE_HEAD.len() + WASM.len().div_ceil(3) * 4 + 3
        );
    }
}
