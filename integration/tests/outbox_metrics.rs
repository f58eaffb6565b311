//! Features `outbox` and `metrics`, against a real PostgreSQL: the outbox's gauges
//! (`idem_outbox_pending`, `idem_outbox_dead`, `idem_outbox_oldest_pending_seconds`, label
//! `table`) read back from a recording `metrics::Recorder` after enqueuing and after
//! dead-lettering — set by `Outbox::report_metrics()` and by a running relay — and the relay's
//! `idem_outbox_messages_total{table, outcome}`.
//!
//! One test only: the recorder is process-wide.

mod pg_common;

use idem::outbox::{Message, Outbox, Relay, RelayOptions};
use idem_integration::outbox::RefusesSome;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use pg_common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Value(AtomicU64);

impl CounterFn for Value {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::Relaxed);
    }
}

impl GaugeFn for Value {
    fn increment(&self, value: f64) {
        self.set(self.get() + value);
    }
    fn decrement(&self, value: f64) {
        self.set(self.get() - value);
    }
    fn set(&self, value: f64) {
        self.0.store(value.to_bits(), Ordering::Relaxed);
    }
}

impl Value {
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

struct NoHistogram;
impl HistogramFn for NoHistogram {
    fn record(&self, _: f64) {}
}

/// Gauges and counters by `name{label=value,…}`.
#[derive(Default)]
struct Rec {
    counters: Mutex<HashMap<String, Arc<Value>>>,
    gauges: Mutex<HashMap<String, Arc<Value>>>,
}

fn id(key: &Key) -> String {
    let labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl Recorder for &'static Rec {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let v = self
            .counters
            .lock()
            .unwrap()
            .entry(id(key))
            .or_default()
            .clone();
        Counter::from_arc(v)
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let v = self
            .gauges
            .lock()
            .unwrap()
            .entry(id(key))
            .or_default()
            .clone();
        Gauge::from_arc(v)
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(NoHistogram))
    }
}

impl Rec {
    fn gauge(&self, name: &str, table: &str) -> Option<f64> {
        let id = format!("{name}{{table={table}}}");
        self.gauges.lock().unwrap().get(&id).map(|v| v.get())
    }
    fn counter(&self, name: &str, table: &str, outcome: &str) -> u64 {
        let id = format!("{name}{{table={table},outcome={outcome}}}");
        self.counters
            .lock()
            .unwrap()
            .get(&id)
            .map_or(0, |v| v.0.load(Ordering::Relaxed))
    }
}

async fn the_outbox_gauges_follow_enqueues_and_dead_letters(url: String) {
    let rec: &'static Rec = Box::leak(Box::default());
    metrics::set_global_recorder(rec).expect("the only recorder of this process");
    let admin = admin(&url).await;
    let table = unique_table("obx_metrics");
    let outbox = Outbox::with_table(admin.clone(), &table)
        .unwrap()
        .migrate()
        .await
        .unwrap();
    let (pending, dead, oldest) = (
        "idem_outbox_pending",
        "idem_outbox_dead",
        "idem_outbox_oldest_pending_seconds",
    );

    // Nothing enqueued: zeros.
    outbox.report_metrics().await.unwrap();
    assert_eq!(rec.gauge(pending, &table), Some(0.0));
    assert_eq!(rec.gauge(dead, &table), Some(0.0));
    assert_eq!(rec.gauge(oldest, &table), Some(0.0));

    // Three committed messages (one to be refused), one rolled back.
    for (i, topic) in ["order.placed", "refused", "order.placed"]
        .iter()
        .enumerate()
    {
        let mut tx = admin.begin().await.unwrap();
        let m = Message::new(*topic, b"x".to_vec())
            .ordering_key(format!("k{i}"))
            .id(format!("m{i}"));
        outbox.enqueue(&mut tx, m).await.unwrap();
        tx.commit().await.unwrap();
    }
    let mut tx = admin.begin().await.unwrap();
    outbox
        .enqueue(
            &mut tx,
            Message::new("order.placed", b"x".to_vec()).id("rolled-back"),
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    tokio::time::sleep(Duration::from_millis(30)).await;
    let stats = outbox.report_metrics().await.unwrap();
    assert_eq!(stats.pending, 3);
    assert_eq!(rec.gauge(pending, &table), Some(3.0));
    assert_eq!(rec.gauge(dead, &table), Some(0.0));
    let age = rec.gauge(oldest, &table).unwrap();
    assert!((0.03..60.0).contains(&age), "oldest pending age {age}");

    // A relay with max_attempts 1: two delivered, one dead. It sets the gauges itself after
    // its rounds, and counts what it handled.
    let relay = Relay::start(
        &outbox,
        RefusesSome,
        RelayOptions::default()
            .max_attempts(1)
            .metrics_every(Duration::from_millis(50)),
    );
    let mut waited = 0;
    while !(rec.gauge(pending, &table) == Some(0.0) && rec.gauge(dead, &table) == Some(1.0)) {
        assert!(
            waited < 10_000,
            "the relay did not set the gauges: pending {:?}, dead {:?}",
            rec.gauge(pending, &table),
            rec.gauge(dead, &table)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 20;
    }
    assert_eq!(rec.gauge(oldest, &table), Some(0.0));
    let total = "idem_outbox_messages_total";
    assert_eq!(rec.counter(total, &table, "delivered"), 2);
    assert_eq!(rec.counter(total, &table, "dead"), 1);
    assert_eq!(rec.counter(total, &table, "failed"), 0);
    relay.stop().await;

    // The dead letter retried: pending again, no dead letter.
    assert_eq!(outbox.retry_dead(Some("m1")).await.unwrap(), 1);
    outbox.report_metrics().await.unwrap();
    assert_eq!(rec.gauge(pending, &table), Some(1.0));
    assert_eq!(rec.gauge(dead, &table), Some(0.0));
    drop_table(&admin, &table).await;
}

idem_integration::server_tests! {
    POSTGRES => [the_outbox_gauges_follow_enqueues_and_dead_letters],
}
