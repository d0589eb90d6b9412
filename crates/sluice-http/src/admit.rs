//! Running one request through every policy of a route.
//!
//! # Order, and what a denial costs
//!
//! Every policy must admit. The policies that answer at once (no queue, or the request may
//! not wait) are asked first, in the order listed, then those that may queue, in the order
//! listed: a request refused at once never waits in a queue first. Concurrency limits come
//! last: a slot is taken only by a request every rate admitted, and held until its response
//! is over, so a request waiting for a rate does not hold a slot.
//!
//! A request one policy refuses gets back what the policies before it took
//! ([`Policy::refund`]): a denial spends nothing anywhere, whichever policy gives it, and a
//! route of several policies costs one store call per policy. Between a take and its refund,
//! another request may find that bucket one request emptier. A request dropped while it waits
//! (its client went away) gives its tokens back the same way, from a task of its own.
//!
//! # Shadow policies
//!
//! A policy in shadow mode ([`Policy::shadow`]) never waits and never denies: where it would
//! deny, the request goes on, the would-be denial is counted (`sluice_shadow_denied_total`)
//! and listed in [`Admission::shadow_denied`], and its verdict carries the bucket's real state.
//! Nothing is spent in it then (the store refused the take).

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Uri};
use sluice::store::Origin;
use sluice::{Error, PoolPermit};
use sluice_core::Decision;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::cost::settle::Owed;
use crate::cost::Reserved;
use crate::key::{AmbiguousKey, Key};
use crate::policy::Policy;
use crate::protocol::Protocol;

/// Why a request was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum Reason {
    /// The bucket is empty (or, for a concurrency limit without a queue, every slot is taken).
    Limit = 0,
    /// The wait queue is full.
    QueueFull = 1,
    /// The wait would exceed, or did exceed, the maximum wait.
    Timeout = 2,
    /// The cost exceeds the capacity: no wait would admit it.
    Capacity = 3,
    /// The store could not answer and its policy denies.
    Unavailable = 4,
    /// The request carries the policy's key header or query parameter more than once, with
    /// different values (see [`crate::key`]).
    AmbiguousKey = 5,
}

impl Reason {
    /// Every reason, in `repr` order.
    pub const ALL: [Reason; 6] = [
        Reason::Limit,
        Reason::QueueFull,
        Reason::Timeout,
        Reason::Capacity,
        Reason::Unavailable,
        Reason::AmbiguousKey,
    ];

    /// The name in problem bodies, logs and metrics: `limit`, `queue_full`, `timeout`,
    /// `capacity`, `unavailable`, `ambiguous_key`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Limit => "limit",
            Reason::QueueFull => "queue_full",
            Reason::Timeout => "timeout",
            Reason::Capacity => "capacity",
            Reason::Unavailable => "unavailable",
            Reason::AmbiguousKey => "ambiguous_key",
        }
    }

    /// The HTTP status: 429 for `limit`, `queue_full` and `timeout`, 422 for `capacity`,
    /// 503 for `unavailable`, 400 for `ambiguous_key`.
    pub const fn status(self) -> http::StatusCode {
        match self {
            Reason::Limit | Reason::QueueFull | Reason::Timeout => {
                http::StatusCode::TOO_MANY_REQUESTS
            }
            Reason::Capacity => http::StatusCode::UNPROCESSABLE_ENTITY,
            Reason::Unavailable => http::StatusCode::SERVICE_UNAVAILABLE,
            Reason::AmbiguousKey => http::StatusCode::BAD_REQUEST,
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One policy's state after a decision, for the `RateLimit` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// The policy's position in the list given to [`admit`].
    pub index: usize,
    /// Whole tokens left.
    pub remaining: u64,
    /// Nanoseconds until the bucket is full again.
    pub reset_after_ns: u64,
}

impl Verdict {
    /// The verdict of policy `index` from `decision`.
    pub fn new(index: usize, decision: &Decision) -> Verdict {
        Verdict {
            index,
            remaining: decision.remaining,
            reset_after_ns: decision.reset_after_ns,
        }
    }
}

/// The verdicts of one request, in the route's order; inline up to two policies.
pub type Verdicts = smallvec::SmallVec<[Verdict; 2]>;

/// What a request that every policy admitted carries: the verdicts for its headers, and the
/// concurrency slots it holds (dropping them frees the slots).
#[derive(Debug, Default)]
pub struct Admission {
    /// One per rate policy, in the route's order.
    pub verdicts: Verdicts,
    /// Concurrency slots, freed on drop.
    pub permits: Vec<PoolPermit>,
    /// The shadow policies that would have denied it (their position and why), in the order
    /// they were asked; empty otherwise.
    pub shadow_denied: SmallVec<[(usize, Reason); 1]>,
    /// The policies whose cost is settled when the response ends (see [`crate::cost`]).
    pub owed: Vec<Owed>,
}

/// A request some policy denied.
#[derive(Debug, Clone)]
pub struct Denial {
    /// The position of the policy that denied it in the list given to [`admit`].
    pub index: usize,
    /// Why.
    pub reason: Reason,
    /// When the same request could be admitted, as far as the policy can tell.
    pub retry_after: Duration,
    /// The verdicts known so far, the denying policy's included.
    pub verdicts: Verdicts,
}

impl Denial {
    /// The policy that denied it, from the list given to [`admit`].
    ///
    /// # Panics
    ///
    /// When `policies` is not that list (shorter than [`Denial::index`]).
    pub fn policy<'a>(&self, policies: &'a [Arc<Policy>]) -> &'a Policy {
        &policies[self.index]
    }

    /// `retry_after` in whole seconds, rounded up and at least 1 (a `Retry-After: 0` would
    /// invite an immediate retry storm).
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs() + u64::from(self.retry_after.subsec_nanos() > 0);
        secs.max(1)
    }

    /// `retry_after` in whole milliseconds, rounded up.
    pub fn retry_after_ms(&self) -> u64 {
        let nanos = self.retry_after.as_nanos();
        u64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// The parts of a request that policies look at.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    /// The request headers (for `header:` and `cookie:` keys).
    pub headers: &'a HeaderMap,
    /// The request URI (for `query:` keys).
    pub uri: &'a Uri,
    /// The client address (for `ip` keys).
    pub client_ip: Option<IpAddr>,
    /// Tokens to take from each bucket (1 for a request).
    pub cost: u64,
    /// Whether the request may wait in queues (false for bodies above `queue_max_body`).
    pub may_wait: bool,
    /// Whether it came from a trusted proxy, whose headers may set a request's cost
    /// (`cost.request = "header:NAME"`); from anyone else, such a header is ignored.
    pub from_trusted_proxy: bool,
    /// The whole request body, when it was read for a reservation computed from it
    /// (`cost.reserve = "openai"`); `None` when it was not read.
    pub body: Option<&'a [u8]>,
}

impl Ask<'_> {
    /// What the request takes from `policy` now: its cost spec's, or [`Ask::cost`].
    pub fn reserve(&self, policy: &Policy) -> Reserved {
        match policy.cost() {
            None => Reserved {
                cost: self.cost,
                settles: false,
                counts_request_body: false,
            },
            Some(spec) => spec.reserve_for(self.headers, self.from_trusted_proxy, self.body),
        }
    }

    fn key(&self, policy: &Policy) -> Result<Key<'_>, AmbiguousKey> {
        // Tagged with the request's plan, for a policy with plans (see `crate::plan`).
        policy.request_key(self.headers, self.uri, self.client_ip)
    }

    /// Whether the request waits in `policy`'s queue rather than being answered at once: it
    /// may wait, the policy has a queue, and the policy is not in shadow mode. The policies
    /// it does not wait for are asked first (see the [module docs](self)).
    pub fn waits(&self, policy: &Policy) -> bool {
        self.may_wait && policy.queue().is_some() && !policy.shadow()
    }
}

/// Asks every policy in `policies` to admit `ask` (see the [module docs](self) for the
/// order, and for what a denial gives back), counted in the metrics as an `http1` request
/// (see [`admit_as`]).
///
/// # Errors
///
/// The first [`Denial`].
///
/// # Cancel safety
///
/// Dropping the future leaves any queue it waits in and gives back the tokens it took.
pub async fn admit(policies: &[Arc<Policy>], ask: &Ask<'_>) -> Result<Admission, Denial> {
    admit_as(policies, ask, Protocol::Http1).await
}

/// [`admit`], counted in the policies' metrics under `protocol`.
///
/// # Errors
///
/// The first [`Denial`].
///
/// # Cancel safety
///
/// Dropping the future leaves any queue it waits in and gives back the tokens it took.
pub async fn admit_as(
    policies: &[Arc<Policy>],
    ask: &Ask<'_>,
    protocol: Protocol,
) -> Result<Admission, Denial> {
    let mut admission = Admission::default();
    // What a later refusal must give back; not kept when nothing can refuse after a take.
    let keep = policies.len() > 1 || policies.iter().any(|p| p.concurrency().is_some());
    let mut taken = Taken {
        policies,
        entries: SmallVec::new(),
    };
    for waiting in [false, true] {
        for (i, policy) in policies.iter().enumerate() {
            if ask.waits(policy) != waiting {
                continue;
            }
            let Ok(key) = ask.key(policy) else {
                if policy.shadow() {
                    policy.count_shadow_denied();
                    admission.shadow_denied.push((i, Reason::AmbiguousKey));
                    continue;
                }
                taken.give_back().await;
                policy.metrics.denied(Reason::AmbiguousKey, protocol);
                return Err(Denial {
                    index: i,
                    reason: Reason::AmbiguousKey,
                    retry_after: Duration::ZERO,
                    verdicts: admission.verdicts,
                });
            };
            let reserved = ask.reserve(policy);
            match decide(policy, &key, reserved.cost, waiting).await {
                Ok((decision, origin)) => {
                    admission.verdicts.push(Verdict::new(i, &decision));
                    if reserved.settles {
                        admission.owed.push(Owed {
                            policy: Arc::clone(policy),
                            key: String::from(&*key),
                            reserved: reserved.cost,
                            at: Instant::now(),
                            counts_request_body: reserved.counts_request_body,
                            origin,
                        });
                    }
                    if keep {
                        taken.entries.push(Took {
                            index: i,
                            key,
                            at: Instant::now(),
                            cost: reserved.cost,
                            origin,
                        });
                    }
                }
                Err(e) if policy.shadow() => {
                    let (reason, _, verdict) = judge(i, policy, &key, e).await;
                    admission.verdicts.push(verdict);
                    policy.count_shadow_denied();
                    admission.shadow_denied.push((i, reason));
                }
                Err(e) => {
                    taken.give_back().await;
                    return Err(deny(i, policy, &key, e, admission.verdicts, protocol).await);
                }
            }
        }
    }
    for (i, policy) in policies.iter().enumerate() {
        let Some(pool) = policy.concurrency() else {
            continue;
        };
        let waits = ask.waits(policy);
        let permit = if waits {
            let _waiting = Waiting::enter(policy);
            pool.acquire().await
        } else {
            pool.try_acquire()
        };
        match permit {
            Ok(permit) => admission.permits.push(permit),
            Err(_) if policy.shadow() => {
                policy.count_shadow_denied();
                admission.shadow_denied.push((i, Reason::Limit));
            }
            Err(e) => {
                // Without a queue, a full pool is the limit itself, not a full queue.
                let (reason, retry_after) = match e {
                    Error::QueueFull { retry_after } if !waits => (Reason::Limit, retry_after),
                    Error::QueueFull { retry_after } => (Reason::QueueFull, retry_after),
                    Error::Timeout { retry_after } => (Reason::Timeout, retry_after),
                    _ => (Reason::Unavailable, Duration::from_secs(1)),
                };
                taken.give_back().await;
                policy.metrics.denied(reason, protocol);
                // The slots have no bucket to show: the verdicts are the rates' ones.
                return Err(Denial {
                    index: i,
                    reason,
                    retry_after,
                    verdicts: admission.verdicts,
                });
            }
        }
    }
    taken.entries.clear();
    for verdict in &admission.verdicts {
        if !admission
            .shadow_denied
            .iter()
            .any(|(i, _)| *i == verdict.index)
        {
            policies[verdict.index].metrics.admitted(protocol);
        }
    }
    Ok(admission)
}

/// The tokens a request has taken so far. Given back where they were granted on a refusal,
/// or, if the request is dropped before it is decided, from a task of their own.
struct Taken<'a, 'k> {
    policies: &'a [Arc<Policy>],
    entries: SmallVec<[Took<'k>; 2]>,
}

/// One take: the policy's index, the key, when, how many, and where they were granted.
struct Took<'k> {
    index: usize,
    key: Key<'k>,
    at: Instant,
    cost: u64,
    origin: Origin,
}

impl Taken<'_, '_> {
    async fn give_back(&mut self) {
        for t in self.entries.drain(..) {
            self.policies[t.index]
                .refund_to(t.origin, &t.key, t.cost, t.at.elapsed())
                .await;
        }
    }
}

impl Drop for Taken<'_, '_> {
    fn drop(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let policies = self.policies;
        let owed: Vec<(Arc<Policy>, String, Instant, u64, Origin)> = self
            .entries
            .drain(..)
            .map(|t| {
                let policy = Arc::clone(&policies[t.index]);
                (policy, String::from(&*t.key), t.at, t.cost, t.origin)
            })
            .collect();
        runtime.spawn(async move {
            for (policy, key, at, cost, origin) in owed {
                policy.refund_to(origin, &key, cost, at.elapsed()).await;
            }
        });
    }
}

/// One policy's decision, with where it was granted: at once, or after waiting in its queue
/// when `wait`.
async fn decide(
    policy: &Policy,
    key: &str,
    cost: u64,
    wait: bool,
) -> Result<(Decision, Origin), Error> {
    match policy.check_granted(key, cost).await {
        Err(Error::Limited { .. }) if wait => {
            let _waiting = Waiting::enter(policy);
            policy.acquire_granted(key, cost).await
        }
        result => result,
    }
}

async fn deny(
    index: usize,
    policy: &Policy,
    key: &str,
    error: Error,
    mut verdicts: Verdicts,
    protocol: Protocol,
) -> Denial {
    let (reason, retry_after, verdict) = judge(index, policy, key, error).await;
    verdicts.push(verdict);
    policy.metrics.denied(reason, protocol);
    Denial {
        index,
        reason,
        retry_after,
        verdicts,
    }
}

/// Why policy `index` refused `key`, when to retry, and its verdict (the bucket's state).
async fn judge(
    index: usize,
    policy: &Policy,
    key: &str,
    error: Error,
) -> (Reason, Duration, Verdict) {
    let (reason, retry_after, decision) = match error {
        Error::Limited {
            retry_after,
            decision,
        } => (Reason::Limit, retry_after, Some(decision)),
        Error::QueueFull { retry_after } => (Reason::QueueFull, retry_after, None),
        Error::Timeout { retry_after } => (Reason::Timeout, retry_after, None),
        Error::InsufficientCapacity { .. } => (Reason::Capacity, Duration::ZERO, None),
        Error::Unavailable { retry_after } => (Reason::Unavailable, retry_after, None),
        _ => (Reason::Unavailable, Duration::from_secs(1), None),
    };
    let decision = match decision {
        Some(d) => Some(d),
        None => policy.peek(key).await.ok(),
    };
    let verdict = match decision {
        Some(d) => Verdict::new(index, &d),
        None => Verdict {
            index,
            remaining: 0,
            reset_after_ns: u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX),
        },
    };
    (reason, retry_after, verdict)
}

/// Counts a request in its policy's `sluice_policy_waiting` gauge while it waits.
struct Waiting<'a>(&'a Policy);

impl<'a> Waiting<'a> {
    fn enter(policy: &'a Policy) -> Waiting<'a> {
        policy.metrics.waiting.increment(1.0);
        Waiting(policy)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.metrics.waiting.decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{AnyAlgorithm, Kind, Quota};

    fn policy(name: &str, capacity: u64, rate: &str) -> Arc<Policy> {
        let alg = AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(capacity, rate).unwrap());
        Arc::new(Policy::builder(name, alg).build().unwrap())
    }

    fn ask<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Ask<'a> {
        Ask {
            headers,
            uri,
            client_ip: None,
            cost: 1,
            may_wait: true,
            from_trusted_proxy: false,
            body: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_policy_denies_before_others_spend() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let wide = policy("wide", 10, "1/s");
        let narrow = policy("narrow", 1, "1/min");
        let route = [Arc::clone(&wide), Arc::clone(&narrow)];
        assert!(admit(&route, &ask(&headers, &uri)).await.is_ok());
        for _ in 0..5 {
            let denial = admit(&route, &ask(&headers, &uri)).await.unwrap_err();
            assert_eq!(denial.policy(&route).name(), "narrow");
            assert_eq!(denial.reason, Reason::Limit);
            assert!(denial.retry_after_secs() >= 59);
        }
        assert_eq!(
            wide.peek("").await.unwrap().remaining,
            9,
            "denials spent nothing"
        );
    }

    /// A shadow policy never denies and never waits, though it has a queue: its would-be
    /// denials are listed with its real state, and the other policies still decide.
    #[tokio::test(start_paused = true)]
    async fn a_shadow_policy_never_denies_or_waits() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let alg = AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(2, "1/min").unwrap());
        let shadow = Arc::new(
            Policy::builder("shadow", alg)
                .shadow(true)
                .queue(10, Duration::from_secs(600))
                .concurrency(1)
                .build()
                .unwrap(),
        );
        let wide = policy("wide", 4, "1/min");
        let route = [Arc::clone(&shadow), Arc::clone(&wide)];
        let mut held = Vec::new();
        for i in 0..4u64 {
            let started = Instant::now();
            let admission = admit(&route, &ask(&headers, &uri)).await.unwrap();
            assert_eq!(started.elapsed(), Duration::ZERO, "never waits");
            let shadow_verdict = admission.verdicts.iter().find(|v| v.index == 0).unwrap();
            assert_eq!(shadow_verdict.remaining, 1u64.saturating_sub(i));
            // The first request holds the only slot: every later one would be refused (by the
            // pool), the third and fourth by the bucket too.
            let expected: &[(usize, Reason)] = match i {
                0 => &[],
                1 => &[(0, Reason::Limit)],
                _ => &[(0, Reason::Limit), (0, Reason::Limit)],
            };
            assert_eq!(&admission.shadow_denied[..], expected, "request {i}");
            held.push(admission);
        }
        // The real policy still denies.
        let denial = admit(&route, &ask(&headers, &uri)).await.unwrap_err();
        assert_eq!(denial.policy(&route).name(), "wide");
    }

    fn queued(name: &str, capacity: u64, rate: &str, max_wait_ms: u64) -> Arc<Policy> {
        let alg = AnyAlgorithm::new(Kind::Gcra, Quota::parse(capacity, rate).unwrap());
        Arc::new(
            Policy::builder(name, alg)
                .queue(4, Duration::from_millis(max_wait_ms))
                .build()
                .unwrap(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_queue_that_refuses_gives_back_what_the_others_took() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let wide = policy("wide", 10, "1/s");
        // One token every 10 s: a second request would wait 10 s, above the 1 s maximum.
        let slow = queued("slow", 1, "6/min", 1_000);
        let route = [Arc::clone(&wide), Arc::clone(&slow)];
        assert!(admit(&route, &ask(&headers, &uri)).await.is_ok());
        assert_eq!(wide.peek("").await.unwrap().remaining, 9);
        for _ in 0..3 {
            let denial = admit(&route, &ask(&headers, &uri)).await.unwrap_err();
            assert_eq!(denial.policy(&route).name(), "slow");
            assert_eq!(denial.reason, Reason::Timeout);
        }
        assert_eq!(
            wide.peek("").await.unwrap().remaining,
            9,
            "the refused requests gave their tokens back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_pool_gives_the_tokens_back() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let alg = AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(5, "1/min").unwrap());
        let p = Arc::new(Policy::builder("c", alg).concurrency(1).build().unwrap());
        let route = [Arc::clone(&p)];
        let held = admit(&route, &ask(&headers, &uri)).await.unwrap();
        for _ in 0..3 {
            assert_eq!(
                admit(&route, &ask(&headers, &uri))
                    .await
                    .unwrap_err()
                    .reason,
                Reason::Limit
            );
        }
        assert_eq!(p.peek("").await.unwrap().remaining, 4);
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_dropped_while_it_waits_gives_its_tokens_back() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let wide = policy("wide", 10, "1/h");
        let slow = queued("slow", 1, "6/min", 60_000);
        let route = [Arc::clone(&wide), Arc::clone(&slow)];
        admit(&route, &ask(&headers, &uri)).await.unwrap();
        let second = ask(&headers, &uri);
        let waiting = admit(&route, &second);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), waiting)
                .await
                .is_err(),
            "it waits its turn in `slow`"
        );
        // The refund runs in a task of its own.
        tokio::task::yield_now().await;
        assert_eq!(wide.peek("").await.unwrap().remaining, 9);
    }

    #[tokio::test(start_paused = true)]
    async fn queues_wait_then_time_out() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let alg = AnyAlgorithm::new(Kind::Gcra, Quota::parse(1, "10/s").unwrap());
        let p = Arc::new(
            Policy::builder("q", alg)
                .queue(1, Duration::from_millis(150))
                .build()
                .unwrap(),
        );
        let route = [p];
        admit(&route, &ask(&headers, &uri)).await.unwrap();
        let start = tokio::time::Instant::now();
        admit(&route, &ask(&headers, &uri)).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(100));
        let mut no_wait = ask(&headers, &uri);
        no_wait.may_wait = false;
        assert_eq!(
            admit(&route, &no_wait).await.unwrap_err().reason,
            Reason::Limit
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrency_without_queue_is_a_limit() {
        let (headers, uri) = (HeaderMap::new(), Uri::from_static("/"));
        let alg = AnyAlgorithm::new(Kind::Gcra, Quota::parse(100, "100/s").unwrap());
        let p = Arc::new(Policy::builder("c", alg).concurrency(1).build().unwrap());
        let route = [p];
        let held = admit(&route, &ask(&headers, &uri)).await.unwrap();
        let denial = admit(&route, &ask(&headers, &uri)).await.unwrap_err();
        assert_eq!(denial.reason, Reason::Limit);
        drop(held);
        assert!(admit(&route, &ask(&headers, &uri)).await.is_ok());
    }
}
