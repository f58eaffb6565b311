//! The statements of the transactional mode, on the caller's own connection.
//!
//! The same statements as the store's own steps (so a key is one key whichever mode writes
//! it), run on a connection inside the caller's transaction instead of on the pool: the claim
//! and the stored result then commit or roll back with the caller's writes. What a call does
//! with them — the decisions, the body, the error policy — is the engine's (`Call::in_transaction`).
//! Completion and release leave out the lease's end: here the row lock is the lease.

use super::{claim_exhausted, claim_once, ms, pg_error, PostgresStore, CLAIM_ATTEMPTS};
use crate::error::Error;
use crate::key::Digest;
use crate::store::{BoxFuture, Claim, ClaimOutcome, Complete, Executor};
use sqlx::{Connection, PgConnection};

/// Claims the key on `conn`, which must be inside a transaction. While another open
/// transaction holds the key's row, PostgreSQL makes this wait for it to end.
pub(crate) async fn claim(
    store: &PostgresStore,
    conn: &mut PgConnection,
    claim: Claim<'_>,
) -> Result<ClaimOutcome, Error> {
    if !conn.is_in_transaction() {
        return Err(Error::Config(format!(
            "{}: the transactional mode needs a transaction: pass `&mut tx` from \
             `pool.begin()`, not a bare connection",
            claim.name
        )));
    }
    for _ in 0..CLAIM_ATTEMPTS {
        if let Some(outcome) = claim_once(store.sql_claim(), &mut *conn, claim).await? {
            return Ok(outcome);
        }
    }
    Err(claim_exhausted(claim.key))
}

/// Stores the result on `conn`; `false` when the claim row is no longer this token's (only
/// possible if it was changed in this very transaction: the row lock keeps everyone else out).
pub(crate) async fn complete(
    store: &PostgresStore,
    conn: &mut PgConnection,
    done: Complete<'_>,
) -> Result<bool, Error> {
    let row = sqlx::query(store.sql_complete_locked())
        .bind(&done.key.0[..])
        .bind(done.token as i64)
        .bind(done.value)
        .bind(ms(done.ttl))
        .bind(store.channel())
        .bind(ms(done.tombstone))
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| pg_error("complete", e))?;
    Ok(row.is_some())
}

/// Ends the claim on `conn` (the row keeps its token, as every release leaves it). It fails
/// when the body's own failed statement aborted the transaction; rolling back removes the claim
/// then.
pub(crate) async fn release(
    store: &PostgresStore,
    conn: &mut PgConnection,
    key: &Digest,
    token: u64,
) -> Result<bool, Error> {
    let row = sqlx::query(store.sql_release_locked())
        .bind(&key.0[..])
        .bind(token as i64)
        .bind(store.channel())
        .fetch_optional(&mut *conn)
        .await
        .map_err(|e| pg_error("release", e))?;
    Ok(row.is_some())
}

/// The executor of the transactional mode: this store's steps on the caller's connection
/// ([`crate::store::Store::in_transaction`]).
pub(crate) struct OnConnection<'a> {
    pub(crate) store: &'a PostgresStore,
    pub(crate) conn: &'a mut PgConnection,
}

// The statements' futures are boxed like a store's: large, and a call's future would
// otherwise hold them inline.
impl Executor for OnConnection<'_> {
    fn backend(&self) -> crate::store::Backend {
        super::BACKEND
    }

    fn leased(&self) -> bool {
        false
    }

    fn claim<'a>(&'a mut self, c: Claim<'a>) -> BoxFuture<'a, Result<ClaimOutcome, Error>> {
        Box::pin(claim(self.store, self.conn, c))
    }

    fn complete<'a>(&'a mut self, done: Complete<'a>) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(complete(self.store, self.conn, done))
    }

    fn release<'a>(
        &'a mut self,
        key: &'a Digest,
        token: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        Box::pin(release(self.store, self.conn, key, token))
    }

    fn park<'a>(&'a mut self, key: &'a Digest, token: u64) -> BoxFuture<'a, Result<bool, Error>> {
        let sql = &self.store.inner.sql.park;
        Box::pin(fenced(self.conn, sql, "park", key, token))
    }

    fn abandon<'a>(
        &'a mut self,
        key: &'a Digest,
        token: u64,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        let sql = &self.store.inner.sql.abandon;
        Box::pin(fenced(self.conn, sql, "abandon", key, token))
    }
}

/// A fenced step (`park`, `abandon`) on `conn`: `true` when this token held the row.
async fn fenced(
    conn: &mut PgConnection,
    sql: &str,
    op: &'static str,
    key: &Digest,
    token: u64,
) -> Result<bool, Error> {
    let done = sqlx::query(sql)
        .bind(&key.0[..])
        .bind(token as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| pg_error(op, e))?;
    Ok(done.rows_affected() == 1)
}
