//! The board's routes: each reads what it shows through the admin API and renders one page;
//! the actions are POSTs, each behind a confirmation page and the CSRF token.

use crate::auth;
use crate::counts::{self, SOON};
use crate::key::{self, parent_of};
use crate::pages::{self, confirm, page, state};
use crate::time::{span, utc};
use crate::{parked, App};
use axum::extract::{Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Form, Router};
use idem::admin::{self, Cursor, Filter, KeyInfo, PageQuery};
use idem::key::Digest;
use idem::outbox::{ListFilter, MessageState};
use idem::store::Status;
use idem::Error;
use maud::{html, Markup};
use serde::Deserialize;
use std::sync::Arc;
use std::time::Duration;

pub(crate) type Shared = State<Arc<App>>;

/// Records per page of a listing.
pub(crate) const PAGE: usize = 50;

pub(crate) fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/keys", get(keys))
        .route("/keys/{hex}", get(key::key_page))
        .route(
            "/keys/{hex}/release",
            get(key::confirm_release).post(key::release),
        )
        .route("/parked", get(parked::parked))
        .route(
            "/keys/{hex}/resolve",
            get(parked::confirm_resolve).post(parked::resolve),
        )
        .route("/purge", get(confirm_purge).post(purge))
        .route("/outbox", get(outbox))
        .route("/outbox/retry", get(confirm_retry).post(retry))
        .route("/login", get(login_page).post(login))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(app.clone(), guard))
        .with_state(app)
}

/// Every request passes here first: the host check (no token) or the token (bearer or
/// cookie); then every answer gets headers that keep it out of frames, caches and referrers.
async fn guard(State(app): Shared, req: Request, next: Next) -> Response {
    let headers = req.headers();
    if !app.auth.has_token() && !auth::loopback_host(headers) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this board answers requests to 127.0.0.1, [::1] or localhost only",
        )
            .into_response();
    }
    let mut response =
        if app.auth.has_token() && req.uri().path() != "/login" && !app.auth.admits(headers) {
            (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                Html(pages::login(false).into_string()),
            )
                .into_response()
        } else {
            next.run(req).await
        };
    let h = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::CACHE_CONTROL, "no-store"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

pub(crate) fn html(markup: Markup) -> Response {
    Html(markup.into_string()).into_response()
}

/// A failed read or action, as a page.
pub(crate) fn failure(app: &App, e: &Error) -> Response {
    let body = html! {
        h1 { "The store answered with an error" }
        div.error { (app.scrub(e)) }
        p { a href="/" { "Back to the overview" } }
    };
    (
        StatusCode::BAD_GATEWAY,
        Html(page(app, "Error", body).into_string()),
    )
        .into_response()
}

pub(crate) fn forbidden(app: &App) -> Response {
    let body = html! {
        h1 { "Refused" }
        div.error { "This action's form is out of date or did not come from this board: \
                     open the page again and confirm from there." }
    };
    (
        StatusCode::FORBIDDEN,
        Html(page(app, "Refused", body).into_string()),
    )
        .into_response()
}

pub(crate) async fn not_found(State(app): Shared) -> Response {
    let body = html! { h1 { "Not found" } p { a href="/" { "Back to the overview" } } };
    (
        StatusCode::NOT_FOUND,
        Html(page(&app, "Not found", body).into_string()),
    )
        .into_response()
}

/// What a finished action left to say, from fixed words only (nothing of the request is
/// echoed).
#[derive(Deserialize, Default)]
pub(crate) struct Done {
    done: Option<String>,
    n: Option<u64>,
}

impl Done {
    pub(crate) fn notice(&self) -> Option<Markup> {
        let n = self.n.unwrap_or(0);
        let text = match self.done.as_deref()? {
            "released" => {
                "Released: the key is free; the next call with it runs the body.".to_string()
            }
            "not_live" => "Nothing released: the key had no live record.".to_string(),
            "purged" => format!("Purged {n} expired records."),
            "retried" => format!("{n} dead letters are back in the queue."),
            "applied" => "Resolved as applied: every call with this key gets the value.".into(),
            "not_applied" => "Resolved as not applied: the next call runs the body.".into(),
            "not_parked" => "Nothing resolved: the key is not parked.".to_string(),
            _ => return None,
        };
        Some(html! { div.notice id="notice" { (text) } })
    }
}

pub(crate) fn key_state(status: Status, expires_at: i64, keep_until: i64, now: i64) -> Markup {
    match admin::State::of(status, expires_at, keep_until, now) {
        admin::State::InProgress => state("in_progress", "in progress"),
        admin::State::Completed => state("completed", "completed"),
        admin::State::Parked => state("parked", "parked"),
        admin::State::Abandoned => state("abandoned", "abandoned"),
        admin::State::Tombstone => state("expired", "tombstone"),
        _ => state("expired", "expired"),
    }
}

pub(crate) fn short(key: &Digest) -> String {
    let hex = key.to_hex();
    format!("{}…", &hex[..16])
}

/// Rows of records: key, namespace, state, token, claimed, expires, size.
pub(crate) fn records_table(rows: &[KeyInfo], id: &str) -> Markup {
    html! {
        table id=(id) {
            tr {
                th { "key" } th { "function" } th { "state" } th.n { "token" }
                th { "claimed" } th { "expires in" } th.n { "value" }
            }
            @for r in rows {
                tr.record data-key=(r.key.to_hex()) {
                    td { a.mono href={ "/keys/" (r.key.to_hex()) } title=(r.key.to_hex()) { (short(&r.key)) } }
                    td {
                        @match parent_of(&r.name) {
                            Some((parent, step)) => { "step " code { (step) } span.muted { " of " (&parent[..16]) "…" } }
                            None => (r.name),
                        }
                    }
                    td { (key_state(r.status, r.expires_at, r.keep_until, r.now)) }
                    td.n { (r.token) }
                    td.t title=(utc(r.created_at)) { (span(r.now - r.created_at)) " ago" }
                    td.t title=(utc(r.expires_at)) { (span(r.expires_at - r.now)) }
                    td.n { @if let Some(n) = r.value_size { (n) " B" } }
                }
            }
        }
        @if rows.is_empty() { p.muted { "No live record." } }
    }
}

async fn overview(State(app): Shared, Query(done): Query<Done>) -> Response {
    let snapshot = match counts::current(&app).await {
        Ok(s) => s,
        Err(e) => return failure(&app, &e),
    };
    let overview = &snapshot.overview;
    let soonest = match app
        .store
        .page(&PageQuery::new(Filter::new().limit(10)))
        .await
    {
        Ok(rows) => rows,
        Err(e) => return failure(&app, &e),
    };
    let outbox = match &app.outbox {
        Some(o) => Some((o.table().to_string(), o.stats().await)),
        None => None,
    };
    let now = overview.now;
    let sum = |f: fn(&admin::NameSummary) -> u64| overview.names.iter().map(f).sum::<u64>();
    let oldest = overview
        .names
        .iter()
        .filter_map(|s| Some((s.oldest_in_progress?, s)))
        .min_by_key(|(at, _)| *at);
    let body = html! {
        h1 { "Overview" }
        @if let Some(n) = done.notice() { (n) }
        div.cards {
            div.card id="total-in-progress" { b { (sum(|s| s.in_progress)) } "in progress" }
            div.card id="total-completed" { b { (sum(|s| s.completed)) } "completed" }
            div.card id="total-expired" { b { (sum(|s| s.expired)) } "expired, awaiting purge" }
            div.card id="total-parked" { b { (sum(|s| s.parked)) } a href="/parked" { "parked, awaiting a resolve" } }
            div.card { b { (sum(|s| s.expiring_soon)) } "expiring within " (span(SOON.as_millis() as i64)) }
            div.card id="oldest" {
                @match oldest {
                    Some((at, s)) => {
                        b { (span(now - at)) }
                        "oldest attempt in flight ("
                        a href={ "/keys?state=in_progress&name=" (urlencode(&s.name)) "&older_than=" (((now - at) / 1000).max(0)) "s" } { (s.name) }
                        ")"
                    }
                    None => { b { "–" } "no attempt in flight" }
                }
            }
        }
        h2 { "By function" }
        table id="by-function" {
            tr {
                th { "function" } th.n { "in progress" } th.n { "completed" } th.n { "expired" }
                th { "oldest in flight" } th.n { "expiring soon" }
            }
            @for s in &overview.names {
                tr {
                    td {
                        @if s.name.starts_with("*/") {
                            "step " code { (&s.name[2..]) } span.muted { " (all calls)" }
                        } @else {
                            a href={ "/keys?name=" (urlencode(&s.name)) } { (s.name) }
                        }
                    }
                    td.n {
                        @if s.in_progress > 0 && !s.name.starts_with("*/") {
                            a href={ "/keys?state=in_progress&name=" (urlencode(&s.name)) } { (s.in_progress) }
                        } @else { (s.in_progress) }
                    }
                    td.n { (s.completed) }
                    td.n { (s.expired) }
                    td { @if let Some(at) = s.oldest_in_progress { (span(now - at)) " ago" } }
                    td.n { (s.expiring_soon) }
                }
            }
        }
        @if overview.names.is_empty() { p.muted { "The store holds no record." } }
        @if sum(|s| s.expired) > 0 {
            p { a.button.danger href="/purge" id="purge" { "Purge expired records…" } }
        }
        h2 { "Expiring soonest" }
        (records_table(&soonest, "soonest"))
        @if let Some((table, stats)) = &outbox {
            h2 { "Outbox " code { (table) } }
            @match stats {
                Ok(st) => div.cards id="outbox" {
                    div.card { b { (st.pending) } a href="/outbox?state=pending" { "pending" } }
                    div.card { b { (st.dead) } a href="/outbox?state=dead" { "dead" } }
                    div.card { b { (st.delivered) } "delivered, awaiting purge" }
                    div.card {
                        b { @match st.oldest_pending { Some(d) => (span(d.as_millis() as i64)), None => "–" } }
                        "oldest pending"
                    }
                },
                Err(e) => div.error { (app.scrub(e)) },
            }
        }
        p.muted id="counted" {
            "Counted " (span(snapshot.at.elapsed().as_millis() as i64)) " ago in "
            (span(snapshot.took.as_millis() as i64)) " (store clock " (utc(now)) "); "
            "recounted when older than " (span(counts::REFRESH.as_millis() as i64)) " as this page is shown."
        }
    };
    html(page(&app, "Overview", body))
}

pub(crate) fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The list's filters, as the form sends them (empty fields are no filter).
#[derive(Deserialize, Default)]
struct ListQuery {
    name: Option<String>,
    state: Option<String>,
    older_than: Option<String>,
    after: Option<String>,
}

pub(crate) fn given(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn parse_cursor(s: &str) -> Option<Cursor> {
    let (at, hex) = s.split_once('.')?;
    Some(Cursor {
        expires_at: at.parse().ok()?,
        key: Digest::from_hex(hex)?,
    })
}

async fn keys(State(app): Shared, Query(q): Query<ListQuery>) -> Response {
    let mut problems = Vec::new();
    let status = match given(&q.state) {
        None => None,
        Some("in_progress") => Some(Status::InProgress),
        Some("completed") => Some(Status::Completed),
        Some("parked") => Some(Status::Parked),
        Some(_) => {
            problems.push("unknown state: showing every state");
            None
        }
    };
    let older_than = given(&q.older_than).and_then(|s| match idem::parse_duration(s) {
        Ok(d) => Some(d),
        Err(_) => {
            problems.push("age: write it as 30s, 10m, 2h or 1d");
            None
        }
    });
    let after = given(&q.after).and_then(parse_cursor);
    let filter = Filter::new()
        .name(given(&q.name).map(str::to_string))
        .status(status)
        .older_than(older_than)
        .limit(PAGE);
    let query = PageQuery::new(filter).after(after);
    let rows = match app.store.page(&query).await {
        Ok(rows) => rows,
        Err(e) => return failure(&app, &e),
    };
    let mut params = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("name", &q.name),
        ("state", &q.state),
        ("older_than", &q.older_than),
    ] {
        if let Some(v) = given(v) {
            params.append_pair(k, v);
        }
    }
    let base = params.finish();
    let next = (rows.len() == PAGE).then(|| {
        let last = &rows[rows.len() - 1];
        format!(
            "/keys?{base}{}after={}.{}",
            if base.is_empty() { "" } else { "&" },
            last.expires_at,
            last.key.to_hex()
        )
    });
    let selected = |s: &str| given(&q.state) == Some(s);
    let body = html! {
        h1 { "Keys" }
        @for p in &problems { div.error { (p) } }
        form.filters method="get" action="/keys" {
            label { "function" input name="name" id="f-name" value=(given(&q.name).unwrap_or_default()) placeholder="any"; }
            label { "state" select name="state" id="f-state" {
                option value="" { "any" }
                option value="in_progress" selected[selected("in_progress")] { "in progress" }
                option value="completed" selected[selected("completed")] { "completed" }
                option value="parked" selected[selected("parked")] { "parked" }
            } }
            label { "claimed at least … ago" input name="older_than" id="f-age" value=(given(&q.older_than).unwrap_or_default()) placeholder="10m"; }
            button type="submit" id="filter" { "Filter" }
        }
        p.muted { "Live records, soonest expiry first, " (PAGE) " a page." }
        (records_table(&rows, "keys"))
        p {
            @if after.is_some() { a href={ "/keys?" (base) } { "« first page" } " " }
            @if let Some(next) = next { a href=(next) id="next" { "next page »" } }
        }
    };
    html(page(&app, "Keys", body))
}

/// An action's form: its CSRF token and, for dead letters, which.
#[derive(Deserialize)]
pub(crate) struct ActionForm {
    pub(crate) csrf: String,
    id: Option<String>,
    all: Option<String>,
}

async fn confirm_purge(State(app): Shared) -> Response {
    let snapshot = match counts::current(&app).await {
        Ok(s) => s,
        Err(e) => return failure(&app, &e),
    };
    let expired: u64 = snapshot.overview.names.iter().map(|s| s.expired).sum();
    let what = html! {
        p { "Delete the records that are no longer live (" b { (expired) } " at the last count), in batches of 1,000." }
        p.muted { "They replay nothing and hold no claim: a purge only frees their space. Live records are kept." }
    };
    html(confirm(
        &app,
        "Purge expired records",
        what,
        "/purge",
        &[],
        "/",
    ))
}

async fn purge(State(app): Shared, Form(form): Form<ActionForm>) -> Response {
    if !app.auth.csrf_matches(&form.csrf) {
        return forbidden(&app);
    }
    let purged = admin::purge_expired(app.store.as_ref(), 1000, |_| {}).await;
    app.counts.drop_snapshot();
    match purged {
        Ok(n) => Redirect::to(&format!("/?done=purged&n={n}")).into_response(),
        Err(e) => failure(&app, &e),
    }
}

#[derive(Deserialize, Default)]
struct OutboxQuery {
    state: Option<String>,
    #[serde(flatten)]
    done: Done,
}

async fn outbox(State(app): Shared, Query(q): Query<OutboxQuery>) -> Response {
    let Some(outbox) = &app.outbox else {
        return not_found(State(app.clone())).await;
    };
    let wanted = match given(&q.state) {
        Some("pending") => Some(MessageState::Pending),
        Some("delivered") => Some(MessageState::Delivered),
        Some("dead") => Some(MessageState::Dead),
        _ => None,
    };
    let mut filter = ListFilter::new().limit(100);
    if let Some(s) = wanted {
        filter = filter.state(s);
    }
    let messages = match outbox.list(&filter).await {
        Ok(m) => m,
        Err(e) => return failure(&app, &e),
    };
    let any_dead = messages.iter().any(|m| m.state == MessageState::Dead);
    let body = html! {
        h1 { "Outbox " code { (outbox.table()) } }
        @if let Some(n) = q.done.notice() { (n) }
        p {
            a href="/outbox" { "pending and dead" } " · "
            a href="/outbox?state=pending" { "pending" } " · "
            a href="/outbox?state=dead" { "dead" } " · "
            a href="/outbox?state=delivered" { "delivered" }
        }
        table id="messages" {
            tr {
                th { "id" } th { "topic" } th { "ordering key" } th { "state" } th.n { "attempts" }
                th { "age" } th { "next attempt" } th { "last error" } th.n { "size" } th {}
            }
            @for m in &messages {
                tr {
                    td.mono { (m.id) } td { (m.topic) } td { (m.ordering_key) }
                    td { (state(m.state.as_str(), m.state.as_str())) }
                    td.n { (m.attempts) }
                    td { (span(m.age.as_millis() as i64)) }
                    td { @if let Some(d) = m.next_attempt_in { "in " (span(d.as_millis() as i64)) } }
                    td { @if let Some(e) = &m.last_error { (e) } }
                    td.n { (m.payload_len) " B" }
                    td { @if m.state == MessageState::Dead {
                        a href={ "/outbox/retry?id=" (urlencode(&m.id)) } { "retry…" }
                    } }
                }
            }
        }
        @if messages.is_empty() { p.muted { "No message." } }
        @if any_dead { p { a.button.danger href="/outbox/retry?all=1" { "Retry every dead letter…" } } }
    };
    html(page(&app, "Outbox", body))
}

#[derive(Deserialize, Default)]
struct RetryQuery {
    id: Option<String>,
    all: Option<String>,
}

async fn confirm_retry(State(app): Shared, Query(q): Query<RetryQuery>) -> Response {
    if app.outbox.is_none() {
        return not_found(State(app)).await;
    }
    let (what, hidden) = match (given(&q.id), given(&q.all)) {
        (Some(id), _) => (
            html! { p { "Put the dead letter " code { (id) } " back in the queue, its attempts reset: the relays deliver it again." } },
            vec![("id", id)],
        ),
        (None, Some(_)) => (
            html! { p { "Put " b { "every" } " dead letter back in the queue, attempts reset: the relays deliver them again." } },
            vec![("all", "1")],
        ),
        (None, None) => return Redirect::to("/outbox?state=dead").into_response(),
    };
    html(confirm(
        &app,
        "Retry dead letters",
        what,
        "/outbox/retry",
        &hidden,
        "/outbox?state=dead",
    ))
}

async fn retry(State(app): Shared, Form(form): Form<ActionForm>) -> Response {
    if !app.auth.csrf_matches(&form.csrf) {
        return forbidden(&app);
    }
    let Some(outbox) = &app.outbox else {
        return not_found(State(app.clone())).await;
    };
    let id = given(&form.id);
    if id.is_none() && given(&form.all).is_none() {
        return forbidden(&app);
    }
    match outbox.retry_dead(id).await {
        Ok(n) => Redirect::to(&format!("/outbox?state=dead&done=retried&n={n}")).into_response(),
        Err(e) => failure(&app, &e),
    }
}

async fn login_page(State(app): Shared) -> Response {
    if !app.auth.has_token() {
        return Redirect::to("/").into_response();
    }
    html(pages::login(false))
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(State(app): Shared, Form(form): Form<LoginForm>) -> Response {
    if app.auth.token_matches(&form.token) {
        return (
            [(header::SET_COOKIE, app.auth.login_cookie())],
            Redirect::to("/"),
        )
            .into_response();
    }
    // A wrong token costs the guesser time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    (
        StatusCode::UNAUTHORIZED,
        Html(pages::login(true).into_string()),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_and_steps_parse() {
        let key = Digest([7; 32]);
        let c = parse_cursor(&format!("123.{}", key.to_hex())).unwrap();
        assert_eq!((c.expires_at, c.key), (123, key));
        assert!(parse_cursor("123").is_none());
        assert!(parse_cursor("x.00").is_none());
        let step = format!("{}/charge", key.to_hex());
        assert_eq!(parent_of(&step), Some((&step[..64], "charge")));
        assert_eq!(parent_of("orders/charge"), None);
    }
}
