//! Division by a divisor fixed at construction, without a hardware divide on the hot path.
//!
//! `remaining` (whole tokens left) divides by the interval on every decision. A 64-bit divide
//! costs tens of cycles on many CPUs, more than the rest of a GCRA step; a multiply by the
//! precomputed reciprocal and one correction step is exact and a few cycles.

/// `n / d` for a fixed `d`, exact for every `u64` dividend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    d: u64,
    /// `floor(2^64 / d)`; `2^64` itself when `d` is 1, hence `u128`.
    m: u128,
}

impl Divisor {
    /// The divisor `d`, which must not be zero (a quota's interval never is).
    pub(crate) const fn new(d: u64) -> Divisor {
        let d = if d == 0 { 1 } else { d };
        Divisor {
            d,
            m: (1u128 << 64) / d as u128,
        }
    }

    /// `floor(n / d)`.
    ///
    /// With `m = floor(2^64 / d)`, `q = floor(n·m / 2^64)` satisfies
    /// `n/d − 1 < n/d − n/2^64 ≤ n·m/2^64 ≤ n/d`, so `q` is `floor(n/d)` or one less; the
    /// remainder tells which.
    #[inline]
    pub(crate) const fn div(&self, n: u64) -> u64 {
        let q = ((n as u128 * self.m) >> 64) as u64;
        if n - q * self.d >= self.d {
            q + 1
        } else {
            q
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Divisor;

    #[test]
    fn exact_for_edge_dividends_and_divisors() {
        let divisors = [
            1u64,
            2,
            3,
            7,
            10,
            1_000,
            333_333_334,
            1 << 32,
            (1 << 32) + 1,
            u64::MAX / 3,
            u64::MAX,
        ];
        let dividends = [
            0u64,
            1,
            2,
            3,
            999,
            1 << 31,
            1 << 32,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX - 1,
            u64::MAX,
        ];
        for &d in &divisors {
            let div = Divisor::new(d);
            for &n in &dividends {
                assert_eq!(div.div(n), n / d, "{n} / {d}");
            }
            for k in 0..1000u64 {
                let n = k.wrapping_mul(d).wrapping_add(k % 3);
                assert_eq!(div.div(n), n / d, "{n} / {d}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn exact_for_any_pair(n in proptest::num::u64::ANY, d in 1u64..) {
            proptest::prop_assert_eq!(Divisor::new(d).div(n), n / d);
        }
    }
}
