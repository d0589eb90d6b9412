//! The embedded browser files, and the served `/sluice/sw.js`: a generated prefix (the
//! worker's configuration and the module) followed by the worker's script (`web/sw.js`), byte
//! for byte as `web/build-sw.mjs` writes it.

/// The browser limiter: `sluice-wasm` built for `wasm32-unknown-unknown` in release by this
/// crate's `build.rs` (or the file named by `SLUICE_WASM` at build time).
pub static WASM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/sluice_wasm.wasm"));

/// `web/sw.js`: the Service Worker, served after the prefix, unchanged. `build.rs` bundles it
/// from the ES modules of `web/sw/` (`build/sw_bundle.rs`); `tests/sw_bundle.rs` checks that the
/// committed `web/sw.js` is these bytes.
pub static SW_SOURCE: &str = include_str!(concat!(env!("OUT_DIR"), "/sw.js"));

/// `web/client.js`: `register()` and `politeFetch()`.
pub static CLIENT_JS: &str = include_str!("../../../../web/client.js");

/// `web/demo.html`: the demo page.
pub static DEMO_HTML: &str = include_str!("../../../../web/demo.html");

/// `web/demo.js`: the demo page's script.
pub static DEMO_JS: &str = include_str!("../../../../web/demo.js");

/// `/sluice/sluice.<hash>.wasm`: where the gateway also serves the module, under a name that
/// changes with its bytes (a 64-bit FNV-1a, 16 hex digits), so it may be cached for a year.
pub fn wasm_path() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in WASM {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("/sluice/sluice.{h:016x}.wasm")
}

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

/// The line after the prefix in the import form: `sw.js` then registers no listeners and
/// exposes `self.sluice = { handle, state, ready }` for the app's own worker.
pub const IMPORT_MODE_LINE: &str = "self.__SLUICE_MODE__ = \"import\";\n";

/// The lines after `web/sw.js` in the ES module form.
pub const MODULE_EXPORTS: &str =
    "\nexport const sluice = self.sluice;\nexport default self.sluice;\n";

/// The import form, for an app's own classic worker (`importScripts()`): the prefix, the
/// [`IMPORT_MODE_LINE`], then `web/sw.js` unchanged.
pub fn service_worker_import(config_json: &str) -> String {
    let mut script = prefix(config_json, WASM);
    script.push_str(IMPORT_MODE_LINE);
    script.push_str(SW_SOURCE);
    script
}

/// The ES module form, for an app's own `{type: 'module'}` worker: the import form followed by
/// [`MODULE_EXPORTS`] (`export const sluice`, `export default`).
pub fn service_worker_module(config_json: &str) -> String {
    let mut script = service_worker_import(config_json);
    script.push_str(MODULE_EXPORTS);
    script
}

/// A content coding the gateway serves the assets in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `br` (RFC 7932), quality 9.
    Brotli,
    /// `gzip` (RFC 1952), level 9.
    Gzip,
}

impl Coding {
    /// The token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    /// `bytes` compressed, at the highest ratio (the assets are compressed once per
    /// configuration, not per request).
    pub fn compress(self, bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        match self {
            Coding::Brotli => {
                let mut out = Vec::with_capacity(bytes.len() / 3);
                let params = brotli::enc::BrotliEncoderParams {
                    quality: 9,
                    lgwin: 22,
                    size_hint: bytes.len(),
                    ..Default::default()
                };
                let mut input = bytes;
                // Reading from a slice and writing to a Vec cannot fail.
                let _ = brotli::BrotliCompress(&mut input, &mut out, &params);
                out
            }
            Coding::Gzip => {
                let mut gz = flate2::write::GzEncoder::new(
                    Vec::with_capacity(bytes.len() / 3),
                    flate2::Compression::best(),
                );
                let _ = gz.write_all(bytes);
                gz.finish().unwrap_or_default()
            }
        }
    }
}

/// The coding to answer with for a request's `Accept-Encoding` values: `br` if accepted, else
/// `gzip`, else none. A coding is accepted when listed (or matched by `*`) with a q-value
/// above 0 (RFC 9110, section 12.5.3).
///
/// # Examples
///
/// ```
/// use sluice_server::browser::assets::{negotiate, Coding};
///
/// assert_eq!(negotiate(["gzip, deflate, br, zstd"]), Some(Coding::Brotli));
/// assert_eq!(negotiate(["gzip", "br;q=0"]), Some(Coding::Gzip));
/// assert_eq!(negotiate(["identity"]), None);
/// assert_eq!(negotiate(["*"]), Some(Coding::Brotli));
/// ```
pub fn negotiate<'a>(values: impl IntoIterator<Item = &'a str>) -> Option<Coding> {
    let (mut br, mut gzip, mut star) = (None, None, None);
    for item in values.into_iter().flat_map(|v| v.split(',')) {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| p.trim().strip_prefix("q=").or(p.trim().strip_prefix("Q=")))
            .find_map(|q| q.trim().parse::<f32>().ok())
            .unwrap_or(1.0);
        let ok = q > 0.0;
        match name.as_str() {
            "br" => br = Some(ok),
            "gzip" | "x-gzip" => gzip = Some(ok),
            "*" => star = Some(ok),
            _ => {}
        }
    }
    let star = star.unwrap_or(false);
    if br.unwrap_or(star) {
        Some(Coding::Brotli)
    } else if gzip.unwrap_or(star) {
        Some(Coding::Gzip)
    } else {
        None
    }
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
    fn compressed_forms_decompress_to_the_plain_bytes() {
        use std::io::Read;
        let plain = service_worker("{}");
        let br = Coding::Brotli.compress(plain.as_bytes());
        let mut back = Vec::new();
        brotli::Decompressor::new(&br[..], 4096)
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, plain.as_bytes());
        let gz = Coding::Gzip.compress(plain.as_bytes());
        let mut back = Vec::new();
        flate2::read::GzDecoder::new(&gz[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, plain.as_bytes());
        assert!(br.len() < gz.len() && gz.len() < plain.len() / 2);
    }

    #[test]
    fn negotiation() {
        assert_eq!(negotiate(["gzip, br"]), Some(Coding::Brotli));
        assert_eq!(negotiate(["br;q=0, gzip;q=0.5"]), Some(Coding::Gzip));
        assert_eq!(negotiate(["*;q=0"]), None);
        assert_eq!(negotiate(["*, br;q=0"]), Some(Coding::Gzip));
        assert_eq!(negotiate(["GZIP"]), Some(Coding::Gzip));
        assert_eq!(negotiate(["deflate"]), None);
        assert_eq!(negotiate([]), None);
    }

    #[test]
    fn the_embedded_module_and_script() {
        assert!(WASM.starts_with(b"\0asm\x01\0\0\0"), "not a wasm module");
        let script = service_worker("{}");
        assert!(script.starts_with(PREFIX_COMMENT));
        assert!(script.ends_with(SW_SOURCE));
        let import = service_worker_import("{}");
        assert_eq!(
            import,
            format!("{}{IMPORT_MODE_LINE}{SW_SOURCE}", prefix("{}", WASM))
        );
        let module = service_worker_module("{}");
        assert_eq!(module, format!("{import}{MODULE_EXPORTS}"));
        let third = script.lines().nth(2).unwrap();
        assert_eq!(
            third.len(),
            WASM_LINE_HEAD.len() + WASM.len().div_ceil(3) * 4 + 3
        );
    }
}
