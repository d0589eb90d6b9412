//! Keys that are secrets (API keys, bearer tokens, session cookies) stored as a keyed hash.
//!
//! A policy keyed by a header, a cookie or a query parameter keeps one bucket per value, and a
//! store that keeps its buckets outside the process (a file, Redis) would write each value
//! verbatim. [`KeyHasher`] turns such a key into HMAC-SHA256(salt, key) truncated to 128 bits,
//! in hex: the same for every gateway with the same salt (so gateways sharing a Redis share the
//! salt), unusable to anyone who reads the store without it. IP keys are not secrets and stay
//! readable.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// HMAC-SHA256 of keys under a salt. Clones share nothing mutable.
///
/// # Examples
///
/// ```
/// use sluice_http::KeyHasher;
///
/// let hasher = KeyHasher::new(b"a secret salt");
/// let stored = hasher.hash("sk-live-0123456789");
/// assert_eq!(stored.len(), 32);
/// assert!(!stored.contains("0123456789"));
/// assert_eq!(stored, KeyHasher::new(b"a secret salt").hash("sk-live-0123456789"));
/// assert_ne!(stored, KeyHasher::new(b"another salt").hash("sk-live-0123456789"));
/// ```
#[derive(Clone)]
pub struct KeyHasher {
    /// The MAC with the salt already absorbed: each key costs two compressions.
    keyed: Hmac<Sha256>,
}

impl fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the salt.
        f.write_str("KeyHasher(HMAC-SHA256)")
    }
}

impl KeyHasher {
    /// A hasher under `salt` (any length; an empty salt still hides the key's text but not
    /// its value from a guess).
    pub fn new(salt: &[u8]) -> KeyHasher {
        KeyHasher {
            keyed: Hmac::<Sha256>::new_from_slice(salt).expect("HMAC takes keys of any length"),
        }
    }

    /// `key` as stored: the first 16 bytes of HMAC-SHA256(salt, key), as 32 lowercase hex
    /// digits.
    pub fn hash(&self, key: &str) -> String {
        let mut mac = self.keyed.clone();
        mac.update(key.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = String::with_capacity(32);
        for byte in &digest[..16] {
            out.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(byte & 0xf)]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::KeyHasher;

    #[test]
    fn matches_the_rfc_4231_vector_truncated() {
        // RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
        assert_eq!(
            KeyHasher::new(b"Jefe").hash("what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c7"
        );
    }
}
