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
                };
                let protocol = crate::protocol::Protocol::of(&request);
                match admit_as(&shared.policies, &ask, protocol).await {
                    Ok(admission) => Ok((admission, inner.call(request))),
                    Err(denial) => Err(denial),
                }
            }),
            Arc::clone(&self.shared),
        )
    }
}
