//! The main listener's client connections, counted against `server.max_connections` across
//! every worker. When every place is taken, the connection that has been idle the longest (no
//! request in flight, no request head begun, no tunnel, not closing already) is asked to
//! close gracefully and the new one takes its place, as nginx reuses its idle keep-alive
//! connections when it runs out of them: clients that leave their connections idle (an
//! HTTP/2 client that cancelled its streams and answers only pings) cannot keep new ones out
//! until `keep_alive_timeout`. With none idle, the new connection is refused.
//!
//! Each open connection's [`Exchange`] is listed here (weakly) by its [`Counted`] place, which
//! takes it off the list when dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::conn::Exchange;

/// Open client connections on the main listener, across every worker.
static OPEN: AtomicUsize = AtomicUsize::new(0);

/// The open connections' exchanges, by the number of their place.
static LISTED: Mutex<Option<HashMap<u64, Weak<Exchange>>>> = Mutex::new(None);

/// The number of the next place.
static NEXT: AtomicU64 = AtomicU64::new(0);

fn listed<T>(f: impl FnOnce(&mut HashMap<u64, Weak<Exchange>>) -> T) -> T {
    let mut guard = LISTED.lock().unwrap_or_else(PoisonError::into_inner);
    f(guard.get_or_insert_with(HashMap::new))
}

/// One open client connection's place, counted in `sluice_connections_open` until it is
/// dropped (when its connection task ends, for whatever reason).
pub(super) struct Counted {
    open: metrics::Gauge,
    id: u64,
}

impl Counted {
    /// A place for the connection of `exchange`: one of `max`, or the place of the longest
    /// idle connection, which is asked to close (counted in
    /// `sluice_connections_closed_early_total{reason="reclaimed"}`); `None` when every place
    /// is taken by a busy connection.
    pub(super) fn admit(
        max: usize,
        open: &metrics::Gauge,
        exchange: &Arc<Exchange>,
    ) -> Option<Counted> {
        if OPEN.fetch_add(1, Ordering::Relaxed) >= max && !reclaim_one() {
            OPEN.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // A reclaimed place is taken at once: the count stands above `max` until the
        // connection that gave it up has closed, which an idle one does as soon as its task
        // next runs.
        open.increment(1.0);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        listed(|l| l.insert(id, Arc::downgrade(exchange)));
        Some(Counted {
            open: open.clone(),
            id,
        })
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        listed(|l| l.remove(&self.id));
        OPEN.fetch_sub(1, Ordering::Relaxed);
        self.open.decrement(1.0);
    }
}

/// Asks the connection idle the longest to close; whether there was one.
fn reclaim_one() -> bool {
    let oldest = listed(|l| {
        l.values()
            .filter_map(Weak::upgrade)
            .filter_map(|e| e.idle_since_if_reclaimable().map(|since| (since, e)))
            .min_by_key(|(since, _)| *since)
            .map(|(_, e)| e)
    });
    match oldest {
        Some(exchange) => {
            exchange.reclaim();
            true
        }
        None => false,
    }
}
