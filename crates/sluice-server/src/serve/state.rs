//! What the listeners share: the current runtime (swapped whole on reload), the metrics
//! handle and the request-id source.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::serve::build::Runtime;

/// Shared by the gateway and admin listeners.
#[derive(Debug)]
pub struct Shared {
    /// The configuration in force.
    pub runtime: ArcSwap<Runtime>,
    /// Renders `/metrics`.
    pub prometheus: PrometheusHandle,
    /// Request ids.
    pub ids: RequestIds,
}

impl Shared {
    /// The runtime in force now.
    pub fn current(&self) -> Arc<Runtime> {
        self.runtime.load_full()
    }
}

/// Request ids: a per-process random prefix and a counter, 16 hex digits.
#[derive(Debug)]
pub struct RequestIds {
    prefix: u32,
    next: AtomicU64,
}

impl Default for RequestIds {
    fn default() -> RequestIds {
        RequestIds {
            prefix: rand_prefix(),
            next: AtomicU64::new(1),
        }
    }
}

impl RequestIds {
    /// A new id.
    pub fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{:08x}{:08x}", self.prefix, n & 0xffff_ffff)
    }
}

fn rand_prefix() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish() as u32
}
