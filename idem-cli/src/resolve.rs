//! Parked keys: `idem pending` lists them, `idem resolve` decides one (the operator's verdict on
//! an abandoned attempt whose function parks such keys).

use crate::cli::ResolveArgs;
use crate::commands::Ctx;
use crate::digest::Named;
use crate::failure::{Failure, REFUSED};
use crate::format::{human, ms, table, utc};
use crate::render::doc;
use idem::admin::{self, KeyInfo, Resolved, Verdict};
use idem::store::{Record, Status};
use serde_json::{json, Value};

/// `idem pending [NAME]`: the parked keys, oldest claim first.
pub(crate) async fn pending(
    ctx: &Ctx,
    name: Option<&str>,
    limit: usize,
) -> Result<String, Failure> {
    let store = ctx.open().await?;
    let rows = store
        .parked(name, limit)
        .await
        .map_err(|e| ctx.failure(e))?;
    Ok(render_pending(&rows, limit, ctx.json))
}

fn render_pending(rows: &[KeyInfo], limit: usize, json: bool) -> String {
    if json {
        return doc(Value::Array(
            rows.iter()
                .map(|i| {
                    json!({
                        "name": i.name,
                        "digest": i.key.to_hex(),
                        "attempt": i.attempt,
                        "since": utc(i.created_at),
                        "age_ms": i.now.saturating_sub(i.created_at).max(0),
                        "token": i.token,
                    })
                })
                .collect(),
        ));
    }
    if rows.is_empty() {
        return "no parked keys\n".into();
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|i| {
            vec![
                i.name.clone(),
                i.attempt.to_string(),
                utc(i.created_at),
                human(ms(i.now - i.created_at)),
                i.key.to_hex(),
            ]
        })
        .collect();
    let mut out = table(&["NAME", "ATTEMPT", "SINCE", "AGE", "DIGEST"], &cells, &[1]);
    if rows.len() == limit {
        out.push_str(&format!(
            "(first {limit} shown: raise --limit or narrow with NAME)\n"
        ));
    }
    out.push_str(
        "Each waits for a verdict: check whether its effect happened, then \
         `idem resolve NAME KEY --applied --value JSON` or `--not-applied` \
         (`--digest HEX` names a key by the digest shown).\n",
    );
    out
}

/// `idem resolve NAME KEY --applied [--value JSON] | --not-applied`.
pub(crate) async fn resolve(ctx: &Ctx, args: &ResolveArgs) -> Result<String, Failure> {
    let key = Named::from_args(&args.key)?;
    let verdict = if args.applied {
        let value = match &args.value {
            Some(text) => serde_json::from_str(text)
                .map_err(|e| Failure::usage(format!("--value is not valid JSON: {e}")))?,
            None => Value::Null,
        };
        Verdict::Applied {
            value,
            ttl: args.ttl,
        }
    } else {
        Verdict::NotApplied
    };
    let store = ctx.open().await?;
    let free = || {
        Failure::not_found(format!(
            "nothing to resolve: no live record for {} (digest {}): the key is free, not \
             parked. Nothing was changed.",
            key.label, key.digest
        ))
    };
    // With --digest and NAME, the record must be in that namespace before anything changes.
    if key.namespace.is_some() {
        ctx.live_record(store.as_ref(), &key, free).await?;
    }
    match admin::resolve(store.as_ref(), &key.digest, &verdict)
        .await
        .map_err(|e| ctx.failure(e))?
    {
        Resolved::Done(was) => Ok(render_resolved(&key, &was, &verdict, ctx.json)),
        Resolved::NotParked(None) => Err(free()),
        Resolved::NotParked(Some(r)) => {
            Err(Failure::new(REFUSED, "refused", not_parked(&key.label, &r)))
        }
    }
}

/// Why a live record that is not parked is not resolved.
fn not_parked(label: &str, r: &Record) -> String {
    let state = match r.status {
        Status::InProgress => format!(
            "in progress (attempt {}, claimed {} ago, token {}): an attempt may still be running \
             its body",
            r.attempt,
            human(ms(r.now - r.created_at)),
            r.token
        ),
        Status::Completed => format!(
            "completed {} ago: its result is replayed, there is no unknown outcome to decide",
            human(ms(r.now - r.created_at))
        ),
        _ => "not parked".to_string(),
    };
    format!("refused: {label} is not parked, it is {state}. Only a parked key is resolved. Nothing was changed.")
}

fn render_resolved(key: &Named, was: &Record, verdict: &Verdict, json: bool) -> String {
    let (applied, value) = match verdict {
        Verdict::Applied { value, .. } => (true, Some(value)),
        Verdict::NotApplied => (false, None),
    };
    if json {
        return doc(json!({
            "resolved": if applied { "applied" } else { "not-applied" },
            "name": was.name,
            "digest": key.digest.to_hex(),
            "attempt": was.attempt,
            "value": value,
        }));
    }
    match (verdict, value) {
        (Verdict::Applied { ttl, .. }, Some(v)) => format!(
            "resolved {}: applied. Every call with this key gets Ok({v}) for {} (attempt {} \
             parked since {}).\n",
            key.label,
            human(*ttl),
            was.attempt,
            utc(was.created_at)
        ),
        _ => format!(
            "resolved {}: not applied. The key is free; the next call with it runs the body \
             (attempt {} parked since {}).\n",
            key.label,
            was.attempt,
            utc(was.created_at)
        ),
    }
}
