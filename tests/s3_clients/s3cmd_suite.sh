#!/usr/bin/env bash
# The S3 API as s3cmd sees it (a generated config: path-style on the
# endpoint, plain HTTP, SigV4): mb, ls, put, get (to a file and to stdout),
# info, cp between keys, sync both ways, del, signurl and rb, with byte
# comparisons.
#
# Environment: S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY; `s3cmd` on PATH.
# Stops at the first failed check.

# shellcheck source=tests/s3_clients/lib.sh
source "$(dirname "$0")/lib.sh"
require s3cmd
require curl

cat >"$WORK/s3cfg" <<CONF
[default]
access_key = $S3_ACCESS_KEY
secret_key = $S3_SECRET_KEY
host_base = $S3_HOSTPORT
host_bucket = $S3_HOSTPORT
use_https = False
signature_v2 = False
bucket_location = us-east-1
CONF
# Uploads over 5 MiB go multipart, in 5 MiB parts (the default is 15 MiB,
# more than the test files).
s3c() { s3cmd -c "$WORK/s3cfg" --multipart-chunk-size-mb=5 "$@"; }
unset "${!AWS_@}"

echo "$(s3cmd --version), endpoint $S3_ENDPOINT"
bucket=$(bucket_name s3cmd)
cleanup() { s3c rb --recursive --force "s3://$bucket"; }

echo "== buckets"
check "s3cmd mb" s3c mb "s3://$bucket"
check "s3cmd ls" s3c ls
has "names the bucket" "$OUT" " s3://$bucket\$"

echo "== put and get"
random_file "$WORK/small.bin" 54321
check "s3cmd put of a small file" s3c put "$WORK/small.bin" "s3://$bucket/small.bin"
check "s3cmd get of it" s3c get "s3://$bucket/small.bin" "$WORK/small.down"
same "it came back whole" "$WORK/small.bin" "$WORK/small.down"
s3c get "s3://$bucket/small.bin" - >"$WORK/small.cat" 2>"$WORK/err" || fail "s3cmd get to stdout" "$(cat "$WORK/err")"
same "s3cmd get to stdout (cat) returns the bytes" "$WORK/small.bin" "$WORK/small.cat"
check "s3cmd info" s3c info "s3://$bucket/small.bin"
has "gives the size" "$OUT" 'File size: +54321$'
has "gives the MD5" "$OUT" "MD5 sum: +$(md5_of "$WORK/small.bin")\$"

random_file "$WORK/twelve.bin" $((12 * 1024 * 1024))
check "s3cmd put of a 12 MiB file (multipart, 3 parts)" s3c put --progress "$WORK/twelve.bin" "s3://$bucket/dir/twelve.bin"
has "it went up in parts" "$OUT" 'part 3 of 3'
check "s3cmd get of it" s3c get "s3://$bucket/dir/twelve.bin" "$WORK/twelve.down"
same "it came back whole" "$WORK/twelve.bin" "$WORK/twelve.down"
check "s3cmd info of it" s3c info "s3://$bucket/dir/twelve.bin"
# A multipart ETag is no MD5: s3cmd keeps the file's in x-amz-meta-s3cmd-attrs.
has "gives the file's MD5, kept in its metadata" "$OUT" "MD5 sum: +$(md5_of "$WORK/twelve.bin")\$"

echo "== ls"
check "s3cmd ls of the bucket" s3c ls "s3://$bucket"
has "names the small file" "$OUT" " 54321 +s3://$bucket/small\.bin\$"
has "names the directory" "$OUT" "DIR +s3://$bucket/dir/\$"
check "s3cmd ls --recursive" s3c ls --recursive "s3://$bucket"
has "names the file in the directory" "$OUT" " $((12 * 1024 * 1024)) +s3://$bucket/dir/twelve\.bin\$"
equal "names both files" "$(wc -l <<<"$OUT")" 2
check "s3cmd ls --list-md5" s3c ls --list-md5 "s3://$bucket"
has "gives the small file's ETag, its MD5" "$OUT" " $(md5_of "$WORK/small.bin") +s3://$bucket/small\.bin\$"

echo "== cp"
check "s3cmd cp between two keys" s3c cp "s3://$bucket/small.bin" "s3://$bucket/copies/small copy ü.bin"
s3c get "s3://$bucket/copies/small copy ü.bin" - >"$WORK/copy.cat" 2>"$WORK/err" || fail "s3cmd get of the copy"
same "the copy holds the bytes" "$WORK/small.bin" "$WORK/copy.cat"

echo "== sync"
random_tree "$WORK/tree"
files=$(find "$WORK/tree" -type f | wc -l)
check "s3cmd sync of a tree up" s3c sync "$WORK/tree/" "s3://$bucket/tree/"
equal "uploads every file" "$(grep -c '^upload: ' <<<"$OUT")" "$files"
check "s3cmd sync of the tree down" s3c sync "s3://$bucket/tree/" "$WORK/back/"
same_tree "the tree came back the same" "$WORK/tree" "$WORK/back"
check "s3cmd sync up again" s3c sync "$WORK/tree/" "s3://$bucket/tree/"
lacks "uploads nothing" "$OUT" '^upload: '
random_file "$WORK/tree/a/one.bin" 70001
rm "$WORK/tree/top.txt"
check "s3cmd sync --delete-removed after a change and a removal" \
  s3c sync --delete-removed "$WORK/tree/" "s3://$bucket/tree/"
has "uploads the changed file" "$OUT" "^upload: .*a/one\.bin' -> 's3://$bucket/tree/a/one\.bin'"
has "deletes the removed one" "$OUT" "^delete: 's3://$bucket/tree/top\.txt'\$"
equal "and does nothing else" "$(grep -cE '^(upload|delete): ' <<<"$OUT")" 2
rm -rf "$WORK/back"
check "s3cmd sync down into a fresh directory" s3c sync "s3://$bucket/tree/" "$WORK/back/"
same_tree "the changed tree came back the same" "$WORK/tree" "$WORK/back"

echo "== signurl"
expiry=$(($(date +%s) + 300))
check "s3cmd signurl" s3c signurl "s3://$bucket/small.bin" "$expiry"
check "the signed URL works without credentials" curl -sSf -o "$WORK/signed.down" "$OUT"
same "it returns the object" "$WORK/small.bin" "$WORK/signed.down"

echo "== del and rb"
check "s3cmd del" s3c del "s3://$bucket/small.bin"
check_fails "s3cmd get of the deleted key fails" s3c get "s3://$bucket/small.bin" "$WORK/gone"
has "as missing" "$OUT" 'does not exist|404'
check_fails "s3cmd rb of a bucket holding objects fails" s3c rb "s3://$bucket"
check "s3cmd del --recursive" s3c del --recursive --force "s3://$bucket"
check "s3cmd ls --recursive of the emptied bucket" s3c ls --recursive "s3://$bucket"
equal "lists nothing" "$OUT" ""
check "s3cmd rb" s3c rb "s3://$bucket"
check "s3cmd ls" s3c ls
lacks "no longer names the bucket" "$OUT" " s3://$bucket\$"

echo
echo "all s3cmd checks passed"
