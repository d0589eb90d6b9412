//! Classifying an attempt's result: done, worth retrying (perhaps after a server-given wait), or
//! not worth retrying.

use std::time::Duration;

/// What an attempt's result means for retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The attempt succeeded: return its result.
    Success,
    /// The attempt failed in a way that may pass: retry it.
    Retry {
        /// A wait the server asked for (`Retry-After`), if any. The retry waits at least this
        /// long, and at least the jittered backoff.
        after: Option<Duration>,
    },
    /// The attempt failed in a way that will not pass (a 4xx, a bad request): return its
    /// result without retrying.
    Fail,
}

impl Outcome {
    /// Retry after the jittered backoff.
    pub const RETRY: Outcome = Outcome::Retry { after: None };

    /// Retry, waiting at least `after` as the server asked.
    pub fn retry_after(after: Duration) -> Outcome {
        Outcome::Retry { after: Some(after) }
    }
}

/// Decides what an attempt's result means for retrying. It sees the whole `Result`, so that a
/// response value (say an HTTP 503) can be retried as well as an error.
///
/// Closures `Fn(&Result<T, E>) -> Outcome` implement it.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use sluice::retry::{Classify, Outcome, RetryAfter};
///
/// struct Response { status: u16, retry_after: Option<String> }
///
/// let classify = |result: &Result<Response, std::io::Error>| match result {
///     Ok(response) if response.status == 503 || response.status == 429 => {
///         let after = response
///             .retry_after
///             .as_deref()
///             .and_then(|value| RetryAfter::parse_delay(value, SystemTime::now()).ok());
///         Outcome::Retry { after }
///     }
///     Ok(response) if response.status >= 500 => Outcome::RETRY,
///     Ok(_) => Outcome::Success,
///     Err(_) => Outcome::RETRY,
/// };
/// let busy = Response { status: 503, retry_after: Some("3".into()) };
/// assert_eq!(classify.classify(&Ok(busy)), Outcome::retry_after(Duration::from_secs(3)));
/// ```
pub trait Classify<T, E> {
    /// What `result` means for retrying.
    fn classify(&self, result: &Result<T, E>) -> Outcome;
}

impl<T, E, F> Classify<T, E> for F
where
    F: Fn(&Result<T, E>) -> Outcome,
{
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        self(result)
    }
}

/// The default classifier: `Ok` is a success, every `Err` is retried after the backoff.
#[derive(Debug, Clone, Copy, Default)]
pub struct RetryErrors;

impl<T, E> Classify<T, E> for RetryErrors {
    fn classify(&self, result: &Result<T, E>) -> Outcome {
        match result {
            Ok(_) => Outcome::Success,
            Err(_) => Outcome::RETRY,
        }
    }
}
