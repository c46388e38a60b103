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
# Rust bindings.
BUILD_PACKAGES=(g++ libclang-dev)
