//! Rates and quotas: `Rate::from_str`, `Quota::parse`, `Rate::from_per_second_f64`,
//! `Rate::from_interval_ns` and their `Display`.
//!
//! Properties: no panic; a rate that parses prints as text that parses to the same interval
//! (so a config written back from a running gateway means the same); the interval is never
//! shorter than the written rate asks (rounding only ever slows a rate down); a refused rate
//! quotes the text it refused; a quota holds only `capacity × interval ≤ MAX_SPAN_NS`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_core::{Quota, QuotaError, Rate, MAX_SPAN_NS};

/// The input: three little-endian 8-byte numbers (capacity, interval in ns, rate per second as
/// an `f64`), then the rate as text. Shorter inputs are padded with zeros.
struct Input<'a> {
    text: &'a str,
    capacity: u64,
    interval_ns: u64,
    per_second: f64,
}

impl<'a> Input<'a> {
    fn read(data: &'a [u8]) -> Option<Input<'a>> {
        let mut head = [0u8; 24];
        let n = data.len().min(24);
        head[..n].copy_from_slice(&data[..n]);
        let word =
            |i: usize| u64::from_le_bytes(head[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Some(Input {
            text: std::str::from_utf8(&data[n..]).ok()?,
            capacity: word(0),
            interval_ns: word(1),
            per_second: f64::from_bits(word(2)),
        })
    }
}

fuzz_target!(|data: &[u8]| {
    let Some(input) = Input::read(data) else {
        return;
    };
    match input.text.parse::<Rate>() {
        Ok(rate) => round_trips(rate),
        Err(e) => {
            if let QuotaError::Syntax { .. }
            | QuotaError::NonPositiveRate { .. }
            | QuotaError::NotFinite { .. }
            | QuotaError::RateTooHigh { .. }
            | QuotaError::RateTooLow { .. } = e
            {
                let shown = e.to_string();
                assert!(
                    shown.contains(input.text),
                    "{shown:?} quotes {:?}",
                    input.text
                );
            }
        }
    }
    if let Ok(q) = Quota::parse(input.capacity, input.text) {
        assert_eq!(q.capacity(), input.capacity);
        assert!(q.capacity() >= 1);
        let span = q.capacity().checked_mul(q.interval_ns());
        assert!(span.is_some_and(|s| s <= MAX_SPAN_NS), "{q:?}");
        assert_eq!(Some(q.rate()), input.text.parse::<Rate>().ok());
    }
    match Rate::from_interval_ns(input.interval_ns) {
        Ok(rate) => {
            assert_eq!(rate.interval_ns(), input.interval_ns);
            round_trips(rate);
        }
        Err(_) => assert_eq!(input.interval_ns, 0),
    }
    if let Ok(rate) = Rate::from_per_second_f64(input.per_second) {
        assert!(rate.interval_ns() >= 1);
        // Rounded up: the rate never exceeds the one asked for (within float precision).
        let asked_interval = 1e9 / input.per_second;
        assert!(
            rate.interval_ns() as f64 >= asked_interval * (1.0 - 1e-12),
            "{} ns for {}/s",
            rate.interval_ns(),
            input.per_second
        );
        round_trips(rate);
    }
});

/// The rate prints as text that reads back as the same interval.
fn round_trips(rate: Rate) {
    let shown = rate.to_string();
    assert_eq!(
        shown.parse::<Rate>(),
        Ok(rate),
        "{rate:?} shown as {shown:?}"
    );
}
