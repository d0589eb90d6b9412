//! [`RedisStore`]: the [`Store`] over Redis.
//!
//! One file, past 700 lines: the store's shared state (`Inner`), its construction and the one
//! round trip every decision, probe and settlement goes through belong together; the
//! settlements (`settle.rs`), leases (`leased.rs`), overrides and queues already live beside it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::RwLock;
use sluice_core::{Algorithm, AnyAlgorithm, Decision};

use crate::clock::{Clock, TokioClock};
use crate::error::Error;
use crate::limiter::AcquireOptions;
use crate::store::redis::cache::DenialCache;
use crate::store::redis::config::{OnError, RedisConfig, RedisStoreError};
use crate::store::redis::deferred::Deferred;
use crate::store::redis::lease::Leases;
use crate::store::redis::leased::leases_unsupported;
use crate::store::redis::link::{self, Conn, Gate, Health};
use crate::store::redis::queue::Queues;
use crate::store::redis::script::Program;
use crate::store::{MemoryStore, Origin, Store};

/// Keyed limits kept in Redis and shared by every process that uses the same Redis and prefix.
/// Clones share the connection, the caches and the queues.
///
/// See the [module documentation](crate::store::redis) for the scripts, the failure policy,
/// the denial cache and the waiting order.
///
/// # Examples
///
/// ```no_run
/// use sluice::store::{OnError, RedisConfig, RedisStore, Store};
/// use sluice_core::{AnyAlgorithm, Kind, Quota};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let per_ip = AnyAlgorithm::new(Kind::Gcra, Quota::parse(20, "10/s")?);
/// let config = RedisConfig::new("redis://127.0.0.1:6379").on_error(OnError::Local);
/// let store = RedisStore::connect(per_ip, config).await?;
/// match store.check("10.0.0.1", 1).await {
///     Ok(decision) => println!("admitted, {} left", decision.remaining),
///     Err(e) => println!("refused: {e}"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    /// What [`RedisStore::reconfigure`] replaces; each decision reads it once.
    pub(crate) current: RwLock<Arc<Settings>>,
    pub(crate) config: RedisConfig,
    pub(crate) clock: TokioClock,
    pub(crate) health: Health,
    pub(crate) denials: DenialCache,
    pub(crate) queues: Queues,
    pub(crate) metrics: StoreMetrics,
    /// The slices this process holds, when keys are leased.
    pub(crate) leases: Option<Leases>,
    /// Keys with a quota of their own, as last read from Redis.
    pub(crate) overrides: crate::store::redis::overrides::Overrides,
    /// Refunds and charges of Redis's admissions that came due while it did not answer.
    pub(crate) deferred: Deferred,
    /// This store, for the task that sends `deferred` once Redis answers (it must not keep
    /// the store alive).
    pub(crate) me: Weak<Inner>,
}

/// The algorithm's script and stamp, the policy's local store and the queue limits: swapped
/// whole, so that a decision never mixes two quotas.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) program: Program,
    pub(crate) fallback: Fallback,
    pub(crate) queue_depth: usize,
    pub(crate) max_wait: Duration,
}

impl Settings {
    /// The settings of `algorithm`; for `on_error = local`, `local` reconfigured, or a new
    /// local store without it.
    fn new(
        algorithm: &AnyAlgorithm,
        on_error: OnError,
        local: Option<&MemoryStore>,
        max_keys: usize,
        queue_depth: usize,
        max_wait: Duration,
    ) -> Result<Settings, RedisStoreError> {
        let program = Program::new(algorithm)?;
        let fallback = match (on_error, local) {
            (OnError::Allow, _) => Fallback::Allow,
            (OnError::Deny, _) => Fallback::Deny,
            (OnError::Local, Some(local)) => {
                local.reconfigure(*algorithm, max_keys, queue_depth, max_wait);
                Fallback::Local(local.clone())
            }
            (OnError::Local, None) => Fallback::Local(MemoryStore::new(
                *algorithm,
                max_keys,
                queue_depth,
                max_wait,
            )),
        };
        Ok(Settings {
            program,
            fallback,
            queue_depth,
            max_wait,
        })
    }
}

#[derive(Debug)]
pub(crate) struct StoreMetrics {
    pub(crate) round_trips: metrics::Counter,
    pub(crate) cached_denials: metrics::Counter,
    pub(crate) fallbacks: metrics::Counter,
    pub(crate) errors: metrics::Counter,
    /// Tokens of refunds and charges that found the store which granted them unreachable.
    pub(crate) unsettled: metrics::Counter,
}

/// The [`OnError`] policy, with its store for `local`.
#[derive(Debug)]
pub(crate) enum Fallback {
    Allow,
    Deny,
    Local(MemoryStore),
}

/// Redis could not answer this request: the policy decides.
pub(crate) struct Unanswered {
    pub(crate) retry_at_ns: u64,
}

impl RedisStore {
    /// A store for `algorithm`, connecting in the background: until Redis answers (and
    /// whenever it stops answering) the [`OnError`] policy decides. Needs a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::NoUrl`], [`RedisStoreError::BadUrl`],
    /// [`RedisStoreError::Unsupported`] for algorithms and quotas the scripts cannot run,
    /// [`RedisStoreError::NoRuntime`] outside a tokio runtime. Never because Redis is down.
    pub fn new(
        algorithm: AnyAlgorithm,
        config: RedisConfig,
    ) -> Result<RedisStore, RedisStoreError> {
        let store = RedisStore::build(algorithm, config)?;
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| RedisStoreError::NoRuntime)?;
        runtime.spawn(connect_until_done(Arc::downgrade(&store.inner)));
        store.sweep_leases();
        store.watch_overrides();
        Ok(store)
    }

    /// A store for `algorithm`, once Redis answered (within [`RedisConfig::connect_timeout`]):
    /// for servers that should not start without it. Later outages are handled as by
    /// [`RedisStore::new`].
    ///
    /// # Errors
    ///
    /// As [`RedisStore::new`], and [`RedisStoreError::Connect`] when Redis does not answer.
    pub async fn connect(
        algorithm: AnyAlgorithm,
        config: RedisConfig,
    ) -> Result<RedisStore, RedisStoreError> {
        let store = RedisStore::build(algorithm, config)?;
        let inner = &store.inner;
        let connected = tokio::time::timeout(inner.config.connect_timeout, async {
            let conn = Conn::open(&inner.config).await?;
            conn.load(inner.settings().program.script()).await?;
            Ok::<_, redis::RedisError>(conn)
        })
        .await;
        match connected {
            Ok(Ok(conn)) => {
                inner.health.connected(conn);
                store.sweep_leases();
                store.watch_overrides();
                Ok(store)
            }
            Ok(Err(e)) => Err(RedisStoreError::Connect {
                target: inner.config.target(),
                reason: e.to_string(),
            }),
            Err(_) => Err(RedisStoreError::Connect {
                target: inner.config.target(),
                reason: format!("no answer within {:?}", inner.config.connect_timeout),
            }),
        }
    }

    fn build(algorithm: AnyAlgorithm, config: RedisConfig) -> Result<RedisStore, RedisStoreError> {
        link::validate(&config)?;
        let settings = Settings::new(
            &algorithm,
            config.on_error,
            None,
            config.max_keys,
            config.queue_depth,
            config.max_wait,
        )?;
        if config.lease.is_some() && settings.program.lease_script().is_none() {
            return Err(leases_unsupported(algorithm.kind()));
        }
        let leases = config.lease.map(|lease| Leases::new(lease, &config.prefix));
        let label = config.prefix.clone();
        let health = Health::new(&config);
        let counter = |name: &'static str| metrics::counter!(name, "store" => "redis", "prefix" => label.clone());
        Ok(RedisStore {
            inner: Arc::new_cyclic(|me| Inner {
                me: me.clone(),
                metrics: StoreMetrics {
                    round_trips: counter("sluice_store_round_trips_total"),
                    cached_denials: counter("sluice_store_cached_denials_total"),
                    fallbacks: counter("sluice_store_fallbacks_total"),
                    errors: counter("sluice_store_errors_total"),
                    unsettled: counter("sluice_store_unsettled_tokens_total"),
                },
                denials: DenialCache::new(config.max_keys),
                deferred: Deferred::new(config.max_keys),
                current: RwLock::new(Arc::new(settings)),
                config,
                clock: TokioClock::new(),
                health,
                queues: Queues::default(),
                leases,
                overrides: Default::default(),
            }),
        })
    }

    /// The algorithm and quota in use now (the latest [`RedisStore::reconfigure`]'s).
    pub fn algorithm(&self) -> AnyAlgorithm {
        self.inner.settings().program.algorithm()
    }

    /// The configuration the store was made with. The queue limits and the bound on keys of
    /// a [`RedisStore::reconfigure`] replace its own.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// Changes the algorithm (another quota, or another algorithm), the queue limits and the
    /// bound on keys of this store in place, for every clone and every request waiting in it.
    ///
    /// Nothing is rewritten in Redis: each key is converted when it is next read, by the
    /// script, so that it has no more tokens than it had (see the [module
    /// documentation](crate::store::redis)). Decisions in flight finish under the quota they
    /// started with; the next ones, waiters included, use the new one. The denials this
    /// store remembers are forgotten, and the local store of `on_error = local` takes the
    /// new quota, its keys converted by the same rule.
    ///
    /// # Errors
    ///
    /// [`RedisStoreError::Unsupported`] for algorithms and quotas the scripts cannot run;
    /// the store then keeps its algorithm.
    pub fn reconfigure(
        &self,
        algorithm: AnyAlgorithm,
        queue_depth: usize,
        max_wait: Duration,
        max_keys: usize,
    ) -> Result<(), RedisStoreError> {
        let inner = &*self.inner;
        let max_keys = max_keys.max(1);
        // Checked before anything changes: an algorithm the scripts cannot run changes nothing.
        let program = Program::new(&algorithm)?;
        if inner.leases.is_some() && program.lease_script().is_none() {
            return Err(leases_unsupported(algorithm.kind()));
        }
        let current = inner.settings();
        let local = match &current.fallback {
            Fallback::Local(local) => Some(local),
            _ => None,
        };
        // The local store converts its keys in place, before the swap: meanwhile it answers
        // (while Redis does not) under the new quota, which never gives a key more.
        let settings = Settings::new(
            &algorithm,
            inner.config.on_error,
            local,
            max_keys,
            queue_depth,
            max_wait,
        )?;
        *inner.current.write() = Arc::new(settings);
        // After the swap: a denial inserted meanwhile was checked against the settings it was
        // answered under (see `Inner::check`).
        inner.denials.reset(max_keys);
        Ok(())
    }

    /// Whether decisions come from Redis right now (`false` while the policy decides).
    pub fn is_using_redis(&self) -> bool {
        self.inner.health.is_up()
    }

    /// Why Redis last failed to answer, if it ever did.
    pub fn last_error(&self) -> Option<String> {
        self.inner.health.last_error.lock().clone()
    }
}

/// Connects in the background until the first connection is there or the store is gone.
async fn connect_until_done(inner: Weak<Inner>) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let config = strong.config.clone();
        let script = strong.settings().program.script().clone();
        drop(strong);
        let attempt = tokio::time::timeout(config.connect_timeout, async {
            let conn = Conn::open(&config).await?;
            conn.load(&script).await?;
            Ok::<_, redis::RedisError>(conn)
        })
        .await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let now = strong.clock.now_ns();
        match attempt {
            Ok(Ok(conn)) => {
                strong.health.connected(conn);
                return;
            }
            Ok(Err(e)) => strong.health.not_connected(
                now.saturating_add(nanos(config.retry_interval)),
                e.to_string(),
            ),
            Err(_) => strong.health.not_connected(
                now.saturating_add(nanos(config.retry_interval)),
                format!("no answer within {:?}", config.connect_timeout),
            ),
        }
        drop(strong);
        tokio::time::sleep(config.retry_interval).await;
    }
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn limited(decision: Decision) -> Error {
    Error::Limited {
        retry_after: Duration::from_nanos(decision.retry_after_ns),
        decision,
    }
}

pub(crate) fn ensure_cost(settings: &Settings, cost: u64) -> Result<(), Error> {
    let capacity = settings.program.algorithm().quota().capacity();
    if cost > capacity {
        return Err(Error::InsufficientCapacity { cost, capacity });
    }
    Ok(())
}

/// Gives the probe back if its future is dropped before Redis answered.
struct ProbeGuard<'a> {
    health: &'a Health,
    armed: bool,
}

impl Drop for ProbeGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.health.abandon_probe();
        }
    }
}

impl Inner {
    /// Whether Redis answers now: `true` while it is in use, `false` while it is down and no
    /// probe is due; when one is due, this is it (a `PING` within the timeout, through the
    /// same health bookkeeping as a decision's probe).
    pub(crate) async fn answers(&self) -> bool {
        let conn = match self.health.gate(self.clock.now_ns()) {
            Gate::Use(_) => return true,
            Gate::Fallback { .. } => return false,
            Gate::Probe(conn) => conn,
        };
        let mut guard = ProbeGuard {
            health: &self.health,
            armed: true,
        };
        self.metrics.round_trips.increment(1);
        let error = match tokio::time::timeout(self.config.timeout, conn.ping()).await {
            Ok(Ok(())) => {
                guard.armed = false;
                self.health.success(true);
                return true;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.config.timeout),
        };
        guard.armed = false;
        self.metrics.errors.increment(1);
        let retry_at_ns = self
            .clock
            .now_ns()
            .saturating_add(nanos(self.config.retry_interval));
        self.health.failure(true, retry_at_ns, error);
        false
    }

    /// The settings in use now.
    pub(crate) fn settings(&self) -> Arc<Settings> {
        Arc::clone(&self.current.read())
    }

    /// Runs `cmd` on the current connection, within the timeout, outside the failure policy
    /// and the health bookkeeping (for `check_at` and `refund_at`).
    pub(crate) async fn run_direct(
        &self,
        script: &redis::Script,
        cmd: &redis::Cmd,
        admission: bool,
    ) -> Result<redis::Value, Error> {
        let unavailable = Error::Unavailable {
            retry_after: self.config.retry_interval,
        };
        let conn = self.health.conn.get().ok_or(unavailable)?;
        let run = conn.run(cmd, script, admission);
        match tokio::time::timeout(self.config.timeout, run).await {
            Ok(Ok(reply)) => Ok(reply),
            _ => Err(unavailable),
        }
    }

    pub(crate) async fn ask(
        &self,
        settings: &Settings,
        key: &str,
        cost: u64,
        now: u64,
    ) -> Result<Decision, Unanswered> {
        // A key with a quota of its own runs the same script under its own stamp.
        let own = self.overrides.program(key);
        let program = own.as_deref().unwrap_or(&settings.program);
        let cmd = program.command(&self.config.prefix, key, cost, None);
        self.round_trip(program.script(), &cmd, now, cost > 0, |reply| {
            program.decision(reply)
        })
        .await
    }

    /// Runs the script `cmd` of `program` (a check that spends if `admission`) and reads its
    /// reply with `read`, all within the timeout. A failure (no connection, no answer in time, an error or a reply `read`
    /// rejects) marks Redis down, except a connection that broke under the request while
    /// Redis still answers `PING` at once over a new one: only this request then goes
    /// unanswered.
    pub(crate) async fn round_trip<T>(
        &self,
        script: &redis::Script,
        cmd: &redis::Cmd,
        now: u64,
        admission: bool,
        read: impl FnOnce(&redis::Value) -> Option<T>,
    ) -> Result<T, Unanswered> {
        self.exchange(now, |conn| conn.run(cmd, script, admission), read)
            .await
    }

    /// [`Inner::round_trip`] of the lease commands `cmds` of `script` (given back, nothing
    /// admitted) in one pipeline (see [`Conn::run_many`]): each reply read with `read`. One
    /// round trip whatever their number; an error or a reply `read` rejects, for any of them,
    /// is a failure as in [`Inner::round_trip`].
    pub(crate) async fn round_trip_many<T>(
        &self,
        script: &redis::Script,
        cmds: &[redis::Cmd],
        now: u64,
        read: impl Fn(&redis::Value) -> Option<T>,
    ) -> Result<Vec<T>, Unanswered> {
        self.exchange(
            now,
            |conn| conn.run_many(cmds, script),
            |replies: &Vec<redis::RedisResult<redis::Value>>| {
                replies
                    .iter()
                    .map(|reply| reply.as_ref().ok().and_then(&read))
                    .collect()
            },
        )
        .await
    }

    /// One exchange with Redis, `run` on the connection the gate gives, its reply read with
    /// `read`, under the timeout and the health bookkeeping of [`Inner::round_trip`].
    async fn exchange<'c, R: std::fmt::Debug, T, F>(
        &'c self,
        now: u64,
        run: impl FnOnce(&'c Conn) -> F,
        read: impl FnOnce(&R) -> Option<T>,
    ) -> Result<T, Unanswered>
    where
        F: std::future::Future<Output = redis::RedisResult<R>>,
    {
        let (conn, probe) = match self.health.gate(now) {
            Gate::Use(conn) => (conn, false),
            Gate::Probe(conn) => (conn, true),
            Gate::Fallback { retry_at_ns } => return Err(Unanswered { retry_at_ns }),
        };
        let mut guard = ProbeGuard {
            health: &self.health,
            armed: probe,
        };
        self.metrics.round_trips.increment(1);
        let deadline = tokio::time::Instant::now() + self.config.timeout;
        let run = async {
            if probe {
                conn.ping().await?;
            }
            run(conn).await
        };
        let reply = tokio::time::timeout_at(deadline, run).await;
        let error = match reply {
            Ok(Ok(reply)) => match read(&reply) {
                Some(value) => {
                    guard.armed = false;
                    self.health.success(probe);
                    return Ok(value);
                }
                None => format!("unexpected script reply {reply:?}"),
            },
            Ok(Err(e)) if lost_connection(&e) => {
                // The request may have been decided: it follows the policy. Redis itself may
                // be fine (a connection cut by a proxy, a firewall, a client kill): the client
                // reconnects, and if Redis answers `PING` at once it stays in use.
                let error = e.to_string();
                let ping = tokio::time::timeout_at(deadline, conn.ping()).await;
                if matches!(ping, Ok(Ok(()))) {
                    guard.armed = false;
                    self.metrics.errors.increment(1);
                    self.health.reconnected(probe, error);
                    return Err(Unanswered {
                        retry_at_ns: self.clock.now_ns(),
                    });
                }
                error
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.config.timeout),
        };
        guard.armed = false;
        self.metrics.errors.increment(1);
        let retry_at_ns = self
            .clock
            .now_ns()
            .saturating_add(nanos(self.config.retry_interval));
        self.health.failure(probe, retry_at_ns, error);
        Err(Unanswered { retry_at_ns })
    }

    /// What the policy decides while Redis does not answer.
    pub(crate) fn fallback(
        &self,
        settings: &Settings,
        key: &str,
        cost: u64,
        unanswered: Unanswered,
    ) -> Result<(Decision, Origin), Error> {
        self.metrics.fallbacks.increment(1);
        match &settings.fallback {
            Fallback::Allow => {
                let limit = settings.program.algorithm().quota().capacity();
                Ok((
                    Decision {
                        allowed: true,
                        limit,
                        remaining: limit - cost,
                        retry_after_ns: 0,
                        reset_after_ns: 0,
                    },
                    Origin::Nowhere,
                ))
            }
            Fallback::Deny => {
                let wait = unanswered
                    .retry_at_ns
                    .saturating_sub(self.clock.now_ns())
                    .max(nanos(self.config.timeout));
                Err(Error::Unavailable {
                    retry_after: Duration::from_nanos(wait),
                })
            }
            Fallback::Local(local) if cost == 0 => Ok((local.keyed().peek(key), Origin::Fallback)),
            Fallback::Local(local) => local.check_now(key, cost).map(|d| (d, Origin::Fallback)),
        }
    }

    pub(crate) async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.check_granted(key, cost).await.map(|(d, _)| d)
    }

    /// [`Inner::check`], with where it was granted.
    pub(crate) async fn check_granted(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<(Decision, Origin), Error> {
        self.settle_deferred().await;
        let settings = self.settings();
        ensure_cost(&settings, cost)?;
        let now = self.clock.now_ns();
        if let (Some(leases), true) = (&self.leases, cost > 0) {
            return self.check_leased(leases, &settings, key, cost, now).await;
        }
        if cost > 0 {
            if let Some(decision) = self.denials.get(key, cost, now) {
                self.metrics.cached_denials.increment(1);
                return Err(limited(decision));
            }
        }
        match self.ask(&settings, key, cost, now).await {
            Ok(decision) if decision.allowed => Ok((decision, Origin::Store)),
            Ok(decision) => {
                // Only a denial under the settings in use now: `reconfigure` clears the cache
                // after it swapped them.
                let current = self.current.read();
                if Arc::ptr_eq(&current, &settings) {
                    self.denials.insert(key, cost, now, decision);
                }
                drop(current);
                Err(limited(decision))
            }
            Err(unanswered) => self.fallback(&settings, key, cost, unanswered),
        }
    }
}

/// Whether `e` says the connection broke (the client reconnects by itself) rather than that
/// Redis refused or did not answer.
fn lost_connection(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error()
}

impl Store for RedisStore {
    async fn check(&self, key: &str, cost: u64) -> Result<Decision, Error> {
        self.inner.check(key, cost).await
    }

    /// Waits in `key`'s FIFO queue of this process (see the module docs).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives its place back. If it is dropped while a request to Redis is
    /// in flight, Redis may have admitted it: that cost is spent, not given back.
    async fn acquire(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<Decision, Error> {
        self.acquire_granted(key, cost, options)
            .await
            .map(|(d, _)| d)
    }

    async fn check_granted(&self, key: &str, cost: u64) -> Result<(Decision, Origin), Error> {
        self.inner.check_granted(key, cost).await
    }

    /// As [`Store::acquire`] (see there for its cancel safety), with where it was granted.
    async fn acquire_granted(
        &self,
        key: &str,
        cost: u64,
        options: AcquireOptions,
    ) -> Result<(Decision, Origin), Error> {
        let inner = &*self.inner;
        let start = inner.clock.now_ns();
        let (depth, config_wait) = {
            let settings = inner.settings();
            (settings.queue_depth, settings.max_wait)
        };
        // Newcomers queue behind the waiters of this process; otherwise ask first.
        let predicted = if depth > 0 && inner.queues.has_waiters(key) {
            None
        } else {
            match inner.check_granted(key, cost).await {
                Err(Error::Limited { retry_after, .. }) if depth > 0 => Some(retry_after),
                other => return other,
            }
        };
        let max_wait = options.max_wait.map_or(config_wait, |w| w.min(config_wait));
        let deadline = start.saturating_add(nanos(max_wait));
        let mut wait = predicted.unwrap_or(Duration::ZERO);
        if wait > max_wait {
            return Err(Error::Timeout { retry_after: wait });
        }
        let Some(place) = inner.queues.join(key, depth) else {
            return Err(Error::QueueFull { retry_after: wait });
        };
        let left = Duration::from_nanos(deadline.saturating_sub(inner.clock.now_ns()));
        let Ok(_turn) = tokio::time::timeout(left, place.queue.turn.lock()).await else {
            return Err(Error::Timeout { retry_after: wait });
        };
        // At the head: ask again (now, if this request never asked), then each time the wait
        // Redis gave has passed.
        if predicted.is_some() {
            // The wait counted from the first answer, part of which was spent in the queue.
            let waited = Duration::from_nanos(inner.clock.now_ns().saturating_sub(start));
            wait = wait.saturating_sub(waited);
        }
        loop {
            let now = inner.clock.now_ns();
            if now.saturating_add(nanos(wait)) > deadline {
                return Err(Error::Timeout { retry_after: wait });
            }
            tokio::time::sleep(wait).await;
            match inner.check_granted(key, cost).await {
                Err(Error::Limited { retry_after, .. }) => wait = retry_after,
                other => return other,
            }
        }
    }

    /// Gives back to Redis (see [`Store::refund_to`] for an admission granted elsewhere).
    async fn refund(&self, key: &str, cost: u64, ago: Duration) {
        self.inner.refund_to(Origin::Store, key, cost, ago).await;
    }

    /// Charges in Redis (see [`Store::charge_to`] for an admission granted elsewhere).
    async fn charge(&self, key: &str, cost: u64, max_debt: u64) -> u64 {
        self.inner
            .charge_to(Origin::Store, key, cost, max_debt)
            .await
    }

    async fn refund_to(&self, origin: Origin, key: &str, cost: u64, ago: Duration) {
        self.inner.refund_to(origin, key, cost, ago).await;
    }

    async fn charge_to(&self, origin: Origin, key: &str, cost: u64, max_debt: u64) -> u64 {
        self.inner.charge_to(origin, key, cost, max_debt).await
    }

    async fn peek(&self, key: &str) -> Result<Decision, Error> {
        self.inner.check(key, 0).await
    }

    fn hottest(&self, n: usize) -> Vec<(String, Decision)> {
        let inner = &*self.inner;
        let mut all = inner.denials.denied(inner.clock.now_ns());
        if let Fallback::Local(local) = &inner.settings().fallback {
            if !inner.health.is_up() {
                all.extend(local.hottest(n));
            }
        }
        all.sort_by_key(|(_, d)| (d.remaining, std::cmp::Reverse(d.reset_after_ns)));
        all.truncate(n);
        all
    }
}
