//! The bodies of the gateway: [`Body`], the response body (the upstream's, streamed or read
//! whole when small, or one of our own), which holds the request's concurrency slots until it
//! is dropped (after the last byte is sent) and fails with [`UpstreamStalled`] when the
//! upstream's stalls for longer than `upstream_read_timeout`; and [`RequestBody`], the request
//! body on its way upstream, cut short with a [`BodyError`] when it grows past `max_body` or
//! stalls for longer than `client_body_timeout`.

use std::collections::VecDeque;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;

use http_body::{Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use metrics::Counter;
use sluice::PoolPermit;

use crate::cost::meter::{Meter, RequestBytes};
use crate::protocol::Protocol;
use crate::proxy::Lease;
use crate::route::Route;

pin_project_lite::pin_project! {
    /// A gateway response body (`B` is the request body type of its upstream connection).
    pub struct Body<B = RequestBody<Incoming>> {
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
            // Dropped first: a settlement is made while the slots are still held.
            meter: Option<Box<Meter>>,
            permits: Vec<PoolPermit>,
            lease: Option<Lease<B>>,
            read: Option<ReadTimeout>,
            clock: GapClock,
        },
        Full {
            #[pin]
            body: Full<Bytes>,
        },
        // An upstream body read whole ahead of the client ([`Body::read_small`]): its
        // upstream connection is free again.
        Read {
            // Dropped first, as above.
            meter: Option<Box<Meter>>,
            frames: VecDeque<Frame<Bytes>>,
            // What ended the read early (the upstream failed or stalled), after the frames.
            failed: Option<BoxError>,
            permits: Vec<PoolPermit>,
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
                meter: None,
                permits,
                lease,
                read: None,
                clock: GapClock::default(),
            },
        }
    }

    /// Times the gaps between two reads of an upstream body with `read`: past its gap, the
    /// next frame is an [`UpstreamStalled`] error, counted and logged. No effect on other
    /// bodies.
    pub(crate) fn read_timeout(mut self, read: Option<ReadTimeout>) -> Body<B> {
        if let Inner::Upstream { read: slot, .. } = &mut self.inner {
            *slot = read;
        }
        self
    }

    /// Watches the frames of an upstream body with `meter`, which settles the request's cost
    /// when the body is dropped (see [`crate::cost::meter`]). No effect on other bodies.
    pub fn metered(mut self, meter: Option<Box<Meter>>) -> Body<B> {
        if let Inner::Upstream { meter: slot, .. } = &mut self.inner {
            *slot = meter;
        }
        self
    }

    /// An upstream body whose declared length is at most `limit`, read whole now, as nginx
    /// buffers an answer: its upstream connection goes back to the pool (an HTTP/2 upstream's
    /// stream ends) before the client has taken a byte, so a client that does not read, or
    /// grants no flow-control window, holds no upstream connection, only the request's slots
    /// until its own `send_timeout`. The read keeps the body's read timeout and meter; what
    /// ends it early (the upstream fails or stalls) is the body's error after the frames read.
    /// Any other body is returned as it is.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the body and its upstream connection.
    pub(crate) async fn read_small(self, limit: u64) -> Body<B> {
        let small = match &self.inner {
            Inner::Upstream { body, .. } => http_body::Body::size_hint(body)
                .exact()
                .is_some_and(|n| n <= limit),
            Inner::Full { .. } | Inner::Read { .. } => false,
        };
        if !small {
            return self;
        }
        let mut this = self;
        let mut frames = VecDeque::new();
        let mut failed = None;
        loop {
            match std::future::poll_fn(|cx| http_body::Body::poll_frame(Pin::new(&mut this), cx))
                .await
            {
                Some(Ok(frame)) => frames.push_back(frame),
                Some(Err(e)) => {
                    failed = Some(e);
                    break;
                }
                None => break,
            }
        }
        match this.inner {
            Inner::Upstream {
                body,
                meter,
                permits,
                lease,
                ..
            } => {
                // The body read to its end first, so that its connection is pooled again.
                drop(body);
                drop(lease);
                Body {
                    inner: Inner::Read {
                        meter,
                        frames,
                        failed,
                        permits,
                    },
                }
            }
            inner => Body { inner },
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
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().inner.project() {
            InnerProj::Upstream {
                body,
                meter,
                read,
                clock,
                ..
            } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(meter) = meter.as_mut() {
                        meter.observe(&frame);
                    }
                    clock.data();
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => match read {
                    Some(read) if clock.waited_out(read.gap, cx) => {
                        Poll::Ready(Some(Err(read.expired().into())))
                    }
                    _ => Poll::Pending,
                },
            },
            InnerProj::Full { body } => match body.poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(frame))),
                Poll::Ready(Some(Err(never))) => match never {},
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            InnerProj::Read { frames, failed, .. } => match frames.pop_front() {
                Some(frame) => Poll::Ready(Some(Ok(frame))),
                None => Poll::Ready(failed.take().map(Err)),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Upstream { body, .. } => body.is_end_stream(),
            Inner::Full { body } => body.is_end_stream(),
            Inner::Read { frames, failed, .. } => frames.is_empty() && failed.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Upstream { body, .. } => body.size_hint(),
            Inner::Full { body } => body.size_hint(),
            Inner::Read { frames, failed, .. } => {
                let data: usize = frames
                    .iter()
                    .filter_map(|f| f.data_ref())
                    .map(Bytes::len)
                    .sum();
                if failed.is_none() && frames.iter().all(Frame::is_data) {
                    SizeHint::with_exact(data as u64)
                } else {
                    let mut hint = SizeHint::new();
                    hint.set_lower(data as u64);
                    hint
                }
            }
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
            Inner::Read {
                frames, permits, ..
            } => f
                .debug_struct("Body::Read")
                .field("frames", &frames.len())
                .field("permits", &permits.len())
                .finish_non_exhaustive(),
        }
    }
}

/// The error type of a [`RequestBody`]: a [`BodyError`] or the client's own.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request body was cut short before it reached the upstream whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// More than this many bytes (413).
    #[error("the request body is larger than {0} bytes")]
    TooLarge(u64),
    /// No data for this long between two reads (408).
    #[error("the client sent no request body data for {0:?}")]
    Stalled(Duration),
}

/// The upstream sent no data of its answer's body for this long between two reads
/// (`upstream_read_timeout`): the answer, already begun, cannot be finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the upstream sent no data of its answer's body for {0:?}")]
pub struct UpstreamStalled(pub Duration);

/// The longest gap between two reads of an upstream's answer body (`upstream_read_timeout`),
/// and where its expiry is counted (`sluice_upstream_errors_total{error="read_timeout"}`)
/// and logged: one rule for the byte path and hyper's.
#[derive(Debug, Clone)]
pub(crate) struct ReadTimeout {
    pub(crate) gap: Duration,
    route: Arc<str>,
    stalled: Counter,
}

impl ReadTimeout {
    /// The read timeout `gap` of an answer on `route` to a request of `protocol`.
    pub(crate) fn new(route: &Route, protocol: Protocol, gap: Duration) -> ReadTimeout {
        ReadTimeout {
            gap,
            route: Arc::clone(&route.metrics.name),
            stalled: route.metrics.read_timeout[protocol as usize].clone(),
        }
    }

    /// Counts and logs an expiry; the error the answer fails with.
    pub(crate) fn expired(&self) -> UpstreamStalled {
        self.stalled.increment(1);
        tracing::warn!(
            route = %self.route,
            timeout = ?self.gap,
            "the upstream's answer stalled mid-body (upstream_read_timeout): the client connection is closed"
        );
        UpstreamStalled(self.gap)
    }
}

/// The clock of the gap between two reads of a body. It exists only once a read has had to
/// wait: a body that arrives whole with its head never allocates one.
#[derive(Debug, Default)]
pub(crate) struct GapClock {
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Data arrived since the timer was last set: set it again at the next wait.
    rearm: bool,
}

impl GapClock {
    /// Data arrived: the next wait starts a new gap.
    fn data(&mut self) {
        self.rearm = true;
    }

    /// A read waits: whether `gap` has passed since this gap began. When it has not, `cx` is
    /// woken when it does.
    fn waited_out(&mut self, gap: Duration, cx: &mut Context<'_>) -> bool {
        let timer = match &mut self.timer {
            Some(timer) => {
                if self.rearm {
                    timer.as_mut().reset(tokio::time::Instant::now() + gap);
                }
                timer
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep(gap))),
        };
        self.rearm = false;
        timer.as_mut().poll(cx).is_ready()
    }
}

impl BodyError {
    /// The `BodyError` somewhere in `error`'s chain of sources, if any: what made a forwarded
    /// request fail when its body was cut short.
    pub fn find(error: &(dyn std::error::Error + 'static)) -> Option<BodyError> {
        let mut at = Some(error);
        while let Some(e) = at {
            if let Some(found) = e.downcast_ref::<BodyError>() {
                return Some(*found);
            }
            at = e.source();
        }
        None
    }
}

/// A request body on its way upstream: its data is counted against a limit and the gap
/// between two reads is timed; past either, the next frame is an error ([`BodyError`]),
/// which makes the upstream request fail mid-body (the upstream never receives it as
/// complete). Frames read ahead with [`RequestBody::read_ahead`] are sent first.
///
/// The gap timer exists only once a read has had to wait (a body that arrives with its head,
/// or none at all, never allocates one).
pub struct RequestBody<B> {
    inner: B,
    ahead: VecDeque<Frame<Bytes>>,
    ahead_bytes: u64,
    inner_done: bool,
    limit: u64,
    seen: u64,
    gap: Option<Duration>,
    clock: GapClock,
    /// Where the bytes read are also counted, for a cost settled on them.
    counted: Option<RequestBytes>,
}

impl<B> std::fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("limit", &self.limit)
            .field("seen", &self.seen)
            .field("gap", &self.gap)
            .finish_non_exhaustive()
    }
}

impl<B> RequestBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// `inner`, cut short past `limit` bytes, or after `gap` without data (`None`: no limit
    /// on the gap).
    pub fn new(inner: B, limit: u64, gap: Option<Duration>) -> RequestBody<B> {
        RequestBody {
            inner,
            ahead: VecDeque::new(),
            ahead_bytes: 0,
            inner_done: false,
            limit,
            seen: 0,
            gap,
            clock: GapClock::default(),
            counted: None,
        }
    }

    /// Also counts the bytes read in `counter` (for a policy whose cost is the body's
    /// length, settled once it is known).
    pub fn counted(mut self, counter: RequestBytes) -> Self {
        // What was already read ahead counts too.
        counter.store(self.seen, std::sync::atomic::Ordering::Relaxed);
        self.counted = Some(counter);
        self
    }

    /// Sets the most bytes the body may have (the route's `max_body`, once it is known).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// The whole body, if [`RequestBody::read_ahead`] read all of it: its data frames joined.
    pub fn read_whole(&self) -> Option<Vec<u8>> {
        if !self.inner_done {
            return None;
        }
        let mut whole = Vec::with_capacity(usize::try_from(self.ahead_bytes).unwrap_or(0));
        for frame in &self.ahead {
            if let Some(data) = frame.data_ref() {
                whole.extend_from_slice(data);
            }
        }
        Some(whole)
    }

    /// Reads the body until at least `bytes` bytes of it are held here, or it ends; the
    /// frames are sent first. So a body that ends within `bytes` is checked whole (its size,
    /// its gaps) before the upstream sees any of it.
    ///
    /// # Errors
    ///
    /// [`BodyError`] (boxed) when the body is too large or stalls, or the client's error.
    pub async fn read_ahead(&mut self, bytes: u64) -> Result<(), BoxError> {
        while self.ahead_bytes < bytes && !self.inner_done {
            match std::future::poll_fn(|cx| self.poll_inner(cx)).await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        self.ahead_bytes += data.len() as u64;
                    }
                    self.ahead.push_back(frame);
                }
                Some(Err(e)) => return Err(e),
                None => self.inner_done = true,
            }
        }
        Ok(())
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.seen += data.len() as u64;
                    if let Some(counter) = &self.counted {
                        counter.store(self.seen, std::sync::atomic::Ordering::Relaxed);
                    }
                    if self.seen > self.limit {
                        self.inner_done = true;
                        return Poll::Ready(Some(Err(BodyError::TooLarge(self.limit).into())));
                    }
                }
                self.clock.data();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                self.inner_done = true;
                Poll::Ready(None)
            }
            Poll::Pending => match self.gap {
                Some(gap) if self.clock.waited_out(gap, cx) => {
                    self.inner_done = true;
                    Poll::Ready(Some(Err(BodyError::Stalled(gap).into())))
                }
                _ => Poll::Pending,
            },
        }
    }
}

impl<B> http_body::Body for RequestBody<B>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.ahead.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if this.inner_done {
            return Poll::Ready(None);
        }
        this.poll_inner(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_empty() && (self.inner_done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        if self.ahead.is_empty() {
            return if self.inner_done {
                SizeHint::with_exact(0)
            } else {
                self.inner.size_hint()
            };
        }
        let trailers = self.ahead.iter().any(|f| !f.is_data());
        if self.inner_done && !trailers {
            // Read whole: the upstream gets it with a Content-Length.
            return SizeHint::with_exact(self.ahead_bytes);
        }
        let mut hint = SizeHint::new();
        hint.set_lower(self.ahead_bytes);
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;
    use http_body_util::{BodyExt as _, StreamBody};

    fn chunks(
        n: usize,
        size: usize,
    ) -> impl http_body::Body<Data = Bytes, Error = std::io::Error> + Unpin {
        let frames = (0..n).map(move |_| Ok(Frame::data(Bytes::from(vec![b'x'; size]))));
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn a_streamed_body_is_cut_once_it_passes_the_limit() {
        // 10 × 1000 bytes against 4500: the fifth frame is the error.
        let mut body = RequestBody::new(chunks(10, 1000), 4500, None);
        let mut passed = 0;
        let error = loop {
            match body.frame().await {
                Some(Ok(frame)) => passed += frame.into_data().map_or(0, |d| d.len()),
                Some(Err(e)) => break e,
                None => panic!("the body ended without an error"),
            }
        };
        assert_eq!(passed, 4000);
        assert_eq!(BodyError::find(&*error), Some(BodyError::TooLarge(4500)));
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_body_read_ahead_whole_is_sent_with_its_length() {
        let mut body = RequestBody::new(chunks(3, 100), 1000, None);
        body.read_ahead(1001).await.unwrap();
        assert_eq!(body.size_hint().exact(), Some(300));
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all.len(), 300);
        // Read ahead past the limit: the error comes from read_ahead itself.
        let mut body = RequestBody::new(chunks(3, 100), 250, None);
        let e = body.read_ahead(251).await.unwrap_err();
        assert_eq!(BodyError::find(&*e), Some(BodyError::TooLarge(250)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_gap_longer_than_the_timeout_is_an_error() {
        use futures_util::StreamExt as _;
        // One frame, then nothing ever again.
        let first = futures_util::stream::iter([Ok::<_, std::io::Error>(Frame::data(
            Bytes::from_static(b"a"),
        ))]);
        let stalled = StreamBody::new(first.chain(futures_util::stream::pending()));
        let mut body = RequestBody::new(stalled, u64::MAX, Some(Duration::from_secs(1)));
        assert!(body.frame().await.unwrap().is_ok());
        let started = tokio::time::Instant::now();
        let e = body.frame().await.unwrap().unwrap_err();
        assert_eq!(
            BodyError::find(&*e),
            Some(BodyError::Stalled(Duration::from_secs(1)))
        );
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }
}
