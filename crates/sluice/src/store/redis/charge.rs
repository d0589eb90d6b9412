//! A charge on Redis: a cost learnt after the request ran, taken without asking (the scripts'
//! charge mode, `ARGV[4] = 'c'`: a bucket goes into debt, down to `ARGV[5]`), from this
//! gateway's slice of a leased key first. Beside the decisions of `store.rs`, through the
//! same round trip.

use crate::clock::Clock;
use crate::store::redis::script::Program;
use crate::store::redis::store::{Fallback, Inner};
use crate::store::Origin;

impl Inner {
    /// Takes `cost` for `key` without asking (see
    /// [`Store::charge`](crate::store::Store::charge)) where its admission was granted: from
    /// the slice this gateway holds on the key first, the rest in Redis; or in the local store
    /// that answered while Redis did not. Never in the other one. What cannot reach the store
    /// that granted it is counted and reported forgiven. Returns what was forgiven.
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
        // A key with a quota of its own is charged under its own stamp.
        let own = self.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
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
        if !self.health.is_up() {
            self.metrics.unsettled.increment(cost);
            return cost;
        }
        let now = self.clock.now_ns();
        let cmd = program.charge_command(&self.config.prefix, key, cost, max_debt, None);
        match self
            .round_trip(program.script(), &cmd, now, true, Program::charged)
            .await
        {
            Ok(taken) => cost.saturating_sub(taken),
            Err(_) => {
                self.metrics.unsettled.increment(cost);
                cost
            }
        }
    }
}
