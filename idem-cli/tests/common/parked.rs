//! Parked keys through the tool, the same on every store (included by the CLI's own tests and by
//! integration/tests/mysql_cli.rs): keys parked by real calls (`on_abandoned = park`), listed by
//! `idem pending`, resolved both ways by `idem resolve`, and the refusals of a key that is not
//! parked (the board's test uses its calls too). `run` runs the tool against the store the application `app` uses and returns its
//! exit code, stdout and stderr.

use idem::{Idem, OnAbandoned};
use std::time::Duration;

/// A lease that lapses within the test, and a wait that outlasts it on a loaded machine.
pub const LEASE: Duration = Duration::from_millis(400);
pub const LAPSE: Duration = Duration::from_millis(1200);

/// Claims `key` of `name` and dies mid-body (the future dropped after the claim).
pub async fn die_mid_body(app: &Idem, name: &str, key: &str) {
    let (claimed, started) = tokio::sync::oneshot::channel::<()>();
    let call = app
        .call(name.to_string())
        .key(key)
        .lease(LEASE)
        .run(async move {
            let _ = claimed.send(());
            std::future::pending::<Result<u32, idem::Error>>().await
        });
    tokio::select! {
        _ = call => unreachable!("the body never returns"),
        _ = started => {}
    }
}

/// The call a retry makes: `on_abandoned = park`, a body that counts its runs.
pub async fn retry(
    app: &Idem,
    name: &str,
    key: &str,
    runs: &std::sync::atomic::AtomicU32,
) -> Result<idem::Outcome<u32>, idem::Error> {
    app.call(name.to_string())
        .key(key)
        .lease(LEASE)
        .on_abandoned(OnAbandoned::Park)
        .run(async {
            runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok::<u32, idem::Error>(7)
        })
        .await
}

/// One run of the tool: exit code, stdout, stderr.
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    fn expect(self, code: i32, what: &str) -> Out {
        assert_eq!(
            self.code, code,
            "{what}: exit code; stdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).expect("one JSON document")
    }
}

/// The scenario, in namespace `name` (unique to the test).
pub async fn parked_keys_are_listed_and_resolved(
    app: &Idem,
    name: &str,
    run: impl Fn(&[&str]) -> Out,
) {
    use std::sync::atomic::{AtomicU32, Ordering};
    let runs = AtomicU32::new(0);
    // Three workers die mid-charge; one key completes; one is claimed by a live worker.
    tokio::join!(
        die_mid_body(app, name, "order-1"),
        die_mid_body(app, name, "order-2"),
        die_mid_body(app, name, "order-3"),
    );
    tokio::time::sleep(LAPSE).await;
    for key in ["order-1", "order-2", "order-3"] {
        let parked = retry(app, name, key, &runs).await;
        assert!(
            matches!(parked, Err(idem::Error::OutcomeUnknown { .. })),
            "{key}: {parked:?}"
        );
    }
    retry(app, name, "done", &runs).await.unwrap();
    let (claimed, started) = tokio::sync::oneshot::channel::<()>();
    let live = app
        .call(name.to_string())
        .key("running")
        .lease(Duration::from_secs(3600))
        .run(async move {
            let _ = claimed.send(());
            std::future::pending::<Result<u32, idem::Error>>().await
        });
    let live = tokio::spawn(live);
    started.await.unwrap();
    live.abort();
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only `done` ran its body");

    // `idem pending NAME` lists exactly the parked keys, with the attempt that parked them.
    let digest = |key: &str| idem::testkit::digest(name, key).to_hex();
    let listed = run(&["--json", "pending", name]).expect(0, "pending");
    let mut found: Vec<(String, u64)> = listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["name"], name);
            (
                r["digest"].as_str().unwrap().to_string(),
                r["attempt"].as_u64().unwrap(),
            )
        })
        .collect();
    found.sort();
    let mut want: Vec<(String, u64)> = ["order-1", "order-2", "order-3"]
        .iter()
        .map(|k| (digest(k), 2))
        .collect();
    want.sort();
    assert_eq!(found, want);
    let text = run(&["pending", name]).expect(0, "pending as text");
    assert!(text.stdout.starts_with("NAME"), "{}", text.stdout);
    assert!(text.stdout.contains(&digest("order-1")), "{}", text.stdout);
    let elsewhere = run(&["--json", "pending", "some.other.name"]).expect(0, "pending other");
    assert_eq!(elsewhere.json().as_array().unwrap().len(), 0);

    // Applied, with the value found at the gateway: the retry replays it, the body does not run.
    let out = run(&["resolve", name, "order-1", "--applied", "--value", "4200"]);
    let out = out.expect(0, "resolve --applied");
    assert!(out.stdout.contains("applied"), "{}", out.stdout);
    let replay = retry(app, name, "order-1", &runs).await.unwrap();
    assert!(replay.is_replayed());
    assert_eq!(replay.into_inner(), 4200);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Not applied, by the digest `pending` lists (a namespace given beside it must be the
    // record's): the retry runs the body, as a first attempt would.
    let hex = digest("order-2");
    let elsewhere = run(&["resolve", "refunds.v1", "--digest", &hex, "--not-applied"]);
    assert!(elsewhere
        .expect(1, "another namespace")
        .stderr
        .contains("Nothing was changed"));
    let json = run(&["--json", "resolve", "--digest", &hex, "--not-applied"]);
    assert_eq!(
        json.expect(0, "resolve --not-applied").json()["resolved"],
        "not-applied"
    );
    let rerun = retry(app, name, "order-2", &runs).await.unwrap();
    assert!(!rerun.is_replayed());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // Applied without --value stores null: a u32 function gets a codec error, never a panic.
    run(&["resolve", name, "order-3", "--applied"]).expect(0, "resolve --applied, no value");
    let bad = retry(app, name, "order-3", &runs).await;
    assert!(matches!(bad, Err(idem::Error::Codec(_))), "{bad:?}");

    // A key that is not parked is refused with its state, and nothing changes.
    for (key, code, state) in [
        ("done", 3, "completed"),
        ("order-1", 3, "completed"),
        ("running", 3, "in progress"),
        ("never-used", 1, "free"),
    ] {
        let refused = run(&["resolve", name, key, "--not-applied"]);
        let refused = refused.expect(code, key);
        assert!(refused.stderr.contains(state), "{key}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("Nothing was changed"),
            "{key}: {}",
            refused.stderr
        );
    }
    let still = retry(app, name, "order-1", &runs).await.unwrap();
    assert_eq!(
        (still.is_replayed(), still.into_inner()),
        (true, 4200),
        "a refused resolve changed nothing"
    );
    let busy = retry(app, name, "running", &runs).await;
    assert!(
        matches!(busy, Err(idem::Error::InProgress { .. })),
        "{busy:?}"
    );

    // Usage: a verdict is required, --value goes with --applied and must be JSON.
    run(&["resolve", name, "order-1"]).expect(2, "no verdict");
    run(&["resolve", name, "order-1", "--not-applied", "--value", "1"])
        .expect(2, "value, not applied");
    run(&["resolve", name, "order-1", "--applied", "--value", "{nope"]).expect(2, "bad JSON");
    run(&["resolve", name, "order-1", "--applied", "--not-applied"]).expect(2, "both verdicts");

    let none = run(&["pending", name]).expect(0, "pending at the end");
    assert_eq!(none.stdout, "no parked keys\n");
}
