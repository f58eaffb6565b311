//! The protocol, model-checked: every interleaving of three clients on one key, a clock that
//! advances at will, stalls, crashes, retries and lost answers, up to the model's horizon.
//!
//! `IDEM_MODEL_BUG=<name>` plants one of the bugs of `idem_proof::Bug`: the run then fails
//! with a counterexample trace.

use idem_proof::{Bug, OnTakeover, ProtocolModel};
use stateright::{Checker, HasDiscoveries, Model};
use std::time::Instant;

#[test]
fn protocol_model() {
    let bug = Bug::from_env().unwrap_or_else(|name| {
        panic!(
            "IDEM_MODEL_BUG={name} names no planted bug; known: {:?}",
            Bug::ALL.map(Bug::name)
        )
    });
    let mut model = match bug {
        Some(b) if b.of_abandoned_attempts() => {
            let on = match b {
                Bug::ParkedRunsBody | Bug::ResolveOverwritesCompleted => OnTakeover::Park,
                _ => OnTakeover::Reconcile,
            };
            ProtocolModel::abandoned(on, bug)
        }
        _ => ProtocolModel::standard(bug),
    };
    if let Some(h) = std::env::var("IDEM_MODEL_HORIZON")
        .ok()
        .and_then(|h| h.parse().ok())
    {
        model.horizon = h;
    }
    if std::env::var("IDEM_MODEL_OPERATOR").as_deref() == Ok("1") {
        model.operator = true;
    }
    check(model, bug, 100_000);
}

/// Abandoned attempts under `on_abandoned = rerun`: the model reaches a key whose effect
/// happened twice (the crash window, which a rerun does not close), and breaks nothing else.
#[test]
fn abandoned_rerun() {
    check(
        ProtocolModel::abandoned(OnTakeover::Rerun, None),
        None,
        1_000,
    );
}

/// With a reconcile that looks the effect up at the gateway (passing its token): never two
/// effects for one key; a takeover finds the effect and stores it, or finds none and runs.
#[test]
fn abandoned_reconcile() {
    check(
        ProtocolModel::abandoned(OnTakeover::Reconcile, None),
        None,
        1_000,
    );
}

/// With `park` and an operator who resolves from the gateway: never two effects; a parked key
/// runs nothing until resolved; a stale second verdict changes nothing.
#[test]
fn abandoned_park() {
    check(
        ProtocolModel::abandoned(OnTakeover::Park, None),
        None,
        1_000,
    );
}

/// Checks every state of `model`: no violation, every reachability property reached, at
/// least `min_states` states.
fn check(model: ProtocolModel, bug: Option<Bug>, min_states: usize) {
    let properties = model.properties();
    let (model_on_abandoned, model_effects) = (model.on_abandoned, model.effects);
    let started = Instant::now();
    let mut builder = model.checker().threads(2);
    if bug.is_some() {
        // A planted bug only has to show its counterexample.
        builder = builder.finish_when(HasDiscoveries::AnyFailures);
    }
    let checker = builder.spawn_bfs().join();
    let states = checker.unique_state_count();
    let mut violations = 0;
    let mut unreached = Vec::new();
    for p in &properties {
        match (
            p.expectation.discovery_is_failure(),
            checker.discovery(p.name),
        ) {
            (true, Some(path)) => {
                violations += 1;
                eprintln!(
                    "violated: {}\ncounterexample {path}last state: {:#?}\n",
                    p.name,
                    path.last_state()
                );
            }
            (false, None) => unreached.push(p.name),
            _ => {}
        }
    }
    println!(
        "protocol model ({:?}{}): {states} states, {violations} violations ({:.1} s{})",
        model_on_abandoned,
        if model_effects { ", effects" } else { "" },
        started.elapsed().as_secs_f64(),
        bug.map(|b| format!(", planted bug {}", b.name()))
            .unwrap_or_default()
    );
    assert_eq!(
        violations, 0,
        "the protocol model found violations (traces above)"
    );
    assert!(
        checker.is_done(),
        "the search stopped before it covered every state"
    );
    assert!(
        unreached.is_empty(),
        "never reached, so the model could hold vacuously: {unreached:?}"
    );
    assert!(
        states >= min_states,
        "the model explored only {states} states"
    );
}
