//! [`Pace`] and the grant guard that gives back what a request holds in flight.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tower_service::Service;

use crate::pace::fields::read_limits;
use crate::pace::layer::Shared;
use crate::pace::step::{abandon, admit, observe, reconcile, Cost, Grant};

/// The future of [`Pace`].
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// No request waits longer than this for news before it asks the step again.
const POLL: Duration = Duration::from_secs(1);

/// The pacing middleware. See the [module docs](crate::pace).
#[derive(Debug, Clone)]
pub struct Pace<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> Pace<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> Pace<S> {
        Pace { inner, shared }
    }
}

/// A granted request: what it holds in flight goes back when it is dropped unanswered (an
/// error, a dropped future), or when its answer is read.
struct Held {
    shared: Arc<Shared>,
    grant: Option<Grant>,
}

impl Held {
    /// Reads the answer's limit fields and settles the grant; a declared cost is reconciled
    /// from the layer's usage extractor when it reads one from the head, else the answer
    /// carries a [`Reconcile`] for the usage its body tells.
    fn answered<B>(mut self, response: &mut Response<B>) {
        let reading = {
            let mut skew = self.shared.skew_ms.lock();
            let reading = read_limits(response.headers(), self.shared.wall(), *skew);
            *skew = reading.skew_ms;
            reading
        };
        let now = self.shared.now_ms();
        observe(
            &mut self.shared.state.lock(),
            now,
            &reading,
            response.status().as_u16(),
            self.grant.as_ref(),
        );
        let grant = self.grant.take().expect("an unsettled grant");
        if grant.declares_tokens() {
            let used = self
                .shared
                .usage
                .as_ref()
                .and_then(|extract| extract(response.headers()));
            match used {
                Some(used) => reconcile(&mut self.shared.state.lock(), &grant, &used),
                None => {
                    response.extensions_mut().insert(Reconcile {
                        shared: Arc::clone(&self.shared),
                        grant,
                    });
                }
            }
        }
        self.shared.news.notify_waiters();
    }
}

/// Put in the extensions of a paced response whose request declared a token [`Cost`] (unless
/// the layer's [usage extractor](crate::pace::PaceLayer::usage) read its usage from the head):
/// tells the pacer what the request used, once its body says it (OpenAI's
/// `usage.total_tokens`, Anthropic's `usage.input_tokens` and `output_tokens`). For the limits
/// whose latest figure came before the request, the difference between the declared cost and
/// the use goes back to (or is taken from) what remains; a limit the server announced with the
/// answer, or since, already counts it (the drop in `x-ratelimit-remaining-tokens`).
#[derive(Clone)]
pub struct Reconcile {
    shared: Arc<Shared>,
    grant: Grant,
}

impl Reconcile {
    /// Reconciles the request's declared cost with `used`. A second call counts again: call
    /// it once per request.
    pub fn used(&self, used: &Cost) {
        reconcile(&mut self.shared.state.lock(), &self.grant, used);
        self.shared.news.notify_waiters();
    }
}

impl std::fmt::Debug for Reconcile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconcile").finish_non_exhaustive()
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(grant) = self.grant.take() {
            abandon(&mut self.shared.state.lock(), &grant);
            self.shared.news.notify_waiters();
        }
    }
}

/// Waits until the step admits a request of `cost`.
///
/// # Cancel safety
/// Dropped while waiting, nothing was spent; dropped after, the guard gives it back.
async fn acquire(shared: &Arc<Shared>, cost: &Cost) -> Held {
    loop {
        // Registered before asking, so that an answer in between is not missed.
        let news = shared.news.notified();
        let decision = {
            let now = shared.now_ms();
            admit(&mut shared.state.lock(), now, cost)
        };
        match decision {
            Ok(grant) => {
                return Held {
                    shared: Arc::clone(shared),
                    grant: Some(grant),
                }
            }
            Err(ms) => {
                let wait = if ms.is_finite() {
                    Duration::from_secs_f64(ms / 1000.0).min(POLL)
                } else {
                    POLL
                };
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = news => {}
                }
            }
        }
    }
}

impl<S, B, ResBody> Service<Request<B>> for Pace<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<Response<ResBody>, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    /// Waits for the pacer, then calls the inner service. A request's declared cost is its
    /// [`Cost`] extension (default: one request, no tokens); the response of one that declared
    /// tokens carries a [`Reconcile`] in its extensions (see there).
    fn call(&mut self, request: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let cost = request
                .extensions()
                .get::<Cost>()
                .cloned()
                .unwrap_or_default();
            let held = acquire(&shared, &cost).await;
            std::future::poll_fn(|cx| inner.poll_ready(cx)).await?;
            let mut response = inner.call(request).await?;
            held.answered(&mut response);
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{SystemTime, UNIX_EPOCH};

    use tower::{service_fn, Layer, ServiceExt};

    use super::*;
    use crate::pace::PaceLayer;

    /// A server with a hidden fixed window of `limit` per `window`, announced in the IETF fields.
    fn server(
        limit: u32,
        window: Duration,
    ) -> (
        impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future = impl Send>
            + Clone,
        Arc<AtomicU32>,
        Arc<AtomicU32>,
    ) {
        let (ok, denied) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (ok2, denied2) = (ok.clone(), denied.clone());
        let start = tokio::time::Instant::now();
        let used = Arc::new(parking_lot::Mutex::new((0u64, 0u32)));
        let svc = service_fn(move |_: Request<()>| {
            let (ok, denied, used) = (ok2.clone(), denied2.clone(), used.clone());
            async move {
                let elapsed = start.elapsed();
                let index = (elapsed.as_nanos() / window.as_nanos()) as u64;
                let end = window * (index as u32 + 1);
                let mut u = used.lock();
                if u.0 != index {
                    *u = (index, 0);
                }
                let allowed = u.1 < limit;
                if allowed {
                    u.1 += 1;
                    ok.fetch_add(1, Ordering::SeqCst);
                } else {
                    denied.fetch_add(1, Ordering::SeqCst);
                }
                let t = (end - elapsed).as_secs_f64().ceil() as u64;
                let mut r = Response::new(());
                if !allowed {
                    *r.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                }
                let h = r.headers_mut();
                h.insert(
                    "ratelimit-policy",
                    format!("\"api\";q={limit};w={}", window.as_secs())
                        .parse()
                        .unwrap(),
                );
                h.insert(
                    "ratelimit",
                    format!("\"api\";r={};t={t}", limit - u.1).parse().unwrap(),
                );
                Ok::<_, Infallible>(r)
            }
        });
        (svc, ok, denied)
    }

    #[tokio::test(start_paused = true)]
    async fn eight_callers_spread_the_window_and_get_no_429() {
        let (svc, ok, denied) = server(20, Duration::from_secs(10));
        let layer = PaceLayer::new();
        let client = layer.layer(svc);
        let started = tokio::time::Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut times = Vec::new();
                while started.elapsed() < Duration::from_secs(30) {
                    let r = client.clone().oneshot(Request::new(())).await.unwrap();
                    times.push((started.elapsed(), r.status().as_u16()));
                }
                times
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort();
        assert_eq!(denied.load(Ordering::SeqCst), 0, "no 429");
        // Three windows of 20 in the 30 s (each worker's last request may go in a fourth).
        let within = all
            .iter()
            .filter(|(t, s)| *t < Duration::from_secs(30) && *s == 200)
            .count();
        assert!((57..=60).contains(&within), "{within} served in 30 s");
        assert_eq!(ok.load(Ordering::SeqCst) as usize, all.len());
        // Spread, not at once: no more than 3 in any 1 s of the first window.
        let first: Vec<_> = all
            .iter()
            .filter(|(t, _)| *t < Duration::from_secs(10))
            .collect();
        for w in first.windows(4) {
            assert!(
                w[3].0 - w[0].0 >= Duration::from_millis(900),
                "burst at {:?}",
                w[0].0
            );
        }
        assert_eq!(
            layer.remaining("ietf:api").map(|(r, _)| r.is_some()),
            Some(true)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_holds_every_request_back() {
        let calls = Arc::new(AtomicU32::new(0));
        let counter = calls.clone();
        let svc = service_fn(move |_: Request<()>| {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            async move {
                let mut r = Response::new(());
                if n == 0 {
                    *r.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
                    r.headers_mut().insert("retry-after", "5".parse().unwrap());
                    r.headers_mut()
                        .insert("ratelimit", "\"api\";r=50;t=60".parse().unwrap());
                }
                Ok::<_, Infallible>(r)
            }
        });
        let client = PaceLayer::new().layer(svc);
        let started = tokio::time::Instant::now();
        assert_eq!(
            client
                .clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            429
        );
        assert_eq!(
            client
                .clone()
                .oneshot(Request::new(()))
                .await
                .unwrap()
                .status(),
            200
        );
        assert!(
            started.elapsed() >= Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn github_resets_are_read_on_the_servers_clock() {
        fn wall() -> SystemTime {
            UNIX_EPOCH + Duration::from_secs(1_796_576_400)
        }
        let server_now = 1_796_576_400u64 + 120; // two minutes ahead
        let svc = service_fn(move |_: Request<()>| async move {
            let mut r = Response::new(());
            let h = r.headers_mut();
            h.insert(
                "date",
                httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(server_now))
                    .parse()
                    .unwrap(),
            );
            h.insert("x-ratelimit-remaining", "30".parse().unwrap());
            h.insert("x-ratelimit-limit", "60".parse().unwrap());
            h.insert(
                "x-ratelimit-reset",
                (server_now + 60).to_string().parse().unwrap(),
            );
            h.insert("x-ratelimit-resource", "core".parse().unwrap());
            Ok::<_, Infallible>(r)
        });
        let layer = PaceLayer::new().wall_clock(wall);
        layer.layer(svc).oneshot(Request::new(())).await.unwrap();
        let (remaining, reset) = layer.remaining("github:core").unwrap();
        assert_eq!(remaining, Some(30.0));
        assert_eq!(
            reset,
            Some(Duration::from_secs(60)),
            "60 s, not the 180 s of the local clock"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_gives_its_grant_back() {
        let svc =
            service_fn(|_: Request<()>| async { Err::<Response<()>, &'static str>("refused") });
        let layer = PaceLayer::new();
        let client = layer.layer(svc);
        for _ in 0..3 {
            // Before any answer one request goes at a time: a leaked grant would stall the next.
            let r = tokio::time::timeout(
                Duration::from_millis(10),
                client.clone().oneshot(Request::new(())),
            )
            .await;
            assert_eq!(r.expect("not held back").unwrap_err(), "refused");
        }
    }
}
