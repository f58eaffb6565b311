//! `idem check URL` against real servers: idem-proxy in front of a Python upstream passes every
//! check; the same upstream alone fails them, and the command exits non-zero.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};

/// A child process, killed on drop.
struct Proc(Child, #[allow(dead_code)] BufReader<ChildStdout>);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd`; its first line of output.
fn start(mut cmd: Command) -> (Proc, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    (Proc(child, out), line.trim().to_owned())
}

fn upstream() -> (Proc, String) {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../idem-proxy/tests/upstream/upstream.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg("0");
    let (p, line) = start(cmd);
    let port = line.strip_prefix("listening ").expect(&line).to_owned();
    (p, format!("http://127.0.0.1:{port}"))
}

/// idem-proxy, built beside this binary by the workspace's build.
fn proxy(upstream: &str) -> (Proc, String) {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_idem")).with_file_name("idem-proxy");
    assert!(
        exe.exists(),
        "{} is missing: build the workspace's binaries first (cargo build --workspace --all-features)",
        exe.display()
    );
    let mut cmd = Command::new(exe);
    cmd.args([
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "--store",
        "memory",
        "--principal-header",
        "authorization",
    ])
    .env("IDEM_PROXY_LOG", "warn");
    let (p, line) = start(cmd);
    let url = line.split_whitespace().nth(3).expect(&line).to_owned();
    (p, url)
}

fn check(target: &str, count: &str) -> (Option<i32>, serde_json::Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "check",
            target,
            "--count-url",
            count,
            "--as",
            "Authorization: Bearer alice",
            "--as",
            "Authorization: Bearer bob",
            "--json",
        ])
        .output()
        .unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

fn result<'a>(report: &'a serde_json::Value, name: &str) -> &'a str {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == name)
        .and_then(|c| c["result"].as_str())
        .unwrap_or_else(|| panic!("no check {name}: {report}"))
}

#[test]
fn the_proxy_passes_every_check_and_the_bare_upstream_fails() {
    let (_up, up) = upstream();
    let (_px, px) = proxy(&up);
    let count = format!("{up}/count");
    // the upstream takes 300 ms, so that a hang-up after 100 ms is mid-request
    let (code, report) = check(&format!("{px}/charges?delay_ms=300"), &count);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["passed"], true);
    for name in [
        "same-key-twice",
        "another-body",
        "concurrent",
        "hang-up-retry",
        "two-principals",
    ] {
        assert_eq!(result(&report, name), "pass", "{report:#}");
    }

    let (code, report) = check(&format!("{up}/charges?delay_ms=300"), &count);
    assert_eq!(code, Some(6), "{report:#}");
    assert_eq!(report["passed"], false);
    for name in [
        "same-key-twice",
        "another-body",
        "concurrent",
        "hang-up-retry",
    ] {
        assert_eq!(result(&report, name), "fail", "{report:#}");
    }
}

#[test]
fn a_bad_url_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["check", "not a url"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
