//! How a call's store steps are executed: the engine (call.rs) decides what a call does; an
//! executor carries out its claim, completion and release.
//!
//! There are two, chosen per call — as sqlx runs one query on a pool or on a transaction's
//! connection, an enum rather than a trait because the set is closed and the engine stays one
//! monomorphic path:
//!
//! * [`Exec::Store`], the default: each step is one atomic operation of the handle's store, and
//!   the claim lives under a lease that the engine renews while the body runs and while its
//!   result is being stored (lease.rs).
//! * [`Exec::Transaction`] (feature `postgres`) and [`Exec::MysqlTransaction`] (feature
//!   `mysql`): the same statements on the caller's transaction, so the claim and the result
//!   commit or roll back with the caller's writes. The row lock is the lease: nothing renews
//!   it and nothing can take the key over midway.

use crate::error::Error;
use crate::key::Digest;
use crate::observe::KeyPrefix;
use crate::protocol::{self, Verdict};
use crate::store::{Claim, ClaimOutcome, Complete, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// A claim's decision, the time left of the live record it found, and when it was sent
/// ([`Exec::decide`]); the replayed value held as `V` (shared, from [`Exec::decide_now`]).
pub(crate) type Decided<V = Vec<u8>> = (Verdict<V>, Option<Duration>, Option<Instant>);

/// Where a call's claim, completion and release run.
// Named by `InTransaction`'s hidden method (so `pub`); without a transactional store it is
// the engine's alone.
#[cfg_attr(
    not(any(feature = "postgres", feature = "mysql")),
    allow(unreachable_pub)
)]
pub enum Exec<'a> {
    /// On the handle's store, under a renewed lease.
    Store(&'a dyn Store),
    /// The same on the memory store, whose claim the engine reads in place
    /// ([`Exec::decide`]).
    Memory(&'a crate::store::memory::MemoryStore),
    /// Inside the caller's PostgreSQL transaction, on its connection.
    #[cfg(feature = "postgres")]
    Transaction {
        store: &'a crate::store::postgres::PostgresStore,
        conn: &'a mut sqlx::PgConnection,
    },
    /// Inside the caller's MySQL transaction, on its connection.
    #[cfg(feature = "mysql")]
    MysqlTransaction {
        store: &'a crate::store::mysql::MysqlStore,
        conn: &'a mut sqlx::MySqlConnection,
    },
}

impl std::fmt::Debug for Exec<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Exec::Store(_) => "Exec::Store",
            Exec::Memory(_) => "Exec::Memory",
            #[cfg(feature = "postgres")]
            Exec::Transaction { .. } => "Exec::Transaction",
            #[cfg(feature = "mysql")]
            Exec::MysqlTransaction { .. } => "Exec::MysqlTransaction",
        })
    }
}

impl<'a> Exec<'a> {
    /// The backend, for traces and metrics.
    pub(crate) fn backend(&self) -> crate::store::Backend {
        match self {
            Exec::Store(store) => store.backend(),
            Exec::Memory(store) => store.backend(),
            #[cfg(feature = "postgres")]
            Exec::Transaction { store, .. } => store.backend(),
            #[cfg(feature = "mysql")]
            Exec::MysqlTransaction { store, .. } => store.backend(),
        }
    }

    /// The store whose lease the engine renews and whose records a duplicate waits on; `None`
    /// in a transaction, where a duplicate already waits on the row lock.
    pub(crate) fn leased(&self) -> Option<&'a dyn Store> {
        match self {
            Exec::Store(store) => Some(*store),
            Exec::Memory(store) => Some(*store),
            #[cfg(feature = "postgres")]
            Exec::Transaction { .. } => None,
            #[cfg(feature = "mysql")]
            Exec::MysqlTransaction { .. } => None,
        }
    }

    // The transactional statements' futures are boxed: they are large, and inline they would
    // size (and be moved with) every call's future, the default executor's too.
    pub(crate) async fn claim(&mut self, claim: Claim<'_>) -> Result<ClaimOutcome, Error> {
        match self {
            Exec::Store(store) => store.claim(claim).await,
            Exec::Memory(store) => store.claim(claim).await,
            #[cfg(feature = "postgres")]
            Exec::Transaction { store, conn } => {
                Box::pin(crate::store::postgres::tx::claim(store, conn, claim)).await
            }
            #[cfg(feature = "mysql")]
            Exec::MysqlTransaction { store, conn } => {
                Box::pin(crate::store::mysql::tx::claim(store, conn, claim)).await
            }
        }
    }

    /// The claim and what it decides (`protocol::decide`), with the time left of the live
    /// record it found, if any, and when the claim was sent: always for a claim it won, else
    /// only when `timed` (a cached result's age is counted from it).
    pub(crate) async fn decide(&mut self, claim: Claim<'_>, timed: bool) -> Result<Decided, Error> {
        if let Some((verdict, remaining, sent)) = self.decide_now(claim, timed) {
            return Ok((verdict.map(|value| value.to_vec()), remaining, sent));
        }
        let sent = Instant::now();
        let fingerprint = claim.fingerprint;
        let outcome = self.claim(claim).await?;
        let remaining = match &outcome {
            ClaimOutcome::Existing(record) => Some(record.remaining()),
            ClaimOutcome::Claimed { .. } => None,
        };
        Ok((
            protocol::decide(outcome, fingerprint).into(),
            remaining,
            Some(sent),
        ))
    }

    /// [`Exec::decide`] without a suspension point, for the executor that can: the memory
    /// store, whose claim is a map lookup under a lock. `None` for the others.
    pub(crate) fn decide_now(&self, claim: Claim<'_>, timed: bool) -> Option<Decided<Arc<[u8]>>> {
        let Exec::Memory(store) = self else {
            return None;
        };
        // The memory store times a claim it grants: a replay reads only its clock.
        let sent = timed.then(Instant::now);
        let (decision, remaining, started) = store.claim_decided(claim);
        Some((decision, remaining, started.or(sent)))
    }

    /// `Ok(false)`: the record no longer holds this token (fencing).
    pub(crate) async fn complete(&mut self, done: Complete<'_>) -> Result<bool, Error> {
        match self {
            Exec::Store(store) => store.complete(done).await,
            Exec::Memory(store) => store.complete(done).await,
            #[cfg(feature = "postgres")]
            Exec::Transaction { store, conn } => {
                Box::pin(crate::store::postgres::tx::complete(store, conn, done)).await
            }
            #[cfg(feature = "mysql")]
            Exec::MysqlTransaction { store, conn } => {
                Box::pin(crate::store::mysql::tx::complete(store, conn, done)).await
            }
        }
    }

    /// Frees the key. A failure is logged, not returned: the caller's own error (or panic)
    /// matters more, and the claim goes anyway (it lapses after its lease; a transaction's
    /// rollback removes it).
    pub(crate) async fn release(&mut self, name: &str, key: &Digest, token: u64) {
        let released = match self {
            Exec::Store(store) => store.release(key, token).await,
            Exec::Memory(store) => store.release(key, token).await,
            #[cfg(feature = "postgres")]
            Exec::Transaction { store, conn } => {
                match Box::pin(crate::store::postgres::tx::release(store, conn, key, token)).await {
                    // The body's own failed statement aborted the transaction: expected.
                    Err(e) => {
                        tracing::debug!(idem.name = name, idem.key = %KeyPrefix(key), idem.token = token, error = %e,
                            "idem: release in the transaction failed; rolling back removes the claim");
                        return;
                    }
                    done => done,
                }
            }
            #[cfg(feature = "mysql")]
            Exec::MysqlTransaction { store, conn } => {
                match Box::pin(crate::store::mysql::tx::release(store, conn, key, token)).await {
                    // A deadlock in the body's own statements rolled the transaction back.
                    Err(e) => {
                        tracing::debug!(idem.name = name, idem.key = %KeyPrefix(key), idem.token = token, error = %e,
                            "idem: release in the transaction failed; rolling back removes the claim");
                        return;
                    }
                    done => done,
                }
            }
        };
        match released {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(idem.name = name, idem.key = %KeyPrefix(key), idem.token = token, "idem: release found the key taken over")
            }
            Err(e) => {
                tracing::warn!(idem.name = name, idem.key = %KeyPrefix(key), idem.token = token, error = %e, "idem: release failed; the key lapses after its lease")
            }
        }
    }
}
