//! The browser limiter, served by the gateway: with a `[browser]` table, the main
//! listener answers these paths itself, before the route table, and proxies everything else.
//!
//! | method, path | answer |
//! |---|---|
//! | `GET /sluice/sw.js` | the Service Worker: a three-line generated prefix (the worker's configuration and the embedded `sluice-wasm` module in base64), then `web/sw.js` unchanged; `Service-Worker-Allowed: /` |
//! | `GET /sluice/sw-import.js`, `/sluice/sw.mjs` | the import forms of the worker, for an app's own worker: the same prefix, `self.__SLUICE_MODE__ = "import";`, `web/sw.js` (and, in `sw.mjs`, two `export` lines) |
//! | `GET /sluice/client.js`, `/sluice/demo.html`, `/sluice/demo.js` | the files of `web/`, embedded |
//! | `GET /sluice/sluice.<hash>.wasm` | the module alone, under a content-hashed name ([`assets::wasm_path`]): `Cache-Control: public, max-age=31536000, immutable` |
//! | `GET /sluice/config.json` | the worker's configuration ([`BrowserConfig::worker_json`](crate::config::BrowserConfig::worker_json)) |
//! | `POST /v1/telemetry` (`browser.telemetry.endpoint`) | a batch of the worker's counters: 204, 400 malformed, 413 over 1 KiB, 429 over `telemetry.limit` per client address; added to the `sluice_browser_*` metrics |
//!
//! Every file is sent `br` or `gzip` when the request's `Accept-Encoding` allows (compressed
//! once, when the configuration is loaded), with `Vary: Accept-Encoding`, an `ETag` per form
//! and `Cache-Control: no-cache` (the content-hashed module excepted).
//!
//! [`assets`] holds the embedded files and writes the served script, [`telemetry`] reads
//! batches and keeps the metrics, and [`Browser`] answers the requests. The contract (the
//! prefix, the JSON, the batch schema) is `web/README.md`.

pub mod assets;
mod handler;
pub mod telemetry;

pub use handler::Browser;
