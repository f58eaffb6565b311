//! The `idem.call` span and its outcome events, captured by a small recording subscriber: one
//! span per call with its name, store, key prefix, token, outcome and store latency, for every
//! outcome; and never the raw key or an argument value in any span or event field.
//!
//! The subscriber is process-wide (calls hop worker threads), so every test uses its own
//! namespace and looks only at the spans of that namespace.

use idem::{idempotent, Error, Idem};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Values that must never reach a trace: the test's keys, scope and argument values.
const SECRETS: &[&str] = &[
    "SECRET-KEY-4242",
    "ARGVAL-card-9911",
    "ARGVAL-scope-5150",
    "SECRET-CARD-4242",
];

#[derive(Debug, Clone)]
struct SpanRec {
    name: &'static str,
    level: Level,
    fields: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
struct EventRec {
    level: Level,
    span: Option<u64>,
    fields: BTreeMap<String, String>,
}

#[derive(Default)]
struct Capture {
    next: AtomicU64,
    spans: Mutex<HashMap<u64, SpanRec>>,
    events: Mutex<Vec<EventRec>>,
}

thread_local! {
    /// The spans entered on this thread, innermost last: an event's contextual parent.
    static STACK: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_string(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().to_string(), v.to_string());
    }
    fn record_u64(&mut self, f: &Field, v: u64) {
        self.0.insert(f.name().to_string(), v.to_string());
    }
}

impl Subscriber for &'static Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let rec = SpanRec {
            name: attrs.metadata().name(),
            level: *attrs.metadata().level(),
            fields,
        };
        self.spans.lock().unwrap().insert(id, rec);
        Id::from_u64(id)
    }
    fn record(&self, id: &Id, values: &Record<'_>) {
        if let Some(s) = self.spans.lock().unwrap().get_mut(&id.into_u64()) {
            values.record(&mut Fields(&mut s.fields));
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, e: &Event<'_>) {
        let mut fields = BTreeMap::new();
        e.record(&mut Fields(&mut fields));
        let span = match e.parent() {
            Some(id) => Some(id.into_u64()),
            None if e.is_contextual() => STACK.with(|s| s.borrow().last().copied()),
            None => None,
        };
        self.events.lock().unwrap().push(EventRec {
            level: *e.metadata().level(),
            span,
            fields,
        });
    }
    fn enter(&self, id: &Id) {
        STACK.with(|s| s.borrow_mut().push(id.into_u64()));
    }
    fn exit(&self, id: &Id) {
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            if let Some(at) = s.iter().rposition(|x| *x == id.into_u64()) {
                s.remove(at);
            }
        });
    }
}

fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::default());
        tracing::subscriber::set_global_default(c).unwrap();
        c
    })
}

/// The `idem.call` spans of namespace `name`, oldest first.
fn spans(name: &str) -> Vec<(u64, SpanRec)> {
    let spans = capture().spans.lock().unwrap();
    let mut out: Vec<_> = spans
        .iter()
        .filter(|(_, s)| {
            s.name == "idem.call" && s.fields.get("idem.name").map(String::as_str) == Some(name)
        })
        .map(|(id, s)| (*id, s.clone()))
        .collect();
    out.sort_by_key(|(id, _)| *id);
    out
}

/// The events emitted inside span `id`, or carrying `idem.name = name`.
fn events(id: u64, name: &str) -> Vec<EventRec> {
    capture()
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            e.span == Some(id) || e.fields.get("idem.name").map(String::as_str) == Some(name)
        })
        .cloned()
        .collect()
}

fn field<'a>(s: &'a SpanRec, f: &str) -> &'a str {
    s.fields
        .get(f)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("span has no `{f}`: {s:?}"))
}

/// The common fields of a finished call's span.
fn assert_call_span(s: &SpanRec, store: &str, outcome: &str) {
    assert_eq!(s.level, Level::INFO, "{s:?}");
    assert_eq!(field(s, "idem.store"), store, "{s:?}");
    assert_eq!(field(s, "idem.outcome"), outcome, "{s:?}");
    let key = field(s, "idem.key");
    assert!(
        key.len() == 12 && key.bytes().all(|b| b.is_ascii_hexdigit()),
        "key prefix {key:?}"
    );
    field(s, "idem.store_latency_us")
        .parse::<u64>()
        .expect("store latency in microseconds");
}

/// No recorded span or event, of any test so far, holds a secret.
fn assert_no_secrets() {
    let spans = capture().spans.lock().unwrap();
    let events = capture().events.lock().unwrap();
    let all = spans
        .values()
        .flat_map(|s| s.fields.iter())
        .chain(events.iter().flat_map(|e| e.fields.iter()));
    for (k, v) in all {
        for secret in SECRETS {
            assert!(
                !k.contains(secret) && !v.contains(secret),
                "{secret} leaked into {k} = {v}"
            );
        }
    }
}

#[derive(Debug)]
enum Failure {
    // Read through `Debug` in assertion messages.
    #[allow(dead_code)]
    Idem(Error),
    Declined,
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Idem(e)
    }
}

/// The default key is every argument but `idem`: the card, the amount and the scope.
#[idempotent(store = idem, skip(idem), name = "trace.charge")]
async fn charge(card: String, amount: u64, idem: &Idem) -> Result<u64, Failure> {
    if amount == 0 {
        return Err(Failure::Declined);
    }
    Ok(amount)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claimed_replayed_mismatch_and_released_spans() {
    capture();
    let idem = Idem::memory();
    let name = "trace.basic";
    let mut seen_key = None;
    let first = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .scope("ARGVAL-scope-5150")
        .fingerprint(&("ARGVAL-card-9911", 1))
        .run(async {
            seen_key = idem::current_key();
            tracing::info!("inside the body");
            Ok::<_, Error>(1u32)
        })
        .await
        .unwrap();
    assert!(!first.is_replayed());
    let again = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .scope("ARGVAL-scope-5150")
        .fingerprint(&("ARGVAL-card-9911", 1))
        .run(async { Ok::<_, Error>(2u32) })
        .await
        .unwrap();
    assert!(again.is_replayed());
    let other = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .scope("ARGVAL-scope-5150")
        .fingerprint(&("ARGVAL-card-9911", 2))
        .run(async { Ok::<_, Error>(3u32) })
        .await;
    assert!(matches!(other, Err(Error::Mismatch { .. })), "{other:?}");

    let spans = spans(name);
    assert_eq!(spans.len(), 3, "one span per call: {spans:?}");
    let (claimed_id, claimed) = &spans[0];
    assert_call_span(claimed, "memory", "claimed");
    let full_key = seen_key.expect("current_key inside the body");
    assert!(full_key.starts_with(field(claimed, "idem.key")));
    assert!(field(claimed, "idem.token").parse::<u64>().unwrap() > 0);
    // The body's own events are inside the call's span.
    let inside = events(*claimed_id, name);
    assert!(inside
        .iter()
        .any(|e| e.fields.get("message").map(String::as_str) == Some("inside the body")));
    assert!(inside.iter().any(|e| e.level == Level::DEBUG
        && e.fields.get("idem.outcome").map(String::as_str) == Some("claimed")));

    let (_, replayed) = &spans[1];
    assert_call_span(replayed, "memory", "replayed");
    assert_eq!(field(replayed, "idem.key"), field(claimed, "idem.key"));
    assert!(
        !replayed.fields.contains_key("idem.token"),
        "a replay holds no token"
    );

    let (mismatch_id, mismatch) = &spans[2];
    assert_call_span(mismatch, "memory", "mismatch");
    assert!(events(*mismatch_id, name)
        .iter()
        .any(|e| e.level == Level::INFO
            && e.fields.get("idem.outcome").map(String::as_str) == Some("mismatch")));

    // Arguments in the default key: each `Err` releases the key, so the retry runs again.
    for _ in 0..2 {
        let declined = charge("ARGVAL-card-9911".into(), 0, &idem).await;
        assert!(matches!(declined, Err(Failure::Declined)), "{declined:?}");
    }
    charge("ARGVAL-card-9911".into(), 5, &idem).await.unwrap();
    let charges = self::spans("trace.charge");
    assert_eq!(charges.len(), 3, "{charges:?}");
    assert_call_span(&charges[0].1, "memory", "released");
    assert_call_span(&charges[1].1, "memory", "released");
    assert_call_span(&charges[2].1, "memory", "claimed");
    assert_eq!(
        field(&charges[0].1, "idem.key"),
        field(&charges[1].1, "idem.key")
    );
    assert_no_secrets();
}

fn boom() -> Result<(), Error> {
    panic!("body failed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_progress_panicked_and_dropped_spans() {
    capture();
    let idem = Idem::memory();
    let name = "trace.busy";
    let gate = Arc::new(tokio::sync::Notify::new());
    let running = {
        let (idem, gate) = (idem.clone(), gate.clone());
        tokio::spawn(async move {
            idem.call(name)
                .key("SECRET-KEY-4242")
                .run(async move {
                    gate.notified().await;
                    Ok::<_, Error>(1u8)
                })
                .await
        })
    };
    // Until the first call's span shows its token, it does not hold the key yet.
    while !spans(name)
        .first()
        .is_some_and(|(_, s)| s.fields.contains_key("idem.token"))
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .run(async { Ok::<_, Error>(2u8) })
        .await;
    assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    gate.notify_one();
    running.await.unwrap().unwrap();
    let busy_spans = spans(name);
    assert_eq!(busy_spans.len(), 2);
    assert_call_span(&busy_spans[0].1, "memory", "claimed");
    assert_call_span(&busy_spans[1].1, "memory", "in-progress");

    let panicky = "trace.panic";
    let panicked = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call(panicky)
                .key("SECRET-KEY-4242")
                .run(async { boom() })
                .await
        })
        .await
    };
    assert!(panicked.unwrap_err().is_panic());
    let p = spans(panicky);
    assert_eq!(p.len(), 1);
    assert_call_span(&p[0].1, "memory", "panicked");
    assert!(events(p[0].0, panicky)
        .iter()
        .any(|e| e.level == Level::WARN));

    let dropped = "trace.dropped";
    let timed_out = tokio::time::timeout(
        Duration::from_millis(50),
        idem.call(dropped)
            .key("SECRET-KEY-4242")
            .run(std::future::pending::<Result<(), Error>>()),
    )
    .await;
    assert!(timed_out.is_err());
    let d = spans(dropped);
    assert_eq!(d.len(), 1);
    assert_call_span(&d[0].1, "memory", "dropped");

    // A future dropped before its first poll did nothing, and reports nothing.
    let never = "trace.never-polled";
    drop(
        idem.call(never)
            .key("SECRET-KEY-4242")
            .run(async { Ok::<_, Error>(()) }),
    );
    assert!(spans(never).is_empty());
    assert_no_secrets();
}

/// As the conformance suite provokes it: the body blocks its thread past its lease, another
/// attempt takes the key over, and the stalled attempt's completion is fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_lost_is_a_warning() {
    capture();
    let idem = Idem::memory();
    let name = "trace.fenced";
    let lease = Duration::from_millis(200);
    let stalled = {
        let idem = idem.clone();
        tokio::spawn(async move {
            idem.call(name)
                .key("SECRET-KEY-4242")
                .lease(lease)
                .run(async move {
                    tokio::task::block_in_place(|| std::thread::sleep(Duration::from_millis(600)));
                    Ok::<_, Error>(1u8)
                })
                .await
        })
    };
    tokio::time::sleep(lease + Duration::from_millis(150)).await;
    let took_over = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .lease(lease)
        .run(async { Ok::<_, Error>(2u8) })
        .await
        .unwrap();
    assert!(!took_over.is_replayed());
    let lost = stalled.await.unwrap();
    assert!(matches!(lost, Err(Error::LeaseLost { .. })), "{lost:?}");

    let s = spans(name);
    assert_eq!(s.len(), 2, "{s:?}");
    let (lost_id, lost_span) = &s[0];
    assert_call_span(lost_span, "memory", "lease-lost");
    assert_call_span(&s[1].1, "memory", "claimed");
    assert!(
        field(&s[1].1, "idem.token").parse::<u64>().unwrap()
            > field(lost_span, "idem.token").parse::<u64>().unwrap(),
        "the take-over has a higher fencing token"
    );
    let warn = events(*lost_id, name)
        .into_iter()
        .find(|e| e.level == Level::WARN)
        .expect("a WARN event for the lost lease");
    // The warning stands on its own for subscribers that filter spans out.
    assert_eq!(warn.fields["idem.outcome"], "lease-lost");
    assert_eq!(warn.fields["idem.name"], name);
    assert_eq!(warn.fields["idem.key"], field(lost_span, "idem.key"));
    assert_eq!(warn.fields["idem.token"], field(lost_span, "idem.token"));
    assert_no_secrets();
}

/// A real store failure: the SQLite table is dropped under the store's feet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_error_is_a_warning_with_the_backend_message() {
    use sqlx::Connection;
    capture();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.db");
    let url = format!("sqlite://{}", path.display());
    let idem = Idem::sqlite(&url).await.unwrap();
    let name = "trace.store";
    idem.call(name)
        .key("SECRET-KEY-4242")
        .run(async { Ok::<_, Error>(1u8) })
        .await
        .unwrap();
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    sqlx::query("DROP TABLE idem_records")
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
    let failed = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .run(async { Ok::<_, Error>(2u8) })
        .await;
    assert!(matches!(failed, Err(Error::Store(_))), "{failed:?}");

    let s = spans(name);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_call_span(&s[0].1, "sqlite", "claimed");
    assert_call_span(&s[1].1, "sqlite", "store-error");
    assert!(!s[1].1.fields.contains_key("idem.token"));
    let warn = events(s[1].0, name)
        .into_iter()
        .find(|e| e.level == Level::WARN)
        .expect("a WARN event for the store error");
    assert_eq!(warn.fields["idem.outcome"], "store-error");
    assert_eq!(warn.fields["idem.token"], "-", "no token was held");
    assert!(
        warn.fields["error"].contains("sqlite store failed")
            && warn.fields["error"].contains("no such table"),
        "{warn:?}"
    );
    assert_no_secrets();
}

/// A key whose serialization fails (a custom `Serialize` that refuses, quoting a secret).
struct Unserializable;

impl serde::Serialize for Unserializable {
    fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("SECRET-KEY-4242 cannot be a key"))
    }
}

/// The two outcomes no store failure produces: a stored result that no longer decodes into
/// the return type (`codec-error`), and a key that cannot be serialized (`invalid`). Each is a
/// WARN event that names the kind of failure and never quotes the value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codec_error_and_invalid_key_are_warnings_without_values() {
    capture();
    let idem = Idem::memory();
    let name = "trace.codec";
    idem.call(name)
        .key("SECRET-KEY-4242")
        .run(async { Ok::<_, Error>("SECRET-CARD-4242".to_string()) })
        .await
        .unwrap();
    // The same key, the same (empty) arguments, another return type: the stored string does
    // not decode as a number.
    let changed = idem
        .call(name)
        .key("SECRET-KEY-4242")
        .run(async { Ok::<_, Error>(7u64) })
        .await;
    assert!(matches!(changed, Err(Error::Codec(_))), "{changed:?}");
    let s = spans(name);
    assert_eq!(s.len(), 2, "{s:?}");
    assert_call_span(&s[1].1, "memory", "codec-error");
    let warn = events(s[1].0, name)
        .into_iter()
        .find(|e| e.level == Level::WARN)
        .expect("a WARN event for the codec error");
    assert_eq!(warn.fields["idem.outcome"], "codec-error");
    assert!(warn.fields["type_name"].contains("u64"), "{warn:?}");

    let name = "trace.invalid";
    let bad = idem
        .call(name)
        .key(&Unserializable)
        .run(async { Ok::<_, Error>(1u8) })
        .await;
    assert!(matches!(bad, Err(Error::Key(_))), "{bad:?}");
    let s = spans(name);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(field(&s[0].1, "idem.outcome"), "invalid", "{s:?}");
    let warn = events(s[0].0, name)
        .into_iter()
        .find(|e| e.level == Level::WARN)
        .expect("a WARN event for the bad key");
    assert_eq!(warn.fields["idem.outcome"], "invalid");
    assert_no_secrets();
}

/// A replay served by the handle's local cache is the outcome `cached`, with no store time.
#[cfg(feature = "cache")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_replay_is_its_own_outcome() {
    capture();
    let idem = Idem::memory().with_cache(idem::CacheOptions::new());
    let name = "trace.cached";
    for _ in 0..2 {
        idem.call(name)
            .key("SECRET-KEY-7777")
            .run(async { Ok::<_, Error>(1u32) })
            .await
            .unwrap();
    }
    let spans = spans(name);
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_call_span(&spans[0].1, "memory", "claimed");
    assert_call_span(&spans[1].1, "memory", "cached");
    assert_eq!(field(&spans[1].1, "idem.store_latency_us"), "0");
}
