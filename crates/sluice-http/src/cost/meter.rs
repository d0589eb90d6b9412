//! The watcher of one response body whose cost is settled when it ends: it reads each frame
//! as it passes (counting bytes, scanning for `usage`, keeping the trailers) and settles when
//! it is dropped, that is when the body ended or its client went away.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::HeaderMap;
use http_body::Frame;

use crate::cost::settle::{settle_all, Observed, Owed};
use crate::cost::usage::{Format, UsageScanner};
use crate::cost::Settle;

/// The bytes of a request body forwarded so far, shared with the body on its way upstream.
pub type RequestBytes = Arc<AtomicU64>;

/// What a settled response is watched for.
#[derive(Debug)]
pub struct Meter {
    owed: Vec<Owed>,
    scanner: Option<UsageScanner>,
    trailers: Option<HeaderMap>,
    response_bytes: u64,
    request_bytes: Option<RequestBytes>,
}

impl Meter {
    /// A meter for the settlements `owed` by a response with `head`; `None` when nothing is
    /// left to watch (the settlements that read only the head are settled at once).
    pub fn start(
        owed: Vec<Owed>,
        head: &HeaderMap,
        request_bytes: Option<RequestBytes>,
    ) -> Option<Box<Meter>> {
        let reads = |o: &Owed, pick: fn(&Settle) -> bool| {
            !o.counts_request_body
                && o.policy
                    .cost()
                    .and_then(|c| c.settle.as_ref())
                    .is_some_and(pick)
        };
        // Read from the head: settled now.
        let (now, later): (Vec<Owed>, Vec<Owed>) = owed
            .into_iter()
            .partition(|o| reads(o, |s| matches!(s, Settle::Header(_))));
        settle_all(
            now,
            &Observed {
                head: Some(head),
                ..Observed::default()
            },
        );
        if later.is_empty() {
            return None;
        }
        let wants_usage = later
            .iter()
            .any(|o| reads(o, |s| matches!(s, Settle::OpenAi(_))));
        let scanner = if wants_usage {
            Format::of(head.get(CONTENT_TYPE).map(|v| v.as_bytes())).map(UsageScanner::new)
        } else {
            None
        };
        Some(Box::new(Meter {
            owed: later,
            scanner,
            trailers: None,
            response_bytes: 0,
            request_bytes,
        }))
    }

    /// Reads one frame on its way to the client.
    #[inline]
    pub fn observe(&mut self, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.observe_data(data);
        } else if let Some(trailers) = frame.trailers_ref() {
            self.trailers = Some(trailers.clone());
        }
    }

    /// Reads bytes of the body (its content, without framing) on their way to the client.
    #[inline]
    pub fn observe_data(&mut self, data: &[u8]) {
        self.response_bytes += data.len() as u64;
        if let Some(scanner) = &mut self.scanner {
            scanner.feed(data);
        }
    }

    /// Keeps the body's trailers.
    pub fn observe_trailers(&mut self, trailers: HeaderMap) {
        self.trailers = Some(trailers);
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        if let Some(scanner) = &mut self.scanner {
            scanner.finish();
        }
        let observed = Observed {
            head: None,
            trailers: self.trailers.as_ref(),
            usage: self.scanner.as_ref().and_then(UsageScanner::usage),
            response_bytes: self.response_bytes,
            request_bytes: self
                .request_bytes
                .as_ref()
                .map_or(0, |n| n.load(Ordering::Relaxed)),
        };
        settle_all(std::mem::take(&mut self.owed), &observed);
    }
}
