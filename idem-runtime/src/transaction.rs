//! The transactional mode (features `postgres`, `mysql`): a call whose claim and stored result
//! are written **inside the caller's PostgreSQL or MySQL transaction**, with the same
//! statements as the ordinary mode, so the handler's own writes and the idempotency record
//! commit together or roll back together. It is the one engine of call.rs given another
//! executor (the store's [`Store::in_transaction`](crate::Store::in_transaction)); this file
//! only asks the handle's store for that executor on the transaction's connection
//! ([`InTransaction`]) and lends the body the transaction between the claim and the finish. What follows describes PostgreSQL; docs/mysql.md has the
//! same for MySQL (a duplicate waits on InnoDB's row lock likewise).
//!
//! # What a concurrent duplicate sees
//!
//! The first attempt's claim is an uncommitted row (or an uncommitted update of an expired
//! row), and its transaction holds that row's lock until it ends. A duplicate's claim
//! (`INSERT … ON CONFLICT (key) DO UPDATE`) conflicts with it and PostgreSQL makes it **wait**
//! for the first transaction to end; it does not see "in progress":
//!
//! * the first transaction **commits**: the row is completed and live, the duplicate's upsert
//!   does nothing, its claim reads the row again (the committed row is newer than its
//!   snapshot: see the READ COMMITTED note of the PostgreSQL store) and **replays** the stored
//!   result;
//! * the first transaction **rolls back** (an error, a panic, a crash, a lost connection): the
//!   row never existed, the duplicate's insert goes through and it **runs** the body.
//!
//! So in this mode duplicates queue behind the attempt in flight instead of getting
//! [`Error::InProgress`], and a call's `wait` does not apply; the wait lasts as long as the
//! first transaction (bound it with `SET lock_timeout` if that matters). An ordinary call with
//! the same key waits the same way. Only a committed in-progress row, left by an ordinary call
//! in flight, answers `InProgress`.
//!
//! # No lease, no renewal
//!
//! The row lock is the lease: while the transaction is open nobody else can take the key, and
//! when it ends the claim either became the completed record or vanished. So nothing renews it
//! and nothing can take it over midway; fencing cannot fail. The call's `lease` only bounds a
//! claim row that was committed *without* being finished.
//!
//! # Isolation, deadlocks
//!
//! Use READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ or SERIALIZABLE a duplicate
//! that waited on the first transaction fails with a serialization error (SQLSTATE 40001), as
//! PostgreSQL does for any write conflict there; retry its transaction and it replays. Two
//! transactions that claim the same keys in opposite orders can deadlock; PostgreSQL aborts one
//! (40P01) and its retry replays or runs.

use crate::call::{Begun, Call, Failed, Outcome, Prepared};
use crate::context::{Recovery, CURRENT};
use crate::error::Error;
use crate::handle::Idem;
use crate::observe::{self, Obs};
use crate::policy::{ErrorPolicy, ReleaseErrors};
use crate::store::{Connection, Executor};
use serde::{de::DeserializeOwned, Serialize};
use std::future::Future;
use std::sync::atomic::AtomicU8;
use std::sync::Arc;

/// A caller's transaction that a transactional call writes its claim and result in: a
/// `sqlx::Transaction` of PostgreSQL (feature `postgres`) or of MySQL (feature `mysql`), or
/// the connection of one (`&mut *tx`). Implemented by idem for those types only.
#[diagnostic::on_unimplemented(
    message = "`transaction = …` names an argument of type `&mut {Self}`, which is not a PostgreSQL or MySQL transaction",
    label = "the claim and the result are written on this argument's transaction",
    note = "the argument must be a `&mut sqlx::Transaction<'_, sqlx::Postgres>` or `&mut sqlx::Transaction<'_, sqlx::MySql>` (or its connection, inside a transaction)"
)]
pub trait InTransaction: Send {
    /// The connection the transaction runs on, which the body is lent.
    type Connection: InTransaction<Connection = Self::Connection> + ?Sized;

    /// The transaction's connection.
    #[doc(hidden)]
    fn __idem_connection(&mut self) -> &mut Self::Connection;

    /// The connection as the stores take it.
    #[doc(hidden)]
    fn __idem_sql(&mut self) -> Connection<'_>;
}

/// The executor that writes on `conn` with the handle's store, which must be of the same
/// database.
fn executor<'a, C: InTransaction + ?Sized>(
    conn: &'a mut C,
    idem: &'a Idem,
) -> Result<Box<dyn Executor + 'a>, Error> {
    let conn = conn.__idem_sql();
    let database = conn.database();
    idem.store().in_transaction(conn).ok_or_else(|| {
        Error::Config(format!(
            "#[idempotent(transaction = …)] needs a {database} store; this handle's store is `{}`",
            idem.store().backend()
        ))
    })
}

/// The three ways to hold a transaction of one database: the transaction, its connection, and
/// a pooled connection (refused at the claim unless a transaction was begun on it).
macro_rules! in_transaction_for {
    ($feature:literal, $db:ty, $conn:ty, $variant:ident) => {
        #[cfg(feature = $feature)]
        impl InTransaction for $conn {
            type Connection = $conn;
            fn __idem_connection(&mut self) -> &mut $conn {
                self
            }
            fn __idem_sql(&mut self) -> Connection<'_> {
                Connection::$variant(self)
            }
        }
        #[cfg(feature = $feature)]
        impl InTransaction for sqlx::Transaction<'_, $db> {
            type Connection = $conn;
            fn __idem_connection(&mut self) -> &mut $conn {
                self
            }
            fn __idem_sql(&mut self) -> Connection<'_> {
                Connection::$variant(self)
            }
        }
        #[cfg(feature = $feature)]
        impl InTransaction for sqlx::pool::PoolConnection<$db> {
            type Connection = $conn;
            fn __idem_connection(&mut self) -> &mut $conn {
                self
            }
            fn __idem_sql(&mut self) -> Connection<'_> {
                Connection::$variant(self)
            }
        }
    };
}

in_transaction_for!("postgres", sqlx::Postgres, sqlx::PgConnection, Postgres);
in_transaction_for!("mysql", sqlx::MySql, sqlx::MySqlConnection, MySql);

impl Call {
    /// Runs `body` at most once per key **inside the caller's transaction** `tx` (pass
    /// `&mut tx` from `pool.begin()`: a `&mut sqlx::Transaction<'_, Postgres>` or
    /// `&mut sqlx::Transaction<'_, MySql>`, or the transaction's connection): the
    /// claim and the stored result are written on `tx`, so they commit or roll back with the
    /// body's own writes on it. The caller commits (or rolls back) afterwards, as always. An
    /// `Err` releases the key inside the transaction. The handle's store must be of the
    /// transaction's database (PostgreSQL or MySQL), else `Error::Config`.
    ///
    /// A concurrent duplicate waits on the first transaction's row lock and then replays (it
    /// committed) or runs (it rolled back); nothing renews a lease, since the row lock is one.
    ///
    /// ```no_run
    /// # use idem_runtime as idem;
    /// use idem::postgres::{sqlx, PostgresStore};
    /// # async fn demo(store: PostgresStore) -> Result<(), idem::Error> {
    /// let db = |e| idem::Error::store("postgres", "app", e);
    /// let idem = idem::Idem::from_store(store.clone());
    /// let mut tx = store.pool().begin().await.map_err(db)?;
    /// let receipt = idem.call("orders.v1").key("order-42").in_transaction(&mut tx, async |conn| {
    ///     sqlx::query("INSERT INTO orders (id) VALUES (42)")
    ///         .execute(&mut *conn)
    ///         .await
    ///         .map_err(|e| idem::Error::store("postgres", "body", e))?;
    ///     Ok::<_, idem::Error>(42u64)
    /// })
    /// .await?;
    /// tx.commit().await.map_err(db)?;
    /// # let _ = receipt; Ok(()) }
    /// ```
    pub async fn in_transaction<T, E, C, F>(self, tx: &mut C, body: F) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        C: InTransaction + ?Sized,
        F: AsyncFnOnce(&mut C::Connection) -> Result<T, E>,
    {
        self.in_transaction_with(ReleaseErrors, tx, body).await
    }

    /// Like [`Call::in_transaction`], with an error policy ([`crate::KeepErrors`] stores every
    /// `Err` in the transaction).
    pub async fn in_transaction_with<T, E, P, C, F>(
        self,
        policy: P,
        tx: &mut C,
        body: F,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize + DeserializeOwned,
        E: From<Error>,
        P: ErrorPolicy<E>,
        C: InTransaction + ?Sized,
        F: AsyncFnOnce(&mut C::Connection) -> Result<T, E>,
    {
        let attempt = match TxAttempt::claim(self, &mut *tx, &policy, E::from).await {
            TxBegun::Run(attempt) => attempt,
            TxBegun::Done(done) => return done,
        };
        let result = attempt.scope(body(tx.__idem_connection())).await;
        attempt.finish(tx, result, &policy, E::from).await
    }
}

/// What a transactional claim found.
pub(crate) enum TxBegun<T, E> {
    /// This transaction holds the key.
    Run(Box<TxAttempt>),
    /// Replayed, or an idempotency failure: the body does not run.
    Done(Result<Outcome<T>, E>),
}

/// A transactional call that holds its key: run the body on the same transaction (in
/// [`TxAttempt::scope`]), then [`TxAttempt::finish`] there, before the caller commits.
pub(crate) struct TxAttempt {
    call: Prepared,
    token: u64,
    obs: Obs,
    /// When the claim took over an abandoned attempt.
    recovery: Option<Recovery>,
    /// What the body's reconcile decided.
    reconciled: Arc<AtomicU8>,
}

impl TxAttempt {
    /// Claims the key of `call` on `conn`, which must be inside a transaction. Idem's own
    /// errors become the caller's through `into`, here.
    pub(crate) async fn claim<T, E, P, C>(
        call: Call,
        conn: &mut C,
        policy: &P,
        into: fn(Error) -> E,
    ) -> TxBegun<T, E>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
        C: InTransaction + ?Sized,
    {
        let mut obs = Obs::new(observe::call_span(call.name()), call.name().clone());
        let begun = match call.prepare() {
            // The handle cloned: the executor borrows it while the attempt takes the call.
            Ok(call) => match executor(conn, &call.idem.clone()) {
                Ok(mut exec) => match call.begin(&mut *exec, &mut obs, policy).await {
                    Begun::Run {
                        token, takeover, ..
                    } => {
                        let recovery = match takeover {
                            Some(t) => call.take_over(&mut *exec, &mut obs, token, t).await,
                            None => Ok(None),
                        };
                        drop(exec);
                        match recovery {
                            Ok(recovery) => {
                                return TxBegun::Run(Box::new(TxAttempt {
                                    call,
                                    token,
                                    obs,
                                    recovery,
                                    reconciled: Default::default(),
                                }))
                            }
                            Err(failed) => Err(failed),
                        }
                    }
                    Begun::Done(done) => done,
                },
                Err(e) => Err(Failed::Idem(e)),
            },
            Err(e) => Err(Failed::Idem(e)),
        };
        TxBegun::Done(begun.map_err(|failed| failed.into_err(&mut obs, into)))
    }

    /// Runs `body` as this call's body: `current_key()` and `current_token()` answer in it.
    pub(crate) fn scope<F: Future>(&self, body: F) -> impl Future<Output = F::Output> {
        let mut context = self.call.context(self.token, self.recovery);
        context.reconciled = self.reconciled.clone();
        CURRENT.scope(context, body)
    }

    /// Stores the body's result on `conn` (or releases the key), and returns it.
    pub(crate) async fn finish<T, E, P, C>(
        mut self,
        conn: &mut C,
        result: Result<T, E>,
        policy: &P,
        into: fn(Error) -> E,
    ) -> Result<Outcome<T>, E>
    where
        T: Serialize,
        P: ErrorPolicy<E>,
        C: InTransaction + ?Sized,
    {
        // The handle's store matched the transaction at the claim, and a handle's store never
        // changes; this only fails for a connection of another database than the claim's.
        let finished = match executor(conn, &self.call.idem) {
            Ok(mut exec) => {
                let obs = &mut self.obs;
                self.call
                    .settle(
                        &mut *exec,
                        obs,
                        self.token,
                        None,
                        policy,
                        result,
                        self.recovery,
                        &self.reconciled,
                    )
                    .await
            }
            Err(e) => Err(Failed::Idem(e)),
        };
        finished.map_err(|failed| failed.into_err(&mut self.obs, into))
    }
}
