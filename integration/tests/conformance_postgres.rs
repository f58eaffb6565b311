//! The conformance suite against the PostgreSQL store (`IDEM_TEST_POSTGRES_URL`). A test binary with
//! `harness = false`: without the URL, the summary shows its scenarios as ignored.
//!
//! Each scenario runs twice: as the store is, and as `sealed::<scenario>` with encryption under
//! two keys, compression and the local cache on (`idem::testkit::sealed`).

async fn open() -> Option<idem::Idem> {
    let url = idem::testkit::service_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")?;
    Some(
        idem::Idem::postgres(&url)
            .await
            .expect("open the PostgreSQL store"),
    )
}

async fn open_sealed() -> Option<idem::Idem> {
    open().await.map(idem::testkit::sealed)
}

idem::conformance_suite!(main: open, sealed: open_sealed);
