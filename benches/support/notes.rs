//! Figures a bench measures outside criterion, written where `examples/bench_report.rs` finds
//! them (`target/criterion/idem-notes/`) and appends them to `docs/benchmarks.md`.

use std::path::PathBuf;

/// Writes `text` as the note `name` and prints it.
pub fn write_note(name: &str, text: &str) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| "target".into());
    let dir = target.join("criterion").join("idem-notes");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(name), text);
    }
    println!("{text}");
}
