//! The configuration's tests: files as an operator writes them.

use super::*;

fn load(toml: &str) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("proxy.toml");
    std::fs::write(&path, toml).unwrap();
    Settings::load(&Cli {
        config: Some(path),
        ..Cli::default()
    })
}

#[test]
fn routes_inherit_the_defaults_and_match_whole_segments() {
    let s = load(
        r#"
upstream = "http://127.0.0.1:3000"
store = "memory"
allow_anonymous = true
ttl = "1h"

[[route]]
method = "POST"
path = "/payments"
ttl = "7d"
fingerprint = "canonical"

[[route]]
methods = ["post", "put"]
path = "/payments/refunds"
key = "optional"
"#,
    )
    .unwrap();
    assert_eq!(s.routes[0].path, "/payments/refunds");
    assert_eq!(s.routes[0].settings.methods, [Method::POST, Method::PUT]);
    assert_eq!(s.routes[0].settings.ttl, Some(Duration::from_secs(3600)));
    assert_eq!(
        s.routes[1].settings.ttl,
        Some(Duration::from_secs(7 * 86400))
    );
    assert_eq!(s.routes[1].settings.fingerprint, Fingerprint::Canonical);
    assert!(s.routes[1].matches("/payments"));
    assert!(s.routes[1].matches("/payments/1"));
    assert!(!s.routes[1].matches("/paymentsx"));
}

#[test]
fn an_error_names_its_line() {
    let e = load("upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\n\n[[route]]\npath = \"/a\"\nttl = \"5 parsecs\"\n")
        .unwrap_err();
    assert!(e.0.contains(":6:"), "{e}");
    let e = load("upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\nlisten_on = 1\n")
        .unwrap_err();
    assert!(e.0.contains(":3:") && e.0.contains("listen_on"), "{e}");
}

#[test]
fn no_principal_is_refused() {
    let e = load("upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\n").unwrap_err();
    assert!(e.0.contains("no principal"), "{e}");
}

#[test]
fn a_password_is_not_printed() {
    assert_eq!(
        redact("postgres://u:secret@h:5432/db"),
        "postgres://u:***@h:5432/db"
    );
    assert_eq!(redact("memory"), "memory");
}

#[test]
fn a_route_parks_abandoned_requests_or_reruns_them_and_a_bad_choice_is_refused() {
    let s = load(
        r#"
upstream = "http://127.0.0.1:3000"
store = "memory"
allow_anonymous = true

[[route]]
path = "/payments"
on_abandoned = "park"

[[route]]
path = "/search"
"#,
    )
    .unwrap();
    let route = |p: &str| s.routes.iter().find(|r| r.path == p).unwrap();
    assert_eq!(route("/payments").settings.on_abandoned, Abandoned::Park);
    assert_eq!(
        route("/payments").settings.on_abandoned.choice(),
        idem::OnAbandoned::Park
    );
    assert_eq!(route("/search").settings.on_abandoned, Abandoned::Rerun);
    assert_eq!(s.defaults.on_abandoned, Abandoned::Rerun, "the default");
    assert!(
        s.describe().contains("on_abandoned=park"),
        "{}",
        s.describe()
    );

    // A file-wide default, inherited by a route that says nothing.
    let s = load(
        "upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\nallow_anonymous = true\n\
         on_abandoned = \"park\"\n\n[[route]]\npath = \"/a\"\n",
    )
    .unwrap();
    assert_eq!(s.routes[0].settings.on_abandoned, Abandoned::Park);

    // Refused at start, at its line, saying what to write.
    let e = load(
        "upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\nallow_anonymous = true\n\n\
         [[route]]\npath = \"/a\"\non_abandoned = \"retry\"\n",
    )
    .unwrap_err();
    assert!(e.0.contains(":7:"), "{e}");
    assert!(e.0.contains("rerun") && e.0.contains("park"), "{e}");
    let e = Settings::load(&Cli {
        upstream: Some("http://127.0.0.1:3000".into()),
        store: Some("memory".into()),
        allow_anonymous: Some(true),
        on_abandoned: Some("sometimes".into()),
        ..Cli::default()
    })
    .unwrap_err();
    assert!(e.0.contains("use rerun or park"), "{e}");
}
