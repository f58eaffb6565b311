//! The conformance suite against a real Redis Cluster (`IDEM_TEST_REDIS_CLUSTER_URL`: its nodes'
//! URLs, comma-separated; `.ci/redis-cluster start DIR` prints such a list). A test binary with
//! `harness = false`: without the URL, the summary shows its scenarios as ignored.
//!
//! Each scenario runs twice: as the store is, and as `sealed::<scenario>` with encryption under
//! two keys, compression and the local cache on (`idem::testkit::sealed`).

async fn open() -> Option<idem::Idem> {
    let urls = idem::testkit::service_url("IDEM_TEST_REDIS_CLUSTER_URL", "Redis Cluster")?;
    let nodes: Vec<&str> = urls.split(',').collect();
    Some(
        idem::Idem::redis_cluster(&nodes)
            .await
            .expect("open the Redis Cluster store"),
    )
}

async fn open_sealed() -> Option<idem::Idem> {
    open().await.map(idem::testkit::sealed)
}

idem::conformance_suite!(main: open, sealed: open_sealed);
