//! Abandoned attempts at the call level: what a call that takes one over does — rerun, park,
//! reconcile (applied, not applied, undecided) — and an operator's resolve of a parked key.
//! An attempt is abandoned here as a crashed process abandons it: its future is dropped
//! mid-body, after its claim, and its lease lapses.

use super::*;
use crate::{recovery, OnAbandoned, Resolution};

/// A lease short enough to lapse within a test yet long enough for a slow store's steps on a
/// loaded machine (DynamoDB Local, CI), and a wait that outlasts it there.
const LEASE: Duration = Duration::from_millis(1000);
const LAPSE: Duration = Duration::from_millis(2500);

/// Claims `key` in `name` and dies mid-body (the future dropped after its claim), then waits
/// until its lease has lapsed: the key is abandoned.
async fn abandon(idem: &Idem, name: &str, key: &str) {
    let started = Arc::new(tokio::sync::Notify::new());
    let call = idem.call(name.to_string()).key(key).lease(LEASE).run({
        let started = started.clone();
        async move {
            started.notify_one();
            std::future::pending::<Result<Receipt, Failure>>().await
        }
    });
    tokio::select! {
        _ = call => unreachable!("the body never returns"),
        _ = started.notified() => {}
    }
    tokio::time::sleep(LAPSE).await;
}

/// The call on key `k` of `name`, with the short lease.
fn call(idem: &Idem, name: &str) -> Call {
    idem.call(name.to_string()).key("k").lease(LEASE)
}

/// A body that records the attempt it sees (`recovery()`), counts and returns a receipt.
fn body(
    counter: &Counter,
    seen: &Arc<std::sync::Mutex<Vec<Option<u32>>>>,
) -> impl std::future::Future<Output = Result<Receipt, Failure>> {
    let (counter, seen) = (counter.clone(), seen.clone());
    async move {
        seen.lock().unwrap().push(recovery().map(|r| r.attempt()));
        let id = counter.hit() as u64;
        Ok(Receipt {
            id,
            memo: format!("charged {id}"),
        })
    }
}

/// By default a takeover runs the body again, and the body knows: `recovery()` is `Some` with
/// the attempt number (2, then 3 after a second abandonment), `None` on a first attempt.
pub async fn takeover_reruns_by_default_and_says_so(idem: Idem) {
    let name = unique("rerun");
    let (counter, seen) = (
        Counter::default(),
        Arc::new(std::sync::Mutex::new(Vec::new())),
    );
    abandon(&idem, &name, "k").await;
    let first = call(&idem, &name).run(body(&counter, &seen)).await.unwrap();
    assert!(!first.is_replayed());
    assert_eq!(*seen.lock().unwrap(), vec![Some(2)]);
    // A replay afterwards: the body does not run again.
    let again = call(&idem, &name).run(body(&counter, &seen)).await.unwrap();
    assert!(again.is_replayed());
    assert_eq!(counter.get(), 1);

    // Abandoned twice: the second takeover is attempt 3.
    let twice = unique("rerun-twice");
    abandon(&idem, &twice, "k").await;
    abandon(&idem, &twice, "k").await;
    seen.lock().unwrap().clear();
    call(&idem, &twice)
        .run(body(&counter, &seen))
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![Some(3)]);

    // A first attempt has no recovery.
    seen.lock().unwrap().clear();
    let fresh = unique("rerun-fresh");
    call(&idem, &fresh)
        .run(body(&counter, &seen))
        .await
        .unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![None]);
}

/// `on_abandoned = park`: the takeover runs nothing, and this and every later call get
/// `OutcomeUnknown` until an operator resolves the key. Applied: callers get the operator's
/// value as a replay; not applied: the next call runs the body, as a first attempt.
pub async fn parked_key_answers_outcome_unknown_until_resolved(idem: Idem) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    for applied in [true, false] {
        let counter = Counter::default();
        let name = unique(if applied { "park-applied" } else { "park-not" });
        abandon(&idem, &name, "k").await;
        for _ in 0..2 {
            let parked = call(&idem, &name)
                .on_abandoned(OnAbandoned::Park)
                .run(body(&counter, &seen))
                .await;
            assert!(
                matches!(parked, Err(Failure::Idem(Error::OutcomeUnknown { .. }))),
                "{parked:?}"
            );
        }
        // A caller without `park` finds the key parked too: it is the key's state.
        let other = call(&idem, &name).run(body(&counter, &seen)).await;
        assert!(
            matches!(other, Err(Failure::Idem(Error::OutcomeUnknown { .. }))),
            "{other:?}"
        );
        assert_eq!(counter.get(), 0, "a parked key runs no body");
        let verdict = if applied {
            Resolution::Applied(Receipt {
                id: 77,
                memo: "found at the gateway".into(),
            })
        } else {
            Resolution::NotApplied
        };
        idem.resolve(&name, "k", verdict).await.unwrap();
        let after = call(&idem, &name)
            .on_abandoned(OnAbandoned::Park)
            .run(body(&counter, &seen))
            .await
            .unwrap();
        if applied {
            assert!(after.is_replayed());
            assert_eq!(after.into_inner().id, 77);
            assert_eq!(counter.get(), 0);
        } else {
            assert!(!after.is_replayed());
            assert_eq!(counter.get(), 1);
            assert_eq!(seen.lock().unwrap().pop(), Some(None), "a fresh attempt");
        }
    }
}

/// A resolve of a key that is not parked is refused with its state, and changes nothing.
pub async fn resolve_refuses_a_key_that_is_not_parked(idem: Idem) {
    let name = unique("resolve-refused");
    let refused = idem
        .resolve(&name, "k", Resolution::<u8>::NotApplied)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("free"), "{refused}");
    idem.call(name.clone())
        .key("k")
        .run(async { Ok::<_, Failure>(5u8) })
        .await
        .unwrap();
    let refused = idem
        .resolve(&name, "k", Resolution::Applied(6u8))
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("completed"), "{refused}");
    let replayed = idem
        .call(name)
        .key("k")
        .run(async { Ok::<_, Failure>(9u8) })
        .await
        .unwrap();
    assert_eq!(replayed, Outcome::Replayed(5));
}

/// A value resolved as another type than the function's is a codec error on the next call,
/// never a panic, and the body does not run.
pub async fn a_resolved_value_of_another_type_is_a_codec_error(idem: Idem) {
    let name = unique("resolve-type");
    abandon(&idem, &name, "k").await;
    let parked = idem
        .call(name.clone())
        .key("k")
        .on_abandoned(OnAbandoned::Park)
        .run(async { Ok::<_, Failure>(1u8) })
        .await;
    assert!(matches!(
        parked,
        Err(Failure::Idem(Error::OutcomeUnknown { .. }))
    ));
    idem.resolve(&name, "k", Resolution::Applied("not a receipt"))
        .await
        .unwrap();
    let counter = Counter::default();
    let next = charge(&idem, &name, "k", &counter).await;
    assert!(
        matches!(next, Err(Failure::Idem(Error::Codec(_)))),
        "{next:?}"
    );
    assert_eq!(counter.get(), 0);
}

/// A reconcile runs only on a takeover. `Ok(Some(v))`: `v` is this call's result, stored and
/// replayed, and the body does not run; `Ok(None)`: the body runs; `Err(e)`: `e` is returned
/// and the key stays abandoned, so the next call reconciles again, one attempt later.
pub async fn reconcile_decides_a_takeover(idem: Idem) {
    let counter = Counter::default();
    let reconciles = Counter::default();
    let reconciled = |answer: Result<Option<Receipt>, Failure>| {
        let reconciles = reconciles.clone();
        move || async move {
            assert!(crate::current_key().is_some(), "inside the call");
            reconciles.hit();
            answer
        }
    };
    let run = |name: &str, answer: Result<Option<Receipt>, Failure>| {
        let counter = counter.clone();
        idem.call(name.to_string())
            .key("k")
            .lease(LEASE)
            .reconcile(reconciled(answer))
            .run(async move {
                let id = counter.hit() as u64;
                Ok::<_, Failure>(Receipt {
                    id,
                    memo: "charged".into(),
                })
            })
    };
    let found = || {
        Ok(Some(Receipt {
            id: 41,
            memo: "found".into(),
        }))
    };

    // A first attempt: no reconcile.
    let first = unique("reconcile-first");
    run(&first, found()).await.unwrap();
    assert_eq!((reconciles.get(), counter.get()), (0, 1));

    // Applied: the reconcile's value, stored; the body does not run.
    let applied = unique("reconcile-applied");
    abandon(&idem, &applied, "k").await;
    let out = run(&applied, found()).await.unwrap();
    assert_eq!(out, Outcome::Fresh(found().unwrap().unwrap()));
    let again = run(&applied, Ok(None)).await.unwrap();
    assert_eq!(again, Outcome::Replayed(found().unwrap().unwrap()));
    assert_eq!((reconciles.get(), counter.get()), (1, 1));

    // Not applied: the body runs.
    let not = unique("reconcile-not");
    abandon(&idem, &not, "k").await;
    let out = run(&not, Ok(None)).await.unwrap();
    assert!(!out.is_replayed());
    assert_eq!((reconciles.get(), counter.get()), (2, 2));

    // Undecided: the error, the key left abandoned; the next call reconciles again.
    let undecided = unique("reconcile-undecided");
    abandon(&idem, &undecided, "k").await;
    let out = run(
        &undecided,
        Err(Failure::Body(TestError::Declined("gateway down".into()))),
    )
    .await;
    assert!(matches!(out, Err(Failure::Body(_))), "{out:?}");
    let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = idem
        .call(undecided.clone())
        .key("k")
        .lease(LEASE)
        .reconcile({
            let attempts = attempts.clone();
            move || async move {
                attempts
                    .lock()
                    .unwrap()
                    .push(recovery().map(|r| r.attempt()));
                Ok::<Option<Receipt>, Failure>(None)
            }
        })
        .run(async {
            Ok(Receipt {
                id: 9,
                memo: "ran".into(),
            })
        })
        .await
        .unwrap();
    assert_eq!(out.into_inner().id, 9);
    assert_eq!(*attempts.lock().unwrap(), vec![Some(3)]);
}

/// A released key (an `Err` under the release policy) is not abandoned: the next call is a
/// first attempt, and neither reconciles nor parks.
pub async fn a_released_key_is_not_taken_over(idem: Idem) {
    let name = unique("released-not-abandoned");
    let failed = idem
        .call(name.clone())
        .key("k")
        .run(async { Err::<u8, _>(Failure::Body(TestError::Declined("no".into()))) })
        .await;
    assert!(matches!(failed, Err(Failure::Body(_))));
    let parked_or_ran = idem
        .call(name)
        .key("k")
        .on_abandoned(OnAbandoned::Park)
        .run(async { Ok::<_, Failure>(recovery().map(|r| r.attempt())) })
        .await
        .unwrap();
    assert_eq!(parked_or_ran, Outcome::Fresh(None));
}
