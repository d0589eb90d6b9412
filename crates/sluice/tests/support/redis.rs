//! Real `redis-server` processes on free ports of 127.0.0.1, in temporary directories, without
//! persistence, killed on drop: one server, or a Cluster of masters.
//!
//! Without redis-server the tests that need it are skipped, except under `CI=true`, where they
//! fail: CI installs it (scripts/test), so its absence there is a broken machine, not a reason
//! to pass.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const SERVER: &str = "redis-server";
const CLI: &str = "redis-cli";

/// Whether redis-server can be run here; under `CI=true` its absence is a failure.
pub fn available() -> bool {
    let found = Command::new(SERVER)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("redis-server is not installed; CI=true, so this fails instead of skipping (scripts/test installs it)");
        }
        eprintln!("skipped: redis-server is not installed (install it, or run scripts/test)");
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
        let mut server = RedisServer {
            child: None,
            port,
            cluster,
            node_timeout_ms,
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
