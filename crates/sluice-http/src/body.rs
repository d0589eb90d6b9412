//! The response body of the gateway: the upstream's, streamed, or one of our own; it holds
//! the request's concurrency slots until it is dropped (after the last byte is sent).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use sluice::PoolPermit;

pin_project_lite::pin_project! {
    /// A gateway response body.
    pub struct Body {
        #[pin]
        inner: Inner,
    }
}

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner {
        Upstream {
            #[pin]
            body: Incoming,
            permits: Vec<PoolPermit>,
        },
        Full {
            #[pin]
            body: Full<Bytes>,
        },
    }
}

impl Body {
    /// The upstream's body, holding `permits` until it is dropped.
    pub fn upstream(body: Incoming, permits: Vec<PoolPermit>) -> Body {
        Body {
            inner: Inner::Upstream { body, permits },
        }
    }

    /// A body of `bytes`.
    pub fn full(bytes: impl Into<Bytes>) -> Body {
        Body {
            inner: Inner::Full {
                body: Full::new(bytes.into()),
            },
        }
    }

    /// An empty body.
    pub fn empty() -> Body {
        Body::full(Bytes::new())
    }
}

impl From<Full<Bytes>> for Body {
    fn from(body: Full<Bytes>) -> Body {
        Body {
            inner: Inner::Full { body },
        }
    }
}

impl http_body::Body for Body {
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

impl std::fmt::Debug for Body {
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
