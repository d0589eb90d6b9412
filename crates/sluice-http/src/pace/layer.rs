//! [`PaceLayer`]: the state one client shares, and what holds while the server is silent.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::HeaderMap;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower_layer::Layer;

use crate::pace::service::Pace;
use crate::pace::step::{Cost, State};

/// Reads what a request used from its answer's head.
pub(crate) type UsageFn = Arc<dyn Fn(&HeaderMap) -> Option<Cost> + Send + Sync>;

/// The pacer's state, owned here and reached by every clone of the layer and its services.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) skew_ms: Mutex<Option<i64>>,
    /// Woken by every answer: a waiting request asks the step again.
    pub(crate) news: Notify,
    epoch: Instant,
    wall: fn() -> SystemTime,
    /// The usage extractor ([`PaceLayer::usage`]).
    pub(crate) usage: Option<UsageFn>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("state", &self.state)
            .field("skew_ms", &self.skew_ms)
            .field("usage", &self.usage.is_some())
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// Ms since the layer was made, on tokio's clock (paused in tests).
    pub(crate) fn now_ms(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1000.0
    }
    pub(crate) fn wall(&self) -> SystemTime {
        (self.wall)()
    }
}

/// Paces the requests of every service it wraps as one client, from the limits the servers
/// announce. See the [module docs](crate::pace).
#[derive(Debug, Clone)]
pub struct PaceLayer {
    pub(crate) shared: Arc<Shared>,
}

impl PaceLayer {
    /// A pacer that knows nothing until the first answer (one request at a time until then).
    pub fn new() -> PaceLayer {
        PaceLayer::with_limits(&[])
    }

    /// A pacer with the limits that hold while the server says nothing: `(unit, limit,
    /// window)`, e.g. `("requests", 60, Duration::from_secs(60))`. Once the server announces a
    /// limit, these no longer apply. A zero limit or window is left out.
    pub fn with_limits(limits: &[(&str, u64, Duration)]) -> PaceLayer {
        let configured: Vec<(String, u64, f64)> = limits
            .iter()
            .filter(|(_, l, w)| *l > 0 && !w.is_zero())
            .map(|(u, l, w)| ((*u).to_owned(), *l, w.as_secs_f64() * 1000.0))
            .collect();
        PaceLayer {
            shared: Arc::new(Shared {
                state: Mutex::new(State::new(&configured, 0.0)),
                skew_ms: Mutex::new(None),
                news: Notify::new(),
                epoch: Instant::now(),
                wall: SystemTime::now,
                usage: None,
            }),
        }
    }

    /// The same pacer, reading what a request that declared a token [`Cost`] used from its
    /// answer's head: `extract(headers)` gives the use (e.g. from a header a gateway adds), or
    /// `None`, in which case the answer carries a [`Reconcile`](crate::pace::Reconcile) for
    /// the usage its body tells. The use reconciles the declared cost on the limits whose
    /// latest figure came before the request. Set it before the layer is cloned or used: a
    /// layer already shared is copied, state and all, and the copy paces apart from it.
    pub fn usage(
        self,
        extract: impl Fn(&HeaderMap) -> Option<Cost> + Send + Sync + 'static,
    ) -> PaceLayer {
        self.rebuild(|shared| Shared {
            usage: Some(Arc::new(extract)),
            ..shared
        })
    }

    /// This layer's shared state, made anew (with `change`) when it is already shared.
    fn rebuild(self, change: impl FnOnce(Shared) -> Shared) -> PaceLayer {
        let shared = Arc::try_unwrap(self.shared).unwrap_or_else(|shared| Shared {
            state: Mutex::new(shared.state.lock().clone()),
            skew_ms: Mutex::new(*shared.skew_ms.lock()),
            news: Notify::new(),
            epoch: shared.epoch,
            wall: shared.wall,
            usage: shared.usage.clone(),
        });
        PaceLayer {
            shared: Arc::new(change(shared)),
        }
    }

    /// The same pacer with another wall clock, what header times are read against (tests).
    pub fn wall_clock(self, wall: fn() -> SystemTime) -> PaceLayer {
        self.rebuild(|shared| Shared { wall, ..shared })
    }

    /// What is known of a limit (`family:name`, e.g. `ietf:api`, `openai:tokens`,
    /// `github:core`): `(remaining, time to its reset)`.
    pub fn remaining(&self, key: &str) -> Option<(Option<f64>, Option<Duration>)> {
        let now = self.shared.now_ms();
        let state = self.shared.state.lock();
        state.limits.get(key).map(|l| {
            (
                l.remaining,
                l.reset_at
                    .map(|r| Duration::from_secs_f64((r - now).max(0.0) / 1000.0)),
            )
        })
    }
}

impl Default for PaceLayer {
    fn default() -> PaceLayer {
        PaceLayer::new()
    }
}

impl<S> Layer<S> for PaceLayer {
    type Service = Pace<S>;
    fn layer(&self, inner: S) -> Pace<S> {
        Pace::new(inner, Arc::clone(&self.shared))
    }
}
