//! The pages' frame and the pieces several pages share. Everything goes through maud, which
//! escapes every value it is given: a key's name or a stored value cannot inject markup.

use crate::App;
use maud::{html, Markup, PreEscaped, DOCTYPE};

const STYLE: &str = "
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d2b3a;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header a:hover{text-decoration:underline}
header .store{margin-left:auto;color:#9fb2c6;font-family:ui-monospace,monospace;font-size:12px}
main{padding:16px 24px;max-width:1200px}
h1{font-size:20px;margin:8px 0 16px}h2{font-size:16px;margin:24px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:8px}
th,td{border-bottom:1px solid #e3e6ea;padding:6px 10px;text-align:left;vertical-align:top}
th{background:#eef1f4;font-weight:600}td.t,td.n{white-space:nowrap}td.n,th.n{text-align:right}
code,.mono{font-family:ui-monospace,monospace;font-size:12px}
pre{background:#fff;border:1px solid #e3e6ea;padding:10px;overflow:auto;max-height:400px}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{background:#fff;border:1px solid #e3e6ea;
padding:10px 16px;min-width:140px}.card b{display:block;font-size:22px}
.state{padding:1px 8px;border-radius:9px;font-size:12px;white-space:nowrap}
.in_progress{background:#fff1c2}.parked{background:#ffe3c2}.abandoned{background:#ffd8a8}.completed{background:#d8f3dc}.expired{background:#e9ecef}
.dead{background:#ffd6d6}.pending{background:#fff1c2}
.notice{background:#e7f5ff;border:1px solid #a5d8ff;padding:8px 12px;margin-bottom:12px}
.error{background:#fff0f0;border:1px solid #ffa8a8;padding:8px 12px;margin-bottom:12px}
form.inline{display:inline}button,.button{background:#1c7ed6;color:#fff;border:0;padding:6px 14px;
border-radius:4px;cursor:pointer;text-decoration:none;font-size:13px;display:inline-block}
button.danger,.button.danger{background:#e03131}.muted{color:#6c757d}
.filters{display:flex;gap:12px;align-items:end;margin-bottom:12px;flex-wrap:wrap}
.filters label{display:flex;flex-direction:column;font-size:12px;color:#495057}
input,select,textarea{padding:5px 8px;border:1px solid #ced4da;border-radius:4px}
dl{display:grid;grid-template-columns:180px 1fr;gap:4px 16px;background:#fff;padding:12px;
border:1px solid #e3e6ea}dt{color:#495057}dd{margin:0}
";

/// A whole page: the frame around `body`.
pub(crate) fn page(app: &App, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · idem board" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    strong { "idem board" }
                    a href="/" { "Overview" }
                    a href="/keys" { "Keys" }
                    a href="/keys?state=in_progress" { "In progress" }
                    a href="/parked" { "Parked" }
                    @if app.outbox.is_some() {
                        a href="/outbox" { "Outbox" }
                    }
                    span.store { (app.store.backend()) " · " (app.shown_url) }
                }
                main { (body) }
            }
        }
    }
}

/// The page an unauthenticated request gets: the login form, and nothing of the store.
pub(crate) fn login(failed: bool) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { "Sign in · idem board" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header { strong { "idem board" } }
                main {
                    h1 { "Sign in" }
                    @if failed {
                        div.error { "That is not the board's token." }
                    }
                    p.muted { "This board needs the token it was started with (--token)." }
                    form method="post" action="/login" {
                        input type="password" name="token" id="token" autocomplete="off"
                            placeholder="token" required;
                        " "
                        button type="submit" id="sign-in" { "Sign in" }
                    }
                }
            }
        }
    }
}

/// A state as a coloured label.
pub(crate) fn state(class: &str, label: &str) -> Markup {
    html! { span class={ "state " (class) } { (label) } }
}

/// A form that POSTs an action with the CSRF token.
pub(crate) fn action_form(
    app: &App,
    action: &str,
    hidden: &[(&str, &str)],
    label: &str,
    id: &str,
) -> Markup {
    html! {
        form.inline method="post" action=(action) {
            input type="hidden" name="csrf" value=(app.auth.csrf);
            @for (name, value) in hidden {
                input type="hidden" name=(name) value=(value);
            }
            button.danger type="submit" id=(id) { (label) }
        }
    }
}

/// A confirmation page: what will happen, and the button that does it.
pub(crate) fn confirm(
    app: &App,
    title: &str,
    what: Markup,
    action: &str,
    hidden: &[(&str, &str)],
    back: &str,
) -> Markup {
    page(
        app,
        title,
        html! {
            h1 { (title) "?" }
            (what)
            p {
                (action_form(app, action, hidden, "Confirm", "confirm"))
                " "
                a.button href=(back) id="cancel" style="background:#868e96" { "Cancel" }
            }
        },
    )
}
