//! What the outbox's tests in this package and in `idem-cli` share (feature `outbox`).

use idem::outbox::{Delivery, Publisher};
use idem::BoxError;
use std::future::Future;
use std::pin::Pin;

/// What [`RefusesSome`] answers for a message it refuses: a dead letter's `last_error`.
pub const REFUSED: &str = "HTTP 503 from the consumer";

/// A publisher that accepts every message but those of topic `refused` (to make dead letters).
#[derive(Debug, Clone, Copy)]
pub struct RefusesSome;

impl Publisher for RefusesSome {
    fn publish<'a>(
        &'a self,
        message: &'a Delivery,
    ) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send + 'a>> {
        Box::pin(async move {
            if message.topic == "refused" {
                return Err(REFUSED.into());
            }
            Ok(())
        })
    }
}
