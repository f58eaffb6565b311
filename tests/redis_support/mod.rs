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

/// True when `redis-server` can be run. When it cannot: a skip line, or a panic under
/// `IDEM_REQUIRE_SERVICES=1` (CI), so a missing server never passes silently.
pub fn have_redis_server() -> bool {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("IDEM_REQUIRE_SERVICES").as_deref() == Ok("1") {
            panic!("IDEM_REQUIRE_SERVICES=1 but redis-server is not installed");
        }
        eprintln!("skipped: redis-server is not installed");
    }
    ok
}

/// A port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().unwrap().port()
}

impl TempRedis {
    /// Starts a server without persistence and with `extra` settings (`["--requirepass", "x"]`),
    /// or `None` (skip) when redis-server is not installed.
    pub fn start(extra: &[&str]) -> Option<TempRedis> {
        if !have_redis_server() {
            return None;
        }
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
                Ok(()) => return Some(t),
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

    fn kill(&mut self) {
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
