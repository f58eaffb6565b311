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
    pub(super) strip: String,
    pub(super) force_release: String,
    pub(super) park: String,
    pub(super) abandon: String,
    pub(super) resolve: String,
}

impl Sql {
    pub(super) fn new(t: &Table, notify: bool) -> Sql {
        let r = &t.records;
        let cols =
            "name, fingerprint, token, status, value, created_at, expires_at, attempt, keep_until";
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
        // `protocol::occupied`: live, or a tombstone (completed, its TTL over, still kept); a
        // claim finds either, and a tombstone without its value.
        let occupied =
            format!("(e.expires_at > {CLOCK} OR (e.status = 1 AND e.keep_until > {CLOCK}))");
        let complete = |cond: &str| {
            format!(
                "UPDATE {r} AS u SET status = 1, value = $3, expires_at = {CLOCK} + $4, \
                 keep_until = {CLOCK} + $4 + $6 WHERE {cond} RETURNING {}",
                notify_expr("u", 5)
            )
        };
        // A release ends the row (`protocol::ended_at`) rather than deleting it: its token
        // stays, for the next claim to pass, and its status says it was not abandoned.
        let release = |cond: &str| {
            format!(
                "UPDATE {r} AS d SET status = 2, expires_at = {CLOCK}, keep_until = {CLOCK} \
                 WHERE {cond} RETURNING {}",
                notify_expr("d", 3)
            )
        };
        Sql {
            // A live row in the statement's snapshot is answered without touching it (a
            // replay is a pure read: no row lock, no WAL); otherwise the upsert runs, and takes
            // over a row that is not live.
            //
            // `old` locks the row that is not live (`FOR UPDATE` reads its latest version, and
            // skips it if that one is live), and the upsert replaces only that version: so the
            // claimed row answers with the attempt number the upsert computed from it and with
            // its `created_at`, the abandoned attempt's start (in the `created_at` column). A
            // row that appeared after the snapshot is replaced by nobody here: neither claimed
            // nor found, the statement runs again. `$5` is `max(lease, ttl)`.
            claim: format!(
                "WITH live AS MATERIALIZED ( \
                   SELECT e.name, e.fingerprint, e.token, e.status, \
                          CASE WHEN e.expires_at > {CLOCK} THEN e.value END, e.created_at, \
                          e.expires_at, e.attempt, e.keep_until \
                     FROM {r} e WHERE e.key = $1 AND {occupied}), \
                 old AS MATERIALIZED ( \
                   SELECT e.token, e.created_at FROM {r} e \
                    WHERE e.key = $1 AND NOT {occupied} FOR UPDATE), \
                 ins AS ( \
                   INSERT INTO {r} AS r (key, name, fingerprint, token, status, value, created_at, \
                                         expires_at, attempt, keep_until) \
                   SELECT $1, $2, $3, {CLOCK} * 1000, 0, NULL, {CLOCK}, {CLOCK} + $4, 1, {CLOCK} + $5 \
                    WHERE NOT EXISTS (SELECT 1 FROM live) \
                   ON CONFLICT (key) DO UPDATE SET \
                     name = EXCLUDED.name, fingerprint = EXCLUDED.fingerprint, \
                     token = GREATEST(r.token + 1, EXCLUDED.token), status = 0, \
                     value = CASE WHEN r.status = 0 AND r.keep_until >= EXCLUDED.created_at \
                                  THEN r.value END, \
                     created_at = EXCLUDED.created_at, expires_at = EXCLUDED.expires_at, \
                     attempt = CASE WHEN r.status = 0 AND r.keep_until >= EXCLUDED.created_at \
                                    THEN r.attempt + 1 ELSE 1 END, \
                     keep_until = EXCLUDED.keep_until \
                   WHERE r.expires_at <= EXCLUDED.created_at \
                     AND NOT (r.status = 1 AND r.keep_until > EXCLUDED.created_at) \
                     AND r.token IS NOT DISTINCT FROM (SELECT o.token FROM old o) \
                   RETURNING r.token, r.attempt) \
                 SELECT TRUE AS claimed, NULL::text, NULL::bytea, ins.token, NULL::smallint, \
                        NULL::bytea, (SELECT o.created_at FROM old o), NULL::bigint, ins.attempt, \
                        NULL::bigint, {CLOCK} \
                   FROM ins \
                 UNION ALL \
                 SELECT FALSE, live.*, {CLOCK} FROM live"
            ),
            complete: complete(&holds),
            complete_locked: complete(locked),
            // After a lost connection: the first attempt may have landed; only this attempt
            // holds this token, so a completed record with it is our own completion.
            complete_again: format!(
                "UPDATE {r} AS u SET status = 1, value = $3, expires_at = {CLOCK} + $4, \
                 keep_until = {CLOCK} + $4 + $6 WHERE key = $1 AND token = $2 \
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
            renew: format!(
                "UPDATE {r} SET expires_at = {CLOCK} + $3, \
                 keep_until = GREATEST(keep_until, {CLOCK} + $3) WHERE {holds}"
            ),
            park: format!(
                "UPDATE {r} SET status = 3, expires_at = {MAX}, keep_until = {MAX} WHERE {holds}",
                MAX = i64::MAX
            ),
            // The lease ends now; `keep_until` stays, so the next claim finds it abandoned.
            abandon: format!("UPDATE {r} SET expires_at = {CLOCK} WHERE {holds}"),
            // Only a parked row, locked by the read so that the answer is the row as it was;
            // `$2` true for applied (`$3` the value, `$4` the ttl), false for not applied. The
            // live row found is returned either way, with whether it was resolved.
            resolve: format!(
                "WITH old AS ( \
                   SELECT {cols} FROM {r} WHERE key = $1 AND expires_at > {CLOCK} FOR UPDATE), \
                 done AS (UPDATE {r} AS d SET \
                     status = CASE WHEN $2 THEN 1 ELSE 2 END, \
                     value = CASE WHEN $2 THEN $3 ELSE NULL END, \
                     expires_at = CASE WHEN $2 THEN {CLOCK} + $4 ELSE {CLOCK} END, \
                     keep_until = CASE WHEN $2 THEN {CLOCK} + $4 ELSE {CLOCK} END \
                   FROM old WHERE d.key = $1 AND old.status = 3 RETURNING 1) \
                 SELECT old.*, {CLOCK}, EXISTS (SELECT 1 FROM done) FROM old"
            ),
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
            // a row that ended this millisecond keeps its token for claims in it. By
            // `keep_until`, which an abandoned attempt's claim set past its lease; the
            // `expires_at` condition never lets a live row go, whatever wrote it.
            purge: format!(
                "DELETE FROM {r} WHERE ctid = ANY(ARRAY( \
                   SELECT e.ctid FROM {r} e WHERE e.keep_until < {CLOCK} \
                      AND e.expires_at < {CLOCK} \
                    ORDER BY e.keep_until LIMIT $1 FOR UPDATE SKIP LOCKED)) \
                   AND keep_until < {CLOCK} AND expires_at < {CLOCK}"
            ),
            // A tombstone's value goes once its TTL is over: only its fingerprint is read.
            strip: format!(
                "UPDATE {r} SET value = NULL WHERE ctid = ANY(ARRAY( \
                   SELECT e.ctid FROM {r} e WHERE e.status = 1 AND e.expires_at <= {CLOCK} \
                      AND e.keep_until > {CLOCK} AND e.value IS NOT NULL \
                    LIMIT $1 FOR UPDATE SKIP LOCKED))"
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
                 ended AS (UPDATE {r} AS d SET status = 2, expires_at = {CLOCK}, \
                   keep_until = {CLOCK} FROM old WHERE d.key = $1 \
                   RETURNING {} AS notified, \
                     pg_notify($3, encode(d.key, 'hex')) IS NULL AS announced) \
                 SELECT old.*, {CLOCK}, ended.notified, ended.announced FROM old, ended",
                notify_expr("d", 2)
            ),
        }
    }
}
