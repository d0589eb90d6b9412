//! The response body of the gateway: the upstream's, streamed, or one of our own; it holds
//! the request's concurrency slots until it is dropped (after the last byte is sent).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use sluice::PoolPermit;

use crate::proxy::Lease;

pin_project_lite::pin_project! {
    /// A gateway response body (`B` is the request body type of its upstream connection).
    pub struct Body<B = Incoming> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Upstream {
            #[pin]
            body: Incoming,
            permits: Vec<PoolPermit>,
            lease: Option<Lease<B>>,
        },
        Full {
            #[pin]
            body: Full<Bytes>,
        },
    }
}

impl<B> Body<B> {
    /// The upstream's body, holding `permits` and the connection's `lease` until it is
    /// dropped.
    pub fn upstream(body: Incoming, permits: Vec<PoolPermit>, lease: Option<Lease<B>>) -> Body<B> {
        Body {
            inner: Inner::Upstream {
                body,
                permits,
                lease,
            },
        }
    }

    /// A body of `bytes`.
    pub fn full(bytes: impl Into<Bytes>) -> Body<B> {
        Body {
            inner: Inner::Full {
                body: Full::new(bytes.into()),
            },
        }
    }

    /// An empty body.
    pub fn empty() -> Body<B> {
        Body::full(Bytes::new())
    }
}

impl<B> From<Full<Bytes>> for Body<B> {
    fn from(body: Full<Bytes>) -> Body<B> {
        Body {
            inner: Inner::Full { body },
        }
    }
}

impl<B> http_body::Body for Body<B> {
    type Data = Bytes;
    type Error = hyper::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.project().inner.project() {
            InnerProj::Upstream { body, .. } => body.poll_frame(cx),
            InnerProj::Full { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Upstream { body, .. } => body.is_end_stream(),
            Inner::Full { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream { body, .. } => body.size_hint(),
            Inner::Full { body } => body.size_hint(),
        }
    }
}

impl<B> std::fmt::Debug for Body<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            Inner::Upstream { permits, .. } => f
                .debug_struct("Body::Upstream")
                .field("permits", &permits.len())
                .finish_non_exhaustive(),
            Inner::Full { body } => f.debug_tuple("Body::Full").field(body).finish(),
        }
    }
}
