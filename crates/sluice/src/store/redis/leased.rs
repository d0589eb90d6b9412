//! The store's side of leases: taking, spending and giving back slices of a key's bucket
//! (the protocol is in `lease.rs` and `lua/gcra_state.lua`).
//!
//! Owns the leased decision ([`Inner::check_leased`]), the sweeper and the giving back. It goes
//! to Redis only through the store's round trip (timeout, `on_error`, the replicas' wait).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Algorithm, Decision};

use crate::clock::Clock;
use crate::error::Error;
use crate::store::redis::config::RedisStoreError;
use crate::store::redis::lease::{Leases, Slice};
use crate::store::redis::script::Program;
use crate::store::redis::store::{limited, nanos, Inner, RedisStore, Settings};
use crate::store::Origin;

/// The most give-backs in one pipeline: each pipeline is one round trip under the store's
/// timeout, which a pipeline of every key a busy gateway holds could outlast (Redis runs a
/// few hundred thousand lease scripts a second), marking Redis down at the gateway's stop.
const GIVE_BACK_BATCH: usize = 1024;

impl RedisStore {
    /// Gives back the slices past their deadline every lease `ttl`, while the store lives.
    pub(crate) fn sweep_leases(&self) {
        let Some(leases) = &self.inner.leases else {
            return;
        };
        let every = leases.config.ttl.max(Duration::from_millis(10));
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = inner.upgrade() else { return };
                inner.give_back(false).await;
            }
        });
    }

    /// Gives back every slice this process holds (what was not spent is free again for the
    /// other gateways at once); call it when the gateway stops. The store stays usable.
    pub async fn give_back_leases(&self) {
        self.inner.give_back(true).await;
    }
}

impl Inner {
    /// Gives back the slices past their deadline (with `all`, every slice held) to Redis in
    /// pipelines of [`GIVE_BACK_BATCH`]: one round trip for up to that many keys (the gateway
    /// stopping, or a batch of slices past their deadline at a sweep).
    pub(crate) async fn give_back(&self, all: bool) {
        let Some(leases) = &self.leases else { return };
        let due = leases.due(tokio::time::Instant::now(), all);
        if due.is_empty() {
            return;
        }
        let settings = self.settings();
        // Every program's lease script is the same script (one text, one hash): the pipeline
        // loads it once if Redis lacks it.
        let Some(script) = settings.program.lease_script() else {
            return;
        };
        let mut cmds = Vec::with_capacity(due.len());
        let mut unspent_of = Vec::with_capacity(due.len());
        for (key, generation, spent, unspent) in due {
            // Under the stamp the slice was taken under: the key's own quota, if it has one.
            let own = self.overrides.program(&key);
            let program = own.as_deref().unwrap_or(&settings.program);
            let id = leases.slice_id(generation);
            let Some(cmd) = program.lease_command(
                &self.config.prefix,
                &key,
                (&id, None),
                Some(spent),
                (0, 0),
                0,
                None,
            ) else {
                continue;
            };
            if unspent > 0 {
                leases.metrics.expired.increment(1);
                leases.metrics.unspent.increment(unspent);
            } else {
                leases.metrics.returned.increment(1);
            }
            cmds.push(cmd);
            unspent_of.push(unspent);
        }
        if cmds.is_empty() {
            return;
        }
        // Unanswered: Redis settles each lease when it expires, as all spent.
        for (cmds, unspent_of) in cmds
            .chunks(GIVE_BACK_BATCH)
            .zip(unspent_of.chunks(GIVE_BACK_BATCH))
        {
            let now = self.clock.now_ns();
            if let Ok(answers) = self
                .round_trip_many(script, cmds, now, Program::granted)
                .await
            {
                for (granted, &unspent) in answers.into_iter().zip(unspent_of) {
                    if !granted.found {
                        leases.metrics.lost.increment(unspent);
                    }
                }
            }
        }
    }

    /// [`Inner::check`] of a positive cost on a leased key: from this process's slice while
    /// it lasts, then one round trip that gives the slice back and takes the next.
    pub(crate) async fn check_leased(
        &self,
        leases: &Leases,
        settings: &Arc<Settings>,
        key: &str,
        cost: u64,
        now: u64,
    ) -> Result<(Decision, Origin), Error> {
        // A key with a quota of its own takes its slices on that quota, under its own stamp,
        // as its checks, charges and refunds do.
        let own = self.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let limit = program.algorithm().quota().capacity();
        let entry = leases.entry(key);
        let spent = |slice: &mut Slice| {
            let left = slice.spend(cost, tokio::time::Instant::now())?;
            leases.metrics.local.increment(1);
            Some(Decision {
                allowed: true,
                limit,
                remaining: left.saturating_add(slice.free).min(limit),
                retry_after_ns: 0,
                reset_after_ns: 0,
            })
        };
        if let Some(decision) = spent(&mut entry.slice.lock()) {
            return Ok((decision, Origin::Store));
        }
        if let Some(decision) = self.denials.get(key, cost, now) {
            self.metrics.cached_denials.increment(1);
            return Err(limited(decision));
        }
        // One renewal at a time per key: the others wait for it and spend its slice.
        let _renewing = entry.renewing.lock().await;
        if let Some(decision) = spent(&mut entry.slice.lock()) {
            return Ok((decision, Origin::Store));
        }
        // The renewal this request waited for may have been denied.
        let now = self.clock.now_ns();
        if let Some(decision) = self.denials.get(key, cost, now) {
            self.metrics.cached_denials.increment(1);
            return Err(limited(decision));
        }
        let max = leases.config.max.tokens(limit);
        let (give_back, want, held, unspent) = {
            let mut slice = entry.slice.lock();
            let (give_back, want) =
                slice.renewal(tokio::time::Instant::now(), leases.config.min, max, cost);
            (give_back, want, slice.generation, slice.left)
        };
        // The slice given back is named by its generation, the next by a new one: a give-back
        // of an earlier slice still in flight settles that slice alone.
        let next = leases.next_generation();
        let (old_id, new_id) = (leases.slice_id(held), leases.slice_id(next));
        let ids = match give_back {
            Some(_) => (old_id.as_str(), Some(new_id.as_str())),
            None => (new_id.as_str(), None),
        };
        let Some(script) = program.lease_script() else {
            // Never: a leasing store refuses an algorithm without leases (build, reconfigure).
            return Err(Error::Unavailable {
                retry_after: self.config.retry_interval,
            });
        };
        let ttl_ns = nanos(leases.config.ttl);
        // A whole slice or none: a key kept at its limit takes its refill a slice at a time
        // (each denial meanwhile answered from the cache) rather than token by token.
        let at_least = want;
        let Some(cmd) = program.lease_command(
            &self.config.prefix,
            key,
            ids,
            give_back,
            (want, at_least),
            ttl_ns,
            None,
        ) else {
            return Err(Error::Unavailable {
                retry_after: self.config.retry_interval,
            });
        };
        let sent = tokio::time::Instant::now();
        // Taking a slice is an admission: with replicas it counts once they have it (see
        // `link`), so that a failover never forgets a slice being spent.
        match self
            .round_trip(script, &cmd, now, want > 0, Program::granted)
            .await
        {
            Ok(granted) => {
                if give_back.is_some() {
                    leases.metrics.returned.increment(1);
                    if !granted.found {
                        leases.metrics.lost.increment(unspent);
                    }
                }
                let mut slice = entry.slice.lock();
                slice.generation = next;
                slice.granted = granted.granted;
                slice.left = granted.granted;
                slice.free = granted.free;
                slice.deadline = leases.config.deadline(sent);
                if granted.granted > 0 {
                    leases.metrics.taken.increment(1);
                }
                if let Some(decision) = spent(&mut slice) {
                    return Ok((decision, Origin::Store));
                }
                drop(slice);
                let decision = Decision {
                    allowed: false,
                    limit,
                    remaining: granted.free.saturating_add(granted.granted),
                    retry_after_ns: granted.retry_after_ns.max(1),
                    reset_after_ns: granted.reset_after_ns,
                };
                // As in `check`: a denial under the settings in use now only. Leases given back
                // later may free tokens before its retry time: the cache then denies a little
                // longer than Redis would, never less long.
                let current = self.current.read();
                if granted.granted == 0 && Arc::ptr_eq(&current, settings) {
                    self.denials.insert(key, cost, now, decision);
                }
                drop(current);
                Err(limited(decision))
            }
            Err(unanswered) => {
                // Whether the slice given back was settled is unknown: it is not spent here
                // again, and Redis settles it at its expiry if it was not.
                entry.slice.lock().clear();
                self.fallback(settings, key, cost, unanswered)
            }
        }
    }
}

pub(crate) fn leases_unsupported(kind: sluice_core::Kind) -> RedisStoreError {
    RedisStoreError::Unsupported {
        algorithm: kind,
        reason: String::from(
            "leases slice a bucket, which the window algorithms do not keep; use gcra, token_bucket or leaky_bucket, or no lease",
        ),
    }
}
