//! The conformance suite against the PostgreSQL store (`IDEM_TEST_POSTGRES_URL`). A test binary with
//! `harness = false`: without the URL, the summary shows its scenarios as ignored.

async fn open() -> Option<idem::Idem> {
    let url = idem::testkit::service_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")?;
    Some(
        idem::Idem::postgres(&url)
            .await
            .expect("open the PostgreSQL store"),
    )
}

idem::conformance_suite!(main: open);
