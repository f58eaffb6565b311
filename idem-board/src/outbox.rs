//! The store's outbox, when it has one: PostgreSQL or MySQL, by the URL's scheme.

use idem::outbox::{ListFilter, MessageInfo, Outbox, OutboxStats};
use idem::postgres::sqlx::{MySql, Postgres};
use idem::Error;

/// An outbox on either database the outbox runs on.
pub(crate) enum OutboxHandle {
    Postgres(Outbox<Postgres>),
    Mysql(Outbox<MySql>),
}

/// The same call on whichever database.
macro_rules! each {
    ($handle:expr, $o:ident => $call:expr) => {
        match $handle {
            OutboxHandle::Postgres($o) => $call,
            OutboxHandle::Mysql($o) => $call,
        }
    };
}

impl OutboxHandle {
    /// The outbox table of the store at `url`, checked and not created; `None` when the store
    /// is not one the outbox runs on, or has no such table.
    pub(crate) async fn open(url: &str, table: &str) -> Option<OutboxHandle> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Outbox::connect_as(url, table, Some("idem-board"))
                .await
                .ok()
                .map(OutboxHandle::Postgres)
        } else if url.starts_with("mysql://") || url.starts_with("mariadb://") {
            Outbox::connect_mysql(url, table)
                .await
                .ok()
                .map(OutboxHandle::Mysql)
        } else {
            None
        }
    }

    pub(crate) fn table(&self) -> &str {
        each!(self, o => o.table())
    }

    pub(crate) async fn stats(&self) -> Result<OutboxStats, Error> {
        each!(self, o => o.stats().await)
    }

    pub(crate) async fn list(&self, filter: &ListFilter) -> Result<Vec<MessageInfo>, Error> {
        each!(self, o => o.list(filter).await)
    }

    /// Puts the dead letter `id` (or every one) back in the queue; how many.
    pub(crate) async fn retry_dead(&self, id: Option<&str>) -> Result<u64, Error> {
        each!(self, o => o.retry_dead(id).await)
    }
}
