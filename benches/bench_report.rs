//! Turns the criterion results of `cargo bench -p idem-benches` into `docs/benchmarks.md` (medians
//! and ratios) and `docs/benchmarks.svg` (idem's calls per second per store and concurrency).
//!
//! `benches/report.sh` runs the benches and then this; on its own:
//!
//! ```text
//! cargo run --release -p idem-benches --bin bench_report -- [target/criterion] [docs]
//! ```
//!
//! It reads every `new/benchmark.json` + `new/estimates.json` pair criterion left, so a bench
//! that was not run (a service missing) is simply absent from the report.

use plotters::prelude::*;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One measured benchmark: `group / function / value`, its median per iteration.
#[derive(Debug, Clone)]
struct Bench {
    group: String,
    function: String,
    value: String,
    median_ns: f64,
}

/// Stores in the order the report shows them, with the variant each is compared against first
/// (its floor: the same work without idem) and a note on what that floor is.
const STORES: [(&str, &str, &str); 5] = [
    (
        "memory",
        "no_attribute",
        "the same async fn without the attribute",
    ),
    (
        "sqlite",
        "no_attribute",
        "the same async fn without the attribute",
    ),
    (
        "postgres",
        "raw_minimal",
        "raw sqlx running the minimal statements (fresh: a plain INSERT and UPDATE; replay: \
         one SELECT by key); `raw_same` is raw sqlx running idem's own statements, so \
         idem / raw_same is the cost of the library and raw_same / raw_minimal that of the \
         single-statement claim",
    ),
    (
        "mysql",
        "raw_minimal",
        "raw sqlx running the minimal statements (fresh: INSERT IGNORE and UPDATE; replay: one \
         SELECT by key); `raw` is raw sqlx running idem's own statements",
    ),
    (
        "redis",
        "raw_minimal",
        "raw redis-rs running the minimal commands (fresh: SET NX PX and SET PX; replay: one \
         GET); `raw` is raw redis-rs running idem's own scripts",
    ),
];
const MODES: [&str; 2] = ["fresh", "replay"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let criterion = PathBuf::from(args.next().unwrap_or_else(|| "target/criterion".into()));
    let docs = PathBuf::from(args.next().unwrap_or_else(|| "docs".into()));
    let mut benches = Vec::new();
    collect(&criterion, &mut benches)?;
    if benches.is_empty() {
        return Err(format!(
            "no criterion results under {}: run `cargo bench -p idem-benches` first",
            criterion.display()
        )
        .into());
    }
    let by_id: BTreeMap<(String, String, String), f64> = benches
        .iter()
        .map(|b| {
            (
                (b.group.clone(), b.function.clone(), b.value.clone()),
                b.median_ns,
            )
        })
        .collect();
    let mut md = markdown(&benches, &by_id);
    // Figures a bench measured outside criterion (percentiles, per-row costs), as it wrote them.
    if let Ok(notes) = std::fs::read_dir(criterion.join("idem-notes")) {
        let mut notes: Vec<PathBuf> = notes.filter_map(|e| Some(e.ok()?.path())).collect();
        notes.sort();
        for note in notes {
            md.push('\n');
            md.push_str(&std::fs::read_to_string(note)?);
        }
    }
    std::fs::create_dir_all(&docs)?;
    std::fs::write(docs.join("benchmarks.md"), md)?;
    chart(&by_id, &docs.join("benchmarks.svg"))?;
    println!(
        "wrote {} and {} from {} results",
        docs.join("benchmarks.md").display(),
        docs.join("benchmarks.svg").display(),
        benches.len()
    );
    Ok(())
}

/// Walks `dir` for criterion's `new/` folders.
fn collect(dir: &Path, out: &mut Vec<Bench>) -> Result<(), Box<dyn std::error::Error>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            let (Ok(meta), Ok(est)) = (
                std::fs::read_to_string(path.join("benchmark.json")),
                std::fs::read_to_string(path.join("estimates.json")),
            ) else {
                continue;
            };
            let meta: serde_json::Value = serde_json::from_str(&meta)?;
            let est: serde_json::Value = serde_json::from_str(&est)?;
            let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
            let Some(median_ns) = est["median"]["point_estimate"].as_f64() else {
                continue;
            };
            out.push(Bench {
                group: text(&meta["group_id"]),
                function: text(&meta["function_id"]),
                value: text(&meta["value_str"]),
                median_ns,
            });
        } else {
            collect(&path, out)?;
        }
    }
    Ok(())
}

/// A time in the unit that suits it (a difference may be negative).
fn time(ns: f64) -> String {
    let abs = ns.abs();
    if abs < 10.0 {
        format!("{ns:.1} ns")
    } else if abs < 1e3 {
        format!("{ns:.0} ns")
    } else if abs < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if abs < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

fn rate(ns: f64) -> String {
    let per_s = 1e9 / ns;
    if per_s >= 1e6 {
        format!("{:.2} M/s", per_s / 1e6)
    } else if per_s >= 1e3 {
        format!("{:.1} k/s", per_s / 1e3)
    } else {
        format!("{per_s:.0} /s")
    }
}

fn markdown(benches: &[Bench], by_id: &BTreeMap<(String, String, String), f64>) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Benchmarks\n\n\
         Generated by `benches/report.sh` (`cargo bench -p idem-benches`, then \
         `cargo run --release -p idem-benches --bin bench_report`) from criterion's medians. Time is per \
         call; at concurrency *c*, *c* tasks call in a loop on a 2-worker tokio runtime, so \
         the time per call is wall time / calls (the inverse of throughput). Ratios are \
         idem / the other variant, measured in the same run. Host: {} hardware threads.\n\n\
         One bench: `cargo bench -p idem-benches --bench NAME` (`overhead`, `postgres`, `mysql`, \
         `redis`, `http_layer`, `peers`, `contention`, `growth`; PostgreSQL from \
         `IDEM_TEST_POSTGRES_URL`, MySQL / MariaDB from `IDEM_TEST_MYSQL_URL`, Redis from a private `redis-server` on the PATH); the PostgreSQL peer: \
         `CARGO_TARGET_DIR=target cargo bench --manifest-path benches/peers-postgres/Cargo.toml`.\n\n\
         ![calls per second](benchmarks.svg)\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let _ = writeln!(md, "## idem against its floor\n");
    let _ = writeln!(
        md,
        "| store | call | c | idem | calls/s | floor | idem − floor | idem / floor | others (idem / other) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let mut shown = std::collections::BTreeSet::new();
    for (store, floor, _) in STORES {
        for mode in MODES {
            let group = format!("{store}/{mode}");
            for c in ["1", "16", "64"] {
                let get = |f: &str| by_id.get(&(group.clone(), f.to_string(), c.to_string()));
                let Some(&idem) = get("idem") else { continue };
                shown.insert(group.clone());
                let (floor_cell, extra, ratio) = match get(floor) {
                    Some(&f) => (
                        format!("{} ({floor})", time(f)),
                        time(idem - f),
                        // A floor under a microsecond (no I/O: the bare fn) makes a ratio
                        // meaningless: the difference is the figure then.
                        if f < 1_000.0 {
                            "—".to_string()
                        } else {
                            format!("{:.2}", idem / f)
                        },
                    ),
                    None => ("—".into(), "—".into(), "—".into()),
                };
                let others: Vec<String> = benches
                    .iter()
                    .filter(|b| {
                        b.group == group
                            && b.value == c
                            && b.function != "idem"
                            && b.function != floor
                    })
                    .map(|b| {
                        format!(
                            "{}: {} ({:.2})",
                            b.function,
                            time(b.median_ns),
                            idem / b.median_ns
                        )
                    })
                    .collect();
                let _ = writeln!(
                    md,
                    "| {store} | {mode} | {c} | {} | {} | {floor_cell} | {extra} | {ratio} | {} |",
                    time(idem),
                    rate(idem),
                    if others.is_empty() {
                        "—".into()
                    } else {
                        others.join("; ")
                    }
                );
            }
        }
    }
    let _ = writeln!(md, "\nFloors:\n");
    for (store, floor, what) in STORES {
        let _ = writeln!(md, "- {store}: `{floor}`, {what}.");
    }

    // Other groups with an `idem` variant (the peers): idem against each other variant.
    let mut compared: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for b in benches
        .iter()
        .filter(|b| b.function == "idem" && !shown.contains(&b.group))
    {
        compared.insert((&b.group, &b.value), b.median_ns);
    }
    if !compared.is_empty() {
        let _ = writeln!(md, "\n## idem against other crates\n");
        let _ = writeln!(
            md,
            "| group | c | idem | other | other's median | idem / other |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|");
        for (&(group, value), &idem) in &compared {
            for b in benches
                .iter()
                .filter(|b| b.group == group && b.value == value && b.function != "idem")
            {
                let _ = writeln!(
                    md,
                    "| {group} | {value} | {} | {} | {} | {:.2} |",
                    time(idem),
                    b.function,
                    time(b.median_ns),
                    idem / b.median_ns
                );
            }
            shown.insert(group.to_string());
        }
    }

    growth(&mut md, benches, &mut shown);

    // Everything else (contention, the http layer, …): group by group.
    let mut rest: BTreeMap<&str, Vec<&Bench>> = BTreeMap::new();
    for b in benches.iter().filter(|b| !shown.contains(&b.group)) {
        rest.entry(&b.group).or_default().push(b);
    }
    if !rest.is_empty() {
        let _ = writeln!(md, "\n## Other benchmarks\n");
        let _ = writeln!(md, "| group | benchmark | parameter | median |");
        let _ = writeln!(md, "|---|---|---|---|");
        for (group, mut list) in rest {
            list.sort_by(|a, b| {
                (&a.function, a.value.parse::<f64>().ok(), &a.value)
                    .partial_cmp(&(&b.function, b.value.parse::<f64>().ok(), &b.value))
                    .unwrap_or(std::cmp::Ordering::Equal)
            });
            for b in list {
                let _ = writeln!(
                    md,
                    "| {group} | {} | {} | {} |",
                    b.function,
                    if b.value.is_empty() { "—" } else { &b.value },
                    time(b.median_ns)
                );
            }
        }
    }
    md
}

/// The growth groups (`growth/<store>`, functions `fresh`/`replay`, parameter the live rows):
/// one row per store and call, the medians by table size and the largest size against the
/// smallest (the target: under 1.5× from 10 thousand to 10 million rows).
fn growth(md: &mut String, benches: &[Bench], shown: &mut std::collections::BTreeSet<String>) {
    // (store, call) -> [(rows, median)]
    let mut rows: BTreeMap<(&str, &str), Vec<(u64, f64)>> = BTreeMap::new();
    for b in benches {
        let Some(store) = b.group.strip_prefix("growth/") else {
            continue;
        };
        if let Ok(n) = b.value.parse::<u64>() {
            rows.entry((store, &b.function))
                .or_default()
                .push((n, b.median_ns));
        }
    }
    if rows.is_empty() {
        return;
    }
    let mut sizes: Vec<u64> = rows.values().flatten().map(|&(n, _)| n).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let count = |n: u64| match n {
        n if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{} M", n / 1_000_000),
        n if n >= 1_000 && n % 1_000 == 0 => format!("{} k", n / 1_000),
        n => n.to_string(),
    };
    let _ = writeln!(md, "\n## Growth\n");
    let _ = writeln!(
        md,
        "Latency of one call (c = 1) as the table holds more live rows. The last column is the \
         largest table against the smallest, in this run.\n"
    );
    let heads: Vec<String> = sizes
        .iter()
        .map(|&n| format!("{} rows", count(n)))
        .collect();
    let _ = writeln!(
        md,
        "| store | call | {} | largest / smallest |",
        heads.join(" | ")
    );
    let _ = writeln!(md, "|---|---|{}---|", "---|".repeat(sizes.len()));
    for ((store, call), mut points) in rows {
        points.sort_by_key(|&(n, _)| n);
        let cells: Vec<String> = sizes
            .iter()
            .map(|n| {
                points
                    .iter()
                    .find(|(m, _)| m == n)
                    .map_or("—".to_string(), |&(_, ns)| time(ns))
            })
            .collect();
        let ratio = match (points.first(), points.last()) {
            (Some(&(a, lo)), Some(&(b, hi))) if b > a => {
                format!("{:.2} ({} → {})", hi / lo, count(a), count(b))
            }
            _ => "—".to_string(),
        };
        let _ = writeln!(md, "| {store} | {call} | {} | {ratio} |", cells.join(" | "));
        shown.insert(format!("growth/{store}"));
    }
}

/// One line of the chart: label, store index, mode index, (concurrency, calls per second).
type Series = (String, usize, usize, Vec<(f64, f64)>);

/// idem's calls per second against concurrency, one line per store and call kind (log scales).
fn chart(
    by_id: &BTreeMap<(String, String, String), f64>,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    // (label, store index, mode index, (concurrency, calls per second))
    let mut series: Vec<Series> = Vec::new();
    for (si, (store, _, _)) in STORES.iter().enumerate() {
        for (mi, mode) in MODES.iter().enumerate() {
            let points: Vec<(f64, f64)> = [1.0, 16.0, 64.0]
                .into_iter()
                .filter_map(|c: f64| {
                    let id = (format!("{store}/{mode}"), "idem".into(), c.to_string());
                    // x is log2(c): the axis is labelled 1, 2, 4, … 64.
                    by_id.get(&id).map(|ns| (c.log2(), 1e9 / ns))
                })
                .collect();
            if !points.is_empty() {
                series.push((format!("{store} {mode}"), si, mi, points));
            }
        }
    }
    let (lo, hi) = series
        .iter()
        .flat_map(|(_, _, _, p)| p.iter().map(|&(_, y)| y))
        .fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)));
    let (lo, hi) = if lo <= hi {
        (lo / 2.0, hi * 2.0)
    } else {
        (1.0, 10.0)
    };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("idem: calls per second by concurrency", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.3f64..6.3f64, (lo..hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("concurrent callers")
        .y_desc("calls per second")
        .x_labels(7)
        .x_label_formatter(&|x| format!("{}", 2f64.powf(x.round())))
        .y_labels(10)
        .y_label_formatter(&|y| rate(1e9 / y).replace("/s", ""))
        .draw()?;
    for (label, store, mode, points) in &series {
        // One colour per store: fresh calls thick, replays thin.
        let width = if *mode == 0 { 3 } else { 1 };
        let style = ShapeStyle::from(&Palette99::pick(*store)).stroke_width(width);
        chart
            .draw_series(std::iter::once(PathElement::new(points.clone(), style)))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(
            points
                .iter()
                .map(move |&p| Circle::new(p, 4, style.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
