//! Parked keys on the board, without a browser (plain HTTP on loopback against a SQLite store):
//! counted on the overview, listed and filtered, resolved both ways from a key's page through
//! the confirmation and the CSRF token; a forged or bad form changes nothing, and a key that is
//! not parked is not resolved.

use idem::Idem;
use idem_board::{Board, BoardOptions};
use std::sync::atomic::{AtomicU32, Ordering};

// The application's calls that park keys: the CLI's parked-keys scenario's.
#[allow(dead_code)] // the scenario itself runs in the CLI's tests
#[path = "../../idem-cli/tests/common/parked.rs"]
mod parked;

use parked::{die_mid_body, retry, LAPSE};

struct Page {
    status: u16,
    location: Option<String>,
    body: String,
}

struct Client {
    base: String,
    http: reqwest::Client,
}

impl Client {
    async fn get(&self, path: &str) -> Page {
        let res = self
            .http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        page(res).await
    }

    async fn post(&self, path: &str, form: &[(&str, &str)]) -> Page {
        let res = self
            .http
            .post(format!("{}{path}", self.base))
            .form(form)
            .send()
            .await
            .unwrap();
        page(res).await
    }
}

async fn page(res: reqwest::Response) -> Page {
    Page {
        status: res.status().as_u16(),
        location: res
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_string()),
        body: res.text().await.unwrap(),
    }
}

/// The CSRF token a page's form carries.
fn csrf(html: &str) -> String {
    let at = html
        .find("name=\"csrf\" value=\"")
        .expect("a form with the CSRF token")
        + 19;
    html[at..].split('"').next().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_keys_are_counted_listed_and_resolved_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("keys.db").display());
    let app = Idem::sqlite(&url).await.unwrap();
    let runs = AtomicU32::new(0);
    let name = "charges.v1";
    tokio::join!(
        die_mid_body(&app, name, "order-1"),
        die_mid_body(&app, name, "order-2"),
    );
    tokio::time::sleep(LAPSE).await;
    for key in ["order-1", "order-2"] {
        let parked = retry(&app, name, key, &runs).await;
        assert!(
            matches!(parked, Err(idem::Error::OutcomeUnknown { .. })),
            "{parked:?}"
        );
    }
    retry(&app, name, "done", &runs).await.unwrap();
    let hex = |key: &str| idem::testkit::digest(name, key).to_hex();

    let board = Board::bind(BoardOptions::new(url.clone()).listen(([127, 0, 0, 1], 0).into()))
        .await
        .unwrap();
    let base = format!("http://{}", board.local_addr());
    let server = tokio::spawn(board.serve_until(std::future::pending()));
    let c = Client {
        base,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
    };

    // The overview counts them and links to their list.
    let overview = c.get("/").await;
    assert_eq!(overview.status, 200);
    let card = overview
        .body
        .split("id=\"total-parked\"")
        .nth(1)
        .expect("the parked card");
    assert!(card.starts_with("><b>2</b>"), "{card:.80}");
    // The list, and its filter by function; the keys list's state filter.
    let list = c.get("/parked").await.body;
    assert!(
        list.contains(&hex("order-1")) && list.contains(&hex("order-2")),
        "{list}"
    );
    assert!(!list.contains(&hex("done")));
    let other = c.get("/parked?name=refunds").await.body;
    assert!(other.contains("id=\"none-parked\""), "{other}");
    let keys = c.get("/keys?state=parked").await.body;
    assert!(
        keys.contains(&hex("order-1")) && !keys.contains(&hex("done")),
        "{keys}"
    );

    // A parked key's page offers the resolve; its confirmation page carries the token.
    let key_page = c.get(&format!("/keys/{}", hex("order-1"))).await.body;
    assert!(key_page.contains("id=\"resolve\""), "{key_page}");
    let confirm = c.get(&format!("/keys/{}/resolve", hex("order-1"))).await;
    assert!(confirm.body.contains("id=\"confirm-applied\""));
    assert!(confirm.body.contains("id=\"confirm-not-applied\""));
    let token = csrf(&confirm.body);
    let resolve = format!("/keys/{}/resolve", hex("order-1"));

    // A forged form, or one with a bad value, changes nothing.
    let forged = c
        .post(&resolve, &[("csrf", "0000"), ("verdict", "not_applied")])
        .await;
    assert_eq!(forged.status, 403);
    let bad = c
        .post(
            &resolve,
            &[("csrf", &token), ("verdict", "applied"), ("value", "{nope")],
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("not JSON"), "{}", bad.body);
    let parked = retry(&app, name, "order-1", &runs).await;
    assert!(
        matches!(parked, Err(idem::Error::OutcomeUnknown { .. })),
        "{parked:?}"
    );

    // Applied, with the value found downstream: the next call replays it, no body runs.
    let done = c
        .post(
            &resolve,
            &[
                ("csrf", &token),
                ("verdict", "applied"),
                ("value", "4200"),
                ("ttl", "1h"),
            ],
        )
        .await;
    assert_eq!(done.status, 303);
    assert_eq!(
        done.location.unwrap(),
        format!("/keys/{}?done=applied", hex("order-1"))
    );
    let replay = retry(&app, name, "order-1", &runs).await.unwrap();
    assert_eq!((replay.is_replayed(), replay.into_inner()), (true, 4200));
    let after = c
        .get(&format!("/keys/{}?done=applied", hex("order-1")))
        .await
        .body;
    assert!(after.contains("Resolved as applied"), "{after}");
    assert!(
        !after.contains("id=\"resolve\""),
        "completed now: no resolve offered"
    );

    // Not applied: the next call runs the body.
    let done = c
        .post(
            &format!("/keys/{}/resolve", hex("order-2")),
            &[("csrf", &token), ("verdict", "not_applied")],
        )
        .await;
    assert_eq!(
        done.location.unwrap(),
        format!("/keys/{}?done=not_applied", hex("order-2"))
    );
    let before = runs.load(Ordering::SeqCst);
    let rerun = retry(&app, name, "order-2", &runs).await.unwrap();
    assert!(!rerun.is_replayed());
    assert_eq!(runs.load(Ordering::SeqCst), before + 1);

    // A key that is not parked (completed) is not resolved, and keeps its value.
    let confirm = c.get(&format!("/keys/{}/resolve", hex("done"))).await.body;
    assert!(confirm.contains("id=\"not-parked\""), "{confirm}");
    let refused = c
        .post(
            &format!("/keys/{}/resolve", hex("done")),
            &[("csrf", &token), ("verdict", "not_applied")],
        )
        .await;
    assert_eq!(
        refused.location.unwrap(),
        format!("/keys/{}?done=not_parked", hex("done"))
    );
    let still = retry(&app, name, "done", &runs).await.unwrap();
    assert_eq!((still.is_replayed(), still.into_inner()), (true, 7));

    // None is left to resolve.
    let none = c.get("/parked").await.body;
    assert!(none.contains("id=\"none-parked\""), "{none}");
    server.abort();
}
