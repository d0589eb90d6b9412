//! HTTP/1.1 request heads read as bytes: `sluice_http::wire::Request::parse` against hyper's
//! HTTP/1.1 server, on the same bytes (the harness of `tests/wire_differential.rs`).
//!
//! Properties: no panic; every request wire reads as plain is one hyper serves with the same
//! method, target, fields, body and keep-alive decision, the next one starting where wire
//! says; a request hyper refuses is never plain.
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
    wire_harness::request_differential(&RUNTIME, data);
});
