//! A charge on Redis: a cost learnt after the request ran, taken without asking (the scripts'
//! charge mode, `ARGV[4] = 'c'`: a bucket goes into debt, down to `ARGV[5]`), from this
//! gateway's slice of a leased key first. Beside the decisions of `store.rs`, through the
//! same round trip.

use crate::store::redis::deferred::Change;
use crate::store::redis::store::{Fallback, Inner};
use crate::store::Origin;

impl Inner {
    /// Takes `cost` for `key` without asking (see
    /// [`Store::charge`](crate::store::Store::charge)) where its admission was granted: from
    /// the slice this gateway holds on the key first, the rest in Redis; or in the local store
    /// that answered while Redis did not. Never in the other one. While Redis does not answer,
    /// a charge of its admission waits for it (see `deferred`). Returns what was forgiven.
    pub(crate) async fn charge_to(
        &self,
        origin: Origin,
        key: &str,
        mut cost: u64,
        max_debt: u64,
    ) -> u64 {
        if cost == 0 {
            return 0;
        }
        let settings = self.settings();
        match origin {
            Origin::Nowhere => return cost,
            Origin::Fallback => {
                return match &settings.fallback {
                    Fallback::Local(local) => local.keyed().charge(key, cost, max_debt),
                    _ => {
                        self.metrics.unsettled.increment(cost);
                        cost
                    }
                };
            }
            Origin::Store => {}
        }
        if let Some(leases) = &self.leases {
            // Spent from the slice like an admission: debited when the slice is given back.
            let entry = leases.entry(key);
            let mut slice = entry.slice.lock();
            if slice.left > 0 && tokio::time::Instant::now() < slice.deadline {
                let take = cost.min(slice.left);
                slice.left -= take;
                cost -= take;
            }
        }
        if cost == 0 {
            return 0;
        }
        self.settle_deferred().await;
        self.send(key, Change::Charge { cost, max_debt }).await
    }
}
