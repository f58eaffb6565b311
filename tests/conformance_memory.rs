//! The conformance suite against the in-memory store.

async fn open() -> Option<idem::Idem> {
    Some(idem::Idem::memory())
}

idem::conformance_suite!(open);
