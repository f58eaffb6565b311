//! The conformance suite against a real Redis Cluster (`IDEM_TEST_REDIS_CLUSTER_URL`: its nodes'
//! URLs, comma-separated; `.ci/redis-cluster start DIR` prints such a list). A test binary with
//! `harness = false`: without the URL, the summary shows its scenarios as ignored.

async fn open() -> Option<idem::Idem> {
    let urls = idem::testkit::service_url("IDEM_TEST_REDIS_CLUSTER_URL", "Redis Cluster")?;
    let nodes: Vec<&str> = urls.split(',').collect();
    Some(
        idem::Idem::redis_cluster(&nodes)
            .await
            .expect("open the Redis Cluster store"),
    )
}

idem::conformance_suite!(main: open);
