//! Counts the statements a call sends to SQLite. Alone in its binary: it installs a global
//! tracing subscriber and must see no other test's statements.
#![cfg(feature = "sqlite")]

use idem::{Error, Idem, Outcome};
use std::sync::{Arc, Mutex};

fn temp_db(tag: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "sqlite://{}",
        dir.path().join(format!("{tag}.db")).display()
    );
    (dir, url)
}

/// Records the statements sqlx executes (sqlx logs each one as a tracing event with target
/// `sqlx::query`, on its SQLite worker thread, hence a global subscriber and a binary of its own), so the count is the real number of statements sent.
struct StatementLog(Arc<Mutex<Vec<String>>>);

impl tracing::Subscriber for StatementLog {
    fn enabled(&self, m: &tracing::Metadata<'_>) -> bool {
        m.target() == "sqlx::query"
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        struct Statement(Option<String>);
        impl tracing::field::Visit for Statement {
            fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
                if f.name() == "db.statement" || (f.name() == "summary" && self.0.is_none()) {
                    self.0 = Some(format!("{v:?}"));
                }
            }
            fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
                if f.name() == "db.statement" || (f.name() == "summary" && self.0.is_none()) {
                    self.0 = Some(v.to_string());
                }
            }
        }
        let mut s = Statement(None);
        e.record(&mut s);
        self.0.lock().unwrap().push(s.0.unwrap_or_default());
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn verbs(log: &Mutex<Vec<String>>) -> Vec<String> {
    let mut log = log.lock().unwrap();
    let out = log
        .iter()
        .map(|s| {
            s.trim_start_matches('"')
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_uppercase()
        })
        .collect();
    log.clear();
    out
}

#[test]
fn a_fresh_call_is_two_writes_and_a_replay_one_read() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (_dir, url) = temp_db("count");
    // One connection, so that opening a second one (its set-up PRAGMAs) is not counted.
    let store = idem::store::sqlite::SqliteOptions::from_url(&url)
        .unwrap()
        .max_connections(1);
    let idem = Idem::from_store(rt.block_on(store.connect()).unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    tracing::subscriber::set_global_default(StatementLog(log.clone())).unwrap();
    verbs(&log);
    let call = || {
        idem.call("count")
            .key("k")
            .run(async { Ok::<_, Error>(1u8) })
    };
    // The pool opens its connection (and runs its set-up PRAGMAs) on first use: warm it up.
    let warm = idem
        .call("warm-up")
        .key("k")
        .run(async { Ok::<_, Error>(0u8) });
    rt.block_on(warm).unwrap();
    verbs(&log);
    assert_eq!(rt.block_on(call()).unwrap(), Outcome::Fresh(1));
    assert_eq!(
        verbs(&log),
        ["SELECT", "INSERT", "UPDATE"],
        "read, claim, complete"
    );
    assert_eq!(rt.block_on(call()).unwrap(), Outcome::Replayed(1));
    assert_eq!(verbs(&log), ["SELECT"], "a replay is one read");
}
