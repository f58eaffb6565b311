//! The queue consumer on RabbitMQ (quorum queues): a consumer process killed with `kill -9`
//! mid-message, duplicates over two consumers, a poison message, and every connection closed by
//! the broker mid-stream. Needs `IDEM_TEST_POSTGRES_URL` and `IDEM_TEST_RABBITMQ_URL`; the last
//! test runs `rabbitmqctl` (on a virtual host of its own).

mod consume_common;

use consume_common::*;
use idem::consume::rabbitmq::{self, lapin, Publisher, Queue};
use idem::consume::DEAD_LETTER_REASON;
use lapin::options::{BasicGetOptions, QueueDeleteOptions};
use lapin::types::AMQPValue;
use std::time::Duration;

struct Rabbit {
    url: String,
    queue: String,
    dead: String,
    publisher: Publisher,
}

impl Kit for Rabbit {
    type Source = Queue;

    async fn open(url: &str, run: &str) -> Self {
        let conn = rabbitmq::connect(url).await.expect("connect to RabbitMQ");
        let publisher = Publisher::new(&conn).await.unwrap();
        let (queue, dead) = (
            format!("idem.consume.{run}"),
            format!("idem.consume.{run}.dead"),
        );
        for q in [&queue, &dead] {
            rabbitmq::declare_quorum_queue(publisher.channel(), q)
                .await
                .unwrap();
        }
        Rabbit {
            url: url.to_owned(),
            queue,
            dead,
            publisher,
        }
    }

    async fn source(&self, _member: &str) -> Queue {
        Queue::new(self.url.clone(), self.queue.clone(), self.dead.clone())
    }

    async fn publish(&self, id: &str, payload: &[u8]) {
        self.publisher
            .publish(&self.queue, id, payload)
            .await
            .expect("publish with a confirm");
    }

    async fn dead_letters(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let get = BasicGetOptions { no_ack: true };
        while let Some(msg) = self
            .publisher
            .channel()
            .basic_get(&self.dead, get)
            .await
            .unwrap()
        {
            let props = &msg.delivery.properties;
            let id = props
                .message_id()
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default();
            let reason = props
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(DEAD_LETTER_REASON).cloned())
                .map(|v| match v {
                    AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            out.push((id, reason));
        }
        out
    }

    async fn cleanup(&self) {
        for q in [&self.queue, &self.dead] {
            let _ = self
                .publisher
                .channel()
                .queue_delete(q, QueueDeleteOptions::default())
                .await;
        }
    }
}

async fn a_killed_consumer_s_message_runs_once_rabbitmq(pg: String, url: String) {
    a_killed_consumer_s_message_runs_once::<Rabbit>(pg, url).await
}

async fn duplicates_run_once_rabbitmq(pg: String, url: String) {
    duplicates_run_once::<Rabbit>(pg, url).await
}

async fn a_poison_message_is_dead_lettered_rabbitmq(pg: String, url: String) {
    a_poison_message_is_dead_lettered::<Rabbit>(pg, url).await
}

fn rabbitmqctl(args: &[&str]) {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .expect("run rabbitmqctl");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The broker closes every connection of the consumers' virtual host while 400 messages are
/// being consumed: the consumers reconnect, the messages whose acks were lost come back and
/// replay, and every effect happens once.
async fn consumers_resume_after_the_broker_closes_their_connections(url: String) {
    let run = run_name();
    let vhost = format!("idem-{run}");
    rabbitmqctl(&["add_vhost", &vhost]);
    rabbitmqctl(&["set_permissions", "-p", &vhost, "guest", ".*", ".*", ".*"]);
    let base = url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base);
    let url = format!("{base}/{vhost}");
    let kit = Rabbit::open(&url, &run).await;
    let n = 400;
    for i in 0..n {
        kit.publish(&format!("m-{i}"), format!("payload {i}").as_bytes())
            .await;
    }
    let effects = Effects::default();
    let idem = idem::Idem::memory();
    let work = Duration::from_millis(200);
    let a = spawn_consumer::<Rabbit>(&idem, &run, kit.source("a").await, effects.clone(), work);
    let b = spawn_consumer::<Rabbit>(&idem, &run, kit.source("b").await, effects.clone(), work);
    wait_until(Duration::from_secs(30), "a first part handled", || {
        effects.distinct() >= n / 5
    })
    .await;
    let vh = vhost.clone();
    tokio::task::spawn_blocking(move || {
        rabbitmqctl(&[
            "close_all_connections",
            "--vhost",
            &vh,
            "--limit",
            "100",
            "test: connections dropped",
        ])
    })
    .await
    .unwrap();
    let before = effects.distinct();
    let progress = || {
        let s = |s: &idem::consume::Stats| {
            (
                s.processed(),
                s.replayed(),
                s.in_progress(),
                s.broker_errors(),
            )
        };
        format!(
            "{} of {n} handled; a {:?}, b {:?}",
            effects.distinct(),
            s(&a.stats),
            s(&b.stats)
        )
    };
    try_wait_until(Duration::from_secs(30), "every message handled", || {
        effects.distinct() >= n
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", progress()));
    let (a, b) = (a.stop().await, b.stop().await);
    let counts = effects.snapshot();
    assert_eq!(counts.len(), n);
    assert!(counts.values().all(|&c| c == 1), "effects not once");
    assert!(
        before < n,
        "the drop came mid-stream ({before} of {n} done)"
    );
    assert!(
        a.broker_errors() + b.broker_errors() > 0,
        "the consumers saw their connections go"
    );
    tokio::task::spawn_blocking(move || rabbitmqctl(&["delete_vhost", &vhost]))
        .await
        .unwrap();
}

fn main() -> std::process::ExitCode {
    if let Some(code) = child_main::<Rabbit>() {
        return code;
    }
    use idem_integration::harness::{trial, POSTGRES_AND_RABBITMQ, RABBITMQ};
    idem_integration::harness::run(vec![
        trial(
            POSTGRES_AND_RABBITMQ,
            "a_killed_consumer_s_message_runs_once",
            a_killed_consumer_s_message_runs_once_rabbitmq,
        ),
        trial(
            POSTGRES_AND_RABBITMQ,
            "duplicates_run_once",
            duplicates_run_once_rabbitmq,
        ),
        trial(
            POSTGRES_AND_RABBITMQ,
            "a_poison_message_is_dead_lettered",
            a_poison_message_is_dead_lettered_rabbitmq,
        ),
        trial(
            RABBITMQ,
            "consumers_resume_after_the_broker_closes_their_connections",
            consumers_resume_after_the_broker_closes_their_connections,
        ),
    ])
}
