#!/usr/bin/env bash
# Installs the peers (nginx, wrk) when missing, builds depot and runs
# `depot bench` with the given arguments: `scripts/bench.sh all --quick`
# for a three-minute look, `scripts/bench.sh all` for the full experiments.
# The report lands in bench-results/<UTC time>/ unless --out says otherwise.
# (Debian's nginx package also starts a system nginx on port 80; the bench
# runs its own instances on free loopback ports and does not use it.)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
depot_install_packages "${BUILD_PACKAGES[@]}" "${BENCH_PACKAGES[@]}"
exec cargo run --release --bin depot -- bench "$@"
