//! [`RateLimit`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use tower_service::Service;

use crate::admit::{admit_as, Ask};
use crate::client_ip::ClientIp;
use crate::limit::future::ResponseFuture;
use crate::limit::layer::Shared;

/// The rate-limiting middleware. Clones share the policies' state.
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S> RateLimit<S> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>) -> RateLimit<S> {
        RateLimit { inner, shared }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

fn client_ip<B>(shared: &Shared, request: &Request<B>) -> Option<IpAddr> {
    let ext = request.extensions();
    let peer = ext
        .get::<ClientIp>()
        .map(|c| c.0)
        .or_else(|| ext.get::<SocketAddr>().map(SocketAddr::ip))
        .or_else(|| shared.peer.and_then(|f| f(ext)))?;
    Some(shared.trusted.client_ip(peer, request.headers()))
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: Send + 'static,
{
    type Response = Response<Either<ResBody, Full<Bytes>>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The ready service goes into the future; a fresh clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        ResponseFuture::admitting(
            Box::pin(async move {
                let ip = client_ip(&shared, &request);
                let ask = Ask {
                    headers: request.headers(),
                    uri: request.uri(),
                    client_ip: ip,
                    cost: 1,
                    may_wait: shared.may_wait,
                    // A service's own callers: no proxy in front is known to be trusted.
                    from_trusted_proxy: false,
                    body: None,
                };
                let protocol = crate::protocol::Protocol::of(&request);
                match admit_as(&shared.policies, &ask, protocol).await {
                    Ok(admission) => Ok((admission, inner.call(request))),
                    Err(denial) => {
                        // A gRPC request is refused as the gateway refuses it: a gRPC
                        // status, in the request's content type family.
                        let grpc = (protocol == crate::protocol::Protocol::Grpc).then(|| {
                            request
                                .headers()
                                .get(http::header::CONTENT_TYPE)
                                .and_then(|ct| crate::grpc::web_content_type(ct.as_bytes()))
                                .unwrap_or_else(|| crate::grpc::APPLICATION_GRPC.clone())
                        });
                        Err((denial, grpc))
                    }
                }
            }),
            Arc::clone(&self.shared),
        )
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use sluice_core::{AnyAlgorithm, Kind, Quota};
    use tower::{service_fn, Layer as _, ServiceExt as _};

    use crate::{Policy, RateLimitLayer};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn grpc_requests_are_refused_with_a_grpc_status() {
        let quota = Quota::parse(1, "1/min").unwrap();
        let policy = Policy::builder("rpc", AnyAlgorithm::new(Kind::Gcra, quota))
            .build()
            .unwrap();
        let svc = RateLimitLayer::new(Arc::new(policy)).layer(service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(String::from("hi")))
        }));
        let call = |ct: &str| {
            Request::post("/pkg.Svc/Call")
                .header("content-type", ct)
                .body(())
                .unwrap()
        };
        let first = svc.clone().oneshot(call("application/grpc")).await.unwrap();
        assert_eq!(first.status(), 200);
        assert_eq!(first.headers().get("grpc-status"), None);
        for (ct, answer) in [
            ("application/grpc", "application/grpc"),
            ("application/grpc+proto", "application/grpc"),
            (
                "application/grpc-web-text+proto",
                "application/grpc-web-text+proto",
            ),
        ] {
            let denied = svc.clone().oneshot(call(ct)).await.unwrap();
            let h = denied.headers();
            assert_eq!(denied.status(), 200, "{ct}");
            assert_eq!(h["content-type"], answer);
            assert_eq!(h["grpc-status"], "8");
            assert!(h.contains_key("grpc-retry-pushback-ms"), "{ct}");
            assert_eq!(h["ratelimit-policy"], r#""rpc";q=1;w=60"#);
            assert!(!h.contains_key("retry-after"), "{ct}");
        }
        // Anything else gets the HTTP answer.
        let plain = svc.clone().oneshot(call("application/json")).await.unwrap();
        assert_eq!(plain.status(), 429);
        assert_eq!(plain.headers()["content-type"], "application/problem+json");
    }
}
