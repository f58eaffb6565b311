//! The conformance suite against the in-memory store: as it is, with encryption and
//! compression on (feature `encryption`, `compression`), and with the local cache on.

async fn open() -> Option<idem::Idem> {
    Some(idem::Idem::memory())
}

idem::conformance_suite!(open);

/// Every result encrypted, and compressed when above 64 bytes, under a ring of two keys.
#[cfg(all(feature = "encryption", feature = "compression"))]
mod sealed {
    async fn open() -> Option<idem::Idem> {
        let ring = idem::Keyring::new("old", [1; 32])
            .and_then(|ring| ring.with_key("new", [2; 32]))
            .expect("a keyring");
        Some(
            idem::Idem::memory()
                .with_encryption(ring)
                .with_compression(64),
        )
    }
    idem::conformance_suite!(open);
}

/// Completed results kept in the handle: every scenario passes as without.
#[cfg(feature = "cache")]
mod cached {
    async fn open() -> Option<idem::Idem> {
        Some(idem::Idem::memory().with_cache(idem::CacheOptions::new()))
    }
    idem::conformance_suite!(open);
}
