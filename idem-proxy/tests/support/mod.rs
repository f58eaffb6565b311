//! Processes the proxy tests start: upstreams in Python and Node, and the proxy itself, each
//! over real TCP on a port the OS chose, each killed when its handle drops.

#![allow(dead_code)] // each test file uses its part

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

/// A child process, killed (by its pid) on drop.
pub struct Proc {
    pub child: Child,
    _stdout: BufReader<ChildStdout>,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }
}

fn upstream_script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/upstream")
        .join(name)
}

/// Starts `cmd` and reads its first line of output.
fn start(mut cmd: Command) -> (Proc, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(!line.is_empty(), "{cmd:?} printed nothing");
    (
        Proc {
            child,
            _stdout: stdout,
        },
        line.trim().to_owned(),
    )
}

/// An upstream (Python, standard library) on `port` (0: any); its base URL.
pub fn python_upstream(port: u16) -> (Proc, String) {
    let mut cmd = Command::new("python3");
    cmd.arg(upstream_script("upstream.py"))
        .arg(port.to_string());
    let (p, line) = start(cmd);
    let port = line.strip_prefix("listening ").expect(&line);
    (p, format!("http://127.0.0.1:{port}"))
}

/// An upstream in Node (its `http` module); its base URL.
pub fn node_upstream() -> (Proc, String) {
    let mut cmd = Command::new("node");
    cmd.arg(upstream_script("upstream.js")).arg("0");
    let (p, line) = start(cmd);
    let port = line.strip_prefix("listening ").expect(&line);
    (p, format!("http://127.0.0.1:{port}"))
}

/// A running proxy: its base URL and its admin one.
pub struct Proxy {
    pub proc: Proc,
    pub url: String,
    pub admin: String,
}

/// The proxy's command with `args`.
pub fn proxy_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem-proxy"));
    cmd.args(args).env("IDEM_PROXY_LOG", "warn");
    for (k, _) in std::env::vars() {
        if k.starts_with("IDEM_PROXY_") && k != "IDEM_PROXY_LOG" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Starts a proxy in front of `upstream` with `args` (a store, a principal…).
pub fn proxy(upstream: &str, args: &[&str]) -> Proxy {
    let mut all = vec![
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
    ];
    all.extend_from_slice(args);
    let (proc, line) = start(proxy_command(&all));
    // idem-proxy listening on http://A (admin http://B) for …
    let url = line.split_whitespace().nth(3).expect(&line).to_owned();
    let admin = line
        .split("(admin ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .expect(&line)
        .to_owned();
    Proxy { proc, url, admin }
}

/// A free port on loopback (nothing listens on it when this returns).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A key no other test run uses.
pub fn unique_key(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("\"{name}-{}-{nanos}\"", std::process::id())
}
