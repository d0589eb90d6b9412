//! The WebSocket opening handshake's keys (RFC 6455 §4), for a WebSocket that a client opens
//! over HTTP/2 (RFC 8441 extended `CONNECT`, which has no key) and the gateway opens to its
//! upstream with an HTTP/1.1 upgrade (which needs one): a fresh `Sec-WebSocket-Key`, and the
//! `Sec-WebSocket-Accept` the upstream must answer it with.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use http::HeaderValue;
use sha1::{Digest as _, Sha1};

/// `Sec-WebSocket-Key`: 16 random bytes, base64.
pub fn new_key() -> HeaderValue {
    let nonce: [u8; 16] = rand::random();
    HeaderValue::from_str(&STANDARD.encode(nonce)).expect("base64 is a valid header value")
}

/// The `Sec-WebSocket-Accept` that answers `key`: base64 of the SHA-1 of the key followed
/// by RFC 6455's GUID.
///
/// # Examples
///
/// ```
/// // RFC 6455 §1.3.
/// assert_eq!(
///     sluice_http::websocket::accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
///     "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
/// );
/// ```
pub fn accept(key: &[u8]) -> String {
    const GUID: &[u8] = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
    let mut sha = Sha1::new();
    sha.update(key);
    sha.update(GUID);
    STANDARD.encode(sha.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fresh_and_well_formed() {
        let (a, b) = (new_key(), new_key());
        assert_ne!(a, b);
        assert_eq!(a.len(), 24);
        assert_eq!(
            accept(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
