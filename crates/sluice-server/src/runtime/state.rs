//! What the listeners share: the current runtime (swapped whole on reload), the metrics
//! handle and the request-id source.

use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::runtime::build::Runtime;

/// Shared by the gateway and admin listeners.
#[derive(Debug)]
pub struct Shared {
    /// The configuration in force.
    pub runtime: ArcSwap<Runtime>,
    /// Renders `/metrics`.
    pub prometheus: PrometheusHandle,
    /// Request ids.
    pub ids: RequestIds,
    /// The built-in demo upstream, if started (a rebuilt runtime needs its address).
    pub demo: Option<std::net::SocketAddr>,
    /// Held while a new runtime is built and swapped in (a reload, a live policy change), so
    /// that two changes never build on the same runtime and one undo the other.
    pub reconfigure: tokio::sync::Mutex<()>,
    /// The span exporter of `[telemetry] otlp_endpoint`; `None` (nothing built, nothing
    /// done per request) without it.
    pub spans: Option<crate::runtime::otlp::Spans>,
    /// The job queues of `[jobs]`, read for the dashboard and `/metrics`; `None` without it.
    pub jobs: Option<crate::runtime::jobs::Jobs>,
}

impl Shared {
    /// What the listeners of one process share, starting with `runtime`; `demo` is the
    /// built-in demo upstream's address, if it runs; `spans`, the OTLP exporter, if set.
    /// The job queues are those of the runtime's `[jobs]`.
    pub fn new(
        runtime: Runtime,
        prometheus: PrometheusHandle,
        demo: Option<std::net::SocketAddr>,
        spans: Option<crate::runtime::otlp::Spans>,
    ) -> Shared {
        let jobs = runtime
            .config
            .jobs
            .clone()
            .map(crate::runtime::jobs::Jobs::new);
        Shared {
            runtime: ArcSwap::from_pointee(runtime),
            prometheus,
            ids: RequestIds,
            demo,
            reconfigure: tokio::sync::Mutex::new(()),
            spans,
            jobs,
        }
    }

    /// The runtime in force now.
    pub fn current(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }

    /// The `/metrics` text: the recorder's series, then the browser wait series it cannot
    /// hold ([`crate::browser::telemetry::render_waits`]).
    pub fn metrics_text(&self) -> String {
        let mut text = self.prometheus.render();
        crate::browser::telemetry::render_waits(&mut text);
        text
    }
}

/// Request ids: 16 hex digits, from a per-thread counter that starts at a random point (no
/// shared atomic on the request path).
#[derive(Debug, Default)]
pub struct RequestIds;

thread_local! {
    static NEXT_ID: std::cell::Cell<u64> = std::cell::Cell::new(random_start());
}

impl RequestIds {
    /// A new id.
    pub fn next(&self) -> http::HeaderValue {
        let word = NEXT_ID.with(|n| {
            let v = n.get();
            n.set(v.wrapping_add(1));
            v
        });
        let mut hex = [0u8; 16];
        for (i, b) in hex.iter_mut().enumerate() {
            *b = b"0123456789abcdef"[((word >> (60 - 4 * i)) & 0xf) as usize];
        }
        http::HeaderValue::from_bytes(&hex).unwrap_or(http::HeaderValue::from_static("0"))
    }
}

fn random_start() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    // The counter's low bits move; keep them clear so ids of one thread stay apart.
    h.finish() & !0xff_ffff
}
