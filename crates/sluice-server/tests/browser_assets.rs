//! The browser assets as `sluice serve` sends them over a real socket: `br` and `gzip` when the
//! request's `Accept-Encoding` allows, `Vary: Accept-Encoding`, bodies that decompress to the
//! plain one, `no-cache` for the scripts and a year's `immutable` for the content-hashed module,
//! and the import forms of the worker (`/sluice/sw-import.js`, `/sluice/sw.mjs`).

mod common;

use std::io::Read;

use common::{get_with, Gateway, Upstream};
use http::StatusCode;
use sluice_server::browser::assets::{self, WASM};

fn config(upstream: &str) -> String {
    format!("[[route]]\npath_prefix = \"/\"\nupstream = \"{upstream}\"\n[browser]\ncapacity = 4\n")
}

fn unbrotli(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    brotli::Decompressor::new(bytes, 4096)
        .read_to_end(&mut out)
        .expect("a valid br stream");
    out
}

fn ungzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a valid gzip stream");
    out
}

/// The module's content-hashed path: `/sluice/sluice.<64-bit FNV-1a of its bytes>.wasm`.
fn wasm_path() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in WASM {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("/sluice/sluice.{h:016x}.wasm")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_are_compressed_as_accepted_and_decompress_to_the_plain_bytes() {
    let up = Upstream::start().await;
    let text = config(&up.url());
    let gw = Gateway::start("", &text).await;
    let wasm = wasm_path();
    assert_eq!(assets::wasm_path(), wasm);
    for path in [
        "/sluice/sw.js",
        "/sluice/sw-import.js",
        "/sluice/sw.mjs",
        "/sluice/client.js",
        "/sluice/config.json",
        wasm.as_str(),
    ] {
        let plain = get_with(&gw.url(path), &[]).await;
        assert_eq!(plain.status, StatusCode::OK, "{path}");
        assert_eq!(plain.header("content-encoding"), None, "{path}");
        assert_eq!(plain.header("vary"), Some("Accept-Encoding"), "{path}");
        let cache = if path == wasm {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        assert_eq!(plain.header("cache-control"), Some(cache), "{path}");

        let br = get_with(
            &gw.url(path),
            &[("accept-encoding", "gzip, deflate, br, zstd")],
        )
        .await;
        assert_eq!(br.status, StatusCode::OK);
        assert_eq!(br.header("content-encoding"), Some("br"), "{path}");
        assert_eq!(br.header("vary"), Some("Accept-Encoding"));
        assert_eq!(br.header("cache-control"), Some(cache));
        assert_eq!(
            br.header("content-length"),
            Some(br.body.len().to_string().as_str())
        );
        assert_eq!(unbrotli(&br.body), plain.body, "{path}: br");

        let gz = get_with(&gw.url(path), &[("accept-encoding", "gzip, br;q=0")]).await;
        assert_eq!(gz.header("content-encoding"), Some("gzip"), "{path}");
        assert_eq!(ungzip(&gz.body), plain.body, "{path}: gzip");

        let none = get_with(&gw.url(path), &[("accept-encoding", "identity")]).await;
        assert_eq!(none.header("content-encoding"), None);
        assert_eq!(none.body, plain.body);

        // Each form has its own tag, and any of them is current.
        let tags = [&plain, &br, &gz].map(|a| a.header("etag").unwrap().to_owned());
        assert!(tags[0] != tags[1] && tags[1] != tags[2] && tags[0] != tags[2]);
        for tag in &tags {
            let again = get_with(
                &gw.url(path),
                &[("accept-encoding", "br"), ("if-none-match", tag)],
            )
            .await;
            assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{path} {tag}");
            assert!(again.body.is_empty());
            assert_eq!(again.header("etag"), Some(tag.as_str()));
            assert_eq!(again.header("vary"), Some("Accept-Encoding"));
        }
        if path.ends_with(".js") || path.ends_with(".mjs") {
            assert!(
                br.body.len() < plain.body.len() / 2,
                "{path}: {} of {}",
                br.body.len(),
                plain.body.len()
            );
        }
    }

    let wasm_plain = get_with(&gw.url(&wasm), &[]).await;
    assert_eq!(wasm_plain.header("content-type"), Some("application/wasm"));
    assert!(wasm_plain.body == WASM);
    let sw = get_with(&gw.url("/sluice/sw.js"), &[("accept-encoding", "br")]).await;
    assert_eq!(sw.header("service-worker-allowed"), Some("/"));
    let sw = String::from_utf8(unbrotli(&sw.body)).unwrap();
    let import = get_with(&gw.url("/sluice/sw-import.js"), &[]).await;
    let import = String::from_utf8(import.body.to_vec()).unwrap();
    let module = get_with(&gw.url("/sluice/sw.mjs"), &[]).await;
    let module = String::from_utf8(module.body.to_vec()).unwrap();
    // The import forms: the same prefix, the mode line, the same web/sw.js.
    let prefix = sw
        .strip_suffix(assets::SW_SOURCE)
        .expect("sw.js ends with web/sw.js");
    assert_eq!(
        import,
        format!("{prefix}{}{}", assets::IMPORT_MODE_LINE, assets::SW_SOURCE)
    );
    assert_eq!(module, format!("{import}{}", assets::MODULE_EXPORTS));
    assert_eq!(
        assets::IMPORT_MODE_LINE,
        "self.__SLUICE_MODE__ = \"import\";\n"
    );
}
