#!/usr/bin/env python3
"""The S3 API as boto3 sees it, with boto3's default configuration.

Environment:
  S3_ENDPOINT                       http://127.0.0.1:PORT
  S3_ACCESS_KEY, S3_SECRET_KEY      a user
  S3_ACCESS_KEY2, S3_SECRET_KEY2    optional: a second user (its checks are
                                    skipped without one)

The expectations are AWS S3's documented behaviour. Clients are built with
nothing but the endpoint, the region and the credentials: boto3 addresses an
IP endpoint path-style, and from 1.36 on it sends a CRC32 checksum with
every upload and asks for checksums on downloads. Over plain HTTP it sends
that checksum as a header; the checksum area also sends uploads the way
boto3 sends them over HTTPS (aws-chunked, with the checksum as a trailer).

Each area is one function with its own buckets. An area stops at its first
failed check and the next area runs; the suite prints one line per check and
exits 1 when any check failed, naming each failure at the end.
"""

import base64
import datetime
import hashlib
import hmac
import http.client
import io
import os
import random
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
import zlib

import boto3
import botocore
from boto3.s3.transfer import TransferConfig
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT = os.environ["S3_ENDPOINT"].rstrip("/")
ACCESS_KEY = os.environ["S3_ACCESS_KEY"]
# How the server shows an owner: an opaque id, never the access key itself.
OWNER_ID = hashlib.sha256(b"depot owner\0" + ACCESS_KEY.encode()).hexdigest()
SECRET_KEY = os.environ["S3_SECRET_KEY"]
ACCESS_KEY2 = os.environ.get("S3_ACCESS_KEY2")
SECRET_KEY2 = os.environ.get("S3_SECRET_KEY2")
REGION = "us-east-1"

KiB = 1024
MiB = 1024 * KiB
# boto3's TransferConfig defaults: multipart from 8 MiB on, in 8 MiB parts.
TRANSFER_CHUNK = 8 * MiB

RUN = "%06x" % random.randrange(16**6)


class CheckFailed(Exception):
    pass


# --- checks -----------------------------------------------------------------


LAST_OK = [""]


def ok(what):
    LAST_OK[0] = what
    print(f"  ok    {what}", flush=True)


def expect(condition, what, detail=""):
    """One check: `what` holds, else the area fails with `detail`."""
    if not condition:
        raise CheckFailed(f"{what}: {detail}" if detail else what)
    ok(what)


def expect_equal(got, want, what):
    expect(got == want, what, f"expected {want!r}, got {got!r}")


def expect_error(what, code, status, call):
    """One check: `call` fails with this S3 error code (None: any code) and
    HTTP status. Returns the error."""
    try:
        result = call()
    except ClientError as e:
        got_code = e.response.get("Error", {}).get("Code")
        got_status = e.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if got_status != status or (code is not None and got_code != code):
            want = f"{code} ({status})" if code else f"status {status}"
            raise CheckFailed(f"{what}: expected {want}, got {got_code} ({got_status}): {e}") from None
        ok(what)
        return e
    want = f"{code} ({status})" if code else f"status {status}"
    status = result.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(result, dict) else None
    raise CheckFailed(f"{what}: expected {want}, but it succeeded (status {status})")


def short(value, limit=300):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# --- helpers ----------------------------------------------------------------


def client(access_key=ACCESS_KEY, secret_key=SECRET_KEY, config=None):
    """A client with boto3's default configuration, or `config`."""
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        region_name=REGION,
        aws_access_key_id=access_key,
        aws_secret_access_key=secret_key,
        config=config,
    )


def anonymous_client():
    """A client that signs nothing."""
    return boto3.client("s3", endpoint_url=ENDPOINT, region_name=REGION, config=Config(signature_version=UNSIGNED))


def data(size, seed):
    return random.Random(seed).randbytes(size)


def md5_hex(b):
    return hashlib.md5(b).hexdigest()


def etag_of(b):
    """The ETag of a single PUT: the body's hex MD5, quoted."""
    return f'"{md5_hex(b)}"'


def multipart_etag(parts):
    """The ETag of a completed multipart upload: the MD5 of the parts'
    binary MD5s, then '-' and the number of parts, quoted."""
    digests = b"".join(hashlib.md5(p).digest() for p in parts)
    return f'"{hashlib.md5(digests).hexdigest()}-{len(parts)}"'


def body_of(response):
    return response["Body"].read()


def keys_of(listing):
    return [o["Key"] for o in listing.get("Contents", [])]


def prefixes_of(listing):
    return [p["Prefix"] for p in listing.get("CommonPrefixes", [])]


def http_get(url, headers=None):
    """A plain GET through urllib: (status, headers, body)."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def http_put(url, body, content_type, extra=None):
    headers = {"Content-Type": content_type, **(extra or {})}
    request = urllib.request.Request(url, data=body, method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def form_post(post, body, filename="f.txt", origin=None):
    """A browser's multipart/form-data POST of `post` (from
    generate_presigned_post) with the file `body`, sent from a page of
    `origin` if given: (status, answer)."""
    boundary = "----form%06x" % random.randrange(16**6)
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in post["fields"].items()
    ]
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode() + body + b"\r\n"
    )
    form = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if origin:
        headers["Origin"] = origin
    request = urllib.request.Request(post["url"], data=form, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def other_first(signature):
    """`signature` with its first character changed, in its own alphabet
    (hex for SigV4, base64 for SigV2), so it stays well-formed."""
    first = signature[0]
    if first in "0123456789abcdef":
        return ("1" if first == "0" else "0") + signature[1:]
    return ("B" if first == "A" else "A") + signature[1:]


def with_other_signature(url):
    """The presigned `url` with one character of its signature changed."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    names = [k for k, _ in query if k in ("Signature", "X-Amz-Signature")]
    assert names, f"no signature in {url}"
    query = [(k, other_first(v) if k in names else v) for k, v in query]
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def error_code(xml_body):
    """The <Code> of an S3 XML error body, or None."""
    try:
        return ET.fromstring(xml_body).findtext("Code")
    except ET.ParseError:
        return None


class Buckets:
    """Buckets an area creates, emptied and deleted when it ends."""

    def __init__(self, area):
        self.area = area.replace("_", "-")
        self.made = []

    def name(self, suffix=""):
        return f"depot-t-{RUN}-{self.area}{'-' + suffix if suffix else ''}"

    def create(self, s3, suffix="", **kwargs):
        name = self.name(suffix)
        s3.create_bucket(Bucket=name, **kwargs)
        self.made.append((s3, name))
        return name

    def adopt(self, s3, name):
        self.made.append((s3, name))

    def clean(self):
        for s3, name in reversed(self.made):
            try:
                empty_and_delete(s3, name)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("NoSuchBucket", "404"):
                    print(f"  note  could not remove bucket {name}: {e}", flush=True)
            except Exception as e:  # the area already failed or passed
                print(f"  note  could not remove bucket {name}: {e}", flush=True)


def empty_and_delete(s3, bucket):
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket):
        for u in page.get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=u["Key"], UploadId=u["UploadId"])
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=o["Key"])
    s3.delete_bucket(Bucket=bucket)


# --- areas ------------------------------------------------------------------


# Headers PutObject, CopyObject (REPLACE) and CreateMultipartUpload store,
# as boto3 names them, and the HTTP headers they come back as.
STORED = {
    "CacheControl": ("cache-control", "public, max-age=600"),
    "ContentDisposition": ("content-disposition", 'attachment; filename="data.bin"'),
    "ContentEncoding": ("content-encoding", "identity"),
    "ContentLanguage": ("content-language", "de-CH"),
    "Expires": ("expires", "Wed, 21 Oct 2099 07:28:00 GMT"),
}


def stored_args():
    return {arg: (datetime.datetime(2099, 10, 21, 7, 28) if arg == "Expires" else value) for arg, (_, value) in STORED.items()}


def expect_stored(response, what, expected=None):
    """The STORED headers in a HeadObject or GetObject answer."""
    headers = response["ResponseMetadata"]["HTTPHeaders"]
    for arg, (name, value) in STORED.items():
        want = value if expected is None else expected.get(name)
        expect_equal(headers.get(name), want, f"{what}: {name}")


def area_buckets(s3, buckets):
    bucket = buckets.create(s3)
    ok(f"CreateBucket {bucket}")
    head = s3.head_bucket(Bucket=bucket)
    expect_equal(head["ResponseMetadata"]["HTTPStatusCode"], 200, "HeadBucket of the new bucket is 200")
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    expect(bucket in names, "ListBuckets names the new bucket", short(names))
    location = s3.get_bucket_location(Bucket=bucket)["LocationConstraint"]
    expect(location in (None, ""), "GetBucketLocation of a us-east-1 bucket is empty", repr(location))
    expect_error(
        "CreateBucket of a bucket the caller owns is BucketAlreadyOwnedByYou",
        "BucketAlreadyOwnedByYou",
        409,
        lambda: s3.create_bucket(Bucket=bucket),
    )
    invalid = f"Depot-T-{RUN}-Upper"
    buckets.adopt(s3, invalid)  # removed at the end should it be created
    refused = expect_error(
        "CreateBucket with an uppercase name is InvalidBucketName",
        "InvalidBucketName",
        400,
        lambda: s3.create_bucket(Bucket=invalid),
    )
    message = refused.response.get("Error", {}).get("Message", "")
    expect("lowercase" in message, "... with a message saying what a bucket name is", short(refused.response))
    # What a bucket cannot keep is refused rather than dropped.
    refused_bucket = f"depot-t-{RUN}-refused"
    buckets.adopt(s3, refused_bucket)  # removed at the end should it be created
    for what, extra in [
        ("object lock", {"ObjectLockEnabledForBucket": True}),
        ("a grant", {"GrantFullControl": 'id="someone-else"'}),
    ]:
        expect_error(
            f"CreateBucket with {what} is NotImplemented",
            "NotImplemented",
            501,
            lambda: s3.create_bucket(Bucket=refused_bucket, **extra),
        )
        expect_error(f"... and no bucket was made ({what})", None, 404, lambda: s3.head_bucket(Bucket=refused_bucket))

    s3.put_object(Bucket=bucket, Key="k", Body=b"x")
    expect_error(
        "DeleteBucket of a bucket holding an object is BucketNotEmpty",
        "BucketNotEmpty",
        409,
        lambda: s3.delete_bucket(Bucket=bucket),
    )
    s3.delete_object(Bucket=bucket, Key="k")
    # As in S3, an upload in progress does not keep a bucket without objects.
    s3.create_multipart_upload(Bucket=bucket, Key="unfinished")
    deleted = s3.delete_bucket(Bucket=bucket)
    expect_equal(deleted["ResponseMetadata"]["HTTPStatusCode"], 204, "DeleteBucket of the emptied bucket is 204")
    s3.create_bucket(Bucket=bucket)
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    expect_equal(uploads, [], "... and its uploads in progress went with it")
    s3.delete_bucket(Bucket=bucket)
    expect_error("HeadBucket of the deleted bucket is 404", None, 404, lambda: s3.head_bucket(Bucket=bucket))
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    expect(bucket not in names, "ListBuckets no longer names it", short(names))
    expect_error(
        "DeleteBucket of a missing bucket is NoSuchBucket",
        "NoSuchBucket",
        404,
        lambda: s3.delete_bucket(Bucket=bucket),
    )
    expect_error(
        "ListObjectsV2 of a missing bucket is NoSuchBucket",
        "NoSuchBucket",
        404,
        lambda: s3.list_objects_v2(Bucket=bucket),
    )
    expect_error(
        "PutObject into a missing bucket is NoSuchBucket",
        "NoSuchBucket",
        404,
        lambda: s3.put_object(Bucket=bucket, Key="k", Body=b"x"),
    )

    # ListBuckets in pages, as SDKs' paginators ask for them.
    paged = sorted(buckets.create(s3, f"page{i}") for i in range(3))
    prefix = buckets.name("page")
    first = s3.list_buckets(MaxBuckets=2, Prefix=prefix)
    expect_equal(
        ([b["Name"] for b in first["Buckets"]], first.get("Prefix"), "ContinuationToken" in first),
        (paged[:2], prefix, True),
        "ListBuckets with MaxBuckets 2 answers the first two and a continuation token",
    )
    rest = s3.list_buckets(MaxBuckets=2, Prefix=prefix, ContinuationToken=first["ContinuationToken"])
    expect_equal(
        ([b["Name"] for b in rest["Buckets"]], "ContinuationToken" in rest),
        (paged[2:], False),
        "... and the token the rest, with none after it",
    )
    # boto3 refuses 0 itself; without its checks, the server must.
    unchecked = client(config=Config(parameter_validation=False))
    for n in (0, 10_001):
        expect_error(
            f"ListBuckets with MaxBuckets {n} is InvalidArgument",
            "InvalidArgument",
            400,
            lambda n=n: unchecked.list_buckets(MaxBuckets=n),
        )


def area_users(s3, buckets):
    if not (ACCESS_KEY2 and SECRET_KEY2):
        print("  skip  S3_ACCESS_KEY2/S3_SECRET_KEY2 not set: no second user", flush=True)
        return
    other = client(ACCESS_KEY2, SECRET_KEY2)
    mine = buckets.create(s3, "one")
    s3.put_object(Bucket=mine, Key="secret.txt", Body=b"user one's")
    theirs = buckets.create(other, "two")
    ok("each user creates a bucket")

    names_one = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    names_two = [b["Name"] for b in other.list_buckets()["Buckets"]]
    expect(
        mine in names_one and theirs not in names_one, "ListBuckets of user 1 names its bucket only", short(names_one)
    )
    expect(
        theirs in names_two and mine not in names_two, "ListBuckets of user 2 names its bucket only", short(names_two)
    )

    expect_error(
        "CreateBucket of another user's bucket name is BucketAlreadyExists",
        "BucketAlreadyExists",
        409,
        lambda: other.create_bucket(Bucket=mine),
    )
    expect_error("HeadBucket of another user's bucket is 403", None, 403, lambda: other.head_bucket(Bucket=mine))
    expect_error(
        "ListObjectsV2 in another user's bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: other.list_objects_v2(Bucket=mine),
    )
    expect_error(
        "GetObject from another user's bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: other.get_object(Bucket=mine, Key="secret.txt"),
    )
    expect_error(
        "PutObject into another user's bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: other.put_object(Bucket=mine, Key="intruder.txt", Body=b"x"),
    )
    expect_error(
        "DeleteObject in another user's bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: other.delete_object(Bucket=mine, Key="secret.txt"),
    )
    expect_error(
        "DeleteBucket of another user's bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: other.delete_bucket(Bucket=mine),
    )
    expect_equal(body_of(s3.get_object(Bucket=mine, Key="secret.txt")), b"user one's", "the owner's object is intact")
    expect_equal(keys_of(s3.list_objects_v2(Bucket=mine)), ["secret.txt"], "nothing was added to the owner's bucket")


def area_put(s3, buckets):
    bucket = buckets.create(s3)
    body = data(3000, 1)
    put = s3.put_object(
        Bucket=bucket,
        Key="obj",
        Body=body,
        ContentType="text/plain; charset=utf-8",
        Metadata={"color": "blue", "Mixed-Case": "Value 1"},
    )
    expect_equal(put["ETag"], etag_of(body), "PutObject answers the hex MD5 as ETag")

    head = s3.head_object(Bucket=bucket, Key="obj")
    expect_equal(head["ContentLength"], len(body), "HeadObject: Content-Length")
    expect_equal(head["ContentType"], "text/plain; charset=utf-8", "HeadObject: Content-Type")
    expect_equal(head["Metadata"], {"color": "blue", "mixed-case": "Value 1"}, "HeadObject: x-amz-meta-*")
    expect_equal(head["ETag"], etag_of(body), "HeadObject: ETag")
    age = abs((datetime.datetime.now(datetime.timezone.utc) - head["LastModified"]).total_seconds())
    expect(age < 600, "HeadObject: Last-Modified is about now", str(head["LastModified"]))

    got = s3.get_object(Bucket=bucket, Key="obj")
    expect(body_of(got) == body, "GetObject returns the stored bytes")
    expect_equal(got["Metadata"], {"color": "blue", "mixed-case": "Value 1"}, "GetObject: x-amz-meta-*")
    expect_equal(got["ContentType"], "text/plain; charset=utf-8", "GetObject: Content-Type")
    attributes = s3.get_object_attributes(Bucket=bucket, Key="obj", ObjectAttributes=["ObjectSize", "ObjectParts"])
    expect_equal(
        (attributes.get("ObjectSize"), "ObjectParts" in attributes, "ETag" in attributes),
        (len(body), False, False),
        "GetObjectAttributes answers what it is asked, and no parts for an object put whole",
    )

    newer = data(2000, 2)
    md5 = base64.b64encode(hashlib.md5(newer).digest()).decode()
    s3.put_object(Bucket=bucket, Key="obj", Body=newer, ContentMD5=md5)
    expect(body_of(s3.get_object(Bucket=bucket, Key="obj")) == newer, "PutObject with the right Content-MD5 overwrites")
    wrong = base64.b64encode(hashlib.md5(b"something else").digest()).decode()
    expect_error(
        "PutObject with a wrong Content-MD5 is BadDigest",
        "BadDigest",
        400,
        lambda: s3.put_object(Bucket=bucket, Key="obj", Body=body, ContentMD5=wrong),
    )
    expect_error(
        "PutObject with a malformed Content-MD5 is InvalidDigest",
        "InvalidDigest",
        400,
        lambda: s3.put_object(Bucket=bucket, Key="obj", Body=body, ContentMD5="not-an-md5"),
    )
    expect(body_of(s3.get_object(Bucket=bucket, Key="obj")) == newer, "a refused PutObject leaves the object as it was")

    first = s3.put_object(Bucket=bucket, Key="once", Body=b"first", IfNoneMatch="*")
    expect_equal(first["ETag"], etag_of(b"first"), "PutObject If-None-Match: * creates a new key")
    expect_error(
        "PutObject If-None-Match: * on an existing key is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: s3.put_object(Bucket=bucket, Key="once", Body=b"second", IfNoneMatch="*"),
    )
    expect_equal(body_of(s3.get_object(Bucket=bucket, Key="once")), b"first", "the key kept its first body")
    s3.put_object(Bucket=bucket, Key="once", Body=b"third", IfMatch=etag_of(b"first"))
    expect_equal(body_of(s3.get_object(Bucket=bucket, Key="once")), b"third", "PutObject If-Match: current ETag writes")
    expect_error(
        "PutObject If-Match: a stale ETag is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: s3.put_object(Bucket=bucket, Key="once", Body=b"fourth", IfMatch=etag_of(b"first")),
    )
    expect_error(
        "PutObject If-Match on a missing key is NoSuchKey",
        "NoSuchKey",
        404,
        lambda: s3.put_object(Bucket=bucket, Key="absent", Body=b"x", IfMatch=etag_of(b"x")),
    )
    expect_equal(body_of(s3.get_object(Bucket=bucket, Key="once")), b"third", "refused conditional PUTs wrote nothing")
    expect_error(
        "PutObject If-None-Match: the current ETag is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: s3.put_object(Bucket=bucket, Key="once", Body=b"fifth", IfNoneMatch=etag_of(b"third")),
    )
    expect_equal(body_of(s3.get_object(Bucket=bucket, Key="once")), b"third", "... and wrote nothing")
    s3.put_object(Bucket=bucket, Key="once", Body=b"sixth", IfNoneMatch=etag_of(b"first"))
    expect_equal(
        body_of(s3.get_object(Bucket=bucket, Key="once")), b"sixth", "PutObject If-None-Match: another ETag writes"
    )
    expect_error(
        "PutObject If-Match: the current ETag made weak is PreconditionFailed (weak tags never match)",
        "PreconditionFailed",
        412,
        lambda: s3.put_object(Bucket=bucket, Key="once", Body=b"seventh", IfMatch="W/" + etag_of(b"sixth")),
    )
    s3.put_object(Bucket=bucket, Key="once", Body=b"eighth", IfMatch=f'{etag_of(b"first")}, {etag_of(b"sixth")}')
    expect_equal(
        body_of(s3.get_object(Bucket=bucket, Key="once")),
        b"eighth",
        "PutObject If-Match: a list holding the current ETag writes",
    )

    s3.put_object(Bucket=bucket, Key="headers", Body=b"with headers", **stored_args())
    expect_stored(s3.head_object(Bucket=bucket, Key="headers"), "HeadObject keeps PutObject's headers")
    got = s3.get_object(Bucket=bucket, Key="headers")
    expect_stored(got, "GetObject keeps PutObject's headers")
    expect(body_of(got) == b"with headers", "... and the bytes")
    overrides = s3.get_object(
        Bucket=bucket,
        Key="headers",
        ResponseCacheControl="no-store",
        ResponseContentDisposition="inline",
        ResponseContentEncoding="gzip",
        ResponseContentLanguage="fr",
        ResponseExpires=datetime.datetime(2030, 1, 1),
    )
    expect_stored(
        overrides,
        "GetObject response-* parameters override the stored headers",
        {
            "cache-control": "no-store",
            "content-disposition": "inline",
            "content-encoding": "gzip",
            "content-language": "fr",
            "expires": "Tue, 01 Jan 2030 00:00:00 GMT",
        },
    )
    s3.put_object(Bucket=bucket, Key="headers", Body=b"without")
    expect_stored(s3.head_object(Bucket=bucket, Key="headers"), "an overwrite without headers drops them", {})

    s3.put_object(Bucket=bucket, Key="page.html", Body=b"<script>1</script>", ContentType="text/html")
    headers = s3.get_object(Bucket=bucket, Key="page.html")["ResponseMetadata"]["HTTPHeaders"]
    expect(headers.get("content-security-policy", "").startswith("sandbox"), "an uploaded page is sandboxed", short(headers))
    headers = s3.get_object(Bucket=bucket, Key="page.html", ResponseContentType="text/plain")["ResponseMetadata"]["HTTPHeaders"]
    expect("content-security-policy" not in headers, "... unless served as another type", short(headers))

    empty = s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    expect_equal(empty["ETag"], '"d41d8cd98f00b204e9800998ecf8427e"', "an empty object's ETag is the MD5 of nothing")
    got = s3.get_object(Bucket=bucket, Key="empty")
    expect(got["ContentLength"] == 0 and body_of(got) == b"", "an empty object reads back empty")


def area_get(s3, buckets):
    bucket = buckets.create(s3)
    body = data(10_000, 3)
    etag = s3.put_object(Bucket=bucket, Key="obj", Body=body)["ETag"]

    def get(**kwargs):
        return s3.get_object(Bucket=bucket, Key="obj", **kwargs)

    r = get(Range="bytes=100-199")
    expect_equal(r["ResponseMetadata"]["HTTPStatusCode"], 206, "GetObject Range: status 206")
    expect_equal(r["ContentRange"], "bytes 100-199/10000", "GetObject Range: Content-Range")
    expect_equal(r["ContentLength"], 100, "GetObject Range: Content-Length")
    expect(body_of(r) == body[100:200], "GetObject Range bytes=100-199 returns those bytes")
    expect(body_of(get(Range="bytes=-300")) == body[-300:], "GetObject Range bytes=-300 returns the last 300")
    expect(body_of(get(Range="bytes=9990-")) == body[9990:], "GetObject Range bytes=9990- returns the tail")
    expect(body_of(get(Range="bytes=9990-20000")) == body[9990:], "a range past the end is cut at the end")
    expect_error(
        "GetObject Range starting past the end is InvalidRange",
        "InvalidRange",
        416,
        lambda: get(Range="bytes=10000-"),
    )
    r = s3.head_object(Bucket=bucket, Key="obj", Range="bytes=100-199")
    expect_equal(r["ResponseMetadata"]["HTTPStatusCode"], 206, "HeadObject Range: status 206")
    expect_equal(r["ContentLength"], 100, "HeadObject Range: the range's length")
    expect_equal(r["ContentRange"], "bytes 100-199/10000", "HeadObject Range: Content-Range")
    expect_error(
        "HeadObject Range past the end is 416",
        "416",
        416,
        lambda: s3.head_object(Bucket=bucket, Key="obj", Range="bytes=10000-"),
    )
    # A presigned URL signs only the host: a Range it is sent with that is
    # not one byte range is ignored, as S3 ignores it, and so is a date
    # condition that is not a date (RFC 9110 sections 14.2 and 13.1.3).
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "obj"})
    for bad in ["bytes=0-1,5-6", "bytes=5-1", "bytes=abc", "items=0-5"]:
        status, _, got = http_get(url, {"Range": bad})
        what = f"Range: {bad} is ignored (200, the whole object)"
        expect(status == 200 and got == body, what, f"{status}: {short(got)}")
    for name in ["If-Modified-Since", "If-Unmodified-Since"]:
        status, _, got = http_get(url, {name: "not a date"})
        expect(status == 200 and got == body, f"{name}: not a date is ignored (200)", f"{status}: {short(got)}")
    status, sent, got = http_get(url, {"Range": "bytes=100-199"})
    expect(
        (status, sent.get("Content-Range"), got) == (206, "bytes 100-199/10000", body[100:200]),
        "... while a valid Range is served (206)",
        f"{status}: {short(got)}",
    )
    status, _, got = http_get(url, {"Range": "bytes=10000-"})
    expect_equal((status, error_code(got)), (416, "InvalidRange"), "... and one past the end is InvalidRange (416)")
    expect(body_of(get(VersionId="null")) == body, "GetObject VersionId=null: the one version")
    expect_error(
        "GetObject of another VersionId is InvalidArgument (buckets are not versioned)",
        "InvalidArgument",
        400,
        lambda: get(VersionId="3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY"),
    )

    expect(body_of(get(IfMatch=etag)) == body, "GetObject If-Match: the ETag returns the object")
    expect_error(
        "GetObject If-Match: another ETag is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: get(IfMatch='"0123456789abcdef0123456789abcdef"'),
    )
    not_modified = expect_error("GetObject If-None-Match: the ETag is 304", None, 304, lambda: get(IfNoneMatch=etag))
    sent = not_modified.response["ResponseMetadata"]["HTTPHeaders"]
    expect_equal(
        (sent.get("etag"), bool(sent.get("last-modified"))),
        (etag, True),
        "... carrying the ETag and Last-Modified a cache updates",
    )
    expect(body_of(get(IfNoneMatch='"0123456789abcdef0123456789abcdef"')) == body, "If-None-Match: another ETag is 200")

    # Last-Modified is whole seconds; the object may be younger by a
    # fraction. A second after it, and no later than now, is after it.
    modified = s3.head_object(Bucket=bucket, Key="obj")["LastModified"]
    after, day = modified + datetime.timedelta(seconds=1), datetime.timedelta(days=1)
    time.sleep(max(0.0, (after - datetime.datetime.now(datetime.timezone.utc)).total_seconds() + 1))
    expect_error("GetObject If-Modified-Since: a second after it is 304", None, 304, lambda: get(IfModifiedSince=after))
    expect(body_of(get(IfModifiedSince=modified - day)) == body, "GetObject If-Modified-Since: a day before is 200")
    expect_error(
        "GetObject If-Unmodified-Since: a day before is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: get(IfUnmodifiedSince=modified - day),
    )
    expect(body_of(get(IfUnmodifiedSince=after)) == body, "GetObject If-Unmodified-Since: a second after it is 200")
    expect(
        body_of(get(IfMatch=etag, IfUnmodifiedSince=modified - day)) == body,
        "If-Match true wins over If-Unmodified-Since false (200)",
    )

    r = get(
        ResponseContentType="application/x-depot-test",
        ResponseContentDisposition='attachment; filename="report.txt"',
        ResponseCacheControl="no-cache",
    )
    expect_equal(r["ContentType"], "application/x-depot-test", "response-content-type overrides Content-Type")
    expect_equal(
        r.get("ContentDisposition"),
        'attachment; filename="report.txt"',
        "response-content-disposition sets Content-Disposition",
    )
    expect_equal(r.get("CacheControl"), "no-cache", "response-cache-control sets Cache-Control")
    h = s3.head_object(
        Bucket=bucket,
        Key="obj",
        ResponseContentType="application/x-depot-test",
        ResponseContentDisposition='attachment; filename="report.txt"',
    )
    expect_equal(
        (h["ContentType"], h.get("ContentDisposition")),
        ("application/x-depot-test", 'attachment; filename="report.txt"'),
        "HeadObject answers the response-* overrides as GetObject does",
    )

    expect_error("HeadObject of a missing key is 404", None, 404, lambda: s3.head_object(Bucket=bucket, Key="absent"))
    expect_error(
        "GetObject of a missing key is NoSuchKey",
        "NoSuchKey",
        404,
        lambda: s3.get_object(Bucket=bucket, Key="absent"),
    )
    expect_error(
        "GetObject in a missing bucket is NoSuchBucket",
        "NoSuchBucket",
        404,
        lambda: s3.get_object(Bucket=buckets.name("absent"), Key="obj"),
    )


def area_empty_and_parts(s3, buckets):
    bucket = buckets.create(s3)
    s3.put_object(Bucket=bucket, Key="empty", Body=b"")
    expect_error(
        "a suffix Range of an empty object is 416",
        "InvalidRange",
        416,
        lambda: s3.get_object(Bucket=bucket, Key="empty", Range="bytes=-5"),
    )
    whole = data(1000, 3)
    s3.put_object(Bucket=bucket, Key="whole", Body=whole)
    # An object not made of parts is its one part.
    got = s3.get_object(Bucket=bucket, Key="whole", PartNumber=1)
    expect_equal(
        (body_of(got), got["ContentRange"], got.get("PartsCount")),
        (whole, "bytes 0-999/1000", None),
        "GetObject by partNumber 1 of a simple object is all of it",
    )
    head = s3.head_object(Bucket=bucket, Key="whole", PartNumber=1)
    expect_equal(
        (head["ResponseMetadata"]["HTTPStatusCode"], head["ContentLength"]),
        (206, 1000),
        "HeadObject by partNumber 1 of a simple object",
    )
    expect_error(
        "GetObject by partNumber 2 of a simple object is InvalidPartNumber",
        "InvalidPartNumber",
        416,
        lambda: s3.get_object(Bucket=bucket, Key="whole", PartNumber=2),
    )
    expect_error(
        "GetObject by partNumber with a Range is InvalidRequest",
        "InvalidRequest",
        400,
        lambda: s3.get_object(Bucket=bucket, Key="whole", PartNumber=1, Range="bytes=0-9"),
    )
    expect_error(
        "GetObject by partNumber 10001 is InvalidArgument",
        "InvalidArgument",
        400,
        lambda: s3.get_object(Bucket=bucket, Key="whole", PartNumber=10001),
    )


def area_object_acls(s3, buckets):
    """Objects are as public as their bucket: a canned ACL that says
    otherwise is refused, never ignored."""
    public = buckets.create(s3, "public", ACL="public-read")
    private = buckets.create(s3, "private")
    expect_error(
        "PutObject with ACL private into a public-read bucket is 501",
        "NotImplemented",
        501,
        lambda: s3.put_object(Bucket=public, Key="secret", Body=b"secret", ACL="private"),
    )
    expect_error("... and stored nothing", None, 404, lambda: s3.head_object(Bucket=public, Key="secret"))
    expect_error(
        "PutObject with ACL public-read into a private bucket is 501",
        "NotImplemented",
        501,
        lambda: s3.put_object(Bucket=private, Key="open", Body=b"open", ACL="public-read"),
    )
    expect_error(
        "CreateMultipartUpload with ACL private into a public-read bucket is 501",
        "NotImplemented",
        501,
        lambda: s3.create_multipart_upload(Bucket=public, Key="secret", ACL="private"),
    )
    s3.put_object(Bucket=public, Key="open", Body=b"open", ACL="public-read")
    s3.put_object(Bucket=private, Key="mine", Body=b"mine", ACL="private")
    s3.put_object(Bucket=private, Key="theirs", Body=b"theirs", ACL="bucket-owner-full-control")
    ok("ACLs that match the bucket's access are accepted")


def area_unsupported(s3, buckets):
    """What a write asks that depot does not do is refused, never dropped."""
    bucket = buckets.create(s3)
    s3.put_object(Bucket=bucket, Key="src", Body=b"source")
    asks = [
        ("Tagging", {"Tagging": "team=a"}, "NotImplemented", 501),
        ("SSE-S3", {"ServerSideEncryption": "AES256"}, "NotImplemented", 501),
        ("SSE-C", {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32}, "NotImplemented", 501),
        ("object lock", {"ObjectLockLegalHoldStatus": "ON"}, "NotImplemented", 501),
        ("a grant", {"GrantRead": 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'}, "NotImplemented", 501),
        ("a website redirect", {"WebsiteRedirectLocation": "/elsewhere"}, "NotImplemented", 501),
        ("GLACIER", {"StorageClass": "GLACIER"}, "InvalidStorageClass", 400),
    ]
    for what, extra, code, status in asks:
        expect_error(
            f"PutObject with {what} is {status}",
            code,
            status,
            lambda: s3.put_object(Bucket=bucket, Key="asked", Body=b"asked", **extra),
        )
        expect_error(
            f"CopyObject with {what} is {status}",
            code,
            status,
            lambda: s3.copy_object(Bucket=bucket, Key="asked", CopySource={"Bucket": bucket, "Key": "src"}, **extra),
        )
        expect_error(
            f"CreateMultipartUpload with {what} is {status}",
            code,
            status,
            lambda: s3.create_multipart_upload(Bucket=bucket, Key="asked", **extra),
        )
    expect_error("... and nothing was stored", None, 404, lambda: s3.head_object(Bucket=bucket, Key="asked"))
    expect_equal(s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []), [], "... and no upload began")
    expect_error(
        "PutObject appending at an offset is 501",
        "NotImplemented",
        501,
        lambda: s3.put_object(Bucket=bucket, Key="src", Body=b" appended", WriteOffsetBytes=6),
    )
    expect_equal(s3.get_object(Bucket=bucket, Key="src")["Body"].read(), b"source", "... and the object is as it was")
    for what, extra in [("size", {"IfMatchSize": 6}), ("time", {"IfMatchLastModifiedTime": datetime.datetime.now()})]:
        expect_error(
            f"DeleteObject conditional on {what} is 501",
            "NotImplemented",
            501,
            lambda: s3.delete_object(Bucket=bucket, Key="src", **extra),
        )
    expect_equal(s3.head_object(Bucket=bucket, Key="src")["ContentLength"], 6, "... and the object is still there")
    s3.put_object(Bucket=bucket, Key="std", Body=b"std", StorageClass="STANDARD")
    s3.put_object(Bucket=bucket, Key="rrs", Body=b"rrs", StorageClass="REDUCED_REDUNDANCY")
    ok("StorageClass STANDARD and REDUCED_REDUNDANCY are accepted")

    # SigV4a, in a header or a presigned URL, is said to be unsupported.
    amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    credential = f"{ACCESS_KEY}/{amz_date[:8]}/s3/aws4_request"
    sigv4a = {
        "x-amz-date": amz_date,
        "x-amz-region-set": "*",
        "x-amz-content-sha256": EMPTY_SHA256,
        "Authorization": f"AWS4-ECDSA-P256-SHA256 Credential={credential}, "
        "SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-region-set, Signature=3045022100ab",
    }
    status, _, got = http_get(f"{ENDPOINT}/{bucket}/std", sigv4a)
    expect(
        status == 501 and error_code(got) == "NotImplemented",
        "a SigV4a request is 501 NotImplemented",
        f"status {status}: {got[:300]!r}",
    )
    query = urllib.parse.urlencode(
        {"X-Amz-Algorithm": "AWS4-ECDSA-P256-SHA256", "X-Amz-Credential": credential, "X-Amz-Date": amz_date}
    )
    status, _, got = http_get(f"{ENDPOINT}/{bucket}/std?{query}&X-Amz-Signature=30450221")
    expect(status == 501, "... and so is a SigV4a presigned URL", f"status {status}: {got[:300]!r}")


def area_delete(s3, buckets):
    bucket = buckets.create(s3)
    for key in ["d1", "d2", "d3", "q1", "q2", "keep"]:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    r = s3.delete_object(Bucket=bucket, Key="d1")
    expect_equal(r["ResponseMetadata"]["HTTPStatusCode"], 204, "DeleteObject is 204")
    expect_error("HeadObject after DeleteObject is 404", None, 404, lambda: s3.head_object(Bucket=bucket, Key="d1"))
    r = s3.delete_object(Bucket=bucket, Key="never-was")
    expect_equal(r["ResponseMetadata"]["HTTPStatusCode"], 204, "DeleteObject of a missing key is 204 too")
    s3.put_object(Bucket=bucket, Key="d1", Body=b"d1")
    expect_error(
        "DeleteObject If-Match: the ETag made weak is PreconditionFailed (weak tags never match)",
        "PreconditionFailed",
        412,
        lambda: s3.delete_object(Bucket=bucket, Key="d1", IfMatch="W/" + etag_of(b"d1")),
    )
    expect_equal(s3.head_object(Bucket=bucket, Key="d1")["ContentLength"], 2, "... and deleted nothing")
    s3.delete_object(Bucket=bucket, Key="d1", IfMatch=f'"0123456789abcdef0123456789abcdef", {etag_of(b"d1")}')
    expect_error(
        "DeleteObject If-Match: a list holding the ETag deletes",
        None,
        404,
        lambda: s3.head_object(Bucket=bucket, Key="d1"),
    )

    expect_error(
        "DeleteObject If-Match of a key that does not exist is NoSuchKey",
        "NoSuchKey",
        404,
        lambda: s3.delete_object(Bucket=bucket, Key="never-was", IfMatch=etag_of(b"x")),
    )
    expect_error(
        "DeleteObject of another VersionId is InvalidArgument (buckets are not versioned)",
        "InvalidArgument",
        400,
        lambda: s3.delete_object(Bucket=bucket, Key="d2", VersionId="3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY"),
    )
    expect_equal(s3.head_object(Bucket=bucket, Key="d2")["ContentLength"], 2, "... and deleted nothing")

    # Conditional entries: deleted only with their ETag still current.
    for key in ["c1", "c2", "c3", "c4", "c5"]:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    r = s3.delete_objects(
        Bucket=bucket,
        Delete={
            "Objects": [
                {"Key": "c1", "ETag": etag_of(b"c1")},
                {"Key": "c2", "ETag": etag_of(b"stale")},
                {"Key": "c3", "VersionId": "3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY"},
                {"Key": "never-was", "ETag": etag_of(b"x")},
                {"Key": "c4", "Size": 2},
                {"Key": "c5", "LastModifiedTime": datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)},
            ]
        },
    )
    expect_equal(sorted(d["Key"] for d in r.get("Deleted", [])), ["c1"], "DeleteObjects with ETags deletes the matches")
    expect_equal(
        sorted((e["Key"], e["Code"]) for e in r.get("Errors", [])),
        [
            ("c2", "PreconditionFailed"),
            ("c3", "InvalidArgument"),
            ("c4", "NotImplemented"),
            ("c5", "NotImplemented"),
            ("never-was", "NoSuchKey"),
        ],
        "DeleteObjects: a stale ETag, another version, a size or time condition and a gone key are errors",
    )
    expect_equal(
        keys_of(s3.list_objects_v2(Bucket=bucket, Prefix="c")), ["c2", "c3", "c4", "c5"], "... and those are kept"
    )
    versioned = [e.get("VersionId") for e in r.get("Errors", []) if e["Key"] == "c3"]
    expect_equal(versioned, ["3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY"], "DeleteObjects: an entry's error names its VersionId")
    # In the document's order: the condition holds when its entry comes.
    r = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": "c2", "ETag": etag_of(b"c2")}, {"Key": "c2"}] + [{"Key": k} for k in ["c3", "c4", "c5"]]},
    )
    expect_equal(
        (sorted(d["Key"] for d in r.get("Deleted", [])), r.get("Errors", [])),
        (["c2", "c2", "c3", "c4", "c5"], []),
        "DeleteObjects: entries are taken in order",
    )

    r = s3.delete_objects(
        Bucket=bucket,
        Delete={"Objects": [{"Key": "d2"}, {"Key": "d3"}, {"Key": "never-was"}]},
    )
    deleted = sorted(d["Key"] for d in r.get("Deleted", []))
    expect_equal(deleted, ["d2", "d3", "never-was"], "DeleteObjects reports every key deleted, missing ones too")
    expect_equal(r.get("Errors", []), [], "DeleteObjects reports no errors")
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "q1"}, {"Key": "q2"}], "Quiet": True})
    expect_equal(r.get("Deleted", []), [], "DeleteObjects in Quiet mode lists nothing deleted")
    expect_equal(r.get("Errors", []), [], "DeleteObjects in Quiet mode reports no errors")
    expect_equal(keys_of(s3.list_objects_v2(Bucket=bucket)), ["keep"], "only the kept key remains")

    # A document changed on the way, after boto3 computed its checksum and
    # signed: another key than the one meant must not be deleted.
    s3.put_object(Bucket=bucket, Key="keepmf", Body=b"kept")

    def change_document(request, **_):
        request.body = request.body.replace(b"<Key>keepme</Key>", b"<Key>keepmf</Key>")

    s3.meta.events.register("before-send.s3.DeleteObjects", change_document)
    try:
        expect_error(
            "a DeleteObjects document changed after its checksum is refused with 400",
            None,
            400,
            lambda: s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "keepme"}]}),
        )
    finally:
        s3.meta.events.unregister("before-send.s3.DeleteObjects", change_document)
    expect_equal(s3.head_object(Bucket=bucket, Key="keepmf")["ContentLength"], 4, "... and deleted nothing")

    # Keys as a client may write them in the document: characters as
    # character references, and a carriage return, which the answer must
    # escape too (an XML parser reads a raw one as a line feed).
    odd = ["ref-\u00fc-x", "cr-\r-x"]
    for key in odd:
        s3.put_object(Bucket=bucket, Key=key, Body=b"odd")
    document = b"<Delete><Object><Key>ref-&#xFC;-x</Key></Object><Object><Key>cr-&#13;-x</Key></Object></Delete>"
    md5 = base64.b64encode(hashlib.md5(document).digest()).decode()
    payload = hashlib.sha256(document).hexdigest()
    now = datetime.datetime.now(datetime.timezone.utc)
    *_, headers = signed_put(f"/{bucket}", document, payload, now, {"content-md5": md5}, "POST", "delete=")
    status, answer = send_put(f"/{bucket}", document, headers, "POST", "delete")
    expect_equal(status, 200, "DeleteObjects with character references")
    deleted = sorted(e.text for e in ET.fromstring(answer).iter() if e.tag.rpartition("}")[2] == "Key")
    expect_equal(deleted, sorted(odd), "DeleteObjects reads character references and answers with the keys exact")
    expect_equal(keys_of(s3.list_objects_v2(Bucket=bucket)), ["keep", "keepmf"], "... and deleted them")

    status, headers, answer = http_get(f"{ENDPOINT}/{bucket}/keep?acl")  # anonymous: AccessDenied
    named = ET.fromstring(answer).findtext("RequestId")
    expect(
        status == 403 and named and named == headers.get("x-amz-request-id"),
        "an error's XML names its request, as the x-amz-request-id header does",
        f"status {status}, {short(answer)}",
    )


def area_copy(s3, buckets):
    bucket = buckets.create(s3)
    other = buckets.create(s3, "dst")
    body = data(50_000, 4)
    src_etag = s3.put_object(
        Bucket=bucket,
        Key="src/orig",
        Body=body,
        ContentType="text/x-orig",
        Metadata={"origin": "source"},
        **stored_args(),
    )["ETag"]
    source = {"Bucket": bucket, "Key": "src/orig"}

    r = s3.copy_object(Bucket=bucket, Key="dst/copy", CopySource=source)
    expect_equal(r["CopyObjectResult"]["ETag"], src_etag, "CopyObject answers the source's ETag")
    versioned = {**source, "VersionId": "3HL4kqtJlcpXroDTDmJ-rmSpXd3dIbrHY"}
    expect_error(
        "CopyObject from another version is InvalidArgument (buckets are not versioned)",
        "InvalidArgument",
        400,
        lambda: s3.copy_object(Bucket=bucket, Key="dst/versioned", CopySource=versioned),
    )
    expect_error("... and copied nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="dst/versioned"))
    r = s3.copy_object(Bucket=bucket, Key="dst/versioned", CopySource={**source, "VersionId": "null"})
    expect_equal(r["CopyObjectResult"]["ETag"], src_etag, "CopyObject from version null copies")

    # The destination's own conditions, as on PutObject.
    s3.put_object(Bucket=bucket, Key="dst/precious", Body=b"precious")
    expect_error(
        "CopyObject onto an existing key with If-None-Match: * is 412",
        "PreconditionFailed",
        412,
        lambda: s3.copy_object(Bucket=bucket, Key="dst/precious", CopySource=source, IfNoneMatch="*"),
    )
    expect_error(
        "CopyObject with an If-Match that does not hold is 412",
        "PreconditionFailed",
        412,
        lambda: s3.copy_object(Bucket=bucket, Key="dst/precious", CopySource=source, IfMatch='"0000"'),
    )
    expect_error(
        "CopyObject with If-None-Match: the destination's ETag is 412",
        "PreconditionFailed",
        412,
        lambda: s3.copy_object(Bucket=bucket, Key="dst/precious", CopySource=source, IfNoneMatch=etag_of(b"precious")),
    )
    expect(body_of(s3.get_object(Bucket=bucket, Key="dst/precious")) == b"precious", "... and the key kept its bytes")
    s3.copy_object(Bucket=bucket, Key="dst/fresh", CopySource=source, IfNoneMatch="*")
    expect(body_of(s3.get_object(Bucket=bucket, Key="dst/fresh")) == body, "If-None-Match: * copies onto a new key")
    head = s3.head_object(Bucket=bucket, Key="dst/copy")
    expect_equal(head["Metadata"], {"origin": "source"}, "CopyObject (COPY) keeps the metadata")
    expect_equal(head["ContentType"], "text/x-orig", "CopyObject (COPY) keeps the Content-Type")
    expect_stored(head, "CopyObject (COPY) keeps the stored headers")
    expect(body_of(s3.get_object(Bucket=bucket, Key="dst/copy")) == body, "the copy holds the source's bytes")

    s3.copy_object(
        Bucket=bucket,
        Key="dst/replaced",
        CopySource=source,
        MetadataDirective="REPLACE",
        Metadata={"fresh": "yes"},
        ContentType="application/x-new",
    )
    head = s3.head_object(Bucket=bucket, Key="dst/replaced")
    expect_equal(head["Metadata"], {"fresh": "yes"}, "CopyObject (REPLACE) sets the new metadata only")
    expect_equal(head["ContentType"], "application/x-new", "CopyObject (REPLACE) sets the new Content-Type")
    expect_stored(head, "CopyObject (REPLACE) without headers drops the stored ones", {})
    expect(body_of(s3.get_object(Bucket=bucket, Key="dst/replaced")) == body, "the replaced copy holds the bytes")

    expect_error(
        "CopyObject onto itself without REPLACE is InvalidRequest",
        "InvalidRequest",
        400,
        lambda: s3.copy_object(Bucket=bucket, Key="src/orig", CopySource=source),
    )
    s3.copy_object(
        Bucket=bucket, Key="src/orig", CopySource=source, MetadataDirective="REPLACE", Metadata={"origin": "updated"}
    )
    head = s3.head_object(Bucket=bucket, Key="src/orig")
    expect_equal(head["Metadata"], {"origin": "updated"}, "CopyObject onto itself with REPLACE updates the metadata")
    expect(body_of(s3.get_object(Bucket=bucket, Key="src/orig")) == body, "... and keeps the bytes")

    odd = "sp ace/ü+%&.txt"
    s3.put_object(Bucket=bucket, Key=odd, Body=b"odd source")
    s3.copy_object(Bucket=other, Key="from other bucket", CopySource={"Bucket": bucket, "Key": odd})
    expect_equal(
        body_of(s3.get_object(Bucket=other, Key="from other bucket")),
        b"odd source",
        "CopyObject across buckets, from a key that needs escaping",
    )
    expect_error(
        "CopyObject of a missing source is NoSuchKey",
        "NoSuchKey",
        404,
        lambda: s3.copy_object(Bucket=bucket, Key="x", CopySource={"Bucket": bucket, "Key": "absent"}),
    )
    expect_error(
        "CopyObject x-amz-copy-source-if-match: another ETag is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: s3.copy_object(
            Bucket=bucket, Key="x", CopySource=source, CopySourceIfMatch='"0123456789abcdef0123456789abcdef"'
        ),
    )
    now_etag = s3.head_object(Bucket=bucket, Key="src/orig")["ETag"]
    future = datetime.datetime(2100, 1, 1, tzinfo=datetime.timezone.utc)
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    for what, condition in [
        ("if-none-match: its ETag", {"CopySourceIfNoneMatch": now_etag}),
        ("if-modified-since: later than it", {"CopySourceIfModifiedSince": future}),
        ("if-unmodified-since: before it", {"CopySourceIfUnmodifiedSince": past}),
    ]:
        expect_error(
            f"CopyObject x-amz-copy-source-{what} is PreconditionFailed",
            "PreconditionFailed",
            412,
            lambda condition=condition: s3.copy_object(Bucket=bucket, Key="x", CopySource=source, **condition),
        )
    s3.copy_object(
        Bucket=bucket, Key="x", CopySource=source, CopySourceIfMatch=now_etag, CopySourceIfModifiedSince=past
    )
    expect(
        body_of(s3.get_object(Bucket=bucket, Key="x")) == body, "CopyObject with source conditions that hold copies"
    )
    expect_error(
        "CopyObject (REPLACE) with more than 2 KB of metadata is MetadataTooLarge",
        "MetadataTooLarge",
        400,
        lambda: s3.copy_object(
            Bucket=bucket, Key="y", CopySource=source, MetadataDirective="REPLACE", Metadata={"big": "x" * 3000}
        ),
    )


LISTED = ["a/1", "a/2", "a/b/3", "b/1", "c", "d/e/f", "plus+sign", "sp ace", "ü"]


def area_listing(s3, buckets):
    bucket = buckets.create(s3)
    empty = s3.list_objects_v2(Bucket=bucket)
    expect(empty["KeyCount"] == 0 and "Contents" not in empty, "ListObjectsV2 of an empty bucket", short(empty))
    for key in LISTED:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode() * 3)
    everything = sorted(LISTED)

    r = s3.list_objects_v2(Bucket=bucket)
    expect_equal(keys_of(r), everything, "ListObjectsV2 lists every key in UTF-8 order")
    expect_equal(r["KeyCount"], len(LISTED), "ListObjectsV2: KeyCount")
    expect_equal(r["IsTruncated"], False, "ListObjectsV2: not truncated")
    wrong = [
        o
        for o in r["Contents"]
        if o.get("Size") != len(o["Key"].encode() * 3)
        or o.get("ETag") != etag_of(o["Key"].encode() * 3)
        or "LastModified" not in o
    ]
    expect(not wrong, "ListObjectsV2: each entry's Size, ETag and LastModified", short(wrong))
    first = r["Contents"][0]
    expect_equal(
        first["LastModified"],
        s3.head_object(Bucket=bucket, Key=first["Key"])["LastModified"],
        "ListObjectsV2 gives LastModified in whole seconds, as HeadObject does",
    )
    expect_equal(
        s3.get_bucket_versioning(Bucket=bucket).get("Status"), None, "GetBucketVersioning: an unversioned bucket"
    )
    me = {"ID": OWNER_ID}
    expect(all("Owner" not in o for o in r["Contents"]), "ListObjectsV2 names no Owner unless asked", short(r))
    r = s3.list_objects_v2(Bucket=bucket, FetchOwner=True)
    expect(all(o.get("Owner") == me for o in r["Contents"]), "ListObjectsV2 FetchOwner: each Owner", short(r))
    r = s3.list_objects(Bucket=bucket)
    expect(all(o.get("Owner") == me for o in r["Contents"]), "ListObjects (V1) names each Owner", short(r))

    r = s3.list_objects_v2(Bucket=bucket, Prefix="a/")
    expect_equal(keys_of(r), ["a/1", "a/2", "a/b/3"], "ListObjectsV2 Prefix=a/")
    r = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    expect_equal(keys_of(r), ["c", "plus+sign", "sp ace", "ü"], "ListObjectsV2 Delimiter=/: Contents")
    expect_equal(prefixes_of(r), ["a/", "b/", "d/"], "ListObjectsV2 Delimiter=/: CommonPrefixes")
    r = s3.list_objects_v2(Bucket=bucket, Prefix="a/", Delimiter="/")
    expect_equal((keys_of(r), prefixes_of(r)), (["a/1", "a/2"], ["a/b/"]), "ListObjectsV2 Prefix=a/ Delimiter=/")
    r = s3.list_objects_v2(Bucket=bucket, Prefix="a", Delimiter="/b/")
    expect_equal(
        (keys_of(r), prefixes_of(r)), (["a/1", "a/2"], ["a/b/"]), "ListObjectsV2 Delimiter=/b/ (several characters)"
    )
    r = s3.list_objects_v2(Bucket=bucket, Prefix="zzz")
    expect(r["KeyCount"] == 0 and not keys_of(r), "ListObjectsV2 with a prefix nothing has", short(r))

    seen, pages, token = [], 0, None
    while True:
        kwargs = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=bucket, MaxKeys=2, **kwargs)
        pages += 1
        if len(keys_of(r)) > 2 or r["KeyCount"] != len(keys_of(r)):
            raise CheckFailed(f"ListObjectsV2 MaxKeys=2 page {pages}: {short(r)}")
        seen += keys_of(r)
        if not r["IsTruncated"]:
            break
        token = r.get("NextContinuationToken")
        if not token or pages > 20:
            raise CheckFailed(f"ListObjectsV2 MaxKeys=2 page {pages} is truncated without a token: {short(r)}")
    expect_equal(seen, everything, "ListObjectsV2 MaxKeys=2 with ContinuationToken walks every key once")
    expect_equal(pages, 5, "... in 5 pages")

    seen, token = [], None
    for _ in range(10):
        kwargs = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=bucket, MaxKeys=2, Delimiter="/", **kwargs)
        entries = keys_of(r) + prefixes_of(r)
        if len(entries) > 2:
            raise CheckFailed(f"ListObjectsV2 MaxKeys=2 Delimiter=/ returned {entries}")
        seen += entries
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    want = ["a/", "b/", "c", "d/", "plus+sign", "sp ace", "ü"]
    expect_equal(sorted(seen), want, "ListObjectsV2 MaxKeys=2 Delimiter=/ counts CommonPrefixes as keys")

    r = s3.list_objects_v2(Bucket=bucket, StartAfter="b/1")
    expect_equal(keys_of(r), [k for k in everything if k > "b/1"], "ListObjectsV2 StartAfter=b/1")

    # botocore asks for encoding-type=url itself and decodes the answer; a
    # caller that names EncodingType gets the keys as sent.
    r = s3.list_objects_v2(Bucket=bucket, EncodingType="url")
    expect_equal(r.get("EncodingType"), "url", "ListObjectsV2 EncodingType=url is echoed")
    raw = keys_of(r)
    expect(
        all(k.isascii() and " " not in k for k in raw) and "plus+sign" not in raw,
        "EncodingType=url escapes spaces, '+' and non-ASCII",
        short(raw),
    )
    expect_equal([urllib.parse.unquote_plus(k) for k in raw], everything, "EncodingType=url keys decode to the keys")

    r = s3.list_objects(Bucket=bucket)
    expect_equal(keys_of(r), everything, "ListObjects (v1) lists every key")
    r = s3.list_objects(Bucket=bucket, Marker="b/1")
    expect_equal(keys_of(r), [k for k in everything if k > "b/1"], "ListObjects (v1) Marker=b/1")
    seen, marker = [], ""
    for _ in range(10):
        r = s3.list_objects(Bucket=bucket, MaxKeys=4, Marker=marker)
        seen += keys_of(r)
        if not r["IsTruncated"]:
            break
        marker = keys_of(r)[-1]
    expect_equal(seen, everything, "ListObjects (v1) MaxKeys=4 with Marker walks every key once")
    r = s3.list_objects(Bucket=bucket, MaxKeys=2, Delimiter="/")
    expect(
        r["IsTruncated"] and r.get("NextMarker"),
        "ListObjects (v1) truncated with a delimiter gives NextMarker",
        short(r),
    )

    paged = [
        k
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 2})
        for k in keys_of(page)
    ]
    expect_equal(paged, everything, "the ListObjectsV2 paginator (page size 2)")
    paged = [
        k
        for page in s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig={"PageSize": 3})
        for k in keys_of(page)
    ]
    expect_equal(paged, everything, "the ListObjects paginator (page size 3)")

    folder = buckets.create(s3, "folder")
    for k in ["photos/", "photos/a.jpg", "photos/b.jpg", "photos/sub/c.jpg"]:
        s3.put_object(Bucket=folder, Key=k, Body=b"")
    pages = list(
        s3.get_paginator("list_objects_v2").paginate(
            Bucket=folder, Prefix="photos/", Delimiter="/", PaginationConfig={"PageSize": 1}
        )
    )
    expect_equal(
        [k for p in pages for k in keys_of(p) + prefixes_of(p)],
        ["photos/", "photos/a.jpg", "photos/b.jpg", "photos/sub/"],
        "ListObjectsV2 paged one by one past a folder marker equal to the prefix",
    )
    r = s3.list_objects_v2(Bucket=folder, Prefix="photos/", StartAfter="photos/")
    expect_equal(keys_of(r), ["photos/a.jpg", "photos/b.jpg", "photos/sub/c.jpg"], "StartAfter the folder marker")

    r = s3.list_object_versions(Bucket=bucket)
    versions = r.get("Versions", [])
    expect_equal([v["Key"] for v in versions], everything, "ListObjectVersions lists every key")
    expect(
        all(v["VersionId"] == "null" and v["IsLatest"] for v in versions),
        "ListObjectVersions: VersionId 'null', IsLatest",
        short(versions),
    )
    expect_equal(r.get("DeleteMarkers", []), [], "ListObjectVersions: no delete markers")
    r = s3.list_object_versions(Bucket=bucket, Prefix="a/")
    expect_equal([v["Key"] for v in r.get("Versions", [])], ["a/1", "a/2", "a/b/3"], "ListObjectVersions Prefix=a/")


def area_upload_listing(s3, buckets):
    bucket = buckets.create(s3, "uploads")
    same = [s3.create_multipart_upload(Bucket=bucket, Key="same")["UploadId"] for _ in range(6)]
    for k in ["d/a", "d/b", "e/c"]:
        s3.create_multipart_upload(Bucket=bucket, Key=k)
    seen = [
        (u["Key"], u["UploadId"])
        for page in s3.get_paginator("list_multipart_uploads").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": 1}
        )
        for u in page.get("Uploads", [])
    ]
    expect_equal(
        [k for k, _ in seen], ["d/a", "d/b", "e/c"] + ["same"] * 6, "ListMultipartUploads paged one by one: the keys"
    )
    expect_equal(
        sorted(u for k, u in seen if k == "same"),
        sorted(same),
        "... each of six uploads of one key once",
    )
    r = s3.list_multipart_uploads(Bucket=bucket, Delimiter="/")
    expect_equal(prefixes_of(r), ["d/", "e/"], "ListMultipartUploads Delimiter=/ rolls keys up")
    expect_equal(sorted(u["Key"] for u in r.get("Uploads", [])), ["same"] * 6, "... and lists the rest")
    # Asked for url encoding, every key-like element of the answer is
    # encoded, the markers and the delimiter too.
    r = s3.list_multipart_uploads(Bucket=bucket, KeyMarker="d/a b", Delimiter=" ", EncodingType="url")
    expect_equal(
        (r.get("KeyMarker"), r.get("Delimiter")),
        ("d/a%20b", "%20"),
        "ListMultipartUploads EncodingType=url encodes KeyMarker and Delimiter",
    )
    # No key holds a NUL character: a listing that names one is refused.
    for listing, field in [
        (s3.list_multipart_uploads, "Prefix"),
        (s3.list_multipart_uploads, "KeyMarker"),
        (s3.list_objects_v2, "Prefix"),
        (s3.list_objects_v2, "StartAfter"),
    ]:
        expect_error(
            f"{listing.__name__} with a NUL in its {field}",
            "InvalidArgument",
            400,
            lambda: listing(Bucket=bucket, **{field: "d\x00"}),
        )


def area_multipart(s3, buckets):
    bucket = buckets.create(s3)
    source = data(6 * MiB, 5)
    s3.put_object(Bucket=bucket, Key="mp/source", Body=source)
    key = "mp/object"

    created = s3.create_multipart_upload(
        Bucket=bucket, Key=key, ContentType="application/x-parts", Metadata={"kind": "multipart"}, **stored_args()
    )
    upload = created["UploadId"]
    expect(bool(upload), "CreateMultipartUpload answers an UploadId")

    for number in (0, 10_001):
        expect_error(
            f"UploadPart number {number} is InvalidArgument",
            "InvalidArgument",
            400,
            lambda number=number: s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, Body=b"x"),
        )
    expect_error(
        "CompleteMultipartUpload with no parts is MalformedXML",
        "MalformedXML",
        400,
        lambda: s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": []}),
    )
    expect_error(
        "CreateMultipartUpload with more than 2 KB of metadata is MetadataTooLarge",
        "MetadataTooLarge",
        400,
        lambda: s3.create_multipart_upload(Bucket=bucket, Key=key, Metadata={"big": "x" * 3000}),
    )
    area_upload_listing(s3, buckets)

    part1 = data(5 * MiB, 6)
    r1 = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=part1)
    expect_equal(r1["ETag"], etag_of(part1), "UploadPart answers the part's MD5 as ETag")
    part2 = source[100 : 100 + 5 * MiB]
    r2 = s3.upload_part_copy(
        Bucket=bucket,
        Key=key,
        UploadId=upload,
        PartNumber=2,
        CopySource={"Bucket": bucket, "Key": "mp/source"},
        CopySourceRange=f"bytes=100-{100 + 5 * MiB - 1}",
    )
    expect_equal(r2["CopyPartResult"]["ETag"], etag_of(part2), "UploadPartCopy with CopySourceRange: the range's MD5")
    for bad in [f"bytes=0-{len(source)}", "bytes=0-", "bytes=9-3"]:
        expect_error(
            f"UploadPartCopy with CopySourceRange {bad} is InvalidArgument, as in S3",
            "InvalidArgument",
            400,
            lambda: s3.upload_part_copy(
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                PartNumber=2,
                CopySource={"Bucket": bucket, "Key": "mp/source"},
                CopySourceRange=bad,
            ),
        )
    part3 = data(1234, 7)
    r3 = s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=3, Body=part3)
    parts = [part1, part2, part3]

    listed = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload)
    expect_equal(
        [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed.get("Parts", [])],
        [(i + 1, len(p), etag_of(p)) for i, p in enumerate(parts)],
        "ListParts: numbers, sizes and ETags",
    )
    me = {"ID": OWNER_ID}
    expect_equal((listed.get("Initiator"), listed.get("Owner")), (me, me), "ListParts: Initiator and Owner")
    first = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload, MaxParts=2)
    expect_equal(
        ([p["PartNumber"] for p in first.get("Parts", [])], first.get("IsTruncated"), first.get("NextPartNumberMarker")),
        ([1, 2], True, 2),
        "ListParts with MaxParts 2: the first two, truncated, and where to go on",
    )
    rest = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload, MaxParts=2, PartNumberMarker=2)
    expect_equal(
        ([p["PartNumber"] for p in rest.get("Parts", [])], rest.get("IsTruncated")),
        ([3], False),
        "... and from that marker the rest",
    )
    none = s3.list_parts(Bucket=bucket, Key=key, UploadId=upload, MaxParts=0)
    expect_equal(none.get("Parts", []), [], "ListParts with MaxParts 0 lists no part")
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    expect(
        any(u["UploadId"] == upload and u["Key"] == key for u in uploads),
        "ListMultipartUploads names the upload",
        short(uploads),
    )
    expect(
        all(u.get("Initiator") == me and u.get("Owner") == me for u in uploads),
        "ListMultipartUploads: each upload's Initiator and Owner",
        short(uploads),
    )
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix="other/").get("Uploads", [])
    expect_equal(uploads, [], "ListMultipartUploads with another prefix names nothing")

    etags = [r1["ETag"], r2["CopyPartResult"]["ETag"], r3["ETag"]]
    completion = {"Parts": [{"PartNumber": n, "ETag": etags[n - 1]} for n in (1, 2, 3)]}
    expect_error(
        "CompleteMultipartUpload with parts out of order is InvalidPartOrder",
        "InvalidPartOrder",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key=key,
            UploadId=upload,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n - 1]} for n in (2, 1, 3)]},
        ),
    )
    expect_error(
        "CompleteMultipartUpload If-Match on a key that does not exist is NoSuchKey, as PutObject's",
        "NoSuchKey",
        404,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=completion, IfMatch=etag_of(b"x")
        ),
    )
    done = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=completion)
    expect_equal(done["ETag"], multipart_etag(parts), "CompleteMultipartUpload: ETag is md5(part md5s)-3")
    expect_equal(done["Location"], f"{ENDPOINT}/{bucket}/{key}", "CompleteMultipartUpload: Location is the object's URL")
    got = s3.get_object(Bucket=bucket, Key=key)
    expect(body_of(got) == b"".join(parts), "the completed object is the parts in order")
    expect_equal(got["ETag"], multipart_etag(parts), "GetObject: the multipart ETag")
    expect_equal(got["ContentType"], "application/x-parts", "the Content-Type given at creation")
    expect_equal(got["Metadata"], {"kind": "multipart"}, "the metadata given at creation")
    expect_stored(got, "the headers given at creation")
    # Each part by its number, as the SDKs' parallel downloads ask.
    offset = 0
    for n, part in enumerate(parts, 1):
        got = s3.get_object(Bucket=bucket, Key=key, PartNumber=n)
        span = f"bytes {offset}-{offset + len(part) - 1}/{sum(map(len, parts))}"
        expect_equal(
            (body_of(got), got["ContentRange"], got["PartsCount"], got["ETag"]),
            (part, span, 3, multipart_etag(parts)),
            f"GetObject by partNumber {n} is that part",
        )
        head = s3.head_object(Bucket=bucket, Key=key, PartNumber=n)
        expect_equal((head["ContentLength"], head["PartsCount"]), (len(part), 3), f"HeadObject by partNumber {n}")
        offset += len(part)
    expect_error(
        "GetObject by a part number past the last is InvalidPartNumber",
        "InvalidPartNumber",
        416,
        lambda: s3.get_object(Bucket=bucket, Key=key, PartNumber=4),
    )
    uploads = s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    expect(all(u["UploadId"] != upload for u in uploads), "a completed upload is no longer listed", short(uploads))
    again = s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload=completion)
    expect_equal(again["ETag"], multipart_etag(parts), "completing the same upload again succeeds")

    small = s3.create_multipart_upload(Bucket=bucket, Key="mp/small")["UploadId"]
    s1 = s3.upload_part(Bucket=bucket, Key="mp/small", UploadId=small, PartNumber=1, Body=data(1 * MiB, 8))
    s2 = s3.upload_part(Bucket=bucket, Key="mp/small", UploadId=small, PartNumber=2, Body=data(1 * KiB, 9))
    expect_error(
        "CompleteMultipartUpload with a part under 5 MiB before the last is EntityTooSmall",
        "EntityTooSmall",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mp/small",
            UploadId=small,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": s1["ETag"]}, {"PartNumber": 2, "ETag": s2["ETag"]}]},
        ),
    )
    expect_error(
        "CompleteMultipartUpload with a wrong part ETag is InvalidPart",
        "InvalidPart",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mp/small",
            UploadId=small,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"0123456789abcdef0123456789abcdef"'}]},
        ),
    )
    expect_error(
        "CompleteMultipartUpload naming a part never uploaded is InvalidPart",
        "InvalidPart",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mp/small",
            UploadId=small,
            MultipartUpload={"Parts": [{"PartNumber": 7, "ETag": s1["ETag"]}]},
        ),
    )
    for number in [0, 10001]:
        expect_error(
            f"CompleteMultipartUpload naming part {number} is InvalidArgument",
            "InvalidArgument",
            400,
            lambda: s3.complete_multipart_upload(
                Bucket=bucket,
                Key="mp/small",
                UploadId=small,
                MultipartUpload={"Parts": [{"PartNumber": number, "ETag": s1["ETag"]}]},
            ),
        )
    expect_error(
        "ListParts with a negative part number marker is InvalidArgument",
        "InvalidArgument",
        400,
        lambda: s3.list_parts(Bucket=bucket, Key="mp/small", UploadId=small, PartNumberMarker=-1),
    )
    expect_error(
        "the refused completions stored nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="mp/small")
    )
    one = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="mp/small",
        UploadId=small,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": s1["ETag"]}]},
    )
    expect_equal(one["ETag"], multipart_etag([data(1 * MiB, 8)]), "a single small (last) part completes: ETag -1")
    retry = s3.create_multipart_upload(Bucket=bucket, Key="mp/small")["UploadId"]
    a1 = s3.upload_part(Bucket=bucket, Key="mp/small", UploadId=retry, PartNumber=1, Body=b"again")
    completion = {"Parts": [{"PartNumber": 1, "ETag": a1["ETag"]}]}
    expect_error(
        "CompleteMultipartUpload If-None-Match: the current ETag is PreconditionFailed",
        "PreconditionFailed",
        412,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket, Key="mp/small", UploadId=retry, MultipartUpload=completion, IfNoneMatch=one["ETag"]
        ),
    )
    expect_equal(s3.head_object(Bucket=bucket, Key="mp/small")["ETag"], one["ETag"], "... and the object is unchanged")
    completed = s3.complete_multipart_upload(
        Bucket=bucket, Key="mp/small", UploadId=retry, MultipartUpload=completion, IfNoneMatch=etag_of(b"other")
    )
    expect_equal(completed["ETag"], multipart_etag([b"again"]), "... and with another ETag it completes")

    odd = "mp/a key #1?%.txt"
    oddly = s3.create_multipart_upload(Bucket=bucket, Key=odd)["UploadId"]
    o1 = s3.upload_part(Bucket=bucket, Key=odd, UploadId=oddly, PartNumber=1, Body=b"odd")
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key=odd, UploadId=oddly, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": o1["ETag"]}]}
    )
    expect_equal(
        urllib.parse.unquote(done["Location"]),
        f"{ENDPOINT}/{bucket}/{odd}",
        "CompleteMultipartUpload: Location names the key",
    )
    expect(
        " " not in done["Location"] and "#" not in done["Location"] and "?" not in done["Location"],
        "CompleteMultipartUpload: Location is percent-encoded",
        done["Location"],
    )

    aborted = s3.create_multipart_upload(Bucket=bucket, Key="mp/aborted")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="mp/aborted", UploadId=aborted, PartNumber=1, Body=b"x" * 100)
    r = s3.abort_multipart_upload(Bucket=bucket, Key="mp/aborted", UploadId=aborted)
    expect_equal(r["ResponseMetadata"]["HTTPStatusCode"], 204, "AbortMultipartUpload is 204")
    expect_error(
        "ListParts of an aborted upload is NoSuchUpload",
        "NoSuchUpload",
        404,
        lambda: s3.list_parts(Bucket=bucket, Key="mp/aborted", UploadId=aborted),
    )
    expect_error(
        "UploadPart to an aborted upload is NoSuchUpload",
        "NoSuchUpload",
        404,
        lambda: s3.upload_part(Bucket=bucket, Key="mp/aborted", UploadId=aborted, PartNumber=2, Body=b"y"),
    )
    expect_error(
        "CompleteMultipartUpload of an aborted upload is NoSuchUpload",
        "NoSuchUpload",
        404,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key="mp/aborted",
            UploadId=aborted,
            MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag_of(b"x" * 100)}]},
        ),
    )
    expect_error(
        "the aborted upload left no object",
        None,
        404,
        lambda: s3.head_object(Bucket=bucket, Key="mp/aborted"),
    )


def area_transfer(s3, buckets):
    bucket = buckets.create(s3)
    size = 100 * MiB
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "up.bin")
        sha, part_md5s, rng = hashlib.sha256(), b"", random.Random(10)
        with open(path, "wb") as f:
            for offset in range(0, size, TRANSFER_CHUNK):
                chunk = rng.randbytes(min(TRANSFER_CHUNK, size - offset))
                sha.update(chunk)
                part_md5s += hashlib.md5(chunk).digest()
                f.write(chunk)
        parts = -(-size // TRANSFER_CHUNK)
        want_etag = f'"{hashlib.md5(part_md5s).hexdigest()}-{parts}"'
        started = time.monotonic()
        s3.upload_file(path, bucket, "big/100MiB.bin")
        ok(f"upload_file of 100 MiB (TransferConfig defaults) in {time.monotonic() - started:.1f} s")
        head = s3.head_object(Bucket=bucket, Key="big/100MiB.bin")
        expect_equal(head["ContentLength"], size, "the uploaded object's size")
        expect_equal(head["ETag"], want_etag, "its ETag: a multipart upload of 8 MiB parts (md5 of md5s -13)")
        # boto3 asks for CRC32 checksums of the parts by default; the object
        # gets their composite, as S3 gives it.
        crcs, rng = b"", random.Random(10)
        for offset in range(0, size, TRANSFER_CHUNK):
            crcs += zlib.crc32(rng.randbytes(min(TRANSFER_CHUNK, size - offset))).to_bytes(4, "big")
        head = s3.head_object(Bucket=bucket, Key="big/100MiB.bin", ChecksumMode="ENABLED")
        expect_equal(
            (head.get("ChecksumCRC32"), head.get("ChecksumType")),
            (f"{crc32_b64(crcs)}-{parts}", "COMPOSITE"),
            "its checksum: the CRC32 of the parts' CRC32s, -13",
        )

        back = os.path.join(tmp, "down.bin")
        started = time.monotonic()
        s3.download_file(bucket, "big/100MiB.bin", back)
        ok(f"download_file of 100 MiB (ranged GETs) in {time.monotonic() - started:.1f} s")
        got = hashlib.sha256()
        with open(back, "rb") as f:
            for block in iter(lambda: f.read(MiB), b""):
                got.update(block)
        expect_equal(got.hexdigest(), sha.hexdigest(), "the downloaded file's SHA-256")

    body = data(20 * MiB + 17, 11)
    s3.upload_fileobj(io.BytesIO(body), bucket, "big/20MiB.bin")
    sink = io.BytesIO()
    s3.download_fileobj(bucket, "big/20MiB.bin", sink)
    expect(sink.getvalue() == body, "upload_fileobj then download_fileobj of 20 MiB")
    chunks = [body[i : i + TRANSFER_CHUNK] for i in range(0, len(body), TRANSFER_CHUNK)]
    expect_equal(s3.head_object(Bucket=bucket, Key="big/20MiB.bin")["ETag"], multipart_etag(chunks), "its ETag (-3)")


def area_presign(s3, buckets):
    bucket = buckets.create(s3)
    key = "pre/signed file ü.txt"
    body = data(5000, 12)
    s3.put_object(Bucket=bucket, Key=key, Body=body)

    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    status, _, got = http_get(url)
    expect(status == 200 and got == body, "a presigned GET URL works through urllib", f"status {status}")
    etag = s3.head_object(Bucket=bucket, Key=key)["ETag"]
    status, _, got = http_get(url, {"Range": "bytes=10-", "If-Range": etag})
    expect(status == 206 and got == body[10:], "a resumed download whose If-Range matches is 206", f"status {status}")
    status, _, got = http_get(url, {"Range": "bytes=10-", "If-Range": '"another-version"'})
    expect(status == 200 and got == body, "... one whose If-Range does not is the whole object", f"status {status}")
    status, _, got = http_get(with_other_signature(url))
    expect(
        status == 403 and error_code(got) == "SignatureDoesNotMatch",
        "a presigned URL with a changed signature is SignatureDoesNotMatch",
        f"status {status}: {got[:300]!r}",
    )

    # boto3's presigned URLs are signed with SigV2 by default (query
    # parameters AWSAccessKeyId, Expires, Signature), which signs the
    # Content-Type too.
    params = {"Bucket": bucket, "Key": "pre/put", "ContentType": "text/plain"}
    put_url = s3.generate_presigned_url("put_object", Params=params, ExpiresIn=300)
    status, answer = http_put(put_url, b"put through a presigned URL", "text/plain")
    expect(status == 200, "a presigned PUT URL works through urllib", f"status {status}: {answer[:300]!r}")
    expect_equal(
        body_of(s3.get_object(Bucket=bucket, Key="pre/put")), b"put through a presigned URL", "... and stored the body"
    )
    # Metadata and an ACL presigned with SigV2 ride in the URL's query,
    # which the signature covers: S3 applies them as headers.
    params = {"Bucket": bucket, "Key": "pre/meta", "Metadata": {"a": "b"}, "ACL": "private"}
    meta_url = s3.generate_presigned_url("put_object", Params=params, ExpiresIn=300)
    expect("x-amz-meta-a=b" in meta_url, "(the metadata is in the SigV2 URL's query)", meta_url)
    status, answer = http_put(meta_url, b"with metadata", "")
    expect(status == 200, "a SigV2 presigned PUT with metadata and an ACL works", f"status {status}: {answer[:300]!r}")
    expect_equal(s3.head_object(Bucket=bucket, Key="pre/meta").get("Metadata"), {"a": "b"}, "... and kept the metadata")

    # The signature boto3 users configure most often, and the one AWS
    # requires outside its oldest regions.
    v4 = client(config=Config(signature_version="s3v4"))
    url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    expect("X-Amz-Signature=" in url, "(signature_version s3v4 presigns with SigV4)", url)
    status, _, got = http_get(url)
    expect(status == 200 and got == body, "a SigV4 presigned GET URL works through urllib", f"status {status}")
    status, _, got = http_get(with_other_signature(url))
    expect(
        status == 403 and error_code(got) == "SignatureDoesNotMatch",
        "a SigV4 presigned URL with a changed signature is SignatureDoesNotMatch",
        f"status {status}: {got[:300]!r}",
    )

    # A header the signer did not sign cannot change what the URL does: a
    # copy source added to a presigned PUT would copy the signer's objects.
    put_v4 = v4.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "pre/v4put"}, ExpiresIn=300)
    copy = {"x-amz-copy-source": f"/{bucket}/{urllib.parse.quote(key)}"}
    status, answer = http_put(put_v4, b"", "application/octet-stream", copy)
    expect(
        status == 403 and error_code(answer) == "AccessDenied",
        "an x-amz-* header the presigned URL did not sign is AccessDenied",
        f"status {status}: {answer[:300]!r}",
    )
    expect_error("... and nothing was written", None, 404, lambda: s3.head_object(Bucket=bucket, Key="pre/v4put"))
    # ... nor with an Authorization header beside it, which the signature
    # in the query does not cover either.
    status, answer = http_put(put_v4, b"", "application/octet-stream", {**copy, "Authorization": "AWS4-x"})
    expect(
        status == 400 and error_code(answer) == "AuthorizationQueryParametersError",
        "a presigned URL sent with an Authorization header too is refused",
        f"status {status}: {answer[:300]!r}",
    )
    expect_error("... and nothing was written", None, 404, lambda: s3.head_object(Bucket=bucket, Key="pre/v4put"))
    # A signed request's header names the headers it signed: one added
    # after signing cannot be named in the algorithm's place, nor hidden
    # behind another algorithm's name.
    now = datetime.datetime.now(datetime.timezone.utc)
    path = f"/{bucket}/pre/v4header"
    *_, signed = signed_put(path, b"", hashlib.sha256(b"").hexdigest(), now)
    # Nor named in the signed list as the protocol layer would not find
    # it (in capitals, or with a space), which changes nothing it signs.
    for forged in (
        signed["authorization"].replace("AWS4-HMAC-SHA256 ", "AWS4-HMAC-SHA256,SignedHeaders=x-amz-copy-source; ", 1),
        signed["authorization"].replace("AWS4-HMAC-SHA256 ", "X ", 1),
        signed["authorization"].replace(", Signature=", ";X-Amz-Copy-Source, Signature=", 1),
        signed["authorization"].replace(", Signature=", ";x-amz-copy-source , Signature=", 1),
    ):
        status, answer = send_put(path, b"", {**signed, **copy, "authorization": forged})
        expect(
            status == 400 and error_code(answer) == "AuthorizationHeaderMalformed",
            f"an Authorization header beginning {forged[:30]!r} is AuthorizationHeaderMalformed",
            f"status {status}: {answer[:300]!r}",
        )
    # Nor by an Authorization header the protocol layer reads and this
    # check could not: one not ASCII, or a second one.
    forged = signed["authorization"].replace("AWS4-HMAC-SHA256 ", "AWS4-HMAC-SHA256\u00e9 ", 1).encode()
    others = [(name, value) for name, value in signed.items() if name != "authorization"] + list(copy.items())
    for what, authorizations in (
        ("an Authorization header that is not ASCII", [forged]),
        ("a second Authorization header", [b"\xff", signed["authorization"]]),
    ):
        status, answer = send_headers(path, others + [("authorization", a) for a in authorizations])
        expect(
            status == 400 and error_code(answer) == "AuthorizationHeaderMalformed",
            f"{what} is AuthorizationHeaderMalformed",
            f"status {status}: {answer[:300]!r}",
        )
    expect_error("... and nothing was written", None, 404, lambda: s3.head_object(Bucket=bucket, Key="pre/v4header"))
    status, answer = send_put(path, b"", signed)
    expect(status == 200, "the signed request as signed works", f"status {status}: {answer[:300]!r}")
    status, answer = http_put(put_v4, b"signed body", "application/octet-stream")
    expect(status == 200, "the same URL without the header works", f"status {status}: {answer[:300]!r}")

    # x-amz-* parameters in a presigned URL's query are signed, and S3
    # applies them as headers, but for checksums, which it ignores there.
    # (aws-sdk-go v1 puts metadata there; the JavaScript SDK v3, by default,
    # the CRC32 of the empty body it has when it signs an upload.)
    status, answer = http_put(presigned_put(bucket, "pre/v4meta", {"x-amz-meta-color": "blue"}), b"meta", "text/plain")
    expect(status == 200, "a presigned PUT with x-amz-meta-* in its query works", f"status {status}: {answer[:300]!r}")
    expect_equal(
        s3.head_object(Bucket=bucket, Key="pre/v4meta")["Metadata"], {"color": "blue"}, "... and stored the metadata"
    )
    empty_crc = base64.b64encode(zlib.crc32(b"").to_bytes(4, "big")).decode()
    crc_url = presigned_put(
        bucket, "pre/v4crc", {"x-amz-checksum-crc32": empty_crc, "x-amz-sdk-checksum-algorithm": "CRC32"}
    )
    status, answer = http_put(crc_url, b"these bytes", "application/octet-stream")
    expect(
        status == 200,
        "a presigned PUT with the CRC32 of no bytes in its query stores its body, as on S3",
        f"status {status}: {answer[:300]!r}",
    )
    head = s3.head_object(Bucket=bucket, Key="pre/v4crc", ChecksumMode="ENABLED")
    expect(
        head["ContentLength"] == len(b"these bytes") and "ChecksumCRC32" not in head,
        "... and keeps no checksum from the query",
        repr(head.get("ChecksumCRC32")),
    )

    # SigV2 signs a Date: one far from the server's clock is a replay.
    path = f"/{bucket}/{urllib.parse.quote(key)}"
    stale = "Thu, 01 Jan 2015 00:00:00 GMT"
    v2_signature = base64.b64encode(
        hmac.new(SECRET_KEY.encode(), f"GET\n\n\n{stale}\n{path}".encode(), hashlib.sha1).digest()
    ).decode()
    status, _, got = http_get(ENDPOINT + path, {"Date": stale, "Authorization": f"AWS {ACCESS_KEY}:{v2_signature}"})
    expect(
        status == 403 and error_code(got) == "RequestTimeTooSkewed",
        "a SigV2 request signed in 2015 is RequestTimeTooSkewed",
        f"status {status}: {got[:300]!r}",
    )
    # Dates as s3cmd (+0000) and rclone (UTC) send them are HTTP dates too.
    now = datetime.datetime.now(datetime.timezone.utc)
    for date in (now.strftime("%a, %d %b %Y %H:%M:%S +0000"), now.strftime("%a, %d %b %Y %H:%M:%S UTC")):
        v2_signature = base64.b64encode(
            hmac.new(SECRET_KEY.encode(), f"GET\n\n\n{date}\n{path}".encode(), hashlib.sha1).digest()
        ).decode()
        status, _, got = http_get(ENDPOINT + path, {"Date": date, "Authorization": f"AWS {ACCESS_KEY}:{v2_signature}"})
        expect(status == 200 and got == body, f"a SigV2 request dated {date[-5:]!r} works", f"status {status}")

    # A browser's form upload under a POST policy (SigV4 with s3v4).
    conditions = [{"Content-Type": "text/plain"}, ["content-length-range", 1, 1000]]
    post = v4.generate_presigned_post(
        bucket, "pre/posted", Fields={"Content-Type": "text/plain"}, Conditions=conditions, ExpiresIn=300
    )
    status, answer = form_post(post, b"sent from a form")
    expect(status == 204, "a POST policy upload is 204", f"status {status}: {answer[:300]!r}")
    posted = s3.get_object(Bucket=bucket, Key="pre/posted")
    expect_equal(
        (body_of(posted), posted["ContentType"]), (b"sent from a form", "text/plain"), "... and stored body and type"
    )
    status, answer = form_post(post, b"x" * 1001)
    expect(
        status == 400 and error_code(answer) == "EntityTooLarge",
        "a POST policy upload over its content-length-range is EntityTooLarge",
        f"status {status}: {answer[:300]!r}",
    )
    # The protocol layer reads a form's file whole before it stores it:
    # forms take files of 64 MiB at most, whatever their policy allows.
    roomy = v4.generate_presigned_post(
        bucket, "pre/large", Conditions=[["content-length-range", 1, 1 << 30]], ExpiresIn=300
    )
    # A file full of CRs, each of which may begin the closing boundary,
    # comes whole, as a browser on another site's page sends it.
    crs = b"\r" * 300_000 + data(3 << 20, 31)
    status, answer = form_post(roomy, crs, origin="https://app.example.com")
    expect(status == 204, "a form upload of 3 MB with many CRs, from another site's page", f"status {status}: {answer[:300]!r}")
    expect_equal(body_of(s3.get_object(Bucket=bucket, Key="pre/large")) == crs, True, "... stored whole")
    status, answer = form_post(roomy, b"x" * ((64 << 20) + 1))
    expect(
        status == 400 and error_code(answer) == "EntityTooLarge",
        "a form upload of a file over 64 MiB is EntityTooLarge",
        f"status {status}: {answer[:300]!r}",
    )
    status, answer = form_post({**post, "fields": {**post["fields"], "Content-Type": "text/html"}}, b"<script>")
    expect(
        status == 403 and error_code(answer) == "AccessDenied" and b"Invalid according to Policy" in answer,
        "a form field its policy does not allow is 403 AccessDenied",
        f"status {status}: {answer[:300]!r}",
    )
    expect_equal(body_of(s3.get_object(Bucket=bucket, Key="pre/posted"))[:4], b"sent", "... and neither replaced it")

    # A checksum among a form's fields is checked as a header is; one in an
    # algorithm not computed here is refused.
    file = b"summed in a form"
    right = base64.b64encode(hashlib.sha256(file).digest()).decode()
    summed, sha512 = (
        v4.generate_presigned_post(bucket, f"pre/{field}", Conditions=[["starts-with", f"${field}", ""]], ExpiresIn=300)
        for field in ("x-amz-checksum-sha256", "x-amz-checksum-sha512")
    )
    for post, field, value, (code, name, what) in (
        (
            summed,
            "x-amz-checksum-sha256",
            base64.b64encode(hashlib.sha256(b"another file").digest()).decode(),
            (400, "BadDigest", "whose file does not match its x-amz-checksum-sha256 field"),
        ),
        (
            sha512,
            "x-amz-checksum-sha512",
            base64.b64encode(hashlib.sha512(file).digest()).decode(),
            (501, "NotImplemented", "with an x-amz-checksum-sha512 field"),
        ),
    ):
        status, answer = form_post({**post, "fields": {**post["fields"], field: value}}, file)
        expect(
            status == code and error_code(answer) == name,
            f"a form upload {what} is {name}",
            f"status {status}: {answer[:300]!r}",
        )
        key = post["fields"]["key"]
        expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key=key))
    # A field that no header could carry back (every answer about the
    # object names it) is refused, not stored to make the object unreadable.
    for field, value in (("Content-Type", "image/png\r\nX-Evil: 1"), ("x-amz-meta-a b", "spaced name")):
        post = v4.generate_presigned_post(
            bucket, "pre/unfit", Conditions=[["starts-with", f"${field}", ""]], ExpiresIn=300
        )
        status, answer = form_post({**post, "fields": {**post["fields"], field: value}}, b"unfit")
        expect(
            status == 400 and error_code(answer) == "InvalidArgument",
            f"a form upload whose {field} no header can carry is InvalidArgument",
            f"status {status}: {answer[:300]!r}",
        )
        expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="pre/unfit"))
    status, answer = form_post({**summed, "fields": {**summed["fields"], "x-amz-checksum-sha256": right}}, file)
    expect(status == 204, "a form upload whose file matches its checksum is 204", f"status {status}: {answer[:300]!r}")
    head = s3.head_object(Bucket=bucket, Key=summed["fields"]["key"], ChecksumMode="ENABLED")
    expect_equal(head.get("ChecksumSHA256"), right, "... and keeps the checksum")

    # `${filename}` in the form's key is the uploaded file's name.
    named = v4.generate_presigned_post(
        bucket, "named/${filename}", Conditions=[["starts-with", "$key", "named/"]], ExpiresIn=300
    )
    for name, body in [("report.pdf", b"a report"), ("photo.jpg", b"a photo")]:
        status, answer = form_post(named, body, filename=name)
        expect(status == 204, f"a form upload of {name} to named/${{filename}}", f"status {status}: {answer[:300]!r}")
        expect_equal(
            body_of(s3.get_object(Bucket=bucket, Key=f"named/{name}")), body, f"... is stored as named/{name}"
        )
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="named/").get("Contents", [])]
    expect_equal(listed, ["named/photo.jpg", "named/report.pdf"], "... and no key is named ${filename}")

    # Asked for 201, the answer is a PostResponse document, its ETag quoted
    # as in every other answer.
    created = v4.generate_presigned_post(
        bucket,
        "pre/created",
        Fields={"success_action_status": "201"},
        Conditions=[{"success_action_status": "201"}],
        ExpiresIn=300,
    )
    status, answer = form_post(created, b"created")
    etag = s3.head_object(Bucket=bucket, Key="pre/created")["ETag"]
    document = ET.fromstring(answer)
    expect_equal(
        (status, document.tag.split("}")[-1], document.findtext("{*}ETag"), document.findtext("{*}Key")),
        (201, "PostResponse", etag, "pre/created"),
        "a POST policy upload asking for 201 gets a PostResponse with the quoted ETag",
    )

    expiring = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=1)
    time.sleep(2)
    status, _, got = http_get(expiring)
    expect(
        status == 403 and error_code(got) == "AccessDenied",
        "an expired presigned URL is 403 AccessDenied",
        f"status {status}: {got[:300]!r}",
    )


def area_auth(s3, buckets):
    private = buckets.create(s3, "private")
    s3.put_object(Bucket=private, Key="obj", Body=b"private bytes")

    wrong_secret = client(ACCESS_KEY, SECRET_KEY + "-wrong")
    expect_error(
        "a wrong secret is SignatureDoesNotMatch (ListBuckets)",
        "SignatureDoesNotMatch",
        403,
        lambda: wrong_secret.list_buckets(),
    )
    expect_error(
        "a wrong secret is SignatureDoesNotMatch (PutObject)",
        "SignatureDoesNotMatch",
        403,
        lambda: wrong_secret.put_object(Bucket=private, Key="forged", Body=b"x"),
    )
    unknown = client("DEPOTNOSUCHACCESSKEY", SECRET_KEY)
    expect_error(
        "an unknown access key is InvalidAccessKeyId",
        "InvalidAccessKeyId",
        403,
        lambda: unknown.get_object(Bucket=private, Key="obj"),
    )

    anon = anonymous_client()
    expect_error(
        "anonymous GetObject in a private bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: anon.get_object(Bucket=private, Key="obj"),
    )
    expect_error(
        "anonymous ListObjectsV2 of a private bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: anon.list_objects_v2(Bucket=private),
    )
    expect_error(
        "anonymous PutObject into a private bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: anon.put_object(Bucket=private, Key="anon", Body=b"x"),
    )
    expect_error("anonymous ListBuckets is AccessDenied", "AccessDenied", 403, lambda: anon.list_buckets())

    public = buckets.create(s3, "public", ACL="public-read")
    s3.put_object(Bucket=public, Key="shared/obj", Body=b"public bytes")
    expect_error(
        "anonymous GetObject with ResponseContentType is InvalidRequest (as S3)",
        "InvalidRequest",
        400,
        lambda: anon.get_object(Bucket=public, Key="shared/obj", ResponseContentType="text/plain,text/html"),
    )
    expect_error(
        "anonymous HeadObject with ResponseContentType is 400",
        None,
        400,
        lambda: anon.head_object(Bucket=public, Key="shared/obj", ResponseContentType="text/html"),
    )
    r = anon.get_object(Bucket=public, Key="shared/obj", ResponseContentDisposition='attachment; filename="o.bin"')
    expect_equal(r["ContentDisposition"], 'attachment; filename="o.bin"', "... but it may name the download")
    expect_equal(
        body_of(anon.get_object(Bucket=public, Key="shared/obj")),
        b"public bytes",
        "anonymous GetObject in a bucket created public-read",
    )
    expect_equal(
        keys_of(anon.list_objects_v2(Bucket=public)),
        ["shared/obj"],
        "anonymous ListObjectsV2 of the public-read bucket",
    )
    expect_error(
        "anonymous PutObject into a public-read bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: anon.put_object(Bucket=public, Key="anon", Body=b"x"),
    )
    expect_error(
        "anonymous DeleteObject in a public-read bucket is AccessDenied",
        "AccessDenied",
        403,
        lambda: anon.delete_object(Bucket=public, Key="shared/obj"),
    )
    expect_equal(keys_of(s3.list_objects_v2(Bucket=public)), ["shared/obj"], "the public bucket is unchanged")

    s3.put_bucket_acl(Bucket=private, ACL="public-read")
    expect_equal(
        body_of(anon.get_object(Bucket=private, Key="obj")),
        b"private bytes",
        "after PutBucketAcl public-read, anonymous GetObject works",
    )
    expect_equal(keys_of(anon.list_objects_v2(Bucket=private)), ["obj"], "... and anonymous ListObjectsV2")
    s3.put_bucket_acl(Bucket=private, ACL="private")
    expect_error(
        "after PutBucketAcl private, anonymous GetObject is AccessDenied again",
        "AccessDenied",
        403,
        lambda: anon.get_object(Bucket=private, Key="obj"),
    )
    # The documents GetBucketAcl gives, sent back as s3cmd's setacl sends
    # them, set the same access.
    public_policy = {k: v for k, v in s3.get_bucket_acl(Bucket=public).items() if k in ("Grants", "Owner")}
    expect_equal(public_policy["Owner"], {"ID": OWNER_ID}, "GetBucketAcl: the owner by an opaque id")
    _, _, listing = http_get(f"{ENDPOINT}/{public}?list-type=2&fetch-owner=true")
    expect(ACCESS_KEY.encode() not in listing, "an anonymous listing shows no access key", listing[:300])
    private_policy = {k: v for k, v in s3.get_bucket_acl(Bucket=private).items() if k in ("Grants", "Owner")}
    s3.put_bucket_acl(Bucket=private, AccessControlPolicy=public_policy)
    expect_equal(
        body_of(anon.get_object(Bucket=private, Key="obj")),
        b"private bytes",
        "PutBucketAcl with a public-read document makes the bucket public",
    )
    s3.put_bucket_acl(Bucket=private, AccessControlPolicy=private_policy)
    expect_error(
        "... and with the private one, private again",
        "AccessDenied",
        403,
        lambda: anon.get_object(Bucket=private, Key="obj"),
    )
    other = {**private_policy, "Grants": private_policy["Grants"] + [{"Grantee": {"Type": "CanonicalUser", "ID": "someone"}, "Permission": "READ"}]}
    expect_error(
        "a document granting anything else is NotImplemented",
        "NotImplemented",
        501,
        lambda: s3.put_bucket_acl(Bucket=private, AccessControlPolicy=other),
    )
    all_users = 'uri="http://acs.amazonaws.com/groups/global/AllUsers"'
    expect_error(
        "a canned ACL with a grant beside it is NotImplemented",
        "NotImplemented",
        501,
        lambda: s3.put_bucket_acl(Bucket=private, ACL="private", GrantRead=all_users),
    )


def area_native(s3, buckets):
    """Objects written through S3 read back through depot's own HTTP API."""
    bucket = buckets.create(s3)
    for key, body in [("native/plain.bin", data(70_000, 13)), ("native/sp ace ü+.txt", b"through the native API")]:
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        url = f"{ENDPOINT}/{bucket}/{urllib.parse.quote(key, safe='/')}"
        status, _, got = http_get(url, {"Authorization": f"Bearer {SECRET_KEY}"})
        expect(status == 200 and got == body, f"native GET of {key!r} with a Bearer token", f"status {status}")


EDGE_KEYS = {
    "control characters": "ctl-\x01\x02\x1b\x1f\x7f-\t-\r\n-end",
    "emoji and other non-ASCII": "emoji-🎉📦-ü-中文",
    "'..'": "..",
    "'../x'": "../x",
    "'a//b'": "a//b",
    "a leading slash": "/leading",
    "a trailing slash": "folder/",
    "spaces, percent, plus": "sp ace %20 %41 plus+ &=?#;,",
    "1024 bytes": "long/" + "k" * 1019,
}


def area_keys(s3, buckets):
    bucket = buckets.create(s3)
    failed = []  # every key is tried, then the area fails naming the keys that did
    for what, key in EDGE_KEYS.items():
        body = ("body of " + key).encode()
        try:
            s3.put_object(Bucket=bucket, Key=key, Body=body)
            head = s3.head_object(Bucket=bucket, Key=key)
            got = body_of(s3.get_object(Bucket=bucket, Key=key))
            listed = keys_of(s3.list_objects_v2(Bucket=bucket, Prefix=key))
            if head["ContentLength"] != len(body) or got != body or key not in listed:
                raise CheckFailed(f"length {head['ContentLength']}, listed {short(listed)}")
            ok(f"a key with {what}: PUT, HEAD, GET and listed by prefix")
        except (CheckFailed, ClientError) as e:
            print(f"  FAIL  a key with {what} ({key!r}): {e}", flush=True)
            failed.append(what)
    if failed:
        raise CheckFailed(f"keys with {', '.join(failed)} failed (see above)")
    expect_equal(len("long/" + "k" * 1019), 1024, "(the long key is 1024 bytes)")
    everything = keys_of(s3.list_objects_v2(Bucket=bucket))
    expect_equal(everything, sorted(EDGE_KEYS.values()), "ListObjectsV2 lists every odd key exactly")

    too_long = "long/" + "k" * 1020
    expect_error(
        "a 1025-byte key is KeyTooLongError (400)",
        "KeyTooLongError",
        400,
        lambda: s3.put_object(Bucket=bucket, Key=too_long, Body=b"x"),
    )
    expect(too_long not in keys_of(s3.list_objects_v2(Bucket=bucket)), "the 1025-byte key was not stored")
    now = datetime.datetime.now(datetime.timezone.utc)
    *_, headers = signed_put(f"/{bucket}/nul\0key", b"x", hashlib.sha256(b"x").hexdigest(), now)
    status, said = send_put(f"/{bucket}/nul\0key", b"x", headers)
    expect(
        status == 400 and error_code(said) == "InvalidArgument",
        "a key with a NUL character is InvalidArgument (400)",
        f"{status}: {short(said)}",
    )

    for key in EDGE_KEYS.values():
        s3.delete_object(Bucket=bucket, Key=key)
    expect_equal(keys_of(s3.list_objects_v2(Bucket=bucket)), [], "DeleteObject removes every odd key")


def crc32_b64(b):
    return base64.b64encode(zlib.crc32(b).to_bytes(4, "big")).decode()


def area_checksums(s3, buckets):
    bucket = buckets.create(s3)
    body = data(300_000, 14)
    s3.put_object(Bucket=bucket, Key="header", Body=body, ChecksumCRC32=crc32_b64(body))
    expect(body_of(s3.get_object(Bucket=bucket, Key="header")) == body, "PutObject with the right x-amz-checksum-crc32")
    # The checksum is kept and answered for the whole body, as S3 does when
    # asked; boto3 then checks the body it reads against it.
    crc = crc32_b64(body)
    got = s3.get_object(Bucket=bucket, Key="header", ChecksumMode="ENABLED")
    expect_equal(
        (got.get("ChecksumCRC32"), got.get("ChecksumType")), (crc, "FULL_OBJECT"), "GetObject answers the stored CRC32"
    )
    expect(body_of(got) == body, "... with the body it checks")
    head = s3.head_object(Bucket=bucket, Key="header", ChecksumMode="ENABLED")
    expect_equal(head.get("ChecksumCRC32"), crc, "HeadObject answers the stored CRC32")
    part = s3.get_object(Bucket=bucket, Key="header", Range="bytes=0-99", ChecksumMode="ENABLED")
    expect_equal(part.get("ChecksumCRC32"), None, "a range gets no checksum of the whole")
    copied = s3.copy_object(
        Bucket=bucket,
        Key="header-copy",
        CopySource={"Bucket": bucket, "Key": "header"},
        MetadataDirective="REPLACE",
        ContentType="text/plain",
    )
    expect_equal(copied["CopyObjectResult"].get("ChecksumCRC32"), crc, "CopyObject answers the source's CRC32")
    head = s3.head_object(Bucket=bucket, Key="header-copy", ChecksumMode="ENABLED")
    expect_equal(head.get("ChecksumCRC32"), crc, "... and the copy keeps it, its metadata replaced")
    expect_error(
        "PutObject with a wrong x-amz-checksum-crc32 is BadDigest",
        "BadDigest",
        400,
        lambda: s3.put_object(Bucket=bucket, Key="header", Body=data(1000, 15), ChecksumCRC32=crc32_b64(b"other")),
    )
    expect(body_of(s3.get_object(Bucket=bucket, Key="header")) == body, "the refused upload changed nothing")

    # What boto3 sends over HTTPS by default: Content-Encoding aws-chunked,
    # x-amz-content-sha256 STREAMING-UNSIGNED-PAYLOAD-TRAILER, and the CRC32
    # in a trailer. boto3 keeps that to TLS; here it is asked for explicitly.
    chunked = client()
    chunked.meta.events.register("before-call.s3.PutObject", checksum_in_trailer)
    chunked.meta.events.register("before-call.s3.UploadPart", checksum_in_trailer)
    body = data(3 * MiB + 5, 16)  # several 1 MiB aws-chunked chunks
    r = chunked.put_object(Bucket=bucket, Key="trailer", Body=body)
    expect_equal(r["ETag"], etag_of(body), "aws-chunked PutObject with a CRC32 trailer: ETag of the decoded body")
    expect(body_of(s3.get_object(Bucket=bucket, Key="trailer")) == body, "... and the decoded body is stored")
    head = s3.head_object(Bucket=bucket, Key="trailer", ChecksumMode="ENABLED")
    expect_equal(head.get("ChecksumCRC32"), crc32_b64(body), "... with the CRC32 of its trailer")
    expect_equal(head.get("ContentEncoding"), None, "... and no Content-Encoding: aws-chunked framed the upload")
    chunked.put_object(Bucket=bucket, Key="trailer-gzip", Body=data(1000, 21), ContentEncoding="gzip")
    head = s3.head_object(Bucket=bucket, Key="trailer-gzip")
    expect_equal(head.get("ContentEncoding"), "gzip", "aws-chunked PutObject with gzip keeps gzip alone")

    upload = chunked.create_multipart_upload(Bucket=bucket, Key="trailer-mp", ChecksumAlgorithm="CRC32")["UploadId"]
    parts = [data(5 * MiB, 17), data(1000, 18)]
    done = [
        chunked.upload_part(Bucket=bucket, Key="trailer-mp", UploadId=upload, PartNumber=i + 1, Body=p)
        for i, p in enumerate(parts)
    ]
    expect_equal(
        [d["ETag"] for d in done], [etag_of(p) for p in parts], "aws-chunked UploadPart: ETags of the decoded parts"
    )
    chunked.complete_multipart_upload(
        Bucket=bucket,
        Key="trailer-mp",
        UploadId=upload,
        MultipartUpload={"Parts": [completed_part(i + 1, d) for i, d in enumerate(done)]},
    )
    expect(body_of(s3.get_object(Bucket=bucket, Key="trailer-mp")) == b"".join(parts), "... and the completed object")
    # A document in aws-chunked, whose checksum the framing would hide, is
    # refused whole, as boto3 never sends one.
    document = b"<Delete><Object><Key>trailer</Key></Object></Delete>"
    framed = f"{len(document):x}\r\n".encode() + document + b"\r\n0\r\n\r\n"
    headers = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(document))}
    now = datetime.datetime.now(datetime.timezone.utc)
    *_, headers = signed_put(
        f"/{bucket}", None, "STREAMING-UNSIGNED-PAYLOAD-TRAILER", now, headers, method="POST", query="delete="
    )
    status, answer = send_put(f"/{bucket}", framed, headers, method="POST", query="delete=")
    expect(status == 400 and b"InvalidRequest" in answer, f"an aws-chunked DeleteObjects is refused: {status} {answer}")
    expect(body_of(s3.get_object(Bucket=bucket, Key="trailer")) == body, "... and deletes nothing")
    multipart_checksums(s3, bucket)

    lying = client()
    lying.meta.events.register("before-call.s3.PutObject", checksum_in_trailer)
    lying.meta.events.register("before-sign.s3.PutObject", wrong_trailer)
    expect_error(
        "aws-chunked PutObject whose trailing CRC32 is wrong is BadDigest",
        "BadDigest",
        400,
        lambda: lying.put_object(Bucket=bucket, Key="lied", Body=data(2 * MiB, 19)),
    )
    expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="lied"))

    twice = client()
    twice.meta.events.register("before-sign.s3.PutObject", second_checksum)
    body = data(1000, 20)
    expect_error(
        "PutObject declaring two checksums (CRC32 and SHA-256, both right) is InvalidRequest",
        "InvalidRequest",
        400,
        lambda: twice.put_object(Bucket=bucket, Key="twice", Body=body, ChecksumCRC32=crc32_b64(body)),
    )
    expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="twice"))

    # S3 offers algorithms not computed here: declared, they are refused,
    # not stored unchecked.
    other = client()
    other.meta.events.register("before-sign.s3.PutObject", sha512_header)
    expect_error(
        "PutObject declaring a SHA-512 checksum is NotImplemented",
        "NotImplemented",
        501,
        lambda: other.put_object(Bucket=bucket, Key="sha512", Body=data(1000, 23)),
    )
    expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="sha512"))

    # A copy asked for a checksum gets one computed from its bytes.
    body = data(3 * MiB, 24)
    s3.put_object(Bucket=bucket, Key="to-copy", Body=body)
    want = base64.b64encode(hashlib.sha256(body).digest()).decode()
    copied = s3.copy_object(
        Bucket=bucket, Key="copied-sha256", CopySource={"Bucket": bucket, "Key": "to-copy"}, ChecksumAlgorithm="SHA256"
    )
    expect_equal(copied["CopyObjectResult"].get("ChecksumSHA256"), want, "CopyObject asking for SHA-256 answers it")
    head = s3.head_object(Bucket=bucket, Key="copied-sha256", ChecksumMode="ENABLED")
    expect_equal(
        (head.get("ChecksumSHA256"), head.get("ChecksumCRC32")), (want, None), "... and the copy keeps it alone"
    )
    # A new checksum is a change S3 takes for a copy onto itself.
    s3.copy_object(
        Bucket=bucket, Key="to-copy", CopySource={"Bucket": bucket, "Key": "to-copy"}, ChecksumAlgorithm="SHA256"
    )
    head = s3.head_object(Bucket=bucket, Key="to-copy", ChecksumMode="ENABLED")
    expect_equal(head.get("ChecksumSHA256"), want, "CopyObject onto itself with a new checksum algorithm adds it")
    expect(body_of(s3.get_object(Bucket=bucket, Key="to-copy")) == body, "... and keeps the bytes")
    expect_error(
        "CopyObject onto itself asking for the checksum it has is InvalidRequest",
        "InvalidRequest",
        400,
        lambda: s3.copy_object(
            Bucket=bucket, Key="to-copy", CopySource={"Bucket": bucket, "Key": "to-copy"}, ChecksumAlgorithm="SHA256"
        ),
    )

    # A part declares its upload's algorithm, or is refused then, not at
    # its completion.
    upload = s3.create_multipart_upload(Bucket=bucket, Key="mixed", ChecksumAlgorithm="SHA256")["UploadId"]
    expect_error(
        "UploadPart declaring a CRC32 to an upload of SHA-256 checksums is InvalidRequest",
        "InvalidRequest",
        400,
        lambda: s3.upload_part(
            Bucket=bucket, Key="mixed", UploadId=upload, PartNumber=1, Body=data(1000, 25), ChecksumAlgorithm="CRC32"
        ),
    )
    expect_equal(s3.list_parts(Bucket=bucket, Key="mixed", UploadId=upload).get("Parts", []), [], "... and keeps no part")
    part = s3.upload_part(
        Bucket=bucket, Key="mixed", UploadId=upload, PartNumber=1, Body=data(1000, 25), ChecksumAlgorithm="SHA256"
    )
    other = client()
    other.meta.events.register("before-sign.s3.CompleteMultipartUpload", sha512_header)
    expect_error(
        "CompleteMultipartUpload declaring a SHA-512 checksum is NotImplemented",
        "NotImplemented",
        501,
        lambda: other.complete_multipart_upload(
            Bucket=bucket, Key="mixed", UploadId=upload, MultipartUpload={"Parts": [completed_part(1, part)]}
        ),
    )
    expect_error("... and writes nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="mixed"))
    s3.abort_multipart_upload(Bucket=bucket, Key="mixed", UploadId=upload)


def checksum_header(name, digest):
    """A before-sign hook adding the header `name`: the body's `digest`
    (a hashlib constructor), right for the body, in base64."""

    def hook(request, **_):
        body = request.body
        if not isinstance(body, bytes):
            body = body.read()
            request.body.seek(0)
        request.headers[name] = base64.b64encode(digest(body).digest()).decode()

    return hook


# A SHA-512 checksum, which is not computed here; a SHA-256 one beside
# the CRC32 boto3 sends.
sha512_header = checksum_header("x-amz-checksum-sha512", hashlib.sha512)
second_checksum = checksum_header("x-amz-checksum-sha256", hashlib.sha256)


def completed_part(number, uploaded):
    """A part for CompleteMultipartUpload, with its checksum when UploadPart
    answered one (as s3transfer does)."""
    part = {"PartNumber": number, "ETag": uploaded["ETag"]}
    if "ChecksumCRC32" in uploaded:
        part["ChecksumCRC32"] = uploaded["ChecksumCRC32"]
    return part


def composite_crc32(parts):
    """S3's composite checksum: the CRC32 of the parts' CRC32s, -parts."""
    return f"{crc32_b64(b''.join(zlib.crc32(p).to_bytes(4, 'big') for p in parts))}-{len(parts)}"


def multipart_checksums(s3, bucket):
    """Checksums of objects completed from parts: composite and full-object,
    checked against what the Complete request declares."""
    parts = [data(5 * MiB, 21), data(2000, 22)]
    created = s3.create_multipart_upload(Bucket=bucket, Key="composite", ChecksumAlgorithm="CRC32")
    expect_equal(
        (created.get("ChecksumAlgorithm"), created.get("ChecksumType")),
        ("CRC32", "COMPOSITE"),
        "CreateMultipartUpload with a CRC32 algorithm: composite by default",
    )
    upload = created["UploadId"]
    uploads = s3.list_multipart_uploads(Bucket=bucket, Prefix="composite")["Uploads"]
    expect_equal(
        [(u["UploadId"], u.get("ChecksumAlgorithm"), u.get("ChecksumType")) for u in uploads],
        [(upload, "CRC32", "COMPOSITE")],
        "ListMultipartUploads answers the upload's algorithm and type",
    )
    done = [
        s3.upload_part(Bucket=bucket, Key="composite", UploadId=upload, PartNumber=i + 1, Body=p, ChecksumAlgorithm="CRC32")
        for i, p in enumerate(parts)
    ]
    listed = s3.list_parts(Bucket=bucket, Key="composite", UploadId=upload)
    expect_equal(
        ([p.get("ChecksumCRC32") for p in listed["Parts"]], listed.get("ChecksumAlgorithm"), listed.get("ChecksumType")),
        ([crc32_b64(p) for p in parts], "CRC32", "COMPOSITE"),
        "ListParts answers each part's CRC32, and the upload's algorithm and type",
    )
    wrong = [completed_part(i + 1, d) for i, d in enumerate(done)]
    wrong[0]["ChecksumCRC32"] = crc32_b64(b"another part")
    expect_error(
        "CompleteMultipartUpload listing a part with a CRC32 its bytes do not have is InvalidPart",
        "InvalidPart",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket, Key="composite", UploadId=upload, MultipartUpload={"Parts": wrong}
        ),
    )
    expect_error("... and writes nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="composite"))
    want = composite_crc32(parts)
    expect_error(
        "CompleteMultipartUpload declaring another composite CRC32 is BadDigest",
        "BadDigest",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key="composite",
            UploadId=upload,
            ChecksumCRC32=crc32_b64(b"other parts"),
            MultipartUpload={"Parts": [completed_part(i + 1, d) for i, d in enumerate(done)]},
        ),
    )
    # Declared without its `-2`, as some SDKs send it.
    completed = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="composite",
        UploadId=upload,
        ChecksumCRC32=want.rsplit("-", 1)[0],
        MultipartUpload={"Parts": [completed_part(i + 1, d) for i, d in enumerate(done)]},
    )
    expect_equal(
        (completed.get("ChecksumCRC32"), completed.get("ChecksumType")),
        (want, "COMPOSITE"),
        "CompleteMultipartUpload answers the composite CRC32 (CRC32 of the parts' CRC32s, -2)",
    )
    again = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="composite",
        UploadId=upload,
        MultipartUpload={"Parts": [completed_part(i + 1, d) for i, d in enumerate(done)]},
    )
    expect_equal(
        (again.get("ETag"), again.get("ChecksumCRC32"), again.get("ChecksumType")),
        (completed["ETag"], want, "COMPOSITE"),
        "a repeated CompleteMultipartUpload answers the same ETag and checksum",
    )
    got = s3.get_object(Bucket=bucket, Key="composite", ChecksumMode="ENABLED")
    expect_equal(
        (got.get("ChecksumCRC32"), got.get("ChecksumType")), (want, "COMPOSITE"), "GetObject answers it too"
    )
    expect(body_of(got) == b"".join(parts), "... with the object's bytes")
    every = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]
    attributes = s3.get_object_attributes(Bucket=bucket, Key="composite", ObjectAttributes=every, MaxParts=1)
    expect_equal(
        (
            attributes["ETag"].strip('"'),
            attributes["ObjectSize"],
            attributes["StorageClass"],
            attributes["Checksum"],
        ),
        (
            completed["ETag"].strip('"'),
            sum(map(len, parts)),
            "STANDARD",
            {"ChecksumCRC32": want.rsplit("-", 1)[0], "ChecksumType": "COMPOSITE"},
        ),
        "GetObjectAttributes answers its ETag, size, storage class and checksum",
    )
    expect_error(
        "GetObjectAttributes of an attribute S3 does not name is InvalidArgument",
        "InvalidArgument",
        400,
        lambda: s3.get_object_attributes(Bucket=bucket, Key="composite", ObjectAttributes=["ETag", "Bogus"]),
    )
    pages = [attributes["ObjectParts"]]
    pages.append(
        s3.get_object_attributes(
            Bucket=bucket,
            Key="composite",
            ObjectAttributes=["ObjectParts"],
            MaxParts=1,
            PartNumberMarker=pages[0]["NextPartNumberMarker"],
        )["ObjectParts"]
    )
    expect_equal(
        [(p["TotalPartsCount"], p["IsTruncated"], [(q["PartNumber"], q["Size"]) for q in p["Parts"]]) for p in pages],
        [(2, True, [(1, len(parts[0]))]), (2, False, [(2, len(parts[1]))])],
        "... and its parts, a page at a time",
    )

    # Parts copied from another object get a checksum in the upload's
    # algorithm too, as s3transfer's managed copy reads them back.
    # The same parts, copied out of "composite".
    source, pieces = b"".join(parts), parts
    upload = s3.create_multipart_upload(Bucket=bucket, Key="copied", ChecksumAlgorithm="CRC32")["UploadId"]
    copied = [
        s3.upload_part_copy(
            Bucket=bucket,
            Key="copied",
            UploadId=upload,
            PartNumber=i + 1,
            CopySource={"Bucket": bucket, "Key": "composite"},
            CopySourceRange=f"bytes={start}-{start + len(p) - 1}",
        )["CopyPartResult"]
        for i, (start, p) in enumerate([(0, parts[0]), (len(parts[0]), parts[1])])
    ]
    expect_equal(
        [c.get("ChecksumCRC32") for c in copied],
        [crc32_b64(p) for p in pieces],
        "UploadPartCopy into a CRC32 upload answers the copied range's CRC32",
    )
    listed = s3.list_parts(Bucket=bucket, Key="copied", UploadId=upload)
    expect_equal(
        [p.get("ChecksumCRC32") for p in listed["Parts"]],
        [crc32_b64(p) for p in pieces],
        "... and ListParts answers it",
    )
    completed = s3.complete_multipart_upload(
        Bucket=bucket,
        Key="copied",
        UploadId=upload,
        MultipartUpload={"Parts": [completed_part(i + 1, c) for i, c in enumerate(copied)]},
    )
    expect_equal(
        completed.get("ChecksumCRC32"),
        composite_crc32(pieces),
        "... and CompleteMultipartUpload, given those CRC32s, answers their composite",
    )
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.copy(
        {"Bucket": bucket, "Key": "composite"},
        bucket,
        "managed copy",
        ExtraArgs={"ChecksumAlgorithm": "CRC32"},
        Config=config,
    )
    got = s3.get_object(Bucket=bucket, Key="managed copy", ChecksumMode="ENABLED")
    expect_equal(
        (got.get("ChecksumCRC32"), got.get("ContentLength")),
        (composite_crc32(pieces), len(source)),
        "a managed copy in 5 MiB parts with CRC32 gets the parts' composite",
    )
    expect(body_of(got) == source, "... with the source's bytes")

    created = s3.create_multipart_upload(
        Bucket=bucket, Key="full", ChecksumAlgorithm="CRC32", ChecksumType="FULL_OBJECT"
    )
    expect_equal(created.get("ChecksumType"), "FULL_OBJECT", "CreateMultipartUpload with a full-object CRC32")
    upload = created["UploadId"]
    done = [
        s3.upload_part(Bucket=bucket, Key="full", UploadId=upload, PartNumber=i + 1, Body=p, ChecksumAlgorithm="CRC32")
        for i, p in enumerate(parts)
    ]
    listed = {"Parts": [completed_part(i + 1, d) for i, d in enumerate(done)]}
    whole = crc32_b64(b"".join(parts))
    expect_error(
        "CompleteMultipartUpload declaring a CRC32 of the whole that its bytes do not have is BadDigest",
        "BadDigest",
        400,
        lambda: s3.complete_multipart_upload(
            Bucket=bucket,
            Key="full",
            UploadId=upload,
            MultipartUpload=listed,
            ChecksumCRC32=crc32_b64(b"another object"),
            ChecksumType="FULL_OBJECT",
        ),
    )
    completed = s3.complete_multipart_upload(
        Bucket=bucket, Key="full", UploadId=upload, MultipartUpload=listed, ChecksumCRC32=whole, ChecksumType="FULL_OBJECT"
    )
    expect_equal(
        (completed.get("ChecksumCRC32"), completed.get("ChecksumType")),
        (whole, "FULL_OBJECT"),
        "... and with the right one, answers the CRC32 of the whole object",
    )
    got = s3.get_object(Bucket=bucket, Key="full", ChecksumMode="ENABLED")
    expect_equal(got.get("ChecksumCRC32"), whole, "GetObject answers it, and boto3 checks the body against it")
    expect(body_of(got) == b"".join(parts), "... with the object's bytes")
    expect_error(
        "a full-object SHA-256 is InvalidRequest, as S3 has it",
        "InvalidRequest",
        400,
        lambda: s3.create_multipart_upload(Bucket=bucket, Key="x", ChecksumAlgorithm="SHA256", ChecksumType="FULL_OBJECT"),
    )


def checksum_in_trailer(params, **_):
    """before-call hook: the checksum goes in a trailer, as over HTTPS."""
    algorithm = params["context"].get("checksum", {}).get("request_algorithm")
    if not isinstance(algorithm, dict):
        raise CheckFailed(f"boto3 planned no checksum for this upload: {params['context'].get('checksum')}")
    algorithm["in"] = "trailer"


class WrongCrc32(botocore.httpchecksum.Crc32Checksum):
    def b64digest(self):
        return crc32_b64(b"not the body")


def wrong_trailer(request, **_):
    """before-sign hook: the aws-chunked body ends with a wrong CRC32."""
    body = request.body
    if not isinstance(body, botocore.httpchecksum.AwsChunkedWrapper):
        raise CheckFailed(f"expected an aws-chunked body, got {type(body).__name__}")
    body._checksum_cls = WrongCrc32
    body._reset()


# ----- SigV4 by hand: what boto3 never sends over HTTP -----

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
STREAMING = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"


def hmac_sha256(key, text):
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def signing_key(day):
    key = hmac_sha256(("AWS4" + SECRET_KEY).encode(), day)
    for part in (REGION, "s3", "aws4_request"):
        key = hmac_sha256(key, part)
    return key


def signed_put(path, body, payload_hash, at, headers=None, method="PUT", query=""):
    """The headers of a PUT (or `method`) of `body` to `path` (and `query`,
    in canonical form), signed with SigV4 at time `at` with
    x-amz-content-sha256 = `payload_hash`. Returns (seed signature, signing
    key, amz date, scope, headers)."""
    amz_date = at.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    scope = f"{day}/{REGION}/s3/aws4_request"
    host = urllib.parse.urlsplit(ENDPOINT).netloc
    headers = dict(headers or {})
    headers.update({"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date})
    names = sorted(h.lower() for h in headers)
    canonical_headers = "".join(f"{n}:{headers[n].strip()}\n" for n in names)
    canonical = "\n".join(
        [method, urllib.parse.quote(path, safe="/~"), query, canonical_headers, ";".join(names), payload_hash]
    )
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = signing_key(day)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return signature, key, amz_date, scope, headers


def presigned_put(bucket, key, params):
    """A SigV4 presigned PUT URL for bucket/key, signing only the host, with
    `params` in its query as SDKs hoist x-amz-* headers there."""
    amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
    host = urllib.parse.urlsplit(ENDPOINT).netloc
    query = dict(params)
    query.update(
        {
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Credential": f"{ACCESS_KEY}/{scope}",
            "X-Amz-Date": amz_date,
            "X-Amz-Expires": "300",
            "X-Amz-SignedHeaders": "host",
        }
    )
    encode = lambda v: urllib.parse.quote(v, safe="~")  # noqa: E731
    canonical_query = "&".join(f"{encode(k)}={encode(v)}" for k, v in sorted(query.items()))
    path = f"/{bucket}/{urllib.parse.quote(key, safe='/~')}"
    canonical = "\n".join(["PUT", path, canonical_query, f"host:{host}\n", "host", "UNSIGNED-PAYLOAD"])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    signature = hmac.new(signing_key(amz_date[:8]), to_sign.encode(), hashlib.sha256).hexdigest()
    return f"{ENDPOINT}{path}?{canonical_query}&X-Amz-Signature={signature}"


def send_put(path, body, headers, method="PUT", query=""):
    parts = urllib.parse.urlsplit(ENDPOINT)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        target = urllib.parse.quote(path, safe="/~") + (f"?{query}" if query else "")
        conn.request(method, target, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def send_headers(path, headers):
    """An empty PUT to `path` with `headers`, a list of (name, value) pairs
    sent as given: a name may repeat, a value may be bytes."""
    parts = urllib.parse.urlsplit(ENDPOINT)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.putrequest("PUT", urllib.parse.quote(path, safe="/~"), skip_host=True, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        conn.putheader("content-length", "0")
        conn.endheaders()
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def aws_chunked(body, seed, key, amz_date, scope, chunk=64 * 1024, tamper=False):
    """`body` framed as signed aws-chunked: each chunk signed over the one
    before (STREAMING-AWS4-HMAC-SHA256-PAYLOAD)."""
    out, previous = [], seed
    pieces = [body[i : i + chunk] for i in range(0, len(body), chunk)] + [b""]
    for i, piece in enumerate(pieces):
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, EMPTY_SHA256, hashlib.sha256(piece).hexdigest()]
        )
        previous = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        if tamper and i == 1:
            piece = bytes([piece[0] ^ 1]) + piece[1:]
        out.append(f"{len(piece):x};chunk-signature={previous}\r\n".encode() + piece + b"\r\n")
    return b"".join(out)


def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: the test's own, independent of
    any library the server might share."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def unsigned_trailer_put(bucket, key, body, name, value, now, chunk=64 * 1024, gzip=False):
    """PutObject with an aws-chunked body, in chunks of `chunk` bytes, whose
    checksum `name` comes as a trailer (STREAMING-UNSIGNED-PAYLOAD-TRAILER).
    With `gzip`, Content-Encoding gzip and aws-chunked go on two lines, as
    the Java SDK sends them (signed as one list, as SigV4 reads them)."""
    headers = {
        "content-encoding": "gzip,aws-chunked" if gzip else "aws-chunked",
        "x-amz-decoded-content-length": str(len(body)),
        "x-amz-trailer": name,
    }
    *_, headers = signed_put(f"/{bucket}/{key}", None, "STREAMING-UNSIGNED-PAYLOAD-TRAILER", now, headers)
    framed = b"".join(
        f"{len(body[i : i + chunk]):x}\r\n".encode() + body[i : i + chunk] + b"\r\n" for i in range(0, len(body), chunk)
    )
    framed += f"0\r\n{name}:{value}\r\n\r\n".encode()
    lines = [(n, v) for n, v in headers.items() if n != "content-encoding"]
    lines += [("content-encoding", v) for v in headers["content-encoding"].split(",")]
    parts = urllib.parse.urlsplit(ENDPOINT)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.putrequest("PUT", urllib.parse.quote(f"/{bucket}/{key}", safe="/~"), skip_host=True)
        for n, v in lines + [("content-length", str(len(framed)))]:
            conn.putheader(n, v)
        conn.endheaders(framed)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def oversized_chunk_put(bucket, key, now):
    """A chunk-signed aws-chunked PutObject whose first chunk declares
    16 MiB and one byte, of which 64 KiB are sent: (status, answer) of what
    the server says before the rest would come."""
    size = 16 * MiB + 1
    headers = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(size)}
    *_, headers = signed_put(f"/{bucket}/{key}", None, STREAMING, now, headers)
    line = f"{size:x};chunk-signature={'0' * 64}\r\n"
    framed_length = len(line) + size + len(f"\r\n0;chunk-signature={'0' * 64}\r\n\r\n")
    parts = urllib.parse.urlsplit(ENDPOINT)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    try:
        conn.putrequest("PUT", f"/{bucket}/{key}", skip_host=True, skip_accept_encoding=True)
        for name, value in {**headers, "content-length": str(framed_length)}.items():
            conn.putheader(name, value)
        conn.endheaders(line.encode() + bytes(64 * KiB))
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def area_signing(s3, buckets):
    bucket = buckets.create(s3)
    now = datetime.datetime.now(datetime.timezone.utc)

    body = data(200_000, 20)
    chunked_headers = {"content-encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(body))}
    seed, key, amz_date, scope, headers = signed_put(f"/{bucket}/chunked", None, STREAMING, now, chunked_headers)
    status, said = send_put(f"/{bucket}/chunked", aws_chunked(body, seed, key, amz_date, scope), headers)
    expect(status == 200, "PutObject with a chunk-signed aws-chunked body", f"status {status}: {short(said)}")
    expect(body_of(s3.get_object(Bucket=bucket, Key="chunked")) == body, "... stores the decoded body")

    # A signed chunk is held whole until it is checked: one larger than
    # MinIO's 16 MiB limit is refused by its size line, before its bytes come.
    status, said = oversized_chunk_put(bucket, "huge-chunk", now)
    expect(
        400 <= status < 500 and b"16777216" in said,
        "a signed aws-chunked chunk of more than 16 MiB is refused by its size",
        f"status {status}: {short(said)}",
    )
    expect_error("... and nothing was written", None, 404, lambda: s3.head_object(Bucket=bucket, Key="huge-chunk"))

    seed, key, amz_date, scope, headers = signed_put(f"/{bucket}/tampered", None, STREAMING, now, chunked_headers)
    framed = aws_chunked(body, seed, key, amz_date, scope, tamper=True)
    status, said = send_put(f"/{bucket}/tampered", framed, headers)
    expect(
        status == 403 and error_code(said) == "SignatureDoesNotMatch",
        "a chunk changed after signing is SignatureDoesNotMatch",
        f"status {status}: {short(said)}",
    )
    expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="tampered"))

    declared = hashlib.sha256(b"some other body").hexdigest()
    *_, headers = signed_put(f"/{bucket}/mismatch", body, declared, now)
    status, said = send_put(f"/{bucket}/mismatch", body, headers)
    expect(
        status == 400 and error_code(said) == "XAmzContentSHA256Mismatch",
        "a body that does not match its x-amz-content-sha256 is XAmzContentSHA256Mismatch",
        f"status {status}: {short(said)}",
    )
    expect_error("... and stores nothing", None, 404, lambda: s3.head_object(Bucket=bucket, Key="mismatch"))

    *_, headers = signed_put(f"/{bucket}/unsigned", body, "UNSIGNED-PAYLOAD", now)
    status, said = send_put(f"/{bucket}/unsigned", body, headers)
    expect(status == 200, "UNSIGNED-PAYLOAD is accepted", f"status {status}: {short(said)}")

    small = data(150_000, 21)
    right = base64.b64encode(crc32c(small).to_bytes(4, "big")).decode()
    status, said = unsigned_trailer_put(bucket, "crc32c", small, "x-amz-checksum-crc32c", right, now)
    expect(status == 200, "a trailing x-amz-checksum-crc32c that matches is accepted", f"{status}: {short(said)}")
    expect(body_of(s3.get_object(Bucket=bucket, Key="crc32c")) == small, "... and the decoded body stored")
    wrong = base64.b64encode(crc32c(b"other").to_bytes(4, "big")).decode()
    status, said = unsigned_trailer_put(bucket, "crc32c-bad", small, "x-amz-checksum-crc32c", wrong, now)
    expect(
        status == 400 and error_code(said) == "BadDigest",
        "a trailing x-amz-checksum-crc32c that does not match is BadDigest",
        f"status {status}: {short(said)}",
    )
    # Unsigned, a chunk may be as large as the object (as some SDKs send it
    # over TLS): it is cut into pieces on its way in.
    large = data(20 * MiB + 3, 22)
    large_sha = base64.b64encode(hashlib.sha256(large).digest()).decode()
    status, said = unsigned_trailer_put(
        bucket, "one-chunk", large, "x-amz-checksum-sha256", large_sha, now, chunk=len(large)
    )
    expect(status == 200, "an unsigned aws-chunked body of one 20 MiB chunk is accepted", f"{status}: {short(said)}")
    expect(body_of(s3.get_object(Bucket=bucket, Key="one-chunk")) == large, "... and stored whole")
    sha = base64.b64encode(hashlib.sha256(small).digest()).decode()
    status, said = unsigned_trailer_put(bucket, "gz", small, "x-amz-checksum-sha256", sha, now, gzip=True)
    expect(status == 200, "Content-Encoding gzip and aws-chunked on two lines", f"{status}: {short(said)}")
    expect_equal(s3.head_object(Bucket=bucket, Key="gz").get("ContentEncoding"), "gzip", "... keeps gzip alone")
    status, said = unsigned_trailer_put(bucket, "sha256", small, "x-amz-checksum-sha256", sha, now)
    expect(status == 200, "a trailing x-amz-checksum-sha256 that matches is accepted", f"{status}: {short(said)}")
    status, said = unsigned_trailer_put(bucket, "sha256-bad", small, "x-amz-checksum-sha256", right, now)
    expect(status == 400 and error_code(said) == "BadDigest", "... and one that does not is BadDigest", short(said))

    v4 = client(config=Config(signature_version="s3v4"))
    for expires, want in [(7 * 24 * 3600, 200), (7 * 24 * 3600 + 1, 400)]:
        url = v4.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "unsigned"}, ExpiresIn=expires)
        status, _, got = http_get(url)
        expect(status == want, f"a SigV4 presigned URL valid for {expires} s answers {want}", f"status {status}")
    expect(error_code(got) == "AuthorizationQueryParametersError", "... AuthorizationQueryParametersError", short(got))

    skewed = now - datetime.timedelta(minutes=16)
    *_, headers = signed_put(f"/{bucket}/skewed", body, hashlib.sha256(body).hexdigest(), skewed)
    status, said = send_put(f"/{bucket}/skewed", body, headers)
    expect(
        status == 403 and error_code(said) == "RequestTimeTooSkewed",
        "a request signed 16 minutes ago is RequestTimeTooSkewed",
        f"status {status}: {short(said)}",
    )


AREAS = [
    area_buckets,
    area_users,
    area_put,
    area_get,
    area_empty_and_parts,
    area_object_acls,
    area_unsupported,
    area_delete,
    area_copy,
    area_listing,
    area_multipart,
    area_transfer,
    area_presign,
    area_auth,
    area_keys,
    area_checksums,
    area_signing,
    area_native,
]


def main():
    print(f"boto3 {boto3.__version__}, botocore {botocore.__version__}, endpoint {ENDPOINT}", flush=True)
    s3 = client()
    failures = []
    for area in AREAS:
        name = area.__name__.removeprefix("area_")
        print(f"== {name}", flush=True)
        buckets = Buckets(name)
        LAST_OK[0] = ""
        try:
            area(s3, buckets)
        except CheckFailed as e:
            print(f"  FAIL  {e}", flush=True)
            failures.append(f"{name}: {e}")
        except Exception as e:  # a step that must work did not
            after = f" (after the check {LAST_OK[0]!r})" if LAST_OK[0] else ""
            print(f"  FAIL  unexpected {type(e).__name__}{after}: {e}", flush=True)
            traceback.print_exc(file=sys.stdout)
            failures.append(f"{name}: unexpected {type(e).__name__}{after}: {e}")
        finally:
            buckets.clean()
    if failures:
        print(f"\n{len(failures)} of {len(AREAS)} areas failed:")
        for f in failures:
            print(f"  {f}")
        sys.exit(1)
    print(f"\nall {len(AREAS)} areas passed")


if __name__ == "__main__":
    main()
