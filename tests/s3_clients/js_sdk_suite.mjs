// The S3 API as the AWS SDK for JavaScript v3 sees it, in its default
// configuration.
//
// Environment:
//   DEPOT_TEST_S3_JS                where scripts/deps.sh installed
//                                   @aws-sdk/client-s3, lib-storage and
//                                   s3-request-presigner
//   S3_ENDPOINT                     http://127.0.0.1:PORT
//   S3_ACCESS_KEY, S3_SECRET_KEY    a user
//
// The expectations are AWS S3's documented behaviour. Clients are built with
// nothing but the endpoint, the region, path-style addressing and the
// credentials, and a logger, which changes nothing they send, so that the
// SDK's warnings are seen: a warning fails the check it comes before. The SDK
// sends a CRC32 with every upload (a header for a buffer, an aws-chunked
// trailer for a stream), asks for checksums on every GetObject and checks
// the body against the one it gets.
//
// Each area is one function with its own bucket. An area stops at its first
// failed check and the next area runs; the suite prints one line per check
// and exits 1 when any check failed, naming each failure at the end. The
// last area reads back every object the others left; then the buckets go.
import { createRequire } from 'node:module';
import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { isDeepStrictEqual } from 'node:util';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};
const sdk = createRequire(path.join(env('DEPOT_TEST_S3_JS'), 'package.json'));
const S3 = sdk('@aws-sdk/client-s3');
const { Upload } = sdk('@aws-sdk/lib-storage');
const { getSignedUrl } = sdk('@aws-sdk/s3-request-presigner');
const {
  S3Client, S3ServiceException, paginateListObjectsV2, CreateBucketCommand, HeadBucketCommand, ListBucketsCommand,
  DeleteBucketCommand, PutObjectCommand, GetObjectCommand, HeadObjectCommand, ListObjectsV2Command, CopyObjectCommand,
  DeleteObjectCommand, DeleteObjectsCommand, CreateMultipartUploadCommand, UploadPartCommand,
  CompleteMultipartUploadCommand, ListPartsCommand, AbortMultipartUploadCommand, ListMultipartUploadsCommand,
} = S3;

const ENDPOINT = env('S3_ENDPOINT').replace(/\/$/, '');
const ACCESS_KEY = env('S3_ACCESS_KEY');
const SECRET_KEY = env('S3_SECRET_KEY');
const REGION = 'us-east-1';
const MiB = 1024 * 1024;
const RUN = randomBytes(3).toString('hex');

// --- checks -------------------------------------------------------------------

class CheckFailed extends Error {}

// What the SDK warned since the last check.
const warnings = [];
const logger = { trace() {}, debug() {}, info() {}, warn: (...a) => warnings.push(a.join(' ')), error() {} };
console.warn = (...a) => warnings.push(a.join(' '));
// Not counted: the SDK's notice that it will drop this Node.js (18), which
// is about the runtime.
process.on('warning', (w) => {
  if (!w.message.startsWith('NodeDeprecationWarning')) warnings.push(String(w));
});

let lastOk = '';

function ok(what) {
  if (warnings.length) throw new CheckFailed(`${what}: the SDK warned: ${warnings.splice(0).join(' | ')}`);
  lastOk = what;
  console.log(`  ok    ${what}`);
}

// One check: `what` holds, else the area fails with `detail`.
function expect(condition, what, detail = '') {
  if (!condition) throw new CheckFailed(detail ? `${what}: ${detail}` : what);
  ok(what);
}

function expectEqual(got, want, what) {
  expect(isDeepStrictEqual(got, want), what, `expected ${short(want)}, got ${short(got)}`);
}

// One check: `call` fails with this S3 error code (null: any) and HTTP
// status, as an S3ServiceException, and as the SDK's class of that error
// when it has one. Returns the error.
async function expectError(what, code, status, call) {
  const want = code ? `${code} (${status})` : `status ${status}`;
  let result;
  try {
    result = await call();
  } catch (e) {
    const got = e.$metadata?.httpStatusCode;
    if (got !== status || (code && e.name !== code)) {
      throw new CheckFailed(`${what}: expected ${want}, got ${e.name} (${got}): ${e.message}`);
    }
    const typed = code && typeof S3[code] === 'function' ? S3[code] : S3ServiceException;
    expect(e instanceof S3ServiceException && e instanceof typed, what, `${e.name} is no ${typed.name}`);
    return e;
  }
  throw new CheckFailed(`${what}: expected ${want}, but it succeeded (status ${result?.$metadata?.httpStatusCode})`);
}

function short(value, limit = 300) {
  const text = value === undefined ? 'undefined' : JSON.stringify(value);
  return text.length <= limit ? text : `${text.slice(0, limit)}...`;
}

// --- helpers ------------------------------------------------------------------

function client(accessKeyId = ACCESS_KEY, secretAccessKey = SECRET_KEY) {
  return new S3Client({
    endpoint: ENDPOINT, region: REGION, forcePathStyle: true, credentials: { accessKeyId, secretAccessKey }, logger,
  });
}

const md5 = (b) => createHash('md5').update(b).digest();
// The ETag of a single PUT: the body's hex MD5, quoted.
const etagOf = (b) => `"${md5(b).toString('hex')}"`;
// The ETag of a completed multipart upload: the MD5 of the parts' MD5s,
// then '-' and the number of parts, quoted.
const multipartEtag = (parts) => `"${md5(Buffer.concat(parts.map(md5))).toString('hex')}-${parts.length}"`;
// `b` cut into pieces of `size`.
const pieces = (b, size) =>
  Array.from({ length: Math.ceil(b.length / size) }, (_, i) => b.subarray(i * size, (i + 1) * size));

async function bodyOf(response) {
  return Buffer.from(await response.Body.transformToByteArray());
}

// The checksums S3 knows, computed here rather than by the SDK (and by hand:
// zlib.crc32 is newer than Node.js 18).
function crc32Table(polynomial) {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ polynomial : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
}
function crc32With(table, b) {
  let c = 0xffffffff;
  for (let i = 0; i < b.length; i++) c = table[(c ^ b[i]) & 0xff] ^ (c >>> 8);
  const out = Buffer.alloc(4);
  out.writeUInt32BE((c ^ 0xffffffff) >>> 0);
  return out;
}
// CRC-64/NVME, its 64 bits in two halves.
const CRC64_HI = new Uint32Array(256);
const CRC64_LO = new Uint32Array(256);
for (let n = 0; n < 256; n++) {
  let c = BigInt(n);
  for (let k = 0; k < 8; k++) c = c & 1n ? (c >> 1n) ^ 0x9a6c9329ac4bc9b5n : c >> 1n;
  CRC64_HI[n] = Number(c >> 32n);
  CRC64_LO[n] = Number(c & 0xffffffffn);
}
function crc64nvme(b) {
  let hi = 0xffffffff;
  let lo = 0xffffffff;
  for (let i = 0; i < b.length; i++) {
    const n = (lo ^ b[i]) & 0xff;
    lo = ((lo >>> 8) | (hi << 24)) ^ CRC64_LO[n];
    hi = (hi >>> 8) ^ CRC64_HI[n];
  }
  const out = Buffer.alloc(8);
  out.writeUInt32BE((hi ^ 0xffffffff) >>> 0, 0);
  out.writeUInt32BE((lo ^ 0xffffffff) >>> 0, 4);
  return out;
}
const CRC32 = crc32Table(0xedb88320);
const CRC32C = crc32Table(0x82f63b78);
const DIGESTS = {
  CRC32: (b) => crc32With(CRC32, b),
  CRC32C: (b) => crc32With(CRC32C, b),
  CRC64NVME: crc64nvme,
  SHA1: (b) => createHash('sha1').update(b).digest(),
  SHA256: (b) => createHash('sha256').update(b).digest(),
};
// A checksum as S3 sends it: base64.
const checksum = (algorithm, b) => DIGESTS[algorithm](b).toString('base64');
// The checksum of a multipart upload whose parts have one: the checksum of
// the parts' checksums, then '-' and the number of parts.
const composite = (algorithm, parts) =>
  `${checksum(algorithm, Buffer.concat(parts.map(DIGESTS[algorithm])))}-${parts.length}`;

// Objects the areas leave, read back by the last one.
const kept = [];
const keep = (Bucket, Key, bytes) => kept.push({ Bucket, Key, bytes });

// One check: the object holds `bytes` and has this ETag.
async function expectObject(s3, Bucket, Key, bytes, what, etag = etagOf(bytes)) {
  const got = await s3.send(new GetObjectCommand({ Bucket, Key }));
  const body = await bodyOf(got);
  expect(
    body.equals(bytes) && got.ContentLength === bytes.length && got.ETag === etag,
    what,
    `${body.length} bytes (${body.equals(bytes) ? 'the same' : 'others'}), Content-Length ${got.ContentLength}, ETag ` +
      `${got.ETag}; expected ${bytes.length} bytes, ETag ${etag}`,
  );
  return got;
}

async function emptyAndDelete(s3, Bucket) {
  const uploads = await s3.send(new ListMultipartUploadsCommand({ Bucket }));
  for (const u of uploads.Uploads ?? []) {
    await s3.send(new AbortMultipartUploadCommand({ Bucket, Key: u.Key, UploadId: u.UploadId }));
  }
  for await (const page of paginateListObjectsV2({ client: s3 }, { Bucket })) {
    const Objects = (page.Contents ?? []).map((o) => ({ Key: o.Key }));
    if (Objects.length) await s3.send(new DeleteObjectsCommand({ Bucket, Delete: { Objects, Quiet: true } }));
  }
  await s3.send(new DeleteBucketCommand({ Bucket }));
}

// --- areas --------------------------------------------------------------------

async function buckets(s3, Bucket) {
  expectEqual((await s3.send(new HeadBucketCommand({ Bucket }))).$metadata.httpStatusCode, 200, 'HeadBucket');
  const listed = (await s3.send(new ListBucketsCommand({}))).Buckets?.find((b) => b.Name === Bucket);
  expect(listed?.CreationDate instanceof Date, 'ListBuckets names the bucket, with its creation date', short(listed));
  await expectError('CreateBucket of it again is BucketAlreadyOwnedByYou', 'BucketAlreadyOwnedByYou', 409, () =>
    s3.send(new CreateBucketCommand({ Bucket })));

  const missing = `${Bucket}-missing`;
  await expectError('GetObject in a missing bucket is NoSuchBucket', 'NoSuchBucket', 404, () =>
    s3.send(new GetObjectCommand({ Bucket: missing, Key: 'k' })));
  await expectError('PutObject into a missing bucket is NoSuchBucket', 'NoSuchBucket', 404, () =>
    s3.send(new PutObjectCommand({ Bucket: missing, Key: 'k', Body: 'x' })));
  await expectError('ListObjectsV2 of a missing bucket is NoSuchBucket', 'NoSuchBucket', 404, () =>
    s3.send(new ListObjectsV2Command({ Bucket: missing })));
  await expectError('HeadBucket of a missing bucket is NotFound', 'NotFound', 404, () =>
    s3.send(new HeadBucketCommand({ Bucket: missing })));

  await s3.send(new PutObjectCommand({ Bucket, Key: 'k', Body: 'x' }));
  await expectError('DeleteBucket of a bucket with an object is BucketNotEmpty', 'BucketNotEmpty', 409, () =>
    s3.send(new DeleteBucketCommand({ Bucket })));
  await s3.send(new DeleteObjectCommand({ Bucket, Key: 'k' }));
  const deleted = await s3.send(new DeleteBucketCommand({ Bucket }));
  expectEqual(deleted.$metadata.httpStatusCode, 204, 'DeleteBucket of the emptied bucket');
  await expectError('... and HeadBucket then is NotFound', 'NotFound', 404, () =>
    s3.send(new HeadBucketCommand({ Bucket })));
}

async function put(s3, Bucket) {
  const text = 'hello, depot \u00e9\u4e16\n';
  const utf8 = Buffer.from(text);
  const answer = await s3.send(new PutObjectCommand({ Bucket, Key: 'string', Body: text }));
  expectEqual(answer.ETag, etagOf(utf8), 'PutObject of a string: the ETag is the MD5 of its UTF-8');
  expectEqual(answer.ChecksumCRC32, checksum('CRC32', utf8), '... the SDK sent its default CRC32, and it is echoed');
  await expectObject(s3, Bucket, 'string', utf8, '... and GetObject returns the bytes');
  keep(Bucket, 'string', utf8);

  const bodies = [
    ['a Buffer', 'buffer', randomBytes(100_000), (b) => ({ Body: b })],
    ['a Uint8Array', 'u8', randomBytes(70_001), (b) => ({ Body: new Uint8Array(b) })],
    ['an empty Buffer', 'empty', Buffer.alloc(0), (b) => ({ Body: b })],
    ['a Readable with its ContentLength', 'stream', randomBytes(300_000),
      (b) => ({ Body: Readable.from(pieces(b, 100_000)), ContentLength: b.length })],
    ['a key with spaces, non-ASCII and reserved characters', "sp ace/\u00fc+plus=eq&amp;%25?#~!$'()*,;:@.txt",
      Buffer.from('special'), (b) => ({ Body: b })],
  ];
  for (const [what, Key, bytes, body] of bodies) {
    await s3.send(new PutObjectCommand({ Bucket, Key, ...body(bytes) }));
    await expectObject(s3, Bucket, Key, bytes, `PutObject of ${what} reads back whole`);
    keep(Bucket, Key, bytes);
  }
  // The SDK sets no Content-Length for an empty string, and warns about
  // that (about itself: the same against S3).
  await s3.send(new PutObjectCommand({ Bucket, Key: 'empty-string', Body: '' }));
  const unknownLength = warnings.findIndex((w) => w.includes('Stream of unknown length'));
  if (unknownLength >= 0) warnings.splice(unknownLength, 1);
  await expectObject(s3, Bucket, 'empty-string', Buffer.alloc(0), 'PutObject of an empty string reads back empty');

  const file = path.join(os.tmpdir(), 'upload.bin');
  const bytes = randomBytes(3 * MiB + 7);
  fs.writeFileSync(file, bytes);
  await s3.send(new PutObjectCommand({ Bucket, Key: 'file', Body: fs.createReadStream(file) }));
  await expectObject(s3, Bucket, 'file', bytes, 'PutObject of an fs.ReadStream (the SDK finds its length) reads back');
  keep(Bucket, 'file', bytes);
  fs.unlinkSync(file);

  const stored = {
    ContentType: 'application/json', CacheControl: 'max-age=60, public',
    ContentDisposition: 'attachment; filename="m.json"', Metadata: { color: 'blue', 'long-name': 'v a l u e' },
  };
  const json = Buffer.from('{"a":1}');
  await s3.send(new PutObjectCommand({ Bucket, Key: 'meta.json', Body: json, ...stored }));
  const head = await s3.send(new HeadObjectCommand({ Bucket, Key: 'meta.json' }));
  const { ContentType, CacheControl, ContentDisposition, Metadata } = head;
  expectEqual({ ContentType, CacheControl, ContentDisposition, Metadata }, stored,
    'HeadObject returns the Content-Type, Cache-Control, Content-Disposition and metadata stored');
  expect(
    head.ContentLength === json.length && head.ETag === etagOf(json) &&
      Math.abs(head.LastModified - Date.now()) < 120_000,
    '... and the length, ETag and a Last-Modified of now',
    short(head),
  );

  const wrongCrc = checksum('CRC32', Buffer.from('abd'));
  await expectError('PutObject with a wrong CRC32 is BadDigest', 'BadDigest', 400, () =>
    s3.send(new PutObjectCommand({ Bucket, Key: 'bad', Body: 'abc', ChecksumCRC32: wrongCrc })));
  const md5b64 = (b) => md5(b).toString('base64');
  await expectError('PutObject with a wrong Content-MD5 is BadDigest', 'BadDigest', 400, () =>
    s3.send(new PutObjectCommand({ Bucket, Key: 'bad', Body: 'abc', ContentMD5: md5b64('abd') })));
  await expectError('... and neither stored anything', 'NotFound', 404, () =>
    s3.send(new HeadObjectCommand({ Bucket, Key: 'bad' })));
  const signed = Buffer.from('with its MD5');
  await s3.send(new PutObjectCommand({ Bucket, Key: 'md5', Body: signed, ContentMD5: md5b64(signed) }));
  await expectObject(s3, Bucket, 'md5', signed, 'PutObject with the right Content-MD5 stores the body');
}

async function checksums(s3, Bucket) {
  const bytes = randomBytes(150_000);
  for (const algorithm of Object.keys(DIGESTS)) {
    const field = `Checksum${algorithm}`;
    const want = checksum(algorithm, bytes);
    for (const [how, Key, body] of [
      ['a Buffer', algorithm, { Body: bytes }],
      ['a stream (aws-chunked, with a trailer)', `${algorithm}-stream`,
        { Body: Readable.from([bytes]), ContentLength: bytes.length }],
    ]) {
      const answer = await s3.send(new PutObjectCommand({ Bucket, Key, ChecksumAlgorithm: algorithm, ...body }));
      expectEqual(answer[field], want, `PutObject of ${how} with ChecksumAlgorithm ${algorithm}: the answer has it`);
      const got = await s3.send(new GetObjectCommand({ Bucket, Key, ChecksumMode: 'ENABLED' }));
      expectEqual(got[field], want, '... GetObject returns it');
      expect((await bodyOf(got)).equals(bytes), '... and the body, which the SDK checked against it');
      const head = await s3.send(new HeadObjectCommand({ Bucket, Key, ChecksumMode: 'ENABLED' }));
      expectEqual([head[field], head.ChecksumType], [want, 'FULL_OBJECT'], '... and HeadObject, FULL_OBJECT');
      keep(Bucket, Key, bytes);
    }
  }
  // Without ChecksumMode: the SDK asks for it by default.
  const got = await s3.send(new GetObjectCommand({ Bucket, Key: 'CRC32' }));
  expectEqual(got.ChecksumCRC32, checksum('CRC32', bytes), 'GetObject by default asks for the checksum and gets it');
  expect((await bodyOf(got)).equals(bytes), '... and the body passes the SDK\'s check');
}

async function get(s3, Bucket) {
  const bytes = randomBytes(1_000_000);
  await s3.send(new PutObjectCommand({ Bucket, Key: 'range.bin', Body: bytes }));
  keep(Bucket, 'range.bin', bytes);
  const n = bytes.length;
  for (const [Range, from, to] of [['bytes=0-9', 0, 10], ['bytes=1000-', 1000, n], ['bytes=-5', n - 5, n],
    ['bytes=500000-500000', 500000, 500001], [`bytes=999990-${n + 100}`, 999990, n]]) {
    const r = await s3.send(new GetObjectCommand({ Bucket, Key: 'range.bin', Range }));
    const body = await bodyOf(r);
    expect(
      r.$metadata.httpStatusCode === 206 && r.ContentRange === `bytes ${from}-${to - 1}/${n}` &&
        r.ContentLength === to - from && body.equals(bytes.subarray(from, to)),
      `GetObject Range ${Range} is 206 with those bytes`,
      `status ${r.$metadata.httpStatusCode}, Content-Range ${r.ContentRange}, ${body.length} bytes`,
    );
  }
  await expectError('GetObject Range from past the end is InvalidRange', 'InvalidRange', 416, () =>
    s3.send(new GetObjectCommand({ Bucket, Key: 'range.bin', Range: `bytes=${n}-` })));

  const sha = randomBytes(50_000);
  await s3.send(new PutObjectCommand({ Bucket, Key: 'range-sha', Body: sha, ChecksumAlgorithm: 'SHA256' }));
  const part = await s3.send(new GetObjectCommand({
    Bucket, Key: 'range-sha', Range: 'bytes=100-199', ChecksumMode: 'ENABLED',
  }));
  expect(
    part.ChecksumSHA256 === undefined && (await bodyOf(part)).equals(sha.subarray(100, 200)),
    'a range of an object with a SHA256 comes without the whole object\'s SHA256',
    `ChecksumSHA256 ${part.ChecksumSHA256}`,
  );

  const { ETag, LastModified } = await s3.send(new HeadObjectCommand({ Bucket, Key: 'range.bin' }));
  const hour = 3600_000;
  const other = '"0123456789abcdef0123456789abcdef"';
  const getIf = (conditions) => s3.send(new GetObjectCommand({ Bucket, Key: 'range.bin', ...conditions }));
  await expectError('GetObject If-None-Match: the ETag is 304', null, 304, () => getIf({ IfNoneMatch: ETag }));
  await expectError('GetObject If-Modified-Since: an hour later is 304', null, 304, () =>
    getIf({ IfModifiedSince: new Date(LastModified.getTime() + hour) }));
  await expectError('HeadObject If-None-Match: the ETag is 304', null, 304, () =>
    s3.send(new HeadObjectCommand({ Bucket, Key: 'range.bin', IfNoneMatch: ETag })));
  const fresh = await getIf({ IfNoneMatch: other, IfModifiedSince: new Date(LastModified.getTime() - hour) });
  expect((await bodyOf(fresh)).equals(bytes), 'GetObject If-None-Match another ETag, If-Modified-Since an hour before');
  const matched = await getIf({ IfMatch: ETag });
  expect((await bodyOf(matched)).equals(bytes), 'GetObject If-Match: the ETag returns the object');
  await expectError('GetObject If-Match: another ETag is PreconditionFailed', 'PreconditionFailed', 412, () =>
    getIf({ IfMatch: other }));
  await expectError('GetObject If-Unmodified-Since: an hour before is PreconditionFailed', 'PreconditionFailed', 412,
    () => getIf({ IfUnmodifiedSince: new Date(LastModified.getTime() - hour) }));

  const overridden = await s3.send(new GetObjectCommand({
    Bucket, Key: 'range.bin', ResponseContentType: 'text/plain', ResponseContentDisposition: 'inline',
    ResponseCacheControl: 'no-store',
  }));
  await bodyOf(overridden);
  const { ContentType, ContentDisposition, CacheControl } = overridden;
  expectEqual({ ContentType, ContentDisposition, CacheControl },
    { ContentType: 'text/plain', ContentDisposition: 'inline', CacheControl: 'no-store' },
    'GetObject ResponseContentType, ResponseContentDisposition, ResponseCacheControl');
}

async function listing(s3, Bucket) {
  const keys = ['a/1', 'a/2', 'b/1', 'b/c/1', 'c', 'd', 'e f', '\u00e9'].map((k) => `list/${k}`);
  await Promise.all(keys.map((Key) => s3.send(new PutObjectCommand({ Bucket, Key, Body: Key }))));
  await s3.send(new PutObjectCommand({ Bucket, Key: 'other', Body: 'other' }));

  const pages = [];
  for await (const page of paginateListObjectsV2({ client: s3, pageSize: 2 }, { Bucket, Prefix: 'list/' })) {
    pages.push(page.Contents ?? []);
  }
  expectEqual(pages.map((p) => p.length), [2, 2, 2, 2], 'paginateListObjectsV2 with pageSize 2: four pages of two');
  const listed = pages.flat();
  expectEqual(listed.map((o) => o.Key), keys, '... the keys in UTF-8 order');
  expect(
    listed.every((o) => o.Size === Buffer.byteLength(o.Key) && o.ETag === etagOf(o.Key)),
    '... each with its size and ETag',
    short(listed),
  );

  const delimited = await s3.send(new ListObjectsV2Command({ Bucket, Prefix: 'list/', Delimiter: '/' }));
  expectEqual(
    [delimited.CommonPrefixes?.map((p) => p.Prefix), delimited.Contents?.map((o) => o.Key)],
    [['list/a/', 'list/b/'], ['list/c', 'list/d', 'list/e f', 'list/\u00e9']],
    'ListObjectsV2 with Delimiter /: the common prefixes and the keys',
  );
  const seen = [];
  const oneByOne = paginateListObjectsV2({ client: s3, pageSize: 1 }, { Bucket, Prefix: 'list/', Delimiter: '/' });
  for await (const page of oneByOne) {
    seen.push(...(page.CommonPrefixes ?? []).map((p) => p.Prefix), ...(page.Contents ?? []).map((o) => o.Key));
  }
  expectEqual(seen, ['list/a/', 'list/b/', 'list/c', 'list/d', 'list/e f', 'list/\u00e9'],
    '... and one at a time, a common prefix counting as one');
  const after = await s3.send(new ListObjectsV2Command({ Bucket, Prefix: 'list/', StartAfter: 'list/c' }));
  expectEqual(after.Contents?.map((o) => o.Key), ['list/d', 'list/e f', 'list/\u00e9'], 'ListObjectsV2 StartAfter');
  const none = await s3.send(new ListObjectsV2Command({ Bucket, Prefix: 'nothing/' }));
  expectEqual([none.KeyCount, none.Contents], [0, undefined], 'ListObjectsV2 of a prefix nothing has');
}

async function copyAndDelete(s3, Bucket) {
  const bytes = Buffer.from('{"shape":"square"}');
  await s3.send(new PutObjectCommand({
    Bucket, Key: 'src.json', Body: bytes, ContentType: 'application/json', Metadata: { shape: 'square' },
  }));
  const copied = await s3.send(new CopyObjectCommand({ Bucket, Key: 'copy.json', CopySource: `${Bucket}/src.json` }));
  expectEqual(copied.CopyObjectResult?.ETag, etagOf(bytes), 'CopyObject: the copy\'s ETag');
  const copy = await expectObject(s3, Bucket, 'copy.json', bytes, '... its bytes');
  expectEqual([copy.ContentType, copy.Metadata], ['application/json', { shape: 'square' }],
    '... and the source\'s Content-Type and metadata');
  await s3.send(new CopyObjectCommand({
    Bucket, Key: 'replaced', CopySource: `${Bucket}/src.json`, MetadataDirective: 'REPLACE',
    Metadata: { shape: 'round' }, ContentType: 'text/x-new',
  }));
  const replaced = await s3.send(new HeadObjectCommand({ Bucket, Key: 'replaced' }));
  expectEqual([replaced.ContentType, replaced.Metadata], ['text/x-new', { shape: 'round' }],
    'CopyObject MetadataDirective REPLACE: the new Content-Type and metadata');

  const odd = 'sp ace/\u00fc+plus=%25?#.txt';
  await s3.send(new PutObjectCommand({ Bucket, Key: odd, Body: bytes }));
  await s3.send(new CopyObjectCommand({ Bucket, Key: 'odd-copy', CopySource: `${Bucket}/${encodeURIComponent(odd)}` }));
  await expectObject(s3, Bucket, 'odd-copy', bytes, 'CopyObject of a key that needs URL-encoding');
  const sha = randomBytes(10_000);
  await s3.send(new PutObjectCommand({ Bucket, Key: 'sha', Body: sha, ChecksumAlgorithm: 'SHA256' }));
  await s3.send(new CopyObjectCommand({ Bucket, Key: 'sha-copy', CopySource: `${Bucket}/sha` }));
  const shaCopy = await s3.send(new HeadObjectCommand({ Bucket, Key: 'sha-copy', ChecksumMode: 'ENABLED' }));
  expectEqual(shaCopy.ChecksumSHA256, checksum('SHA256', sha), 'CopyObject of an object with a SHA256 keeps it');
  keep(Bucket, 'sha-copy', sha);
  await expectError('CopyObject of a missing key is NoSuchKey', 'NoSuchKey', 404, () =>
    s3.send(new CopyObjectCommand({ Bucket, Key: 'nothing', CopySource: `${Bucket}/missing` })));

  const deleted = await s3.send(new DeleteObjectCommand({ Bucket, Key: 'odd-copy' }));
  expectEqual(deleted.$metadata.httpStatusCode, 204, 'DeleteObject');
  await expectError('... and HeadObject then is NotFound', 'NotFound', 404, () =>
    s3.send(new HeadObjectCommand({ Bucket, Key: 'odd-copy' })));
  const missing = await s3.send(new DeleteObjectCommand({ Bucket, Key: 'never-was' }));
  expectEqual(missing.$metadata.httpStatusCode, 204, 'DeleteObject of a missing key is 204 too');

  // The SDK sends the document with a checksum of it.
  const keys = ['src.json', 'copy.json', odd, 'never-was'];
  const many = await s3.send(new DeleteObjectsCommand({ Bucket, Delete: { Objects: keys.map((Key) => ({ Key })) } }));
  expectEqual([many.Errors, many.Deleted?.map((d) => d.Key).sort()], [undefined, [...keys].sort()],
    'DeleteObjects names every key deleted, the missing one too, and no errors');
  const left = await s3.send(new ListObjectsV2Command({ Bucket }));
  expectEqual(left.Contents?.map((o) => o.Key), ['replaced', 'sha', 'sha-copy'], '... and only the others are left');
  const quiet = await s3.send(new DeleteObjectsCommand({
    Bucket, Delete: { Quiet: true, Objects: [{ Key: 'replaced' }] },
  }));
  expectEqual(quiet.Deleted, undefined, 'DeleteObjects Quiet names nothing');
  await expectError('... and deleted it', 'NotFound', 404, () =>
    s3.send(new HeadObjectCommand({ Bucket, Key: 'replaced' })));
}

async function multipart(s3, Bucket) {
  const partSize = 5 * MiB;
  const big = randomBytes(30 * MiB + 12345);
  const parts = pieces(big, partSize);
  const upload = new Upload({
    client: s3, partSize, queueSize: 4,
    params: { Bucket, Key: 'lib.bin', Body: big, ContentType: 'video/mp4', Metadata: { kind: 'lib' } },
  });
  const done = await upload.done();
  expectEqual(done.ETag, multipartEtag(parts), 'lib-storage Upload of 30 MiB in 5 MiB parts: the multipart ETag');
  const got = await expectObject(s3, Bucket, 'lib.bin', big, '... GetObject returns the bytes', multipartEtag(parts));
  expectEqual([got.ContentType, got.Metadata], ['video/mp4', { kind: 'lib' }], '... and the Content-Type and metadata');
  keep(Bucket, 'lib.bin', big);
  const head = await s3.send(new HeadObjectCommand({ Bucket, Key: 'lib.bin', ChecksumMode: 'ENABLED' }));
  expectEqual([head.ChecksumCRC32, head.ChecksumType], [composite('CRC32', parts), 'COMPOSITE'],
    '... HeadObject returns the CRC32 of the parts\' CRC32s (the SDK sent one with each)');
  const second = await s3.send(new GetObjectCommand({ Bucket, Key: 'lib.bin', PartNumber: 2 }));
  expect(
    second.$metadata.httpStatusCode === 206 && second.PartsCount === parts.length &&
      (await bodyOf(second)).equals(parts[1]),
    'GetObject PartNumber 2 returns that part and the number of parts',
    `status ${second.$metadata.httpStatusCode}, PartsCount ${second.PartsCount}`,
  );

  const streamed = randomBytes(12 * MiB + 99);
  const fromStream = await new Upload({
    client: s3, partSize, queueSize: 2,
    params: { Bucket, Key: 'lib-stream', Body: Readable.from(pieces(streamed, 300_001)) },
  }).done();
  const streamedEtag = multipartEtag(pieces(streamed, partSize));
  expectEqual(fromStream.ETag, streamedEtag, 'lib-storage Upload of a 12 MiB stream of unknown length: three parts');
  await expectObject(s3, Bucket, 'lib-stream', streamed, '... and GetObject returns the bytes', streamedEtag);
  keep(Bucket, 'lib-stream', streamed);
  const small = randomBytes(100_000);
  const single = await new Upload({
    client: s3, params: { Bucket, Key: 'lib-small', Body: Readable.from([small]) },
  }).done();
  expectEqual(single.ETag, etagOf(small), 'lib-storage Upload of a small stream is one PutObject');
  await expectObject(s3, Bucket, 'lib-small', small, '... and GetObject returns the bytes');

  // By hand.
  const Key = 'hand.bin';
  const [p1, p2] = [randomBytes(partSize), randomBytes(1234)];
  const { UploadId } = await s3.send(new CreateMultipartUploadCommand({
    Bucket, Key, ContentType: 'application/x-hand', Metadata: { by: 'hand' },
  }));
  const u1 = await s3.send(new UploadPartCommand({ Bucket, Key, UploadId, PartNumber: 1, Body: p1 }));
  const u2 = await s3.send(new UploadPartCommand({
    Bucket, Key, UploadId, PartNumber: 2, Body: Readable.from([p2]), ContentLength: p2.length,
  }));
  expectEqual([u1.ETag, u2.ETag], [etagOf(p1), etagOf(p2)], 'UploadPart of a Buffer and of a stream: their ETags');
  const listed = await s3.send(new ListPartsCommand({ Bucket, Key, UploadId }));
  expectEqual(listed.Parts?.map((p) => [p.PartNumber, p.ETag, p.Size]),
    [[1, u1.ETag, p1.length], [2, u2.ETag, p2.length]], 'ListParts');
  const page = await s3.send(new ListPartsCommand({ Bucket, Key, UploadId, MaxParts: 1 }));
  expectEqual([page.Parts?.length, page.IsTruncated, page.NextPartNumberMarker], [1, true, '1'],
    'ListParts MaxParts 1');
  const uploads = await s3.send(new ListMultipartUploadsCommand({ Bucket }));
  expect(uploads.Uploads?.some((u) => u.UploadId === UploadId && u.Key === Key), 'ListMultipartUploads lists it',
    short(uploads.Uploads));
  const completed = await s3.send(new CompleteMultipartUploadCommand({
    Bucket, Key, UploadId,
    MultipartUpload: { Parts: [{ PartNumber: 1, ETag: u1.ETag }, { PartNumber: 2, ETag: u2.ETag }] },
  }));
  expectEqual(completed.ETag, multipartEtag([p1, p2]), 'CompleteMultipartUpload: the multipart ETag');
  const whole = Buffer.concat([p1, p2]);
  const handGot = await expectObject(s3, Bucket, Key, whole, '... GetObject returns the parts in order',
    completed.ETag);
  expectEqual([handGot.ContentType, handGot.Metadata], ['application/x-hand', { by: 'hand' }],
    '... with the Content-Type and metadata of CreateMultipartUpload');
  keep(Bucket, Key, whole);
  const after = await s3.send(new ListMultipartUploadsCommand({ Bucket }));
  expect(!after.Uploads?.some((u) => u.UploadId === UploadId), '... and ListMultipartUploads no longer lists it');

  const tiny = await s3.send(new CreateMultipartUploadCommand({ Bucket, Key: 'tiny' }));
  const tinyParts = [];
  for (const PartNumber of [1, 2]) {
    const { ETag } = await s3.send(new UploadPartCommand({
      Bucket, Key: 'tiny', UploadId: tiny.UploadId, PartNumber, Body: 'abc',
    }));
    tinyParts.push({ PartNumber, ETag });
  }
  const complete = (Parts) => s3.send(new CompleteMultipartUploadCommand({
    Bucket, Key: 'tiny', UploadId: tiny.UploadId, MultipartUpload: { Parts },
  }));
  await expectError('CompleteMultipartUpload with a part under 5 MiB not last is EntityTooSmall', 'EntityTooSmall', 400,
    () => complete(tinyParts));
  await expectError('CompleteMultipartUpload with a wrong ETag is InvalidPart', 'InvalidPart', 400, () =>
    complete([{ PartNumber: 1, ETag: `"${'0'.repeat(32)}"` }]));
  const aborted = await s3.send(new AbortMultipartUploadCommand({ Bucket, Key: 'tiny', UploadId: tiny.UploadId }));
  expectEqual(aborted.$metadata.httpStatusCode, 204, 'AbortMultipartUpload');
  await expectError('... then ListParts is NoSuchUpload', 'NoSuchUpload', 404, () =>
    s3.send(new ListPartsCommand({ Bucket, Key: 'tiny', UploadId: tiny.UploadId })));
  await expectError('... and so is UploadPart', 'NoSuchUpload', 404, () =>
    s3.send(new UploadPartCommand({ Bucket, Key: 'tiny', UploadId: tiny.UploadId, PartNumber: 3, Body: 'x' })));
  const gone = await s3.send(new ListMultipartUploadsCommand({ Bucket }));
  expect(!gone.Uploads?.some((u) => u.UploadId === tiny.UploadId), '... and ListMultipartUploads no longer lists it');

  for (const algorithm of ['SHA256', 'CRC32C']) {
    const field = `Checksum${algorithm}`;
    const Key = `checksum-${algorithm}`;
    const bodies = [randomBytes(partSize), randomBytes(777)];
    const up = await s3.send(new CreateMultipartUploadCommand({ Bucket, Key, ChecksumAlgorithm: algorithm }));
    const Parts = [];
    for (const [i, Body] of bodies.entries()) {
      const answer = await s3.send(new UploadPartCommand({
        Bucket, Key, UploadId: up.UploadId, PartNumber: i + 1, Body, ChecksumAlgorithm: algorithm,
      }));
      Parts.push({ PartNumber: i + 1, ETag: answer.ETag, [field]: answer[field] });
    }
    expectEqual(Parts.map((p) => p[field]), bodies.map((b) => checksum(algorithm, b)),
      `multipart with ChecksumAlgorithm ${algorithm}: each UploadPart answers the part's`);
    const parts = await s3.send(new ListPartsCommand({ Bucket, Key, UploadId: up.UploadId }));
    expectEqual(parts.Parts?.map((p) => p[field]), Parts.map((p) => p[field]), '... and ListParts names them');
    await s3.send(new CompleteMultipartUploadCommand({
      Bucket, Key, UploadId: up.UploadId, MultipartUpload: { Parts },
    }));
    const whole = Buffer.concat(bodies);
    const got = await s3.send(new GetObjectCommand({ Bucket, Key, ChecksumMode: 'ENABLED' }));
    expect((await bodyOf(got)).equals(whole), '... GetObject with ChecksumMode ENABLED returns the bytes');
    const head = await s3.send(new HeadObjectCommand({ Bucket, Key, ChecksumMode: 'ENABLED' }));
    expectEqual([head[field], head.ChecksumType], [composite(algorithm, bodies), 'COMPOSITE'],
      `... and HeadObject the ${algorithm} of the parts' ${algorithm}s`);
    keep(Bucket, Key, whole);
  }
}

async function presign(s3, Bucket) {
  const bytes = randomBytes(200_000);
  await s3.send(new PutObjectCommand({ Bucket, Key: 'get', Body: bytes }));
  const url = await getSignedUrl(s3, new GetObjectCommand({ Bucket, Key: 'get' }), { expiresIn: 600 });
  const r = await fetch(url);
  const got = Buffer.from(await r.arrayBuffer());
  expect(r.status === 200 && got.equals(bytes), 'a presigned GET URL works through fetch', `status ${r.status}`);
  const ranged = await fetch(url, { headers: { Range: 'bytes=0-3' } });
  const four = Buffer.from(await ranged.arrayBuffer());
  expect(ranged.status === 206 && four.equals(bytes.subarray(0, 4)), '... with a Range too', `status ${ranged.status}`);
  const tampered = await fetch(url.replace(/X-Amz-Signature=(.)/, (_, c) => `X-Amz-Signature=${c === '0' ? 1 : 0}`));
  const answer = await tampered.text();
  expect(tampered.status === 403 && answer.includes('<Code>SignatureDoesNotMatch</Code>'),
    '... and with a changed signature it is SignatureDoesNotMatch',
    `status ${tampered.status}: ${answer.slice(0, 300)}`);

  // A browser's multipart upload: the server signs a URL per part.
  const Key = 'parts';
  const { UploadId } = await s3.send(new CreateMultipartUploadCommand({ Bucket, Key }));
  const bodies = [randomBytes(5 * MiB), randomBytes(1000)];
  const Parts = [];
  for (const [i, body] of bodies.entries()) {
    const command = new UploadPartCommand({ Bucket, Key, UploadId, PartNumber: i + 1 });
    const put = await fetch(await getSignedUrl(s3, command, { expiresIn: 600 }), { method: 'PUT', body });
    const text = await put.text();
    expect(put.status === 200 && put.headers.get('etag') === etagOf(body),
      `a presigned UploadPart URL works through fetch (part ${i + 1})`, `status ${put.status}: ${text.slice(0, 300)}`);
    Parts.push({ PartNumber: i + 1, ETag: put.headers.get('etag') });
  }
  await s3.send(new CompleteMultipartUploadCommand({ Bucket, Key, UploadId, MultipartUpload: { Parts } }));
  const whole = Buffer.concat(bodies);
  await expectObject(s3, Bucket, Key, whole, '... and CompleteMultipartUpload joins the parts', multipartEtag(bodies));
  keep(Bucket, Key, whole);

  const png = randomBytes(10_000);
  const typed = new PutObjectCommand({ Bucket, Key: 'typed', ContentType: 'image/png', Metadata: { from: 'presign' } });
  const typedPut = await fetch(await getSignedUrl(s3, typed, { expiresIn: 600 }), {
    method: 'PUT', body: png, headers: { 'Content-Type': 'image/png' },
  });
  const typedText = await typedPut.text();
  expect(typedPut.status === 200, 'a presigned PUT URL with a Content-Type and metadata works through fetch',
    `status ${typedPut.status}: ${typedText.slice(0, 300)}`);
  const typedHead = await s3.send(new HeadObjectCommand({ Bucket, Key: 'typed' }));
  expectEqual([typedHead.ContentType, typedHead.Metadata], ['image/png', { from: 'presign' }],
    '... and stored them');
  await expectObject(s3, Bucket, 'typed', png, '... and the bytes');
  keep(Bucket, 'typed', png);

  // The SDK puts the CRC32 of the body it presigned, none, in the URL; S3
  // ignores checksums in a presigned URL's query.
  const plain = randomBytes(123_456);
  const putUrl = await getSignedUrl(s3, new PutObjectCommand({ Bucket, Key: 'plain' }), { expiresIn: 600 });
  expect(/[?&]x-amz-checksum-crc32=/.test(putUrl), '(the SDK\'s presigned PUT URL carries a CRC32)', putUrl);
  const plainPut = await fetch(putUrl, { method: 'PUT', body: plain });
  const plainText = await plainPut.text();
  expect(plainPut.status === 200 && plainPut.headers.get('etag') === etagOf(plain),
    'a presigned PUT URL (SDK default) works through fetch', `status ${plainPut.status}: ${plainText.slice(0, 300)}`);
  await expectObject(s3, Bucket, 'plain', plain, '... and stored the bytes');
  const plainHead = await s3.send(new HeadObjectCommand({ Bucket, Key: 'plain', ChecksumMode: 'ENABLED' }));
  expectEqual(plainHead.ChecksumCRC32, undefined, '... and no CRC32 with them');
  keep(Bucket, 'plain', plain);
}

async function conditionalPut(s3, Bucket) {
  const Key = 'once';
  await s3.send(new PutObjectCommand({ Bucket, Key, Body: 'first', IfNoneMatch: '*' }));
  await expectError('PutObject If-None-Match * onto an existing key is PreconditionFailed', 'PreconditionFailed', 412,
    () => s3.send(new PutObjectCommand({ Bucket, Key, Body: 'second', IfNoneMatch: '*' })));
  await expectObject(s3, Bucket, Key, Buffer.from('first'), '... and the object is as it was');
  const { ETag } = await s3.send(new HeadObjectCommand({ Bucket, Key }));
  await s3.send(new PutObjectCommand({ Bucket, Key, Body: 'third', IfMatch: ETag }));
  await expectObject(s3, Bucket, Key, Buffer.from('third'), 'PutObject If-Match: the ETag overwrites');
  keep(Bucket, Key, Buffer.from('third'));
  await expectError('PutObject If-Match: the old ETag is PreconditionFailed', 'PreconditionFailed', 412, () =>
    s3.send(new PutObjectCommand({ Bucket, Key, Body: 'fourth', IfMatch: ETag })));
}

async function errors(s3, Bucket) {
  await s3.send(new PutObjectCommand({ Bucket, Key: 'k', Body: 'k' }));
  const e = await expectError('GetObject of a missing key is NoSuchKey', 'NoSuchKey', 404, () =>
    s3.send(new GetObjectCommand({ Bucket, Key: 'missing' })));
  expect(!!e.$metadata.requestId, '... with the request ID', short(e.$metadata));
  await expectError('HeadObject of a missing key is NotFound', 'NotFound', 404, () =>
    s3.send(new HeadObjectCommand({ Bucket, Key: 'missing' })));

  const wrong = client(ACCESS_KEY, `${SECRET_KEY}x`);
  const list = ['ListBuckets', new ListBucketsCommand({})];
  const read = ['GetObject', new GetObjectCommand({ Bucket, Key: 'k' })];
  for (const [what, command] of [list, read, ['PutObject', new PutObjectCommand({ Bucket, Key: 'k2', Body: 'x' })]]) {
    await expectError(`${what} with a wrong secret is SignatureDoesNotMatch`, 'SignatureDoesNotMatch', 403, () =>
      wrong.send(command));
  }
  const unknown = client('nobody', SECRET_KEY);
  for (const [what, command] of [list, read]) {
    await expectError(`${what} with an unknown access key is InvalidAccessKeyId`, 'InvalidAccessKeyId', 403, () =>
      unknown.send(command));
  }
  await expectError('... and HeadObject 403', null, 403, () =>
    unknown.send(new HeadObjectCommand({ Bucket, Key: 'k' })));
  await expectError('PutObject with Tagging is NotImplemented', 'NotImplemented', 501, () =>
    s3.send(new PutObjectCommand({ Bucket, Key: 'tagged', Body: 'x', Tagging: 'a=b' })));
}

async function readBack(s3) {
  for (const { Bucket, Key, bytes } of kept) {
    const body = await bodyOf(await s3.send(new GetObjectCommand({ Bucket, Key })));
    if (!body.equals(bytes)) throw new CheckFailed(`${Bucket}/${Key} holds ${body.length} other bytes`);
  }
  ok(`every object the areas left reads back whole (${kept.length})`);
}

const AREAS = {
  buckets, put, checksums, get, listing, copyAndDelete, multipart, presign, conditionalPut, errors, readBack,
};

// --- main ---------------------------------------------------------------------

const s3 = client();
const version = sdk('@aws-sdk/client-s3/package.json').version;
console.log(`@aws-sdk/client-s3 ${version}, Node.js ${process.version}, endpoint ${ENDPOINT}`);
const made = [];
const failures = [];
for (const [name, area] of Object.entries(AREAS)) {
  console.log(`== ${name}`);
  lastOk = '';
  warnings.length = 0;
  try {
    const Bucket = `depot-t-${RUN}-${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
    if (area !== readBack) {
      await s3.send(new CreateBucketCommand({ Bucket }));
      made.push(Bucket);
    }
    await area(s3, Bucket);
    if (warnings.length) throw new CheckFailed(`the SDK warned after the last check: ${warnings.join(' | ')}`);
  } catch (e) {
    if (e instanceof CheckFailed) {
      console.log(`  FAIL  ${e.message}`);
      failures.push(`${name}: ${e.message}`);
    } else {
      const after = lastOk ? ` (after the check '${lastOk}')` : '';
      const status = e.$metadata ? `, status ${e.$metadata.httpStatusCode}` : '';
      console.log(`  FAIL  unexpected ${e.name}${after}${status}: ${e.message}`);
      console.log(String(e.stack).split('\n').slice(1, 8).map((l) => `        ${l.trim()}`).join('\n'));
      failures.push(`${name}: unexpected ${e.name}${after}${status}: ${e.message}`);
    }
  }
}
for (const Bucket of made) {
  try {
    await emptyAndDelete(s3, Bucket);
  } catch (e) {
    if (e.name !== 'NoSuchBucket') console.log(`  note  could not remove bucket ${Bucket}: ${e.name}: ${e.message}`);
  }
}
const count = Object.keys(AREAS).length;
if (failures.length) {
  console.log(`\n${failures.length} of ${count} areas failed:`);
  for (const f of failures) console.log(`  ${f}`);
  process.exit(1);
}
console.log(`\nall ${count} areas passed`);
process.exit(0);
