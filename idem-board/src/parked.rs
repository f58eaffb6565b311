//! Parked keys: their list, and an operator's resolve of one (the abandoned attempt's effect
//! happened, with the value callers get, or it did not), through a confirmation page and the
//! CSRF token like every action.

use crate::counts;
use crate::pages::page;
use crate::routes::{failure, forbidden, given, html, not_found, short, urlencode, Shared, PAGE};
use crate::time::{span, utc};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::Form;
use idem::admin::{self, Resolved, Verdict};
use idem::key::Digest;
use idem::store::Status;
use maud::html;
use serde::Deserialize;
use std::time::Duration;

/// How long an applied value is replayed unless the operator says otherwise: the handle's
/// default TTL.
const DEFAULT_TTL: &str = "24h";

/// `/parked?name=`: only this function.
#[derive(Deserialize, Default)]
pub(crate) struct ParkedQuery {
    name: Option<String>,
}

/// The parked keys, oldest first: each waits for an operator.
pub(crate) async fn parked(State(app): Shared, Query(q): Query<ParkedQuery>) -> Response {
    let name = given(&q.name);
    let rows = match app.store.parked(name, PAGE).await {
        Ok(rows) => rows,
        Err(e) => return failure(&app, &e),
    };
    let body = html! {
        h1 { "Parked keys" }
        p.muted {
            "Abandoned attempts of functions that park them (" code { "on_abandoned = park" } "): "
            "whether their effect happened is unknown, and every call with the key gets "
            code { "outcome unknown" } " until it is resolved. Check the effect downstream, then resolve."
        }
        form.filters method="get" action="/parked" {
            label { "function" input name="name" id="p-name" value=(name.unwrap_or_default()) placeholder="any"; }
            button type="submit" id="p-filter" { "Filter" }
        }
        table id="parked" {
            tr { th { "key" } th { "function" } th.n { "attempt" } th { "since" } th { "" } }
            @for r in &rows {
                tr.record data-key=(r.key.to_hex()) {
                    td { a.mono href={ "/keys/" (r.key.to_hex()) } title=(r.key.to_hex()) { (short(&r.key)) } }
                    td { a href={ "/parked?name=" (urlencode(&r.name)) } { (r.name) } }
                    td.n { (r.attempt) }
                    td.t title=(utc(r.created_at)) { (span(r.now - r.created_at)) " ago" }
                    td { a.button href={ "/keys/" (r.key.to_hex()) "/resolve" } { "Resolve…" } }
                }
            }
        }
        @if rows.is_empty() { p.muted id="none-parked" { "No parked key." } }
        @if rows.len() == PAGE { p.muted { "The oldest " (PAGE) " shown: filter by function for the others." } }
    };
    html(page(&app, "Parked keys", body))
}

/// The confirmation page of a resolve: what is known of the parked attempt, and the two
/// verdicts, each a form with the CSRF token.
pub(crate) async fn confirm_resolve(State(app): Shared, Path(hex): Path<String>) -> Response {
    let Some(key) = Digest::from_hex(&hex) else {
        return not_found(State(app)).await;
    };
    let record = match app.store.get(&key).await {
        Ok(r) => r,
        Err(e) => return failure(&app, &e),
    };
    let hex = key.to_hex();
    let action = format!("/keys/{hex}/resolve");
    let body = match &record {
        Some(r) if r.status == Status::Parked => html! {
            h1 { "Resolve this parked key?" }
            p { "Attempt " b { (r.attempt) } " of " code { (r.name) } " took over an abandoned attempt "
                (span(r.now - r.created_at)) " ago (" (utc(r.created_at)) ") and parked the key: "
                "whether the abandoned attempt's effect happened is unknown. Look it up downstream "
                "(by the key the function passed on), then say what you found." }
            h2 { "It happened: applied" }
            form method="post" action=(action) id="applied-form" {
                input type="hidden" name="csrf" value=(app.auth.csrf);
                input type="hidden" name="verdict" value="applied";
                p { label { "The result callers get, as JSON (the function's Ok value; empty: null)" br;
                    textarea name="value" id="value-json" rows="4" cols="60" placeholder="{\"charge\": \"ch_123\"}" {} } }
                p { label { "Replayed for " input name="ttl" id="ttl" value=(DEFAULT_TTL) size="6"; } }
                button.danger type="submit" id="confirm-applied" { "Resolve: applied" }
            }
            h2 { "It did not happen: not applied" }
            p { "The key is freed; the next call with it runs the body." }
            form method="post" action=(action) id="not-applied-form" {
                input type="hidden" name="csrf" value=(app.auth.csrf);
                input type="hidden" name="verdict" value="not_applied";
                button.danger type="submit" id="confirm-not-applied" { "Resolve: not applied" }
            }
            p { a.button href={ "/keys/" (hex) } id="cancel" style="background:#868e96" { "Cancel" } }
        },
        _ => html! {
            h1 { "Nothing to resolve" }
            p id="not-parked" { "This key is not parked: only a parked key is resolved." }
            p { a href={ "/keys/" (hex) } { "Back to the key" } }
        },
    };
    html(page(&app, "Resolve", body))
}

/// A resolve's form.
#[derive(Deserialize)]
pub(crate) struct ResolveForm {
    csrf: String,
    verdict: String,
    value: Option<String>,
    ttl: Option<String>,
}

/// Why a resolve's form is refused before anything changes: a 400 page.
fn bad_form(app: &crate::App, hex: &str, why: String) -> Response {
    let body = html! {
        h1 { "Not resolved" }
        div.error id="bad-form" { (why) }
        p { "Nothing was changed. " a href={ "/keys/" (hex) "/resolve" } { "Back to the resolve" } }
    };
    (
        StatusCode::BAD_REQUEST,
        Html(page(app, "Not resolved", body).into_string()),
    )
        .into_response()
}

/// The resolve: only a parked key changes; another is left as it is.
pub(crate) async fn resolve(
    State(app): Shared,
    Path(hex): Path<String>,
    Form(form): Form<ResolveForm>,
) -> Response {
    if !app.auth.csrf_matches(&form.csrf) {
        return forbidden(&app);
    }
    let Some(key) = Digest::from_hex(&hex) else {
        return not_found(State(app)).await;
    };
    let hex = key.to_hex();
    let verdict = match form.verdict.as_str() {
        "applied" => {
            let value = match form
                .value
                .as_deref()
                .map(str::trim)
                .filter(|v| !v.is_empty())
            {
                None => serde_json::Value::Null,
                Some(text) => match serde_json::from_str(text) {
                    Ok(v) => v,
                    Err(e) => return bad_form(&app, &hex, format!("The value is not JSON: {e}")),
                },
            };
            let ttl = form.ttl.as_deref().map(str::trim).unwrap_or(DEFAULT_TTL);
            let ttl: Duration = match idem::parse_duration(ttl) {
                Ok(d) => d,
                Err(_) => {
                    return bad_form(
                        &app,
                        &hex,
                        "Replayed for: write it as 30s, 10m, 2h or 1d".into(),
                    )
                }
            };
            Verdict::Applied { value, ttl }
        }
        "not_applied" => Verdict::NotApplied,
        _ => return bad_form(&app, &hex, "Say applied or not applied.".into()),
    };
    let resolved = admin::resolve(app.store.as_ref(), &key, &verdict).await;
    counts::recount(&app);
    let done = match resolved {
        Ok(Resolved::Done(_)) if matches!(verdict, Verdict::Applied { .. }) => "applied",
        Ok(Resolved::Done(_)) => "not_applied",
        Ok(Resolved::NotParked(_)) => "not_parked",
        Err(e) => return failure(&app, &e),
    };
    Redirect::to(&format!("/keys/{hex}?done={done}")).into_response()
}
