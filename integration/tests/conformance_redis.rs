//! The conformance suite against a real Redis server (`IDEM_TEST_REDIS_URL`). A test binary with
//! `harness = false`: without the URL, the summary shows its scenarios as ignored.

async fn open() -> Option<idem::Idem> {
    let url = idem::testkit::service_url("IDEM_TEST_REDIS_URL", "Redis")?;
    Some(idem::Idem::redis(&url).await.expect("open the Redis store"))
}

idem::conformance_suite!(main: open);
