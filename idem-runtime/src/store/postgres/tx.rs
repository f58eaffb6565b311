//! The transactional mode: exactly once for database side effects.
//!
//! The claim and the stored result are written **inside the caller's transaction**, with the
//! same statements as the ordinary mode, so the handler's own writes and the idempotency record
//! commit together or roll back together. If the process dies, the connection drops, or the
//! caller rolls back, nothing of the attempt remains: neither its writes nor its claim, and the
//! next attempt runs the body again against a database in which the body never ran. Once the
//! transaction commits, both are there, and every repeat replays the stored result.
//!
//! ```no_run
//! # use idem_runtime as idem;
//! use idem::store::postgres::{in_transaction, sqlx, PostgresStore, TxCall};
//! # async fn demo(store: PostgresStore) -> Result<(), idem::Error> {
//! let db = |e| idem::Error::store("postgres", "app", e);
//! let mut tx = store.pool().begin().await.map_err(db)?;
//! let receipt = in_transaction(&store, &mut tx, TxCall::new("orders.v1").key("order-42"), |conn| {
//!     Box::pin(async move {
//!         sqlx::query("INSERT INTO orders (id) VALUES (42)")
//!             .execute(&mut *conn)
//!             .await
//!             .map_err(|e| idem::Error::store("postgres", "body", e))?;
//!         Ok::<_, idem::Error>(42u64)
//!     })
//! })
//! .await?;
//! tx.commit().await.map_err(db)?;
//! # let _ = receipt; Ok(()) }
//! ```
//!
//! # What a concurrent duplicate sees
//!
//! The first attempt's claim is an uncommitted row (or an uncommitted update of an expired
//! row), and its transaction holds that row's lock until it ends. A duplicate's claim
//! (`INSERT … ON CONFLICT (key) DO UPDATE`) conflicts with it and PostgreSQL makes it **wait**
//! for the first transaction to end; it does not see "in progress":
//!
//! * the first transaction **commits**: the row is completed and live, the duplicate's upsert
//!   does nothing, its claim reads the row again (the committed row is newer than its snapshot:
//!   see the READ COMMITTED note in the module docs) and **replays** the stored result;
//! * the first transaction **rolls back** (an error, a panic, a crash, a lost connection): the
//!   row never existed, the duplicate's insert goes through and it **runs** the body.
//!
//! So in this mode duplicates queue behind the attempt in flight instead of getting
//! [`Error::InProgress`]; the wait lasts as long as the first transaction (bound it with
//! `SET lock_timeout` if that matters). An ordinary (non-transactional) call with the same key
//! waits the same way. Only a committed in-progress row, left by an ordinary call in flight
//! (or by a caller that committed without finishing its [`TxClaim`]), answers `InProgress`.
//!
//! # No lease, no renewal
//!
//! The row lock is the lease: while the transaction is open nobody else can take the key, and
//! when it ends the claim either became the completed record or vanished. So nothing renews it
//! and nothing can take it over midway; fencing cannot fail. The `lease` given to [`TxCall`]
//! only bounds a claim row that was committed *without* being finished.
//!
//! # Isolation, deadlocks
//!
//! Use READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ or SERIALIZABLE a duplicate
//! that waited on the first transaction fails with a serialization error (SQLSTATE 40001), as
//! PostgreSQL does for any write conflict there; retry its transaction and it replays. Two
//! transactions that claim the same keys in opposite orders can deadlock; PostgreSQL aborts one
//! (40P01) and its retry replays or runs.

use super::{claim_exhausted, claim_once, pg_error, PostgresStore, CLAIM_ATTEMPTS};
use crate::call::Outcome;
use crate::codec::{self, Stored};
use crate::context::{CallContext, CURRENT};
use crate::error::Error;
use crate::key::{self, Digest};
use crate::policy::{ErrorPolicy, OnError, ReleaseErrors};
use crate::protocol::{self, Decision};
use crate::store::{BoxFuture, Claim};
use serde::{de::DeserializeOwned, Serialize};
use sqlx::{Connection, PgConnection};
use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

/// An idempotent call whose record is written inside the caller's transaction. Set it up like
/// [`crate::Call`] (key, optionally scope, fingerprint, ttl), then either [`TxCall::run`] a body
/// or, from generated code, [`TxCall::claim`] and [`TxClaim::finish`] around it.
#[must_use = "a TxCall does nothing until `claim` or `run`"]
#[derive(Debug)]
pub struct TxCall {
    name: Cow<'static, str>,
    parts: key::KeyParts,
    ttl: Duration,
    lease: Duration,
}

/// What a transactional claim found.
#[derive(Debug)]
pub enum TxStep {
    /// The key is this transaction's: run the body on the same transaction, then
    /// [`TxClaim::finish`].
    Run(TxClaim),
    /// A committed earlier attempt's result: return it; the body does not run.
    Replay(StoredResult),
}

/// A stored result, to be decoded into the function's return type.
#[derive(Debug, Clone)]
pub struct StoredResult {
    bytes: Vec<u8>,
}

impl StoredResult {
    /// Decodes the stored result: a stored `Ok` value, or a kept `Err` decoded by `policy`.
    /// A stored value that does not decode into `T` is [`Error::Codec`].
    pub fn decode<T, E, P>(&self, policy: &P) -> Result<T, E>
    where
        T: DeserializeOwned,
        E: From<Error>,
        P: ErrorPolicy<E>,
    {
        match codec::split::<T>(&self.bytes)? {
            Stored::Ok(json) => Ok(codec::decode(json)?),
            Stored::Err(json) => Err(policy.decode(json)?),
        }
    }

    /// The stored bytes (format byte, kind byte, JSON).
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// This transaction holds the key: finish it on the same transaction before committing.
/// Dropping it without finishing leaves the claim row in the transaction; committing that
/// leaves the key in progress until its lease lapses.
#[derive(Debug)]
#[must_use = "finish the claim on the same transaction before committing"]
pub struct TxClaim {
    store: PostgresStore,
    name: Cow<'static, str>,
    key: Digest,
    token: u64,
    ttl: Duration,
}

impl TxCall {
    /// A transactional call in namespace `name` (ttl 24 h, lease 30 s by default).
    pub fn new(name: impl Into<Cow<'static, str>>) -> TxCall {
        TxCall {
            name: name.into(),
            parts: key::KeyParts::default(),
            ttl: Duration::from_secs(24 * 3600),
            lease: Duration::from_secs(30),
        }
    }

    /// The key (any `Serialize`), the same on every retry; the same digest as [`crate::Call`]
    /// computes, so a key is one key whichever mode calls it.
    pub fn key<K: Serialize + ?Sized>(mut self, key: &K) -> Self {
        self.parts.key = self.parts.encode(&self.name, "key", key);
        self
    }

    /// A tenant or principal.
    pub fn scope<S: Serialize + ?Sized>(mut self, scope: &S) -> Self {
        self.parts.scope = self.parts.encode(&self.name, "scope", scope);
        self
    }

    /// What must match on a repeat (default: the key).
    pub fn fingerprint<F: Serialize + ?Sized>(mut self, fingerprint: &F) -> Self {
        self.parts.fingerprint = self.parts.encode(&self.name, "fingerprint", fingerprint);
        self
    }

    /// How long the committed result is kept and replayed (default 24 h).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a claim row lives if it is committed without being finished (default 30 s).
    /// While the transaction is open the row lock, not this, keeps the key exclusive.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Claims the key inside the transaction `conn` (pass `&mut tx`: a
    /// `&mut sqlx::Transaction<'_, Postgres>` coerces). Waits while another open transaction
    /// holds the key (see the module docs). `InProgress` and `Mismatch` come back as errors.
    pub async fn claim(
        mut self,
        store: &PostgresStore,
        conn: &mut PgConnection,
    ) -> Result<TxStep, Error> {
        if let Some(e) = self.parts.error.take() {
            return Err(e);
        }
        if !conn.is_in_transaction() {
            return Err(Error::Config(format!(
                "{}: the transactional mode needs a transaction: pass `&mut tx` from \
                 `pool.begin()`, not a bare connection",
                self.name
            )));
        }
        let (key, fingerprint) = self.parts.digests(&self.name)?;
        let claim = Claim {
            name: &self.name,
            key: &key,
            fingerprint: &fingerprint,
            lease: self.lease.max(Duration::from_millis(1)),
        };
        let mut outcome = None;
        for _ in 0..CLAIM_ATTEMPTS {
            if let Some(o) = claim_once(store.sql_claim(), &mut *conn, claim).await? {
                outcome = Some(o);
                break;
            }
        }
        let outcome = outcome.ok_or_else(|| claim_exhausted(&key))?;
        match protocol::decide(outcome, &fingerprint) {
            Decision::Run { token } => Ok(TxStep::Run(TxClaim {
                store: store.clone(),
                name: self.name,
                key,
                token,
                ttl: self.ttl,
            })),
            Decision::Replay(bytes) => Ok(TxStep::Replay(StoredResult { bytes })),
            Decision::Mismatch => Err(Error::Mismatch {
                name: self.name.to_string(),
                key: key.to_hex(),
            }),
            Decision::InProgress { retry_after } => Err(Error::InProgress {
                name: self.name.to_string(),
                key: key.to_hex(),
                retry_after: Some(retry_after),
            }),
        }
    }

    /// Runs `body` on the transaction at most once per key; an `Err` releases the key (inside
    /// the transaction). The caller commits (or rolls back) afterwards, as always.
    pub async fn run<T, E, F>(
        self,
        store: &PostgresStore,
        conn: &mut PgConnection,
        body: F,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>>,
    {
        self.run_with(ReleaseErrors, store, conn, body).await
    }

    /// Like [`TxCall::run`], with an error policy ([`crate::KeepErrors`] stores every `Err`).
    pub async fn run_with<T, E, P, F>(
        self,
        policy: P,
        store: &PostgresStore,
        conn: &mut PgConnection,
        body: F,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        P: ErrorPolicy<E>,
        F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>>,
    {
        match self.claim(store, conn).await? {
            TxStep::Replay(stored) => stored.decode(&policy).map(Outcome::Replayed),
            TxStep::Run(claim) => {
                let result = claim.scope(body(&mut *conn)).await;
                claim
                    .finish(conn, &policy, result)
                    .await
                    .map(Outcome::Fresh)
            }
        }
    }
}

/// Runs `body` inside the caller's transaction at most once per key: see the module docs.
/// `tx` is a `&mut sqlx::Transaction<'_, Postgres>` (it coerces to the connection).
pub async fn in_transaction<T, E, F>(
    store: &PostgresStore,
    tx: &mut PgConnection,
    call: TxCall,
    body: F,
) -> Result<Outcome<T>, E>
where
    T: Serialize + DeserializeOwned,
    E: From<Error>,
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>>,
{
    call.run(store, tx, body).await
}

impl TxClaim {
    /// The fencing token of this attempt.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The key's hex digest (what [`crate::current_key`] returns inside the body).
    pub fn key_hex(&self) -> String {
        self.key.to_hex()
    }

    /// Runs `fut` as this call's body: [`crate::current_key`] and [`crate::current_token`]
    /// answer inside it.
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(
            CallContext {
                key: self.key,
                token: self.token,
                idem: None,
                scope: None,
                ttl: self.ttl,
            },
            fut,
        )
    }

    /// Stores the body's result in the transaction (an `Ok`, or an `Err` the policy keeps), or
    /// releases the key for an `Err` the policy releases; returns the result. Commit afterwards.
    pub async fn finish<T, E, P>(
        self,
        conn: &mut PgConnection,
        policy: &P,
        result: Result<T, E>,
    ) -> Result<T, E>
    where
        T: Serialize,
        E: From<Error>,
        P: ErrorPolicy<E>,
    {
        self.finish_with(conn, policy, result, E::from).await
    }

    /// [`TxClaim::finish`], with idempotency failures converted by `from` (the attribute's
    /// expansion converts through its own trait, for its own compile error).
    pub(crate) async fn finish_with<T, E, P>(
        self,
        conn: &mut PgConnection,
        policy: &P,
        result: Result<T, E>,
        from: impl Fn(Error) -> E,
    ) -> Result<T, E>
    where
        T: Serialize,
        P: ErrorPolicy<E>,
    {
        match result {
            Ok(value) => {
                let stored = match codec::encode_ok(&value) {
                    Ok(bytes) => self.store_bytes(conn, &bytes).await,
                    Err(e) => Err(e),
                };
                stored.map_err(&from)?;
                Ok(value)
            }
            Err(error) => match policy.on_error(&error) {
                OnError::Release => {
                    self.release(conn).await;
                    Err(error)
                }
                OnError::Keep => {
                    let stored = match policy.encode(&error) {
                        Ok(bytes) => self.store_bytes(conn, &bytes).await,
                        Err(e) => Err(e),
                    };
                    stored.map_err(&from)?;
                    Err(error)
                }
            },
        }
    }

    /// Stores `value` as the result, in the transaction.
    pub async fn complete<T: Serialize>(
        self,
        conn: &mut PgConnection,
        value: &T,
    ) -> Result<(), Error> {
        let bytes = codec::encode_ok(value)?;
        self.store_bytes(conn, &bytes).await
    }

    async fn store_bytes(&self, conn: &mut PgConnection, bytes: &[u8]) -> Result<(), Error> {
        let row = sqlx::query(self.store.sql_complete())
            .bind(&self.key.0[..])
            .bind(self.token as i64)
            .bind(bytes)
            .bind(super::ms(self.ttl))
            .bind(self.store.channel())
            .fetch_optional(&mut *conn)
            .await
            .map_err(|e| pg_error("complete", e))?;
        match row {
            Some(_) => Ok(()),
            // Only possible if the claim row was changed in this very transaction.
            None => Err(Error::LeaseLost {
                name: self.name.to_string(),
                key: self.key.to_hex(),
                token: self.token,
            }),
        }
    }

    /// Deletes the claim in the transaction. A failure (the transaction is already aborted by
    /// the body's failed statement) is logged: rolling back removes the claim anyway.
    pub async fn release(self, conn: &mut PgConnection) {
        let res = sqlx::query(self.store.sql_release())
            .bind(&self.key.0[..])
            .bind(self.token as i64)
            .bind(self.store.channel())
            .fetch_optional(&mut *conn)
            .await;
        if let Err(e) = res {
            tracing::debug!(key = %self.key, error = %e,
                "idem: release in the transaction failed; rolling back removes the claim");
        }
    }
}
