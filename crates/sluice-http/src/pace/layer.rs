//! [`PaceLayer`]: the state one client shares, and what holds while the server is silent.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::time::Instant;
use tower_layer::Layer;

use crate::pace::service::Pace;
use crate::pace::step::State;

/// The pacer's state, owned here and reached by every clone of the layer and its services.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) skew_ms: Mutex<Option<i64>>,
    /// Woken by every answer: a waiting request asks the step again.
    pub(crate) news: Notify,
    epoch: Instant,
    wall: fn() -> SystemTime,
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
            }),
        }
    }

    /// The same pacer with another wall clock, what header times are read against (tests).
    pub fn wall_clock(self, wall: fn() -> SystemTime) -> PaceLayer {
        let shared = Arc::try_unwrap(self.shared).unwrap_or_else(|shared| Shared {
            state: Mutex::new(shared.state.lock().clone()),
            skew_ms: Mutex::new(*shared.skew_ms.lock()),
            news: Notify::new(),
            epoch: shared.epoch,
            wall: shared.wall,
        });
        PaceLayer {
            shared: Arc::new(Shared { wall, ..shared }),
        }
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
