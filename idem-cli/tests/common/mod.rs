//! Runs the built `idem` binary as a process and captures what it says.
#![allow(dead_code)]

pub mod parked;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// What one run of the tool produced.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts the exit code, showing everything the tool said when it differs.
    pub fn expect(self, code: i32) -> Run {
        assert_eq!(self.code, code, "exit code of idem; it said:\n{self:#?}");
        self
    }

    /// The stdout as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}):\n{self:#?}"))
    }
}

/// Runs `idem` with `args`, none of the IDEM_* variables of the environment leaking in.
pub fn idem(args: &[&str]) -> Run {
    idem_with_env(args, &[])
}

/// Runs `idem` with `args` and the variables `env` set (AWS credentials for DynamoDB Local).
pub fn idem_with_env(args: &[&str], env: &[(String, String)]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env_remove("IDEM_URL")
        .env_remove("IDEM_TABLE")
        .env_remove("IDEM_REDIS_PREFIX")
        .env_remove("IDEM_KEYRING")
        .env_remove("IDEM_DIGEST_SECRET")
        .env_remove("IDEM_OUTBOX_TABLE")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("the idem binary runs");
    Run {
        code: out
            .status
            .code()
            .expect("idem exited by itself, not by a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// The tool pointed at one store: the flags every command of a test repeats.
pub struct Cli {
    flags: Vec<String>,
    env: Vec<(String, String)>,
}

impl Cli {
    /// `--url url`.
    pub fn new(url: &str) -> Cli {
        Cli {
            flags: vec!["--url".into(), url.into()],
            env: Vec::new(),
        }
    }

    /// One more flag and its value (`--table t`, `--prefix p`).
    pub fn with(mut self, flag: &str, value: &str) -> Cli {
        self.flags.push(flag.into());
        self.flags.push(value.into());
        self
    }

    /// One more environment variable for the tool's process.
    #[allow(dead_code)] // only the DynamoDB test sets one
    pub fn env(mut self, name: &str, value: &str) -> Cli {
        self.env.push((name.into(), value.into()));
        self
    }

    /// Runs `idem <flags> <rest>`.
    pub fn run(&self, rest: &[&str]) -> Run {
        let mut args: Vec<&str> = self.flags.iter().map(String::as_str).collect();
        args.extend_from_slice(rest);
        idem_with_env(&args, &self.env)
    }
}

/// A name no other test, process or run uses.
pub fn unique(prefix: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let micros = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
        % 1_000_000_000;
    format!(
        "{prefix}_{}_{}_{micros}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Claims `key` in `name` with a one-hour lease and then "dies": the body never finishes and
/// the future is dropped, so nothing renews or releases the claim. This is the stuck key an
/// operator finds after a crash.
pub async fn leave_stuck_claim(idem: &idem::Idem, name: &'static str, key: &str) {
    let (claimed, started) = tokio::sync::oneshot::channel::<()>();
    let call = idem
        .call(name)
        .key(key)
        .lease(Duration::from_secs(3600))
        .run(async move {
            let _ = claimed.send(());
            std::future::pending::<()>().await;
            Ok::<u32, idem::Error>(0)
        });
    let task = tokio::spawn(call);
    started
        .await
        .expect("the body started, so the key is claimed");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

/// Finishes a call for `key` in `name` with `value`, kept for `ttl`.
pub async fn complete(idem: &idem::Idem, name: &'static str, key: &str, value: u32, ttl: Duration) {
    let out = idem
        .call(name)
        .key(key)
        .ttl(ttl)
        .run(async move { Ok::<_, idem::Error>(value) })
        .await
        .expect("the call succeeds");
    assert!(!out.is_replayed());
}

/// The tool's run as the shared parked-keys scenario takes it.
pub fn out(run: Run) -> parked::Out {
    parked::Out {
        code: run.code,
        stdout: run.stdout,
        stderr: run.stderr,
    }
}
