//! Decisions at a time the caller names, bypassing the denial cache and the failure policy:
//! for conformance tests and replays, which drive the scripts on their own clock. Each runs
//! under the key's own quota if it has one, as the store's own decisions do.

use std::time::Duration;

use sluice_core::Decision;

use crate::error::Error;
use crate::store::redis::script::Program;
use crate::store::redis::store::{ensure_cost, nanos, RedisStore};

impl RedisStore {
    /// Gives back `cost` admitted `ago` for `key` as if Redis's clock read `unix_ns` (see
    /// [`RedisStore::check_at`], and the same warning).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] if Redis does not answer.
    pub async fn refund_at(
        &self,
        key: &str,
        cost: u64,
        ago: Duration,
        unix_ns: u64,
    ) -> Result<(), Error> {
        let inner = &*self.inner;
        let settings = inner.settings();
        let own = inner.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let cmd =
            program.refund_command(&inner.config.prefix, key, cost, nanos(ago), Some(unix_ns));
        inner
            .run_direct(program.script(), &cmd, false)
            .await
            .map(drop)
    }

    /// Takes `cost` for `key`, down to `max_debt` tokens beyond empty, as if Redis's clock
    /// read `unix_ns` (see
    /// [`Store::charge`](crate::store::Store::charge), and the warning of
    /// [`RedisStore::check_at`]). Returns what was forgiven.
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] if Redis does not answer.
    pub async fn charge_at(
        &self,
        key: &str,
        cost: u64,
        max_debt: u64,
        unix_ns: u64,
    ) -> Result<u64, Error> {
        let inner = &*self.inner;
        let settings = inner.settings();
        let own = inner.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let cmd = program.charge_command(&inner.config.prefix, key, cost, max_debt, Some(unix_ns));
        let reply = inner.run_direct(program.script(), &cmd, cost > 0).await?;
        let taken = Program::charged(&reply).ok_or(Error::Unavailable {
            retry_after: inner.config.retry_interval,
        })?;
        Ok(cost.saturating_sub(taken))
    }

    /// Decides `cost` for `key` as if Redis's clock read `unix_ns`, bypassing the denial
    /// cache and the failure policy: for conformance tests and replays. Never use it on keys
    /// that live traffic uses, whose state is kept on Redis's own clock.
    ///
    /// # Errors
    ///
    /// [`Error::InsufficientCapacity`], and [`Error::Unavailable`] if Redis does not answer.
    pub async fn check_at(&self, key: &str, cost: u64, unix_ns: u64) -> Result<Decision, Error> {
        let inner = &*self.inner;
        let settings = inner.settings();
        ensure_cost(&settings, cost)?;
        let own = inner.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let cmd = program.command(&inner.config.prefix, key, cost, Some(unix_ns));
        let reply = inner.run_direct(program.script(), &cmd, cost > 0).await?;
        program.decision(&reply).ok_or(Error::Unavailable {
            retry_after: inner.config.retry_interval,
        })
    }

    /// Runs the lease script for `key` as if Redis's clock read `unix_ns`: gives back the
    /// lease named `id` (having spent `spent` of it; `None`: nothing to give back) and takes
    /// up to `want` tokens for `ttl`, as a lease named `new_id` (else `id`). Returns the tokens granted and those free after. For tests of
    /// the lease protocol, like [`RedisStore::check_at`] (and with the same warning); a
    /// store's own leases go through [`Store::check`](crate::store::Store::check).
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`] if Redis does not answer or the algorithm has no leases.
    pub async fn lease_at(
        &self,
        key: &str,
        (id, new_id): (&str, Option<&str>),
        spent: Option<u64>,
        want: u64,
        ttl: Duration,
        unix_ns: u64,
    ) -> Result<(u64, u64), Error> {
        let inner = &*self.inner;
        let settings = inner.settings();
        let own = inner.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let unavailable = Error::Unavailable {
            retry_after: inner.config.retry_interval,
        };
        let (Some(script), Some(cmd)) = (
            program.lease_script(),
            program.lease_command(
                &inner.config.prefix,
                key,
                (id, new_id),
                spent,
                (want, 1),
                nanos(ttl),
                Some(unix_ns),
            ),
        ) else {
            return Err(unavailable);
        };
        let reply = inner.run_direct(script, &cmd, want > 0).await?;
        let granted = Program::granted(&reply).ok_or(unavailable)?;
        Ok((granted.granted, granted.free))
    }
}
