//! The conformance suite against the SQLite store: a file database (the durable default) and
//! the shared in-memory database; the file database again (`file::sealed::…`) with encryption
//! under two keys, compression and the local cache on, as far as the features built allow
//! (`idem::testkit::sealed`).
#![cfg(feature = "sqlite")]

mod file {
    async fn open_file(name: &str) -> idem::Idem {
        let dir = std::env::temp_dir().join(format!("idem-conformance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let url = format!("sqlite://{}", dir.join(name).display());
        idem::Idem::sqlite(&url)
            .await
            .expect("open the SQLite file")
    }

    async fn open() -> Option<idem::Idem> {
        Some(open_file("keys.db").await)
    }

    async fn open_sealed() -> Option<idem::Idem> {
        Some(idem::testkit::sealed(open_file("sealed.db").await))
    }

    idem::conformance_suite!(open, sealed: open_sealed);
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
