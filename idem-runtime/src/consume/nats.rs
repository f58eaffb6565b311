//! The consumer on NATS JetStream (feature `consume-nats`): a pull consumer's messages.
//!
//! - **Key**: the `Nats-Msg-Id` header (what JetStream deduplicates publishes on, and what the
//!   outbox's `NatsPublisher` sets), else `STREAM:SEQUENCE`, which a redelivery keeps.
//! - **Nack with a delay**: `AckKind::Nak(Some(delay))`: the server redelivers after it.
//! - **Dead letter**: the message is published with JetStream to the subject you name (a
//!   stream must capture it: the publish waits for the stream's ack), with its headers, its
//!   id as `Nats-Msg-Id` if it had none, the reason in [`DEAD_LETTER_REASON`] and its subject in
//!   `idem-original-subject`; then the original is terminated (`AckKind::Term`).
//! - **Prefetch**: the pull batch (`max_messages_per_batch`); set the consumer's
//!   `max_ack_pending` at least as high, and its `ack_wait` longer than a handler takes (a
//!   shorter one is survived: the redelivery is answered "in progress", then replays).
//! - **A lost connection**: async-nats reconnects by itself; the pull stream resumes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! # use idem_runtime as idem;
//! use idem::consume::{nats::{async_nats, JetStream}, Consumer};
//! use async_nats::jetstream::{self, consumer::pull};
//! let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! let stream = js.get_stream("ORDERS").await?;
//! let pull = stream
//!     .get_or_create_consumer("charges", pull::Config {
//!         durable_name: Some("charges".into()),
//!         ..Default::default()
//!     })
//!     .await?;
//! let source = JetStream::new(js, pull, "orders.dead");
//! Consumer::new(&idem::Idem::memory(), "charges.v1")
//!     .run(source, tokio::signal::ctrl_c(), |msg| async move {
//!         Ok::<_, idem::Error>(msg.payload.len())
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

use super::{broker_error, Delivery, Message, Source, DEAD_LETTER_REASON};
use crate::error::Error;
use crate::store::BoxFuture;
pub use async_nats;
use async_nats::jetstream::{self, consumer::pull, AckKind};
use futures_util::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// A JetStream pull consumer as a [`Source`].
pub struct JetStream {
    js: jetstream::Context,
    consumer: jetstream::consumer::Consumer<pull::Config>,
    dead_letter: Arc<str>,
    messages: Option<pull::Stream>,
}

impl std::fmt::Debug for JetStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStream")
            .field("dead_letter", &self.dead_letter)
            .finish_non_exhaustive()
    }
}

impl JetStream {
    /// The messages of the pull `consumer`; dead letters are published on `js` to the subject
    /// `dead_letter`.
    pub fn new(
        js: jetstream::Context,
        consumer: jetstream::consumer::Consumer<pull::Config>,
        dead_letter: impl Into<String>,
    ) -> JetStream {
        JetStream {
            js,
            consumer,
            dead_letter: dead_letter.into().into(),
            messages: None,
        }
    }
}

impl Source for JetStream {
    fn start(&mut self, prefetch: u16) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let messages = self
                .consumer
                .stream()
                .max_messages_per_batch(usize::from(prefetch))
                .heartbeat(Duration::from_secs(5))
                .messages()
                .await
                .map_err(|e| broker_error("nats", "subscribe", e))?;
            self.messages = Some(messages);
            Ok(())
        })
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<Box<dyn Delivery>, Error>>> {
        Box::pin(async move {
            let next = self.messages.as_mut()?.next().await?;
            Some(match next {
                Ok(msg) => Ok(Box::new(NatsDelivery::new(
                    msg,
                    self.js.clone(),
                    self.dead_letter.clone(),
                )) as Box<dyn Delivery>),
                Err(e) => Err(broker_error("nats", "next message", e)),
            })
        })
    }
}

/// One JetStream message.
struct NatsDelivery {
    msg: jetstream::Message,
    view: Message,
    js: jetstream::Context,
    dead_letter: Arc<str>,
}

impl NatsDelivery {
    fn new(msg: jetstream::Message, js: jetstream::Context, dead_letter: Arc<str>) -> Self {
        let headers: Vec<(String, String)> = msg
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().to_owned()))
            })
            .collect();
        let info = msg.info().ok();
        let id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
            .map(|v| v.as_str().to_owned())
            .or_else(|| {
                info.as_ref()
                    .map(|i| format!("{}:{}", i.stream, i.stream_sequence))
            });
        let view = Message {
            id,
            subject: msg.subject.to_string(),
            payload: msg.payload.clone(),
            headers,
            redelivered: info.is_some_and(|i| i.delivered > 1),
        };
        NatsDelivery {
            msg,
            view,
            js,
            dead_letter,
        }
    }

    async fn settle(self, kind: AckKind) -> Result<(), Error> {
        self.msg
            .ack_with(kind)
            .await
            .map_err(|e| broker_error("nats", "ack", e))
    }
}

impl Delivery for NatsDelivery {
    fn message(&self) -> &Message {
        &self.view
    }

    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(self.settle(AckKind::Ack))
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(self.settle(AckKind::Nak(Some(delay))))
    }

    fn dead_letter(self: Box<Self>, reason: String) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            let mut headers = self.msg.headers.clone().unwrap_or_default();
            if headers.get(async_nats::header::NATS_MESSAGE_ID).is_none() {
                if let Some(id) = &self.view.id {
                    headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
                }
            }
            headers.insert(DEAD_LETTER_REASON, reason.as_str());
            headers.insert("idem-original-subject", self.view.subject.as_str());
            self.js
                .publish_with_headers(
                    self.dead_letter.to_string(),
                    headers,
                    self.view.payload.clone(),
                )
                .await
                .map_err(|e| broker_error("nats", "dead letter", e))?
                .await
                .map_err(|e| broker_error("nats", "dead letter", e))?;
            self.settle(AckKind::Term).await
        })
    }
}
