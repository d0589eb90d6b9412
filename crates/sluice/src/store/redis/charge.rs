//! A charge on Redis: a cost learnt after the request ran, taken whatever the key has left
//! (the scripts' charge mode, `ARGV[4] = 'c'`), from this gateway's slice of a leased key
//! first. Beside the decisions of `store.rs`, through the same round trip.

use sluice_core::Algorithm;

use crate::clock::Clock;
use crate::store::redis::script::Program;
use crate::store::redis::store::{Fallback, Inner};

impl Inner {
    /// Takes `cost` for `key` whatever is left (see [`Store::charge`](crate::store::Store::charge)): from the slice this
    /// gateway holds on the key first, the rest in Redis (or in the local store while Redis is
    /// down and the local store answers for it). Returns what was forgiven.
    pub(crate) async fn charge(&self, key: &str, cost: u64) -> u64 {
        if cost == 0 {
            return 0;
        }
        let settings = self.settings();
        // A key with a quota of its own is charged under its own stamp.
        let own = self.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        // More than the capacity can never be taken: the rest is forgiven whatever the state.
        let capacity = program.algorithm().quota().capacity();
        let over = cost.saturating_sub(capacity);
        let mut cost = cost - over;
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
            return over;
        }
        if !self.health.is_up() {
            return over
                + match &settings.fallback {
                    Fallback::Local(local) => local.keyed().charge(key, cost),
                    _ => cost,
                };
        }
        let now = self.clock.now_ns();
        let cmd = program.charge_command(&self.config.prefix, key, cost, None);
        match self
            .round_trip(program.script(), &cmd, now, true, Program::charged)
            .await
        {
            Ok(taken) => over + cost.saturating_sub(taken),
            Err(_) => over + cost,
        }
    }
}
