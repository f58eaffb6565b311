//! The conformance suite against the DynamoDB store (`IDEM_TEST_DYNAMODB_URL`: DynamoDB Local,
//! started by `.ci/dynamodb-local`). A test binary with `harness = false`: without the URL, the
//! summary shows its scenarios as ignored.
//!
//! Each scenario runs twice: as the store is, and as `sealed::<scenario>` with encryption under
//! two keys, compression and the local cache on (`idem::testkit::sealed`).

async fn open() -> Option<idem::Idem> {
    let url = idem::testkit::service_url("IDEM_TEST_DYNAMODB_URL", "DynamoDB")?;
    let store = idem_integration::dynamodb::options(&url)
        .table("idem_conformance")
        .connect()
        .await
        .expect("open the DynamoDB store");
    Some(idem::Idem::from_store(store))
}

async fn open_sealed() -> Option<idem::Idem> {
    open().await.map(idem::testkit::sealed)
}

idem::conformance_suite!(main: open, sealed: open_sealed);
