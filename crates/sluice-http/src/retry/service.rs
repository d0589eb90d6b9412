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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::num::NonZeroU32;
    use std::sync::atomic::{AtomicU32, Ordering};

    use http::StatusCode;
    use sluice::retry::Backoff;
    use tower::{service_fn, Layer, ServiceExt};

    use super::*;

    fn answering(
        status: StatusCode,
        calls: Arc<AtomicU32>,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future = impl Send> + Clone
    {
        service_fn(move |_: Request<()>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut r = Response::new(());
                *r.status_mut() = status;
                Ok::<_, Infallible>(r)
            }
        })
    }

    fn layer(attempts: u32) -> RetryLayer {
        RetryLayer::new(
            Backoff::new(Duration::from_millis(100), Duration::from_secs(1))
                .with_max_attempts(NonZeroU32::new(attempts).unwrap()),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_the_attempts_and_returns_the_last_answer() {
        let calls = Arc::new(AtomicU32::new(0));
        let svc = layer(3).layer(answering(StatusCode::SERVICE_UNAVAILABLE, calls.clone()));
        let started = Instant::now();
        let r = svc.oneshot(Request::new(())).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        // Full jitter: each wait is drawn from [0, 100 ms], then [0, 200 ms].
        assert!(started.elapsed() <= Duration::from_millis(300));
    }

    #[tokio::test(start_paused = true)]
    async fn other_statuses_are_not_retried() {
        for status in [
            StatusCode::OK,
            StatusCode::INTERNAL_SERVER_ERROR,
            StatusCode::BAD_REQUEST,
        ] {
            let calls = Arc::new(AtomicU32::new(0));
            let svc = layer(5).layer(answering(status, calls.clone()));
            assert_eq!(
                svc.oneshot(Request::new(())).await.unwrap().status(),
                status
            );
            assert_eq!(calls.load(Ordering::SeqCst), 1, "{status}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_beyond_the_time_limit_is_not_waited_for() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let svc = service_fn(move |_: Request<()>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                let mut r = Response::new(());
                *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                r.headers_mut()
                    .insert(RETRY_AFTER, http::HeaderValue::from_static("60"));
                Ok::<_, Infallible>(r)
            }
        });
        let limited = RetryLayer::new(
            Backoff::new(Duration::from_millis(100), Duration::from_secs(1))
                .with_max_attempts(NonZeroU32::new(5).unwrap())
                .with_max_elapsed(Duration::from_secs(10)),
        )
        .layer(svc);
        let started = Instant::now();
        let r = limited.oneshot(Request::new(())).await.unwrap();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
