//! Steps: a retry replays the finished steps of its parent call and runs the rest.

use super::*;

async fn checkout(
    idem: &Idem,
    name: &str,
    effects: &[Counter; 3],
    fail_third: bool,
) -> Result<u8, Failure> {
    let effects = effects.clone();
    idem.call(name.to_string())
        .key("order-1")
        .lease(Duration::from_secs(5))
        .run(async move {
            crate::step("reserve", || async { Ok::<_, Failure>(effects[0].hit()) }).await?;
            crate::step("charge", || async { Ok::<_, Failure>(effects[1].hit()) }).await?;
            crate::step("receipt", || async {
                effects[2].hit();
                if fail_third {
                    Err(Failure::Body(TestError::Declined(
                        "mail server down".into(),
                    )))
                } else {
                    Ok(())
                }
            })
            .await?;
            Ok(3u8)
        })
        .await
        .map(Outcome::into_inner)
}

/// A three-step body whose third step fails once: on the retry the first two steps
/// replay (their effects happened once) and the third runs again.
pub async fn steps_replay_finished_and_rerun_failed(idem: Idem) {
    let name = unique("checkout");
    let effects: [Counter; 3] = Default::default();
    assert!(matches!(
        checkout(&idem, &name, &effects, true).await,
        Err(Failure::Body(_))
    ));
    assert_eq!(checkout(&idem, &name, &effects, false).await.unwrap(), 3);
    assert_eq!(checkout(&idem, &name, &effects, false).await.unwrap(), 3);
    let counts: Vec<usize> = effects.iter().map(Counter::get).collect();
    assert_eq!(
        counts,
        vec![1, 1, 2],
        "reserve once, charge once, receipt failed then sent once"
    );
}

/// The future dropped between two steps: after the parent's lease, the retry replays the
/// finished step and runs the rest.
pub async fn steps_survive_a_crash_between_steps(idem: Idem) {
    let name = unique("crash");
    let effects: [Counter; 2] = Default::default();
    let lease = Duration::from_millis(300);
    // The first attempt is dropped once step one has stored its result, whatever the machine's
    // load: a fixed timeout could cut it inside step one, whose own lease is 30 s.
    let between = std::sync::Arc::new(tokio::sync::Notify::new());
    let attempt = |hang: bool| {
        let (effects, between) = (effects.clone(), between.clone());
        idem.call(name.clone())
            .key("k")
            .lease(lease)
            .run(async move {
                crate::step("one", || async { Ok::<_, Failure>(effects[0].hit()) }).await?;
                if hang {
                    between.notify_one();
                    std::future::pending::<()>().await;
                }
                crate::step("two", || async { Ok::<_, Failure>(effects[1].hit()) }).await?;
                Ok::<_, Failure>(())
            })
    };
    tokio::select! {
        r = attempt(true) => panic!("the hanging attempt returned: {r:?}"),
        _ = between.notified() => {}
    }
    tokio::time::sleep(lease + Duration::from_millis(150)).await;
    assert_eq!(attempt(false).await.unwrap(), Outcome::Fresh(()));
    assert_eq!((effects[0].get(), effects[1].get()), (1, 1));
}

/// Steps nest three deep; a step called twice with one key runs once; a nested call that is
/// not a step keeps its own global key.
pub async fn steps_nest_and_dedupe(idem: Idem) {
    let name = unique("nest");
    let global = unique("global-receipt");
    let c: [Counter; 4] = Default::default();
    let run = |order: &'static str| {
        let (c, idem2, global) = (c.clone(), idem.clone(), global.clone());
        idem.call(name.clone()).key(order).run(async move {
            let depth3 = crate::step("outer", || async {
                c[0].hit();
                crate::step("middle", || async {
                    c[1].hit();
                    crate::step("inner", || async { Ok::<_, Failure>(c[2].hit()) }).await
                })
                .await
            })
            .await?;
            let again = crate::step("outer", || async { Ok::<_, Failure>(99) }).await?;
            assert_eq!(again, depth3, "the same step key inside one body replays");
            // Not a step: deduplicated across every caller by its own key.
            let c3 = c[3].clone();
            idem2
                .call(global)
                .key("receipt-for-customer-9")
                .run(async move { Ok::<_, Failure>(c3.hit()) })
                .await?;
            Ok::<_, Failure>(depth3)
        })
    };
    assert_eq!(run("order-1").await.unwrap().into_inner(), 1);
    assert_eq!(run("order-2").await.unwrap().into_inner(), 2);
    let counts: Vec<usize> = c.iter().map(Counter::get).collect();
    assert_eq!(
        counts,
        vec![2, 2, 2, 1],
        "steps per parent; the global call once overall"
    );
}

/// A parent whose retry calls a step with other arguments than the first attempt gets
/// `Mismatch` for that step, not a second side effect.
pub async fn step_with_other_arguments_is_a_mismatch(idem: Idem) {
    let name = unique("determinism");
    let c = Counter::default();
    let attempt = |amount: u32, fail: bool| {
        let c = c.clone();
        idem.call(name.clone()).key("k").run(async move {
            let c2 = c.clone();
            Call::installed("charge")
                .step()
                .key("charge")
                .fingerprint(&amount)
                .run(async move { Ok::<_, Failure>(c2.hit()) })
                .await?;
            if fail {
                return Err(Failure::Body(TestError::Declined("later failure".into())));
            }
            Ok(())
        })
    };
    assert!(matches!(attempt(100, true).await, Err(Failure::Body(_))));
    assert!(matches!(
        attempt(200, false).await,
        Err(Failure::Idem(Error::Mismatch { .. }))
    ));
    assert_eq!(c.get(), 1);
}
