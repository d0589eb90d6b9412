//! Each decision reaches Redis at most once: a reply cut by a connection reset after Redis ran
//! the script is an unknown outcome, which follows `on_error`, and is never sent again.
//!
//! A loopback proxy sits between the store and a real redis-server. It reads the RESP commands
//! going to Redis (counting `EVAL` and `EVALSHA`) and the replies coming back (one per command,
//! in order), and once Redis has answered script command number K it resets the store's
//! connection (`SO_LINGER` 0: an RST) instead of relaying that answer. Each test then counts
//! the scripts of the cut call three ways: on the wire (the proxy), in Redis (`INFO
//! commandstats`), and in the key's state (one spend, one refund, one charge, one lease).
//!
//! Each path is covered on one server (checks under `deny` and `local`, refunds, charges,
//! leased renewals and give-backs, decisions at a given time, a probe), and the check on a
//! Cluster and on a master found through Sentinels.
//!
//! Real time (Redis has its own clock): the one sleep that waits for time is the probe test's
//! retry interval; the Cluster and Sentinel tests poll until the servers name the proxies.

#![cfg(feature = "redis")]

mod support;

use std::collections::VecDeque;
use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice::store::{LeaseConfig, LeaseSize, OnError, RedisConfig, RedisStore, Store};
use sluice::Error;
use sluice_core::{AnyAlgorithm, Kind, Quota};
use support::process::unix_ns;
use support::redis::{RedisCluster, RedisSentinels, RedisServer, MASTER_NAME};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// === the proxy ===

/// The length of the RESP value (RESP2 or RESP3) at the start of `buf`, once it is whole.
fn value_len(buf: &[u8]) -> Option<usize> {
    let line = buf.windows(2).position(|w| w == b"\r\n")?;
    let after = line + 2;
    let number = || -> usize {
        let text = std::str::from_utf8(&buf[1..line]).unwrap_or("");
        let n: i64 = text
            .parse()
            .unwrap_or_else(|_| panic!("a RESP length, not {text:?}"));
        // -1: a null string or array, nothing follows.
        usize::try_from(n).unwrap_or(0)
    };
    match buf[0] {
        // Blobs: a length, then that many bytes and CRLF (none for a null).
        b'$' | b'=' | b'!' => {
            let n = number();
            if buf[1] == b'-' {
                return Some(after);
            }
            let end = after + n + 2;
            (buf.len() >= end).then_some(end)
        }
        // Aggregates: a count, then that many values (twice that many for maps).
        kind @ (b'*' | b'~' | b'>' | b'%' | b'|') => {
            let n = number();
            let count = if matches!(kind, b'%' | b'|') {
                2 * n
            } else {
                n
            };
            let mut at = after;
            for _ in 0..count {
                at += value_len(&buf[at..])?;
            }
            Some(at)
        }
        // Simple strings, errors, numbers, nulls, booleans: one line.
        _ => Some(after),
    }
}

/// The name (upper case) of a whole RESP command: an array whose first element is a blob.
fn command_name(cmd: &[u8]) -> String {
    let first = value_len(cmd)
        .and_then(|_| {
            let head = cmd.windows(2).position(|w| w == b"\r\n")? + 2;
            let blob = &cmd[head..];
            let line = blob.windows(2).position(|w| w == b"\r\n")?;
            let len: usize = std::str::from_utf8(&blob[1..line]).ok()?.parse().ok()?;
            blob.get(line + 2..line + 2 + len)
        })
        .unwrap_or_default();
    String::from_utf8_lossy(first).to_ascii_uppercase()
}

/// What the proxy saw, over every connection, and which reply it is told to cut.
#[derive(Default)]
struct Seen {
    /// `EVAL` and `EVALSHA` commands forwarded to Redis.
    scripts: AtomicU64,
    /// The number of the script command whose reply is cut (0: none).
    cut: AtomicU64,
    /// Replies cut so far.
    cuts: AtomicU64,
}

/// A TCP proxy on 127.0.0.1 in front of one Redis that resets the client's connection in
/// place of the reply to one script command.
struct CutProxy {
    port: u16,
    seen: Arc<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    async fn start(redis_port: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", redis_port)).await else {
                        continue;
                    };
                    tokio::spawn(relay(client, server, Arc::clone(&seen)));
                }
            }
        });
        CutProxy { port, seen, task }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The script commands forwarded to Redis so far.
    fn scripts(&self) -> u64 {
        self.seen.scripts.load(Ordering::SeqCst)
    }

    /// Cuts the reply to the next script command (number K = those seen so far + 1).
    fn cut_next_script(&self) {
        self.seen.cut.store(self.scripts() + 1, Ordering::SeqCst);
    }

    /// The replies cut so far.
    fn cuts(&self) -> u64 {
        self.seen.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relays one connection both ways, reading whole commands up and whole replies down (one
/// reply per command, in order), until either side closes or the reply to cut has come back
/// from Redis: then the client's connection is reset and Redis's closed.
async fn relay(mut client: TcpStream, mut server: TcpStream, seen: Arc<Seen>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // For each command sent and not answered yet: whether its reply is to be cut.
    let pending = Mutex::new(VecDeque::<bool>::new());
    let cut = {
        let (mut client_read, mut client_write) = client.split();
        let (mut server_read, mut server_write) = server.split();
        let up = async {
            let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 64 * 1024]);
            loop {
                let n = match client_read.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                let mut whole = 0;
                while let Some(len) = value_len(&buf[whole..]) {
                    let name = command_name(&buf[whole..whole + len]);
                    let mut cut = false;
                    if name == "EVALSHA" || name == "EVAL" {
                        let number = seen.scripts.fetch_add(1, Ordering::SeqCst) + 1;
                        cut = number == seen.cut.load(Ordering::SeqCst);
                    }
                    // Before the command leaves: its reply cannot come back earlier.
                    pending.lock().unwrap().push_back(cut);
                    whole += len;
                }
                if server_write.write_all(&buf[..whole]).await.is_err() {
                    return;
                }
                buf.drain(..whole);
            }
        };
        let down = async {
            let (mut buf, mut chunk) = (Vec::new(), vec![0u8; 64 * 1024]);
            loop {
                let n = match server_read.read(&mut chunk).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                let mut whole = 0;
                let mut cut = false;
                while let Some(len) = value_len(&buf[whole..]) {
                    // A value with no command waiting (a Sentinel's pub/sub message) is relayed.
                    if pending.lock().unwrap().pop_front().unwrap_or(false) {
                        cut = true;
                        break;
                    }
                    whole += len;
                }
                // The replies before the one cut still go back.
                if client_write.write_all(&buf[..whole]).await.is_err() {
                    return false;
                }
                if cut {
                    seen.cuts.fetch_add(1, Ordering::SeqCst);
                    return true;
                }
                buf.drain(..whole);
            }
        };
        tokio::select! {
            () = up => false,
            cut = down => cut,
        }
    };
    if cut {
        // Closed with SO_LINGER 0: the client's side gets an RST, not a FIN.
        let _ = client.set_zero_linger();
    }
}

// === helpers ===

/// Held by the tests that start many processes (a Cluster, Sentinels), so that on a small
/// machine they do not start at once.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn gcra(capacity: u64, rate: &str) -> AnyAlgorithm {
    AnyAlgorithm::new(Kind::Gcra, Quota::parse(capacity, rate).unwrap())
}

/// A store of 10 per minute (GCRA) under `on_error`, over `config`'s connection.
async fn store_with(config: RedisConfig, on_error: OnError) -> RedisStore {
    let config = config
        .on_error(on_error)
        // Generous for a debug build on a loaded machine: no answer here is ever slow.
        .timeout(Duration::from_millis(500))
        // Far beyond the test: a store that found Redis answering after the cut keeps using it.
        .retry_interval(Duration::from_secs(60));
    RedisStore::connect(gcra(10, "1/min"), config)
        .await
        .unwrap()
}

/// How often one call's script reached Redis.
#[derive(Debug, PartialEq, Eq)]
struct Sent {
    /// `EVALSHA`/`EVAL` seen going to Redis by the proxy.
    wire: u64,
    /// Script calls Redis counted (`INFO commandstats`).
    redis: u64,
}

const ONCE: Sent = Sent { wire: 1, redis: 1 };

/// Runs `call` with the reply to its (first) script cut: what it returned, and how often its
/// script reached Redis, printed under `label`.
async fn cut<T>(
    label: &str,
    proxy: &CutProxy,
    server: &RedisServer,
    call: impl Future<Output = T>,
) -> (T, Sent) {
    let (wire, redis, cuts) = (proxy.scripts(), server.script_calls(), proxy.cuts());
    proxy.cut_next_script();
    let out = call.await;
    assert_eq!(proxy.cuts(), cuts + 1, "{label}: the proxy cut one reply");
    let sent = Sent {
        wire: proxy.scripts() - wire,
        redis: server.script_calls() - redis,
    };
    eprintln!(
        "{label}: script on the wire {}, run by Redis {}",
        sent.wire, sent.redis
    );
    (out, sent)
}

fn unavailable<T: std::fmt::Debug>(answer: &Result<T, Error>) -> bool {
    matches!(answer, Err(Error::Unavailable { .. }))
}

// === one server ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_reply_is_cut_runs_once_and_is_denied_under_deny() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    let store = store_with(RedisConfig::new(proxy.url()), OnError::Deny).await;
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    let (answer, sent) = cut("check, deny", &proxy, &server, store.check("k", 1)).await;
    assert_eq!(sent, ONCE, "the cut check reached Redis once");
    assert!(unavailable(&answer), "on_error = deny: {answer:?}");
    assert!(
        store.is_using_redis(),
        "Redis answers over a new connection"
    );
    // Spent once: 8 left before this one.
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_whose_reply_is_cut_runs_once_and_is_decided_locally_under_local() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    let store = store_with(RedisConfig::new(proxy.url()), OnError::Local).await;
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    let (answer, sent) = cut("check, local", &proxy, &server, store.check("k", 3)).await;
    assert_eq!(sent, ONCE, "the cut check reached Redis once");
    // The local store has not seen the key: it takes the 3 from a full bucket.
    let local = answer.expect("on_error = local admits from the local store");
    assert_eq!((local.allowed, local.remaining), (true, 7));
    // In Redis, spent once: 6 left before this one.
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_whose_reply_is_cut_is_given_back_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    let store = store_with(RedisConfig::new(proxy.url()), OnError::Deny).await;
    assert_eq!(store.check("k", 4).await.unwrap().remaining, 6);
    let ((), sent) = cut(
        "refund",
        &proxy,
        &server,
        store.refund("k", 2, Duration::ZERO),
    )
    .await;
    assert_eq!(sent, ONCE, "the cut refund reached Redis once");
    // Given back once: 8, not 10.
    assert_eq!(store.peek("k").await.unwrap().remaining, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_whose_reply_is_cut_is_taken_once_and_reported_forgiven() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    let store = store_with(RedisConfig::new(proxy.url()), OnError::Deny).await;
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    let (forgiven, sent) = cut("charge", &proxy, &server, store.charge("k", 3, u64::MAX)).await;
    assert_eq!(sent, ONCE, "the cut charge reached Redis once");
    // Unanswered: the whole cost is reported forgiven (`Store::charge`).
    assert_eq!(forgiven, 3);
    // Taken once: 6, not 3.
    assert_eq!(store.peek("k").await.unwrap().remaining, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_renewal_and_a_give_back_whose_replies_are_cut_run_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    // Slices of one token: each check past the first renews (gives back, takes the next).
    let lease = LeaseConfig::new(LeaseSize::Tokens(1), Duration::from_secs(30));
    let leased = store_with(RedisConfig::new(proxy.url()).lease(lease), OnError::Deny).await;
    // A store without leases on the same keys, straight to Redis: it counts held tokens as taken.
    let plain = store_with(RedisConfig::new(server.url()), OnError::Deny).await;
    leased.check("k", 1).await.unwrap();
    let (answer, sent) = cut("leased check", &proxy, &server, leased.check("k", 1)).await;
    assert_eq!(sent, ONCE, "the cut renewal reached Redis once");
    assert!(unavailable(&answer), "on_error = deny: {answer:?}");
    // The first slice debited (1), the one the cut renewal took held (1). A renewal run
    // twice would settle that slice as spent and hold another: 7.
    assert_eq!(plain.peek("k").await.unwrap().remaining, 8);

    // The next renewal settles the slice the cut one took (as spent) and takes another.
    leased.check("k", 1).await.unwrap();
    let ((), sent) = cut(
        "leases given back",
        &proxy,
        &server,
        leased.give_back_leases(),
    )
    .await;
    assert_eq!(sent, ONCE, "the cut give-back reached Redis once");
    assert_eq!(plain.peek("k").await.unwrap().remaining, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_at_a_given_time_whose_replies_are_cut_run_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    let store = store_with(RedisConfig::new(proxy.url()), OnError::Deny).await;
    let now = unix_ns();
    let (answer, sent) = cut("check_at", &proxy, &server, store.check_at("k", 1, now)).await;
    assert_eq!(sent, ONCE);
    assert!(unavailable(&answer), "{answer:?}");
    let (answer, sent) = cut(
        "charge_at",
        &proxy,
        &server,
        store.charge_at("k", 2, u64::MAX, now),
    )
    .await;
    assert_eq!(sent, ONCE);
    assert!(unavailable(&answer), "{answer:?}");
    let refund = store.refund_at("k", 1, Duration::ZERO, now);
    let (answer, sent) = cut("refund_at", &proxy, &server, refund).await;
    assert_eq!(sent, ONCE);
    assert!(unavailable(&answer), "{answer:?}");
    // 10 - 1 - 2 + 1, each once.
    assert_eq!(store.check_at("k", 0, now).await.unwrap().remaining, 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_whose_reply_is_cut_runs_once() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let proxy = CutProxy::start(server.port()).await;
    let retry = Duration::from_millis(100);
    let config = RedisConfig::new(proxy.url())
        .on_error(OnError::Deny)
        .timeout(Duration::from_millis(300))
        .retry_interval(retry);
    let store = RedisStore::connect(gcra(10, "1/min"), config)
        .await
        .unwrap();
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    // A stopped Redis: no answer within the timeout, Redis left alone for the retry interval.
    server.signal("STOP");
    let stopped = store.check("k", 1).await;
    server.signal("CONT");
    assert!(unavailable(&stopped), "{stopped:?}");
    assert!(!store.is_using_redis());
    // Once resumed, Redis runs the request it held (a spend) at once; the next request after
    // the retry interval is the probe.
    let resumed = Instant::now();
    tokio::time::sleep(retry + Duration::from_millis(50)).await;
    let (answer, sent) = cut("probe", &proxy, &server, store.check("k", 1)).await;
    assert_eq!(sent, ONCE, "the cut probe reached Redis once");
    assert!(unavailable(&answer), "on_error = deny: {answer:?}");
    assert!(store.is_using_redis(), "the probe found Redis answering");
    // 10 - 1 - 1 (held while stopped) - 1 (the probe), each once.
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 6);
    assert!(resumed.elapsed() < Duration::from_secs(5));
}

// === a Cluster, and a master found through Sentinels ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_on_a_cluster_whose_reply_is_cut_runs_once() {
    let _heavy = HEAVY.lock().await;
    let Some(cluster) = tokio::task::spawn_blocking(|| RedisCluster::start(3))
        .await
        .unwrap()
    else {
        return;
    };
    // Each master behind its own proxy, and announcing the proxy's port, so that the client
    // reaches every node through a proxy.
    let mut proxies = Vec::new();
    for node in &cluster.nodes {
        let proxy = CutProxy::start(node.port()).await;
        let bus = (node.port() + 10_000).to_string();
        for (name, value) in [
            ("cluster-announce-ip", "127.0.0.1".to_string()),
            ("cluster-announce-bus-port", bus),
            ("cluster-announce-port", proxy.port.to_string()),
        ] {
            assert!(node.cli(&["CONFIG", "SET", name, &value]).contains("OK"));
        }
        proxies.push(proxy);
    }
    let announced = Instant::now();
    while !cluster.nodes.iter().all(|n| {
        let slots = n.cli(&["CLUSTER", "SLOTS"]);
        proxies.iter().all(|p| slots.contains(&p.port.to_string()))
    }) {
        assert!(
            announced.elapsed() < Duration::from_secs(10),
            "the nodes did not learn each other's proxies"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let urls: Vec<String> = proxies.iter().map(CutProxy::url).collect();
    let store = store_with(RedisConfig::cluster(urls), OnError::Deny).await;
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    let i = (0..proxies.len())
        .find(|&i| proxies[i].scripts() > 0)
        .expect("the check went through a proxy");
    let (answer, sent) = cut(
        "check, cluster",
        &proxies[i],
        &cluster.nodes[i],
        store.check("k", 1),
    )
    .await;
    assert_eq!(sent, ONCE, "the cut check reached its master once");
    assert!(unavailable(&answer), "on_error = deny: {answer:?}");
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_through_sentinels_whose_reply_is_cut_runs_once() {
    let _heavy = HEAVY.lock().await;
    let Some(set) = tokio::task::spawn_blocking(|| RedisSentinels::start(0))
        .await
        .unwrap()
    else {
        return;
    };
    let master = &set.servers[0];
    let proxy = CutProxy::start(master.port()).await;
    // The Sentinels watch the master at the proxy's address, and name that one.
    let port = proxy.port.to_string();
    for sentinel in &set.ports {
        let cli = |args: &[&str]| {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &sentinel.to_string()])
                .args(args)
                .output()
                .expect("run redis-cli");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        assert!(cli(&["SENTINEL", "REMOVE", MASTER_NAME]).contains("OK"));
        let monitor = ["SENTINEL", "MONITOR", MASTER_NAME, "127.0.0.1", &port, "2"];
        assert!(cli(&monitor).contains("OK"));
    }
    let watched = Instant::now();
    while !set.ports.iter().all(|&p| {
        let fields = set.sentinel_master(p);
        fields.get("port") == Some(&port)
            && fields.get("flags").map(String::as_str) == Some("master")
    }) {
        assert!(
            watched.elapsed() < Duration::from_secs(10),
            "the Sentinels did not watch the proxy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = store_with(RedisConfig::new(set.url()), OnError::Deny).await;
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 9);
    let (answer, sent) = cut("check, sentinel", &proxy, master, store.check("k", 1)).await;
    assert_eq!(sent, ONCE, "the cut check reached the master once");
    assert!(unavailable(&answer), "on_error = deny: {answer:?}");
    assert_eq!(store.check("k", 1).await.unwrap().remaining, 7);
}
