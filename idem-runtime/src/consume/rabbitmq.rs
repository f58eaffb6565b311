//! The consumer on RabbitMQ (feature `consume-rabbitmq`, AMQP 0-9-1 through lapin on tokio,
//! `amqp://` without TLS).
//!
//! - **Queues**: the consumed queue and the dead-letter queue are declared as durable
//!   **quorum queues** (`x-queue-type: quorum`) unless [`Queue::declare`] is turned off (a
//!   queue declared before with other arguments refuses the declaration).
//! - **Key**: the AMQP `message_id` property ([`Publisher`] sets it).
//! - **Nack with a delay**: AMQP has no delayed requeue, so the delivery is held (still
//!   unacked, still counted by the prefetch) for the delay, then `basic.nack` with requeue.
//! - **Dead letter**: published to the dead-letter queue through the default exchange with a
//!   publisher confirm, its `message_id` kept and the reason in the [`DEAD_LETTER_REASON`]
//!   header; the original is acked only after the broker confirmed the copy.
//! - **Prefetch**: `basic.qos`, per consumer.
//! - **A lost connection** (a broker restart, `rabbitmqctl close_all_connections`): the
//!   unacked deliveries go back to the queue at once (their late acks fail and are counted as
//!   broker errors); the source reconnects, with a growing pause up to 2 s, and consumes
//!   again. The redeliveries of messages already handled replay.

use super::{broker_error, Delivery, Message, Source, DEAD_LETTER_REASON};
use crate::error::Error;
use crate::store::BoxFuture;
use futures_util::StreamExt;
pub use lapin;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::sync::Arc;
use std::time::Duration;

/// Opens a connection on the current tokio runtime (`amqp://guest:guest@127.0.0.1:5672/%2f`).
pub async fn connect(url: &str) -> Result<Connection, Error> {
    let properties = ConnectionProperties::default()
        .with_executor(tokio_executor_trait::Tokio::current())
        .with_reactor(tokio_reactor_trait::Tokio::current());
    Connection::connect(url, properties)
        .await
        .map_err(|e| broker_error("rabbitmq", "connect", e))
}

/// The arguments of a quorum queue.
fn quorum() -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    args
}

/// Declares `queue` as a durable quorum queue (nothing happens if it exists with those
/// arguments).
pub async fn declare_quorum_queue(channel: &Channel, queue: &str) -> Result<(), Error> {
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    channel
        .queue_declare(queue, options, quorum())
        .await
        .map(drop)
        .map_err(|e| broker_error("rabbitmq", "declare queue", e))
}

/// A queue consumed as a [`Source`]; it reconnects by itself.
#[derive(Debug)]
pub struct Queue {
    url: String,
    queue: String,
    dead_letter: Arc<str>,
    declare: bool,
    prefetch: u16,
    /// The connection, the channel (in confirm mode, for dead letters) and the consumer.
    live: Option<(Connection, Channel, lapin::Consumer)>,
    /// Failed connection attempts in a row, for the pause before the next.
    failures: u32,
}

impl Queue {
    /// `queue` on the broker at `url`; messages that cannot be handled go to the queue
    /// `dead_letter`.
    pub fn new(
        url: impl Into<String>,
        queue: impl Into<String>,
        dead_letter: impl Into<String>,
    ) -> Queue {
        Queue {
            url: url.into(),
            queue: queue.into(),
            dead_letter: dead_letter.into().into(),
            declare: true,
            prefetch: 32,
            live: None,
            failures: 0,
        }
    }

    /// Whether the queues are declared (as quorum queues) when the source connects (default:
    /// yes).
    pub fn declare(mut self, declare: bool) -> Queue {
        self.declare = declare;
        self
    }

    async fn open(&mut self) -> Result<(), Error> {
        let conn = connect(&self.url).await?;
        let channel = conn
            .create_channel()
            .await
            .map_err(|e| broker_error("rabbitmq", "open channel", e))?;
        if self.declare {
            declare_quorum_queue(&channel, &self.queue).await?;
            declare_quorum_queue(&channel, &self.dead_letter).await?;
        }
        channel
            .basic_qos(self.prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| broker_error("rabbitmq", "qos", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| broker_error("rabbitmq", "confirm select", e))?;
        let consumer = channel
            .basic_consume(
                &self.queue,
                "",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| broker_error("rabbitmq", "consume", e))?;
        self.live = Some((conn, channel, consumer));
        Ok(())
    }
}

impl Source for Queue {
    fn start(&mut self, prefetch: u16) -> BoxFuture<'_, Result<(), Error>> {
        self.prefetch = prefetch;
        Box::pin(self.open())
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<Box<dyn Delivery>, Error>>> {
        Box::pin(async move {
            if self.live.is_none() {
                // A growing pause, so that a broker that is down is not hammered.
                let pause =
                    Duration::from_millis(100 << self.failures.min(4)).min(Duration::from_secs(2));
                tokio::time::sleep(pause).await;
                if let Err(e) = self.open().await {
                    self.failures += 1;
                    return Some(Err(e));
                }
                self.failures = 0;
            }
            let (_, channel, consumer) = self.live.as_mut().expect("connected above");
            match consumer.next().await {
                Some(Ok(delivery)) => Some(Ok(Box::new(AmqpDelivery::new(
                    delivery,
                    channel.clone(),
                    self.dead_letter.clone(),
                )) as Box<dyn Delivery>)),
                Some(Err(e)) => {
                    self.live = None;
                    Some(Err(broker_error("rabbitmq", "next delivery", e)))
                }
                None => {
                    self.live = None;
                    Some(Err(broker_error(
                        "rabbitmq",
                        "next delivery",
                        "the broker cancelled the consumer",
                    )))
                }
            }
        })
    }
}

fn header_text(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        AMQPValue::LongUInt(n) => n.to_string(),
        AMQPValue::Boolean(b) => b.to_string(),
        _ => return None,
    })
}

/// One AMQP delivery.
struct AmqpDelivery {
    delivery: lapin::message::Delivery,
    view: Message,
    channel: Channel,
    dead_letter: Arc<str>,
}

impl AmqpDelivery {
    fn new(
        mut delivery: lapin::message::Delivery,
        channel: Channel,
        dead_letter: Arc<str>,
    ) -> Self {
        let props = &delivery.properties;
        let headers = props
            .headers()
            .as_ref()
            .map(|t| {
                t.inner()
                    .iter()
                    .filter_map(|(k, v)| Some((k.to_string(), header_text(v)?)))
                    .collect()
            })
            .unwrap_or_default();
        let view = Message {
            id: props.message_id().as_ref().map(ShortString::to_string),
            subject: delivery.routing_key.to_string(),
            payload: std::mem::take(&mut delivery.data).into(),
            headers,
            redelivered: delivery.redelivered,
        };
        AmqpDelivery {
            delivery,
            view,
            channel,
            dead_letter,
        }
    }
}

impl Delivery for AmqpDelivery {
    fn message(&self) -> &Message {
        &self.view
    }

    fn ack(self: Box<Self>) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            self.delivery
                .ack(BasicAckOptions::default())
                .await
                .map(drop)
                .map_err(|e| broker_error("rabbitmq", "ack", e))
        })
    }

    fn nack(self: Box<Self>, delay: Duration) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let requeue = BasicNackOptions {
                requeue: true,
                ..Default::default()
            };
            self.delivery
                .nack(requeue)
                .await
                .map(drop)
                .map_err(|e| broker_error("rabbitmq", "nack", e))
        })
    }

    fn dead_letter(self: Box<Self>, reason: String) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            let mut headers = self
                .delivery
                .properties
                .headers()
                .clone()
                .unwrap_or_default();
            headers.insert(
                DEAD_LETTER_REASON.into(),
                AMQPValue::LongString(reason.into()),
            );
            headers.insert(
                "idem-original-routing-key".into(),
                AMQPValue::LongString(self.view.subject.as_str().into()),
            );
            let properties = self
                .delivery
                .properties
                .clone()
                .with_headers(headers)
                .with_delivery_mode(2);
            publish_confirmed(
                &self.channel,
                &self.dead_letter,
                &self.view.payload,
                properties,
            )
            .await?;
            self.delivery
                .ack(BasicAckOptions::default())
                .await
                .map(drop)
                .map_err(|e| broker_error("rabbitmq", "ack", e))
        })
    }
}

/// Publishes to `queue` through the default exchange on a channel in confirm mode, and waits
/// for the broker's confirm.
async fn publish_confirmed(
    channel: &Channel,
    queue: &str,
    payload: &[u8],
    properties: BasicProperties,
) -> Result<(), Error> {
    let options = BasicPublishOptions {
        mandatory: true,
        ..Default::default()
    };
    let confirm = channel
        .basic_publish("", queue, options, payload, properties)
        .await
        .map_err(|e| broker_error("rabbitmq", "publish", e))?
        .await
        .map_err(|e| broker_error("rabbitmq", "publish", e))?;
    match confirm {
        // A mandatory message that no queue took comes back with the ack.
        Confirmation::Ack(None) => Ok(()),
        Confirmation::Ack(Some(_)) => Err(broker_error(
            "rabbitmq",
            "publish",
            format!("no queue `{queue}` took the message"),
        )),
        Confirmation::Nack(_) => Err(broker_error(
            "rabbitmq",
            "publish",
            "the broker refused the message (nack)",
        )),
        Confirmation::NotRequested => Err(broker_error(
            "rabbitmq",
            "publish",
            "the channel is not in confirm mode",
        )),
    }
}

/// A producer with publisher confirms: [`Publisher::publish`] returns once the broker has the
/// message (for a quorum queue: once a majority of its replicas wrote it).
#[derive(Debug, Clone)]
pub struct Publisher {
    channel: Channel,
}

impl Publisher {
    /// A publisher on a new channel of `conn`, in confirm mode.
    pub async fn new(conn: &Connection) -> Result<Publisher, Error> {
        let channel = conn
            .create_channel()
            .await
            .map_err(|e| broker_error("rabbitmq", "open channel", e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| broker_error("rabbitmq", "confirm select", e))?;
        Ok(Publisher { channel })
    }

    /// The channel, to declare queues (`declare_quorum_queue`) or publish otherwise.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Publishes `payload` to `queue` (through the default exchange), persistent, with `id` as
    /// its `message_id` (the consumer's key), and waits for the broker's confirm.
    pub async fn publish(&self, queue: &str, id: &str, payload: &[u8]) -> Result<(), Error> {
        let properties = BasicProperties::default()
            .with_message_id(id.into())
            .with_delivery_mode(2);
        publish_confirmed(&self.channel, queue, payload, properties).await
    }
}
