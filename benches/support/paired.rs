//! Paired ratios: variants measured in alternation, round after round, and compared round by
//! round.
//!
//! Criterion measures one benchmark after another, so a ratio of two of its medians also
//! compares two stretches of the host's time: on a shared virtual machine a slow minute falls
//! on one side only, and single ratios at concurrency 1 swung by ±30–100 % between runs. Here
//! each round runs every variant for about the same wall time, in an order that rotates from
//! round to round; the ratio is taken inside each round, and the report gives the median of
//! those ratios with a distribution-free 95 % interval for it.

use std::fmt::Write as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// One variant's call: gets a distinct number per call, as in [`super::drive::drive`].
#[allow(dead_code)] // see `paired`
pub type Op = Arc<dyn Fn(u64) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Rounds per comparison: 15 gives the interval [4th, 12th] smallest ratio, 96.5 % coverage.
pub const ROUNDS: usize = 15;
/// Wall time each variant gets per round.
const SLICE: Duration = Duration::from_millis(150);

/// The paired result of the first variant against each of the others.
pub struct Paired {
    /// Median time per call of every variant, over the rounds.
    pub medians: Vec<(&'static str, Duration)>,
    /// For each other variant: its name, and the median, low and high end of the 95 % interval
    /// of the ratio first / it.
    pub ratios: Vec<(&'static str, f64, f64, f64)>,
}

/// Runs [`ROUNDS`] rounds of `variants` at concurrency `conc` (the first variant is the one
/// compared with the others) and summarises them.
#[allow(dead_code)] // peers.rs drives its variants itself (`paired_by`)
pub fn paired(rt: &tokio::runtime::Runtime, conc: u64, variants: &[(&'static str, Op)]) -> Paired {
    let names: Vec<&'static str> = variants.iter().map(|(name, _)| *name).collect();
    paired_by(conc, &names, |v, calls| {
        run(rt, conc, calls, &variants[v].1)
    })
}

/// [`paired`] for variants that `run(v, calls)` drives itself (`calls` calls of variant `v`
/// at concurrency `conc`, returning the wall time): for calls that must not be boxed behind
/// an [`Op`], whose allocation would weigh on both sides of a ratio of fast calls.
pub fn paired_by(
    conc: u64,
    names: &[&'static str],
    mut run: impl FnMut(usize, u64) -> Duration,
) -> Paired {
    // Calls per slice, from a short probe of each variant (after a warm-up of the same size).
    let calls: Vec<u64> = (0..names.len())
        .map(|v| {
            let probe = 50 * conc;
            run(v, probe);
            let took = run(v, probe);
            let per_call = took.as_secs_f64() / probe as f64;
            ((SLICE.as_secs_f64() / per_call) as u64).max(conc)
        })
        .collect();
    let mut per_call: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for round in 0..ROUNDS {
        for k in 0..names.len() {
            let v = (k + round) % names.len();
            let took = run(v, calls[v]);
            per_call[v].push(took.as_secs_f64() / calls[v] as f64);
        }
    }
    let medians = names
        .iter()
        .zip(&per_call)
        .map(|(name, t)| (*name, Duration::from_secs_f64(median(t.clone()))))
        .collect();
    let ratios = names
        .iter()
        .zip(&per_call)
        .skip(1)
        .map(|(name, other)| {
            let r: Vec<f64> = per_call[0].iter().zip(other).map(|(a, b)| a / b).collect();
            let (lo, hi) = interval(r.clone());
            (*name, median(r), lo, hi)
        })
        .collect();
    Paired { medians, ratios }
}

/// `calls` calls of `op` over `conc` tasks; the wall time.
#[allow(dead_code)] // see `paired`
fn run(rt: &tokio::runtime::Runtime, conc: u64, calls: u64, op: &Op) -> Duration {
    let op = op.clone();
    rt.block_on(super::drive::drive(conc, calls, move |i| op(i)))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The distribution-free 95 % interval for the median: the k-th smallest and k-th largest
/// sample, with the largest k for which the binomial tails below k hold at most 2.5 % each.
fn interval(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    // P(Bin(n, 1/2) <= j), summed term by term.
    let tail = |j: usize| -> f64 {
        let mut c = 1.0f64;
        let mut sum = 0.0;
        for i in 0..=j {
            if i > 0 {
                c = c * (n - i + 1) as f64 / i as f64;
            }
            sum += c;
        }
        sum / 2f64.powi(n as i32)
    };
    let mut k = 1;
    while k < n / 2 && tail(k) <= 0.025 {
        k += 1;
    }
    (v[k - 1], v[n - k])
}

/// A markdown table of paired results: one line per (call, concurrency), one ratio column per
/// other variant.
pub fn table(store: &str, rows: &[(&str, u64, Paired)]) -> String {
    let mut md = format!(
        "## Paired ratios, {store}\n\n\
         The variants measured in alternation: {ROUNDS} rounds, each giving every variant about \
         {} ms of calls in an order that rotates by round; the ratio is taken within each round. \
         Median of the {ROUNDS} ratios, and in brackets the 95 % interval of that median \
         (4th and 12th smallest ratio).\n\n",
        SLICE.as_millis()
    );
    let Some((_, _, first)) = rows.first() else {
        return md;
    };
    let names: Vec<&str> = first.medians.iter().map(|(n, _)| *n).collect();
    let _ = write!(md, "| call | c |");
    for n in &names {
        let _ = write!(md, " {n} |");
    }
    for (n, ..) in &first.ratios {
        let _ = write!(md, " {} / {n} |", names[0]);
    }
    md.push_str("\n|---|---|");
    md.push_str(&"---|".repeat(names.len() + first.ratios.len()));
    md.push('\n');
    for (call, conc, p) in rows {
        let _ = write!(md, "| {call} | {conc} |");
        for (_, t) in &p.medians {
            let _ = write!(md, " {:.2} µs |", t.as_secs_f64() * 1e6);
        }
        for (_, r, lo, hi) in &p.ratios {
            let _ = write!(md, " {r:.2} ({lo:.2}–{hi:.2}) |");
        }
        md.push('\n');
    }
    md
}
