//! After the body: its result stored (fenced by the attempt's token) or its key released. The
//! one finish path, whatever executes it.

use super::{Failed, Outcome, Prepared, Ran};
use crate::codec;
use crate::error::{Error, StoreErrorKind};
use crate::lease::Held;
use crate::observe::{Ended, KeyPrefix, Obs};
use crate::policy::{ErrorPolicy, OnError};
use crate::store::{Backend, Complete, Executor};
use serde::Serialize;

impl Prepared {
    /// Stores the body's result (an `Ok`, or an `Err` the policy keeps) or releases the key
    /// (an `Err` the policy releases, or a result that cannot be encoded), and returns it.
    /// `held`: the lease the store steps are bounded by, when the claim has one.
    pub(crate) async fn finish<T, E, P>(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
        policy: &P,
        result: Result<T, E>,
    ) -> Ran<T, E>
    where
        T: Serialize,
        P: ErrorPolicy<E>,
    {
        let (sealed, result) = match result {
            Ok(value) => {
                let sealed = codec::encode_ok(&value).and_then(|plain| self.seal::<T>(plain));
                (sealed, Ok(Outcome::Fresh(value)))
            }
            Err(error) => match policy.on_error(&error) {
                OnError::Release => {
                    self.release(exec, obs, token, held).await;
                    obs.done(Ended::Released);
                    return Err(Failed::Body(error));
                }
                OnError::Keep => {
                    let sealed = policy
                        .encode(&error)
                        .and_then(|plain| self.seal::<E>(plain));
                    (sealed, Err(Failed::Body(error)))
                }
            },
        };
        let (bytes, plain) = match sealed {
            Ok(sealed) => sealed,
            Err(e) => {
                // Nothing can be stored, so nothing could be replayed: free the key.
                self.release(exec, obs, token, held).await;
                return Err(e.into());
            }
        };
        let sent = std::time::Instant::now();
        let epoch = self.idem.cache().map(|cache| cache.epoch());
        self.complete(exec, obs, token, held, &bytes).await?;
        // Only a result the store holds for good is cached: not one completed inside a
        // caller's transaction, which may yet roll back.
        if let (Some(cache), Some(plain), Some(epoch), true) =
            (self.idem.cache(), plain, epoch, exec.leased())
        {
            cache.put(self.key, self.fingerprint, &plain, sent, self.ttl, epoch);
        }
        obs.done(Ended::Claimed);
        result
    }

    /// The bytes to store for an encoded result of type `V` (compressed, encrypted and checked
    /// against the size limit as the handle says), and the encoded result itself when the
    /// handle caches results.
    fn seal<V>(&self, plain: Vec<u8>) -> Result<(Vec<u8>, Option<Vec<u8>>), Error> {
        let keep = self.idem.cache().map(|_| plain.clone());
        let type_name = std::any::type_name::<V>();
        let stored = self
            .idem
            .codec()
            .seal(type_name, &self.name, &self.key, plain)?;
        if let Some(max) = self.max_value.filter(|max| stored.len() > *max) {
            return Err(Error::codec(
                crate::CodecErrorKind::TooLarge,
                type_name,
                format!(
                    "{} bytes as stored, over {}'s limit of {max} bytes (`max_value`)",
                    stored.len(),
                    self.name
                ),
            ));
        }
        Ok((stored, keep))
    }

    /// The encoded result inside a stored value (decrypted, decompressed).
    pub(super) fn open<'a, T>(
        &self,
        stored: &'a [u8],
    ) -> Result<std::borrow::Cow<'a, [u8]>, Error> {
        self.idem
            .codec()
            .open(std::any::type_name::<T>(), &self.name, &self.key, stored)
    }

    /// Stores the result, fenced by `token`: `LeaseLost` when another attempt took the key
    /// over meanwhile.
    async fn complete(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
        value: &[u8],
    ) -> Result<(), Error> {
        let backend = exec.backend();
        let done = Complete {
            key: &self.key,
            token,
            value,
            ttl: self.ttl,
            tombstone: self.tombstone,
        };
        let step = obs.store("complete", exec.complete(done));
        let completed = match held {
            Some(held) => match held.bound(step).await {
                Some(completed) => completed,
                None => return Err(self.lease_ran_out(backend)),
            },
            None => step.await,
        };
        if completed? {
            Ok(())
        } else {
            Err(self.lease_lost(token))
        }
    }

    /// Frees the key. A failure is logged, not returned: the caller's own error (or panic)
    /// matters more, and the claim goes anyway (it lapses after its lease; a transaction's
    /// rollback removes it).
    pub(crate) async fn release(
        &self,
        exec: &mut dyn Executor,
        obs: &mut Obs,
        token: u64,
        held: Option<&Held>,
    ) {
        let (backend, leased) = (exec.backend(), exec.leased());
        let step = obs.store("release", exec.release(&self.key, token));
        let released = match held {
            Some(held) => held.bound(step).await,
            None => Some(step.await),
        };
        let (name, key) = (&*self.name, KeyPrefix(&self.key));
        match released {
            Some(Ok(true)) => {}
            Some(Ok(false)) => {
                tracing::debug!(idem.name = name, idem.key = %key, idem.token = token, "idem: release found the key taken over")
            }
            // In a transaction, the body's own failed statement aborted it: expected, and
            // rolling back removes the claim.
            Some(Err(e)) if !leased => {
                tracing::debug!(idem.name = name, idem.key = %key, idem.token = token, error = %e,
                    "idem: release in the transaction failed; rolling back removes the claim")
            }
            Some(Err(e)) => {
                tracing::warn!(idem.name = name, idem.key = %key, idem.token = token, error = %e, "idem: release failed; the key lapses after its lease")
            }
            None => {
                tracing::warn!(idem.name = name, idem.key = %key, idem.token = token, error = %self.lease_ran_out(backend), "idem: release abandoned; the key lapses after its lease")
            }
        }
    }

    /// The store kept failing (renewals too) until this attempt's lease ran out.
    fn lease_ran_out(&self, backend: Backend) -> Error {
        Error::store_kind(
            backend,
            "complete",
            StoreErrorKind::Timeout,
            format!(
                "{}: the store did not answer before this attempt's lease ran out; the key \
                 frees when the lease lapses",
                self.name
            ),
        )
    }
}
