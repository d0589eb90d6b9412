//! [`ResponseFuture`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE};
use http::Response;
use http_body_util::{Either, Full};

use crate::admit::{Admission, Denial};
use crate::grpc;
use crate::headers;
use crate::limit::layer::Shared;

/// The admission, or the denial with, for a gRPC request, the `content-type` of its answer.
type Admitting<F> =
    Pin<Box<dyn Future<Output = Result<(Admission, F), (Denial, Option<HeaderValue>)>> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of [`RateLimit`](crate::RateLimit): first the admission, then the
    /// inner service's future, holding the admission (and its concurrency slots) until it
    /// completes.
    ///
    /// # Cancel safety
    ///
    /// Dropping it leaves any queue it waits in and frees its slots.
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        shared: Arc<Shared>,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    enum State<F> {
        Admitting { admitting: Admitting<F> },
        Responding { #[pin] future: F, admission: Option<Admission> },
        Done,
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn admitting(admitting: Admitting<F>, shared: Arc<Shared>) -> ResponseFuture<F> {
        ResponseFuture {
            state: State::Admitting { admitting },
            shared,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<Either<B, Full<Bytes>>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Admitting { admitting } => match ready!(admitting.as_mut().poll(cx)) {
                    Ok((admission, future)) => this.state.set(State::Responding {
                        future,
                        admission: Some(admission),
                    }),
                    Err((denial, grpc)) => {
                        this.state.set(State::Done);
                        let (policies, header) =
                            (&this.shared.policies, this.shared.policy_header.as_ref());
                        let response = match grpc {
                            None => headers::denied(&denial, policies, header),
                            Some(content_type) => {
                                let mut r = grpc::denied(&denial, policies, header);
                                r.headers_mut().insert(CONTENT_TYPE, content_type);
                                r
                            }
                        };
                        return Poll::Ready(Ok(response.map(Either::Right)));
                    }
                },
                StateProj::Responding { future, admission } => {
                    let result = ready!(future.poll(cx));
                    let admission = admission.take().unwrap_or_default();
                    this.state.set(State::Done);
                    let mut response = result?.map(Either::Left);
                    headers::insert(
                        response.headers_mut(),
                        this.shared.policy_header.as_ref(),
                        &this.shared.policies,
                        &admission.verdicts,
                    );
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => {
                    // Polled after completion: a contract violation; stay pending forever
                    // rather than panic on what a caller did.
                    return Poll::Pending;
                }
            }
        }
    }
}
