//! The protocol, model-checked: every interleaving of three clients on one key, a clock that
//! advances at will, stalls, crashes, retries and lost answers, up to the model's horizon.
//!
//! `IDEM_MODEL_BUG=<name>` plants one of the bugs of `idem_proof::Bug`: the run then fails
//! with a counterexample trace.

use idem_proof::{Bug, ProtocolModel};
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
    let mut model = ProtocolModel::standard(bug);
    if let Some(h) = std::env::var("IDEM_MODEL_HORIZON")
        .ok()
        .and_then(|h| h.parse().ok())
    {
        model.horizon = h;
    }
    if std::env::var("IDEM_MODEL_OPERATOR").as_deref() == Ok("1") {
        model.operator = true;
    }
    let properties = model.properties();
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
        "protocol model: {states} states, {violations} violations ({:.1} s{})",
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
    assert!(states >= 100_000, "the model explored only {states} states");
}
