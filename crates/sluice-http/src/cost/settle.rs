//! Settling a request's cost once its response is over: what was taken before it was
//! forwarded against what it really cost.

use std::future::Future as _;
use std::sync::Arc;

use http::HeaderMap;
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::cost::usage::usage_field;
use crate::cost::Settle;
use crate::policy::Policy;
use sluice::store::Origin;

/// A settlement one policy is owed by one request.
#[derive(Debug)]
pub struct Owed {
    /// The policy.
    pub policy: Arc<Policy>,
    /// The key the request was admitted under (as the request presented it).
    pub key: String,
    /// What was taken before the request was forwarded.
    pub reserved: u64,
    /// When it was taken.
    pub at: Instant,
    /// Whether the real cost is the request body's length (read while it was forwarded).
    pub counts_request_body: bool,
    /// Where the reservation was granted: the settlement goes there and nowhere else.
    pub origin: Origin,
}

/// What a response told about its cost, by the time it ended or was dropped.
#[derive(Debug, Default)]
pub struct Observed<'a> {
    /// The response head.
    pub head: Option<&'a HeaderMap>,
    /// Its trailers, if any came.
    pub trailers: Option<&'a HeaderMap>,
    /// The `usage` object found in its body.
    pub usage: Option<&'a Map<String, Value>>,
    /// The bytes of its body that were sent on.
    pub response_bytes: u64,
    /// The bytes of the request body that were forwarded.
    pub request_bytes: u64,
}

fn number(headers: Option<&HeaderMap>, name: &http::HeaderName) -> Option<u64> {
    headers?
        .get(name)?
        .to_str()
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
}

impl Owed {
    /// The real cost `observed` reports for this policy, if it does.
    pub fn actual(&self, observed: &Observed<'_>) -> Option<u64> {
        if self.counts_request_body {
            return Some(observed.request_bytes);
        }
        match self.policy.cost()?.settle.as_ref()? {
            Settle::Header(name) => number(observed.head, name),
            Settle::Trailer(name) => number(observed.trailers, name),
            Settle::OpenAi(field) => usage_field(observed.usage?, field),
            Settle::ResponseBytes => Some(observed.response_bytes),
        }
    }
}

/// Settles each of `owed` with what `observed` reports, from a task of its own (the caller
/// may be a body being dropped): the difference is given back or charged on the key, and a
/// settlement without a report keeps the estimate.
pub fn settle_all(owed: Vec<Owed>, observed: &Observed<'_>) {
    if owed.is_empty() {
        return;
    }
    let settlements: Vec<(Owed, Option<u64>)> = owed
        .into_iter()
        .map(|o| {
            let actual = o.actual(observed);
            (o, actual)
        })
        .collect();
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // No runtime left (the process is stopping): the estimates stand.
        return;
    };
    let mut settling = Box::pin(async move {
        for (owed, actual) in settlements {
            settle(&owed, actual).await;
        }
    });
    // A memory or file store settles at once: no task is spawned for it. A remote store's
    // round trip goes on in a task of its own.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    if settling.as_mut().poll(&mut cx).is_pending() {
        runtime.spawn(settling);
    }
}

/// What one settlement did, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settled {
    /// Given back: the request cost less than was reserved.
    pub refunded: u64,
    /// Taken on top: it cost more.
    pub charged: u64,
    /// Of what it cost more, the part an empty bucket could not hold.
    pub forgiven: u64,
}

/// Settles one: `actual` against what was reserved (`None`: the estimate stands).
pub async fn settle(owed: &Owed, actual: Option<u64>) -> Settled {
    let metrics = &owed.policy.metrics;
    let Some(actual) = actual else {
        metrics.settled_estimate.increment(1);
        return Settled::default();
    };
    metrics.settled_reported.increment(1);
    let mut settled = Settled::default();
    match actual.cmp(&owed.reserved) {
        std::cmp::Ordering::Less => {
            settled.refunded = owed.reserved - actual;
            owed.policy
                .refund_to(owed.origin, &owed.key, settled.refunded, owed.at.elapsed())
                .await;
            metrics.settled_refunded.increment(settled.refunded);
        }
        std::cmp::Ordering::Greater => {
            let more = actual - owed.reserved;
            settled.forgiven = owed.policy.charge_to(owed.origin, &owed.key, more).await;
            settled.charged = more - settled.forgiven;
            metrics.settled_charged.increment(settled.charged);
            metrics.settled_forgiven.increment(settled.forgiven);
        }
        std::cmp::Ordering::Equal => {}
    }
    settled
}
