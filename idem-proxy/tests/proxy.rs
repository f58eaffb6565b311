//! idem-proxy over real TCP, in front of upstreams the tests start (Python's standard library
//! and Node's `http`): replays, 422, 409, hang-ups, an upstream down or failing, limits,
//! configuration, principals, stores, metrics and shutdown.

mod support;

use reqwest::{Client, Response, StatusCode};
use serde_json::Value;
use std::time::Duration;
use support::{free_port, node_upstream, proxy, proxy_command, python_upstream, unique_key};

const AUTH: &str = "Bearer alice-token";

async fn post(url: &str, key: Option<&str>, auth: Option<&str>, body: &str) -> Response {
    let mut req = Client::new().post(url).body(body.to_owned());
    if let Some(k) = key {
        req = req.header("idempotency-key", k);
    }
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    req.send().await.unwrap()
}

/// The effects the upstream made so far.
async fn runs(upstream: &str) -> u64 {
    let v: Value = reqwest::get(format!("{upstream}/count"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["runs"].as_u64().unwrap()
}

fn replayed(res: &Response) -> bool {
    res.headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

async fn problem_type(res: Response) -> String {
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "{res:?}"
    );
    let v: Value = res.json().await.unwrap();
    v["type"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn the_same_key_twice_is_replayed_with_the_upstreams_headers_but_set_cookie() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &["--store", "memory", "--principal-header", "authorization"],
    );
    let url = format!("{}/charges", px.url);
    let first = post(&url, Some("\"k-1\""), Some(AUTH), "amount=10").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(!replayed(&first));
    assert_eq!(first.headers()["set-cookie"], "session=s1");
    let charge = first.headers()["x-charge-id"].clone();
    let first_body: Value = first.json().await.unwrap();
    // the key was forwarded, so the service can pass it on
    assert_eq!(first_body["key"], "\"k-1\"");

    let again = post(&url, Some("\"k-1\""), Some(AUTH), "amount=10").await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert!(replayed(&again));
    assert_eq!(again.headers()["x-charge-id"], charge);
    assert_eq!(again.headers()["location"], "/charges/1");
    assert!(again.headers().get("set-cookie").is_none());
    assert_eq!(again.json::<Value>().await.unwrap(), first_body);
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn the_same_key_with_another_body_is_a_422() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &["--store", "memory", "--principal-header", "authorization"],
    );
    let url = format!("{}/charges", px.url);
    assert_eq!(
        post(&url, Some("\"k-2\""), Some(AUTH), "amount=10")
            .await
            .status(),
        StatusCode::CREATED
    );
    let other = post(&url, Some("\"k-2\""), Some(AUTH), "amount=99").await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problem_type(other)
        .await
        .ends_with("#idempotency-key-reused"));
    // without a key where it is required: 400, nothing ran
    let none = post(&url, None, Some(AUTH), "amount=10").await;
    assert_eq!(none.status(), StatusCode::BAD_REQUEST);
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn a_concurrent_duplicate_gets_a_409_with_retry_after() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &["--store", "memory", "--principal-header", "authorization"],
    );
    let url = format!("{}/charges?delay_ms=1500", px.url);
    let first = tokio::spawn({
        let url = url.clone();
        async move { post(&url, Some("\"k-3\""), Some(AUTH), "a").await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    let dup = post(&url, Some("\"k-3\""), Some(AUTH), "a").await;
    assert_eq!(dup.status(), StatusCode::CONFLICT);
    assert!(dup.headers().contains_key("retry-after"));
    assert!(problem_type(dup).await.ends_with("#request-in-progress"));
    assert_eq!(first.await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn a_client_that_hangs_up_does_not_cut_the_upstream_call_and_its_retry_gets_the_response() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &["--store", "memory", "--principal-header", "authorization"],
    );
    let url = format!("{}/charges?delay_ms=800", px.url);
    let hung_up = Client::new()
        .post(&url)
        .header("idempotency-key", "\"k-4\"")
        .header("authorization", AUTH)
        .body("a")
        .timeout(Duration::from_millis(200))
        .send()
        .await;
    assert!(
        hung_up.is_err(),
        "the client gave up before the upstream answered"
    );
    // retries until the detached call has finished: 409 while it runs, then its response
    let mut answer = None;
    for _ in 0..50 {
        let res = post(&url, Some("\"k-4\""), Some(AUTH), "a").await;
        if res.status() != StatusCode::CONFLICT {
            answer = Some(res);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let res = answer.expect("the retry got an answer");
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(replayed(&res));
    assert_eq!(res.json::<Value>().await.unwrap()["id"], 1);
    assert_eq!(runs(&up).await, 1, "the upstream ran once");
}

#[tokio::test]
async fn an_upstream_that_is_down_is_a_502_and_the_key_is_released() {
    let port = free_port();
    let up = format!("http://127.0.0.1:{port}");
    let px = proxy(
        &up,
        &["--store", "memory", "--principal-header", "authorization"],
    );
    let url = format!("{}/charges", px.url);
    let res = post(&url, Some("\"k-5\""), Some(AUTH), "a").await;
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(
        problem_type(res).await,
        "urn:idem-proxy:problem:upstream-unavailable"
    );
    // the upstream comes up: the retry runs
    let (_up, up) = python_upstream(port);
    let res = post(&url, Some("\"k-5\""), Some(AUTH), "a").await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert!(!replayed(&res));
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn an_upstream_5xx_releases_the_key() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &["--store", "memory", "--principal-header", "authorization"],
    );
    let url = format!("{}/fail", px.url);
    for _ in 0..2 {
        let res = post(&url, Some("\"k-6\""), Some(AUTH), "a").await;
        assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!replayed(&res));
    }
    assert_eq!(runs(&up).await, 2, "a 5xx is not replayed: the retry ran");
}

#[tokio::test]
async fn a_response_over_the_limit_is_passed_on_not_stored() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &[
            "--store",
            "memory",
            "--principal-header",
            "authorization",
            "--response-limit",
            "1000",
        ],
    );
    let url = format!("{}/big?size=5000", px.url);
    for _ in 0..2 {
        let res = post(&url, Some("\"k-7\""), Some(AUTH), "a").await;
        assert_eq!(res.status(), StatusCode::CREATED);
        assert!(!replayed(&res));
        assert_eq!(res.bytes().await.unwrap().len(), 5000);
    }
    assert_eq!(runs(&up).await, 2);
    // and a request body over the limit is a 413 before anything runs
    let px = proxy(
        &up,
        &[
            "--store",
            "memory",
            "--allow-anonymous",
            "--body-limit",
            "10",
        ],
    );
    let res = post(
        &format!("{}/charges", px.url),
        Some("\"k-8\""),
        None,
        "0123456789ab",
    )
    .await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(runs(&up).await, 2);
}

#[test]
fn bad_configuration_is_refused_with_the_reason() {
    let out = |args: &[&str]| {
        let o = proxy_command(args).output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
        )
    };
    let (code, err, _) = out(&["--upstream", "http://127.0.0.1:1", "--store", "memory"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("no principal"), "{err}");

    let (code, err, _) = out(&[
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        "oracle://x",
        "--allow-anonymous",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("oracle"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\nallow_anonymous = true\n\n[[route]]\npath = \"/payments\"\nttl = \"7 fortnights\"\n",
    )
    .unwrap();
    let (code, err, _) = out(&["--check-config", bad.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(err.contains("bad.toml:7:"), "the line of the error: {err}");
    let takeover = dir.path().join("takeover.toml");
    std::fs::write(
        &takeover,
        "upstream = \"http://127.0.0.1:3000\"\nstore = \"memory\"\nallow_anonymous = true\n\n[[route]]\npath = \"/payments\"\non_abandoned = \"retry\"\n",
    )
    .unwrap();
    let (code, err, _) = out(&["--check-config", takeover.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("takeover.toml:7:") && err.contains("park"),
        "the line and the choices: {err}"
    );

    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "upstream = \"http://127.0.0.1:3000\"\nstore = \"postgres://u:secret@127.0.0.1/db\"\nprincipal_header = \"authorization\"\n\n[[route]]\nmethod = \"POST\"\npath = \"/payments\"\nttl = \"7d\"\nfingerprint = \"canonical\"\non_abandoned = \"park\"\n",
    )
    .unwrap();
    let (code, err, printed) = out(&["--check-config", good.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        printed.contains("/payments")
            && printed.contains("canonical")
            && printed.contains("on_abandoned=park"),
        "{printed}"
    );
    assert!(
        !printed.contains("secret"),
        "the store's password is not printed: {printed}"
    );

    // a store that cannot be reached: exit 1 with the reason
    let (code, err, _) = out(&[
        "--upstream",
        "http://127.0.0.1:1",
        "--store",
        &format!("postgres://postgres@127.0.0.1:{}/test", free_port()),
        "--allow-anonymous",
    ]);
    assert_eq!(code, Some(1));
    assert!(err.contains("cannot open the store"), "{err}");
}

fn jwt(secret: &[u8], sub: &str) -> String {
    #[derive(serde::Serialize)]
    struct Claims<'a> {
        sub: &'a str,
        exp: u64,
    }
    let exp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &Claims { sub, exp },
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .unwrap()
}

#[tokio::test]
async fn a_jwt_sub_scopes_keys_and_a_bad_token_is_a_401_before_anything_runs() {
    let secret = b"0123456789abcdef0123456789abcdef-test";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("secret");
    std::fs::write(&file, secret).unwrap();
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &[
            "--store",
            "memory",
            "--jwt-secret-file",
            file.to_str().unwrap(),
        ],
    );
    let url = format!("{}/charges", px.url);
    let alice = format!("Bearer {}", jwt(secret, "alice"));
    let bob = format!("Bearer {}", jwt(secret, "bob"));
    let a1 = post(&url, Some("\"k-9\""), Some(&alice), "a").await;
    assert_eq!(a1.status(), StatusCode::CREATED);
    let a2 = post(&url, Some("\"k-9\""), Some(&alice), "a").await;
    assert!(replayed(&a2));
    // the same key under another sub is another key
    let b1 = post(&url, Some("\"k-9\""), Some(&bob), "a").await;
    assert_eq!(b1.status(), StatusCode::CREATED);
    assert!(!replayed(&b1));
    assert_eq!(runs(&up).await, 2);

    let forged = format!(
        "Bearer {}",
        jwt(b"another-secret-another-secret-0000", "alice")
    );
    let res = post(&url, Some("\"k-9\""), Some(&forged), "a").await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        problem_type(res).await,
        "urn:idem-proxy:problem:unauthorized"
    );
    let res = post(&url, Some("\"k-10\""), None, "a").await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(runs(&up).await, 2, "nothing ran for a bad or missing token");
}

#[tokio::test]
async fn a_node_upstream_is_replayed_and_unkeyed_requests_pass_through() {
    let (_up, up) = node_upstream();
    let px = proxy(
        &up,
        &[
            "--store",
            "memory",
            "--allow-anonymous",
            "--key",
            "optional",
        ],
    );
    let url = format!("{}/orders", px.url);
    let first = post(&url, Some("\"n-1\""), None, "{\"sku\":1}").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let order = first.headers()["x-order-id"].clone();
    let again = post(&url, Some("\"n-1\""), None, "{\"sku\":1}").await;
    assert!(replayed(&again));
    assert_eq!(again.headers()["x-order-id"], order);
    assert!(again.headers().get("set-cookie").is_none());
    assert_eq!(runs(&up).await, 1);
    // no key where it is optional: straight through, every time
    for _ in 0..2 {
        let res = post(&url, None, None, "{\"sku\":2}").await;
        assert_eq!(res.status(), StatusCode::CREATED);
        assert!(!replayed(&res));
    }
    assert_eq!(runs(&up).await, 3);
}

#[tokio::test]
async fn per_route_settings_apply_by_method_and_path_prefix() {
    let (_up, up) = python_upstream(0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.toml");
    std::fs::write(
        &file,
        format!(
            "upstream = \"{up}\"\nstore = \"memory\"\nallow_anonymous = true\nlisten = \"127.0.0.1:0\"\n\n\
             [[route]]\nmethod = \"POST\"\npath = \"/charges\"\nfingerprint = \"canonical\"\n\n\
             [[route]]\nmethod = \"POST\"\npath = \"/fail\"\nkey = \"off\"\n"
        ),
    )
    .unwrap();
    let px = proxy(&up, &["--config", file.to_str().unwrap()]);
    // canonical: the same JSON in another order is the same request
    let json = |body: &'static str| {
        Client::new()
            .post(format!("{}/charges", px.url))
            .header("idempotency-key", "\"r-1\"")
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let a = json("{\"a\":1,\"b\":2}").await.unwrap();
    assert_eq!(a.status(), StatusCode::CREATED);
    let b = json("{ \"b\": 2, \"a\": 1 }").await.unwrap();
    assert!(replayed(&b));
    // key = "off": no key needed, nothing stored
    let res = post(&format!("{}/fail", px.url), None, None, "x").await;
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    // elsewhere the defaults: a key is required
    let res = post(&format!("{}/big", px.url), None, None, "x").await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(runs(&up).await, 2);
}

#[tokio::test]
async fn two_proxies_on_one_postgres_share_keys() {
    let Ok(pg) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("IDEM_REQUIRE_SERVICES").as_deref() != Ok("1"),
            "IDEM_TEST_POSTGRES_URL is not set"
        );
        eprintln!("skipped: IDEM_TEST_POSTGRES_URL is not set");
        return;
    };
    let (_up, up) = python_upstream(0);
    let a = proxy(
        &up,
        &["--store", &pg, "--principal-header", "authorization"],
    );
    let b = proxy(
        &up,
        &["--store", &pg, "--principal-header", "authorization"],
    );
    let key = unique_key("pg");
    let first = post(&format!("{}/charges", a.url), Some(&key), Some(AUTH), "a").await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = post(&format!("{}/charges", b.url), Some(&key), Some(AUTH), "a").await;
    assert!(
        replayed(&again),
        "the second proxy replays the first one's response"
    );
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn metrics_and_health_on_the_admin_listener() {
    let (_up, up) = python_upstream(0);
    let px = proxy(&up, &["--store", "memory", "--allow-anonymous"]);
    post(&format!("{}/charges", px.url), Some("\"m-1\""), None, "a").await;
    let health = reqwest::get(format!("{}/healthz", px.admin)).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let metrics = reqwest::get(format!("{}/metrics", px.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("idem_proxy_requests_total") && metrics.contains("outcome=\"fresh\""),
        "{metrics}"
    );
    assert!(
        metrics.contains("idem_calls_total"),
        "the runtime's metrics too: {metrics}"
    );
    // the admin listener is not the proxy
    let res = reqwest::get(format!("{}/metrics", px.url)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.text().await.unwrap().contains("\"path\": \"/metrics\""));
}

#[tokio::test]
async fn sigterm_waits_for_the_request_in_flight() {
    let (_up, up) = python_upstream(0);
    let mut px = proxy(&up, &["--store", "memory", "--allow-anonymous"]);
    let url = format!("{}/charges?delay_ms=1000", px.url);
    let first = tokio::spawn(async move { post(&url, Some("\"t-1\""), None, "a").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    px.proc.terminate();
    let res = first.await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let status = tokio::task::spawn_blocking(move || {
        let s = px.proc.child.wait().unwrap();
        (s, px)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "{status:?}");
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn max_in_flight_bounds_the_upstream_calls() {
    let (_up, up) = python_upstream(0);
    let px = proxy(
        &up,
        &[
            "--store",
            "memory",
            "--allow-anonymous",
            "--max-in-flight",
            "1",
        ],
    );
    let url = format!("{}/charges?delay_ms=1000", px.url);
    let first = tokio::spawn({
        let url = url.clone();
        async move { post(&url, Some("\"q-1\""), None, "a").await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = post(&url, Some("\"q-2\""), None, "a").await;
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(second.headers().contains_key("retry-after"));
    assert!(problem_type(second).await.ends_with("#overloaded"));
    assert_eq!(first.await.unwrap().status(), StatusCode::CREATED);
    assert_eq!(runs(&up).await, 1);
}

#[tokio::test]
async fn the_log_has_one_line_per_request_with_the_key_digest_never_the_key_or_credential() {
    let (_up, up) = python_upstream(0);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("proxy.log");
    let mut child = proxy_command(&[
        "--listen",
        "127.0.0.1:0",
        "--upstream",
        &up,
        "--store",
        "memory",
        "--principal-header",
        "authorization",
    ])
    .env("IDEM_PROXY_LOG", "info")
    .stdout(std::process::Stdio::piped())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let url = line.split_whitespace().nth(3).unwrap().to_owned();
    let key = "\"key-that-must-not-be-logged\"";
    let auth = "Bearer token-that-must-not-be-logged";
    post(&format!("{url}/charges"), Some(key), Some(auth), "a").await;
    post(&format!("{url}/charges"), Some(key), Some(auth), "a").await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("must-not-be-logged"), "{text}");
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "request")
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["outcome"], "fresh");
    assert_eq!(lines[1]["outcome"], "replayed");
    assert_eq!(lines[0]["route"], "*");
    assert_eq!(lines[1]["status"], 201);
    assert!(lines[1]["latency_us"].is_u64());
    let digest = lines[0]["key_digest"].as_str().unwrap();
    assert_eq!(digest.len(), 32);
    assert_eq!(lines[1]["key_digest"], digest);
}
