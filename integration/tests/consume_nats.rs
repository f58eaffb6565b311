//! The queue consumer on NATS JetStream: a consumer process killed with `kill -9` mid-message,
//! duplicates over two consumers, a poison message. Needs `IDEM_TEST_POSTGRES_URL` and
//! `IDEM_TEST_NATS_URL`.
//!
//! The messages carry their id in a header of the test's own (`idem-test-id`), the consumer's
//! key: a second publish with the same `Nats-Msg-Id` would be dropped by JetStream itself.

mod consume_common;

use async_nats::jetstream::{self, consumer::pull, stream};
use consume_common::*;
use idem::consume::nats::{async_nats, JetStream};
use idem::consume::{Message, DEAD_LETTER_REASON};
use std::time::Duration;

const ID: &str = "idem-test-id";

struct Nats {
    js: jetstream::Context,
    stream: String,
    dead_stream: String,
    subject: String,
}

impl Kit for Nats {
    type Source = JetStream;

    async fn open(url: &str, run: &str) -> Self {
        let js = jetstream::new(async_nats::connect(url).await.expect("connect to NATS"));
        let (stream, dead_stream) = (
            format!("IDEM_CONSUME_{run}"),
            format!("IDEM_CONSUME_{run}_DEAD"),
        );
        let (subject, dead) = (
            format!("idem.consume.{run}"),
            format!("idem.consume.{run}.dead"),
        );
        for (name, subject) in [(&stream, &subject), (&dead_stream, &dead)] {
            js.get_or_create_stream(stream::Config {
                name: name.clone(),
                subjects: vec![subject.clone()],
                storage: stream::StorageType::Memory,
                ..Default::default()
            })
            .await
            .unwrap();
        }
        Nats {
            js,
            stream,
            dead_stream,
            subject,
        }
    }

    async fn source(&self, _member: &str) -> JetStream {
        let stream = self.js.get_stream(&self.stream).await.unwrap();
        let consumer = stream
            .get_or_create_consumer(
                "workers",
                pull::Config {
                    durable_name: Some("workers".into()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    // A killed consumer's message comes back after this.
                    ack_wait: Duration::from_secs(2),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        JetStream::new(self.js.clone(), consumer, format!("{}.dead", self.subject))
    }

    async fn publish(&self, id: &str, payload: &[u8]) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(ID, id);
        self.js
            .publish_with_headers(self.subject.clone(), headers, payload.to_vec().into())
            .await
            .unwrap()
            .await
            .expect("the stream's ack");
    }

    fn key(message: &Message) -> Option<String> {
        message.header(ID).map(str::to_owned)
    }

    async fn dead_letters(&self) -> Vec<(String, String)> {
        let mut stream = self.js.get_stream(&self.dead_stream).await.unwrap();
        let last = stream.info().await.unwrap().state.last_sequence;
        let mut out = Vec::new();
        for seq in 1..=last {
            if let Ok(msg) = stream.get_raw_message(seq).await {
                let header = |name: &str| {
                    msg.headers
                        .get(name)
                        .map(|v| v.as_str().to_owned())
                        .unwrap_or_default()
                };
                out.push((header(ID), header(DEAD_LETTER_REASON)));
            }
        }
        out
    }

    async fn cleanup(&self) {
        let _ = self.js.delete_stream(&self.stream).await;
        let _ = self.js.delete_stream(&self.dead_stream).await;
    }
}

async fn a_killed_consumer_s_message_runs_once_nats(pg: String, url: String) {
    a_killed_consumer_s_message_runs_once::<Nats>(pg, url).await
}

async fn duplicates_run_once_nats(pg: String, url: String) {
    duplicates_run_once::<Nats>(pg, url).await
}

async fn a_poison_message_is_dead_lettered_nats(pg: String, url: String) {
    a_poison_message_is_dead_lettered::<Nats>(pg, url).await
}

fn main() -> std::process::ExitCode {
    if let Some(code) = child_main::<Nats>() {
        return code;
    }
    use idem_integration::harness::{trial, POSTGRES_AND_NATS};
    idem_integration::harness::run(vec![
        trial(
            POSTGRES_AND_NATS,
            "a_killed_consumer_s_message_runs_once",
            a_killed_consumer_s_message_runs_once_nats,
        ),
        trial(
            POSTGRES_AND_NATS,
            "duplicates_run_once",
            duplicates_run_once_nats,
        ),
        trial(
            POSTGRES_AND_NATS,
            "a_poison_message_is_dead_lettered",
            a_poison_message_is_dead_lettered_nats,
        ),
    ])
}
