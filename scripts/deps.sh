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
