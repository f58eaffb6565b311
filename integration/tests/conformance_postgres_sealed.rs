//! The conformance suite against the PostgreSQL store (`IDEM_TEST_POSTGRES_URL`) with every
//! transformation of a stored result on at once: encryption under a ring of two keys, zstd
//! above 64 bytes, and the handle's local cache. A test binary with `harness = false`: without
//! the URL, the summary shows its scenarios as ignored.

async fn open() -> Option<idem::Idem> {
    let url = idem::testkit::service_url("IDEM_TEST_POSTGRES_URL", "PostgreSQL")?;
    let ring = idem::Keyring::new("old", [1; 32])
        .and_then(|ring| ring.with_key("new", [2; 32]))
        .expect("a keyring");
    Some(
        idem::Idem::postgres(&url)
            .await
            .expect("open the PostgreSQL store")
            .with_encryption(ring)
            .with_compression(64)
            .with_cache(idem::CacheOptions::new()),
    )
}

idem::conformance_suite!(main: open);
