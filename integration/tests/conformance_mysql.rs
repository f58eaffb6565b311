//! The conformance suite against the MySQL / MariaDB store (`IDEM_TEST_MYSQL_URL`). A test binary
//! with `harness = false`: without the URL, the summary shows its scenarios as ignored.

async fn open() -> Option<idem::Idem> {
    let url = idem::testkit::service_url("IDEM_TEST_MYSQL_URL", "MySQL")?;
    Some(idem::Idem::mysql(&url).await.expect("open the MySQL store"))
}

idem::conformance_suite!(main: open);
