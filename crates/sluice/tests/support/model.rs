//! What the model-based ownership tests share (`tests/ownership.rs`, `tests/overrides_model.rs`):
//! the bucket kinds they draw, the waiters they spawn, the admissions those record, and the
//! paused runtime they run on. Each test keeps its own model of what a key may hold.

use std::sync::Arc;

use parking_lot::Mutex;
use proptest::prelude::*;
use sluice::store::Store;
use sluice::AcquireOptions;
use sluice_core::Kind;

/// The admissions waiters recorded: (key index, cost, when).
pub type Admissions = Arc<Mutex<Vec<(usize, u64, tokio::time::Instant)>>>;

/// A model that takes admissions, in time order.
pub trait Admits {
    /// `cost` admitted for key `key` at `t` (ns since the start); `context` names the step.
    fn admit(&mut self, key: usize, cost: u64, t: u64, context: &str);
}

/// The bucket algorithms (they convert into one another).
pub fn bucket_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Gcra),
        Just(Kind::TokenBucket),
        Just(Kind::LeakyBucket)
    ]
}

/// A task that waits in `store`'s queue for `cost` of `keys[key]` and records its admission.
pub fn wait_on<S: Store + 'static>(
    store: S,
    keys: &'static [&'static str],
    key: usize,
    cost: u64,
    admitted: Admissions,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let r = store
            .acquire(keys[key], cost, AcquireOptions::default())
            .await;
        if r.is_ok() {
            admitted
                .lock()
                .push((key, cost, tokio::time::Instant::now()));
        }
    })
}

/// Applies the recorded admissions to `model`, in time order.
pub fn drain(
    admissions: &Admissions,
    model: &mut impl Admits,
    since: &impl Fn(tokio::time::Instant) -> u64,
    context: &str,
) {
    let mut seen = std::mem::take(&mut *admissions.lock());
    seen.sort_by_key(|&(_, _, t)| t);
    for (key, cost, t) in seen {
        model.admit(key, cost, since(t), context);
    }
}

/// A current-thread runtime on paused time.
pub fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}
