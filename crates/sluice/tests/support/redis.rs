//! Real `redis-server` processes on free ports of 127.0.0.1, in temporary directories, without
//! persistence, killed on drop: one server, a Cluster of masters, or a master with replicas
//! watched by `redis-sentinel` processes.
//!
//! Without redis-server (or redis-sentinel) the tests that need it are skipped, except under
//! `CI=true`, where they fail: CI installs them (scripts/test), so their absence there is a
//! broken machine, not a reason to pass.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SERVER: &str = "redis-server";
const SENTINEL: &str = "redis-sentinel";
const CLI: &str = "redis-cli";

/// Whether redis-server can be run here; under `CI=true` its absence is a failure.
pub fn available() -> bool {
    installed(SERVER)
}

/// Whether `program` (redis-server, redis-sentinel) runs here; under `CI=true` its absence is
/// a failure.
fn installed(program: &str) -> bool {
    let found = Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{program} is not installed; CI=true, so this fails instead of skipping (scripts/test installs it)");
        }
        eprintln!("skipped: {program} is not installed (install it, or run scripts/test)");
    }
    found
}

/// A directory under the system's temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(label: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "sluice-{label}-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            // The time too: a directory left by an earlier run under a reused pid is not reused.
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&path).expect("create a temporary directory");
        TempDir(path)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port on 127.0.0.1 that nobody listens on (and, for a Cluster node, its bus port + 10000).
fn free_port(cluster: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = listener.local_addr().unwrap().port();
        if !cluster {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One redis-server process.
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    cluster: bool,
    /// `cluster-node-timeout`, in milliseconds: how long a Cluster node may not answer before
    /// it is failed over.
    node_timeout_ms: u32,
    /// More arguments (`--replicaof HOST PORT`).
    extra: Vec<String>,
    dir: TempDir,
}

impl RedisServer {
    /// A server on a free port, answering `PING`; `None` (skip) if redis-server is missing.
    pub fn start() -> Option<RedisServer> {
        if !available() {
            return None;
        }
        Some(RedisServer::spawn(free_port(false), false, 5000))
    }

    fn spawn(port: u16, cluster: bool, node_timeout_ms: u32) -> RedisServer {
        RedisServer::spawn_with(port, cluster, node_timeout_ms, Vec::new())
    }

    fn spawn_with(
        port: u16,
        cluster: bool,
        node_timeout_ms: u32,
        extra: Vec<String>,
    ) -> RedisServer {
        let mut server = RedisServer {
            child: None,
            port,
            cluster,
            node_timeout_ms,
            extra,
            dir: TempDir::new("redis"),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let dir = self.dir.path();
        let mut cmd = Command::new(SERVER);
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            // A replica that must copy everything copies it at once (not 5 s later).
            .args(["--repl-diskless-sync-delay", "0"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .stdin(Stdio::null());
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes", "--cluster-node-timeout"])
                .arg(self.node_timeout_ms.to_string())
                .arg("--cluster-config-file")
                .arg(dir.join("nodes.conf"));
        }
        self.child = Some(cmd.spawn().expect("start redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer within 10 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it answers `PING` now.
    pub fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect_timeout(
            &([127, 0, 0, 1], self.port).into(),
            Duration::from_millis(200),
        ) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server is running").id()
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process: SIGSTOP makes it stop answering while
    /// its connections stay open, as a hung server does.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.pid());
    }

    /// Starts again on the same port (empty: no persistence).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// Runs redis-cli against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(CLI)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// How many times `EVALSHA` and `EVAL` ran on this server so far.
    pub fn script_calls(&self) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]);
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split([':', ','])
                    .find_map(|f| f.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
            })
            .sum()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A Redis Cluster, every slot assigned: masters, and optionally replicas of each.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` servers joined with `redis-cli --cluster create`, once `cluster_state:ok`
    /// everywhere; `None` (skip) if redis-server is missing.
    pub fn start(masters: usize) -> Option<RedisCluster> {
        RedisCluster::start_with_replicas(masters, 0, 5000)
    }

    /// `masters` masters with `replicas` replicas each (`--cluster-replicas`), every node with
    /// `cluster-node-timeout` `node_timeout_ms`, once `cluster_state:ok` everywhere and every
    /// replica is in sync with its master; `None` (skip) if redis-server is missing.
    pub fn start_with_replicas(
        masters: usize,
        replicas: usize,
        node_timeout_ms: u32,
    ) -> Option<RedisCluster> {
        if !available() {
            return None;
        }
        let mut nodes: Vec<RedisServer> = Vec::new();
        while nodes.len() < masters * (1 + replicas) {
            let port = free_port(true);
            if nodes.iter().any(|n| n.port == port) {
                continue;
            }
            nodes.push(RedisServer::spawn(port, true, node_timeout_ms));
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new(CLI)
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = nodes.iter().all(|n| {
                let replication = n.cli(&["INFO", "replication"]);
                let synced = !replication.contains("role:slave")
                    || replication.contains("master_link_status:up");
                synced && n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
            if ok {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cluster_state:ok not reached in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(RedisCluster { nodes })
    }

    /// The nodes that are masters now (`ROLE`), by index into `nodes`.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                self.nodes[i].child.is_some()
                    && self.nodes[i].cli(&["ROLE"]).lines().next() == Some("master")
            })
            .collect()
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Keys on each node (`DBSIZE`), to see that keys spread over the masters.
    pub fn keys_per_node(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|n| n.cli(&["DBSIZE"]).trim().parse().unwrap_or(0))
            .collect()
    }
}

/// A master, its replicas and three `redis-sentinel` processes watching it under the name
/// `mymaster` (quorum 2), every process on a free port of 127.0.0.1.
pub struct RedisSentinels {
    /// The master first, then the replicas.
    pub servers: Vec<RedisServer>,
    /// The Sentinels' ports.
    pub ports: Vec<u16>,
    sentinels: Vec<Child>,
    _dirs: Vec<TempDir>,
}

/// The master name the Sentinels watch.
pub const MASTER_NAME: &str = "mymaster";

impl RedisSentinels {
    /// A master with `replicas` replicas (in sync) and three Sentinels that all see them and
    /// each other; `None` (skip) if redis-server or redis-sentinel is missing.
    pub fn start(replicas: usize) -> Option<RedisSentinels> {
        if !available() || !installed(SENTINEL) {
            return None;
        }
        let master = RedisServer::spawn(free_port(false), false, 5000);
        let mut servers = vec![master];
        for _ in 0..replicas {
            let of = servers[0].port.to_string();
            servers.push(RedisServer::spawn_with(
                free_port(false),
                false,
                5000,
                vec!["--replicaof".into(), "127.0.0.1".into(), of],
            ));
        }
        let mut set = RedisSentinels {
            servers,
            ports: Vec::new(),
            sentinels: Vec::new(),
            _dirs: Vec::new(),
        };
        for _ in 0..3 {
            let port = free_port(false);
            let dir = TempDir::new("sentinel");
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n",
                    dir = dir.path().display(),
                    master = set.servers[0].port,
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new(SENTINEL)
                .arg(&conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .stdin(Stdio::null())
                .spawn()
                .expect("start redis-sentinel");
            set.sentinels.push(child);
            set.ports.push(port);
            set._dirs.push(dir);
        }
        // Ready: every replica in sync, and every Sentinel sees them all and the others.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let synced = set.servers[1..].iter().all(|r| {
                r.cli(&["INFO", "replication"])
                    .contains("master_link_status:up")
            });
            let seen = set.ports.iter().all(|&p| {
                let fields = set.sentinel_master(p);
                fields.get("num-slaves").map(String::as_str) == Some(&replicas.to_string())
                    && fields.get("num-other-sentinels").map(String::as_str) == Some("2")
            });
            if synced && seen {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the Sentinels did not see the master, its {replicas} replicas and each other within 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(set)
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/mymaster`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// What the Sentinel on `port` knows of the master (`SENTINEL MASTER mymaster`).
    pub fn sentinel_master(&self, port: u16) -> std::collections::HashMap<String, String> {
        let out = Command::new(CLI)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["SENTINEL", "MASTER", MASTER_NAME])
            .output()
            .expect("run redis-cli");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_string(), c[1].to_string()))
            .collect()
    }

    /// The servers that answer `ROLE` with `master` now, by index into `servers`.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.servers.len())
            .filter(|&i| self.servers[i].cli(&["ROLE"]).lines().next() == Some("master"))
            .collect()
    }

    /// `SENTINEL FAILOVER mymaster` on the first Sentinel (again while it answers that no
    /// replica is ready yet).
    pub fn failover(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let out = Command::new(CLI)
                .args(["-h", "127.0.0.1", "-p", &self.ports[0].to_string()])
                .args(["SENTINEL", "FAILOVER", MASTER_NAME])
                .output()
                .expect("run redis-cli");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if text.trim() == "OK" {
                return;
            }
            assert!(Instant::now() < deadline, "SENTINEL FAILOVER: {text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
