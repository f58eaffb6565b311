//! The server killed (`kill -9`) and started again, twice, under load.
//!
//! It runs on a private MariaDB (`mariadb-install-db` into a temporary directory, `mariadbd`
//! on a free port as a child of the test), never on the shared server of
//! `IDEM_TEST_MYSQL_URL`, which other test runs use at the same time; the guard kills the
//! child and removes its directory even if the test panics. InnoDB keeps its default
//! durability (`innodb_flush_log_at_trx_commit=1`): what was committed survives the kill.
//!
//! What is checked: no key's body ran twice; every call either finished or failed with
//! `Error::Store` of kind `Unreachable` (or `InProgress`: its own claim landed but the answer
//! was lost with the server, and the claim lapses after the lease); while the server is down a
//! call fails promptly without running its body; after each restart the pool recovers and
//! every key finishes, then replays.

mod mysql_common;

use idem::store::mysql::MysqlOptions;
use idem::testkit::{unique, Counter};
use idem::{Error, Idem, StoreErrorKind};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A MariaDB server of this test's own.
struct TempMariadb {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

impl TempMariadb {
    /// Installs a data directory and starts the server (the harness checked that MariaDB's
    /// programs are installed).
    fn start() -> TempMariadb {
        let dir = tempfile::tempdir().unwrap();
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.path().join("data").display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if running_as_root() {
            install.arg("--user=root");
        }
        let out = install.output().expect("mariadb-install-db runs");
        assert!(
            out.status.success(),
            "mariadb-install-db failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = TempMariadb {
            dir,
            port,
            child: None,
        };
        server.spawn();
        server
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Starts `mariadbd` on the data directory and waits until it takes connections.
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("server.log"))
            .unwrap();
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", self.path("data").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--socket={}", self.path("sock").display()))
            .arg(format!("--pid-file={}", self.path("pid").display()))
            .args([
                "--bind-address=127.0.0.1",
                // No user accounts to manage: any user connects (root, no password).
                "--skip-grant-tables",
                "--skip-name-resolve",
                "--skip-log-bin",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if running_as_root() {
            cmd.arg("--user=root");
        }
        self.child = Some(cmd.spawn().expect("mariadbd starts"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("mariadbd exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "mariadbd did not listen:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `kill -9`: no shutdown, no flush beyond what InnoDB already made durable.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("server.log")).unwrap_or_default()
    }

    fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TempMariadb {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Default)]
struct Log {
    /// Errors the load met, by kind.
    unreachable: usize,
    in_progress: usize,
    /// The longest a failed call took.
    slowest_failure: Duration,
}

fn server_killed_twice_under_load_runs_no_body_twice_and_recovers((): ()) {
    let mut server = TempMariadb::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let url = server.url("idem_restart");
    rt.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::MySqlConnection::connect(&server.url(""))
            .await
            .unwrap();
        sqlx::raw_sql("CREATE DATABASE idem_restart")
            .execute(&mut conn)
            .await
            .unwrap();
    });
    let store = rt.block_on(async {
        MysqlOptions::from_url(&url)
            .unwrap()
            .max_connections(8)
            .acquire_timeout(Duration::from_millis(300))
            .connect()
            .await
            .unwrap()
    });
    let idem = Idem::from_store(store);
    let name = unique("restart");
    const TASKS: usize = 8;
    const KEYS: usize = 60; // per task
    let counters: Arc<Vec<Counter>> =
        Arc::new((0..TASKS * KEYS).map(|_| Counter::default()).collect());
    let log = Arc::new(Mutex::new(Log::default()));
    let done = Arc::new(AtomicUsize::new(0));

    let load: Vec<_> = (0..TASKS)
        .map(|t| {
            let (idem, name, counters, log, done) = (
                idem.clone(),
                name.clone(),
                counters.clone(),
                log.clone(),
                done.clone(),
            );
            rt.spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(90);
                for i in 0..KEYS {
                    let k = t * KEYS + i;
                    loop {
                        assert!(Instant::now() < deadline, "key {k} never finished");
                        let c = counters[k].clone();
                        let started = Instant::now();
                        let out = idem
                            .call(name.clone())
                            .key(&k)
                            .lease(Duration::from_secs(5))
                            .run(async move {
                                c.hit();
                                // Half the tasks spend their time in a body, half in the
                                // store's statements: a kill finds claims and completions
                                // in flight.
                                if t % 2 == 0 {
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                Ok::<_, Error>(k)
                            })
                            .await;
                        {
                            let mut log = log.lock().unwrap();
                            match out {
                                Ok(v) => {
                                    assert_eq!(v.into_inner(), k);
                                    done.fetch_add(1, Ordering::SeqCst);
                                    break;
                                }
                                Err(e)
                                    if e.store_error_kind()
                                        == Some(StoreErrorKind::Unreachable) =>
                                {
                                    log.unreachable += 1;
                                    log.slowest_failure =
                                        log.slowest_failure.max(started.elapsed());
                                }
                                Err(Error::InProgress { .. }) => log.in_progress += 1,
                                Err(e) => panic!("key {k}: unexpected {e} ({:?})", e.kind()),
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            })
        })
        .collect();

    let wait_for = |n: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.load(Ordering::SeqCst) < n {
            assert!(
                Instant::now() < deadline,
                "{what}: stuck at {}",
                done.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        done.load(Ordering::SeqCst)
    };

    let mut progress = vec![];
    for round in 0..2 {
        let at = progress.last().copied().unwrap_or(0);
        progress.push(wait_for(at + 40, "load before a kill"));
        server.kill();
        // While it is down, a call fails cleanly and promptly, without running its body.
        let probe = Counter::default();
        for p in 0..3 {
            let (c, t) = (probe.clone(), Instant::now());
            let out = rt.block_on(
                idem.call(name.clone())
                    .key(&("probe", round, p))
                    .run(async move { Ok::<_, Error>(c.hit()) }),
            );
            let err = out.expect_err("the server is down");
            assert_eq!(
                err.store_error_kind(),
                Some(StoreErrorKind::Unreachable),
                "while down: {err}"
            );
            assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        }
        assert_eq!(probe.get(), 0);
        std::thread::sleep(Duration::from_millis(300));
        server.spawn();
    }
    rt.block_on(async {
        for l in load {
            l.await.unwrap();
        }
    });
    let log = log.lock().unwrap();
    eprintln!(
        "data dir {}: calls done before each kill {progress:?}, all {} done at the end; the load \
         met {} unreachable errors (slowest {:?}) and {} in-progress answers",
        server.data_dir().display(),
        TASKS * KEYS,
        log.unreachable,
        log.slowest_failure,
        log.in_progress,
    );
    // The kills hit the load: calls failed while the server was down.
    assert!(
        log.unreachable > 0,
        "no call of the load saw the server down"
    );
    for (k, c) in counters.iter().enumerate() {
        assert_eq!(c.get(), 1, "key {k} ran {} times", c.get());
    }
    // Everything replays after recovery.
    rt.block_on(async {
        for k in 0..TASKS * KEYS {
            let out = idem
                .call(name.clone())
                .key(&k)
                .run(async { Ok::<_, Error>(usize::MAX) })
                .await
                .unwrap();
            assert!(out.is_replayed(), "key {k}");
            assert_eq!(out.into_inner(), k);
        }
    });
}

idem_integration::server_tests! {
    // The server is the test's own, on a free port, in a temporary data directory.
    blocking MARIADB_SERVER => [server_killed_twice_under_load_runs_no_body_twice_and_recovers],
}
