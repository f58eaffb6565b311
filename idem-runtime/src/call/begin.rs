//! A call's claim and what it decides: run the body, replay, in progress (or wait for the
//! attempt in flight), mismatch. The one claim path, whatever executes it.

use super::{Failed, Outcome, Prepared, Ran};
use crate::codec;
use crate::error::Error;
use crate::observe::{Ended, Obs};
use crate::policy::ErrorPolicy;
use crate::protocol::{self, Decision};
use crate::store::{Claim, Executor, Store, Takeover};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

/// What a call's claim decided.
pub(crate) enum Begun<T, E> {
    /// The call holds the key with `token` (claimed at `sent`; taking over an abandoned
    /// attempt when `takeover` says so): run the body, then finish.
    Run {
        token: u64,
        sent: Instant,
        takeover: Option<Takeover>,
    },
    /// Replayed, or an idempotency failure: the body does not run.
    Done(Ran<T, E>),
}

impl Prepared {
    /// Claims the key on `exec` and acts on the decision: run, replay, in progress (after
    /// waiting for the attempt in flight when the call has a `wait` and the claim a lease),
    /// mismatch.
    pub(crate) async fn begin<T, E, P>(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        policy: &P,
    ) -> Begun<T, E>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        obs.prepared(exec.backend(), &self.key);
        self.idem.follow_releases();
        // A completed result kept in this process under this very fingerprint replays without
        // asking the store; anything else (a miss, another fingerprint) goes to the store.
        if let Some(plain) = self
            .idem
            .cache()
            .and_then(|c| c.get(&self.key, &self.fingerprint))
        {
            self.remember();
            return Begun::Done(replay(obs, policy, &plain, Ended::Cached));
        }
        let may_wait = self.wait.filter(|_| exec.leased());
        loop {
            // Read before the claim: a release announced after it keeps the result uncached.
            let epoch = self.idem.cache().map(|cache| cache.epoch());
            let sent = Instant::now();
            let claimed = obs.store("claim", exec.claim(self.claim())).await;
            let decision = match claimed {
                Ok(outcome) => protocol::decide(outcome, &self.fingerprint),
                Err(e) => return Begun::Done(Err(e.into())),
            };
            let decision = match (decision, may_wait) {
                (Decision::InProgress { .. }, Some(wait)) => {
                    // Boxed: a rare branch, kept out of every call's future.
                    let store = self.idem.store();
                    match Box::pin(self.wait_for(store, obs, sent + wait)).await {
                        Ok(Some(Decision::Run { .. })) | Ok(None) => continue,
                        // The record waited for was the attempt in flight: the time it had
                        // left was its lease, not the TTL of the result, which is not cached.
                        Ok(Some(Decision::Replay { value, .. })) => {
                            return Begun::Done(self.replayed(obs, policy, &value, None));
                        }
                        Ok(Some(decision)) => decision,
                        Err(e) => return Begun::Done(Err(e.into())),
                    }
                }
                (decision, _) => decision,
            };
            return match decision {
                Decision::Run { token, takeover } => {
                    obs.claimed(token);
                    Begun::Run {
                        token,
                        sent,
                        takeover,
                    }
                }
                Decision::Replay { value, ttl_left } => {
                    let cache = epoch.map(|epoch| (epoch, sent, ttl_left));
                    Begun::Done(self.replayed(obs, policy, &value, cache))
                }
                Decision::Mismatch => Begun::Done(Err(self.mismatch().into())),
                Decision::OutcomeUnknown => Begun::Done(Err(self.outcome_unknown().into())),
                Decision::Expired { expired_at, until } => Begun::Done(Err(Error::Expired {
                    name: self.name.to_string(),
                    key: self.key.to_hex(),
                    expired_at,
                    until,
                }
                .into())),
                Decision::InProgress { retry_after } => {
                    Begun::Done(Err(self.in_progress(retry_after).into()))
                }
            };
        }
    }

    /// This call's claim.
    fn claim(&self) -> Claim<'_> {
        Claim {
            name: &self.name,
            key: &self.key,
            fingerprint: &self.fingerprint,
            lease: self.lease,
            ttl: self.ttl,
        }
    }

    /// Replays a stored value, and keeps it in the handle's cache when `cache` says (the
    /// cache's epoch read before the claim, when the claim was sent, the record's time left).
    fn replayed<T, E, P>(
        &self,
        obs: &mut Obs,
        policy: &P,
        stored: &[u8],
        cache: Option<(u64, Instant, std::time::Duration)>,
    ) -> Ran<T, E>
    where
        T: DeserializeOwned,
        P: ErrorPolicy<E>,
    {
        self.remember();
        let plain = self.open::<T>(stored)?;
        if let (Some(store), Some((epoch, sent, ttl_left))) = (self.idem.cache(), cache) {
            store.put(
                self.key,
                self.fingerprint,
                &plain,
                sent.into_std(),
                ttl_left,
                epoch,
            );
        }
        replay(obs, policy, &plain, Ended::Replayed)
    }

    /// Waits until the attempt in flight finishes or `deadline` passes: what the record then
    /// decides, or `None` when it is gone (released, or lapsed) and the key may be claimed.
    async fn wait_for(
        &self,
        store: &dyn Store,
        obs: &mut Obs,
        deadline: Instant,
    ) -> Result<Option<Decision>, Error> {
        loop {
            let now = Instant::now();
            let last = now >= deadline;
            if !last {
                store.changed(&self.key, deadline - now).await;
            }
            let record = obs.store("get", store.get(&self.key)).await?;
            match record.map(|r| protocol::decide_existing(r, &self.fingerprint)) {
                Some(Decision::InProgress { .. }) if !last => continue,
                decided => return Ok(decided),
            }
        }
    }
}

/// Decodes an encoded (opened) result; `ended` says where it came from (the store, the cache).
fn replay<T, E, P>(obs: &mut Obs, policy: &P, plain: &[u8], ended: Ended) -> Ran<T, E>
where
    T: DeserializeOwned,
    P: ErrorPolicy<E>,
{
    let result = codec::decode_result::<T, E>(plain, |json| policy.decode(json))?;
    obs.done(ended);
    result.map(Outcome::Replayed).map_err(Failed::Body)
}
