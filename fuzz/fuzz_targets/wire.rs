//! HTTP/1.1 heads read as bytes: `sluice_http::wire` against hyper, on the same bytes (the
//! harness of `tests/wire_differential.rs`). An input that starts with `HTTP/` is an upstream's
//! answer, read by `wire::Response::parse` and hyper's HTTP/1.1 client; any other is what a
//! client sends, read by `wire::Request::parse` and hyper's HTTP/1.1 server.
//!
//! Properties: no panic; every request wire reads as plain is one hyper serves with the same
//! method, target, body and keep-alive decision and the fields the byte path forwards, the
//! next one starting where wire says; a request hyper refuses is never plain, and a head wire
//! finds too large is one hyper answers 431, wherever it stands on the connection. Every
//! answer wire reads as final is one hyper's client reads with the same status, fields, body
//! and keep-alive decision.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use tokio::runtime::Runtime;

#[path = "../../crates/sluice-http/tests/support/wire_harness.rs"]
mod wire_harness;

/// One paused-clock runtime for every input.
static RUNTIME: LazyLock<Runtime> = LazyLock::new(wire_harness::paused_runtime);

fuzz_target!(|data: &[u8]| {
    // Past twice the head limit every head is too large for both sides: nothing to learn.
    if data.len() > 2 * wire_harness::MAX_HEAD {
        return;
    }
    if data.starts_with(b"HTTP/") {
        wire_harness::response_differential(&RUNTIME, data, false);
    } else {
        wire_harness::request_differential(&RUNTIME, data);
    }
});
