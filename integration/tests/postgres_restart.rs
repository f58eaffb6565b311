//! The server stopped and started during a load run, on a PostgreSQL server of the test's own
//! (`initdb` and `pg_ctl` on a free port: the shared server serves other test runs).

mod pg_common;

use idem::store::postgres::PostgresOptions;
use idem::testkit::{unique, Counter};
use idem::{Error, Idem};
use pg_common::*;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A PostgreSQL server of this test's own (the shared one on 5432 serves other test runs):
/// `initdb` in a temporary directory, listening on a free loopback port. Dropping it stops it,
/// whatever happened.
struct TempPostgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
}

impl TempPostgres {
    fn new(bin: PathBuf) -> TempPostgres {
        let dir = tempfile::tempdir().expect("a temporary directory");
        // The server runs as `postgres` when this test runs as root (initdb refuses root); the
        // directory is the test's own, so it may be open to that user.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let pg = TempPostgres { bin, dir, port };
        let data = pg.data();
        assert!(
            pg.run(
                "initdb",
                &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"]
            ),
            "initdb"
        );
        assert!(pg.start(), "start the test's own server");
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    /// Runs one of the server programs, as `postgres` when this process is root.
    fn run(&self, program: &str, args: &[&str]) -> bool {
        let program = self.bin.join(program);
        let root = std::env::var("USER").as_deref() == Ok("root")
            || Command::new("id")
                .arg("-u")
                .output()
                .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        cmd.args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    fn start(&self) -> bool {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        let data = self.data();
        self.run(
            "pg_ctl",
            &["start", "-w", "-D", &data, "-l", &log, "-o", &options],
        )
    }

    fn stop(&self) -> bool {
        self.run("pg_ctl", &["stop", "-w", "-m", "fast", "-D", &self.data()])
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        self.run(
            "pg_ctl",
            &["stop", "-w", "-m", "immediate", "-D", &self.data()],
        );
    }
}

fn server_restart_during_load_fails_cleanly_and_recovers(bin: PathBuf) {
    let server = TempPostgres::new(bin);
    let url = server.url();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let table = unique_table("restart");
    let store = rt.block_on(async {
        PostgresOptions::from_url(&url)
            .unwrap()
            .table(&table)
            .max_connections(8)
            .acquire_timeout(Duration::from_millis(300))
            .connect()
            .await
            .unwrap()
    });
    let idem = Idem::from_store(store.clone());
    let name = unique("restart");
    const TASKS: usize = 8;
    const KEYS: usize = 60; // per task
    let counters: Arc<Vec<Counter>> =
        Arc::new((0..TASKS * KEYS).map(|_| Counter::default()).collect());
    let failures = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));

    let load: Vec<_> = (0..TASKS)
        .map(|t| {
            let (idem, name, counters, failures, done) = (
                idem.clone(),
                name.clone(),
                counters.clone(),
                failures.clone(),
                done.clone(),
            );
            rt.spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(60);
                for i in 0..KEYS {
                    let k = t * KEYS + i;
                    loop {
                        assert!(Instant::now() < deadline, "key {k} never finished");
                        let c = counters[k].clone();
                        let out = idem
                            .call(name.clone())
                            .key(&k)
                            .lease(Duration::from_secs(15))
                            .run(async move {
                                c.hit();
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Ok::<_, Error>(k)
                            })
                            .await;
                        match out {
                            Ok(v) => {
                                assert_eq!(v.into_inner(), k);
                                done.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                            // Down: a clean store error. In progress: our own claim whose
                            // answer was lost; it lapses after the lease.
                            Err(Error::Store(_)) | Err(Error::InProgress { .. }) => {
                                failures.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            Err(e) => panic!("key {k}: unexpected {e}"),
                        }
                    }
                }
            })
        })
        .collect();

    std::thread::sleep(Duration::from_millis(700));
    let before = done.load(Ordering::SeqCst);
    assert!(server.stop(), "stop the server");
    let stopped = Instant::now();
    // While it is down, a call fails cleanly, at once (within the acquire timeout), without
    // running its body.
    let probe = Counter::default();
    for p in 0..3 {
        let (c, t) = (probe.clone(), Instant::now());
        let out = rt.block_on(
            idem.call(name.clone())
                .key(&("probe", p))
                .run(async move { Ok::<_, Error>(c.hit()) }),
        );
        assert!(matches!(out, Err(Error::Store(_))), "while down: {out:?}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    assert_eq!(probe.get(), 0);
    std::thread::sleep(Duration::from_millis(1000));
    let during = done.load(Ordering::SeqCst);
    assert!(server.start(), "start the server");
    let downtime = stopped.elapsed();

    rt.block_on(async {
        for l in load {
            l.await.unwrap();
        }
    });
    let failures = failures.load(Ordering::SeqCst);
    eprintln!(
        "down for {downtime:?}: {before} calls done before the stop, {} during, {failures} \
         clean failures of the load (besides the probes), all {} done after",
        during - before,
        TASKS * KEYS
    );
    assert!(before > 0, "load ran before the stop");
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
        }
    });
}

idem_integration::server_tests! {
    blocking PG_SERVER => [
        server_restart_during_load_fails_cleanly_and_recovers,
    ],
}
