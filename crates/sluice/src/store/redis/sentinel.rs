//! Redis Sentinel: the master found through the Sentinels, found again whenever it stops
//! answering, and admissions acknowledged by replicas so that a failover does not lose them.
//!
//! # Finding the master
//!
//! Every Sentinel is asked at once (`SENTINEL GET-MASTER-ADDR-BY-NAME <name>` and `SENTINEL
//! MASTER <name>`, each within the connect timeout, so that one hung or partitioned Sentinel
//! delays nothing), and among those that name a master that is up, the one with the highest
//! configuration epoch wins: a failover raises the epoch, so a Sentinel that has not heard of
//! it yet is outvoted by one that has. The Sentinel leading a failover names the promoted
//! replica as soon as it answers as a master (before the others hear of it, and before the
//! failover ends): from then on the failover cannot be aborted.
//! The server found must then answer `ROLE` with `master`. One search at a time; the others
//! that asked meanwhile use what it found.
//!
//! (redis-rs's own `sentinel` module asks the Sentinels one after the other without a
//! timeout, and takes the first answer whatever its epoch.)
//!
//! # Acknowledged admissions
//!
//! A Sentinel failover promotes a replica, which has what was replicated to it, no more: an
//! admission the old master made but had not sent on is lost, its tokens given back. And the
//! old master keeps answering after the promotion, as a master, until the Sentinels turn it
//! into a replica (about 10 s later, Sentinel's fixed delay), its writes meanwhile lost too;
//! with several replicas, the ones not promoted still follow it (and acknowledge its writes)
//! until the Sentinels point them at the new master, then resynchronise from it.
//!
//! So (unless the URL says `wait=none`) an admission counts only once every replica that was
//! connected to the master when this connection was made has it: `WAIT <n>`, one at a time
//! per connection, covering every admission answered on it before it was sent (a group
//! commit). `n` is the number of replicas `ROLE` listed then, raised (never lowered) by every
//! later `ROLE` on the connection. Whichever of them is promoted has every admission that
//! counted; and the old master, one of whose replicas is gone at the promotion, gets no
//! `WAIT` through: its admissions follow the failure policy, and the next probe asks the
//! Sentinels again. A master found with no replica (the new master of a failover, before any
//! replica follows it) waits for none: no failover can promote a replica it never had, and
//! those that join it copy everything first. (The limits of this: a replica that joins later
//! is waited for only once a probe's `ROLE` lists it, so until then a failover to it, should
//! it lag, may lose its lag; and a new connection to the same master, made because the old one
//! broke, counts the replicas anew.)
//!
//! Denials, refunds and conversions are not waited for: losing one never gives a token.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    RedisConnectionInfo, RedisError, RedisResult, Script, Value,
};

use crate::store::redis::config::SentinelUrl;

/// The Sentinels of one master, and the connection to the master they name.
pub(crate) struct SentinelLink {
    url: SentinelUrl,
    connect_timeout: Duration,
    /// `WAIT`'s timeout, in milliseconds (the decision timeout; at least 1: 0 waits forever).
    wait_ms: u64,
    master: parking_lot::RwLock<Option<Arc<Master>>>,
    /// Bumped at each new master connection.
    generation: AtomicU64,
    /// One search at a time.
    search: tokio::sync::Mutex<()>,
}

/// One connection to a master (one TCP connection: it does not reconnect by itself, so a
/// `WAIT` on it covers what was written on it).
pub(crate) struct Master {
    addr: String,
    conn: MultiplexedConnection,
    /// The replicas each admission must reach (see the module documentation).
    replicas: AtomicI64,
    acks: Acks,
}

/// The group commit of one connection.
#[derive(Default)]
struct Acks {
    /// Admissions answered on the connection so far: each takes the next number.
    answered: AtomicU64,
    /// One `WAIT` at a time; the last one that came back.
    last: tokio::sync::Mutex<Covered>,
}

#[derive(Default)]
struct Covered {
    /// The admissions it covered: numbers up to this one.
    upto: u64,
    /// How many replicas it asked for.
    needed: i64,
    /// How many replicas acknowledged them.
    replicas: i64,
}

impl SentinelLink {
    /// Finds the master and connects to it.
    pub(crate) async fn open(
        url: SentinelUrl,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> RedisResult<Arc<SentinelLink>> {
        let link = Arc::new(SentinelLink {
            url,
            connect_timeout,
            wait_ms: u64::try_from(timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            master: parking_lot::RwLock::new(None),
            generation: AtomicU64::new(0),
            search: tokio::sync::Mutex::new(()),
        });
        link.find().await?;
        Ok(link)
    }

    /// The master connection in use.
    fn current(&self) -> RedisResult<Arc<Master>> {
        self.master.read().clone().ok_or_else(|| {
            RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no master connection",
            ))
        })
    }

    /// Asks the Sentinels which server is the master and makes sure this link is connected
    /// to it and that it answers `ROLE` with `master`. Sends nothing that decides.
    pub(crate) async fn find(&self) -> RedisResult<()> {
        let seen = self.generation.load(Ordering::Acquire);
        let _search = self.search.lock().await;
        if self.generation.load(Ordering::Acquire) != seen {
            // Another search connected to a new master meanwhile.
            return self.current()?.role().await;
        }
        let (host, port) = self.ask_sentinels().await?;
        let addr = address(&host, port);
        let current = self.master.read().clone();
        if let Some(master) = current.filter(|m| m.addr == addr) {
            match master.role().await {
                Err(e) if e.is_io_error() || e.is_unrecoverable_error() => {}
                other => return other,
            }
        }
        let info = ConnectionInfo {
            addr: ConnectionAddr::Tcp(host, port),
            redis: RedisConnectionInfo {
                db: self.url.db,
                username: self.url.username.clone(),
                password: self.url.password.clone(),
                ..RedisConnectionInfo::default()
            },
        };
        let conn = Client::open(info)?
            .get_multiplexed_async_connection_with_config(
                &AsyncConnectionConfig::new().set_connection_timeout(self.connect_timeout),
            )
            .await?;
        let master = Arc::new(Master {
            addr,
            conn,
            replicas: AtomicI64::new(0),
            acks: Acks::default(),
        });
        master.role().await?;
        tracing::debug!(
            redis = %self.url,
            master = %master.addr,
            replicas = master.replicas.load(Ordering::Acquire),
            "redis store: connected to the master the Sentinels name"
        );
        *self.master.write() = Some(master);
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// The master's address by the Sentinels that answer: the highest epoch's.
    async fn ask_sentinels(&self) -> RedisResult<(String, u16)> {
        let asks = self
            .url
            .sentinels
            .iter()
            .map(|(host, port)| self.ask_sentinel(host, *port));
        let answers = futures_util::future::join_all(asks).await;
        let mut best: Option<(u64, String, u16)> = None;
        let mut why = Vec::new();
        for ((host, port), answer) in self.url.sentinels.iter().zip(answers) {
            match answer {
                Ok((epoch, ip, p)) => {
                    if best.as_ref().is_none_or(|(e, ..)| epoch > *e) {
                        best = Some((epoch, ip, p));
                    }
                }
                Err(e) => why.push(format!("{}: {e}", address(host, *port))),
            }
        }
        match best {
            Some((_, ip, port)) => Ok((ip, port)),
            None => Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "no Sentinel names a master that is up",
                format!("`{}`: {}", self.url.master, why.join("; ")),
            ))),
        }
    }

    /// One Sentinel's view: the epoch and address of the master, if it deems it up.
    async fn ask_sentinel(&self, host: &str, port: u16) -> RedisResult<(u64, String, u16)> {
        let ask = async {
            let info = ConnectionInfo {
                addr: ConnectionAddr::Tcp(host.to_string(), port),
                redis: RedisConnectionInfo {
                    username: self.url.sentinel_username.clone(),
                    password: self.url.sentinel_password.clone(),
                    ..RedisConnectionInfo::default()
                },
            };
            let mut conn = Client::open(info)?
                .get_multiplexed_async_connection_with_config(
                    &AsyncConnectionConfig::new().set_connection_timeout(self.connect_timeout),
                )
                .await?;
            let (fields, named): (HashMap<String, String>, Option<(String, String)>) =
                redis::pipe()
                    .cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(&self.url.master)
                    .cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.url.master)
                    .query_async(&mut conn)
                    .await?;
            Ok::<_, RedisError>((fields, named))
        };
        let (fields, named) = tokio::time::timeout(self.connect_timeout, ask)
            .await
            .map_err(|_| {
                RedisError::from((
                    ErrorKind::MasterNameNotFoundBySentinel,
                    "no answer",
                    format!("within {:?}", self.connect_timeout),
                ))
            })??;
        let field = |k: &str| fields.get(k).map(String::as_str).unwrap_or("");
        let flags = field("flags");
        let epoch = field("config-epoch").parse().unwrap_or(0);
        let Some((ip, port)) = named.and_then(|(ip, port)| Some((ip, port.parse::<u16>().ok()?)))
        else {
            return Err(RedisError::from((
                ErrorKind::MasterNameNotFoundBySentinel,
                "names no master",
                format!("flags {flags}"),
            )));
        };
        // Mid-failover, once the promoted replica answers as a master, the Sentinel that leads
        // it names the new master (its epoch already raised) while its record still holds the
        // old one, flags included: that answer stands whatever the old master's flags say.
        let promoted = (field("ip"), field("port")) != (ip.as_str(), port.to_string().as_str());
        let up = flags.split(',').any(|f| f == "master")
            && !flags.split(',').any(|f| f == "s_down" || f == "o_down");
        if promoted || up {
            return Ok((epoch, ip, port));
        }
        Err(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "master not up",
            format!("{} flags {flags}", address(&ip, port)),
        )))
    }

    /// One command on the master; the master it went to.
    pub(crate) async fn query(&self, cmd: &Cmd) -> RedisResult<(Arc<Master>, Value)> {
        let master = self.current()?;
        let reply = master.conn.clone().req_packed_command(cmd).await?;
        Ok((master, reply))
    }

    /// `count` commands in one pipeline on the master.
    pub(crate) async fn query_many(
        &self,
        pipe: &redis::Pipeline,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let master = self.current()?;
        master
            .conn
            .clone()
            .req_packed_commands(pipe, 0, count)
            .await
    }

    /// Loads `script` into the master.
    pub(crate) async fn load(&self, script: &Script) -> RedisResult<()> {
        let master = self.current()?;
        let _sha: String = script
            .prepare_invoke()
            .load_async(&mut master.conn.clone())
            .await?;
        Ok(())
    }

    /// Waits until the replicas have what `master` answered so far (see the module
    /// documentation); `Err` if fewer than needed acknowledged it within the timeout.
    pub(crate) async fn acknowledged(&self, master: &Master) -> RedisResult<()> {
        if !self.url.wait {
            return Ok(());
        }
        let ticket = master.acks.answered.fetch_add(1, Ordering::AcqRel) + 1;
        let mut last = master.acks.last.lock().await;
        // Read after the lock: a ROLE that raised it meanwhile counts for this admission.
        let needed = master.replicas.load(Ordering::Acquire);
        if needed == 0 {
            return Ok(());
        }
        if last.upto < ticket || last.needed < needed {
            // Every admission numbered so far was answered before this WAIT is sent.
            let upto = master.acks.answered.load(Ordering::Acquire);
            let replicas: i64 = redis::cmd("WAIT")
                .arg(needed)
                .arg(self.wait_ms)
                .query_async(&mut master.conn.clone())
                .await?;
            *last = Covered {
                upto,
                needed,
                replicas,
            };
        }
        if last.replicas >= needed {
            return Ok(());
        }
        Err(RedisError::from((
            ErrorKind::ReadOnly,
            "admission not acknowledged by the replicas",
            format!(
                "{} of the {needed} replicas of {} had it within {} ms (WAIT): one may have been promoted",
                last.replicas, master.addr, self.wait_ms
            ),
        )))
    }
}

impl Master {
    /// `ROLE`: `Ok` if this server is a master; the replicas it lists raise those each
    /// admission must reach.
    async fn role(&self) -> RedisResult<()> {
        let reply = self
            .conn
            .clone()
            .req_packed_command(&redis::cmd("ROLE"))
            .await?;
        let text = |v: Option<&Value>| match v {
            Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            Some(Value::SimpleString(s)) => s.clone(),
            _ => String::new(),
        };
        let (role, replicas) = match &reply {
            Value::Array(items) => (
                text(items.first()),
                match items.get(2) {
                    Some(Value::Array(replicas)) => replicas.len(),
                    _ => 0,
                },
            ),
            _ => (String::new(), 0),
        };
        if role != "master" {
            return Err(RedisError::from((
                ErrorKind::ReadOnly,
                "the Sentinels' master is not a master",
                format!("{} answers ROLE {role:?}", self.addr),
            )));
        }
        self.replicas.fetch_max(
            i64::try_from(replicas).unwrap_or(i64::MAX),
            Ordering::AcqRel,
        );
        Ok(())
    }
}

fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}
