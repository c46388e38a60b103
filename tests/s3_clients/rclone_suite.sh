#!/usr/bin/env bash
# The S3 API as rclone sees it (provider Other, from a generated config
# file): mkdir, lsd, copy, check, ls, cat, copyto between keys, sync both
# ways, delete, link (a SigV4 presigned URL) and purge, with byte
# comparisons.
#
# Environment: S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY; `rclone` on PATH.
# Stops at the first failed check.

# shellcheck source=tests/s3_clients/lib.sh
source "$(dirname "$0")/lib.sh"
require rclone
require curl

cat >"$WORK/rclone.conf" <<CONF
[depot]
type = s3
provider = Other
access_key_id = $S3_ACCESS_KEY
secret_access_key = $S3_SECRET_KEY
endpoint = $S3_ENDPOINT
region = us-east-1
force_path_style = true
CONF
# Uploads from 5 MiB on go multipart, in 5 MiB parts (the defaults, 200 MiB
# and 5 MiB, would keep the test files to single PUTs). No retries: they
# would hide errors, and make a failing run take minutes.
rc() {
  rclone --config "$WORK/rclone.conf" --s3-upload-cutoff 5M --s3-chunk-size 5M \
    --retries 1 --low-level-retries 1 "$@"
}
# Nothing from the environment: rclone's SDK reads AWS_* too.
unset "${!RCLONE_@}" "${!AWS_@}"

echo "$(rclone version | head -n 1), endpoint $S3_ENDPOINT"
bucket=$(bucket_name rclone)
cleanup() { rc purge "depot:$bucket"; }

echo "== buckets"
check "rclone mkdir of a bucket" rc mkdir "depot:$bucket"
check "rclone lsd depot:" rc lsd depot:
has "names the bucket" "$OUT" " $bucket\$"

echo "== copy"
random_tree "$WORK/tree"
files=$(find "$WORK/tree" -type f | wc -l)
check "rclone copy of a tree up (the 9 MiB file multipart)" rc copy "$WORK/tree" "depot:$bucket/tree"
check "rclone check: sizes and MD5s match" rc check "$WORK/tree" "depot:$bucket/tree"
check "rclone ls" rc ls "depot:$bucket"
equal "lists every file" "$(wc -l <<<"$OUT")" "$files"
has "with its size and name" "$OUT" '^ +4321 tree/sp ace/ü\+plus\.txt$'
has "the multipart one too" "$OUT" "^ +$((9 * 1024 * 1024)) tree/big/nine-mib\.bin\$"
check "rclone lsf of a directory" rc lsf "depot:$bucket/tree/a"
equal "lists its file and subdirectory" "$OUT" "$(printf 'b/\none.bin')"
check "rclone md5sum" rc md5sum "depot:$bucket/tree"
# The multipart file's MD5 comes from the x-amz-meta-md5chksum rclone sent.
equal "answers the local MD5s, the multipart file's too" "$(sort -k2 <<<"$OUT")" \
  "$(cd "$WORK/tree" && find . -type f -exec md5sum {} + | sed 's|  \./|  |' | sort -k2)"

echo "== cat"
rc cat "depot:$bucket/tree/a/one.bin" >"$WORK/one.cat" || fail "rclone cat"
same "rclone cat returns the bytes" "$WORK/tree/a/one.bin" "$WORK/one.cat"
rc cat "depot:$bucket/tree/big/nine-mib.bin" >"$WORK/nine.cat" || fail "rclone cat of the multipart file"
same "rclone cat of the multipart file returns the bytes" "$WORK/tree/big/nine-mib.bin" "$WORK/nine.cat"
rc cat --offset 1000 --count 100 "depot:$bucket/tree/a/one.bin" >"$WORK/one.range" || fail "rclone cat --offset"
dd if="$WORK/tree/a/one.bin" of="$WORK/one.want" bs=100 skip=10 count=1 status=none
same "rclone cat --offset 1000 --count 100 (a range)" "$WORK/one.want" "$WORK/one.range"

echo "== server-side copy"
check "rclone copyto between two keys" rc copyto "depot:$bucket/tree/a/b/deep.bin" "depot:$bucket/copies/deep copy.bin"
rc cat "depot:$bucket/copies/deep copy.bin" >"$WORK/copy.cat" || fail "rclone cat of the copy"
same "the copy holds the bytes" "$WORK/tree/a/b/deep.bin" "$WORK/copy.cat"

echo "== copy down and sync"
check "rclone copy of the tree down" rc copy "depot:$bucket/tree" "$WORK/back"
same_tree "the tree came back the same" "$WORK/tree" "$WORK/back"
check "rclone sync -v with nothing changed" rc sync -v "$WORK/tree" "depot:$bucket/tree"
lacks "transfers nothing" "$OUT" ': (Copied|Deleted)'
random_file "$WORK/tree/a/one.bin" 70001
rm "$WORK/tree/top.txt"
random_file "$WORK/tree/new/file.txt" 10
check "rclone sync -v after a change, a removal and an addition" rc sync -v "$WORK/tree" "depot:$bucket/tree"
has "copies the changed file" "$OUT" 'a/one\.bin: Copied'
has "copies the new file" "$OUT" 'new/file\.txt: Copied'
has "deletes the removed file" "$OUT" 'top\.txt: Deleted'
equal "and does nothing else" "$(grep -cE ': (Copied|Deleted)' <<<"$OUT")" 3
check "rclone check after the sync" rc check "$WORK/tree" "depot:$bucket/tree"
check "rclone sync of the bucket down" rc sync "depot:$bucket/tree" "$WORK/back"
same_tree "the synced tree came back the same" "$WORK/tree" "$WORK/back"

echo "== link"
check "rclone link (a presigned URL)" rc link --expire 5m "depot:$bucket/tree/a/one.bin"
has "the URL is signed with SigV4" "$OUT" 'X-Amz-Signature='
check "the link works without credentials" curl -sSf -o "$WORK/link.down" "$OUT"
same "it returns the object" "$WORK/tree/a/one.bin" "$WORK/link.down"

echo "== delete and purge"
check "rclone delete of a directory" rc delete "depot:$bucket/tree/a"
check "rclone ls of the tree" rc ls "depot:$bucket/tree"
lacks "lists nothing under a/" "$OUT" ' a/'
has "lists the rest" "$OUT" ' new/file\.txt$'
check "rclone deletefile" rc deletefile "depot:$bucket/copies/deep copy.bin"
check "rclone lsf of its directory" rc lsf "depot:$bucket/copies"
equal "lists nothing" "$OUT" ""
check "rclone purge of the bucket" rc purge "depot:$bucket"
check "rclone lsd depot:" rc lsd depot:
lacks "no longer names the bucket" "$OUT" " $bucket\$"

echo
echo "all rclone checks passed"
