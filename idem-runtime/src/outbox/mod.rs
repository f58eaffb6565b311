//! The transactional outbox (feature `outbox` on PostgreSQL, `outbox-mysql` on MySQL and
//! MariaDB): a message to another system is
//! written **in the same transaction** as the business rows and the idempotency record, and a
//! [`Relay`] delivers the committed ones, at least once, in order per ordering key, to a
//! [`Publisher`] (NATS JetStream with feature `outbox-nats`, HTTP webhooks with
//! `outbox-webhook`, or your own).
//!
//! ```no_run
//! # use idem_runtime as idem;
//! use idem::outbox::{Message, Outbox};
//! use idem::postgres::sqlx::{self, Postgres, Transaction};
//! # async fn demo(pool: sqlx::PgPool, store: idem::Idem) -> Result<(), idem::Error> {
//! let outbox = Outbox::new(pool.clone()).migrate().await?;
//! let mut tx = pool.begin().await.map_err(|e| idem::Error::store("postgres", "begin", e))?;
//! // … the business rows, on `tx` (typically inside `#[idempotent(transaction = tx)]`) …
//! outbox
//!     .enqueue(&mut tx, Message::json("order.placed", &serde_json::json!({"order": 42}))?.ordering_key("order-42"))
//!     .await?;
//! tx.commit().await.map_err(|e| idem::Error::store("postgres", "commit", e))?;
//! # Ok(()) }
//! ```
//!
//! # The message id
//!
//! Inside an idempotent call the id is derived from [`crate::current_key`] (the logical call,
//! the same on every retry) and the message's position in the call (its first `enqueue` is 0,
//! the next 1, …) or the name given with [`Message::name`]; the insert is
//! `ON CONFLICT (id) DO NOTHING` (MySQL: `ON DUPLICATE KEY UPDATE` that changes nothing), so a
//! retried call never enqueues a message twice. Outside a call, give the id ([`Message::id`])
//! or the database makes a random one. The publishers send
//! the id along (`Nats-Msg-Id`), so the consumer deduplicates on it: with an idempotent
//! consumer keyed on the message id, delivery is at least once and the effect exactly once.
//!
//! See docs/outbox.md for the guarantees and their limits.

mod admin;
mod dialect;
mod listing;
#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
mod relay;
mod schema;

#[cfg(feature = "outbox-nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox-nats")))]
pub mod nats;
#[cfg(feature = "outbox-webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "outbox-webhook")))]
pub mod webhook;

pub use dialect::OutboxDatabase;
pub use listing::{ListFilter, MessageInfo, MessageState};
pub use relay::{Delivery, Publisher, Relay, RelayOptions, RelayStats};
pub use schema::{DEFAULT_OUTBOX_TABLE, OUTBOX_SCHEMA_VERSION};

use crate::context;
use crate::error::{CodecError, CodecErrorKind, Error};
use crate::store::SchemaVersion;
use dialect::Dialect;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use sqlx::{Database, Pool};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The outbox table on a database: enqueue messages on a caller's transaction, start relays on
/// it. Cheap to clone.
///
/// `Outbox` (that is, `Outbox<sqlx::Postgres>`) is on PostgreSQL: [`Outbox::new`],
/// [`Outbox::with_table`]. `Outbox<sqlx::MySql>` is on MySQL or MariaDB (feature `mysql`):
/// `Outbox::mysql`, `Outbox::mysql_with_table`. Every other method is the same on both.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub struct Outbox<Db: OutboxDatabase = sqlx::Postgres> {
    inner: Arc<Inner<Db>>,
}

/// The outbox table on a database: enqueue messages on a caller's transaction, start relays on
/// it. Cheap to clone.
///
/// `Outbox<sqlx::MySql>` is on MySQL or MariaDB: `Outbox::mysql`, `Outbox::mysql_with_table`
/// (with the feature `postgres` too, `Outbox<sqlx::Postgres>` is on PostgreSQL).
#[cfg(not(feature = "postgres"))]
pub struct Outbox<Db: OutboxDatabase> {
    inner: Arc<Inner<Db>>,
}

struct Inner<Db: OutboxDatabase> {
    pool: Pool<Db>,
    dialect: Db::__Dialect,
}

impl<Db: OutboxDatabase> Clone for Outbox<Db> {
    fn clone(&self) -> Self {
        Outbox {
            inner: self.inner.clone(),
        }
    }
}

impl<Db: OutboxDatabase> std::fmt::Debug for Outbox<Db> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("dialect", &self.inner.dialect)
            .finish_non_exhaustive()
    }
}

impl<Db: OutboxDatabase> Outbox<Db> {
    /// The outbox in `table` of `pool`'s database (the constructors of each database).
    fn assemble(pool: Pool<Db>, table: &str) -> Result<Outbox<Db>, Error> {
        Ok(Outbox {
            inner: Arc::new(Inner {
                pool,
                dialect: Db::__Dialect::parse(table)?,
            }),
        })
    }

    pub(crate) fn dialect(&self) -> &Db::__Dialect {
        &self.inner.dialect
    }

    /// Creates or upgrades the outbox table (versioned, in `<table>_migrations`, under the same
    /// lock as the store's migrations of this database), and returns the outbox.
    pub async fn migrate(self) -> Result<Outbox<Db>, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| Db::__Dialect::error("outbox.migrate", e))?;
        self.inner.dialect.ensure(&mut conn, true).await?;
        Ok(self)
    }

    /// The schema version of the outbox table (0: none).
    pub async fn schema_version(&self) -> Result<SchemaVersion, Error> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| Db::__Dialect::error("outbox.migrate", e))?;
        self.inner.dialect.schema_version(&mut conn).await
    }

    /// The pool the relays read from.
    pub fn pool(&self) -> &Pool<Db> {
        &self.inner.pool
    }

    /// The table's name as given.
    pub fn table(&self) -> &str {
        self.inner.dialect.display()
    }

    /// Writes `message` on `conn` — the connection of the caller's open transaction (`&mut tx`,
    /// or the `conn` an `#[idempotent(transaction = conn)]` body holds) — so it is sent if and
    /// only if that transaction commits. Returns its id, and whether it was new: `false` when
    /// a message with this id was already enqueued (a retry of the same logical call), in
    /// which case nothing is written.
    ///
    /// A bare connection outside a transaction is refused (`Error::Config`): the message would
    /// be committed on its own, which is what an outbox is there to prevent. On MySQL an id or
    /// ordering key longer than 255 characters is `Error::Config` too.
    pub async fn enqueue(
        &self,
        conn: &mut <Db as Database>::Connection,
        message: Message,
    ) -> Result<Enqueued, Error> {
        if !sqlx::Connection::is_in_transaction(&*conn) {
            return Err(Error::config(
                "outbox: enqueue needs the connection of an open transaction (`&mut tx` from \
                 `pool.begin()`), so the message commits with the transaction's writes",
            ));
        }
        let id = message.resolve_id();
        let headers = serde_json::to_string(&message.headers).map_err(|e| {
            Error::Codec(CodecError {
                kind: CodecErrorKind::Encode,
                type_name: "outbox headers",
                message: e.to_string(),
            })
        })?;
        self.inner
            .dialect
            .enqueue(conn, id, &message, headers)
            .await
    }

    /// What is in the outbox now: for metrics (pending, oldest pending age, dead letters) and
    /// operators.
    pub async fn stats(&self) -> Result<OutboxStats, Error> {
        self.inner.dialect.stats(&self.inner.pool).await
    }

    /// Puts dead letters back in the queue with their attempts reset: the one with id `id`, or
    /// every one (`None`). Returns how many. The relays pick them up at their next round.
    pub async fn retry_dead(&self, id: Option<&str>) -> Result<u64, Error> {
        self.inner.dialect.retry_dead(&self.inner.pool, id).await
    }
}

/// What is in an outbox ([`Outbox::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxStats {
    /// Messages waiting for delivery (including those backing off after a failure).
    pub pending: u64,
    /// Delivered messages not yet purged.
    pub delivered: u64,
    /// Dead letters: failed `max_attempts` times.
    pub dead: u64,
    /// How long the oldest pending message has waited since it was enqueued.
    pub oldest_pending: Option<Duration>,
}

impl OutboxStats {
    /// From the counts a dialect reads: pending, delivered, dead, the oldest pending age in ms.
    fn from_counts((pending, delivered, dead, oldest): (i64, i64, i64, Option<i64>)) -> Self {
        OutboxStats {
            pending: pending.max(0) as u64,
            delivered: delivered.max(0) as u64,
            dead: dead.max(0) as u64,
            oldest_pending: oldest.map(|ms| Duration::from_millis(ms.max(0) as u64)),
        }
    }
}

/// What [`Outbox::enqueue`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Enqueued {
    /// The message id: what the publishers send along (`Nats-Msg-Id`, `Idempotency-Key`) for
    /// the consumer to deduplicate on.
    pub id: String,
    /// False when this id was already in the outbox (a retried call): nothing was written.
    pub new: bool,
}

/// A message to enqueue: a topic (a NATS subject, a webhook's URL path…), an ordering key
/// (messages with the same key are delivered one after the other, in enqueue order), a
/// payload and headers.
#[derive(Debug, Clone)]
pub struct Message {
    topic: String,
    ordering_key: String,
    payload: Vec<u8>,
    headers: BTreeMap<String, String>,
    id: Id,
}

#[derive(Debug, Clone)]
enum Id {
    Position,
    Named(String),
    Explicit(String),
}

impl Message {
    /// A message with these payload bytes, in the ordering key `""` until
    /// [`Message::ordering_key`] says otherwise.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> Message {
        Message {
            topic: topic.into(),
            ordering_key: String::new(),
            payload: payload.into(),
            headers: BTreeMap::new(),
            id: Id::Position,
        }
    }

    /// A message whose payload is `value` as JSON (header `content-type: application/json`).
    pub fn json<T: Serialize + ?Sized>(
        topic: impl Into<String>,
        value: &T,
    ) -> Result<Message, Error> {
        let payload = serde_json::to_vec(value).map_err(|e| {
            Error::Codec(CodecError {
                kind: CodecErrorKind::Encode,
                type_name: std::any::type_name::<T>(),
                message: e.to_string(),
            })
        })?;
        Ok(Message::new(topic, payload).header("content-type", "application/json"))
    }

    /// The ordering key: the relays deliver the messages of one key one at a time, in order.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Message {
        self.ordering_key = key.into();
        self
    }

    /// Adds a header (sent as a NATS header or an HTTP header).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Message {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Inside an idempotent call: derive the id from the call and this name instead of the
    /// message's position, so the id does not depend on how many messages came before (a body
    /// whose messages vary between attempts). Outside a call: the id is derived from the name
    /// alone.
    pub fn name(mut self, name: impl Into<String>) -> Message {
        self.id = Id::Named(name.into());
        self
    }

    /// This exact id, whatever call the message is enqueued in.
    pub fn id(mut self, id: impl Into<String>) -> Message {
        self.id = Id::Explicit(id.into());
        self
    }

    /// The id, or `None` for the database to make a random one (a positional message outside a
    /// call). Takes the message's position in the current call.
    fn resolve_id(&self) -> Option<String> {
        match &self.id {
            Id::Explicit(id) => Some(id.clone()),
            Id::Named(name) => {
                let call = context::current()
                    .map(|c| c.key.to_hex())
                    .unwrap_or_default();
                Some(derive_id(&call, "name", name))
            }
            Id::Position => context::next_position()
                .map(|(key, position)| derive_id(&key.to_hex(), "pos", &position.to_string())),
        }
    }
}

/// sha256 over a versioned, length-prefixed encoding of the call and the message's place in it.
fn derive_id(call: &str, kind: &str, what: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"idem.outbox.v1\0");
    for part in [call, kind, what] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    crate::key::Digest(h.finalize().into()).to_hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_distinct() {
        let a = derive_id("k", "pos", "0");
        assert_eq!(a, derive_id("k", "pos", "0"));
        assert_ne!(a, derive_id("k", "pos", "1"));
        assert_ne!(a, derive_id("k", "name", "0"));
        // Length prefixes: moving a character from one part to the next is another id.
        assert_ne!(derive_id("ab", "pos", "c"), derive_id("a", "pos", "bc"));
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn outside_a_call_a_positional_message_gets_a_database_id() {
        assert_eq!(Message::new("t", b"x".to_vec()).resolve_id(), None);
        assert_eq!(
            Message::new("t", b"x".to_vec()).id("m-1").resolve_id(),
            Some("m-1".into())
        );
    }
}
