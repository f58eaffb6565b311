//! The NATS JetStream publisher (feature `outbox-nats`): each message is published to the
//! subject named by its topic with `Nats-Msg-Id` set to the message id, so JetStream's
//! deduplication window drops a redelivery the relay makes after a crash, and delivery counts
//! only once the stream acknowledged the message.

use super::{Delivery, Publisher};
use crate::error::BoxError;
use crate::store::BoxFuture;
pub use async_nats;
use async_nats::jetstream;

/// Publishes outbox messages to NATS JetStream.
#[derive(Debug, Clone)]
pub struct NatsPublisher {
    js: jetstream::Context,
    prefix: String,
}

impl NatsPublisher {
    /// Publishes on `js` (from `async_nats::jetstream::new(client)`), to the subject equal to
    /// each message's topic. A stream must capture those subjects.
    pub fn new(js: jetstream::Context) -> NatsPublisher {
        NatsPublisher {
            js,
            prefix: String::new(),
        }
    }

    /// Publishes to `<prefix><topic>` instead.
    pub fn subject_prefix(mut self, prefix: impl Into<String>) -> NatsPublisher {
        self.prefix = prefix.into();
        self
    }
}

impl Publisher for NatsPublisher {
    fn publish<'a>(&'a self, message: &'a Delivery) -> BoxFuture<'a, Result<(), BoxError>> {
        Box::pin(async move {
            let mut headers = async_nats::HeaderMap::new();
            for (name, value) in &message.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            headers.insert(async_nats::header::NATS_MESSAGE_ID, message.id.as_str());
            let subject = format!("{}{}", self.prefix, message.topic);
            let ack = self
                .js
                .publish_with_headers(subject, headers, message.payload.clone().into())
                .await?;
            // The stream's acknowledgement: only then is the message stored on the NATS side.
            ack.await?;
            Ok(())
        })
    }
}
