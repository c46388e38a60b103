#!/usr/bin/env bash
# Installs the peers (nginx, wrk) when missing, starts the engines' servers
# (PostgreSQL, the MongoDB wire-protocol test server, S3Proxy; as root),
# builds depot and runs `depot bench` with the given arguments:
# `scripts/bench.sh all --quick` for a three-minute look, `scripts/bench.sh
# all` for the experiments at their default sizes. The report lands in
# bench-results/<UTC time>/ unless --out says otherwise. (Debian's nginx
# package also starts a system nginx on port 80; the bench runs its own
# instances on free loopback ports and does not use it.)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/services.sh
depot_install_packages "${BUILD_PACKAGES[@]}" "${BENCH_PACKAGES[@]}"
start_postgres
start_mongo
start_s3
export DEPOT_BENCH_POSTGRES="$DEPOT_TEST_POSTGRES"
export DEPOT_BENCH_MONGO="$DEPOT_TEST_MONGO"
export DEPOT_BENCH_S3="$DEPOT_TEST_S3"
export DEPOT_BENCH_S3_ACCESS_KEY="$DEPOT_TEST_S3_ACCESS_KEY"
export DEPOT_BENCH_S3_SECRET_KEY="$DEPOT_TEST_S3_SECRET_KEY"
exec cargo run --release --locked --bin depot -- bench "$@"
