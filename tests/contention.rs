//! 1 000 concurrent duplicates of one key: the body runs exactly once and all 1 000 callers get
//! its value, on every store (`idem::testkit::stampede` asserts both).

#[cfg(any(feature = "postgres", feature = "redis"))]
use idem::testkit::service_url;
use idem::testkit::stampede;
use idem::Idem;

const DUPLICATES: usize = 1000;
/// How long the one execution takes: the others find it in flight and wait for its result.
const BODY: std::time::Duration = std::time::Duration::from_millis(1);

fn run(open: impl std::future::Future<Output = Option<Idem>>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        if let Some(idem) = open.await {
            let took = stampede(&idem, DUPLICATES, BODY).await;
            eprintln!("{DUPLICATES} duplicates answered in {took:?}");
        }
    });
}

#[test]
fn memory_runs_one_of_1000_duplicates() {
    run(async { Some(Idem::memory()) });
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_runs_one_of_1000_duplicates() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("stampede.db").display());
    run(async { Some(Idem::sqlite(&url).await.expect("open the SQLite store")) });
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_runs_one_of_1000_duplicates() {
    run(async {
        let url = service_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")?;
        Some(
            Idem::postgres(&url)
                .await
                .expect("open the PostgreSQL store"),
        )
    });
}

#[cfg(feature = "redis")]
#[test]
fn redis_runs_one_of_1000_duplicates() {
    run(async {
        let url = service_url("IDEM_TEST_REDIS_URL", "Redis")?;
        Some(Idem::redis(&url).await.expect("open the Redis store"))
    });
}
