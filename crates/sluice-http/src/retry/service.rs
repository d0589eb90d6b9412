//! [`Retry`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;
use http::{Request, Response};
use sluice::retry::RetryAfter;
use tokio::time::Instant;
use tower_service::Service;

use crate::retry::layer::RetryLayer;

/// The future of [`Retry`].
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The retrying middleware. See the [module docs](crate::retry).
#[derive(Debug, Clone)]
pub struct Retry<S> {
    inner: S,
    config: Arc<RetryLayer>,
}

impl<S> Retry<S> {
    pub(crate) fn new(inner: S, config: RetryLayer) -> Retry<S> {
        Retry {
            inner,
            config: Arc::new(config),
        }
    }
}

impl<S, B, ResBody> Service<Request<B>> for Retry<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Clone + Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<ResBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        Box::pin(async move {
            let backoff = config.backoff;
            let started = Instant::now();
            let (parts, body) = request.into_parts();
            let mut retry = 0u32;
            loop {
                if retry > 0 {
                    std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
                }
                let attempt = Request::from_parts(parts.clone(), body.clone());
                let response = inner.call(attempt).await?;
                if !config.statuses.contains(&response.status())
                    || retry + 1 >= backoff.max_attempts().get()
                {
                    return Ok(response);
                }
                let asked = response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| RetryAfter::parse_bytes(v.as_bytes()).ok())
                    .map_or(Duration::ZERO, |after| after.delay_from(SystemTime::now()));
                let jittered = backoff.delay(retry, &mut rand::rng());
                let wait = asked.max(jittered);
                if let Some(limit) = backoff.max_elapsed() {
                    if started.elapsed() + wait > limit {
                        return Ok(response);
                    }
                }
                drop(response);
                tokio::time::sleep(wait).await;
                retry += 1;
            }
        })
    }
}
