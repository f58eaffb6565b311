//! A key's page (its record, value and steps) and its force-release, behind a confirmation.

use crate::counts;
use crate::pages::confirm;
use crate::pages::page;
use crate::routes::{
    failure, forbidden, html, key_state, not_found, records_table, short, ActionForm, Done, Shared,
};
use crate::time::{span, utc};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use idem::admin::{self, Filter, PageQuery, StoredValue};
use idem::key::Digest;
use idem::store::{Record, Status};
use idem::{CodecErrorKind, Error};
use maud::{html, Markup};

pub(crate) fn digest(hex: &str) -> Option<Digest> {
    Digest::from_hex(hex)
}

/// A completed record's value: its JSON, "sealed" when encrypted with a key this board does
/// not hold.
fn value_view(r: &Record) -> Markup {
    if r.status == Status::InProgress {
        return html! { p.muted { "None yet: the attempt is in progress." } };
    }
    if r.status == Status::Parked {
        return html! { p.muted { "None: whether the abandoned attempt's effect happened is unknown until it is resolved." } };
    }
    let pretty = |json: &[u8]| match serde_json::from_slice::<serde_json::Value>(json) {
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(_) => String::from_utf8_lossy(json).into_owned(),
    };
    match admin::open_value(r) {
        Ok(bytes) => match admin::stored_value(&bytes) {
            Ok(StoredValue::Ok(json)) => html! { pre id="value" { (pretty(json)) } },
            Ok(StoredValue::Err(json)) => html! {
                p { "A kept error (" code { "on_error = keep" } "):" }
                pre id="value" { (pretty(json)) }
            },
            Err(e) => html! { p.error { "Unreadable: " (e) } },
        },
        Err(Error::Codec(e)) if e.kind == CodecErrorKind::UnknownKey => {
            html! { p id="value" { span.state.expired { "sealed" } " encrypted; the board holds no key for it" } }
        }
        Err(e) => html! { p.error { "Unreadable: " (e) } },
    }
}

pub(crate) async fn key_page(
    State(app): Shared,
    Path(hex): Path<String>,
    Query(done): Query<Done>,
) -> Response {
    let Some(key) = digest(&hex) else {
        return not_found(State(app)).await;
    };
    let record = match app.store.get(&key).await {
        Ok(r) => r,
        Err(e) => return failure(&app, &e),
    };
    let steps = PageQuery::new(Filter::new().limit(100)).steps_of(Some(key));
    let steps = match app.store.page(&steps).await {
        Ok(rows) => rows,
        Err(e) => return failure(&app, &e),
    };
    let hex = key.to_hex();
    let body = html! {
        h1 { "Key " code { (short(&key)) } }
        @if let Some(n) = done.notice() { (n) }
        @match &record {
            Some(r) => {
                dl id="record" {
                    dt { "function" } dd { (r.name) }
                    @if let Some((parent, step)) = parent_of(&r.name) {
                        dt { "step of" } dd { a href={ "/keys/" (parent) } { code { (parent) } } " (step " code { (step) } ")" }
                    }
                    dt { "key" } dd.mono { (hex) }
                    dt { "state" } dd id="state" { (key_state(r.status, r.expires_at, r.keep_until, r.now)) }
                    dt { "token (attempt)" } dd { (r.token) }
                    dt { "fingerprint" } dd.mono { (r.fingerprint.to_hex()) }
                    dt { "claimed" } dd { (utc(r.created_at)) " (" (span(r.now - r.created_at)) " ago)" }
                    dt { @if r.status == Status::InProgress { "lease ends" } @else { "kept until" } }
                    dd { (utc(r.expires_at)) " (in " (span(r.expires_at - r.now)) ")" }
                }
                h2 { "Value" }
                (value_view(r))
                p {
                    @if r.status == Status::Parked {
                        a.button href={ "/keys/" (hex) "/resolve" } id="resolve" { "Resolve…" } " "
                    }
                    a.button.danger href={ "/keys/" (hex) "/release" } id="release" { "Force-release…" }
                }
            }
            None => {
                p id="state" { span.state.expired { "no live record" } " The key is free (never used, released, or expired): the next call with it runs the body." }
            }
        }
        h2 { "Steps" }
        (records_table(&steps, "steps"))
    };
    html(page(&app, "Key", body))
}

/// A step's namespace `<parent hex>/<step>`: the parent's hex and the step's name.
pub(crate) fn parent_of(name: &str) -> Option<(&str, &str)> {
    let (hex, step) = name.split_once('/')?;
    Digest::from_hex(hex).map(|_| (hex, step))
}

pub(crate) async fn confirm_release(State(app): Shared, Path(hex): Path<String>) -> Response {
    let Some(key) = digest(&hex) else {
        return not_found(State(app)).await;
    };
    let record = match app.store.get(&key).await {
        Ok(r) => r,
        Err(e) => return failure(&app, &e),
    };
    let back = format!("/keys/{}", key.to_hex());
    let what = match &record {
        Some(r) if r.status == Status::InProgress => html! {
            p { "The attempt with token " b { (r.token) } " of " code { (r.name) } " claimed this key "
                (span(r.now - r.created_at)) " ago and its lease runs " (span(r.expires_at - r.now)) " more." }
            p { b { "Check first that no process still runs it:" } " after the release the next call runs the body again, and a still-running attempt can no longer store its result." }
        },
        Some(r) => html! {
            p { "This completed result of " code { (r.name) } " is kept " (span(r.expires_at - r.now)) " more." }
            p { b { "After the release the next call with this key runs the body again" } " instead of replaying the result." }
        },
        None => html! { p { "The key has no live record: there is nothing to release." } },
    };
    let action = format!("/keys/{}/release", key.to_hex());
    html(confirm(
        &app,
        "Force-release this key",
        what,
        &action,
        &[],
        &back,
    ))
}

pub(crate) async fn release(
    State(app): Shared,
    Path(hex): Path<String>,
    Form(form): Form<ActionForm>,
) -> Response {
    if !app.auth.csrf_matches(&form.csrf) {
        return forbidden(&app);
    }
    let Some(key) = digest(&hex) else {
        return not_found(State(app)).await;
    };
    let released = app.store.force_release(&key).await;
    counts::recount(&app);
    match released {
        Ok(Some(_)) => {
            Redirect::to(&format!("/keys/{}?done=released", key.to_hex())).into_response()
        }
        Ok(None) => Redirect::to(&format!("/keys/{}?done=not_live", key.to_hex())).into_response(),
        Err(e) => failure(&app, &e),
    }
}
