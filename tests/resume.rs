//! `#[idempotent(resume)]` and `Idem::resumer` on the memory store: a call whose future was
//! dropped mid-body (its process "died") is finished by a resumer with its stored arguments,
//! once; failures use the retry budget; stored arguments that no longer decode park the key.

use idem::store::{Claim, ClaimOutcome, Status};
use idem::{idempotent, Idem};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

#[derive(Debug, Serialize, Deserialize, PartialEq, Clone)]
enum AppError {
    Idem(String),
    Declined,
}

impl From<idem::Error> for AppError {
    fn from(e: idem::Error) -> Self {
        AppError::Idem(e.to_string())
    }
}

static STORE: LazyLock<Idem> = LazyLock::new(Idem::memory);

/// What the functions did, and whether the next attempt hangs (its caller then drops it).
#[derive(Clone, Default)]
struct Effects {
    done: Arc<Mutex<Vec<String>>>,
    hang: Arc<AtomicBool>,
    fail: Arc<AtomicBool>,
    steps: Arc<AtomicUsize>,
}

impl Effects {
    fn hanging() -> Effects {
        let e = Effects::default();
        e.hang.store(true, Ordering::SeqCst);
        e
    }

    async fn maybe_hang(&self) {
        if self.hang.swap(false, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    fn done(&self) -> Vec<String> {
        self.done.lock().unwrap().clone()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Order {
    id: u64,
    items: Vec<String>,
}

#[idempotent(resume, store = *STORE, skip(effects), lease = "200ms", name = "resume.ship")]
async fn ship(order: &Order, note: &str, effects: &Effects) -> Result<u64, AppError> {
    effects.maybe_hang().await;
    effects
        .done
        .lock()
        .unwrap()
        .push(format!("{}:{note}", order.id));
    Ok(order.id * 2)
}

#[idempotent(resume, store = *STORE, skip(effects), lease = "200ms", name = "resume.race")]
async fn race(id: u64, effects: &Effects) -> Result<u64, AppError> {
    effects.maybe_hang().await;
    effects.done.lock().unwrap().push(format!("{id}:race"));
    Ok(id)
}

#[idempotent(resume, store = *STORE, skip(effects), lease = "200ms", name = "resume.flaky")]
async fn flaky(id: u64, effects: Effects) -> Result<u64, AppError> {
    effects.maybe_hang().await;
    if effects.fail.load(Ordering::SeqCst) {
        return Err(AppError::Declined);
    }
    Ok(id)
}

#[idempotent(resume, store = *STORE, skip(effects), lease = "200ms", name = "resume.steps")]
async fn workflow(id: u64, effects: &Effects) -> Result<u64, AppError> {
    let reserved = idem::step("reserve", || async {
        effects.steps.fetch_add(1, Ordering::SeqCst);
        Ok::<_, AppError>(id + 1)
    })
    .await?;
    effects.maybe_hang().await;
    idem::step("charge", || async {
        effects
            .done
            .lock()
            .unwrap()
            .push(format!("charged {reserved}"));
        Ok::<_, AppError>(reserved)
    })
    .await
}

#[idempotent(resume, store = *STORE, lease = "200ms", name = "resume.decode")]
async fn typed(amount: u64) -> Result<u64, AppError> {
    Ok(amount)
}

/// Starts a call whose body hangs, and drops it: its claim lapses after the lease, abandoned.
async fn abandon<F: std::future::Future>(call: F) {
    assert!(tokio::time::timeout(Duration::from_millis(50), call)
        .await
        .is_err());
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn an_abandoned_call_is_finished_by_a_resumer_once() {
    let effects = Effects::hanging();
    let order = Order {
        id: 7,
        items: vec!["lamp".into()],
    };
    abandon(ship(&order, "fragile", &effects)).await;
    assert!(effects.done().is_empty());

    let resumer = STORE
        .resumer()
        .only(["resume.ship"])
        .provide(effects.clone());
    let pass = resumer.run_once().await.unwrap();
    assert_eq!((pass.found, pass.resumed), (1, 1), "{pass:?}");
    assert_eq!(effects.done(), vec!["7:fragile".to_string()]);

    // Nothing left to resume; the caller's retry replays the resumed result.
    assert_eq!(resumer.run_once().await.unwrap().found, 0);
    assert_eq!(ship(&order, "fragile", &effects).await, Ok(14));
    assert_eq!(effects.done().len(), 1);
}

#[tokio::test]
async fn a_skipped_type_not_provided_is_an_error_when_the_resumer_starts() {
    let e = STORE.resumer().only(["resume.ship"]).spawn().unwrap_err();
    let text = e.to_string();
    assert!(e.is_config(), "{e:?}");
    assert!(text.contains("ship") && text.contains("Effects"), "{text}");
    let e = STORE
        .resumer()
        .only(["resume.nope"])
        .run_once()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("resume.nope"), "{e}");
}

#[tokio::test]
async fn a_resumed_call_that_keeps_failing_is_parked_after_its_retries() {
    let effects = Effects::hanging();
    effects.fail.store(true, Ordering::SeqCst);
    abandon(flaky(11, effects.clone())).await;
    let resumer = STORE
        .resumer()
        .only(["resume.flaky"])
        .retries(2)
        .provide(effects.clone());
    let first = resumer.run_once().await.unwrap();
    assert_eq!((first.found, first.failed), (1, 1), "{first:?}");
    let second = resumer.run_once().await.unwrap();
    assert_eq!((second.found, second.parked), (1, 1), "{second:?}");
    assert_eq!(resumer.run_once().await.unwrap().found, 0);
    // Parked: callers get OutcomeUnknown until an operator resolves it.
    effects.fail.store(false, Ordering::SeqCst);
    match flaky(11, effects.clone()).await {
        Err(AppError::Idem(text)) => assert!(text.contains("outcome"), "{text}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_resumed_workflow_replays_its_finished_steps() {
    let effects = Effects::hanging();
    abandon(workflow(3, &effects)).await;
    assert_eq!(effects.steps.load(Ordering::SeqCst), 1);
    let pass = STORE
        .resumer()
        .only(["resume.steps"])
        .provide(effects.clone())
        .run_once()
        .await
        .unwrap();
    assert_eq!(pass.resumed, 1, "{pass:?}");
    assert_eq!(effects.steps.load(Ordering::SeqCst), 1, "reserve replayed");
    assert_eq!(effects.done(), vec!["charged 4".to_string()]);
}

#[tokio::test]
async fn stored_arguments_that_no_longer_decode_park_the_key() {
    // A call of an older deploy, whose argument was a string.
    let key = idem::key::Digest([0xd1; 32]);
    let store = STORE.store();
    let claim = Claim {
        name: "resume.decode",
        key: &key,
        fingerprint: &key,
        lease: Duration::from_millis(1),
        ttl: Duration::from_secs(60),
    };
    let ClaimOutcome::Claimed { token, .. } = store.claim(claim).await.unwrap() else {
        panic!("a fresh key")
    };
    let mut args = vec![1u8, b'a'];
    args.extend_from_slice(br#"["forty-two"]"#);
    assert!(store.keep_args(&key, token, &args).await.unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let pass = STORE
        .resumer()
        .only(["resume.decode"])
        .run_once()
        .await
        .unwrap();
    assert_eq!((pass.found, pass.parked), (1, 1), "{pass:?}");
    assert_eq!(
        store.get(&key).await.unwrap().unwrap().status,
        Status::Parked
    );
    // `typed` itself still works for keys of this deploy.
    assert_eq!(typed(5).await, Ok(5));
}

#[tokio::test]
async fn two_resumers_racing_resume_each_call_once() {
    let effects = Effects::default();
    let calls = 40u64;
    for id in 0..calls {
        effects.hang.store(true, Ordering::SeqCst);
        assert!(
            tokio::time::timeout(Duration::from_millis(5), race(id, &effects))
                .await
                .is_err()
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resumer = || {
        STORE
            .resumer()
            .only(["resume.race"])
            .concurrency(8)
            .provide(effects.clone())
    };
    let (a, b) = (resumer(), resumer());
    let (a, b) = tokio::join!(a.run_once(), b.run_once());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.resumed + b.resumed, calls as usize, "{a:?} {b:?}");
    let mut done = effects.done();
    done.retain(|d| d.ends_with(":race"));
    done.sort();
    done.dedup();
    assert_eq!(done.len(), calls as usize);
    assert_eq!(
        effects
            .done()
            .iter()
            .filter(|d| d.ends_with(":race"))
            .count(),
        calls as usize
    );
}
