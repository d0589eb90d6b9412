//! Building a [`Limiter`].

use std::sync::Arc;
use std::time::Duration;

use sluice_core::queue::{QueueConfig, WaitQueue};

use crate::cell::{LocalAlgorithm, StateCell};
use crate::clock::{Clock, TokioClock};
use crate::limiter::handle::{Inner, Limiter, Shared};
use crate::metrics::LimiterMetrics;

/// Configures a [`Limiter`]. Start from [`Limiter::builder`].
#[derive(Debug, Clone)]
pub struct Builder<A, C = TokioClock> {
    algorithm: A,
    clock: C,
    queue: QueueConfig,
    name: String,
}

pub(crate) fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl<A: LocalAlgorithm> Builder<A, TokioClock> {
    pub(crate) fn new(algorithm: A) -> Builder<A, TokioClock> {
        Builder {
            algorithm,
            clock: TokioClock::new(),
            queue: QueueConfig {
                depth: usize::MAX,
                max_wait_ns: u64::MAX,
            },
            name: String::from("default"),
        }
    }
}

impl<A: LocalAlgorithm, C: Clock> Builder<A, C> {
    /// At most `depth` waiters, each waiting at most `max_wait`. A depth of zero means no
    /// queue: `acquire` then answers at once, like `try_acquire`.
    pub fn queue(mut self, depth: usize, max_wait: Duration) -> Self {
        self.queue = QueueConfig {
            depth,
            max_wait_ns: duration_ns(max_wait),
        };
        self
    }

    pub(crate) fn queue_config(mut self, queue: QueueConfig) -> Self {
        self.queue = queue;
        self
    }

    /// No queue: `acquire` denies at once what `try_acquire` would.
    pub fn no_queue(mut self) -> Self {
        self.queue = QueueConfig::NONE;
        self
    }

    /// The `limiter` label of this limiter's metrics.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Reads time from `clock` instead of tokio's.
    pub fn clock<C2: Clock>(self, clock: C2) -> Builder<A, C2> {
        Builder {
            algorithm: self.algorithm,
            clock,
            queue: self.queue,
            name: self.name,
        }
    }

    /// The limiter, full (every algorithm starts able to admit its capacity).
    pub fn build(self) -> Limiter<A, C> {
        let state = self.algorithm.initial_state();
        self.build_with_state(state)
    }

    /// The limiter, starting from `state` (for example one restored from a snapshot).
    pub fn build_with_state(self, state: A::State) -> Limiter<A, C> {
        let cell = self.algorithm.cell(state);
        self.build_with_cell(cell)
    }

    /// The limiter over a state that lives elsewhere (a keyed map's entry).
    pub(crate) fn build_with_cell<X: StateCell<A>>(self, cell: X) -> Limiter<A, C, X> {
        let metrics = LimiterMetrics::new(&self.name);
        self.build_with_cell_and_metrics(cell, metrics)
    }

    /// The limiter over a state that lives elsewhere, reporting through `metrics` (a keyed
    /// limiter's handles, shared by the queues of its keys).
    pub(crate) fn build_with_cell_and_metrics<X: StateCell<A>>(
        self,
        cell: X,
        metrics: LimiterMetrics,
    ) -> Limiter<A, C, X> {
        Limiter {
            shared: Arc::new(Shared {
                metrics,
                name: self.name,
                algorithm: self.algorithm,
                clock: self.clock,
                cell: crate::cell::CachePadded(cell),
                waiting: Default::default(),
                closed: Default::default(),
                inner: parking_lot::Mutex::new(Inner {
                    queue: WaitQueue::with_payload(self.queue),
                    done: Default::default(),
                    driver: false,
                    scheduled: u64::MAX,
                }),
                notify: tokio::sync::Notify::new(),
            }),
        }
    }
}
