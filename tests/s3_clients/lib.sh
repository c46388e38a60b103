# Shared by the shell suites (sourced): the environment they need, checks
# that print one line each and stop the suite at the first failure, a
# scratch directory, and test files.
#
# Environment: S3_ENDPOINT (http://127.0.0.1:PORT), S3_ACCESS_KEY,
# S3_SECRET_KEY.

set -euo pipefail

: "${S3_ENDPOINT:?set S3_ENDPOINT to http://127.0.0.1:PORT}"
: "${S3_ACCESS_KEY:?set S3_ACCESS_KEY}"
: "${S3_SECRET_KEY:?set S3_SECRET_KEY}"
S3_HOSTPORT=${S3_ENDPOINT#http://}
S3_HOSTPORT=${S3_HOSTPORT%/}

# A bucket name no other run uses; start_s3 in scripts/services.sh clears
# depot-t-* buckets from the S3 test server.
RUN=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
bucket_name() { echo "depot-t-$RUN-$1"; }

WORK=$(mktemp -d)
# On exit: the suite's own cleanup() when it has one (it removes what the
# suite made should it stop halfway), then the scratch directory.
trap 'if declare -F cleanup >/dev/null; then cleanup >/dev/null 2>&1 || true; fi; rm -rf "$WORK"' EXIT

# Checks ------------------------------------------------------------------

ok() { echo "  ok    $*"; }

# fail WHAT [DETAIL...]: the suite stops here.
fail() {
  echo "  FAIL  $1"
  shift
  [ $# -eq 0 ] || printf '%s\n' "$@" | tail -n 40 | sed 's/^/        /'
  exit 1
}

# check WHAT COMMAND...: COMMAND succeeds. Its output is kept in $OUT.
check() {
  local what=$1
  shift
  if OUT=$("$@" 2>&1); then
    ok "$what"
  else
    fail "$what" "exit status $?: $*" "$OUT"
  fi
}

# check_fails WHAT COMMAND...: COMMAND fails. Its output is kept in $OUT.
check_fails() {
  local what=$1
  shift
  if OUT=$("$@" 2>&1); then
    fail "$what" "succeeded, but should have failed: $*" "$OUT"
  else
    ok "$what"
  fi
}

# same WHAT FILE1 FILE2: the files hold the same bytes.
same() {
  cmp -s "$2" "$3" || fail "$1" "$2 ($(wc -c <"$2") bytes) and $3 ($(wc -c <"$3" 2>/dev/null || echo no) bytes) differ"
  ok "$1"
}

# same_tree WHAT DIR1 DIR2: the trees hold the same files and bytes.
same_tree() {
  local out
  out=$(diff -r "$2" "$3" 2>&1) || fail "$1" "$out"
  ok "$1"
}

# has WHAT TEXT PATTERN: TEXT has a line matching the grep -E PATTERN.
has() {
  grep -qE -- "$3" <<<"$2" || fail "$1" "no line matches /$3/ in:" "$2"
  ok "$1"
}

# lacks WHAT TEXT PATTERN: no line of TEXT matches the grep -E PATTERN.
lacks() {
  ! grep -qE -- "$3" <<<"$2" || fail "$1" "a line matches /$3/ in:" "$2"
  ok "$1"
}

# equal WHAT GOT WANT
equal() {
  [ "$2" = "$3" ] || fail "$1" "expected: $3" "got:      $2"
  ok "$1"
}

# Test files -----------------------------------------------------------------

# random_file PATH BYTES
random_file() {
  mkdir -p "$(dirname "$1")"
  head -c "$2" /dev/urandom >"$1"
}

# random_tree DIR: files of several sizes in nested directories, names with
# spaces, non-ASCII and '+', and an empty file. They were last modified
# long ago: a sync that compares times must not find them newer than what
# it uploaded in the same second.
random_tree() {
  random_file "$1/top.txt" 1000
  random_file "$1/empty" 0
  random_file "$1/a/one.bin" 70000
  random_file "$1/a/b/deep.bin" 1300000
  random_file "$1/a/b/c/deeper.bin" 5
  random_file "$1/sp ace/ü+plus.txt" 4321
  random_file "$1/big/nine-mib.bin" $((9 * 1024 * 1024))
  find "$1" -type f -exec touch -d @1600000000 {} +
}

md5_of() { md5sum "$1" | cut -d' ' -f1; }

require() {
  command -v "$1" >/dev/null || fail "$1 is not installed: run scripts/test.sh, which installs the S3 clients"
}
