//! The statements of one table, one per protocol step, built once at open because the table
//! name is configurable.

pub(super) const COLUMNS: &str =
    "name, fingerprint, token, status, value, created_at, expires_at, attempt, keep_until";

/// The statements, built once at open because the table name is configurable.
#[derive(Debug)]
pub(super) struct Statements {
    pub(super) select: String,
    pub(super) select_any: String,
    pub(super) claim: String,
    pub(super) complete: String,
    pub(super) strip: String,
    pub(super) release: String,
    pub(super) renew: String,
    pub(super) park: String,
    pub(super) abandon: String,
    pub(super) resolve: String,
    pub(super) purge: String,
    pub(super) force_release: String,
    pub(super) list: String,
    pub(super) list_tombstones: String,
    pub(super) stats: String,
}

impl Statements {
    pub(super) fn new(t: &str) -> Self {
        // `?1` now, `?2` newest claim time, `?3` name or NULL, `?4` status or NULL. The
        // value itself is left out (it may be large); its length is what a listing shows.
        let list = |listed: &str| {
            format!(
                "SELECT key, name, fingerprint, token, status, NULL AS value, \
                 length(value) AS size, created_at, expires_at, attempt, keep_until FROM {t} \
                 WHERE {listed} AND created_at <= ?2 AND (?3 IS NULL OR name = ?3) \
                 AND (?4 IS NULL OR status = ?4) ORDER BY created_at, key LIMIT ?5"
            )
        };
        Statements {
            select: format!("SELECT {COLUMNS} FROM {t} WHERE key = ?1 AND expires_at > ?2"),
            select_any: format!("SELECT {COLUMNS} FROM {t} WHERE key = ?1"),
            // The token is `protocol::next_token`: max(previous + 1, now in µs). The row it
            // replaces is the one the claim read just before (`?8`, its token, NULL for none),
            // whose attempt number (`?9`) the claim worked out: a row changed in between is
            // read again.
            claim: format!(
                "INSERT INTO {t} (key, name, fingerprint, token, status, value, created_at, \
                 expires_at, attempt, keep_until) \
                 VALUES (?1, ?2, ?3, ?4, 0, NULL, ?5, ?6, ?9, ?7) \
                 ON CONFLICT(key) DO UPDATE SET name = excluded.name, \
                 fingerprint = excluded.fingerprint, token = max({t}.token + 1, excluded.token), \
                 status = 0, value = CASE WHEN {t}.status = 0 AND \
                 {t}.keep_until >= excluded.created_at THEN {t}.value END, \
                 created_at = excluded.created_at, \
                 expires_at = excluded.expires_at, attempt = excluded.attempt, \
                 keep_until = excluded.keep_until \
                 WHERE {t}.expires_at <= excluded.created_at AND {t}.token IS ?8 \
                 RETURNING token"
            ),
            // The fenced steps: `?1` key, `?2` token, `?3` now, then the step's own. The token
            // holds while the row is in progress with it and live (`protocol::holds`).
            complete: format!(
                "UPDATE {t} SET status = 1, value = ?4, expires_at = ?5, keep_until = ?6 \
                 WHERE key = ?1 AND token = ?2 AND status = 0 AND expires_at > ?3"
            ),
            // A tombstone's value goes once its TTL is over: only its fingerprint is read.
            strip: format!(
                "UPDATE {t} SET value = NULL WHERE key IN (SELECT key FROM {t} \
                 WHERE status = 1 AND expires_at <= ?1 AND keep_until > ?1 \
                 AND value IS NOT NULL LIMIT ?2)"
            ),
            // A release ends the row (`protocol::ended_at`) rather than deleting it: its token
            // stays for the next claim to pass, and its status says it was not abandoned.
            release: format!(
                "UPDATE {t} SET status = 2, expires_at = ?4, keep_until = ?4 \
                 WHERE key = ?1 AND token = ?2 AND status = 0 AND expires_at > ?3"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = ?4, keep_until = max(keep_until, ?4) \
                 WHERE key = ?1 AND token = ?2 AND status = 0 AND expires_at > ?3"
            ),
            park: format!(
                "UPDATE {t} SET status = 3, expires_at = ?4, keep_until = ?4 \
                 WHERE key = ?1 AND token = ?2 AND status = 0 AND expires_at > ?3"
            ),
            // The lease ends now; `keep_until` stays, so the next claim finds it abandoned.
            abandon: format!(
                "UPDATE {t} SET expires_at = ?4 \
                 WHERE key = ?1 AND token = ?2 AND status = 0 AND expires_at > ?3"
            ),
            // The parked row read just before (`?2` its token), if still parked: `?3` the new
            // status, `?4` the value, `?5` the new end.
            resolve: format!(
                "UPDATE {t} SET status = ?3, value = ?4, expires_at = ?5, keep_until = ?5 \
                 WHERE key = ?1 AND token = ?2 AND status = 3"
            ),
            // Strictly before now (`protocol::may_forget` of `keep_until`): a row that ended
            // this millisecond keeps its token for claims in it, an abandoned one stays as long
            // as its claim asked. The `expires_at` condition never lets a live row go, whatever
            // wrote it.
            purge: format!(
                "DELETE FROM {t} WHERE key IN \
                 (SELECT key FROM {t} WHERE keep_until < ?1 AND expires_at < ?1 LIMIT ?2)"
            ),
            // Ends the row read just before if it is still that row (`?1` key, `?2` the end,
            // `?3` token, `?4` status, `?5` expires_at): SQLite's RETURNING shows the row after
            // the change, and the operator is shown the record as it was.
            force_release: format!(
                "UPDATE {t} SET status = 2, expires_at = ?2, keep_until = ?2 \
                 WHERE key = ?1 AND token = ?3 AND status = ?4 AND expires_at = ?5"
            ),
            list: list("expires_at > ?1"),
            list_tombstones: list("status = 1 AND expires_at <= ?1 AND keep_until > ?1"),
            // The codes of `State::from_code`.
            stats: format!(
                "SELECT name, CASE WHEN status = 3 THEN 3 WHEN expires_at > ?1 THEN status \
                 WHEN status = 0 AND keep_until >= ?1 THEN 4 \
                 WHEN status = 1 AND keep_until > ?1 THEN 5 ELSE 2 END AS state, \
                 count(*) AS n FROM {t} GROUP BY name, state ORDER BY name, state"
            ),
        }
    }
}
