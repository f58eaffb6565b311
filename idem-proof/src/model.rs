//! The protocol as a `stateright` model: clients that call, run, renew, stall, crash, retry,
//! and complete or release; an operator; a purger; a logical clock that advances whenever it
//! likes. Every store step is one atomic step of [`ModelStore`].
//!
//! Abandoned attempts ([`ProtocolModel::abandoned`]): a body makes its effect at a gateway
//! (another service, which refuses a fencing token below the highest it has seen for the key),
//! then returns; a claim that takes over an abandoned attempt reruns the body, reconciles (looks
//! the effect up at the gateway, passing its token) or parks the key; an operator resolves a
//! parked key from what the gateway holds.
//!
//! Ghost state (what really happened, which no store sees) lets the properties say what must
//! never happen: who holds which token, which completion is the key's live result.

use crate::store::ModelStore;
use crate::Bug;
use idem_runtime::key::Digest;
use idem_runtime::protocol::{decide, decide_existing, is_live, may_forget, Decision};
use idem_runtime::store::{ClaimOutcome, Status};
use stateright::{Model, Property};

mod abandoned;
mod properties;
pub use abandoned::OnTakeover;

/// The namespace every modelled key lives in.
const NAME: &str = "model";

/// One client: which key it calls with which arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClientSpec {
    /// Index of its key.
    pub key: u8,
    /// Its arguments' fingerprint (clients with another fingerprint on one key mismatch).
    pub fingerprint: u8,
}

/// The model's parameters.
#[derive(Debug, Clone)]
pub struct ProtocolModel {
    /// The clients, each calling one key.
    pub clients: Vec<ClientSpec>,
    /// How many keys there are.
    pub keys: u8,
    /// The lease, in ticks.
    pub lease: i64,
    /// The TTL of a completed result, in ticks.
    pub ttl: i64,
    /// The clock stops here (the bound of the search).
    pub horizon: i64,
    /// How many calls each client makes at most (retries after `InProgress` or an `Err`).
    pub calls: u8,
    /// How many times the answer of a completion may be lost so that it is retried.
    pub complete_retries: u8,
    /// An operator who force-releases keys.
    pub operator: bool,
    /// The planted bug, if any.
    pub bug: Option<Bug>,
    /// What a claim that takes over an abandoned attempt does.
    pub on_abandoned: OnTakeover,
    /// Bodies make their effect at the gateway (a step of its own, before they return), and
    /// the effects are checked: with a reconcile or `park`, never two for one key.
    pub effects: bool,
    /// An operator who resolves parked keys from what the gateway holds (a stale listing may
    /// send a verdict twice).
    pub resolver: bool,
}

impl ProtocolModel {
    /// The configuration CI checks: three clients on one key (two with the same arguments, one
    /// with others) and one on a second key, a lease of 2 ticks and a TTL of 3.
    pub fn standard(bug: Option<Bug>) -> ProtocolModel {
        ProtocolModel {
            clients: vec![
                ClientSpec {
                    key: 0,
                    fingerprint: 0,
                },
                ClientSpec {
                    key: 0,
                    fingerprint: 0,
                },
                ClientSpec {
                    key: 0,
                    fingerprint: 1,
                },
            ],
            keys: 1,
            lease: 2,
            ttl: 3,
            horizon: 5,
            calls: 2,
            complete_retries: 1,
            operator: false,
            bug,
            on_abandoned: OnTakeover::Rerun,
            effects: false,
            resolver: false,
        }
    }
}

/// What a call ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Its body ran and its completion was stored.
    Stored,
    /// It replayed a stored result.
    Replayed,
    /// Its completion was refused: another attempt took the key over.
    LeaseLost,
    /// The key was claimed with other arguments.
    Mismatch,
    /// Another attempt was running and no retry was left.
    InProgress,
    /// Its body returned `Err`, the key was released and no retry was left.
    Failed,
    /// The key is parked and no retry was left.
    OutcomeUnknown,
    /// Its reconcile could not decide (the key left abandoned) and no retry was left.
    Undecided,
}

/// Where a client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Between calls.
    Idle,
    /// `check_then_insert` only: its claim read "free" and has not written yet.
    Read,
    /// Its body runs under the claim with this token; `lost` once a renewal was refused.
    Running {
        /// The claim's token.
        token: u64,
        /// A renewal was refused.
        lost: bool,
        /// It made its effect at the gateway (always true without [`ProtocolModel::effects`]).
        effected: bool,
    },
    /// It took over an abandoned attempt and reconciles under this token.
    Reconciling {
        /// The claim's token.
        token: u64,
    },
    /// It took over an abandoned attempt and parks the key under this token.
    Parking {
        /// The claim's token.
        token: u64,
    },
    /// Its body returned this value; the completion is being stored (`tries` answers lost).
    Completing {
        /// The claim's token.
        token: u64,
        /// The body's value.
        value: u8,
        /// How many answers of the completion were lost so far.
        tries: u8,
    },
    /// Its body returned `Err`; the release is being sent.
    Releasing {
        /// The claim's token.
        token: u64,
    },
    /// The process died.
    Crashed,
    /// The call returned.
    Done(Outcome),
}

/// A client's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Client {
    /// Where it is.
    pub phase: Phase,
    /// Calls made so far.
    pub calls: u8,
    /// When it stopped acting for good (crashed or returned), for property (d).
    pub gone_at: Option<i64>,
}

/// What really happened to a key (ghost state: no store sees it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyGhost {
    /// The last token issued for the key, and the client it was issued to.
    pub holder: Option<(u64, u8)>,
    /// The completion that is the key's result: the client, its value, when its TTL ends.
    pub completion: Option<(u8, u8, i64)>,
    /// Every token the key handed out, in order, for property (f).
    pub issued: Vec<u64>,
    /// The gateway: how many effects it holds for the key, and the value of the first.
    pub effects: u8,
    /// The value the gateway holds for the key (what a reconcile or an operator finds).
    pub effect: Option<u8>,
    /// The gateway's fence: the highest token it has seen for the key.
    pub fence: u64,
    /// The key was parked and not resolved since.
    pub parked: bool,
    /// How many verdicts the operator sent for the key.
    pub resolves: u8,
    /// The key's last attempt ended with a release (so the next claim is no takeover).
    pub released: bool,
}

/// A violation seen while taking a step (ghost flags: a step that breaks a property marks it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Flags {
    /// (a) a completion was stored by an attempt that does not hold the current token.
    pub foreign_completion: bool,
    /// (b) a replay returned something other than the key's live result.
    pub replay_differs: bool,
    /// (c) a completion was stored while another attempt's completion was live.
    pub double_completion: bool,
    /// (e) a body ran although a live record with other arguments existed.
    pub mismatch_ran: bool,
    /// (f) a claim got a token the key had handed out before.
    pub token_reused: bool,
    /// (g) a key's effect happened twice although takeovers reconcile or park.
    pub double_effect: bool,
    /// (h) a claim took over an attempt that had been released.
    pub released_taken_over: bool,
    /// (i) a body (or a reconcile) started on a parked key.
    pub parked_ran: bool,
    /// (j) a resolve changed a key that was not parked.
    pub resolved_unparked: bool,
    /// Reached: a reconcile found the effect and stored it.
    pub adopted: bool,
    /// Reached: a key was parked and then resolved.
    pub resolved: bool,
    /// Reached: a rerun made a key's effect twice (the crash window).
    pub doubled: bool,
}

/// The model's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// The logical clock (ticks).
    pub now: i64,
    /// The store.
    pub store: ModelStore,
    /// The clients.
    pub clients: Vec<Client>,
    /// Ghost state per key.
    pub keys: Vec<KeyGhost>,
    /// Violations seen on the way here.
    pub flags: Flags,
}

/// One atomic step.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    /// The clock advances one tick.
    Tick,
    /// A client calls: its claim (or, under `check_then_insert`, the claim's read).
    Call(u8),
    /// `check_then_insert` only: the claim's write.
    Insert(u8),
    /// The lease keeper renews a client's claim.
    Renew(u8),
    /// A client's body makes its effect at the gateway.
    Effect(u8),
    /// A client's body returns `Ok` (true) or `Err` (false).
    Return(u8, bool),
    /// A client's reconcile: the gateway answers (true) or not (false).
    Reconcile(u8, bool),
    /// A client parks the key it took over.
    Park(u8),
    /// The operator sends a verdict on a parked key, from what the gateway holds.
    Resolve(u8),
    /// A client's completion; `true` when its answer is lost and it will be retried.
    Complete(u8, bool),
    /// A client's release.
    Release(u8),
    /// A client's process dies.
    Crash(u8),
    /// An operator force-releases a key.
    ForceRelease(u8),
    /// A purge of records that are no longer live.
    Purge,
}

fn digest(byte: u8) -> Digest {
    Digest([byte; 32])
}

impl ProtocolModel {
    fn key_of(&self, c: u8) -> Digest {
        digest(self.clients[c as usize].key)
    }

    fn fingerprint_of(&self, c: u8) -> Digest {
        digest(0x80 | self.clients[c as usize].fingerprint)
    }

    /// After a call that did not run: retry later, or return.
    fn next_call(&self, client: &mut Client, now: i64, outcome: Outcome) {
        if client.calls < self.calls {
            client.phase = Phase::Idle;
        } else {
            client.phase = Phase::Done(outcome);
            client.gone_at = Some(now);
        }
    }

    /// Applies the protocol's decision for a claim's outcome.
    fn apply_decision(&self, s: &mut State, c: u8, decision: Decision) {
        let ki = self.clients[c as usize].key as usize;
        let now = s.now;
        match decision {
            Decision::Run { token, takeover } => {
                let ghost = &mut s.keys[ki];
                if ghost.issued.contains(&token) {
                    s.flags.token_reused = true;
                }
                if takeover.is_some() && ghost.released {
                    s.flags.released_taken_over = true;
                }
                if ghost.parked {
                    s.flags.parked_ran = true;
                }
                ghost.released = false;
                ghost.issued.push(token);
                ghost.holder = Some((token, c));
                s.clients[c as usize].phase = self.run_phase(token, takeover);
            }
            Decision::Replay { value: bytes, .. } => {
                let expected = s.keys[ki]
                    .completion
                    .filter(|&(_, _, until)| is_live(until, now))
                    .map(|(_, v, _)| v);
                if expected.is_none() || bytes != [expected.unwrap_or_default()] {
                    s.flags.replay_differs = true;
                }
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Done(Outcome::Replayed);
                cl.gone_at = Some(now);
            }
            // This model keeps no tombstones, so no call answers "expired"; were one to, it
            // would not have run the body: as good as in progress for what is checked.
            Decision::InProgress { .. } | Decision::Expired { .. } => {
                self.next_call(&mut s.clients[c as usize], now, Outcome::InProgress)
            }
            Decision::OutcomeUnknown => {
                self.next_call(&mut s.clients[c as usize], now, Outcome::OutcomeUnknown)
            }
            Decision::Mismatch => {
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Done(Outcome::Mismatch);
                cl.gone_at = Some(now);
            }
        }
    }

    /// Stores a finished result for client `c` under `token` (a body's, or a reconcile's under
    /// `fenced = false` when the bug `unfenced_reconcile` is planted), checking (a) and (c)
    /// against the ghost state; whether the store took it.
    #[allow(clippy::too_many_arguments)]
    fn store_result(
        &self,
        s: &mut State,
        c: u8,
        token: u64,
        value: u8,
        retry: bool,
        fenced: bool,
    ) -> bool {
        let now = s.now;
        let key = self.key_of(c);
        let ki = self.clients[c as usize].key as usize;
        let before = s.store.raw(&key).cloned();
        let stored = if !fenced {
            s.store
                .complete_unfenced(&key, token, &[value], self.ttl, now)
        } else if retry {
            s.store.complete_again(&key, token, &[value], self.ttl, now)
        } else {
            s.store.complete(&key, token, &[value], self.ttl, now)
        };
        let wrote = s.store.raw(&key) != before.as_ref();
        if wrote {
            let held = matches!(&before,
                Some(r) if r.token == token && r.status == Status::InProgress)
                && s.keys[ki].holder == Some((token, c));
            if !held {
                s.flags.foreign_completion = true;
            }
            if matches!(s.keys[ki].completion,
                Some((other, _, until)) if other != c && is_live(until, now))
            {
                s.flags.double_completion = true;
            }
            s.keys[ki].completion = Some((c, value, now + self.ttl));
        }
        stored
    }

    /// Flags (e) when a body is about to run beside a live record of other arguments.
    fn check_exclusive_arguments(&self, s: &mut State, c: u8) {
        let key = self.key_of(c);
        if let Some(r) = s.store.get(&key, s.now) {
            if r.fingerprint != self.fingerprint_of(c) {
                s.flags.mismatch_ran = true;
            }
        }
    }

    /// The value client `c`'s body returns on its current call: distinct per client and call.
    fn value_of(&self, s: &State, c: u8) -> u8 {
        c * 16 + s.clients[c as usize].calls
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            store: ModelStore::with_bug(self.bug),
            clients: vec![
                Client {
                    phase: Phase::Idle,
                    calls: 0,
                    gone_at: None,
                };
                self.clients.len()
            ],
            keys: vec![KeyGhost::default(); self.keys as usize],
            flags: Flags::default(),
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.now < self.horizon {
            actions.push(Action::Tick);
        }
        for (i, cl) in s.clients.iter().enumerate() {
            let c = i as u8;
            match cl.phase {
                Phase::Idle if cl.calls < self.calls => actions.push(Action::Call(c)),
                Phase::Idle => {}
                Phase::Read => {
                    actions.push(Action::Insert(c));
                    actions.push(Action::Crash(c));
                }
                Phase::Running { lost, effected, .. } => {
                    if !lost {
                        actions.push(Action::Renew(c));
                    }
                    if effected {
                        actions.push(Action::Return(c, true));
                    } else {
                        actions.push(Action::Effect(c));
                    }
                    // With effects, a body fails only before its effect: an `Err` after it
                    // would be the function's own choice to release it.
                    if !effected || !self.effects {
                        actions.push(Action::Return(c, false));
                    }
                    actions.push(Action::Crash(c));
                }
                Phase::Reconciling { .. } => {
                    actions.push(Action::Renew(c));
                    actions.push(Action::Reconcile(c, true));
                    actions.push(Action::Reconcile(c, false));
                    actions.push(Action::Crash(c));
                }
                Phase::Parking { .. } => {
                    actions.push(Action::Park(c));
                    actions.push(Action::Crash(c));
                }
                Phase::Completing { tries, .. } => {
                    // While a completion is retried the lease keeper goes on renewing.
                    if tries > 0 {
                        actions.push(Action::Renew(c));
                    }
                    actions.push(Action::Complete(c, false));
                    if tries < self.complete_retries {
                        actions.push(Action::Complete(c, true));
                    }
                    actions.push(Action::Crash(c));
                }
                Phase::Releasing { .. } => {
                    actions.push(Action::Release(c));
                    actions.push(Action::Crash(c));
                }
                Phase::Crashed | Phase::Done(_) => {}
            }
        }
        if self.resolver {
            for k in 0..self.keys {
                // The operator acts on a listing of parked keys, which may be stale: a verdict
                // may be sent again after the key was resolved.
                let ghost = &s.keys[k as usize];
                if (ghost.parked || ghost.resolves > 0) && ghost.resolves < 2 {
                    actions.push(Action::Resolve(k));
                }
            }
        }
        if self.operator {
            for k in 0..self.keys {
                // Only a live record is released (otherwise nothing changes).
                if s.store.get(&digest(k), s.now).is_some() {
                    actions.push(Action::ForceRelease(k));
                }
            }
        }
        let expired = (0..self.keys).any(|k| {
            matches!(s.store.raw(&digest(k)),
                Some(r) if may_forget(r.keep_until, s.now) && !is_live(r.expires_at, s.now))
        });
        if expired {
            actions.push(Action::Purge);
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        let now = s.now;
        match action {
            Action::Tick => s.now += 1,
            Action::Call(c) => {
                let key = self.key_of(c);
                let fp = self.fingerprint_of(c);
                s.clients[c as usize].calls += 1;
                if self.bug == Some(Bug::CheckThenInsert) {
                    match s.store.get(&key, now) {
                        Some(r) => {
                            let d = decide_existing(r, &fp);
                            self.apply_decision(&mut s, c, d);
                        }
                        None => s.clients[c as usize].phase = Phase::Read,
                    }
                } else {
                    let outcome =
                        s.store
                            .claim(NAME, &key, &fp, self.lease, self.ttl.max(self.lease), now);
                    if matches!(outcome, ClaimOutcome::Claimed { .. }) {
                        self.check_exclusive_arguments(&mut s, c);
                    }
                    self.apply_decision(&mut s, c, decide(outcome, &fp));
                }
            }
            Action::Insert(c) => {
                self.check_exclusive_arguments(&mut s, c);
                let key = self.key_of(c);
                let fp = self.fingerprint_of(c);
                let (token, takeover) =
                    s.store
                        .insert(NAME, &key, &fp, self.lease, self.ttl.max(self.lease), now);
                self.apply_decision(&mut s, c, Decision::Run { token, takeover });
            }
            Action::Renew(c) => {
                let key = self.key_of(c);
                match s.clients[c as usize].phase {
                    Phase::Running {
                        token, effected, ..
                    } => {
                        if !s.store.renew(&key, token, self.lease, now) {
                            s.clients[c as usize].phase = Phase::Running {
                                token,
                                lost: true,
                                effected,
                            };
                        }
                    }
                    Phase::Completing { token, .. } | Phase::Reconciling { token } => {
                        s.store.renew(&key, token, self.lease, now);
                    }
                    _ => return None,
                }
            }
            Action::Effect(c) => self.effect(&mut s, c)?,
            Action::Reconcile(c, answered) => self.reconcile(&mut s, c, answered)?,
            Action::Park(c) => self.park(&mut s, c)?,
            Action::Resolve(k) => self.resolve(&mut s, k)?,
            Action::Return(c, ok) => {
                let Phase::Running { token, .. } = s.clients[c as usize].phase else {
                    return None;
                };
                s.clients[c as usize].phase = if ok {
                    Phase::Completing {
                        token,
                        value: self.value_of(&s, c),
                        tries: 0,
                    }
                } else {
                    Phase::Releasing { token }
                };
            }
            Action::Complete(c, answer_lost) => {
                let Phase::Completing {
                    token,
                    value,
                    tries,
                } = s.clients[c as usize].phase
                else {
                    return None;
                };
                let stored = self.store_result(&mut s, c, token, value, tries > 0, true);
                let cl = &mut s.clients[c as usize];
                if answer_lost {
                    cl.phase = Phase::Completing {
                        token,
                        value,
                        tries: tries + 1,
                    };
                } else {
                    let outcome = if stored {
                        Outcome::Stored
                    } else {
                        Outcome::LeaseLost
                    };
                    cl.phase = Phase::Done(outcome);
                    cl.gone_at = Some(now);
                }
            }
            Action::Release(c) => {
                let Phase::Releasing { token } = s.clients[c as usize].phase else {
                    return None;
                };
                // Tracked with effects only: the standard configuration's state space stays as
                // it was (its (h) holds vacuously; the abandoned configurations check it).
                if s.store.release(&self.key_of(c), token, now) && self.effects {
                    s.keys[self.clients[c as usize].key as usize].released = true;
                }
                self.next_call(&mut s.clients[c as usize], now, Outcome::Failed);
            }
            Action::Crash(c) => {
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Crashed;
                cl.gone_at = Some(now);
            }
            Action::ForceRelease(k) => {
                s.store.force_release(&digest(k), now);
                // The operator's decision: the key's result is forgotten on purpose.
                let ghost = &mut s.keys[k as usize];
                ghost.completion = None;
                ghost.parked = false;
                ghost.released = self.effects;
            }
            Action::Purge => {
                s.store.purge_expired(now);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        properties::all(self)
    }

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
}
