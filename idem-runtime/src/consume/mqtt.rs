//! The consumer on MQTT 5 (feature `consume-mqtt`, through rumqttc's `v5` client, without
//! TLS), with QoS 1: at least once.
//!
//! MQTT has **no negative ack** and no per-message redelivery: a broker sends a QoS 1 message
//! again only when the client reconnects to a session in which it is still unacknowledged
//! (MQTT 5 §4.4). So:
//!
//! - the subscription's session **persists**: `clean_start = false` and a session expiry
//!   interval (default one day), and acks are manual (`set_manual_acks(true)`): a message is
//!   acked (`PUBACK`) only after its result is stored;
//! - **a nack** keeps the message unacked and hands it back to this consumer after the delay
//!   (the same delivery runs its call again: by then it replays, or runs if the first attempt
//!   failed). If the process dies meanwhile, the broker redelivers it to the next client that
//!   connects **with the same client id** (the restarted or replacement consumer), with its
//!   DUP flag set. A shared subscription (`$share/GROUP/topic`) spreads messages over several
//!   client ids; each keeps its own unacked ones;
//! - **a lost connection**: rumqttc reconnects on the next poll; the broker resumes the
//!   session (resubscribing if the session was lost) and resends what was not acked;
//! - **key**: the MQTT 5 user property [`MESSAGE_ID`] ([`publish`] sets it). Packet
//!   identifiers are reused and are not message ids;
//! - **dead letter**: published QoS 1 to the topic you name, with the reason in the
//!   [`DEAD_LETTER_REASON`] user property, before the original is acked on the same connection
//!   (so the broker has the copy before it hears the ack);
//! - **prefetch**: the connection's receive maximum (how many QoS 1 messages the broker sends
//!   before acks).

use super::{broker_error, Delivery, Message, Source, DEAD_LETTER_REASON};
use crate::error::Error;
use crate::store::BoxFuture;
pub use rumqttc;
use rumqttc::v5::mqttbytes::v5::{Packet, Publish, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use std::time::Duration;
use tokio::sync::mpsc;

/// The user property that carries a message's id.
pub const MESSAGE_ID: &str = "message-id";

/// What the event loop task hands the source.
type Incoming = Result<Publish, Error>;

/// A QoS 1 subscription with a persistent session, as a [`Source`].
#[derive(Debug)]
pub struct Subscription {
    options: Option<MqttOptions>,
    filter: String,
    dead_letter: String,
    client: Option<AsyncClient>,
    tx: Option<mpsc::UnboundedSender<Incoming>>,
    rx: Option<mpsc::UnboundedReceiver<Incoming>>,
}

impl Subscription {
    /// Subscribes to `filter` (a topic filter, or `$share/GROUP/filter`) with `options` (its
    /// client id names the session; manual acks, `clean_start = false`, the receive maximum and,
    /// when unset, a one-day session expiry are set here); messages that cannot be handled are
    /// published to `dead_letter`.
    pub fn new(
        options: MqttOptions,
        filter: impl Into<String>,
        dead_letter: impl Into<String>,
    ) -> Subscription {
        Subscription {
            options: Some(options),
            filter: filter.into(),
            dead_letter: dead_letter.into(),
            client: None,
            tx: None,
            rx: None,
        }
    }

    /// The client, once started: to publish on the consumer's connection.
    pub fn client(&self) -> Option<&AsyncClient> {
        self.client.as_ref()
    }
}

impl Source for Subscription {
    fn start(&mut self, prefetch: u16) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let mut options = self
                .options
                .take()
                .ok_or_else(|| Error::config("the MQTT subscription was started twice"))?;
            options.set_manual_acks(true);
            options.set_clean_start(false);
            if options.session_expiry_interval().is_none() {
                options.set_session_expiry_interval(Some(24 * 60 * 60));
            }
            options.set_receive_maximum(Some(prefetch));
            let (client, mut events) = AsyncClient::new(options, 2 * usize::from(prefetch) + 16);
            let (tx, rx) = mpsc::unbounded_channel();
            let (filter, subscriber, sender) = (self.filter.clone(), client.clone(), tx.clone());
            // The event loop must be polled for anything to move, acks included: a task of its
            // own, which ends when the source (and every delivery) is gone.
            tokio::spawn(async move {
                loop {
                    let event = events.poll().await;
                    let forwarded = match event {
                        Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                            if !ack.session_present {
                                // A new session: it has no subscription yet. Requested from
                                // another task: this one drains the requests it would wait on.
                                let (subscriber, filter) = (subscriber.clone(), filter.clone());
                                tokio::spawn(async move {
                                    if let Err(e) =
                                        subscriber.subscribe(filter, QoS::AtLeastOnce).await
                                    {
                                        tracing::warn!(error = %e, "mqtt consumer: subscribe failed");
                                    }
                                });
                            }
                            Ok(())
                        }
                        Ok(Event::Incoming(Packet::Publish(publish))) => sender.send(Ok(publish)),
                        Ok(_) => Ok(()),
                        Err(e) => {
                            let sent = sender.send(Err(broker_error("mqtt", "poll", e)));
                            // rumqttc reconnects on the next poll; not at once.
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            sent
                        }
                    };
                    if forwarded.is_err() || sender.is_closed() {
                        break;
                    }
                }
            });
            self.client = Some(client);
            self.tx = Some(tx);
            self.rx = Some(rx);
            Ok(())
        })
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<Box<dyn Delivery>, Error>>> {
        Box::pin(async move {
            let next = self.rx.as_mut()?.recv().await?;
            let client = self.client.clone()?;
            let tx = self.tx.clone()?;
            Some(next.map(|publish| {
                Box::new(MqttDelivery::new(
                    publish,
                    client,
                    tx,
                    self.dead_letter.clone(),
                )) as Box<dyn Delivery>
            }))
        })
    }
}

/// One QoS 1 publish.
struct MqttDelivery {
    publish: Publish,
    view: Message,
    client: AsyncClient,
    /// The source's queue, which a nacked delivery goes back to.
    again: mpsc::UnboundedSender<Incoming>,
    dead_letter: String,
}

impl MqttDelivery {
    fn new(
        publish: Publish,
        client: AsyncClient,
        again: mpsc::UnboundedSender<Incoming>,
        dead_letter: String,
    ) -> Self {
        let headers: Vec<(String, String)> = publish
            .properties
            .as_ref()
            .map(|p| p.user_properties.clone())
            .unwrap_or_default();
        let id = headers
            .iter()
            .find(|(k, _)| k == MESSAGE_ID)
            .map(|(_, v)| v.clone());
        let view = Message {
            id,
            subject: String::from_utf8_lossy(&publish.topic).into_owned(),
            payload: publish.payload.clone(),
            headers,
            redelivered: publish.dup,
        };
        MqttDelivery {
            publish,
            view,
            client,
            again,
            dead_letter,
        }
    }
}

impl Delivery for MqttDelivery {
    fn message(&self) -> &Message {
        &self.view
    }

    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            self.client
                .ack(&self.publish)
                .await
                .map_err(|e| broker_error("mqtt", "ack", e))
        })
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), Error>> {
        // Unacked, it stays the broker's to redeliver if this process dies; alive, this
        // consumer tries it again after the delay.
        let MqttDelivery { publish, again, .. } = *self;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = again.send(Ok(publish));
        });
        Box::pin(async { Ok(()) })
    }

    fn dead_letter(self: Box<Self>, reason: String) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            let mut properties = self.publish.properties.clone().unwrap_or_default();
            properties
                .user_properties
                .push((DEAD_LETTER_REASON.to_owned(), reason));
            properties
                .user_properties
                .push(("idem-original-topic".to_owned(), self.view.subject.clone()));
            properties.topic_alias = None;
            properties.subscription_identifiers.clear();
            self.client
                .publish_with_properties(
                    self.dead_letter.clone(),
                    QoS::AtLeastOnce,
                    false,
                    self.view.payload.clone(),
                    properties,
                )
                .await
                .map_err(|e| broker_error("mqtt", "dead letter", e))?;
            self.client
                .ack(&self.publish)
                .await
                .map_err(|e| broker_error("mqtt", "ack", e))
        })
    }
}

/// Publishes `payload` to `topic` at QoS 1 with `id` in the [`MESSAGE_ID`] user property (the
/// consumer's key). It returns once the request is queued on `client`'s connection; the
/// broker's `PUBACK` arrives through that client's event loop.
pub async fn publish(
    client: &AsyncClient,
    topic: &str,
    id: &str,
    payload: impl Into<Bytes>,
) -> Result<(), Error> {
    let properties = PublishProperties {
        user_properties: vec![(MESSAGE_ID.to_owned(), id.to_owned())],
        ..Default::default()
    };
    client
        .publish_with_properties(topic, QoS::AtLeastOnce, false, payload.into(), properties)
        .await
        .map_err(|e| broker_error("mqtt", "publish", e))
}

use bytes::Bytes;
