//! Configuring a [`Keyed`] limiter.

use std::time::Duration;

use sluice_core::queue::QueueConfig;

use crate::cell::LocalAlgorithm;
use crate::clock::{Clock, TokioClock};
use crate::keyed::map::Keyed;
use crate::limiter::builder_duration_ns;

/// Configures a [`Keyed`]. Start from [`Keyed::builder`].
#[derive(Debug, Clone)]
pub struct KeyedBuilder<A, C = TokioClock> {
    pub(crate) algorithm: A,
    pub(crate) clock: C,
    pub(crate) max_keys: usize,
    pub(crate) queue: QueueConfig,
    pub(crate) name: String,
}

/// The queue limits of `depth` waiters per key, each waiting at most `max_wait` (no queue at
/// depth 0).
pub(crate) fn queue_limits(depth: usize, max_wait: Duration) -> QueueConfig {
    if depth == 0 {
        return QueueConfig::NONE;
    }
    QueueConfig {
        depth,
        max_wait_ns: builder_duration_ns(max_wait),
    }
}

/// The default cap on keys.
pub const DEFAULT_MAX_KEYS: usize = 100_000;

impl<A: LocalAlgorithm> KeyedBuilder<A, TokioClock> {
    pub(crate) fn new(algorithm: A) -> Self {
        KeyedBuilder {
            algorithm,
            clock: TokioClock::new(),
            max_keys: DEFAULT_MAX_KEYS,
            queue: QueueConfig::NONE,
            name: String::from("default"),
        }
    }
}

impl<A: LocalAlgorithm, C: Clock + Clone> KeyedBuilder<A, C> {
    /// The most keys held at once (at least 1; default 100,000). The table is reserved for
    /// this many up front, so memory does not grow under a flood of new keys.
    ///
    /// At the cap, idle keys (full again) make room first. When none is idle, the busy key
    /// nearest to idle is evicted and remembered until it would be idle, so it comes back no
    /// fuller than it left; under a flood of such evictions new keys may be limited until
    /// then too. Keys with waiters are never evicted (the cap is exceeded by at most their
    /// number when every other key has gone).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys.max(1);
        self
    }

    /// Each key may have up to `depth` waiters, each waiting at most `max_wait`. Without this,
    /// or with a depth of 0, `acquire` denies at once.
    pub fn queue(mut self, depth: usize, max_wait: Duration) -> Self {
        self.queue = queue_limits(depth, max_wait);
        self
    }

    /// The `limiter` label of the metrics.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Reads time from `clock`.
    pub fn clock<C2: Clock + Clone>(self, clock: C2) -> KeyedBuilder<A, C2> {
        KeyedBuilder {
            algorithm: self.algorithm,
            clock,
            max_keys: self.max_keys,
            queue: self.queue,
            name: self.name,
        }
    }

    /// The keyed limiter.
    pub fn build<K>(self) -> Keyed<K, A, C>
    where
        K: crate::keyed::map::Key,
    {
        Keyed::from_builder(self)
    }
}
