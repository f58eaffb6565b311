//! The store behind [`Idem::disabled`](crate::Idem::disabled): it keeps nothing, so every
//! call claims its key and runs its body, as if the function had no `#[idempotent]`. For tests
//! of application code that want the body every time; never for production.

use super::{
    Backend, BoxFuture, Claim, ClaimOutcome, Complete, Digest, Error, Record, Resolve, Resolved,
    Store,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Keeps nothing: every claim is granted, every completion and release succeeds and is
/// forgotten, no record is ever found.
#[derive(Debug, Default)]
pub(crate) struct DisabledStore {
    /// Fencing tokens stay distinct and growing, as the protocol expects of a claim.
    tokens: AtomicU64,
}

impl Store for DisabledStore {
    fn backend(&self) -> Backend {
        Backend::Other("disabled")
    }

    fn claim<'a>(&'a self, _: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        let token = self.tokens.fetch_add(1, Ordering::Relaxed) + 1;
        Box::pin(async move {
            Ok(ClaimOutcome::Claimed {
                token,
                takeover: None,
            })
        })
    }

    fn complete<'a>(&'a self, _: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async { Ok(true) })
    }

    fn release<'a>(&'a self, _: &'a Digest, _: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async { Ok(true) })
    }

    fn renew<'a>(
        &'a self,
        _: &'a Digest,
        _: u64,
        _: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async { Ok(true) })
    }

    fn get<'a>(&'a self, _: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async { Ok(None) })
    }

    fn purge_expired(&self, _: usize) -> BoxFuture<'_, Result<u64, Error>> {
        Box::pin(async { Ok(0) })
    }

    fn force_release<'a>(&'a self, _: &'a Digest) -> BoxFuture<'a, Result<Option<Record>, Error>> {
        Box::pin(async { Ok(None) })
    }

    fn park<'a>(&'a self, _: &'a Digest, _: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async { Ok(true) })
    }

    fn abandon<'a>(&'a self, _: &'a Digest, _: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(async { Ok(true) })
    }

    fn resolve<'a>(
        &'a self,
        _: &'a Digest,
        _: Resolve<'a>,
    ) -> BoxFuture<'a, Result<Resolved, Error>> {
        Box::pin(async { Ok(Resolved::NotParked(None)) })
    }
}
