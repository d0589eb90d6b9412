//! Division by a divisor fixed at construction, without a hardware divide on the hot path.
//!
//! `remaining` (whole tokens left) divides by the interval on every decision. A 64-bit divide
//! costs tens of cycles on many CPUs, more than the rest of a GCRA step; a multiply by a
//! precomputed reciprocal and a shift is exact and a few cycles.
//!
//! The dividends are token levels in nanoseconds of refill, at most a window (`tau`, at most
//! [`crate::MAX_SPAN_NS`] = 2^62), so the division only has to be exact below 2^63. That bound
//! buys a reciprocal that fits in 64 bits and needs no correction step: one multiply and two
//! shifts, which matters because the quotient is the last link of the chain from the clock read
//! to the decision.

/// `n / d` for a fixed `d`, exact for every dividend below 2^63.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Divisor {
    /// `ceil(2^(63 + shift) / d)`, which is below 2^64.
    m: u64,
    /// `ceil(log2 d)`.
    shift: u32,
}

impl Divisor {
    /// The divisor `d`, which must not be zero (a quota's interval never is; zero counts as one).
    pub(crate) const fn new(d: u64) -> Divisor {
        let d = if d == 0 { 1 } else { d };
        if d > 1 << 63 {
            // Every dividend is below d: the quotient is always zero.
            return Divisor { m: 0, shift: 0 };
        }
        let shift = if d == 1 {
            0
        } else {
            64 - (d - 1).leading_zeros()
        };
        // d > 2^(shift - 1), so 2^(63 + shift) / d < 2^64 and its ceiling fits (see `div`).
        let m = (1u128 << (63 + shift)).div_ceil(d as u128);
        Divisor { m: m as u64, shift }
    }

    /// `floor(n / d)`, for `n < 2^63`.
    ///
    /// With `k = 63 + shift` and `m = (2^k + e) / d`, `0 <= e < d <= 2^shift`: writing
    /// `n = q·d + r` with `r <= d - 1`, `n·m / 2^k = q + (r + n·e / 2^k) / d`, and
    /// `n·e / 2^k < 2^63 · 2^shift / 2^k = 1`, so `r + n·e / 2^k < d` and the floor is `q`.
    /// `(2n·m) >> 64 >> shift` is that floor (`2n` fits because `n < 2^63`).
    #[inline]
    pub(crate) const fn div(&self, n: u64) -> u64 {
        debug_assert!(n < 1 << 63);
        ((((n << 1) as u128 * self.m as u128) >> 64) as u64) >> self.shift
    }
}

#[cfg(test)]
mod tests {
    use super::Divisor;

    /// The largest dividend the algorithms pass: a level never exceeds the window, which is at
    /// most `MAX_SPAN_NS`.
    const MAX_N: u64 = (1 << 63) - 1;

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
            (1 << 62) / 3,
            (1 << 62) - 1,
            1 << 62,
            (1 << 62) + 1,
            1 << 63,
            (1 << 63) + 1,
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
            (1 << 62) - 1,
            1 << 62,
            (1 << 62) + 1,
            MAX_N - 1,
            MAX_N,
        ];
        for &d in &divisors {
            let div = Divisor::new(d);
            for &n in &dividends {
                assert_eq!(div.div(n), n / d, "{n} / {d}");
            }
            for k in 0..1000u64 {
                let n = k.wrapping_mul(d).wrapping_add(k % 3) & MAX_N;
                assert_eq!(div.div(n), n / d, "{n} / {d}");
                let n = k.wrapping_mul(d.wrapping_sub(1)) & MAX_N;
                assert_eq!(div.div(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn exact_around_multiples_of_small_divisors() {
        for d in 1u64..=300 {
            let div = Divisor::new(d);
            for q in [0u64, 1, 2, 1 << 20, MAX_N / d - 1, MAX_N / d] {
                for n in [q * d, (q * d).saturating_sub(1), q * d + d - 1] {
                    let n = n.min(MAX_N);
                    assert_eq!(div.div(n), n / d, "{n} / {d}");
                }
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn exact_for_any_pair(n in 0..=MAX_N, d in 1u64..) {
            proptest::prop_assert_eq!(Divisor::new(d).div(n), n / d);
        }

        #[test]
        fn exact_for_any_pair_of_quota_sizes(n in 0..=(1u64 << 62), d in 1..=(1u64 << 62)) {
            proptest::prop_assert_eq!(Divisor::new(d).div(n), n / d);
        }
    }
}
