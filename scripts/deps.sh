# Installs the Debian packages depot needs to build, when missing.
# Sourced by the other scripts; runs apt-get only if something is absent.

depot_install_packages() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "installing: ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# RocksDB is compiled from source: a C++ compiler, and libclang for its
# Rust bindings. The charts of `depot bench` (drawn by the tests too) need
# a TrueType font.
BUILD_PACKAGES=(g++ libclang-dev fonts-dejavu-core)

# The outside peers of `depot bench`: nginx serves the same files from disk,
# wrk cross-checks the built-in load generator. Without them their rows say
# "skipped".
BENCH_PACKAGES=(nginx wrk)

# The S3 clients the tests of depot's S3 API drive (tests/s3_api.rs):
# rclone and s3cmd from Debian, boto3 and the AWS CLI (v1) from PyPI.
S3_CLIENT_PACKAGES=(rclone s3cmd python3-venv)

# boto3 from 1.36 and the AWS CLI from 1.37 on send a CRC32 with every
# upload by default (a header over plain HTTP, an aws-chunked trailer over
# HTTPS); the tests keep that default. botocore and s3transfer are pinned
# with boto3: they are where that behaviour lives (the AWS CLI carries its
# own copies).
S3_CLIENT_PIP=(boto3==1.44.5 botocore==1.44.5 s3transfer==0.19.3 awscli==1.46.3)
S3_CLIENTS_VENV=/var/cache/depot/s3-clients

# Installs S3_CLIENT_PIP into a venv at S3_CLIENTS_VENV (Debian's python3,
# from S3_CLIENT_PACKAGES), unless the venv already holds exactly those
# versions and still runs. The list of versions is written last, so an
# interrupted install is redone on the next run.
depot_install_s3_clients() {
  local venv=$S3_CLIENTS_VENV stamp="$S3_CLIENTS_VENV/depot-pins.txt"
  local want
  want=$(printf '%s\n' "${S3_CLIENT_PIP[@]}")
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ -x "$venv/bin/aws" ] \
    && "$venv/bin/python" -c 'import boto3, awscli' 2>/dev/null; then
    return 0
  fi
  echo "installing ${S3_CLIENT_PIP[*]} into $venv" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "${S3_CLIENT_PIP[@]}"
  echo "$want" >"$stamp"
}

# Installs the npm packages PACKAGE@VERSION... into DIR, a directory of
# their own (Node.js and npm come from Debian unless some other Node.js is
# installed), unless exactly those versions are there already. The list of
# versions is written last, so an interrupted install is redone on the next
# run.
depot_npm_install() {
  local dir=$1
  shift
  local stamp="$dir/depot-pins.txt" want pkg installed=yes
  want=$(printf '%s\n' "$@")
  for pkg in "$@"; do
    [ -f "$dir/node_modules/${pkg%@*}/package.json" ] || installed=no
  done
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ $installed = yes ]; then
    return 0
  fi
  command -v npm >/dev/null || depot_install_packages nodejs npm
  echo "installing $* into $dir" >&2
  rm -rf "$dir"
  mkdir -p "$dir"
  (cd "$dir" && echo '{"private":true}' >package.json \
    && npm install --no-audit --no-fund --loglevel=error "$@")
  echo "$want" >"$stamp"
}

# The end-to-end tests of the web UI (tests/ui.rs) drive Debian's Chromium
# with playwright-core from npm (the library only: it downloads no browser).
UI_TEST_PACKAGES=(chromium)
UI_TEST_NPM=(playwright-core@1.56.1)
UI_TEST_DIR=/var/cache/depot/ui-tests

depot_install_ui_tests() {
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 depot_npm_install "$UI_TEST_DIR" "${UI_TEST_NPM[@]}"
}

# The AWS SDK for JavaScript v3, for its suite in tests/s3_clients
# (js_sdk_suite.mjs). The three packages are released together and pinned
# together; 3.967.0 is the last release that still runs on Node.js 18,
# Debian 12's (later ones require Node.js 20). Like boto3, it sends a CRC32
# with every upload by default.
S3_JS_NPM=(@aws-sdk/client-s3@3.967.0 @aws-sdk/lib-storage@3.967.0 @aws-sdk/s3-request-presigner@3.967.0)
S3_JS_DIR=/var/cache/depot/s3-js-sdk

depot_install_s3_js() {
  depot_npm_install "$S3_JS_DIR" "${S3_JS_NPM[@]}"
}

# The AWS SDK for Java v2, for its suite in tests/s3_clients/java
# (JavaSdkSuite.java). Its pom.xml pins the SDK (BOM 2.57.8, no CRT) and
# Maven's plugins; `mvn dependency:copy-dependencies` fetches the jars from
# Maven Central into S3_JAVA_DIR/lib and javac (Debian's OpenJDK 17) compiles
# the suite against them into S3_JAVA_DIR/classes, outside the repository.
# The build is redone when pom.xml or the suite differs from the copies of
# them it was made from, which are written last (so an interrupted build is
# redone too); tests/s3_api.rs refuses a build from other sources.
S3_JAVA_SRC=tests/s3_clients/java
S3_JAVA_FILES=(pom.xml JavaSdkSuite.java)
S3_JAVA_DIR=/var/cache/depot/s3-java-sdk

depot_build_s3_java() {
  local src=$S3_JAVA_SRC dir=$S3_JAVA_DIR file built=yes
  for file in "${S3_JAVA_FILES[@]}"; do
    cmp -s "$src/$file" "$dir/source/$file" || built=no
  done
  if [ $built = yes ] && [ -f "$dir/classes/JavaSdkSuite.class" ]; then
    return 0
  fi
  command -v javac >/dev/null || depot_install_packages openjdk-17-jdk-headless
  command -v mvn >/dev/null || depot_install_packages maven
  echo "building the AWS SDK for Java suite into $dir" >&2
  rm -rf "$dir"
  mkdir -p "$dir/classes" "$dir/source"
  if ! mvn -q -B -f "$src/pom.xml" dependency:copy-dependencies -DoutputDirectory="$dir/lib" >"$dir/mvn.log" 2>&1; then
    cat "$dir/mvn.log" >&2
    return 1
  fi
  javac --release 17 -d "$dir/classes" -cp "$dir/lib/*" "$src/JavaSdkSuite.java" || return 1
  for file in "${S3_JAVA_FILES[@]}"; do
    cp "$src/$file" "$dir/source/$file" || return 1
  done
}

# cargo-fuzz, for the fuzz targets in fuzz/ (run by scripts/test.sh). It
# is installed from crates.io into its own directory, once per version.
CARGO_FUZZ_VERSION=0.13.2
CARGO_FUZZ_ROOT=/var/cache/depot/cargo-fuzz

depot_install_cargo_fuzz() {
  local bin="$CARGO_FUZZ_ROOT/bin/cargo-fuzz"
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qF "$CARGO_FUZZ_VERSION"; then
    return 0
  fi
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_ROOT" >&2
  # Its own target directory: the shared one is for depot's build.
  CARGO_TARGET_DIR="$CARGO_FUZZ_ROOT/build" cargo install --quiet --locked --version "$CARGO_FUZZ_VERSION" \
    --root "$CARGO_FUZZ_ROOT" cargo-fuzz
  rm -rf "$CARGO_FUZZ_ROOT/build"
}
