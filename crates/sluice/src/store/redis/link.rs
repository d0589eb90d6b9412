//! The connection to Redis (one server, a Cluster, or the master of Sentinels) and whether to
//! use it right now.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use redis::aio::ConnectionLike;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, Script, Value};

use crate::store::redis::config::{
    is_sentinel_url, OnError, RedisConfig, RedisStoreError, SentinelUrl,
};
use crate::store::redis::sentinel::SentinelLink;

/// A multiplexed connection that reconnects by itself: every clone shares it.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server, through `ConnectionManager` (reconnects on the first I/O error).
    Single(ConnectionManager),
    /// A Cluster: routes by key slot, follows `MOVED`, refreshes its slot map.
    Cluster(ClusterConnection),
    /// The master the Sentinels name, asked again by [`Conn::ping`].
    Sentinel(Arc<SentinelLink>),
}

impl Conn {
    /// Opens the connection (once; it then reconnects by itself).
    pub(crate) async fn open(config: &RedisConfig) -> RedisResult<Conn> {
        if config.is_sentinel() {
            let url = SentinelUrl::parse(&config.urls[0]).map_err(|e| {
                RedisError::from((ErrorKind::InvalidClientConfig, "bad Sentinel URL", e))
            })?;
            let link = SentinelLink::open(url, config.connect_timeout, config.timeout).await?;
            Ok(Conn::Sentinel(link))
        } else if config.cluster {
            let client = ClusterClientBuilder::new(config.urls.clone())
                .connection_timeout(config.connect_timeout)
                .response_timeout(config.connect_timeout.max(config.timeout))
                // The client would resend a request whose connection broke after it left (a
                // possible double decision); `run` follows the redirects that are safe.
                .retries(0)
                .build()?;
            Ok(Conn::Cluster(client.get_async_connection().await?))
        } else {
            let client = redis::Client::open(config.urls[0].as_str())?;
            // No retries inside the manager: a failed reconnection fails at once, and the
            // next request (a probe, see `Health`) starts a fresh one. Its backoff would
            // otherwise keep a restarted Redis unused for seconds.
            let manager_config = ConnectionManagerConfig::new()
                .set_number_of_retries(0)
                .set_connection_timeout(config.connect_timeout);
            let manager = ConnectionManager::new_with_config(client, manager_config).await?;
            Ok(Conn::Single(manager))
        }
    }

    /// Runs one `EVALSHA` of `script`; on `NOSCRIPT` (a restarted or new server: the script
    /// did not run) loads the script and runs it again. Nothing else is ever sent twice: once
    /// the command may have left (a connection that drops, an answer that does not come), its
    /// outcome is unknown, and sending it again could spend or refund twice; the caller then
    /// applies its failure policy. The caller bounds the whole by its timeout.
    ///
    /// In a Cluster, a `MOVED` answer (the slot has another master now: the script did not
    /// run) is asked once more; the client refreshes its slot map on `MOVED`, and while it
    /// still names the old master the decision follows the failure policy.
    ///
    /// Through Sentinels, when `admission` (a check that spends) and the script admitted, the
    /// reply comes back only once the replicas have it (see `sentinel`), or as an error.
    pub(crate) async fn run(
        &self,
        cmd: &Cmd,
        script: &Script,
        admission: bool,
    ) -> RedisResult<Value> {
        if let Conn::Sentinel(link) = self {
            let ran = |(master, reply)| match reply {
                Value::ServerError(e) => Err(RedisError::from(e)),
                reply => Ok((master, reply)),
            };
            let (master, reply) = match ran(link.query(cmd).await?) {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    link.load(script).await?;
                    ran(link.query(cmd).await?)?
                }
                other => other?,
            };
            if admission && admitted(&reply) {
                link.acknowledged(&master).await?;
            }
            return Ok(reply);
        }
        let first = match self.query(cmd).await {
            Err(e) if e.kind() == ErrorKind::Moved => self.query(cmd).await,
            other => other,
        };
        match first {
            Err(e) if e.kind() == ErrorKind::NoScriptError => {
                self.load(script).await?;
                self.query(cmd).await
            }
            other => other,
        }
    }

    /// Runs the `EVALSHA`s `cmds` of `script` in one round trip: one pipeline to one server
    /// or the Sentinels' master; in a Cluster (whose pipelines hold one slot, and these keys
    /// are in many) each as [`Conn::run`], all sent at once, so that those of one node share
    /// its connection's flight. Those that found the script missing (`NOSCRIPT`: they did not
    /// run) are sent once more after loading it; nothing else is sent twice (see
    /// [`Conn::run`]). Each command's reply, in order. The caller bounds the whole by its
    /// timeout. Never for admissions: the Sentinels' wait for replicas is not made here.
    pub(crate) async fn run_many(
        &self,
        cmds: &[Cmd],
        script: &Script,
    ) -> RedisResult<Vec<RedisResult<Value>>> {
        if let Conn::Cluster(_) = self {
            let each = cmds.iter().map(|cmd| self.run(cmd, script, false));
            return Ok(futures_util::future::join_all(each).await);
        }
        let mut replies = self.query_many(cmds).await?;
        let missing: Vec<usize> = (0..replies.len())
            .filter(|&i| matches!(&replies[i], Err(e) if e.kind() == ErrorKind::NoScriptError))
            .collect();
        if !missing.is_empty() {
            self.load(script).await?;
            let again: Vec<Cmd> = missing.iter().map(|&i| cmds[i].clone()).collect();
            for (i, reply) in missing.into_iter().zip(self.query_many(&again).await?) {
                replies[i] = reply;
            }
        }
        Ok(replies)
    }

    /// `cmds` in one pipeline (one server, or the Sentinels' master; in a Cluster all sent at
    /// once); each reply, a server error as an error.
    async fn query_many(&self, cmds: &[Cmd]) -> RedisResult<Vec<RedisResult<Value>>> {
        let mut pipe = redis::Pipeline::with_capacity(cmds.len());
        for cmd in cmds {
            pipe.add_command(cmd.clone());
        }
        let replies = match self {
            Conn::Single(c) => c.clone().req_packed_commands(&pipe, 0, cmds.len()).await?,
            Conn::Sentinel(link) => link.query_many(&pipe, cmds.len()).await?,
            Conn::Cluster(_) => {
                let each = cmds.iter().map(|cmd| self.query(cmd));
                return Ok(futures_util::future::join_all(each).await);
            }
        };
        Ok(replies
            .into_iter()
            .map(|reply| match reply {
                Value::ServerError(e) => Err(e.into()),
                reply => Ok(reply),
            })
            .collect())
    }

    /// Asks one server `PING` before a probe's decision (one server only; a Cluster's
    /// client reconnects to each node by itself). After Redis came back, the first request
    /// only finds the old connection broken (which starts a new one): `PING` decides nothing,
    /// so it may be sent again at once, and the decision then goes over a fresh connection.
    ///
    /// Through Sentinels, asks them which server is the master, connects to it if this is not
    /// the server in use (or its connection broke) and checks that it answers `ROLE` with
    /// `master`: after a failover the probe finds the new master.
    pub(crate) async fn ping(&self) -> RedisResult<()> {
        match self {
            Conn::Single(_) => {}
            Conn::Cluster(_) => return Ok(()),
            Conn::Sentinel(link) => return link.find().await,
        }
        let ping = redis::cmd("PING");
        match self.query(&ping).await {
            Err(e) if e.is_io_error() || e.is_connection_dropped() => {
                self.query(&ping).await.map(drop)
            }
            other => other.map(drop),
        }
    }

    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<Value> {
        let reply = match self {
            Conn::Single(c) => c.clone().req_packed_command(cmd).await?,
            Conn::Cluster(c) => c.clone().req_packed_command(cmd).await?,
            Conn::Sentinel(link) => link.query(cmd).await?.1,
        };
        // A server error (`NOSCRIPT`, a script error) comes back as a value.
        match reply {
            Value::ServerError(e) => Err(e.into()),
            reply => Ok(reply),
        }
    }

    /// Loads `script` into the server (every master of a Cluster), so the first `EVALSHA`
    /// finds it.
    pub(crate) async fn load(&self, script: &Script) -> RedisResult<()> {
        let _sha: String = match self {
            Conn::Single(c) => script.prepare_invoke().load_async(&mut c.clone()).await?,
            Conn::Cluster(c) => script.prepare_invoke().load_async(&mut c.clone()).await?,
            Conn::Sentinel(link) => return link.load(script).await,
        };
        Ok(())
    }
}

/// Checks a configuration's URLs before any connection is tried.
pub(crate) fn validate(config: &RedisConfig) -> Result<(), RedisStoreError> {
    if config.urls.is_empty() || config.urls.iter().all(|u| u.is_empty()) {
        return Err(RedisStoreError::NoUrl);
    }
    if let Some(url) = config.urls.iter().find(|u| is_sentinel_url(u)) {
        let reason = if config.cluster {
            String::from("a Sentinel URL is not a Cluster seed: give it alone, as one URL")
        } else if config.urls.len() > 1 {
            String::from("a Sentinel URL names every Sentinel itself: give it alone")
        } else {
            match SentinelUrl::parse(url) {
                Ok(_) => return Ok(()),
                Err(reason) => reason,
            }
        };
        return Err(RedisStoreError::BadUrl {
            url: url.clone(),
            reason,
        });
    }
    for url in &config.urls {
        if let Err(e) = redis::Client::open(url.as_str()) {
            return Err(RedisStoreError::BadUrl {
                url: url.clone(),
                reason: e.to_string(),
            });
        }
    }
    Ok(())
}

/// Whether the reply of a check says it admitted (`{1, ...}`), or of a lease that it granted tokens.
fn admitted(reply: &Value) -> bool {
    // A decision's first field is 1 when it admitted; a lease's is the tokens it granted.
    matches!(reply, Value::Array(items) if matches!(items.first(), Some(Value::Int(n)) if *n >= 1))
}

/// Whether Redis is being used, and when to try it again if not.
///
/// Up: every request goes to Redis. A failure (error or timeout) marks it down until
/// `retry_at`; meanwhile requests get the fallback at once, without waiting for a timeout.
/// The first request after `retry_at` is the probe (one at a time); its success brings
/// everyone back to Redis.
///
/// Every change is logged once: down (warn: decisions follow `on_error`), back (info).
#[derive(Debug)]
pub(crate) struct Health {
    pub(crate) conn: OnceLock<Conn>,
    down: AtomicBool,
    /// Whether "cannot connect" was logged: once until the first connection.
    unreachable: AtomicBool,
    retry_at_ns: AtomicU64,
    probing: AtomicBool,
    pub(crate) last_error: parking_lot::Mutex<Option<String>>,
    /// For the logs: the URL or cluster, the key prefix and the policy.
    target: String,
    prefix: String,
    on_error: OnError,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Conn::Single(_) => "Conn::Single",
            Conn::Cluster(_) => "Conn::Cluster",
            Conn::Sentinel(_) => "Conn::Sentinel",
        })
    }
}

/// May this request use Redis?
#[derive(Debug, Clone, Copy)]
pub(crate) enum Gate<'a> {
    /// Redis is up: use it.
    Use(&'a Conn),
    /// Redis is down but due for a probe: this request is it.
    Probe(&'a Conn),
    /// Redis is down (or not connected yet): the policy decides; retry from this time.
    Fallback { retry_at_ns: u64 },
}

impl Health {
    pub(crate) fn new(config: &RedisConfig) -> Health {
        Health {
            conn: OnceLock::new(),
            down: AtomicBool::new(false),
            unreachable: AtomicBool::new(false),
            retry_at_ns: AtomicU64::new(0),
            probing: AtomicBool::new(false),
            last_error: parking_lot::Mutex::new(None),
            target: config.target(),
            prefix: config.prefix.clone(),
            on_error: config.on_error,
        }
    }

    pub(crate) fn gate(&self, now: u64) -> Gate<'_> {
        let Some(conn) = self.conn.get() else {
            return Gate::Fallback {
                retry_at_ns: self.retry_at_ns.load(Ordering::Relaxed),
            };
        };
        if !self.down.load(Ordering::Acquire) {
            return Gate::Use(conn);
        }
        let retry_at_ns = self.retry_at_ns.load(Ordering::Acquire);
        if now >= retry_at_ns && !self.probing.swap(true, Ordering::AcqRel) {
            return Gate::Probe(conn);
        }
        Gate::Fallback { retry_at_ns }
    }

    /// Redis answered (to a probe, if `probe`).
    pub(crate) fn success(&self, probe: bool) {
        if probe {
            let was_down = self.down.swap(false, Ordering::AcqRel);
            self.probing.store(false, Ordering::Release);
            if was_down {
                tracing::info!(
                    redis = %self.target,
                    prefix = %self.prefix,
                    "redis store recovered: decisions back on Redis"
                );
            }
        }
    }

    /// Redis did not answer in time: leave it alone until `retry_at_ns`.
    pub(crate) fn failure(&self, probe: bool, retry_at_ns: u64, error: String) {
        self.retry_at_ns.store(retry_at_ns, Ordering::Release);
        let was_down = self.down.swap(true, Ordering::AcqRel);
        if probe {
            self.probing.store(false, Ordering::Release);
        }
        if !was_down {
            tracing::warn!(
                redis = %self.target,
                prefix = %self.prefix,
                on_error = %self.on_error,
                error = %error,
                "redis store down: decisions degraded to on_error until Redis answers again"
            );
        }
        *self.last_error.lock() = Some(error);
    }

    /// A connection broke under a request (its decision went unanswered), and Redis answered
    /// `PING` over a new one at once: Redis stays in use (or, after a probe, is back).
    pub(crate) fn reconnected(&self, probe: bool, error: String) {
        self.success(probe);
        tracing::info!(
            redis = %self.target,
            prefix = %self.prefix,
            on_error = %self.on_error,
            error = %error,
            "redis store reconnected: a connection broke under a request, whose decision followed on_error; Redis answers"
        );
        *self.last_error.lock() = Some(error);
    }

    /// A probe ended without an answer either way (its future was dropped).
    pub(crate) fn abandon_probe(&self) {
        self.probing.store(false, Ordering::Release);
    }

    /// The first connection is there.
    pub(crate) fn connected(&self, conn: Conn) {
        let _ = self.conn.set(conn);
        self.down.store(false, Ordering::Release);
        self.unreachable.store(false, Ordering::Release);
        tracing::info!(
            redis = %self.target,
            prefix = %self.prefix,
            "redis store connected: decisions on Redis"
        );
    }

    /// Whether requests go to Redis now.
    pub(crate) fn is_up(&self) -> bool {
        self.conn.get().is_some() && !self.down.load(Ordering::Acquire)
    }

    /// Records why the first connection is not there yet.
    pub(crate) fn not_connected(&self, retry_at_ns: u64, error: String) {
        self.retry_at_ns.store(retry_at_ns, Ordering::Release);
        if !self.unreachable.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                redis = %self.target,
                prefix = %self.prefix,
                on_error = %self.on_error,
                error = %error,
                "redis store cannot connect: decisions degraded to on_error until it does"
            );
        }
        *self.last_error.lock() = Some(error);
    }
}
