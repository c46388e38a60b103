"""Virtual-host style addressing (BUCKET.DOMAIN) on a server started with
--s3-domain DOMAIN, beside path style on the same server. The domain's
names resolve to the server's address inside this script only."""

import os
import socket
import sys
import urllib.parse

import boto3
from botocore.config import Config

ENDPOINT = os.environ["S3_ENDPOINT"]
DOMAIN = os.environ["S3_DOMAIN"]
PORT = urllib.parse.urlsplit(ENDPOINT).port
CREDENTIALS = dict(aws_access_key_id=os.environ["S3_ACCESS_KEY"], aws_secret_access_key=os.environ["S3_SECRET_KEY"])

real_getaddrinfo = socket.getaddrinfo


def getaddrinfo(host, *args, **kwargs):
    if host == DOMAIN or host.endswith("." + DOMAIN):
        host = "127.0.0.1"
    return real_getaddrinfo(host, *args, **kwargs)


socket.getaddrinfo = getaddrinfo


def client(endpoint, style):
    config = Config(s3={"addressing_style": style})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config, **CREDENTIALS)


def main():
    virtual = client(f"http://{DOMAIN}:{PORT}", "virtual")
    path = client(ENDPOINT, "path")
    seen = []
    virtual.meta.events.register("before-send.s3", lambda request, **_: seen.append(urllib.parse.urlsplit(request.url).hostname))

    virtual.create_bucket(Bucket="vhost-bucket")
    virtual.put_object(Bucket="vhost-bucket", Key="dir/key.txt", Body=b"through the bucket's own host name")
    assert seen[-1] == f"vhost-bucket.{DOMAIN}", f"the request went to {seen[-1]}, not the bucket's host name"
    got = virtual.get_object(Bucket="vhost-bucket", Key="dir/key.txt")["Body"].read()
    assert got == b"through the bucket's own host name", got
    keys = [o["Key"] for o in virtual.list_objects_v2(Bucket="vhost-bucket")["Contents"]]
    assert keys == ["dir/key.txt"], keys
    print("  ok    PutObject, GetObject and ListObjectsV2 at vhost-bucket." + DOMAIN)

    got = path.get_object(Bucket="vhost-bucket", Key="dir/key.txt")["Body"].read()
    assert got == b"through the bucket's own host name", got
    path.put_object(Bucket="vhost-bucket", Key="by-path", Body=b"path style")
    got = virtual.get_object(Bucket="vhost-bucket", Key="by-path")["Body"].read()
    assert got == b"path style", got
    print("  ok    path style on the IP address still works, and both see the same objects")

    # At a bucket's host name the whole path is a key: one that begins
    # with `_/` is no route of the server's, nor its web UI's.
    for key in ["_/ui/app.js", "_/stats"]:
        virtual.put_object(Bucket="vhost-bucket", Key=key, Body=b"an object, not a route")
        got = virtual.get_object(Bucket="vhost-bucket", Key=key)["Body"].read()
        assert got == b"an object, not a route", f"{key}: {got[:60]!r}"
    got = path.get_object(Bucket="vhost-bucket", Key="_/ui/app.js")["Body"].read()
    assert got == b"an object, not a route", got
    print("  ok    keys under _/ at the bucket's host name are objects")

    names = [b["Name"] for b in virtual.list_buckets()["Buckets"]]
    assert "vhost-bucket" in names, names
    print("  ok    ListBuckets at the bare domain")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"  FAIL  {e}")
        sys.exit(1)
