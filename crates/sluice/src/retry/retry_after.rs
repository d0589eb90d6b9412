//! The HTTP `Retry-After` header (RFC 9110, section 10.2.3): delay-seconds or an HTTP-date.

use std::fmt;
use std::time::{Duration, SystemTime};

/// A parsed `Retry-After` value: how long the server asked us to wait.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use sluice::retry::RetryAfter;
///
/// let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // Wed, 21 Oct 2015 07:28:00 GMT
///
/// let delta = RetryAfter::parse("120")?;
/// assert_eq!(delta, RetryAfter::Delay(Duration::from_secs(120)));
/// assert_eq!(delta.delay_from(now), Duration::from_secs(120));
///
/// let date = RetryAfter::parse("Wed, 21 Oct 2015 07:28:30 GMT")?;
/// assert_eq!(date.delay_from(now), Duration::from_secs(30));
///
/// let err = RetryAfter::parse("soon").unwrap_err();
/// assert_eq!(err.value(), "soon");
/// # Ok::<(), sluice::retry::InvalidRetryAfter>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// `delay-seconds`: wait this long from when the response was received.
    Delay(Duration),
    /// `HTTP-date`: wait until this moment on the wall clock.
    At(SystemTime),
}

/// A `Retry-After` value was neither delay-seconds nor an HTTP-date.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid Retry-After value `{value}`: expected delay-seconds (`120`) \
     or an HTTP-date (`Wed, 21 Oct 2015 07:28:00 GMT`)"
)]
pub struct InvalidRetryAfter {
    value: String,
}

// === impl RetryAfter ===

impl RetryAfter {
    /// Parses a header value. Surrounding spaces and tabs are ignored.
    ///
    /// `delay-seconds` is one or more ASCII digits; a value too large for a `u64` is read as
    /// `u64::MAX` seconds (RFC 9111 treats overflowing delta-seconds as "very large" too). The
    /// HTTP-date may be in any of the three formats RFC 9110 requires recipients to accept
    /// (IMF-fixdate, RFC 850, asctime).
    ///
    /// # Errors
    ///
    /// [`InvalidRetryAfter`], naming the value, for anything else: an empty value, a sign, a
    /// fraction, a unit, or a malformed date.
    pub fn parse(value: &str) -> Result<RetryAfter, InvalidRetryAfter> {
        let trimmed = value.trim_matches([' ', '\t']);
        if !trimmed.is_empty() && trimmed.bytes().all(|b| b.is_ascii_digit()) {
            let secs = trimmed.parse::<u64>().unwrap_or(u64::MAX);
            return Ok(RetryAfter::Delay(Duration::from_secs(secs)));
        }
        httpdate::parse_http_date(trimmed)
            .map(RetryAfter::At)
            .map_err(|_| InvalidRetryAfter {
                value: value.to_owned(),
            })
    }

    /// Parses a header value given as bytes, as HTTP libraries hand it over.
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse); bytes that are not UTF-8 are invalid, and the error shows them
    /// lossily decoded.
    pub fn parse_bytes(value: &[u8]) -> Result<RetryAfter, InvalidRetryAfter> {
        match std::str::from_utf8(value) {
            Ok(text) => RetryAfter::parse(text),
            Err(_) => Err(InvalidRetryAfter {
                value: String::from_utf8_lossy(value).into_owned(),
            }),
        }
    }

    /// Parses a value and turns it into a delay from `now` in one step.
    ///
    /// # Errors
    ///
    /// As [`parse`](Self::parse).
    pub fn parse_delay(value: &str, now: SystemTime) -> Result<Duration, InvalidRetryAfter> {
        RetryAfter::parse(value).map(|after| after.delay_from(now))
    }

    /// How long to wait, counted from `now` (the wall-clock time the response arrived). A date
    /// in the past means no wait.
    pub fn delay_from(&self, now: SystemTime) -> Duration {
        match *self {
            RetryAfter::Delay(delay) => delay,
            RetryAfter::At(at) => at.duration_since(now).unwrap_or(Duration::ZERO),
        }
    }
}

impl fmt::Display for RetryAfter {
    /// Formats the value as a header would carry it: whole seconds, rounded up so that a client
    /// never comes back early, or an IMF-fixdate.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RetryAfter::Delay(delay) => {
                let secs = delay.as_secs() + u64::from(delay.subsec_nanos() > 0);
                write!(f, "{secs}")
            }
            RetryAfter::At(at) => f.write_str(&httpdate::fmt_http_date(at)),
        }
    }
}

// === impl InvalidRetryAfter ===

impl InvalidRetryAfter {
    /// The rejected value, as it was given.
    pub fn value(&self) -> &str {
        &self.value
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    const SHELL_SHOCK: u64 = 1_445_412_480; // Wed, 21 Oct 2015 07:28:00 GMT

    #[test]
    fn delta_seconds() {
        assert_eq!(
            RetryAfter::parse("0"),
            Ok(RetryAfter::Delay(Duration::ZERO))
        );
        assert_eq!(
            RetryAfter::parse(" \t42 "),
            Ok(RetryAfter::Delay(Duration::from_secs(42)))
        );
        assert_eq!(
            RetryAfter::parse("99999999999999999999999"),
            Ok(RetryAfter::Delay(Duration::from_secs(u64::MAX)))
        );
    }

    #[test]
    fn all_three_date_formats() {
        let expected = RetryAfter::At(UNIX_EPOCH + Duration::from_secs(SHELL_SHOCK));
        for text in [
            "Wed, 21 Oct 2015 07:28:00 GMT",
            "Wednesday, 21-Oct-15 07:28:00 GMT",
            "Wed Oct 21 07:28:00 2015",
        ] {
            assert_eq!(RetryAfter::parse(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn past_dates_mean_now() {
        let after = RetryAfter::parse("Wed, 21 Oct 2015 07:28:00 GMT").unwrap();
        let later = UNIX_EPOCH + Duration::from_secs(SHELL_SHOCK + 5);
        assert_eq!(after.delay_from(later), Duration::ZERO);
    }

    #[test]
    fn garbage_is_rejected_by_name() {
        for text in [
            "",
            " ",
            "-1",
            "+1",
            "1.5",
            "1e3",
            "5s",
            "soon",
            "0x10",
            "Wed, 32 Oct 2015 07:28:00 GMT",
        ] {
            let err = RetryAfter::parse(text).unwrap_err();
            assert_eq!(err.value(), text);
            assert!(err.to_string().contains(&format!("`{text}`")));
        }
        let err = RetryAfter::parse_bytes(b"\xff12").unwrap_err();
        assert_eq!(err.value(), "\u{fffd}12");
    }

    #[test]
    fn display_round_trips() {
        let date = RetryAfter::At(UNIX_EPOCH + Duration::from_secs(SHELL_SHOCK));
        assert_eq!(date.to_string(), "Wed, 21 Oct 2015 07:28:00 GMT");
        assert_eq!(RetryAfter::parse(&date.to_string()), Ok(date));
        assert_eq!(
            RetryAfter::Delay(Duration::from_millis(1500)).to_string(),
            "2"
        );
        assert_eq!(RetryAfter::Delay(Duration::from_secs(3)).to_string(), "3");
    }
}
