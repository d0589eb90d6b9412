//! [`key_hash`]: the keyed hash under which the gateway stores keys taken from headers,
//! cookies and query parameters, so that a JavaScript process reaches the same buckets.
//!
//! The same construction as `sluice_http::KeyHasher` (`crates/sluice-http/src/key_hash.rs`),
//! on the same `hmac` and `sha2` crates: HMAC-SHA256(salt, key), its first 16 bytes.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The first 16 bytes of HMAC-SHA256 keyed by `salt` over `key` (the gateway writes them as 32
/// lowercase hex digits). Any salt length is valid; the gateway without `store.key_salt` uses
/// the empty salt.
pub fn key_hash(salt: &[u8], key: &[u8]) -> [u8; 16] {
    let mut mac = Hmac::<Sha256>::new_from_slice(salt).expect("HMAC takes keys of any length");
    mac.update(key);
    let digest = mac.finalize().into_bytes();
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

#[cfg(test)]
mod tests {
    use super::key_hash;

    fn hex(bytes: &[u8]) -> std::string::String {
        bytes.iter().map(|b| std::format!("{b:02x}")).collect()
    }

    #[test]
    fn matches_the_gateway_vector() {
        // RFC 4231, test case 2, truncated to 128 bits: the vector
        // crates/sluice-http/src/key_hash.rs pins for the gateway's KeyHasher.
        assert_eq!(
            hex(&key_hash(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c7"
        );
    }

    #[test]
    fn the_empty_salt_is_a_salt_like_any_other() {
        // HMAC-SHA256 with an empty key over the empty message.
        assert_eq!(hex(&key_hash(b"", b"")), "b613679a0814d9ec772f95d778c35fc5");
    }
}
