//! # sluice-wasm-rt
//!
//! What the two `no_std` WebAssembly modules (`sluice-wasm`, the Service Worker's, and
//! `sluice-js-wasm`, the npm package's) bring themselves, written once:
//!
//! - on wasm32, the allocator and the panic handler (`runtime!()`, expanded in each module),
//!   and `Global`: the module's state in a single-threaded global, the one `unsafe` both
//!   modules rest on;
//! - [`Buffers`]: the areas in linear memory through which numbers and text cross the ABI
//!   (`out` for single results, `list` for lists, `input` for text JavaScript writes, `error`
//!   for the last failure's message).
//!
//! ```
//! use sluice_wasm_rt::Buffers;
//!
//! let mut io: Buffers<4> = Buffers::new();
//! let at = io.input(5);
//! assert!(!at.is_null());
//! io.input.copy_from_slice(b"gcra!");
//! assert_eq!(io.input_str(4), Some("gcra"));
//! assert_eq!(io.input_str(6), None); // longer than what was written
//! io.fail(format_args!("unknown algorithm {:?}", "gcra!"));
//! assert_eq!(io.error, "unknown algorithm \"gcra!\"");
//! ```
#![no_std]

extern crate alloc;
// Natively (unit tests, docs, clippy) std supplies the allocator and panic handler.
#[cfg(not(target_arch = "wasm32"))]
extern crate std;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

#[cfg(target_arch = "wasm32")]
mod global;
#[cfg(target_arch = "wasm32")]
pub use global::Global;
// For `runtime!()`, which names the allocator from the module's crate.
#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub use dlmalloc;

/// The ABI's buffers: `out` holds `OUT` floats at an address that never moves; `list` may
/// move on every call (JavaScript reads its address again after each one).
#[derive(Debug)]
pub struct Buffers<const OUT: usize> {
    /// Single results.
    pub out: [f64; OUT],
    /// Lists of results (outcomes, snapshots).
    pub list: Vec<f64>,
    /// Bytes JavaScript writes before a call that reads text.
    pub input: Vec<u8>,
    /// The UTF-8 message of the last failed call.
    pub error: String,
}

// `#[inline]`: compiled in each module under its own profile (Cargo.toml).
impl<const OUT: usize> Buffers<OUT> {
    /// Empty buffers (a `const fn`, for a static).
    pub const fn new() -> Buffers<OUT> {
        Buffers {
            out: [0.0; OUT],
            list: Vec::new(),
            input: Vec::new(),
            error: String::new(),
        }
    }

    /// Records `message` as the last error.
    #[inline]
    pub fn fail(&mut self, message: impl core::fmt::Display) {
        self.error.clear();
        let _ = write!(self.error, "{message}");
    }

    /// Makes room for `len` input bytes (zeroed) and returns their address.
    #[inline]
    pub fn input(&mut self, len: u32) -> *mut u8 {
        self.input.clear();
        self.input.resize(len as usize, 0);
        self.input.as_mut_ptr()
    }

    /// The first `len` input bytes as text, if there are that many and they are UTF-8.
    #[inline]
    pub fn input_str(&self, len: u32) -> Option<&str> {
        core::str::from_utf8(self.input.get(..len as usize)?).ok()
    }
}

impl<const OUT: usize> Default for Buffers<OUT> {
    fn default() -> Buffers<OUT> {
        Buffers::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_resized_and_read_back_as_text_only_when_valid() {
        let mut io: Buffers<2> = Buffers::new();
        io.input(3);
        assert_eq!(io.input, [0, 0, 0]);
        io.input.copy_from_slice(&[0x66, 0xff, 0x6f]);
        assert_eq!(io.input_str(1), Some("f"));
        assert_eq!(io.input_str(3), None, "not UTF-8");
        io.input(0);
        assert_eq!(io.input_str(0), Some(""));
        io.fail("first");
        io.fail(42);
        assert_eq!(io.error, "42", "the last error replaces the one before");
    }
}
