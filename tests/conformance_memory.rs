//! The conformance suite against the in-memory store: as it is, and again (`sealed::…`) with
//! encryption under two keys, compression and the local cache on, as far as the features built
//! allow (`idem::testkit::sealed`).

async fn open() -> Option<idem::Idem> {
    Some(idem::Idem::memory())
}

async fn open_sealed() -> Option<idem::Idem> {
    open().await.map(idem::testkit::sealed)
}

idem::conformance_suite!(open, sealed: open_sealed);
