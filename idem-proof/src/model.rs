//! The protocol as a `stateright` model: clients that call, run, renew, stall, crash, retry,
//! and complete or release; an operator; a purger; a logical clock that advances whenever it
//! likes. Every store step is one atomic step of [`ModelStore`].
//!
//! Ghost state (what really happened, which no store sees) lets the properties say what must
//! never happen: who holds which token, which completion is the key's live result.

use crate::store::ModelStore;
use crate::Bug;
use idem_runtime::key::Digest;
use idem_runtime::protocol::{decide, decide_existing, is_live, may_forget, Decision};
use idem_runtime::store::{ClaimOutcome, Status};
use stateright::{Model, Property};

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
    /// A client's body returns `Ok` (true) or `Err` (false).
    Return(u8, bool),
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
            Decision::Run { token, .. } => {
                if s.keys[ki].issued.contains(&token) {
                    s.flags.token_reused = true;
                }
                s.keys[ki].issued.push(token);
                s.keys[ki].holder = Some((token, c));
                s.clients[c as usize].phase = Phase::Running { token, lost: false };
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
            // This model's calls never park a key nor keep a tombstone, so none answers
            // "outcome unknown" or "expired"; were one to, it would not have run the body: as
            // good as in progress for what is checked.
            Decision::InProgress { .. } | Decision::OutcomeUnknown | Decision::Expired { .. } => {
                self.next_call(&mut s.clients[c as usize], now, Outcome::InProgress)
            }
            Decision::Mismatch => {
                let cl = &mut s.clients[c as usize];
                cl.phase = Phase::Done(Outcome::Mismatch);
                cl.gone_at = Some(now);
            }
        }
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
                Phase::Running { lost, .. } => {
                    if !lost {
                        actions.push(Action::Renew(c));
                    }
                    actions.push(Action::Return(c, true));
                    actions.push(Action::Return(c, false));
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
                    Phase::Running { token, .. } => {
                        if !s.store.renew(&key, token, self.lease, now) {
                            s.clients[c as usize].phase = Phase::Running { token, lost: true };
                        }
                    }
                    Phase::Completing { token, .. } => {
                        s.store.renew(&key, token, self.lease, now);
                    }
                    _ => return None,
                }
            }
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
                let key = self.key_of(c);
                let ki = self.clients[c as usize].key as usize;
                let before = s.store.raw(&key).cloned();
                let stored = if tries == 0 {
                    s.store.complete(&key, token, &[value], self.ttl, now)
                } else {
                    s.store.complete_again(&key, token, &[value], self.ttl, now)
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
                s.store.release(&self.key_of(c), token, now);
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
                s.keys[k as usize].completion = None;
            }
            Action::Purge => {
                s.store.purge_expired(now);
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
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

    fn within_boundary(&self, s: &State) -> bool {
        s.now <= self.horizon
    }
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
