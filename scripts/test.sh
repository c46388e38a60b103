#!/usr/bin/env bash
# Installs what the tests need, then checks formatting and lints and runs
# every test against real processes. Run from anywhere, as root (it starts and restarts PostgreSQL, and starts S3Proxy).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
source scripts/services.sh
depot_install_packages "${BUILD_PACKAGES[@]}" "${S3_CLIENT_PACKAGES[@]}" "${UI_TEST_PACKAGES[@]}"
depot_install_s3_clients
export DEPOT_TEST_S3_CLIENTS="$S3_CLIENTS_VENV"
depot_install_ui_tests
export DEPOT_TEST_UI="$UI_TEST_DIR"
depot_install_s3_js
export DEPOT_TEST_S3_JS="$S3_JS_DIR"
depot_build_s3_java
export DEPOT_TEST_S3_JAVA="$S3_JAVA_DIR"

echo "== services"
start_postgres
start_mongo
start_s3

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --all-targets --locked -- -D warnings

echo "== tests"
cargo test --all-targets --locked

echo "== fuzz targets"
scripts/fuzz.sh "${DEPOT_FUZZ_SECONDS:-20}"
