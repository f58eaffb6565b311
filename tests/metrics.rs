//! Feature `metrics`: `idem_calls_total{name, outcome}` per outcome,
//! `idem_store_latency_seconds{backend, op}` per store step, and the reaper's
//! `idem_live_claims` gauge and `idem_reaper_purged_total` counter, read back from a small
//! recording `metrics::Recorder`.
//!
//! One test only: the recorder is process-wide and the live-claims gauge counts every call of
//! the process, so nothing else may run beside it.

use idem::{Error, Idem};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Samples(Mutex<Vec<f64>>);

impl HistogramFn for Samples {
    fn record(&self, value: f64) {
        self.0.lock().unwrap().push(value);
    }
}

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

/// Every metric by `name{label=value,…}` (labels in the order given).
#[derive(Default)]
struct Rec {
    counters: Mutex<HashMap<String, Arc<Value>>>,
    gauges: Mutex<HashMap<String, Arc<Value>>>,
    histograms: Mutex<HashMap<String, Arc<Samples>>>,
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
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let v = self
            .histograms
            .lock()
            .unwrap()
            .entry(id(key))
            .or_default()
            .clone();
        Histogram::from_arc(v)
    }
}

impl Rec {
    fn counter(&self, id: &str) -> u64 {
        self.counters
            .lock()
            .unwrap()
            .get(id)
            .map_or(0, |v| v.0.load(Ordering::Relaxed))
    }
    fn gauge(&self, id: &str) -> Option<f64> {
        self.gauges.lock().unwrap().get(id).map(|v| v.get())
    }
    fn samples(&self, id: &str) -> Vec<f64> {
        self.histograms
            .lock()
            .unwrap()
            .get(id)
            .map_or_else(Vec::new, |s| s.0.lock().unwrap().clone())
    }
}

/// Waits up to 2 s for `cond`.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_latency_and_live_claims() {
    let rec: &'static Rec = Box::leak(Box::default());
    metrics::set_global_recorder(rec).unwrap_or_else(|_| panic!("a recorder is installed"));
    let idem = Idem::memory();
    let name = "metrics.charge";
    let calls = |outcome: &str| {
        rec.counter(&format!(
            "idem_calls_total{{name={name},outcome={outcome}}}"
        ))
    };

    // claimed, replayed, mismatch, released
    let call = |fp: u8| idem.call(name).key("k1").fingerprint(&fp);
    call(1).run(async { Ok::<_, Error>(1u8) }).await.unwrap();
    assert!(call(1)
        .run(async { Ok::<_, Error>(2u8) })
        .await
        .unwrap()
        .is_replayed());
    let other = call(2).run(async { Ok::<_, Error>(3u8) }).await;
    assert!(matches!(other, Err(Error::Mismatch { .. })), "{other:?}");
    for _ in 0..2 {
        let failed = idem
            .call(name)
            .key("k2")
            .run(async { Err::<u8, _>(Error::Config("declined".into())) })
            .await;
        assert!(failed.is_err());
    }
    assert_eq!(calls("claimed"), 1);
    assert_eq!(calls("replayed"), 1);
    assert_eq!(calls("mismatch"), 1);
    assert_eq!(calls("released"), 2);

    // A step is counted under its own name, not its parent's key.
    idem.call("metrics.parent")
        .key("p")
        .run(async {
            idem.call("metrics.step")
                .step()
                .key("s")
                .run(async { Ok::<_, Error>(()) })
                .await
                .map(idem::Outcome::into_inner)
        })
        .await
        .unwrap();
    assert_eq!(
        rec.counter("idem_calls_total{name=metrics.step,outcome=claimed}"),
        1
    );
    assert!(
        rec.counters
            .lock()
            .unwrap()
            .keys()
            .all(|k| !k.contains('/')),
        "no parent key in a name label"
    );

    // Store round trips: 7 claims (3 on k1, 2 on k2, parent, step), 3 completes, 2 releases.
    let claims = rec.samples("idem_store_latency_seconds{backend=memory,op=claim}");
    assert_eq!(claims.len(), 7, "{claims:?}");
    assert!(claims.iter().all(|s| (0.0..1.0).contains(s)), "{claims:?}");
    assert_eq!(
        rec.samples("idem_store_latency_seconds{backend=memory,op=complete}")
            .len(),
        3
    );
    assert_eq!(
        rec.samples("idem_store_latency_seconds{backend=memory,op=release}")
            .len(),
        2
    );

    // The reaper: a gauge of the claims this process holds, refreshed at every tick.
    let reaper = idem.spawn_reaper(Duration::from_millis(20));
    let gate = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (idem, gate) = (idem.clone(), gate.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("held")
                .lease(Duration::from_millis(90))
                .ttl(Duration::from_millis(1))
                .run(async move {
                    gate.notified().await;
                    Ok::<_, Error>(())
                })
                .await
        })
    };
    eventually("idem_live_claims = 1", || {
        rec.gauge("idem_live_claims{}") == Some(1.0)
    })
    .await;
    // While it holds the key, the heartbeat renews it (every lease / 3 = 30 ms).
    eventually("a renewal", || {
        !rec.samples("idem_store_latency_seconds{backend=memory,op=renew}")
            .is_empty()
    })
    .await;
    gate.notify_one();
    running.await.unwrap().unwrap();
    eventually("idem_live_claims = 0", || {
        rec.gauge("idem_live_claims{}") == Some(0.0)
    })
    .await;
    // Its 1 ms TTL lapsed: the reaper purges the record.
    eventually("a purge", || rec.counter("idem_reaper_purged_total{}") >= 1).await;
    assert!(!rec
        .samples("idem_store_latency_seconds{backend=memory,op=purge}")
        .is_empty());
    drop(reaper);
}
