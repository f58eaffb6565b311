//! The statements of one table: one per protocol step, built once when the store opens (the
//! table name is configurable), each one round trip.

use super::schema::Table;
use super::CLOCK;

/// The statements of one table, built once.
pub(super) struct Sql {
    pub(super) claim: String,
    pub(super) complete: String,
    pub(super) complete_again: String,
    pub(super) release: String,
    pub(super) complete_locked: String,
    pub(super) release_locked: String,
    pub(super) mark_waiting: String,
    pub(super) renew: String,
    pub(super) get: String,
    pub(super) purge: String,
    pub(super) force_release: String,
}

impl Sql {
    pub(super) fn new(t: &Table, notify: bool) -> Sql {
        let r = &t.records;
        let cols = "name, fingerprint, token, status, value, created_at, expires_at";
        // `$n` is the channel parameter of a statement that notifies; the column is a boolean
        // either way (the notification itself is sent when the statement commits). Only a row
        // that a waiter marked (`waiters`, see `mark_waiting`) notifies: NOTIFY serializes
        // committing transactions on a cluster-wide lock, which halved the throughput of fresh
        // calls at 64 connections when every completion sent one.
        let notify_expr = |rel: &str, n: u8| {
            if notify {
                format!(
                    "CASE WHEN {rel}.waiters THEN pg_notify(${n}, encode({rel}.key, 'hex')) IS NULL \
                     ELSE TRUE END"
                )
            } else {
                format!("${n}::text IS NULL")
            }
        };
        // `protocol::holds`: the token holds a row in progress with it that is live.
        let holds = format!("key = $1 AND token = $2 AND status = 0 AND expires_at > {CLOCK}");
        // In the transactional mode the row lock is the lease (see `crate::transaction`): no
        // other attempt can end or take over the row while the transaction is open, so a body
        // that outlasts the lease still completes.
        let locked = "key = $1 AND token = $2 AND status = 0";
        let complete = |cond: &str| {
            format!(
                "UPDATE {r} AS u SET status = 1, value = $3, expires_at = {CLOCK} + $4 \
                 WHERE {cond} RETURNING {}",
                notify_expr("u", 5)
            )
        };
        // A release ends the row (`protocol::ended_at`) rather than deleting it: its token
        // stays, for the next claim to pass.
        let release = |cond: &str| {
            format!(
                "UPDATE {r} AS d SET expires_at = {CLOCK} WHERE {cond} RETURNING {}",
                notify_expr("d", 3)
            )
        };
        Sql {
            // A live row in the statement's snapshot is answered without touching it (a
            // replay is a pure read: no row lock, no WAL); otherwise the upsert runs, and takes
            // over a row that is not live.
            claim: format!(
                "WITH live AS MATERIALIZED ( \
                   SELECT e.name, e.fingerprint, e.token, e.status, e.value, e.created_at, \
                          e.expires_at \
                     FROM {r} e WHERE e.key = $1 AND e.expires_at > {CLOCK}), \
                 ins AS ( \
                   INSERT INTO {r} AS r (key, name, fingerprint, token, status, value, created_at, expires_at) \
                   SELECT $1, $2, $3, {CLOCK} * 1000, 0, NULL, {CLOCK}, {CLOCK} + $4 \
                    WHERE NOT EXISTS (SELECT 1 FROM live) \
                   ON CONFLICT (key) DO UPDATE SET \
                     name = EXCLUDED.name, fingerprint = EXCLUDED.fingerprint, \
                     token = GREATEST(r.token + 1, EXCLUDED.token), status = 0, value = NULL, \
                     created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at \
                   WHERE r.expires_at <= EXCLUDED.created_at \
                   RETURNING r.token) \
                 SELECT TRUE AS claimed, NULL::text, NULL::bytea, ins.token, NULL::smallint, \
                        NULL::bytea, NULL::bigint, NULL::bigint, {CLOCK} \
                   FROM ins \
                 UNION ALL \
                 SELECT FALSE, live.*, {CLOCK} FROM live"
            ),
            complete: complete(&holds),
            complete_locked: complete(locked),
            // After a lost connection: the first attempt may have landed; only this attempt
            // holds this token, so a completed record with it is our own completion.
            complete_again: format!(
                "UPDATE {r} AS u SET status = 1, value = $3, expires_at = {CLOCK} + $4 \
                 WHERE key = $1 AND token = $2 \
                   AND (status = 1 OR (status = 0 AND expires_at > {CLOCK})) RETURNING {}",
                notify_expr("u", 5)
            ),
            release: release(&holds),
            release_locked: release(locked),
            // A waiter asks the key's completion to notify. True when the row is in progress
            // with `waiters` set (by this statement or an earlier waiter): its completion, or
            // its release, is then bound to see the mark and notify. False when it is not in
            // progress (any more), so the waiter reads again at once. Only the first waiter
            // writes; the others find the mark in place.
            mark_waiting: format!(
                "WITH m AS (UPDATE {r} SET waiters = TRUE WHERE key = $1 AND status = 0 \
                       AND NOT waiters AND expires_at > {CLOCK} RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM m) OR EXISTS (SELECT 1 FROM {r} e \
                   WHERE e.key = $1 AND e.status = 0 AND e.waiters AND e.expires_at > {CLOCK})"
            ),
            renew: format!("UPDATE {r} SET expires_at = {CLOCK} + $3 WHERE {holds}"),
            get: format!(
                "SELECT {cols}, {CLOCK} FROM {r} WHERE key = $1 AND expires_at > {CLOCK}"
            ),
            // The clock is written inline: `statement_timestamp()` is stable, so the planner
            // bounds the index scan with it (`Index Cond: expires_at <= …`). Behind a CTE it
            // could only filter, and a batch that found fewer than `n` expired rows (the last
            // one of every purge, and every reaper tick on a clean table) walked the whole
            // index: 1.6 s at 2 M live rows. The rows are deleted by the `ctid` their lock
            // returned rather than looked up again by key: the lock is held to the delete, so
            // the tuple cannot move, and a primary-key probe per row is saved (a batch of
            // 1 000 took 4.5 ms instead of 14). Strictly before now (`protocol::may_forget`):
            // a row that ended this millisecond keeps its token for claims in it.
            purge: format!(
                "DELETE FROM {r} WHERE ctid = ANY(ARRAY( \
                   SELECT e.ctid FROM {r} e WHERE e.expires_at < {CLOCK} \
                    ORDER BY e.expires_at LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                   AND expires_at < {CLOCK}"
            ),
            // Ends the live row, whatever its state, and answers it as it was (an UPDATE's
            // RETURNING shows the row after the change). The lock taken by the read holds the
            // row to the update, so the two see one version. Every release is announced on the
            // releases channel (`$3`), whatever the `notify` option: other instances' caches
            // forget the key (`Store::releases`). Releases are rare, so the NOTIFY's commit
            // lock costs nothing that matters.
            force_release: format!(
                "WITH old AS ( \
                   SELECT {cols} FROM {r} WHERE key = $1 AND expires_at > {CLOCK} FOR UPDATE), \
                 ended AS (UPDATE {r} AS d SET expires_at = {CLOCK} FROM old WHERE d.key = $1 \
                   RETURNING {} AS notified, \
                     pg_notify($3, encode(d.key, 'hex')) IS NULL AS announced) \
                 SELECT old.*, {CLOCK}, ended.notified, ended.announced FROM old, ended",
                notify_expr("d", 2)
            ),
        }
    }
}
