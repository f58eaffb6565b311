//! Abandoned attempts in the model: the takeover's choice (rerun, reconcile, park), the effect
//! at a fenced gateway, the operator's resolve, and what they guarantee and reach.

use super::{digest, ClientSpec, Outcome, Phase, ProtocolModel, State};
use crate::Bug;
use idem_runtime::store::{Resolved, Takeover};
use stateright::Property;

/// What a claim that took over an abandoned attempt does (the function's options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OnTakeover {
    /// `on_abandoned = rerun`: the body runs again.
    Rerun,
    /// `reconcile = …`: look the effect up at the gateway by the key; store it if it happened,
    /// run the body if not, leave the key abandoned if the gateway does not answer.
    Reconcile,
    /// `on_abandoned = park`: nothing runs until an operator resolves the key.
    Park,
}

impl ProtocolModel {
    /// The configuration of abandoned attempts CI checks for each choice: three clients with
    /// the same arguments on one key, one call each, a lease of 1 tick, results kept past the horizon (so a
    /// second effect is never a legitimate run after the TTL), effects at a fenced gateway, and
    /// (under `park`) an operator who resolves.
    pub fn abandoned(on_abandoned: OnTakeover, bug: Option<Bug>) -> ProtocolModel {
        let same = ClientSpec {
            key: 0,
            fingerprint: 0,
        };
        ProtocolModel {
            clients: vec![same; 3],
            keys: 1,
            lease: 1,
            ttl: 10,
            horizon: 3,
            calls: 1,
            complete_retries: 0,
            operator: false,
            bug,
            on_abandoned,
            effects: true,
            resolver: on_abandoned == OnTakeover::Park,
        }
    }

    /// Where a claim that won the key goes: its body, or (taking over an abandoned attempt)
    /// the function's choice.
    pub(super) fn run_phase(&self, token: u64, takeover: Option<Takeover>) -> Phase {
        match (takeover, self.on_abandoned) {
            (Some(_), OnTakeover::Reconcile) => Phase::Reconciling { token },
            (Some(_), OnTakeover::Park) => Phase::Parking { token },
            _ => Phase::Running {
                token,
                lost: false,
                effected: !self.effects,
            },
        }
    }

    /// A client's body makes its effect at the gateway, which refuses a stale token.
    pub(super) fn effect(&self, s: &mut State, c: u8) -> Option<()> {
        let Phase::Running { token, lost, .. } = s.clients[c as usize].phase else {
            return None;
        };
        let value = self.value_of(s, c);
        let ghost = &mut s.keys[self.clients[c as usize].key as usize];
        if token < ghost.fence {
            // The gateway refuses a stale token: the body fails, and its release
            // is refused in turn (the key is no longer its).
            s.clients[c as usize].phase = Phase::Releasing { token };
        } else {
            ghost.fence = token;
            ghost.effects += 1;
            if ghost.effects > 1 {
                if self.on_abandoned == OnTakeover::Rerun {
                    s.flags.doubled = true;
                } else {
                    s.flags.double_effect = true;
                }
            }
            ghost.effect.get_or_insert(value);
            s.clients[c as usize].phase = Phase::Running {
                token,
                lost,
                effected: true,
            };
        }
        Some(())
    }

    /// A client's reconcile: the gateway answered (or not), passing the takeover's token.
    pub(super) fn reconcile(&self, s: &mut State, c: u8, answered: bool) -> Option<()> {
        let now = s.now;
        let Phase::Reconciling { token } = s.clients[c as usize].phase else {
            return None;
        };
        let key = self.key_of(c);
        let ki = self.clients[c as usize].key as usize;
        if s.keys[ki].parked {
            s.flags.parked_ran = true;
        }
        if !answered {
            // Undecided: the key is left abandoned for the next call to reconcile.
            s.store.abandon(&key, token, now);
            self.next_call(&mut s.clients[c as usize], now, Outcome::Undecided);
            return Some(());
        }
        // The look-up passes the attempt's token: from now on the gateway refuses the
        // abandoned attempt, were it only frozen and to wake up.
        let ghost = &mut s.keys[ki];
        if self.bug != Some(Bug::LookupWithoutToken) {
            ghost.fence = ghost.fence.max(token);
        }
        match ghost.effect {
            Some(value) => {
                let fenced = self.bug != Some(Bug::UnfencedReconcile);
                let stored = self.store_result(s, c, token, value, false, fenced);
                if stored {
                    s.flags.adopted = true;
                }
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Done(if stored {
                    Outcome::Stored
                } else {
                    Outcome::LeaseLost
                });
                cl.gone_at = Some(now);
            }
            None => {
                s.clients[c as usize].phase = Phase::Running {
                    token,
                    lost: false,
                    effected: false,
                }
            }
        }
        Some(())
    }

    /// A client parks the key it took over.
    pub(super) fn park(&self, s: &mut State, c: u8) -> Option<()> {
        let now = s.now;
        let Phase::Parking { token } = s.clients[c as usize].phase else {
            return None;
        };
        let ki = self.clients[c as usize].key as usize;
        if s.store.park(&self.key_of(c), token, now) {
            s.keys[ki].parked = true;
            self.next_call(&mut s.clients[c as usize], now, Outcome::OutcomeUnknown);
        } else {
            let cl = &mut s.clients[c as usize];
            cl.phase = Phase::Done(Outcome::LeaseLost);
            cl.gone_at = Some(now);
        }
        Some(())
    }

    /// The operator's verdict on a key, from what the gateway holds.
    pub(super) fn resolve(&self, s: &mut State, k: u8) -> Option<()> {
        let now = s.now;
        let key = digest(k);
        let parked_token = s.store.get(&key, now).map(|r| r.token).unwrap_or(0);
        let ghost = &mut s.keys[k as usize];
        ghost.resolves += 1;
        // The operator looks the effect up at the gateway with the parked record's
        // token, as a reconcile does: a frozen holder cannot make it afterwards.
        ghost.fence = ghost.fence.max(parked_token);
        let effect = ghost.effect;
        let was_parked = ghost.parked;
        let applied = effect.map(|v| ([v], self.ttl));
        let resolved = s
            .store
            .resolve(&key, applied.as_ref().map(|(v, t)| (&v[..], *t)), now);
        if let Resolved::Done(_) = resolved {
            if !was_parked {
                s.flags.resolved_unparked = true;
            }
            let ghost = &mut s.keys[k as usize];
            ghost.parked = false;
            s.flags.resolved = true;
            match effect {
                // The operator's verdict is the key's result from now on.
                Some(v) => ghost.completion = Some((u8::MAX, v, now + self.ttl)),
                None => ghost.released = true,
            }
        }
        Some(())
    }

    /// The properties of abandoned attempts (with effects at the gateway): what each choice
    /// guarantees, and what it reaches.
    pub(super) fn abandoned_properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![Property::sometimes("a result is stored", |_, s: &State| {
            s.clients
                .iter()
                .any(|c| c.phase == Phase::Done(Outcome::Stored))
        })];
        match self.on_abandoned {
            OnTakeover::Rerun => properties.push(Property::sometimes(
                "rerun: a key's effect happens twice (the crash window)",
                |_, s: &State| s.flags.doubled,
            )),
            OnTakeover::Reconcile => {
                properties.push(Property::always(
                    "(g) with a reconcile, a key's effect never happens twice",
                    |_, s: &State| !s.flags.double_effect,
                ));
                properties.push(Property::sometimes(
                    "a reconcile finds the effect and stores it",
                    |_, s: &State| s.flags.adopted,
                ));
                properties.push(Property::sometimes(
                    "a reconcile finds no effect and the body runs",
                    |_, s: &State| {
                        s.keys.iter().any(|k| k.effects == 1)
                            && s.keys.iter().any(|k| k.issued.len() >= 2)
                            && s.clients
                                .iter()
                                .any(|c| c.phase == Phase::Done(Outcome::Stored))
                            && !s.flags.adopted
                    },
                ));
            }
            OnTakeover::Park => {
                properties.push(Property::always(
                    "(g) with park, a key's effect never happens twice",
                    |_, s: &State| !s.flags.double_effect,
                ));
                properties.push(Property::sometimes(
                    "a key is parked and resolved",
                    |_, s: &State| s.flags.resolved,
                ));
                properties.push(Property::sometimes(
                    "a parked key answers outcome unknown",
                    |_, s: &State| {
                        s.clients
                            .iter()
                            .any(|c| c.phase == Phase::Done(Outcome::OutcomeUnknown))
                    },
                ));
            }
        }
        properties
    }
}
