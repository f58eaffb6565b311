//! Each planted bug makes the model checker fail with a counterexample: the properties of
//! `protocol_model` are strong enough to catch the mistakes a store is most likely to make.

use idem_proof::{Bug, OnTakeover, ProtocolModel};
use stateright::{Checker, HasDiscoveries, Model};

/// Runs the standard model with `bug` planted until the first violation; returns the names of
/// the violated properties, having printed each counterexample.
fn violations(bug: Bug) -> Vec<&'static str> {
    let model = match bug {
        Bug::UnfencedReconcile | Bug::ReleasedAsAbandoned | Bug::LookupWithoutToken => {
            ProtocolModel::abandoned(OnTakeover::Reconcile, Some(bug))
        }
        Bug::ParkedRunsBody | Bug::ResolveOverwritesCompleted => {
            ProtocolModel::abandoned(OnTakeover::Park, Some(bug))
        }
        _ => {
            let mut model = ProtocolModel::standard(Some(bug));
            // A shorter horizon than the full run: each bug shows within four ticks.
            model.horizon = 4;
            model
        }
    };
    let properties = model.properties();
    let checker = model
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join();
    let mut names = Vec::new();
    for p in properties
        .iter()
        .filter(|p| p.expectation.discovery_is_failure())
    {
        if let Some(path) = checker.discovery(p.name) {
            println!("{}: violated {}\ncounterexample {path}", bug.name(), p.name);
            names.push(p.name);
        }
    }
    names
}

fn assert_caught(bug: Bug, property: &str) {
    let found = violations(bug);
    assert!(
        found.iter().any(|name| name.starts_with(property)),
        "planted bug {} was not caught by property {property}; violations: {found:?}",
        bug.name()
    );
}

#[test]
fn unfenced_complete_is_caught() {
    assert_caught(Bug::UnfencedComplete, "(a)");
}

#[test]
fn check_then_insert_is_caught() {
    assert_caught(Bug::CheckThenInsert, "(e)");
}

/// The takeover hands out the previous token again: (f) sees it at the claim, before the
/// stale holder's completion would break (a).
#[test]
fn token_not_bumped_on_takeover_is_caught() {
    assert_caught(Bug::TokenNotBumpedOnTakeover, "(f)");
}

#[test]
fn renew_after_takeover_is_caught() {
    assert_caught(Bug::RenewAfterTakeover, "(d)");
}

/// A release that deletes the record: a claim in the same tick gets the released token again.
#[test]
fn token_reuse_after_release_is_caught() {
    assert_caught(Bug::TokenReuseAfterRelease, "(f)");
}

/// A reconcile that lost its claim (its lease lapsed while it looked) stores what it found
/// over its successor's record.
#[test]
fn unfenced_reconcile_is_caught() {
    assert_caught(Bug::UnfencedReconcile, "(a)");
}

/// A key released after a failed body is taken for abandoned by the next claim.
#[test]
fn released_as_abandoned_is_caught() {
    assert_caught(Bug::ReleasedAsAbandoned, "(h)");
}

/// A claim that finds a parked key free runs the body on an outcome nobody knows.
#[test]
fn parked_runs_body_is_caught() {
    assert_caught(Bug::ParkedRunsBody, "(i)");
}

/// A second verdict (a stale listing) overwrites the completed result of the first one.
#[test]
fn resolve_overwrites_completed_is_caught() {
    assert_caught(Bug::ResolveOverwritesCompleted, "(j)");
}

/// A reconcile that does not pass its token downstream: a frozen holder that wakes after the
/// look-up found nothing makes its effect, and so does the takeover.
#[test]
fn lookup_without_token_is_caught() {
    assert_caught(Bug::LookupWithoutToken, "(g)");
}

#[test]
fn every_planted_bug_has_a_name() {
    for bug in Bug::ALL {
        assert_eq!(Bug::from_name(bug.name()), Some(bug));
    }
    assert_eq!(Bug::from_name("no_such_bug"), None);
}
