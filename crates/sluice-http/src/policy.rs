//! A named policy: algorithm and quota, whose bucket a request spends, how many keys are
//! kept, how long a request may wait, and how many may be in flight.

use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::Duration;

use sluice::keyed::Keyed;
use sluice::store::{MemoryStore, Origin, Store};
use sluice::{AcquireOptions, Error, Pool};
use sluice_core::{Algorithm, AnyAlgorithm, Decision, Quota};

use crate::backend::Backend;
use crate::cost::CostSpec;
use crate::key::{AmbiguousKey, Key, KeySpec};
use crate::key_hash::KeyHasher;
use crate::metrics::PolicyMetrics;
use crate::plan::{self, Plans};

/// The default cap on keys per policy.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// How long a request may wait for its turn: at most `depth` waiters per key, each for at
/// most `max_wait`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueSpec {
    /// Waiters per key (and for the concurrency limit).
    pub depth: usize,
    /// The longest wait; a request whose predicted wait is longer is denied at once.
    pub max_wait: Duration,
}

/// A policy could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Names are what headers, metrics and the decision API show.
    #[error("invalid policy name `{0}`: use 1 to 64 of A-Z a-z 0-9 _ - .")]
    InvalidName(String),
    /// `concurrency = 0` would admit nothing.
    #[error("concurrency must be at least 1, got 0")]
    ZeroConcurrency,
    /// `max_keys = 0` would keep no bucket.
    #[error("max_keys must be at least 1, got 0")]
    ZeroMaxKeys,
}

/// A named limit. Share it as `Arc<Policy>`: every clone of a service, every route naming it
/// and every reload that keeps it spends the same buckets.
pub struct Policy {
    name: Arc<str>,
    algorithm: AnyAlgorithm,
    key: KeySpec,
    max_keys: usize,
    queue: Option<QueueSpec>,
    concurrency: Option<Pool>,
    backend: Backend,
    /// Keys of a header, cookie or query parameter go to the store hashed.
    hasher: Option<KeyHasher>,
    item: String,
    shadow: bool,
    cost: Option<CostSpec>,
    /// The plans, each deciding its keys with its own quota and store (see [`crate::plan`]).
    plans: Option<Plans>,
    pub(crate) metrics: PolicyMetrics,
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Policy")
            .field("name", &self.name)
            .field("algorithm", &self.algorithm.which())
            .field("quota", &self.algorithm.quota())
            .field("key", &self.key)
            .field("max_keys", &self.max_keys)
            .field("queue", &self.queue)
            .field("concurrency", &self.concurrency.as_ref().map(Pool::size))
            .field("backend", &self.backend.kind())
            .finish()
    }
}

/// Builds a [`Policy`]. Start from [`Policy::builder`].
#[derive(Debug, Clone)]
pub struct PolicyBuilder {
    name: String,
    algorithm: AnyAlgorithm,
    key: KeySpec,
    max_keys: usize,
    queue: Option<QueueSpec>,
    concurrency: Option<usize>,
    pool: Option<Pool>,
    backend: Option<Backend>,
    hasher: Option<KeyHasher>,
    shadow: bool,
    cost: Option<CostSpec>,
    plans: Option<Plans>,
}

impl Policy {
    /// Starts a policy named `name` over `algorithm`: global key, 100,000 keys, no queue, no
    /// concurrency limit, in memory.
    pub fn builder(name: impl Into<String>, algorithm: AnyAlgorithm) -> PolicyBuilder {
        PolicyBuilder {
            name: name.into(),
            algorithm,
            key: KeySpec::Global,
            max_keys: DEFAULT_MAX_KEYS,
            queue: None,
            concurrency: None,
            pool: None,
            backend: None,
            hasher: None,
            shadow: false,
            cost: None,
            plans: None,
        }
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The algorithm, with its quota.
    pub fn algorithm(&self) -> &AnyAlgorithm {
        &self.algorithm
    }

    /// The quota.
    pub fn quota(&self) -> Quota {
        self.algorithm.quota()
    }

    /// Whose bucket a request spends.
    pub fn key_spec(&self) -> &KeySpec {
        &self.key
    }

    /// The cap on keys.
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// The wait queue, if any.
    pub fn queue(&self) -> Option<QueueSpec> {
        self.queue
    }

    /// The concurrency limit, if any.
    pub fn concurrency(&self) -> Option<&Pool> {
        self.concurrency.as_ref()
    }

    /// Whether the policy is in shadow mode: it decides and counts as usual, and its
    /// headers show its real numbers, but it never denies and never queues (see
    /// [`PolicyBuilder::shadow`]).
    pub fn shadow(&self) -> bool {
        self.shadow
    }

    /// What a request costs this policy, when not one token (see [`crate::cost`]).
    pub fn cost(&self) -> Option<&CostSpec> {
        self.cost.as_ref()
    }

    /// Counts a request this policy, in shadow mode, would have denied and let through, in
    /// `sluice_shadow_denied_total`.
    pub fn count_shadow_denied(&self) {
        self.metrics.shadow_denied.increment(1);
    }

    /// The store.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// This policy as a member of `RateLimit-Policy`: `"name";q=CAPACITY;w=WINDOW_SECONDS`,
    /// the window being `capacity × interval` rounded up to whole seconds (at least 1).
    pub fn policy_item(&self) -> &str {
        &self.item
    }

    /// Takes `cost` from `key`'s bucket now if it allows; never waits.
    ///
    /// # Errors
    ///
    /// As [`Store::check`].
    pub async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_granted(key, cost).await.map(|(d, _)| d)
    }

    /// [`Policy::check`], with where the admission was granted: what a refund or a settled
    /// charge of it names (see [`Origin`]).
    ///
    /// # Errors
    ///
    /// As [`Store::check`].
    pub async fn check_granted(&self, key: &str, cost: u64) -> Result<(Decision, Origin), Error> {
        let (p, key) = self.target(key);
        match &p.hasher {
            None => p.backend.check_granted(key, cost).await,
            Some(h) => p.backend.check_granted(&h.hash(key), cost).await,
        }
    }

    /// The key of a request to this policy: [`KeySpec::extract`] of its key spec, tagged
    /// with the request's plan when the policy has plans (see [`crate::plan`]). What
    /// [`Policy::check`], [`Policy::acquire`], [`Policy::refund`] and [`Policy::peek`] take.
    ///
    /// # Errors
    ///
    /// [`AmbiguousKey`] when the key's, or the plan's, header or query parameter appears more
    /// than once with different values.
    pub fn request_key<'a>(
        &self,
        headers: &'a http::HeaderMap,
        uri: &'a http::Uri,
        client_ip: Option<std::net::IpAddr>,
    ) -> Result<Key<'a>, AmbiguousKey> {
        self.tagged_key(headers, uri, client_ip, true)
    }

    /// [`Policy::request_key`] without counting an unknown plan: for a second look at a
    /// request already counted (its headers, an explanation).
    ///
    /// # Errors
    ///
    /// As [`Policy::request_key`].
    pub fn request_key_uncounted<'a>(
        &self,
        headers: &'a http::HeaderMap,
        uri: &'a http::Uri,
        client_ip: Option<std::net::IpAddr>,
    ) -> Result<Key<'a>, AmbiguousKey> {
        self.tagged_key(headers, uri, client_ip, false)
    }

    fn tagged_key<'a>(
        &self,
        headers: &'a http::HeaderMap,
        uri: &'a http::Uri,
        client_ip: Option<std::net::IpAddr>,
        count: bool,
    ) -> Result<Key<'a>, AmbiguousKey> {
        let key = self.key.extract(headers, uri, client_ip)?;
        let Some(plans) = &self.plans else {
            return Ok(key);
        };
        let name = plans.source.extract(headers, uri, client_ip)?;
        let known = !name.is_empty() && plans.tiers.contains_key(&*name);
        if count && !name.is_empty() && !known {
            plans.unknown.increment(1);
        }
        Ok(Key::Owned(plan::tag(if known { &name } else { "" }, &key)))
    }

    /// The policy that decides `key` (this one, or one of its plans) and the key without its
    /// tag.
    ///
    /// A key with a quota of its own in this policy's store (set through
    /// [`Backend::set_override`]) is decided there, whatever its plan: an override beats the
    /// plan.
    pub fn target<'k>(&self, key: &'k str) -> (&Policy, &'k str) {
        let Some(plans) = &self.plans else {
            return (self, key);
        };
        match plan::split(key) {
            None => (self, key),
            Some((name, key)) => match plans.tiers.get(name) {
                Some(tier) if !name.is_empty() && !self.overridden(key) => (tier, key),
                _ => (self, key),
            },
        }
    }

    /// Whether `key` (untagged) has a quota of its own in this policy's store.
    fn overridden(&self, key: &str) -> bool {
        self.backend.has_overrides() && self.backend.override_of(&self.hashed(key)).is_some()
    }

    fn hashed<'k>(&self, key: &'k str) -> std::borrow::Cow<'k, str> {
        match &self.hasher {
            None => std::borrow::Cow::Borrowed(key),
            Some(h) => std::borrow::Cow::Owned(h.hash(key)),
        }
    }

    /// What (tagged) `key` owes beyond an empty bucket, read from `state` (a peek of it): the
    /// debt a settled charge left, in whole tokens (rounded up) and in the nanoseconds of
    /// refill that pay it, under the quota that decides the key. `(0, 0)` for a key not in
    /// debt and for the window algorithms, which carry none.
    pub fn debt_of(&self, key: &str, state: &Decision) -> (u64, u64) {
        let (quota, _) = self.quota_for(key);
        let algorithm = AnyAlgorithm::new(self.algorithm().kind(), quota);
        (algorithm.debt_tokens(state), algorithm.debt_ns(state))
    }

    /// `key`'s bucket now, consuming nothing, whether or not it would admit: a key in debt
    /// refuses even a query, and its refusal carries its state all the same.
    ///
    /// # Errors
    ///
    /// As [`Store::peek`], less [`Error::Limited`].
    pub async fn state_of(&self, key: &str) -> Result<Decision, Error> {
        match self.peek(key).await {
            Err(Error::Limited { decision, .. }) => Ok(decision),
            other => other,
        }
    }

    /// The quota that decides (tagged) `key`, and where it comes from.
    pub fn quota_for(&self, key: &str) -> (Quota, QuotaSource) {
        let (p, untagged) = self.target(key);
        if let Some(q) = p.backend.override_of(&p.hashed(untagged)) {
            return (q, QuotaSource::Override);
        }
        match self.plan_of(key) {
            Some(plan) if !std::ptr::eq(p, self) => (p.quota(), QuotaSource::Plan(plan.to_owned())),
            _ => (self.quota(), QuotaSource::Policy),
        }
    }

    /// The plan a (tagged) key is decided under, if any.
    pub fn plan_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        self.plans.as_ref()?;
        plan::split(key).map(|(name, _)| name).filter(|name| {
            !name.is_empty()
                && self
                    .plans
                    .as_ref()
                    .is_some_and(|p| p.tiers.contains_key(*name))
        })
    }

    /// The plans, if any.
    pub fn plans(&self) -> Option<&Plans> {
        self.plans.as_ref()
    }

    /// Whether the quota depends on the request (plans): `RateLimit-Policy` is then rendered
    /// per request ([`Policy::policy_item_for`]).
    pub fn has_tiers(&self) -> bool {
        self.plans.is_some() || self.backend.has_overrides()
    }

    /// This policy as a member of `RateLimit-Policy` for a request of (tagged) `key`: the
    /// quota that decides it (its plan's, or the key's own).
    pub fn policy_item_for(&self, key: &str) -> std::borrow::Cow<'_, str> {
        let (p, untagged) = self.target(key);
        match p.backend.override_of(&p.hashed(untagged)) {
            Some(q) => std::borrow::Cow::Owned(item(display_name(&self.name), q)),
            None => std::borrow::Cow::Borrowed(p.policy_item()),
        }
    }

    /// `key` as the store holds it: hashed if the policy hashes keys (see
    /// [`PolicyBuilder::hash_keys`]).
    pub fn stored_key<'k>(&self, key: &'k str) -> std::borrow::Cow<'k, str> {
        let (p, key) = self.target(key);
        p.hashed(key)
    }

    /// Waits in `key`'s queue until `cost` is admitted (without a queue, as [`Policy::check`]).
    ///
    /// # Errors
    ///
    /// As [`Store::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives back its place in the queue.
    pub async fn acquire(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.acquire_granted(key, cost).await.map(|(d, _)| d)
    }

    /// [`Policy::acquire`], with where the admission was granted.
    ///
    /// # Errors
    ///
    /// As [`Store::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`Policy::acquire`].
    pub async fn acquire_granted(&self, key: &str, cost: u64) -> Result<(Decision, Origin), Error> {
        let (p, key) = self.target(key);
        p.backend
            .acquire_granted(&p.stored_key(key), cost, AcquireOptions::default())
            .await
    }

    /// Gives back `cost` taken from `key`'s bucket `ago`, for a request another policy then
    /// refused (see [`Store::refund`]).
    pub async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        self.refund_to(Origin::Store, key, cost, ago).await;
    }

    /// [`Policy::refund`] of an admission granted at `origin`: given back there or nowhere
    /// (see [`Store::refund_to`]).
    pub async fn refund_to(&self, origin: Origin, key: &str, cost: u64, ago: Duration) {
        let (p, key) = self.target(key);
        p.backend
            .refund_to(origin, &p.stored_key(key), cost, ago)
            .await;
    }

    /// Takes `cost` from `key`'s bucket without asking, for a cost learnt after the request
    /// ran (see [`Store::charge`]): a bucket goes into debt, down to the policy's
    /// `cost.max_debt` (no cap without one). Returns the part forgiven.
    pub async fn charge(&self, key: &str, cost: u64) -> u64 {
        self.charge_to(Origin::Store, key, cost).await
    }

    /// [`Policy::charge`] of an admission granted at `origin`: taken there or nowhere (see
    /// [`Store::charge_to`]).
    pub async fn charge_to(&self, origin: Origin, key: &str, cost: u64) -> u64 {
        let max_debt = self.max_debt();
        let (p, key) = self.target(key);
        p.backend
            .charge_to(origin, &p.stored_key(key), cost, max_debt)
            .await
    }

    /// The most a key of this policy may owe beyond empty after a charge, in tokens
    /// (`u64::MAX`: no cap).
    pub fn max_debt(&self) -> u64 {
        self.cost.as_ref().map_or(u64::MAX, |c| c.max_debt)
    }

    /// `key`'s bucket now, consuming nothing.
    ///
    /// # Errors
    ///
    /// As [`Store::peek`].
    pub async fn peek(&self, key: &str) -> Result<Decision, Error> {
        let (p, key) = self.target(key);
        p.backend.peek(&p.stored_key(key)).await
    }

    /// Counts an admission decided outside [`crate::admit::admit`] (by Envoy's rate limit
    /// service, say: `protocol` is then `grpc`) in `sluice_policy_admitted_total`.
    pub fn count_admitted(&self, protocol: crate::protocol::Protocol) {
        self.metrics.admitted(protocol);
    }

    /// Counts a denial decided outside [`crate::admit::admit`] in
    /// `sluice_policy_denied_total{reason}`.
    pub fn count_denied(&self, reason: crate::admit::Reason, protocol: crate::protocol::Protocol) {
        self.metrics.denied(reason, protocol);
    }

    /// Whether `other`'s buckets can be carried over into a policy configured like this one:
    /// same name, algorithm, quota, key, key cap, queue and store kind. A reload keeps the
    /// state of such a policy (see [`PolicyBuilder::reuse`]).
    pub fn same_buckets(&self, other: &Policy) -> bool {
        self.name == other.name
            && self.algorithm == other.algorithm
            && self.key == other.key
            && self.max_keys == other.max_keys
            && self.queue == other.queue
            && self.backend.kind() == other.backend.kind()
    }
}

impl PolicyBuilder {
    /// Whose bucket a request spends (default: global).
    pub fn key(mut self, key: KeySpec) -> Self {
        self.key = key;
        self
    }

    /// At most `max_keys` buckets (default 100,000); idle ones are dropped first.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Requests may wait: at most `depth` per key, each for at most `max_wait`.
    pub fn queue(mut self, depth: usize, max_wait: Duration) -> Self {
        self.queue = Some(QueueSpec { depth, max_wait });
        self
    }

    /// At most `n` admitted requests in flight at once (until their response is sent).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// Shadow mode: the policy decides, spends and counts as usual, but a request it would
    /// deny (or make wait) goes on at once, counted in `sluice_shadow_denied_total`: a way to
    /// try a limit on real traffic before it applies (default: off).
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// What a request costs: a request-side cost, an estimate settled when the response
    /// ends (see [`crate::cost`]). Default: one token, final.
    pub fn cost(mut self, cost: CostSpec) -> Self {
        self.cost = Some(cost);
        self
    }

    /// Plans: the name read from `source` (a header or query parameter) selects one of
    /// `tiers`, each a policy of its own quota and store built for this one (same key spec,
    /// key cap and queue; name `NAME@PLAN`); see [`crate::plan`].
    pub fn plans(mut self, source: KeySpec, tiers: Vec<(String, Arc<Policy>)>) -> Self {
        self.plans = Some(Plans::new(display_name(&self.name), source, tiers));
        self
    }

    /// Uses `backend` instead of a new memory store. It must have been built for the same
    /// algorithm, key cap and queue.
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Stores keys taken from a header, a cookie or a query parameter (secrets such as API keys
    /// and bearer tokens) as `hasher`'s keyed hash; IP and global keys stay as they are. Use it
    /// with a store that keeps keys outside the process (a file, Redis), and the same salt in
    /// every gateway that shares the store.
    pub fn hash_keys(mut self, hasher: KeyHasher) -> Self {
        self.hasher = Some(hasher);
        self
    }

    /// Carries over `old`'s store, and so its buckets, when [`Policy::same_buckets`] would
    /// hold for what this builder builds (the store is `old`'s, whatever its kind: to move
    /// to another kind of store, do not reuse), and its concurrency pool when the size is the
    /// same. This is what a reload does.
    pub fn reuse(mut self, old: &Policy) -> Self {
        if self.name == *old.name
            && self.algorithm == old.algorithm
            && self.key == old.key
            && self.max_keys == old.max_keys
            && self.queue.filter(|q| q.depth > 0) == old.queue
        {
            self.backend = Some(old.backend.clone());
        }
        self.reuse_pool(old)
    }

    /// Uses `pool` (shared, with its slots in use) as the concurrency limit, whatever size this
    /// builder asks for: the caller resizes it ([`Pool::resize`]).
    pub fn pool(mut self, pool: Pool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// Carries over `old`'s concurrency pool (its slots in use included) when this builder
    /// asks for the same size.
    pub fn reuse_pool(mut self, old: &Policy) -> Self {
        if let (Some(n), Some(pool)) = (self.concurrency, &old.concurrency) {
            if pool.size() == n {
                self.pool = Some(pool.clone());
            }
        }
        self
    }

    /// The policy.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] for a bad name, a zero key cap or a zero concurrency.
    pub fn build(self) -> Result<Policy, PolicyError> {
        let valid = match self.name.split_once('@') {
            // A plan's policy: `POLICY@PLAN`.
            Some((policy, plan)) => is_valid_name(policy) && is_valid_name(plan),
            None => is_valid_name(&self.name),
        };
        if !valid {
            return Err(PolicyError::InvalidName(self.name));
        }
        if self.max_keys == 0 {
            return Err(PolicyError::ZeroMaxKeys);
        }
        let queue = self.queue.filter(|q| q.depth > 0);
        let concurrency = match (self.pool, self.concurrency) {
            (Some(pool), _) => Some(pool),
            (None, Some(n)) => {
                let size = NonZeroUsize::new(n).ok_or(PolicyError::ZeroConcurrency)?;
                let (depth, max_wait) =
                    queue.map_or((0, Duration::ZERO), |q| (q.depth, q.max_wait));
                Some(Pool::bounded(size, depth, max_wait, &self.name))
            }
            (None, None) => None,
        };
        let backend = self.backend.unwrap_or_else(|| {
            let keyed = Keyed::builder(self.algorithm)
                .max_keys(self.max_keys)
                .name(self.name.clone());
            let keyed = match queue {
                Some(q) => keyed.queue(q.depth, q.max_wait),
                None => keyed,
            };
            Backend::Memory(MemoryStore::from_keyed(keyed.build()))
        });
        let shown = display_name(&self.name);
        let item = item(shown, self.algorithm.quota());
        let hasher = self.hasher.filter(|_| {
            matches!(
                self.key,
                KeySpec::Header(_) | KeySpec::Cookie(_) | KeySpec::Query(_)
            )
        });
        Ok(Policy {
            shadow: self.shadow,
            cost: self.cost,
            hasher,
            metrics: PolicyMetrics::new(shown),
            plans: self.plans,
            name: self.name.into(),
            algorithm: self.algorithm,
            key: self.key,
            max_keys: self.max_keys,
            queue,
            concurrency,
            backend,
            item,
        })
    }
}

/// Where the quota of a key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaSource {
    /// The policy's own.
    Policy,
    /// The plan of that name.
    Plan(String),
    /// The key's own, set through the admin API.
    Override,
}

/// `"name";q=CAPACITY;w=WINDOW_SECONDS`, the window `capacity × interval` rounded up (at
/// least 1).
fn item(name: &str, quota: Quota) -> String {
    let window = quota
        .window_ns()
        .div_ceil(sluice_core::NANOS_PER_SEC)
        .max(1);
    format!("\"{name}\";q={};w={window}", quota.capacity())
}

/// The name a policy shows in headers and metrics: a plan's policy (`POLICY@PLAN`) shows its
/// policy's.
fn display_name(name: &str) -> &str {
    name.split_once('@').map_or(name, |(policy, _)| policy)
}

/// Whether `name` can name a policy: 1 to 64 of `A-Z a-z 0-9 _ - .` (it is shown in headers,
/// metrics labels and JSON without escaping).
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Kind;

    fn alg(capacity: u64, rate: &str) -> AnyAlgorithm {
        AnyAlgorithm::new(Kind::TokenBucket, Quota::parse(capacity, rate).unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn reuse_keeps_buckets_only_when_unchanged() {
        let old = Policy::builder("api", alg(2, "1/s")).build().unwrap();
        old.check("k", 2).await.unwrap();
        let same = Policy::builder("api", alg(2, "1/s"))
            .reuse(&old)
            .build()
            .unwrap();
        assert!(same.check("k", 1).await.is_err(), "state kept");
        let changed = Policy::builder("api", alg(3, "1/s"))
            .reuse(&old)
            .build()
            .unwrap();
        assert!(
            changed.check("k", 1).await.is_ok(),
            "new quota, new buckets"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn secret_keys_are_stored_hashed_and_ip_keys_as_they_are() {
        let hasher = KeyHasher::new(b"salt");
        let by_header = Policy::builder("api", alg(2, "1/s"))
            .key("header:x-api-key".parse().unwrap())
            .hash_keys(hasher.clone())
            .build()
            .unwrap();
        by_header.check("sk-live-secret", 2).await.unwrap();
        assert!(by_header.check("sk-live-secret", 1).await.is_err());
        assert!(by_header.peek("sk-live-secret").await.unwrap().remaining == 0);
        let held: Vec<String> = by_header
            .backend()
            .hottest(10)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(held, vec![hasher.hash("sk-live-secret")]);
        let by_ip = Policy::builder("api", alg(2, "1/s"))
            .key(KeySpec::Ip)
            .hash_keys(hasher)
            .build()
            .unwrap();
        by_ip.check("10.0.0.1", 1).await.unwrap();
        let held: Vec<String> = by_ip
            .backend()
            .hottest(10)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(held, vec![String::from("10.0.0.1")]);
    }

    #[test]
    fn items_and_names() {
        let p = Policy::builder("api", alg(10, "5/s")).build().unwrap();
        assert_eq!(p.policy_item(), "\"api\";q=10;w=2");
        let p = Policy::builder("slow", alg(1, "1/min")).build().unwrap();
        assert_eq!(p.policy_item(), "\"slow\";q=1;w=60");
        let p = Policy::builder("fast", alg(1, "1000/s")).build().unwrap();
        assert_eq!(p.policy_item(), "\"fast\";q=1;w=1");
        assert!(Policy::builder("a b", alg(1, "1/s")).build().is_err());
        assert!(Policy::builder("", alg(1, "1/s")).build().is_err());
        assert!(Policy::builder("a", alg(1, "1/s"))
            .concurrency(0)
            .build()
            .is_err());
    }
}
