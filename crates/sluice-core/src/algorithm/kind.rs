//! The configuration names of the algorithms.

use core::fmt;
use core::str::FromStr;

/// The algorithms by configuration name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum Kind {
    /// `token_bucket`
    TokenBucket,
    /// `gcra`
    Gcra,
    /// `leaky_bucket`
    LeakyBucket,
    /// `sliding_log`
    SlidingLog,
    /// `sliding_window`
    SlidingWindow,
    /// `fixed_window`
    FixedWindow,
}

impl Kind {
    /// Every kind, in documentation order.
    pub const ALL: [Kind; 6] = [
        Kind::TokenBucket,
        Kind::Gcra,
        Kind::LeakyBucket,
        Kind::SlidingLog,
        Kind::SlidingWindow,
        Kind::FixedWindow,
    ];

    /// The configuration name.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::Gcra => "gcra",
            Kind::LeakyBucket => "leaky_bucket",
            Kind::SlidingLog => "sliding_log",
            Kind::SlidingWindow => "sliding_window",
            Kind::FixedWindow => "fixed_window",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown algorithm name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKind(pub alloc::string::String);

impl fmt::Display for UnknownKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown algorithm `{}`: expected one of token_bucket, gcra, leaky_bucket, sliding_log, sliding_window, fixed_window",
            self.0
        )
    }
}

#[cfg(feature = "std")]
impl std::error::Error for UnknownKind {}

impl FromStr for Kind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Kind, UnknownKind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| UnknownKind(s.into()))
    }
}
