#!/usr/bin/env bash
# Builds depot (installing its build dependencies when missing) and runs
# `depot serve` with any extra arguments: `scripts/serve.sh` alone serves the
# embedded default (./depot-data, 127.0.0.1:8080, hybrid engine).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
depot_install_packages "${BUILD_PACKAGES[@]}"
exec cargo run --release --bin depot -- serve "$@"
