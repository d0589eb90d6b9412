//! What changes a key after its decision, on Redis: a refund (the request never ran) and a
//! charge (a cost learnt after the request ran, taken without asking: the scripts' charge
//! mode, `ARGV[4] = 'c'`, a bucket going into debt down to `ARGV[5]`), each where the admission
//! was granted (Redis, a slice of a leased key, or the local store of `on_error = local`), and
//! kept for Redis while it does not answer (`deferred`). Beside the decisions of `store.rs`,
//! through the same round trip.

use std::time::Duration;

use crate::clock::Clock;
use crate::store::redis::deferred::Change;
use crate::store::redis::script::Program;
use crate::store::redis::store::{nanos, Fallback, Inner};
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

    /// Gives back `cost` admitted `ago` for `key` where it was granted: in Redis (or the slice
    /// it most likely came from), or in the local store that answered while Redis did not.
    /// Never in the other one: a refund there would give a key tokens it never spent. Redis
    /// not answering, a refund of its admission waits for it (see `deferred`).
    pub(crate) async fn refund_to(&self, origin: Origin, key: &str, cost: u64, ago: Duration) {
        if cost == 0 {
            return;
        }
        let settings = self.settings();
        match origin {
            Origin::Nowhere => return,
            Origin::Fallback => {
                match &settings.fallback {
                    Fallback::Local(local) => local.keyed().refund(key, cost, ago),
                    _ => self.metrics.unsettled.increment(cost),
                }
                return;
            }
            Origin::Store => {}
        }
        if let Some(leases) = &self.leases {
            // Back into the slice it most likely came from, while that is still held.
            let entry = leases.entry(key);
            let mut slice = entry.slice.lock();
            if slice.granted > 0 && tokio::time::Instant::now() < slice.deadline {
                slice.left = (slice.left + cost).min(slice.granted);
                return;
            }
        }
        self.settle_deferred().await;
        let admitted = tokio::time::Instant::now()
            .checked_sub(ago)
            .unwrap_or_else(tokio::time::Instant::now);
        self.send(key, Change::Refund { cost, admitted }).await;
    }

    /// Sends `change` to Redis, or keeps it for when Redis answers again if it cannot be sent
    /// now. Returns what a charge forgave (0 for a refund, and for a change kept). A change
    /// sent whose reply was lost is counted as unsettled, never sent again: it may have been
    /// applied.
    pub(crate) async fn send(&self, key: &str, change: Change) -> u64 {
        if !self.health.is_up() {
            if !self.deferred.keep(key, change) {
                self.metrics.unsettled.increment(change.cost());
                return change.cost();
            }
            self.flush_when_redis_answers();
            return 0;
        }
        let settings = self.settings();
        let own = self.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let now = self.clock.now_ns();
        let sent = match change {
            Change::Refund { cost, admitted } => {
                let ago = nanos(admitted.elapsed());
                let cmd = program.refund_command(&self.config.prefix, key, cost, ago, None);
                self.round_trip(program.script(), &cmd, now, false, |reply| {
                    matches!(reply, redis::Value::Array(_)).then_some(0)
                })
                .await
            }
            Change::Charge { cost, max_debt } => {
                let cmd = program.charge_command(&self.config.prefix, key, cost, max_debt, None);
                self.round_trip(program.script(), &cmd, now, true, Program::charged)
                    .await
                    .map(|taken| cost.saturating_sub(taken))
            }
        };
        sent.unwrap_or_else(|_| {
            self.metrics.unsettled.increment(change.cost());
            change.cost()
        })
    }

    /// Sends the settlements kept while Redis did not answer, once it does: before this
    /// process's next decision, refund or charge on Redis (which, when Redis is due a probe,
    /// probes it first, so that the decision that finds Redis back is made after them), or
    /// from the task `flush_when_redis_answers` started, when no decision comes.
    pub(crate) async fn settle_deferred(&self) {
        if !self.deferred.any() || !self.answers().await {
            return;
        }
        for (key, change) in self.deferred.take() {
            self.send(&key, change).await;
        }
    }

    /// Starts, unless one runs, a task that sends the kept settlements once Redis answers,
    /// probing it every retry interval: a gateway that takes no more decisions on this store
    /// still pays what its keys owe. The task holds the store weakly, and ends with it.
    fn flush_when_redis_answers(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if !self.deferred.start_flusher() {
            return;
        }
        let me = self.me.clone();
        let every = self.config.retry_interval;
        runtime.spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = me.upgrade() else {
                    return;
                };
                inner.settle_deferred().await;
                if !inner.deferred.any() {
                    inner.deferred.stop_flusher();
                    // A change kept after the check above started no task: look once more.
                    if !inner.deferred.any() || !inner.deferred.start_flusher() {
                        return;
                    }
                }
            }
        });
    }
}
