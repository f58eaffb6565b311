//! The conformance suite against the SQLite store: a file database (the durable default) and
//! the shared in-memory database; the file database again with encryption (feature
//! `encryption`) and with the local cache.
#![cfg(feature = "sqlite")]

mod file {
    async fn open() -> Option<idem::Idem> {
        let dir = std::env::temp_dir().join(format!("idem-conformance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("keys.db").display());
        Some(
            idem::Idem::sqlite(&url)
                .await
                .expect("open the SQLite file"),
        )
    }
    idem::conformance_suite!(open);
}

mod in_memory {
    async fn open() -> Option<idem::Idem> {
        Some(
            idem::Idem::sqlite("sqlite::memory:")
                .await
                .expect("open sqlite::memory:"),
        )
    }
    idem::conformance_suite!(open);
}

/// Every result encrypted (and compressed above 64 bytes with the feature `compression`).
#[cfg(feature = "encryption")]
mod sealed {
    async fn open() -> Option<idem::Idem> {
        let dir = std::env::temp_dir().join(format!("idem-conformance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("sealed.db").display());
        let ring = idem::Keyring::new("k1", [7; 32]).expect("a keyring");
        let idem = idem::Idem::sqlite(&url)
            .await
            .expect("open the SQLite file")
            .with_encryption(ring);
        #[cfg(feature = "compression")]
        let idem = idem.with_compression(64);
        Some(idem)
    }
    idem::conformance_suite!(open);
}

/// Completed results kept in the handle.
#[cfg(feature = "cache")]
mod cached {
    async fn open() -> Option<idem::Idem> {
        let dir = std::env::temp_dir().join(format!("idem-conformance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join("cached.db").display());
        Some(
            idem::Idem::sqlite(&url)
                .await
                .expect("open the SQLite file")
                .with_cache(idem::CacheOptions::new()),
        )
    }
    idem::conformance_suite!(open);
}
