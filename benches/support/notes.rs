//! Figures a bench measures outside criterion, written where `benches/bench_report.rs` finds
//! them (`target/criterion/idem-notes/`) and appends them to `docs/benchmarks.md`.

use std::path::PathBuf;

/// Writes `text` as the note `name` and prints it.
pub fn write_note(name: &str, text: &str) {
    // `cargo bench` runs a bench in its package's directory (benches/): the workspace's target
    // directory is one up.
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("criterion").join("idem-notes");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join(name), text);
    }
    println!("{text}");
}
