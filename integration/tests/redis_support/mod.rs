//! Private, temporary redis-server processes for the Redis store's tests and bench.
//!
//! The shared server on 6379 is used by other test runs at the same time, so anything that
//! kills connections, restarts a server, counts commands or needs special settings runs on a
//! server of its own, on a free loopback port, stopped when its guard drops (even on a panic).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A redis-server this test started. Dropping it stops the server.
pub struct TempRedis {
    child: Option<Child>,
    /// Its port on 127.0.0.1.
    pub port: u16,
    args: Vec<String>,
    #[allow(dead_code)]
    dir: tempfile::TempDir,
}

/// A port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().unwrap().port()
}

impl TempRedis {
    /// Starts a server without persistence and with `extra` settings (`["--requirepass", "x"]`).
    /// The tests that call it are in the harness's `REDIS_SERVER` group: they run only where
    /// `redis-server` is installed.
    pub fn start(extra: &[&str]) -> TempRedis {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let mut args: Vec<String> = [
                "--bind",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                dir.path().to_str().unwrap(),
                "--logfile",
                "",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut t = TempRedis {
                child: None,
                port,
                args,
                dir,
            };
            match t.spawn() {
                Ok(()) => return t,
                Err(e) => last = e,
            }
        }
        panic!("could not start a temporary redis-server: {last}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err(format!("redis-server exited at once: {status}"));
            }
            if self.answers() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err("redis-server did not answer within 10 s".into())
    }

    /// True when the server answers PING (with PONG, or with an auth error: it is up).
    pub fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
        if s.write_all(b"PING\r\n").is_err() {
            return false;
        }
        let mut buf = [0u8; 64];
        matches!(s.read(&mut buf), Ok(n) if n > 0)
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Stops the server abruptly (`SHUTDOWN NOSAVE`, then a kill if it lingers).
    pub fn shutdown(&mut self) {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
            let _ = s.write_all(b"SHUTDOWN NOSAVE\r\n");
        }
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port, with the same settings (and, having no
    /// persistence, with no keys).
    pub fn restart(&mut self) {
        self.shutdown();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!("restart redis-server: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Kills the server (SIGKILL): a crash, with no chance to answer or replicate.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for TempRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Six cluster-mode servers on free ports, joined as three primaries with a replica each.
pub struct TempCluster {
    /// The nodes, in the order they were started (which are primaries changes on a failover).
    pub nodes: Vec<TempRedis>,
}

impl TempCluster {
    /// Starts six nodes and creates the cluster (`redis-cli --cluster create … --cluster-replicas
    /// 1`); returns once every node says `cluster_state:ok` and every replica is in sync.
    pub fn start() -> TempCluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            nodes.push(TempRedis::start(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "1000",
                // Replicas sync at once instead of after 5 s.
                "--repl-diskless-sync-delay",
                "0",
            ]));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = TempCluster { nodes };
        cluster.wait_ok(&(0..6).collect::<Vec<_>>());
        cluster
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TempRedis::url).collect()
    }

    /// `redis-cli -p <node's port> ARGS`: its standard output.
    pub fn cli(&self, node: usize, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &self.nodes[node].port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until every node in `alive` says `cluster_state:ok`.
    pub fn wait_ok(&self, alive: &[usize]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for &n in alive {
            while !self
                .cli(n, &["cluster", "info"])
                .contains("cluster_state:ok")
            {
                assert!(
                    Instant::now() < deadline,
                    "node {n} never reached cluster_state:ok"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // A replica's first sync waits for repl-diskless-sync-delay (5 s by default): until it is
        // online, a primary's WAIT counts no replica.
        for &n in alive {
            loop {
                let info = self.cli(n, &["info", "replication"]);
                let primary = info.contains("role:master");
                let orphan = info.contains("connected_slaves:0");
                if !primary || info.contains("state=online") || (orphan && alive.len() < 6) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "node {n}'s replica never came in sync"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// The index of a node that is a primary now.
    pub fn a_primary(&self) -> usize {
        (0..self.nodes.len())
            .find(|&n| self.cli(n, &["role"]).starts_with("master"))
            .expect("a primary")
    }
}

/// A raw redis-rs connection (for fault injection and inspection).
pub async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("raw connection")
}

/// `INFO commandstats` as `(command, calls)` pairs.
pub async fn commandstats(con: &mut redis::aio::MultiplexedConnection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, stats) = rest.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_string(), calls))
        })
        .collect()
}
