#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for a bounded time (default 20 s each;
# `scripts/fuzz.sh 600` for longer), starting from the seed corpus in
# fuzz/corpus/<target>/. New inputs go to a scratch directory, so the
# committed seeds stay small; a crash stops the run, its input is kept in
# fuzz/artifacts/<target>/.
#
# cargo-fuzz needs nightly compiler flags: RUSTC_BOOTSTRAP=1 lets the
# stable toolchain accept them. No sanitizer: the code fuzzed is safe Rust,
# where AddressSanitizer finds nothing libFuzzer's own checks (panics,
# overflow checks and debug assertions are on) do not, and it would double
# the build (RocksDB and all) and slow every run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
depot_install_cargo_fuzz
export PATH="$CARGO_FUZZ_ROOT/bin:$PATH" RUSTC_BOOTSTRAP=1
seconds=${1:-20}
cargo fuzz build --sanitizer none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for target in $(cargo fuzz list); do
  mkdir -p "$work/$target"
  if ! cargo fuzz run --sanitizer none "$target" "$work/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 >"$work/$target.log" 2>&1; then
    tail -n 40 "$work/$target.log"
    echo "fuzz target $target failed; the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$target.log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$target.log")
  echo "$target: $runs runs in ${seconds} s ($rate/s)"
done
