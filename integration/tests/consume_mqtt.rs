//! The queue consumer on MQTT 5 (QoS 1, persistent sessions, a shared subscription for two
//! consumers): a consumer process killed with `kill -9` mid-message and its session taken up
//! by a replacement with the same client id, duplicates over two consumers, a poison message,
//! and a broker of the test's own restarted mid-stream. Needs `IDEM_TEST_POSTGRES_URL` and
//! `IDEM_TEST_MQTT_URL`; the restart needs `mosquitto` on the PATH.

mod consume_common;

use consume_common::*;
use idem::consume::mqtt::{self, rumqttc, Subscription, MESSAGE_ID};
use idem::consume::DEAD_LETTER_REASON;
use rumqttc::v5::mqttbytes::v5::Packet;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, MqttOptions};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Mqtt {
    host: String,
    port: u16,
    run: String,
    topic: String,
    dead_topic: String,
    publisher: AsyncClient,
    sent: AtomicUsize,
    acked: Arc<AtomicUsize>,
    dead: Arc<Mutex<Vec<(String, String)>>>,
}

fn host_port(url: &str) -> (String, u16) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.split('/').next().unwrap();
    let (host, port) = rest.rsplit_once(':').unwrap_or((rest, "1883"));
    (host.to_owned(), port.parse().unwrap())
}

impl Mqtt {
    fn options(&self, client_id: &str) -> MqttOptions {
        let mut options = MqttOptions::new(client_id, self.host.clone(), self.port);
        options.set_keep_alive(Duration::from_secs(5));
        options.set_session_expiry_interval(Some(3600));
        options
    }

    fn filter(&self) -> String {
        format!("$share/{}/{}", self.run, self.topic)
    }
}

/// A client whose event loop runs on a task until it disconnects; `on` sees every incoming
/// packet.
fn client(options: MqttOptions, on: impl Fn(&AsyncClient, Packet) + Send + 'static) -> AsyncClient {
    let (client, mut events) = AsyncClient::new(options, 64);
    let c = client.clone();
    tokio::spawn(async move {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(packet)) => on(&c, packet),
                // Polling on would connect again, and take the session back from its consumer.
                Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                Ok(_) => {}
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    });
    client
}

impl Kit for Mqtt {
    type Source = Subscription;

    async fn open(url: &str, run: &str) -> Self {
        let (host, port) = host_port(url);
        let topic = format!("idem/consume/{run}");
        let dead_topic = format!("{topic}/dead");
        let acked = Arc::new(AtomicUsize::new(0));
        let counter = acked.clone();
        let publisher = client(
            MqttOptions::new(format!("{run}-pub"), host.clone(), port),
            move |_, p| {
                if let Packet::PubAck(_) = p {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            },
        );
        let dead = Arc::new(Mutex::new(Vec::new()));
        let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel::<()>();
        let subscribed_tx = Mutex::new(Some(subscribed_tx));
        let collected = dead.clone();
        let collector = client(
            MqttOptions::new(format!("{run}-dlq"), host.clone(), port),
            move |_, p| match p {
                Packet::SubAck(_) => {
                    if let Some(tx) = subscribed_tx.lock().unwrap().take() {
                        let _ = tx.send(());
                    }
                }
                Packet::Publish(p) => {
                    let props = p.properties.map(|p| p.user_properties).unwrap_or_default();
                    let get = |name: &str| {
                        props
                            .iter()
                            .find(|(k, _)| k == name)
                            .map(|(_, v)| v.clone())
                            .unwrap_or_default()
                    };
                    collected
                        .lock()
                        .unwrap()
                        .push((get(MESSAGE_ID), get(DEAD_LETTER_REASON)));
                }
                _ => {}
            },
        );
        collector
            .subscribe(dead_topic.clone(), QoS::AtLeastOnce)
            .await
            .unwrap();
        tokio::time::timeout(Duration::from_secs(10), subscribed)
            .await
            .expect("subscribed to the dead letters")
            .unwrap();
        Mqtt {
            host,
            port,
            run: run.to_owned(),
            topic,
            dead_topic,
            publisher,
            sent: AtomicUsize::new(0),
            acked,
            dead,
        }
    }

    /// Each member's session subscribes once, then goes offline: what is published from then
    /// on waits in its session.
    async fn prepare(&self, members: &[&str]) {
        for member in members {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let tx = Mutex::new(Some(tx));
            let c = client(
                self.options(&format!("{}-{member}", self.run)),
                move |_, p| {
                    if let Packet::SubAck(_) = p {
                        if let Some(tx) = tx.lock().unwrap().take() {
                            let _ = tx.send(());
                        }
                    }
                },
            );
            c.subscribe(self.filter(), QoS::AtLeastOnce).await.unwrap();
            tokio::time::timeout(Duration::from_secs(10), rx)
                .await
                .expect("subscribed")
                .unwrap();
            c.disconnect().await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn source(&self, member: &str) -> Subscription {
        Subscription::new(
            self.options(&format!("{}-{member}", self.run)),
            self.filter(),
            self.dead_topic.clone(),
        )
    }

    async fn publish(&self, id: &str, payload: &[u8]) {
        let sent = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        mqtt::publish(&self.publisher, &self.topic, id, payload.to_vec())
            .await
            .unwrap();
        let start = std::time::Instant::now();
        while self.acked.load(Ordering::SeqCst) < sent {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no PUBACK within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn dead_letters(&self) -> Vec<(String, String)> {
        self.dead.lock().unwrap().clone()
    }
}

async fn a_killed_consumer_s_message_runs_once_mqtt(pg: String, url: String) {
    a_killed_consumer_s_message_runs_once::<Mqtt>(pg, url).await
}

async fn duplicates_run_once_mqtt(pg: String, url: String) {
    duplicates_run_once::<Mqtt>(pg, url).await
}

async fn a_poison_message_is_dead_lettered_mqtt(pg: String, url: String) {
    a_poison_message_is_dead_lettered::<Mqtt>(pg, url).await
}

/// A Mosquitto of the test's own, with persistence, on a free port.
struct Broker {
    dir: tempfile::TempDir,
    port: u16,
    child: Option<std::process::Child>,
}

impl Broker {
    fn start() -> Broker {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        // Mosquitto started as root runs as the `mosquitto` user, which must write its database.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n",
            dir.path().display()
        );
        std::fs::write(dir.path().join("mosquitto.conf"), conf).unwrap();
        let mut broker = Broker {
            dir,
            port,
            child: None,
        };
        broker.up();
        broker
    }

    fn up(&mut self) {
        let child = std::process::Command::new("mosquitto")
            .arg("-c")
            .arg(self.dir.path().join("mosquitto.conf"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start mosquitto");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("mosquitto did not listen on {}", self.port);
    }

    /// Stops it with SIGTERM, so that it saves its sessions.
    fn down(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status();
            child.wait().unwrap();
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The broker restarts while 400 messages are being consumed by two sessions: the consumers
/// reconnect, their sessions resume with what was not acked, and every effect happens once.
async fn consumers_resume_after_the_broker_restarts() {
    let mut broker = Broker::start();
    let url = format!("mqtt://127.0.0.1:{}", broker.port);
    let run = run_name();
    let kit = Mqtt::open(&url, &run).await;
    kit.prepare(&["a", "b"]).await;
    let n = 400;
    for i in 0..n {
        kit.publish(&format!("m-{i}"), format!("payload {i}").as_bytes())
            .await;
    }
    let effects = Effects::default();
    let idem = idem::Idem::memory();
    let work = Duration::from_millis(200);
    let a = spawn_consumer::<Mqtt>(&idem, &run, kit.source("a").await, effects.clone(), work);
    let b = spawn_consumer::<Mqtt>(&idem, &run, kit.source("b").await, effects.clone(), work);
    wait_until(Duration::from_secs(30), "a first part handled", || {
        effects.distinct() >= n / 5
    })
    .await;
    broker.down();
    let before = effects.distinct();
    tokio::time::sleep(Duration::from_millis(500)).await;
    broker.up();
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
        "the restart came mid-stream ({before} of {n} done)"
    );
    assert!(
        a.broker_errors() + b.broker_errors() > 0,
        "the consumers saw the broker go"
    );
}

fn main() -> std::process::ExitCode {
    if let Some(code) = child_main::<Mqtt>() {
        return code;
    }
    use idem_integration::harness::{trial, MOSQUITTO_SERVER, POSTGRES_AND_MQTT};
    idem_integration::harness::run(vec![
        trial(
            POSTGRES_AND_MQTT,
            "a_killed_consumer_s_message_runs_once",
            a_killed_consumer_s_message_runs_once_mqtt,
        ),
        trial(
            POSTGRES_AND_MQTT,
            "duplicates_run_once",
            duplicates_run_once_mqtt,
        ),
        trial(
            POSTGRES_AND_MQTT,
            "a_poison_message_is_dead_lettered",
            a_poison_message_is_dead_lettered_mqtt,
        ),
        trial(
            MOSQUITTO_SERVER,
            "consumers_resume_after_the_broker_restarts",
            consumers_resume_after_the_broker_restarts,
        ),
    ])
}
