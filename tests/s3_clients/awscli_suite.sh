#!/usr/bin/env bash
# The S3 API as the AWS CLI (v1) sees it, with the CLI's default
# configuration: aws s3 mb, cp (a small file, and a 100 MiB one that goes
# multipart), ls, sync both ways, rm, rb and presign, and aws s3api
# put-object, head-object and get-object.
#
# Environment: S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY; `aws` on PATH.
# Stops at the first failed check.

# shellcheck source=tests/s3_clients/lib.sh
source "$(dirname "$0")/lib.sh"
require aws
require curl

export AWS_ACCESS_KEY_ID=$S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$S3_SECRET_KEY AWS_DEFAULT_REGION=us-east-1
# Nothing from a configuration file: only the defaults.
export AWS_CONFIG_FILE=$WORK/no-config AWS_SHARED_CREDENTIALS_FILE=$WORK/no-credentials
unset AWS_PROFILE AWS_SESSION_TOKEN

s3() { aws --endpoint-url "$S3_ENDPOINT" s3 "$@"; }
s3api() { aws --endpoint-url "$S3_ENDPOINT" s3api "$@"; }

echo "$(aws --version 2>&1), endpoint $S3_ENDPOINT"
bucket=$(bucket_name awscli)
cleanup() { s3 rb --force "s3://$bucket"; }

echo "== buckets"
check "aws s3 mb" s3 mb "s3://$bucket"
check "aws s3 ls" s3 ls
has "aws s3 ls names the new bucket" "$OUT" " $bucket\$"

echo "== cp"
random_file "$WORK/small.txt" 12345
check "aws s3 cp of a small file up" s3 cp --no-progress "$WORK/small.txt" "s3://$bucket/small.txt"
check "aws s3 cp of it down" s3 cp --no-progress "s3://$bucket/small.txt" "$WORK/small.down"
same "the small file came back whole" "$WORK/small.txt" "$WORK/small.down"
check "its ETag" s3api head-object --bucket "$bucket" --key small.txt --query ETag --output text
equal "its ETag is the MD5 of the file" "$OUT" "\"$(md5_of "$WORK/small.txt")\""

random_file "$WORK/big.bin" $((100 * 1024 * 1024))
check "aws s3 cp of a 100 MiB file up" s3 cp --no-progress "$WORK/big.bin" "s3://$bucket/dir/big.bin"
check "its ETag" s3api head-object --bucket "$bucket" --key dir/big.bin --query ETag --output text
has "it went up multipart, in 8 MiB parts (ETag ending -13)" "$OUT" '^"[0-9a-f]{32}-13"$'
check "aws s3 cp of it down" s3 cp --no-progress "s3://$bucket/dir/big.bin" "$WORK/big.down"
same "the 100 MiB file came back whole" "$WORK/big.bin" "$WORK/big.down"
rm -f "$WORK/big.bin" "$WORK/big.down"

echo "== ls"
check "aws s3 ls of the bucket" s3 ls "s3://$bucket/"
has "names the small file" "$OUT" ' 12345 small\.txt$'
has "names the directory as a prefix" "$OUT" ' PRE dir/$'
lacks "not the file inside it" "$OUT" 'big\.bin'
check "aws s3 ls --recursive" s3 ls --recursive "s3://$bucket/"
has "names the file inside the directory" "$OUT" ' 104857600 dir/big\.bin$'
equal "names both files" "$(wc -l <<<"$OUT")" 2

echo "== sync"
random_tree "$WORK/tree"
# The empty file goes up on its own, in a process of its own: botocore
# sends "Expect: 100-continue" even with an empty body, the answer comes
# without a 100 Continue (there is no body to wait for), and botocore then
# parses the next answer on that pooled connection against the stale status
# line (boto/botocore#3755): within one sync, a later UploadPart failed with
# KeyError 'ETag' about one run in three.
mv "$WORK/tree/empty" "$WORK/empty"
check "aws s3 cp of an empty file" s3 cp --no-progress "$WORK/empty" "s3://$bucket/empty"
check "its size" s3api head-object --bucket "$bucket" --key empty --query ContentLength --output text
equal "is 0" "$OUT" 0
files=$(find "$WORK/tree" -type f | wc -l)
check "aws s3 sync of a tree up" s3 sync --no-progress "$WORK/tree" "s3://$bucket/tree"
equal "it uploaded every file" "$(grep -c '^upload:' <<<"$OUT")" "$files"
check "aws s3 sync of the tree down" s3 sync --no-progress "s3://$bucket/tree" "$WORK/back"
same_tree "the tree came back the same" "$WORK/tree" "$WORK/back"
check "aws s3 sync up again" s3 sync --no-progress "$WORK/tree" "s3://$bucket/tree"
equal "it uploads nothing" "$OUT" ""
check "aws s3 sync down again" s3 sync --no-progress "s3://$bucket/tree" "$WORK/back"
equal "it downloads nothing" "$OUT" ""
random_file "$WORK/tree/a/one.bin" 70001
rm "$WORK/tree/top.txt"
check "aws s3 sync --delete after a change and a removal" s3 sync --no-progress --delete "$WORK/tree" "s3://$bucket/tree"
has "it uploads the changed file" "$OUT" '^upload: .*a/one\.bin to s3://.*/tree/a/one\.bin$'
has "it deletes the removed one" "$OUT" '^delete: s3://.*/tree/top\.txt$'
equal "and does nothing else" "$(wc -l <<<"$OUT")" 2
check "aws s3 ls --recursive of the tree" s3 ls --recursive "s3://$bucket/tree/"
equal "lists every file" "$(wc -l <<<"$OUT")" $((files - 1))
has "with its name escaped nowhere" "$OUT" ' 4321 tree/sp ace/ü\+plus\.txt$'
rm -rf "$WORK/back"
check "aws s3 sync down into a fresh directory" s3 sync --no-progress "s3://$bucket/tree" "$WORK/back"
same_tree "the changed tree came back the same" "$WORK/tree" "$WORK/back"

echo "== s3api"
printf 'through s3api\n' >"$WORK/api.txt"
check "aws s3api put-object with a Content-Type and metadata" \
  s3api put-object --bucket "$bucket" --key "api/obj one.txt" --body "$WORK/api.txt" \
  --content-type text/x-api --metadata colour=green --query ETag --output text
equal "put-object answers the MD5 as ETag" "$OUT" "\"$(md5_of "$WORK/api.txt")\""
check "aws s3api head-object" s3api head-object --bucket "$bucket" --key "api/obj one.txt" \
  --query '[ContentLength, ContentType, Metadata.colour]' --output text
equal "head-object: length, type, metadata" "$OUT" "$(printf '14\ttext/x-api\tgreen')"
check "aws s3api get-object" s3api get-object --bucket "$bucket" --key "api/obj one.txt" "$WORK/api.down"
same "get-object wrote the bytes" "$WORK/api.txt" "$WORK/api.down"
check "aws s3api get-object --range" s3api get-object --bucket "$bucket" --key "api/obj one.txt" \
  --range bytes=8-11 "$WORK/api.part"
equal "the range's bytes" "$(cat "$WORK/api.part")" "s3ap"
check_fails "aws s3api head-object of a missing key fails" s3api head-object --bucket "$bucket" --key absent
has "with 404" "$OUT" '404|Not Found'

echo "== presign"
check "aws s3 presign" s3 presign "s3://$bucket/small.txt" --expires-in 300
url=$OUT
check "the presigned URL works without credentials" curl -sSf -o "$WORK/presigned.down" "$url"
same "it returns the object" "$WORK/small.txt" "$WORK/presigned.down"
check "aws s3 presign --expires-in 1" s3 presign "s3://$bucket/small.txt" --expires-in 1
url=$OUT
sleep 2
check "an expired presigned URL" curl -sS -o "$WORK/expired.xml" -w '%{http_code}' "$url"
equal "is refused with 403" "$OUT" 403
has "AccessDenied" "$(cat "$WORK/expired.xml")" '<Code>AccessDenied</Code>'

echo "== rm and rb"
check_fails "aws s3 rb of a bucket holding objects fails" s3 rb "s3://$bucket"
check "aws s3 rm --recursive" s3 rm --recursive "s3://$bucket/"
has "it deletes the objects" "$OUT" '^delete: s3://.*/tree/a/b/deep\.bin$'
check "aws s3 ls --recursive of the emptied bucket" s3 ls --recursive "s3://$bucket/"
equal "lists nothing" "$OUT" ""
check "aws s3 rb" s3 rb "s3://$bucket"
check "aws s3 ls" s3 ls
lacks "no longer names the bucket" "$OUT" " $bucket\$"

echo
echo "all awscli checks passed"
