//! The board in a real browser (Debian's headless Chromium, driven over WebDriver by
//! chromedriver) on a PostgreSQL store: sign in with the token, open the overview, find the
//! stuck in-progress key, force-release it through the confirmation page and see its state
//! change; requests without the token are refused and show nothing of the store; an action
//! without the CSRF token is refused. Each page is saved as a screenshot under the test's
//! target folder; `IDEM_BOARD_SCREENSHOTS=docs/board` (from the checkout's root) refreshes the
//! ones the docs show. A test never writes into the source tree by default: CI packages the
//! crates from a clean tree after the tests.

use fantoccini::{Client, ClientBuilder, Locator};
use idem::postgres::sqlx::{self, PgPool};
use idem::postgres::PostgresOptions;
use idem::store::Store;
use idem_board::{Board, BoardOptions};
use idem_integration::harness::{self, Need, Programs, POSTGRES};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

const TOKEN: &str = "a-token-for-the-browser-test";

/// PostgreSQL, Chromium and chromedriver.
struct PostgresAndChromium;

impl Need for PostgresAndChromium {
    type Given = String;

    fn check(&self) -> Result<String, String> {
        Programs(&["chromium", "chromedriver"]).check()?;
        POSTGRES.check()
    }
}

/// A table of this test's own, dropped (with its version table) at the end.
struct Table {
    name: String,
    admin: PgPool,
}

impl Table {
    async fn new(url: &str) -> Table {
        Table {
            name: format!("idem_board_{}", std::process::id()),
            admin: PgPool::connect(url).await.expect("admin connection"),
        }
    }

    async fn drop_all(&self) {
        for t in [self.name.clone(), format!("{}_migrations", self.name)] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{t}\""))
                .execute(&self.admin)
                .await
                .expect("drop the test's table");
        }
    }
}

/// A call of `name` for `key` whose process dies inside the body: its claim stays, in
/// progress, for the lease of an hour.
async fn leave_stuck_claim(idem: &idem::Idem, name: &'static str, key: &str) {
    let (claimed, started) = tokio::sync::oneshot::channel::<()>();
    let call = idem
        .call(name)
        .key(key)
        .lease(Duration::from_secs(3600))
        .run(async move {
            let _ = claimed.send(());
            std::future::pending::<()>().await;
            Ok::<u32, idem::Error>(0)
        });
    let task = tokio::spawn(call);
    started
        .await
        .expect("the body started, so the key is claimed");
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
}

/// A free loopback port (for chromedriver, which takes a port, not a listener).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// chromedriver on a free loopback port, killed when dropped.
async fn chromedriver() -> (tokio::process::Child, u16) {
    let port = free_port();
    let child = tokio::process::Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver starts");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return (child, port);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("chromedriver did not listen on 127.0.0.1:{port}");
}

/// Headless Chromium with a profile of its own, nothing fetched in the background.
async fn browser(port: u16, profile: &std::path::Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ]
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a WebDriver session in Chromium")
}

fn screenshots() -> PathBuf {
    let dir = match std::env::var_os("IDEM_BOARD_SCREENSHOTS") {
        Some(dir) => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(dir),
        None => PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("board"),
    };
    std::fs::create_dir_all(&dir).expect("the screenshots' folder");
    dir
}

async fn shot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "{name} is a PNG");
    std::fs::write(screenshots().join(name), png).expect("the screenshot saved");
}

/// The text of the element `css`, waiting for it (a click's navigation may still be under
/// way).
async fn text(client: &Client, css: &str) -> String {
    let found = client
        .wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(css))
        .await;
    match found {
        Ok(element) => element.text().await.expect("its text"),
        Err(e) => {
            let url = client.current_url().await.map(|u| u.to_string());
            let source = client.source().await.unwrap_or_default();
            panic!("{css} on the page at {url:?}: {e}\n{source}")
        }
    }
}

async fn a_stuck_key_is_found_and_force_released_in_the_browser(url: String) {
    let table = Table::new(&url).await;
    let store = PostgresOptions::from_url(&url)
        .unwrap()
        .table(&table.name)
        .connect()
        .await
        .expect("PostgreSQL store");
    let app = idem::Idem::from_store(store.clone());
    leave_stuck_claim(&app, "charges.v1", "order-1234").await;
    for i in 0..3 {
        let value = serde_json::json!({"sent": true, "to": format!("user{i}@example.com")});
        app.call("emails.v1")
            .key(&format!("welcome-{i}"))
            .run(async move { Ok::<_, idem::Error>(value) })
            .await
            .expect("a completed call");
    }
    let checkout = app.call("checkout.v1").key("order-77").run(async {
        idem::step("reserve", || async { Ok::<_, idem::Error>(3u32) }).await?;
        idem::step("charge", || async {
            Ok::<_, idem::Error>(String::from("ch_1"))
        })
        .await?;
        Ok::<_, idem::Error>(serde_json::json!({"order": 77, "status": "paid"}))
    });
    checkout.await.expect("the checkout with its steps");
    let stuck = idem::key::key_digest("charges.v1", None, &idem_key("order-1234"));
    assert!(
        store.get(&stuck).await.unwrap().is_some(),
        "the stuck claim is live"
    );

    let board = Board::bind(
        BoardOptions::new(url.clone())
            .target(idem::admin::Target::new(Some(table.name.clone()), None))
            .listen(SocketAddr::from(([127, 0, 0, 1], 0)))
            .token(Some(TOKEN.into())),
    )
    .await
    .expect("the board starts");
    let base = format!("http://{}", board.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(board.serve_until(async {
        let _ = stopped.await;
    }));

    // Without the token: refused, and nothing of the store in the answer.
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let stuck_hex = stuck.to_hex();
    for path in ["/", "/keys", &format!("/keys/{stuck_hex}")] {
        for auth in [None, Some("Bearer not-the-token-at-all")] {
            let mut req = http.get(format!("{base}{path}"));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            let res = req.send().await.unwrap();
            assert_eq!(res.status(), 401, "{path} without the token");
            let body = res.text().await.unwrap();
            assert!(body.contains("Sign in"), "{body}");
            for secret in [stuck_hex.as_str(), &stuck_hex[..16], "charges.v1", "user0@"] {
                assert!(
                    !body.contains(secret),
                    "{path} shows {secret} without the token"
                );
            }
        }
    }
    let bearer = format!("Bearer {TOKEN}");
    let res = http
        .get(format!("{base}/keys/{stuck_hex}"))
        .header("authorization", &bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.text().await.unwrap().contains("charges.v1"));
    // With the token but not the form's CSRF token, an action is refused and changes nothing.
    let res = http
        .post(format!("{base}/keys/{stuck_hex}/release"))
        .header("authorization", &bearer)
        .form(&[("csrf", "0".repeat(64))])
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 403);
    assert!(store.get(&stuck).await.unwrap().is_some(), "still claimed");

    let (_driver, port) = chromedriver().await;
    let profile = tempfile::tempdir().expect("a profile folder");
    let client = browser(port, profile.path()).await;
    let result = drive(&client, &base, &stuck_hex).await;
    client.close().await.expect("the browser closes");
    result.expect("the browser session");
    assert!(
        store.get(&stuck).await.unwrap().is_none(),
        "the key was released in the store"
    );

    let _ = stop.send(());
    server.await.expect("the board stops");
    table.drop_all().await;
}

/// The key's encoding as a `.key("…")` call writes it.
fn idem_key(key: &str) -> Vec<u8> {
    idem::key::canonical(key).expect("a string key encodes")
}

/// The operator's walk through the board, in the browser.
async fn drive(
    client: &Client,
    base: &str,
    stuck_hex: &str,
) -> Result<(), fantoccini::error::CmdError> {
    // Signing in.
    client.goto(&format!("{base}/")).await?;
    assert!(text(client, "h1").await.contains("Sign in"));
    shot(client, "login.png").await;
    client
        .find(Locator::Css("#token"))
        .await?
        .send_keys("wrong-token-0123456789")
        .await?;
    client.find(Locator::Css("#sign-in")).await?.click().await?;
    assert!(text(client, ".error")
        .await
        .contains("not the board's token"));
    client
        .find(Locator::Css("#token"))
        .await?
        .send_keys(TOKEN)
        .await?;
    client.find(Locator::Css("#sign-in")).await?.click().await?;

    // The overview: one attempt in flight, in charges.v1, and the steps summed by name.
    text(client, "#by-function").await;
    assert_eq!(text(client, "h1").await, "Overview");
    assert_eq!(text(client, "#total-in-progress b").await, "1");
    let by_function = text(client, "#by-function").await;
    assert!(by_function.contains("charges.v1"), "{by_function}");
    assert!(by_function.contains("step step"), "{by_function}");
    assert!(text(client, "#oldest").await.contains("charges.v1"));
    shot(client, "overview.png").await;

    // The oldest attempt in flight leads to the stuck key.
    client
        .find(Locator::Css("#oldest a"))
        .await?
        .click()
        .await?;
    text(client, "#keys").await;
    assert_eq!(text(client, "h1").await, "Keys");
    let rows = client.find_all(Locator::Css("#keys tr.record")).await?;
    assert_eq!(rows.len(), 1, "one stuck key");
    assert_eq!(
        rows[0].attr("data-key").await?.as_deref(),
        Some(stuck_hex),
        "the stuck key is listed"
    );
    shot(client, "keys.png").await;
    rows[0].find(Locator::Css("a")).await?.click().await?;

    // Its page: in progress, token 1, no value yet.
    assert!(text(client, "#state").await.contains("in progress"));
    assert!(text(client, "#record").await.contains("charges.v1"));
    shot(client, "key.png").await;
    client.find(Locator::Css("#release")).await?.click().await?;

    // The confirmation, then the release.
    text(client, "#confirm").await;
    assert!(text(client, "h1").await.contains("Force-release"));
    shot(client, "confirm-release.png").await;
    client.find(Locator::Css("#confirm")).await?.click().await?;
    assert!(text(client, "#notice").await.contains("Released"));
    assert!(text(client, "#state").await.contains("no live record"));
    shot(client, "released.png").await;

    // A completed call with steps: its value as JSON and its two steps.
    client
        .goto(&format!("{base}/keys?name=checkout.v1"))
        .await?;
    client
        .find(Locator::Css("#keys tr.record a"))
        .await?
        .click()
        .await?;
    assert!(text(client, "#value")
        .await
        .contains("\"status\": \"paid\""));
    let steps = client.find_all(Locator::Css("#steps tr.record")).await?;
    assert_eq!(steps.len(), 2, "reserve and charge");
    shot(client, "key-with-steps.png").await;

    // The purge's confirmation page (nothing is expired: it is only shown).
    client.goto(&format!("{base}/purge")).await?;
    assert!(text(client, "h1").await.contains("Purge expired records"));
    shot(client, "confirm-purge.png").await;
    Ok(())
}

fn main() -> std::process::ExitCode {
    harness::run(vec![harness::trial(
        PostgresAndChromium,
        "a_stuck_key_is_found_and_force_released_in_the_browser",
        a_stuck_key_is_found_and_force_released_in_the_browser,
    )])
}
