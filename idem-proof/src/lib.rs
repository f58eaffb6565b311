//! The protocol of `idem`, proven: a model of the claim / renew / complete / release protocol
//! for the `stateright` model checker, and the model's store that every real store is compared
//! against in the model-based tests.
//!
//! The model calls the runtime's own [`idem_runtime::protocol`] (`decide`, `next_token`,
//! `is_live`, `holds`, `ended_at`, `may_forget`): what is checked is the code that runs, not a transcription of it. What the model
//! covers and what it abstracts away is in `docs/protocol.md`.

pub mod model;
pub mod store;

pub use model::{OnTakeover, ProtocolModel, State};
pub use store::{ModelRecord, ModelStore};

/// A bug planted on purpose, to show that the checker finds it (`IDEM_MODEL_BUG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bug {
    /// `complete` ignores the token: a stalled attempt overwrites its successor's record.
    UnfencedComplete,
    /// The claim reads, then writes, in two steps: two callers both see the key free.
    CheckThenInsert,
    /// A takeover keeps the previous holder's token instead of issuing a new one.
    TokenNotBumpedOnTakeover,
    /// `renew` accepts a stale token: a stalled attempt keeps its successor's claim alive.
    RenewAfterTakeover,
    /// `release` (and `force_release`) delete the record instead of ending it: a claim in the
    /// same tick finds no previous token and hands out the released one again.
    TokenReuseAfterRelease,
    /// A reconcile stores what it found without the fence: a reconcile that lost its claim
    /// overwrites its successor's record.
    UnfencedReconcile,
    /// A claim takes a released record for abandoned: the next call reconciles or parks a
    /// key whose attempt ended on purpose.
    ReleasedAsAbandoned,
    /// A claim takes a parked record for free: the body runs on a key whose outcome is unknown.
    ParkedRunsBody,
    /// A resolve applies to whatever record is there: a second verdict overwrites the first
    /// one's completed result.
    ResolveOverwritesCompleted,
    /// A reconcile looks the effect up without passing its token downstream: an attempt that
    /// was only frozen makes its effect after the look-up found none, and the takeover makes
    /// it again (the limit docs/crash-window.md describes).
    LookupWithoutToken,
}

impl Bug {
    /// Every planted bug.
    pub const ALL: [Bug; 10] = [
        Bug::UnfencedComplete,
        Bug::CheckThenInsert,
        Bug::TokenNotBumpedOnTakeover,
        Bug::RenewAfterTakeover,
        Bug::TokenReuseAfterRelease,
        Bug::UnfencedReconcile,
        Bug::ReleasedAsAbandoned,
        Bug::ParkedRunsBody,
        Bug::ResolveOverwritesCompleted,
        Bug::LookupWithoutToken,
    ];

    /// Whether the bug lives in abandoned attempts (reconcile, park, resolve): the
    /// configuration [`ProtocolModel::abandoned`] shows it.
    pub fn of_abandoned_attempts(self) -> bool {
        matches!(
            self,
            Bug::UnfencedReconcile
                | Bug::ReleasedAsAbandoned
                | Bug::ParkedRunsBody
                | Bug::ResolveOverwritesCompleted
                | Bug::LookupWithoutToken
        )
    }

    /// The name `IDEM_MODEL_BUG` selects it by.
    pub fn name(self) -> &'static str {
        match self {
            Bug::UnfencedComplete => "unfenced_complete",
            Bug::CheckThenInsert => "check_then_insert",
            Bug::TokenNotBumpedOnTakeover => "token_not_bumped_on_takeover",
            Bug::RenewAfterTakeover => "renew_after_takeover",
            Bug::TokenReuseAfterRelease => "token_reuse_after_release",
            Bug::UnfencedReconcile => "unfenced_reconcile",
            Bug::ReleasedAsAbandoned => "released_as_abandoned",
            Bug::ParkedRunsBody => "parked_runs_body",
            Bug::ResolveOverwritesCompleted => "resolve_overwrites_completed",
            Bug::LookupWithoutToken => "lookup_without_token",
        }
    }

    /// The bug of that name.
    pub fn from_name(name: &str) -> Option<Bug> {
        Bug::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The bug `IDEM_MODEL_BUG` names: `Ok(None)` when it is unset or empty, `Err` with the
    /// unknown name otherwise (so a typo cannot pass as "no bug").
    pub fn from_env() -> Result<Option<Bug>, String> {
        match std::env::var("IDEM_MODEL_BUG") {
            Ok(v) if !v.is_empty() => Bug::from_name(&v).map(Some).ok_or(v),
            _ => Ok(None),
        }
    }
}
