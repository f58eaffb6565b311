//! Where a call's claim, completion and release run: the seam between the call engine and the
//! stores.
//!
//! As sqlx's `Executor` runs one query on a pool, a connection or a transaction, an
//! [`Executor`] runs one protocol step on a store or on a caller's transaction. The engine is
//! given one and never learns which store is behind it:
//!
//! * every [`Store`] is an executor of its own steps, each under a lease that the engine renews
//!   while the body runs ([`Executor::leased`]);
//! * a SQL store also lends an executor that runs the same statements on a caller's connection
//!   inside its transaction ([`Store::in_transaction`]), so that the claim and the result commit
//!   or roll back with the caller's writes. There the row lock is the lease: nothing renews it.

use super::{BoxFuture, Claim, ClaimOutcome, Complete, Store};
use crate::backend::Backend;
use crate::error::Error;
use crate::key::Digest;

/// Runs a call's store steps: each method is one atomic step of the protocol, as on
/// [`Store`].
pub trait Executor: Send {
    /// Which backend runs the steps, for errors, traces and metrics.
    fn backend(&self) -> Backend;

    /// Whether a claim lives under a lease that the engine must renew while the call runs (and
    /// a duplicate may wait on the store's notifications): `true` on a store, `false` inside a
    /// caller's transaction, whose row lock keeps every other claim waiting until it ends.
    fn leased(&self) -> bool;

    /// [`Store::claim`].
    fn claim<'a>(&'a mut self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>>;

    /// [`Store::complete`]: `Ok(false)` when the record no longer holds this token (fencing).
    fn complete<'a>(&'a mut self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>>;

    /// [`Store::release`].
    fn release<'a>(&'a mut self, key: &'a Digest, token: u64)
        -> BoxFuture<'a, Result<bool, Error>>;

    /// [`Store::park`].
    fn park<'a>(&'a mut self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>>;

    /// [`Store::abandon`].
    fn abandon<'a>(&'a mut self, key: &'a Digest, token: u64)
        -> BoxFuture<'a, Result<bool, Error>>;
}

/// The default executor: the store itself.
impl Executor for &dyn Store {
    fn backend(&self) -> Backend {
        Store::backend(*self)
    }

    fn leased(&self) -> bool {
        true
    }

    fn claim<'a>(&'a mut self, claim: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Store::claim(*self, claim)
    }

    fn complete<'a>(&'a mut self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Store::complete(*self, done)
    }

    fn release<'a>(
        &'a mut self,
        key: &'a Digest,
        token: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Store::release(*self, key, token)
    }

    fn park<'a>(&'a mut self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        Store::park(*self, key, token)
    }

    fn abandon<'a>(
        &'a mut self,
        key: &'a Digest,
        token: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Store::abandon(*self, key, token)
    }
}

/// A caller's connection, inside a transaction, that a SQL store can run its steps on
/// ([`Store::in_transaction`]).
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "postgres", feature = "mysql"))))]
#[derive(Debug)]
#[non_exhaustive]
pub enum Connection<'a> {
    /// A PostgreSQL connection (feature `postgres`).
    #[cfg(feature = "postgres")]
    Postgres(&'a mut sqlx::PgConnection),
    /// A MySQL / MariaDB connection (feature `mysql`).
    #[cfg(feature = "mysql")]
    MySql(&'a mut sqlx::MySqlConnection),
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl Connection<'_> {
    /// The database the connection is of, for errors.
    pub fn database(&self) -> &'static str {
        match self {
            #[cfg(feature = "postgres")]
            Connection::Postgres(_) => "PostgreSQL",
            #[cfg(feature = "mysql")]
            Connection::MySql(_) => "MySQL",
        }
    }
}
