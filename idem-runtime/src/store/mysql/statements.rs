//! The statements of one table, built once at open (the table name is configurable).
//!
//! Every time is the server's, one instant per statement (MySQL evaluates its time functions
//! once, when the statement starts): [`CLOCK`], milliseconds since the Unix epoch.

use super::schema::Table;

/// The server's clock in milliseconds since the Unix epoch. `UTC_TIMESTAMP(3)` rather than
/// `UNIX_TIMESTAMP(NOW(3))`: the latter goes through the session's time zone and back, which
/// is ambiguous for the repeated hour when a zone leaves daylight saving time.
pub(crate) const CLOCK: &str =
    "CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(3)) DIV 1000 AS SIGNED)";

/// The columns of a record as [`super::record_from`] decodes them (the clock is appended).
const COLUMNS: &str = "`name`, `fingerprint`, `token`, `status`, `value`, `created_at`, \
     `expires_at`, `attempt`, `keep_until`";

/// The bit a claim adds to its insert id when it took over an abandoned attempt (tokens are
/// microseconds since the epoch, far below it); the attempt number and the abandoned attempt's
/// start are then in the session's `@idem_attempt` and `@idem_abandoned_at`.
pub(crate) const TAKEOVER_FLAG: u64 = 1 << 62;

/// The statements of one table.
#[derive(Debug)]
pub(crate) struct Sql {
    pub(crate) claim: String,
    pub(crate) get: String,
    pub(crate) get_for_update: String,
    pub(crate) occupant: String,
    pub(crate) strip: String,
    pub(crate) complete: String,
    pub(crate) complete_again: String,
    pub(crate) release: String,
    pub(crate) complete_locked: String,
    pub(crate) release_locked: String,
    pub(crate) renew: String,
    pub(crate) purge: String,
    pub(crate) force_select: String,
    pub(crate) end: String,
    pub(crate) park: String,
    pub(crate) abandon: String,
    pub(crate) resolve_select: String,
    pub(crate) resolve: String,
}

impl Sql {
    pub(crate) fn new(t: &Table) -> Sql {
        let r = &t.records;
        // Not `protocol::occupied`: neither live nor a tombstone (completed, its TTL over,
        // still kept). Once `status` is assigned below, a row it was true of stays so.
        let lapsed =
            format!("(`expires_at` <= {CLOCK} AND NOT (`status` = 1 AND `keep_until` > {CLOCK}))");
        // `protocol::abandoned` of a row that lapsed.
        let abandoned = format!("`status` = 0 AND `keep_until` >= {CLOCK}");
        let flag = TAKEOVER_FLAG;
        // `protocol::holds`: the token holds a row in progress with it that is live.
        let locked = "`key` = ? AND `token` = ? AND `status` = 0";
        let holds = format!("{locked} AND `expires_at` > {CLOCK}");
        let complete = |cond: &str| {
            format!(
                "UPDATE {r} SET `status` = 1, `value` = ?, `expires_at` = {CLOCK} + ?, \
                 `keep_until` = `expires_at` + ? WHERE {cond}"
            )
        };
        // A release ends the row (`protocol::ended_at`) rather than deleting it: its token
        // stays, for the next claim to pass, and its status says it was not abandoned.
        let release = |cond: &str| {
            format!(
                "UPDATE {r} SET `status` = 2, `expires_at` = {CLOCK}, `keep_until` = {CLOCK} \
                 WHERE {cond}"
            )
        };
        let get = format!(
            "SELECT {COLUMNS}, {CLOCK} FROM {r} WHERE `key` = ? AND `expires_at` > {CLOCK}"
        );
        // What a claim that lost reads: the live row, or a tombstone without its value.
        let occupant = format!(
            "SELECT `name`, `fingerprint`, `token`, `status`, \
             IF(`expires_at` > {CLOCK}, `value`, NULL), `created_at`, `expires_at`, `attempt`, \
             `keep_until`, {CLOCK} FROM {r} WHERE `key` = ? AND (`expires_at` > {CLOCK} \
             OR (`status` = 1 AND `keep_until` > {CLOCK}))"
        );
        Sql {
            // Parameters: key, name, fingerprint, lease, keep (`max(lease, ttl)`), then name,
            // fingerprint, keep, lease again (MySQL 8 deprecates `VALUES(col)` in this clause,
            // MariaDB lacks the row alias that replaces it).
            //
            // A missing key is inserted. An existing row takes the `ON DUPLICATE KEY UPDATE`
            // branch under an exclusive row lock, where every column keeps its value unless the
            // row is no longer live; `expires_at` is assigned last because MySQL evaluates the
            // assignments in order and later ones see the earlier ones' results.
            //
            // The outcome travels in the OK packet's insert id, which `LAST_INSERT_ID(expr)`
            // sets for the client: the new fencing token when the row was inserted or taken
            // over, 0 when a live row was left alone. (The affected-row count cannot tell an
            // insert from an untouched row: sqlx connects with CLIENT_FOUND_ROWS, which counts
            // both as 1.) A takeover of an abandoned attempt adds [`TAKEOVER_FLAG`] and leaves
            // the attempt number and the abandoned attempt's `created_at` in session variables,
            // read by a second statement on the same connection only then (a takeover is the
            // rare path of a crash's recovery).
            claim: format!(
                "INSERT INTO {r} \
                   (`key`, `name`, `fingerprint`, `token`, `status`, `value`, `created_at`, \
                    `expires_at`, `attempt`, `keep_until`) \
                 VALUES (?, ?, ?, LAST_INSERT_ID({CLOCK} * 1000), 0, NULL, {CLOCK}, {CLOCK} + ?, \
                         1, {CLOCK} + ?) \
                 ON DUPLICATE KEY UPDATE \
                   `token` = IF({lapsed}, \
                                LAST_INSERT_ID(GREATEST(`token` + 1, {CLOCK} * 1000) \
                                               + IF({abandoned}, {flag}, 0)) \
                                - IF({abandoned}, {flag}, 0), \
                                `token` + LAST_INSERT_ID(0)), \
                   `attempt` = IF({lapsed}, \
                                  IF({abandoned}, \
                                     CASE WHEN (@idem_abandoned_at := `created_at`) IS NULL \
                                          THEN NULL ELSE (@idem_attempt := `attempt` + 1) END, \
                                     1), \
                                  `attempt`), \
                   `name` = IF({lapsed}, ?, `name`), \
                   `fingerprint` = IF({lapsed}, ?, `fingerprint`), \
                   `value` = IF({lapsed}, IF({abandoned}, `value`, NULL), `value`), \
                   `status` = IF({lapsed}, 0, `status`), \
                   `created_at` = IF({lapsed}, {CLOCK}, `created_at`), \
                   `keep_until` = IF({lapsed}, {CLOCK} + ?, `keep_until`), \
                   `expires_at` = IF({lapsed}, {CLOCK} + ?, `expires_at`)"
            ),
            // Inside a caller's transaction the claim's read must see the row the upsert just
            // locked, not the transaction's older snapshot: a locking read sees the latest
            // version (and the lock is the upsert's already).
            get_for_update: format!("{occupant} FOR UPDATE"),
            occupant,
            get,
            complete: complete(&holds),
            // In the transactional mode the row lock is the lease (see `crate::transaction`):
            // no other attempt can end or take over the row while the transaction is open, so a
            // body that outlasts the lease still completes.
            complete_locked: complete(locked),
            // After a lost connection: the first attempt may have landed; only this attempt
            // holds this token, so a completed record with it is our own completion.
            complete_again: format!(
                "UPDATE {r} SET `status` = 1, `value` = ?, `expires_at` = {CLOCK} + ?, \
                 `keep_until` = `expires_at` + ? WHERE `key` = ? AND `token` = ? \
                   AND (`status` = 1 OR (`status` = 0 AND `expires_at` > {CLOCK}))"
            ),
            release: release(&holds),
            release_locked: release(locked),
            // Affected rows count matched rows (CLIENT_FOUND_ROWS), so a renewal within the
            // lease's millisecond still answers 1.
            renew: format!(
                "UPDATE {r} SET `expires_at` = {CLOCK} + ?, \
                 `keep_until` = GREATEST(`keep_until`, `expires_at`) WHERE {holds}"
            ),
            park: format!(
                "UPDATE {r} SET `status` = 3, `expires_at` = {max}, `keep_until` = {max} \
                 WHERE {holds}",
                max = i64::MAX
            ),
            // The lease ends now; `keep_until` stays, so the next claim finds it abandoned.
            abandon: format!("UPDATE {r} SET `expires_at` = {CLOCK} WHERE {holds}"),
            // A resolve: the live row locked, then, if it is parked, changed in the same
            // transaction (parameters: status, value, ttl or 0, key).
            resolve_select: format!(
                "SELECT {COLUMNS}, {CLOCK} FROM {r} \
                 WHERE `key` = ? AND `expires_at` > {CLOCK} FOR UPDATE"
            ),
            resolve: format!(
                "UPDATE {r} SET `status` = ?, `value` = ?, `expires_at` = {CLOCK} + ?, \
                 `keep_until` = `expires_at` WHERE `key` = ? AND `status` = 3"
            ),
            // Oldest first along the expiry index, bounded; the condition is checked on the
            // latest version of each row, so a record taken over meanwhile is spared. Strictly
            // before now (`protocol::may_forget` of `keep_until`): a row that ended this
            // millisecond keeps its token for claims in it, an abandoned one stays as long as
            // its claim asked. The `expires_at` condition never lets a live row go.
            purge: format!(
                "DELETE FROM {r} WHERE `keep_until` < {CLOCK} AND `expires_at` < {CLOCK} \
                 ORDER BY `keep_until` LIMIT ?"
            ),
            // A tombstone's value goes once its TTL is over: only its fingerprint is read.
            strip: format!(
                "UPDATE {r} SET `value` = NULL WHERE `status` = 1 AND `expires_at` <= {CLOCK} \
                 AND `keep_until` > {CLOCK} AND `value` IS NOT NULL LIMIT ?"
            ),
            // An operator's forced release: the live row whatever its state, locked until it
            // is ended in the same transaction (ended, not deleted: its token stays).
            force_select: format!(
                "SELECT {COLUMNS}, {CLOCK} FROM {r} \
                 WHERE `key` = ? AND `expires_at` > {CLOCK} FOR UPDATE"
            ),
            end: format!(
                "UPDATE {r} SET `status` = 2, `expires_at` = {CLOCK}, `keep_until` = {CLOCK} \
                 WHERE `key` = ?"
            ),
        }
    }
}
