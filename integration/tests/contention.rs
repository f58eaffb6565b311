//! 1 000 concurrent duplicates of one key: the body runs exactly once and all 1 000 callers get
//! its value, on every store (`idem::testkit::stampede` asserts both).

use idem::testkit::stampede;
use idem::Idem;

const DUPLICATES: usize = 1000;
/// How long the one execution takes: the others find it in flight and wait for its result.
const BODY: std::time::Duration = std::time::Duration::from_millis(1);

async fn run(idem: Idem) {
    let took = stampede(&idem, DUPLICATES, BODY).await;
    eprintln!("{DUPLICATES} duplicates answered in {took:?}");
}

async fn memory_runs_one_of_1000_duplicates() {
    run(Idem::memory()).await;
}

#[cfg(feature = "sqlite")]
async fn sqlite_runs_one_of_1000_duplicates() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("stampede.db").display());
    run(Idem::sqlite(&url).await.expect("open the SQLite store")).await;
}

#[cfg(feature = "postgres")]
async fn postgres_runs_one_of_1000_duplicates(url: String) {
    let idem = Idem::postgres(&url)
        .await
        .expect("open the PostgreSQL store");
    run(idem).await;
}

#[cfg(feature = "redis")]
async fn redis_runs_one_of_1000_duplicates(url: String) {
    run(Idem::redis(&url).await.expect("open the Redis store")).await;
}

idem_integration::server_tests! {
    ANYWHERE => [
        memory_runs_one_of_1000_duplicates,
        #[cfg(feature = "sqlite")]
        sqlite_runs_one_of_1000_duplicates,
    ],
    POSTGRES => [
        #[cfg(feature = "postgres")]
        postgres_runs_one_of_1000_duplicates,
    ],
    REDIS => [
        #[cfg(feature = "redis")]
        redis_runs_one_of_1000_duplicates,
    ],
}
