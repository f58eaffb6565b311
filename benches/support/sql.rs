//! What the SQL stores' benches (postgres.rs, mysql.rs) share: the calls' keys, idem's own
//! call, and the criterion groups with the same comparisons as paired ratios.

use super::{drive, notes, paired};
use criterion::{BenchmarkId, Criterion, Throughput};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Keys the replays read, stored before they run.
pub const REPLAY_KEYS: u64 = 1024;
/// Fresh keys count up from here, far from the replay keys.
static NEXT: AtomicU64 = AtomicU64::new(1 << 40);

#[derive(Clone, Copy)]
pub enum Mode {
    Fresh,
    Replay,
}

/// The key number of call `i`: a new one for a fresh call, one of the stored ones for a replay.
pub fn key_number(mode: Mode, i: u64) -> u64 {
    match mode {
        Mode::Fresh => NEXT.fetch_add(1, Ordering::Relaxed),
        Mode::Replay => i % REPLAY_KEYS,
    }
}

/// A raw key: a sha256 digest like idem's (spread over the primary key as idem's are), in a
/// namespace of its own.
pub fn raw_key(n: u64) -> [u8; 32] {
    idem::key::key_digest("raw-bench", None, &n.to_be_bytes()).0
}

/// idem's call `i`.
pub async fn idem_call(idem: &idem::Idem, mode: Mode, i: u64) {
    let n = key_number(mode, i);
    let out = idem
        .call("bench")
        .key(&n)
        .run(async move { Ok::<_, idem::Error>(n) })
        .await
        .unwrap();
    debug_assert_eq!(out.is_replayed(), matches!(mode, Mode::Replay));
}

/// Criterion groups `{store}/replay` and `{store}/fresh` of `variants` at concurrency 1, 16 and
/// 64 (replays first; the variants' order rotates with the concurrency, so none always runs
/// first), then the same comparisons as paired ratios, written as the note `paired-{store}.md`.
pub fn compare(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    store: &str,
    title: &str,
    variants: [&'static str; 3],
    op: impl Fn(Mode, &'static str) -> paired::Op,
) {
    const MODES: [(Mode, &str); 2] = [(Mode::Replay, "replay"), (Mode::Fresh, "fresh")];
    for (mode, label) in MODES {
        let mut g = c.benchmark_group(format!("{store}/{label}"));
        g.sample_size(20)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3))
            .throughput(Throughput::Elements(1));
        for (round, conc) in [1u64, 16, 64].into_iter().enumerate() {
            let mut order = variants;
            order.rotate_left(round);
            for variant in order {
                let op = op(mode, variant);
                g.bench_with_input(BenchmarkId::new(variant, conc), &conc, |b, &conc| {
                    b.iter_custom(|iters| {
                        let op = op.clone();
                        rt.block_on(drive::drive(conc, iters, move |i| op(i)))
                    })
                });
            }
        }
        g.finish();
    }
    let mut rows = Vec::new();
    for (mode, label) in MODES {
        for conc in [1u64, 16, 64] {
            let ops: Vec<_> = variants.map(|v| (v, op(mode, v))).into();
            rows.push((label, conc, paired::paired(rt, conc, &ops)));
        }
    }
    notes::write_note(&format!("paired-{store}.md"), &paired::table(title, &rows));
}
