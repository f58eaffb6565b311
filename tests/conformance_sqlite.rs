//! The conformance suite against the SQLite store: a file database (the durable default) and
//! the shared in-memory database.
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
