//! What operators do with an outbox (the `idem outbox` commands): list its messages (as
//! listing.rs describes them), purge delivered ones, and report its gauges. Opening one by URL
//! without creating anything is each database's (`Outbox::connect`, `Outbox::connect_mysql`).

use super::dialect::{Dialect, OutboxDatabase};
use super::listing::{ListFilter, MessageInfo, MessageState};
use super::{Outbox, OutboxStats};
use crate::error::Error;
use std::time::Duration;

impl<Db: OutboxDatabase> Outbox<Db> {
    /// The messages `filter` selects, oldest first.
    pub async fn list(&self, filter: &ListFilter) -> Result<Vec<MessageInfo>, Error> {
        self.dialect().list(self.pool(), filter).await
    }

    /// The state of the message `id`, `None` when there is none (never enqueued, or purged).
    pub async fn state_of(&self, id: &str) -> Result<Option<MessageState>, Error> {
        let status = self.dialect().status_of(self.pool(), id).await?;
        Ok(status.and_then(MessageState::from_code))
    }

    /// Deletes the messages delivered more than `older_than` ago (what each relay does every
    /// `purge_every` with its retention) and returns how many. Pending and dead messages are
    /// never deleted.
    pub async fn purge_delivered(&self, older_than: Duration) -> Result<u64, Error> {
        self.dialect()
            .purge_delivered(self.pool(), older_than)
            .await
    }

    /// Reads [`Outbox::stats`] and, with the feature `metrics`, sets the gauges
    /// `idem_outbox_pending`, `idem_outbox_dead` and `idem_outbox_oldest_pending_seconds`
    /// (label `table`) from it. A running [`Relay`](super::Relay) does this itself every
    /// [`RelayOptions::metrics_every`](super::RelayOptions::metrics_every); call it from your
    /// own scheduler when no relay runs in the process that exports metrics.
    pub async fn report_metrics(&self) -> Result<OutboxStats, Error> {
        let stats = self.stats().await?;
        crate::observe::outbox_gauges(
            self.table(),
            stats.pending,
            stats.dead,
            stats.oldest_pending,
        );
        Ok(stats)
    }
}
