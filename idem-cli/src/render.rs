//! What each command prints: a JSON document for scripts (`--json`), text for people. The text
//! explains what a record means and what happens next.

use crate::format::{human, ms, table, utc};
use idem::admin::{self, KeyInfo, Migrated, Stat, State, StoredValue};
use idem::key::Digest;
use idem::store::{Backend, Record, Status};
use idem::CodecErrorKind;
use serde_json::{json, Value};
use std::borrow::Cow;

/// A JSON document, pretty-printed, with its final newline.
pub(crate) fn doc(v: Value) -> String {
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}

fn status_str(s: Status) -> &'static str {
    match s {
        Status::InProgress => "in-progress",
        Status::Completed => "completed",
        Status::Released => "released",
        Status::Parked => "parked",
        _ => "unknown",
    }
}

/// The JSON of a record (without its value).
fn info_json(i: &KeyInfo) -> Value {
    let left = i.expires_at.saturating_sub(i.now).max(0);
    json!({
        "name": i.name,
        "digest": i.key.to_hex(),
        "status": status_str(i.status),
        "created_at": utc(i.created_at),
        "age_ms": i.now.saturating_sub(i.created_at).max(0),
        "expires_at": utc(i.expires_at),
        "lease_left_ms": (i.status == Status::InProgress).then_some(left),
        "ttl_left_ms": (i.status == Status::Completed).then_some(left),
        "attempt": i.attempt,
        "token": i.token,
        "fingerprint": i.fingerprint.to_hex(),
        "value_size": i.value_size,
        // A tombstone's end (and any record's): when the store may forget it.
        // (None for a parked record: it is kept until resolved.)
        "kept_until": (i.keep_until != i64::MAX).then(|| utc(i.keep_until)),
    })
}

/// The stored result, as JSON (`{"ok": …}` / `{"err": …}`, `{"encrypted": …}` for a value
/// whose key was not given) and as text.
fn value_of(opened: &Result<Cow<'_, [u8]>, idem::Error>) -> (Value, String) {
    let bytes = match opened {
        Ok(bytes) => bytes,
        Err(idem::Error::Codec(e)) if e.kind == CodecErrorKind::UnknownKey => {
            return (
                json!({"encrypted": e.message}),
                format!("encrypted: {} (pass --keyring or IDEM_KEYRING)", e.message),
            )
        }
        Err(e) => return (json!({"unreadable": e.to_string()}), e.to_string()),
    };
    match admin::stored_value(bytes) {
        Ok(StoredValue::Ok(j)) => {
            let v = serde_json::from_slice(j).unwrap_or(Value::Null);
            (
                json!({"ok": v}),
                format!("Ok({})", String::from_utf8_lossy(j)),
            )
        }
        Ok(StoredValue::Err(j)) => {
            let v = serde_json::from_slice(j).unwrap_or(Value::Null);
            (
                json!({"err": v}),
                format!("Err({})", String::from_utf8_lossy(j)),
            )
        }
        Err(e) => (json!({"unreadable": e.to_string()}), e.to_string()),
    }
}

/// `idem migrate`: what it found and did.
pub(crate) fn migrated(m: &Migrated, json: bool) -> String {
    if json {
        return doc(json!({
            "backend": m.backend.name(), "location": m.location, "from": m.from, "to": m.to,
            "changed": m.changed(),
        }));
    }
    match (m.backend, m.from, m.to) {
        (Backend::Redis, _, _) => format!(
            "redis ({}): Redis needs no schema; the server is reachable and accepted idem's \
             scripts. Nothing to do.\n",
            m.location
        ),
        (b, 0, to) => format!("{b} {}: created the schema (version {to}).\n", m.location),
        (b, from, to) if from == to => format!(
            "{b} {}: the schema is current (version {to}). Nothing to do.\n",
            m.location
        ),
        (b, from, to) => format!(
            "{b} {}: upgraded the schema from version {from} to {to}.\n",
            m.location
        ),
    }
}

/// Why a live record is there and what happens next, in words.
fn explain(r: &Record) -> String {
    let left = human(r.remaining());
    match r.status {
        Status::InProgress => format!(
            "An attempt claimed this key {} ago and has not finished. Until its lease ends \
             (in {left}; a running attempt keeps renewing it) every call with this key gets \
             `in progress` (or waits). If the process that ran it is gone (crashed, killed, \
             redeployed), the key frees itself when the lease ends; to free it now, check \
             that the side effect did not happen (or reconcile it), then `idem release --force`.",
            human(ms(r.now - r.created_at))
        ),
        Status::Completed => format!(
            "The call finished; its stored result is replayed to every call with this key for \
             another {left}. `idem release --force` deletes it: the next call runs the body \
             again."
        ),
        Status::Parked => format!(
            "Attempt {} of this call was abandoned (its process died or its lease lapsed \
             before it stored a result) and its function parks such keys: whether its side \
             effect happened is unknown, so every call with this key gets `outcome unknown` \
             until an operator decides. It does not expire. Check whether the effect happened, \
             then resolve the key; `idem release --force` frees it, and the next call runs the \
             body again.",
            r.attempt.saturating_sub(1).max(1)
        ),
        _ => "The record has ended: the next call with this key runs the body.".to_string(),
    }
}

/// `idem show`: one record, its `key` row as given on the command line.
pub(crate) fn record(
    r: &Record,
    digest: &Digest,
    key: String,
    value: Option<Result<Cow<'_, [u8]>, idem::Error>>,
    json: bool,
) -> String {
    if json {
        let mut v = info_json(&KeyInfo::from(r));
        v["why"] = Value::String(explain(r));
        if let Some(opened) = &value {
            v["value"] = match r.value {
                Some(_) => value_of(opened).0,
                None => Value::Null,
            };
        }
        return doc(v);
    }
    let left = human(r.remaining());
    let mut rows: Vec<(&str, String)> = vec![
        ("name", r.name.clone()),
        ("key", key),
        ("digest", digest.to_hex()),
        ("status", status_str(r.status).into()),
        (
            "claimed",
            format!(
                "{} ({} ago)",
                utc(r.created_at),
                human(ms(r.now - r.created_at))
            ),
        ),
    ];
    match r.status {
        Status::InProgress => rows.push((
            "lease left",
            format!("{left} (until {})", utc(r.expires_at)),
        )),
        Status::Completed => {
            rows.push(("ttl left", format!("{left} (until {})", utc(r.expires_at))))
        }
        Status::Parked => rows.push(("parked", "until an operator resolves it".to_string())),
        _ => rows.push(("ended", utc(r.expires_at))),
    }
    rows.push(("attempt", r.attempt.to_string()));
    rows.push(("token", r.token.to_string()));
    rows.push(("fingerprint", r.fingerprint.to_hex()));
    rows.push((
        "result",
        r.value.as_ref().map_or("none (not finished)".into(), |v| {
            format!("{} bytes", v.len())
        }),
    ));
    if let (Some(opened), Some(_)) = (&value, &r.value) {
        rows.push(("value", value_of(opened).1));
    }
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<12} {v}\n"));
    }
    out.push('\n');
    out.push_str(&explain(r));
    out.push('\n');
    out
}

/// `idem list`: the records found, and a note when `limit` cut the list.
pub(crate) fn records(rows: &[KeyInfo], limit: usize, json: bool) -> String {
    if json {
        return doc(Value::Array(rows.iter().map(info_json).collect()));
    }
    if rows.is_empty() {
        return "no live records match\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                status_str(i.status).into(),
                human(ms(i.now - i.created_at)),
                human(ms(i.expires_at - i.now)),
                i.token.to_string(),
                i.value_size.map_or("-".into(), |n| n.to_string()),
                i.key.to_hex(),
            ]
        })
        .collect();
    let mut out = table(
        &["NAME", "STATUS", "AGE", "LEFT", "TOKEN", "SIZE", "DIGEST"],
        &cells,
        &[4, 5],
    );
    if rows.len() == limit {
        out.push_str(&format!(
            "(first {limit} shown: raise --limit or narrow with --name / --status / --older-than)\n"
        ));
    }
    out
}

/// `idem release` without `--force` on a live record: why it is refused.
pub(crate) fn refusal(label: &str, r: &Record) -> String {
    let ago = human(ms(r.now - r.created_at));
    let left = human(r.remaining());
    match r.status {
        Status::InProgress => format!(
            "refused: {label} is in progress, claimed {ago} ago (token {}), and its lease \
             is live for another {left}. A live lease means an attempt may still be running \
             the body: releasing now lets a retry run it a second time, at the same time. \
             Check that no process still works on it (and whether its side effect \
             happened), then run again with --force. Nothing was changed.",
            r.token
        ),
        Status::Completed => format!(
            "refused: {label} completed {ago} ago; its result ({} bytes) is replayed to \
             every retry for another {left}. Releasing deletes that result, and the next \
             call runs the body again (its side effect repeats). If that is what you want, \
             run again with --force. Nothing was changed.",
            r.value.as_ref().map_or(0, Vec::len)
        ),
        Status::Parked => format!(
            "refused: {label} is parked: an abandoned attempt's outcome is unknown (attempt {}, \
             claimed {ago} ago). Releasing it lets the next call run the body again, which \
             repeats the side effect if it happened. Check first, then run again with --force. \
             Nothing was changed.",
            r.attempt
        ),
        _ => format!("refused: {label} has ended. Nothing was changed."),
    }
}

/// `idem release --force`: what was released (the record is ended, its token kept).
pub(crate) fn released(label: &str, digest: &Digest, r: &Record, json: bool) -> String {
    let live = r.expires_at > r.now;
    if json {
        let mut was = info_json(&KeyInfo::from(r));
        was["live"] = Value::Bool(live);
        return doc(json!({"released": true, "digest": digest.to_hex(), "was": was}));
    }
    let what = match (r.status, live) {
        // A store's forced release ends only a live record; one from elsewhere may differ.
        (_, false) => "ended a record that was not live".to_string(),
        (Status::InProgress, true) => format!(
            "ended the in-progress claim (token {}, claimed {} ago, {} of lease left)",
            r.token,
            human(ms(r.now - r.created_at)),
            human(r.remaining())
        ),
        (Status::Completed, true) => format!(
            "ended the completed result ({} bytes, {} of TTL left)",
            r.value.as_ref().map_or(0, Vec::len),
            human(r.remaining())
        ),
        (Status::Parked, true) => format!(
            "ended the parked key (token {}, attempt {}, outcome never resolved)",
            r.token, r.attempt
        ),
        (_, true) => "ended the record".to_string(),
    };
    format!("released {label}: {what}. The next call with this key runs the body.\n")
}

/// `idem stats`: one row per namespace and a total.
pub(crate) fn stats(stats: &[Stat], json: bool) -> String {
    // One row per namespace: [in progress, completed, expired, parked, abandoned, tombstones].
    let mut by_name: std::collections::BTreeMap<String, [u64; 6]> = Default::default();
    let mut total = [0u64; 6];
    for s in stats {
        let i = match s.state {
            State::InProgress => 0,
            State::Completed => 1,
            State::Expired => 2,
            State::Parked => 3,
            State::Abandoned => 4,
            State::Tombstone => 5,
        };
        by_name.entry(s.name.clone()).or_default()[i] += s.count;
        total[i] += s.count;
    }
    if json {
        let names: Vec<Value> = by_name
            .iter()
            .map(|(n, c)| {
                json!({"name": n, "in_progress": c[0], "completed": c[1], "expired": c[2],
                    "parked": c[3], "abandoned": c[4], "tombstones": c[5]})
            })
            .collect();
        return doc(json!({
            "names": names,
            "total": {"in_progress": total[0], "completed": total[1], "expired": total[2],
                "parked": total[3], "abandoned": total[4], "tombstones": total[5]},
        }));
    }
    let mut rows: Vec<Vec<String>> = by_name
        .iter()
        .map(|(n, c)| {
            let mut row = vec![n.clone()];
            row.extend(c.iter().map(u64::to_string));
            row
        })
        .collect();
    let mut last = vec!["(total)".to_string()];
    last.extend(total.iter().map(u64::to_string));
    rows.push(last);
    table(
        &[
            "NAME",
            "IN-PROGRESS",
            "COMPLETED",
            "EXPIRED",
            "PARKED",
            "ABANDONED",
            "TOMBSTONES",
        ],
        &rows,
        &[1, 2, 3, 4, 5, 6],
    )
}

/// `idem purge` on a store that expires records itself.
pub(crate) fn nothing_to_purge(note: &str, json: bool) -> String {
    if json {
        doc(json!({"purged": 0, "note": note}))
    } else {
        format!("{note}\n")
    }
}

/// `idem purge`: how many records it deleted.
pub(crate) fn purged(n: u64, json: bool) -> String {
    if json {
        doc(json!({"purged": n}))
    } else {
        format!("purged {n} expired records.\n")
    }
}
