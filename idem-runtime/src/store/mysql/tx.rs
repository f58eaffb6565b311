//! The statements of the transactional mode, on the caller's own connection.
//!
//! The same statements as the store's own steps (so a key is one key whichever mode writes
//! it), run on a connection inside the caller's transaction instead of on the pool: the claim
//! and the stored result then commit or roll back with the caller's writes. What a call does
//! with them — the decisions, the body, the error policy — is the engine's.
//!
//! The claim's upsert leaves an exclusive lock on the key's row until the transaction ends,
//! so a concurrent duplicate's upsert waits for it, then finds the committed result (or no row,
//! after a rollback). The claim's read is a locking read (`FOR UPDATE`): a plain read would see
//! the transaction's snapshot, taken at its first read, which may predate the row. Lock
//! conflicts are not retried here: InnoDB rolls back the whole transaction of a deadlock
//! victim, so only the caller can run it again. Completion and release leave out the lease's
//! end: here the row lock is the lease.

use super::{claim_exhausted, claim_on, ms, my_error, record_from, MysqlStore, CLAIM_ATTEMPTS};
use crate::error::Error;
use crate::key::Digest;
use crate::store::{BoxFuture, Claim, ClaimOutcome, Complete, Executor};
use sqlx::{Connection, MySqlConnection};

/// Claims the key on `conn`, which must be inside a transaction. While another open
/// transaction holds the key's row, InnoDB makes this wait for it to end (up to
/// `innodb_lock_wait_timeout`).
pub(crate) async fn claim(
    store: &MysqlStore,
    conn: &mut MySqlConnection,
    claim: Claim<'_>,
) -> Result<ClaimOutcome, Error> {
    if !conn.is_in_transaction() {
        return Err(Error::Config(format!(
            "{}: the transactional mode needs a transaction: pass `&mut tx` from \
             `pool.begin()`, not a bare connection",
            claim.name
        )));
    }
    let sql = &store.inner.sql;
    for _ in 0..CLAIM_ATTEMPTS {
        let (token, takeover) = claim_on(&sql.claim, &mut *conn, claim)
            .await
            .map_err(|e| my_error("claim", e))?;
        if token != 0 {
            return Ok(ClaimOutcome::Claimed { token, takeover });
        }
        let row = sqlx::query(&sql.get_for_update)
            .bind(&claim.key.0[..])
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| my_error("claim", e))?;
        if let Some(row) = row {
            return Ok(ClaimOutcome::Existing(record_from(
                "claim", claim.key, &row,
            )?));
        }
    }
    Err(claim_exhausted(claim.key))
}

/// Stores the result on `conn`; `false` when the claim row is no longer this token's (only
/// possible if it was changed in this very transaction: the row lock keeps everyone else out).
pub(crate) async fn complete(
    store: &MysqlStore,
    conn: &mut MySqlConnection,
    done: Complete<'_>,
) -> Result<bool, Error> {
    let result = sqlx::query(&store.inner.sql.complete_locked)
        .bind(done.value)
        .bind(ms(done.ttl))
        .bind(ms(done.tombstone))
        .bind(&done.key.0[..])
        .bind(done.token as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| my_error("complete", e))?;
    Ok(result.rows_affected() == 1)
}

/// Ends the claim on `conn` (the row keeps its token, as every release leaves it).
pub(crate) async fn release(
    store: &MysqlStore,
    conn: &mut MySqlConnection,
    key: &Digest,
    token: u64,
) -> Result<bool, Error> {
    let result = sqlx::query(&store.inner.sql.release_locked)
        .bind(&key.0[..])
        .bind(token as i64)
        .execute(&mut *conn)
        .await
        .map_err(|e| my_error("release", e))?;
    Ok(result.rows_affected() == 1)
}

/// The executor of the transactional mode: this store's steps on the caller's connection
/// ([`crate::store::Store::in_transaction`]).
pub(crate) struct OnConnection<'a> {
    pub(crate) store: &'a MysqlStore,
    pub(crate) conn: &'a mut MySqlConnection,
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
    conn: &mut MySqlConnection,
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
        .map_err(|e| my_error(op, e))?;
    Ok(done.rows_affected() == 1)
}
