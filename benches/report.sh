#!/usr/bin/env bash
# Runs every bench and writes docs/benchmarks.md + docs/benchmarks.svg from criterion's results.
#
#   benches/report.sh                 # all benches, criterion's short settings per group
#   benches/report.sh --bench redis   # extra arguments go to `cargo bench` (the workspace's only)
#
# PostgreSQL and Redis benches need IDEM_TEST_POSTGRES_URL / redis-server on the PATH (the
# defaults below are the development services); a bench without its service prints
# "skipped: …" and is left out of the report.
set -euo pipefail
cd "$(dirname "$0")/.."
export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEM_TEST_REDIS_URL="${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/}"
# Stale results of renamed or removed benches would otherwise reappear in a full report.
if [ $# -eq 0 ]; then rm -rf target/criterion; fi
cargo bench --all-features "$@"
if [ $# -eq 0 ]; then
  # idem against agent-effects on PostgreSQL: a crate of its own (agent-effects-postgres builds
  # a second sqlx), run with this target directory so that its results join the same report.
  CARGO_TARGET_DIR="$PWD/target" cargo bench --manifest-path benches/peers-postgres/Cargo.toml
fi
cargo run --release --all-features --example bench_report -- target/criterion docs
