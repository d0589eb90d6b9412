//! [`RetryLayer`].

use http::StatusCode;
use sluice::retry::Backoff;
use tower_layer::Layer;

use crate::retry::service::Retry;

/// Applies [`Retry`] to a client service. See the [module docs](crate::retry).
#[derive(Debug, Clone)]
pub struct RetryLayer {
    pub(crate) backoff: Backoff,
    pub(crate) statuses: Vec<StatusCode>,
}

impl RetryLayer {
    /// Retries 429 and 503 according to `backoff` (attempts, delays, elapsed-time limit).
    pub fn new(backoff: Backoff) -> RetryLayer {
        RetryLayer {
            backoff,
            statuses: vec![
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::SERVICE_UNAVAILABLE,
            ],
        }
    }

    /// Retries these statuses instead.
    pub fn statuses(mut self, statuses: Vec<StatusCode>) -> RetryLayer {
        self.statuses = statuses;
        self
    }
}

impl Default for RetryLayer {
    /// [`Backoff::default`]: 100 ms doubling to 10 s, full jitter, three attempts.
    fn default() -> RetryLayer {
        RetryLayer::new(Backoff::default())
    }
}

impl<S> Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::new(inner, self.clone())
    }
}
