//! What the model checks: the properties (a)–(j) and what each configuration must reach.

use super::{digest, Outcome, Phase, ProtocolModel, State};
use idem_runtime::store::Status;
use stateright::Property;

/// Every property of `m`'s configuration.
pub(super) fn all(m: &ProtocolModel) -> Vec<Property<ProtocolModel>> {
    let mut properties = vec![
        Property::always(
            "(a) a completion is stored only by the holder of the current token",
            |_, s: &State| !s.flags.foreign_completion,
        ),
        Property::always(
            "(b) while a completed record is live every call replays its value",
            |m, s: &State| !s.flags.replay_differs && live_results_match(m, s),
        ),
        Property::always(
            "(c) two bodies of one key never both complete",
            |_, s: &State| !s.flags.double_completion,
        ),
        Property::always(
            "(d) no key stays in progress past its lease once its holder is gone",
            no_orphan_outlives_its_lease,
        ),
        Property::always("(e) a mismatch never runs a body", |_, s: &State| {
            !s.flags.mismatch_ran
        }),
        // Fencing rests on it: a token handed out twice lets the first holder renew,
        // complete or release the second one's claim.
        Property::always(
            "(f) a key never hands out the same token twice",
            |_, s: &State| !s.flags.token_reused,
        ),
        Property::always(
            "(h) a takeover follows only an abandoned attempt, never a released one",
            |_, s: &State| !s.flags.released_taken_over,
        ),
        Property::always(
            "(i) a parked key runs no body and no reconcile until it is resolved",
            |_, s: &State| !s.flags.parked_ran,
        ),
        Property::always("(j) a resolve changes only a parked key", |_, s: &State| {
            !s.flags.resolved_unparked
        }),
    ];
    if m.effects {
        properties.extend(m.abandoned_properties());
    } else {
        properties.extend(standard_reachability());
    }
    properties
}

/// What the standard configuration must reach: without these the properties could hold
/// vacuously.
fn standard_reachability() -> Vec<Property<ProtocolModel>> {
    vec![
        // Reachability: without these the properties above could hold vacuously.
        Property::sometimes("a result is stored and replayed", |_, s: &State| {
            s.clients
                .iter()
                .any(|c| c.phase == Phase::Done(Outcome::Stored))
                && s.clients
                    .iter()
                    .any(|c| c.phase == Phase::Done(Outcome::Replayed))
        }),
        Property::sometimes(
            "a stalled attempt is taken over and fenced",
            |_, s: &State| {
                s.clients
                    .iter()
                    .any(|c| c.phase == Phase::Done(Outcome::LeaseLost))
            },
        ),
        Property::sometimes("a mismatch is refused", |_, s: &State| {
            s.clients
                .iter()
                .any(|c| c.phase == Phase::Done(Outcome::Mismatch))
        }),
        Property::sometimes("a key runs again after its TTL", |_, s: &State| {
            s.clients
                .iter()
                .filter(|c| c.phase == Phase::Done(Outcome::Stored))
                .count()
                >= 2
        }),
    ]
}

/// (b), on the store: a live completed record holds the value of the key's live result.
fn live_results_match(m: &ProtocolModel, s: &State) -> bool {
    (0..m.keys).all(|k| {
        let Some(r) = s.store.get(&digest(k), s.now) else {
            return true;
        };
        if r.status != Status::Completed {
            return true;
        }
        match s.keys[k as usize].completion {
            Some((_, v, _)) => r.value.as_deref() == Some(&[v][..]),
            None => false,
        }
    })
}

/// (d): an in-progress record whose holder has crashed or returned is live at most one lease
/// past that moment.
fn no_orphan_outlives_its_lease(m: &ProtocolModel, s: &State) -> bool {
    (0..m.keys).all(|k| {
        let Some(r) = s.store.get(&digest(k), s.now) else {
            return true;
        };
        if r.status != Status::InProgress {
            return true;
        }
        let holder = match s.keys[k as usize].holder {
            Some((token, c)) if token == r.token => c,
            _ => return true,
        };
        match s.clients[holder as usize].gone_at {
            Some(gone) => r.expires_at <= gone + m.lease,
            None => true,
        }
    })
}
