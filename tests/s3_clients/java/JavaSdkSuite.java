// The S3 API as the AWS SDK for Java v2 sees it, in its default configuration.
//
// Environment:
//   S3_ENDPOINT                     http://127.0.0.1:PORT
//   S3_ACCESS_KEY, S3_SECRET_KEY    a user
//
// Compiled by scripts/deps.sh (depot_build_s3_java) against the jars of
// pom.xml, and run by tests/s3_api.rs as
//   java -Xmx512m -cp "$DEPOT_TEST_S3_JAVA/classes:$DEPOT_TEST_S3_JAVA/lib/*" JavaSdkSuite
//
// The expectations are AWS S3's documented behaviour. Clients are built with
// nothing but the endpoint, the region, path-style addressing and static
// credentials, and an interceptor that records what each request sent,
// which changes nothing: S3Client on its default HTTP client (Apache 5),
// S3AsyncClient on its (Netty) with multipartEnabled(true) and without, the
// Transfer Manager on the first, S3Presigner with java.net.http.HttpClient;
// no CRT. The SDK sends a CRC32 with every upload unless told another
// algorithm: over plain HTTP as the trailer of an aws-chunked body, whose
// chunks S3Client signs (STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER) and
// S3AsyncClient does not; with checksumMode ENABLED it checks the body of a
// GetObject against the checksum it gets. What the SDK logs (slf4j-simple,
// warnings and errors, on stderr) fails the check it comes before.
//
// Each area is one method with its own bucket. An area stops at its first
// failed check and the next area runs; the suite prints one line per check
// and exits 1 when any check failed, naming each failure at the end. The
// last area reads back every object the others left; then the buckets go.

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.io.PrintStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Comparator;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Objects;
import java.util.Random;
import java.util.TreeSet;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.zip.CRC32;
import java.util.zip.CRC32C;

import software.amazon.awssdk.auth.credentials.AwsBasicCredentials;
import software.amazon.awssdk.auth.credentials.StaticCredentialsProvider;
import software.amazon.awssdk.awscore.retry.AwsRetryStrategy;
import software.amazon.awssdk.core.ResponseBytes;
import software.amazon.awssdk.core.ResponseInputStream;
import software.amazon.awssdk.core.SdkGlobalTime;
import software.amazon.awssdk.core.async.AsyncRequestBody;
import software.amazon.awssdk.core.async.AsyncResponseTransformer;
import software.amazon.awssdk.core.checksums.RequestChecksumCalculation;
import software.amazon.awssdk.core.checksums.ResponseChecksumValidation;
import software.amazon.awssdk.core.interceptor.Context;
import software.amazon.awssdk.core.interceptor.ExecutionAttributes;
import software.amazon.awssdk.core.interceptor.ExecutionInterceptor;
import software.amazon.awssdk.core.interceptor.SdkExecutionAttribute;
import software.amazon.awssdk.core.sync.RequestBody;
import software.amazon.awssdk.core.util.VersionInfo;
import software.amazon.awssdk.http.SdkHttpRequest;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.services.s3.S3AsyncClient;
import software.amazon.awssdk.services.s3.S3AsyncClientBuilder;
import software.amazon.awssdk.services.s3.S3Client;
import software.amazon.awssdk.services.s3.S3ClientBuilder;
import software.amazon.awssdk.services.s3.S3Configuration;
import software.amazon.awssdk.services.s3.model.Bucket;
import software.amazon.awssdk.services.s3.model.ChecksumAlgorithm;
import software.amazon.awssdk.services.s3.model.ChecksumMode;
import software.amazon.awssdk.services.s3.model.ChecksumType;
import software.amazon.awssdk.services.s3.model.CommonPrefix;
import software.amazon.awssdk.services.s3.model.CompleteMultipartUploadResponse;
import software.amazon.awssdk.services.s3.model.CompletedPart;
import software.amazon.awssdk.services.s3.model.CopyObjectResponse;
import software.amazon.awssdk.services.s3.model.DeleteObjectsResponse;
import software.amazon.awssdk.services.s3.model.DeletedObject;
import software.amazon.awssdk.services.s3.model.EncodingType;
import software.amazon.awssdk.services.s3.model.GetObjectAttributesResponse;
import software.amazon.awssdk.services.s3.model.GetObjectResponse;
import software.amazon.awssdk.services.s3.model.HeadObjectResponse;
import software.amazon.awssdk.services.s3.model.ListObjectsV2Response;
import software.amazon.awssdk.services.s3.model.ListPartsResponse;
import software.amazon.awssdk.services.s3.model.MetadataDirective;
import software.amazon.awssdk.services.s3.model.NoSuchBucketException;
import software.amazon.awssdk.services.s3.model.NoSuchKeyException;
import software.amazon.awssdk.services.s3.model.NoSuchUploadException;
import software.amazon.awssdk.services.s3.model.ObjectAttributes;
import software.amazon.awssdk.services.s3.model.ObjectCannedACL;
import software.amazon.awssdk.services.s3.model.ObjectIdentifier;
import software.amazon.awssdk.services.s3.model.ObjectPart;
import software.amazon.awssdk.services.s3.model.Part;
import software.amazon.awssdk.services.s3.model.PutObjectRequest;
import software.amazon.awssdk.services.s3.model.PutObjectResponse;
import software.amazon.awssdk.services.s3.model.S3Exception;
import software.amazon.awssdk.services.s3.model.S3Object;
import software.amazon.awssdk.services.s3.model.Tag;
import software.amazon.awssdk.services.s3.model.UploadPartResponse;
import software.amazon.awssdk.services.s3.presigner.S3Presigner;
import software.amazon.awssdk.services.s3.presigner.model.PresignedGetObjectRequest;
import software.amazon.awssdk.services.s3.presigner.model.PresignedPutObjectRequest;
import software.amazon.awssdk.services.s3.presigner.model.PresignedUploadPartRequest;
import software.amazon.awssdk.transfer.s3.S3TransferManager;
import software.amazon.awssdk.transfer.s3.model.CompletedCopy;
import software.amazon.awssdk.transfer.s3.model.CompletedDirectoryDownload;
import software.amazon.awssdk.transfer.s3.model.CompletedDirectoryUpload;
import software.amazon.awssdk.transfer.s3.model.CompletedFileDownload;
import software.amazon.awssdk.transfer.s3.model.CompletedFileUpload;
import software.amazon.awssdk.transfer.s3.model.DownloadRequest;
import software.amazon.awssdk.utils.async.SimplePublisher;

public final class JavaSdkSuite {
    static final int MiB = 1024 * 1024;
    /** The part size of the multipart client and the Transfer Manager, and their threshold. */
    static final int PART = 8 * MiB;
    /** Checksums the SDK computes without the CRT, and S3 keeps. */
    static final List<ChecksumAlgorithm> COMPUTED = List.of(
            ChecksumAlgorithm.CRC32, ChecksumAlgorithm.CRC32_C, ChecksumAlgorithm.SHA1, ChecksumAlgorithm.SHA256);
    /** The aws-chunked bodies with a trailer the SDK sends over plain HTTP: signed chunks (S3Client), or not. */
    static final String SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
    static final String UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";
    static final String OTHER_ETAG = "\"0123456789abcdef0123456789abcdef\"";
    /** How long presigned URLs last. */
    static final Duration URL_LIFE = Duration.ofMinutes(10);

    static String endpoint;
    static String accessKey;
    static String secretKey;
    static S3Client s3;
    /** The asynchronous client as the SDK suggests it for uploads of any size: multipartEnabled(true). */
    static S3AsyncClient multipart;
    /** The asynchronous client as it is built by default. */
    static S3AsyncClient async;
    static S3TransferManager tm;
    static S3Presigner presigner;
    static HttpClient http;
    static Path scratch;

    static final Random random = new Random();

    // --- checks ------------------------------------------------------------------

    static final class CheckFailed extends RuntimeException {
        private static final long serialVersionUID = 1L;

        CheckFailed(String message) {
            super(message);
        }
    }

    interface Body {
        void run() throws Exception;
    }

    /** What the SDK logged since the last check. */
    static final ByteArrayOutputStream logged = new ByteArrayOutputStream();

    static String lastOk = "";

    static void ok(String what) {
        String warned;
        synchronized (logged) {
            warned = logged.toString(StandardCharsets.UTF_8).strip();
            logged.reset();
        }
        if (!warned.isEmpty()) {
            throw new CheckFailed(what + ": the SDK logged: " + warned);
        }
        lastOk = what;
        System.out.println("  ok    " + what);
    }

    /** One check: `body` runs to its end (its assertions hold), else the area fails. */
    static void check(String what, Body body) {
        try {
            body.run();
        } catch (CheckFailed e) {
            throw e;
        } catch (AssertionError e) {
            throw new CheckFailed(what + ": " + e.getMessage());
        } catch (Throwable t) {
            throw new CheckFailed(what + ": unexpected " + describe(t));
        }
        ok(what);
    }

    static void expect(boolean condition, String message) {
        if (!condition) {
            throw new AssertionError(message);
        }
    }

    static void eq(String what, Object want, Object got) {
        if (!Objects.equals(want, got)) {
            throw new AssertionError(what + ": expected " + shorten(want) + ", got " + shorten(got));
        }
    }

    /** `body` fails with this S3 error code (null: any) and HTTP status, as an exception of `type`. */
    static <T extends S3Exception> T expectError(Class<T> type, int status, String code, Body body) {
        String want = type.getSimpleName() + " " + (code == null ? "" : code + " ") + "(" + status + ")";
        try {
            body.run();
        } catch (Throwable t) {
            Throwable u = unwrap(t);
            if (type.isInstance(u)) {
                T e = type.cast(u);
                String gotCode = e.awsErrorDetails() == null ? null : e.awsErrorDetails().errorCode();
                if (e.statusCode() == status && (code == null || code.equals(gotCode))) {
                    return e;
                }
            }
            throw new AssertionError("expected " + want + ", got " + describe(u));
        }
        throw new AssertionError("expected " + want + ", but the call succeeded");
    }

    static String describe(Throwable t) {
        t = unwrap(t);
        if (t instanceof S3Exception e) {
            String code = e.awsErrorDetails() == null ? null : e.awsErrorDetails().errorCode();
            return e.getClass().getSimpleName() + " " + code + " (" + e.statusCode() + "): " + e.getMessage();
        }
        String s = t.getClass().getName() + ": " + t.getMessage();
        if (t.getCause() != null && t.getCause() != t) {
            s += " (caused by " + describe(t.getCause()) + ")";
        }
        return s;
    }

    static Throwable unwrap(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
            t = t.getCause();
        }
        return t;
    }

    static String shorten(Object value) {
        String text = String.valueOf(value);
        return text.length() <= 300 ? text : text.substring(0, 300) + "...";
    }

    // --- what was sent -------------------------------------------------------------

    /** The last request of each operation, as signed and sent; and every operation in order. */
    static final Map<String, SdkHttpRequest> sent = new ConcurrentHashMap<>();
    static final List<String> operations = new CopyOnWriteArrayList<>();

    static final ExecutionInterceptor RECORDER = new ExecutionInterceptor() {
        @Override
        public void beforeTransmission(Context.BeforeTransmission context, ExecutionAttributes attributes) {
            String operation = attributes.getAttribute(SdkExecutionAttribute.OPERATION_NAME);
            operations.add(operation);
            sent.put(operation, context.httpRequest());
        }
    };

    /** The values of a header of the last request of `operation`. */
    static List<String> sentHeaders(String operation, String name) {
        SdkHttpRequest request = sent.get(operation);
        expect(request != null, "no " + operation + " was sent");
        return request.matchingHeaders(name);
    }

    /** A header of the last request of `operation`, or null. */
    static String sentHeader(String operation, String name) {
        List<String> values = sentHeaders(operation, name);
        return values.isEmpty() ? null : values.get(0);
    }

    /** The last request of `operation` had an aws-chunked body (`streaming`) with this trailer. */
    static void expectTrailer(String operation, String streaming, String trailer) {
        eq(operation + "'s x-amz-content-sha256", streaming, sentHeader(operation, "x-amz-content-sha256"));
        eq(operation + "'s Content-Encoding", List.of("aws-chunked"), sentHeaders(operation, "Content-Encoding"));
        eq(operation + "'s x-amz-trailer", trailer, sentHeader(operation, "x-amz-trailer"));
    }

    // --- helpers -------------------------------------------------------------------

    static StaticCredentialsProvider credentials(String access, String secret) {
        return StaticCredentialsProvider.create(AwsBasicCredentials.create(access, secret));
    }

    static S3ClientBuilder syncBuilder(String access, String secret) {
        return S3Client.builder()
                .endpointOverride(URI.create(endpoint))
                .region(Region.US_EAST_1)
                .forcePathStyle(true)
                .credentialsProvider(credentials(access, secret))
                .overrideConfiguration(o -> o.addExecutionInterceptor(RECORDER));
    }

    static S3AsyncClientBuilder asyncBuilder() {
        return S3AsyncClient.builder()
                .endpointOverride(URI.create(endpoint))
                .region(Region.US_EAST_1)
                .forcePathStyle(true)
                .credentialsProvider(credentials(accessKey, secretKey))
                .overrideConfiguration(o -> o.addExecutionInterceptor(RECORDER));
    }

    static byte[] randomBytes(int n) {
        byte[] b = new byte[n];
        random.nextBytes(b);
        return b;
    }

    static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    static byte[] concat(byte[]... arrays) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        for (byte[] a : arrays) {
            out.writeBytes(a);
        }
        return out.toByteArray();
    }

    static byte[] slice(byte[] b, int from, int to) {
        return Arrays.copyOfRange(b, from, Math.min(to, b.length));
    }

    /** `b` cut into pieces of `size`. */
    static List<byte[]> pieces(byte[] b, int size) {
        List<byte[]> out = new ArrayList<>();
        for (int off = 0; off < b.length; off += size) {
            out.add(slice(b, off, off + size));
        }
        return out;
    }

    static String hex(byte[] b) {
        return HexFormat.of().formatHex(b);
    }

    static String b64(byte[] b) {
        return Base64.getEncoder().encodeToString(b);
    }

    static byte[] digest(String algorithm, byte[] data) {
        try {
            return MessageDigest.getInstance(algorithm).digest(data);
        } catch (java.security.NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    /** The ETag of a single PUT: the body's hex MD5, quoted. */
    static String etagOf(byte[] data) {
        return "\"" + hex(digest("MD5", data)) + "\"";
    }

    /** The ETag of a completed multipart upload: the MD5 of the parts' MD5s, '-' and their number, quoted. */
    static String multipartEtag(List<byte[]> parts) {
        ByteArrayOutputStream md5s = new ByteArrayOutputStream();
        parts.forEach(p -> md5s.writeBytes(digest("MD5", p)));
        return "\"" + hex(digest("MD5", md5s.toByteArray())) + "-" + parts.size() + "\"";
    }

    static byte[] rawChecksum(ChecksumAlgorithm algorithm, byte[] data) {
        return switch (algorithm) {
            case CRC32 -> {
                CRC32 c = new CRC32();
                c.update(data);
                yield ByteBuffer.allocate(4).putInt((int) c.getValue()).array();
            }
            case CRC32_C -> {
                CRC32C c = new CRC32C();
                c.update(data);
                yield ByteBuffer.allocate(4).putInt((int) c.getValue()).array();
            }
            case CRC64_NVME -> ByteBuffer.allocate(8).putLong(crc64nvme(data)).array();
            case SHA1 -> digest("SHA-1", data);
            case SHA256 -> digest("SHA-256", data);
            case SHA512 -> digest("SHA-512", data);
            default -> throw new IllegalArgumentException(algorithm.toString());
        };
    }

    /** The header of a checksum in `algorithm`. */
    static String checksumHeader(ChecksumAlgorithm algorithm) {
        return "x-amz-checksum-" + algorithm.toString().toLowerCase(Locale.ROOT);
    }

    /** A checksum as S3 sends it: base64. */
    static String checksum(ChecksumAlgorithm algorithm, byte[] data) {
        return b64(rawChecksum(algorithm, data));
    }

    /** The checksum of a multipart upload whose parts have one: the checksum of theirs, '-' and their number. */
    static String composite(ChecksumAlgorithm algorithm, List<byte[]> parts) {
        ByteArrayOutputStream raw = new ByteArrayOutputStream();
        parts.forEach(p -> raw.writeBytes(rawChecksum(algorithm, p)));
        return checksum(algorithm, raw.toByteArray()) + "-" + parts.size();
    }

    static final long[] CRC64_TABLE = new long[256];

    static {
        for (int n = 0; n < 256; n++) {
            long c = n;
            for (int k = 0; k < 8; k++) {
                c = (c & 1) != 0 ? (c >>> 1) ^ 0x9a6c9329ac4bc9b5L : c >>> 1;
            }
            CRC64_TABLE[n] = c;
        }
    }

    /** CRC-64/NVME, which the SDK computes only with the CRT. */
    static long crc64nvme(byte[] data) {
        long c = -1L;
        for (byte b : data) {
            c = CRC64_TABLE[(int) ((c ^ b) & 0xff)] ^ (c >>> 8);
        }
        return ~c;
    }

    /** The checksum in `algorithm` of a PutObject, GetObject or HeadObject answer. */
    static String answered(ChecksumAlgorithm algorithm, Object response) {
        if (response instanceof PutObjectResponse r) {
            return pick(algorithm, r.checksumCRC32(), r.checksumCRC32C(), r.checksumCRC64NVME(), r.checksumSHA1(),
                    r.checksumSHA256());
        } else if (response instanceof GetObjectResponse r) {
            return pick(algorithm, r.checksumCRC32(), r.checksumCRC32C(), r.checksumCRC64NVME(), r.checksumSHA1(),
                    r.checksumSHA256());
        } else if (response instanceof HeadObjectResponse r) {
            return pick(algorithm, r.checksumCRC32(), r.checksumCRC32C(), r.checksumCRC64NVME(), r.checksumSHA1(),
                    r.checksumSHA256());
        }
        throw new IllegalArgumentException(response.getClass().toString());
    }

    static String pick(ChecksumAlgorithm algorithm, String crc32, String crc32c, String crc64, String sha1,
            String sha256) {
        return switch (algorithm) {
            case CRC32 -> crc32;
            case CRC32_C -> crc32c;
            case CRC64_NVME -> crc64;
            case SHA1 -> sha1;
            case SHA256 -> sha256;
            default -> throw new IllegalArgumentException(algorithm.toString());
        };
    }

    static void expectBody(byte[] want, byte[] got) {
        if (!Arrays.equals(want, got)) {
            throw new AssertionError("the body differs: wrote " + want.length + " bytes (SHA-256 "
                    + hex(digest("SHA-256", want)) + "), read " + (got == null ? "none"
                    : got.length + " bytes (SHA-256 " + hex(digest("SHA-256", got)) + ")"));
        }
    }

    static byte[] read(String bucket, String key) {
        return s3.getObjectAsBytes(b -> b.bucket(bucket).key(key)).asByteArray();
    }

    /** GetObject with checksumMode ENABLED: the SDK checks the body against the checksum it gets. */
    static ResponseBytes<GetObjectResponse> getWithChecksum(String bucket, String key) {
        return s3.getObjectAsBytes(b -> b.bucket(bucket).key(key).checksumMode(ChecksumMode.ENABLED));
    }

    static HeadObjectResponse headWithChecksum(String bucket, String key) {
        return s3.headObject(b -> b.bucket(bucket).key(key).checksumMode(ChecksumMode.ENABLED));
    }

    /** PutObject of `data`, its ETag and its Content-Length; then HeadObject and GetObject agree. */
    static void putAndRead(String bucket, String key, byte[] data) {
        PutObjectResponse put = s3.putObject(b -> b.bucket(bucket).key(key), RequestBody.fromBytes(data));
        eq("PutObject's ETag", etagOf(data), put.eTag());
        HeadObjectResponse head = s3.headObject(b -> b.bucket(bucket).key(key));
        eq("HeadObject's Content-Length", (long) data.length, head.contentLength());
        eq("HeadObject's ETag", etagOf(data), head.eTag());
        ResponseBytes<GetObjectResponse> got = s3.getObjectAsBytes(b -> b.bucket(bucket).key(key));
        expectBody(data, got.asByteArray());
        eq("GetObject's ETag", etagOf(data), got.response().eTag());
    }

    /** Objects the areas leave, read back by the last one. */
    record Kept(String bucket, String key, byte[] bytes) {}

    static final List<Kept> kept = new ArrayList<>();

    static void keep(String bucket, String key, byte[] bytes) {
        kept.add(new Kept(bucket, key, bytes));
    }

    /** PutObject through `client` of a body of unknown length, `data` in pieces of `piece` bytes. */
    static PutObjectResponse putFromPublisher(S3AsyncClient client, String bucket, String key, byte[] data,
            int piece) throws Exception {
        SimplePublisher<ByteBuffer> publisher = new SimplePublisher<>();
        AsyncRequestBody body = AsyncRequestBody.fromPublisher(publisher);
        expect(body.contentLength().isEmpty(), "a publisher's body has a known length");
        CompletableFuture<PutObjectResponse> put = client.putObject(b -> b.bucket(bucket).key(key), body);
        CompletableFuture<Void> feeder = CompletableFuture.runAsync(() -> {
            for (int off = 0; off < data.length; off += piece) {
                publisher.send(ByteBuffer.wrap(data, off, Math.min(piece, data.length - off)).slice()).join();
            }
            publisher.complete().join();
        });
        try {
            return put.get(5, TimeUnit.MINUTES);
        } finally {
            if (!feeder.isDone()) {
                publisher.error(new IOException("the upload ended before its body was sent"));
            }
        }
    }

    static HttpResponse<byte[]> send(URI url, String method, byte[] body, Map<String, List<String>> signedHeaders)
            throws Exception {
        HttpRequest.BodyPublisher publisher =
                body == null ? HttpRequest.BodyPublishers.noBody() : HttpRequest.BodyPublishers.ofByteArray(body);
        HttpRequest.Builder request = HttpRequest.newBuilder(url).method(method, publisher);
        signedHeaders.forEach((name, values) -> {
            // java.net.http sets Host itself, and refuses to be given one.
            if (!name.equalsIgnoreCase("host")) {
                values.forEach(v -> request.header(name, v));
            }
        });
        return http.send(request.build(), HttpResponse.BodyHandlers.ofByteArray());
    }

    static String text(HttpResponse<byte[]> response) {
        return shorten(new String(response.body(), StandardCharsets.UTF_8));
    }

    static void emptyAndDelete(String bucket) {
        for (var upload : s3.listMultipartUploadsPaginator(b -> b.bucket(bucket)).uploads()) {
            s3.abortMultipartUpload(b -> b.bucket(bucket).key(upload.key()).uploadId(upload.uploadId()));
        }
        for (ListObjectsV2Response page : s3.listObjectsV2Paginator(b -> b.bucket(bucket))) {
            List<ObjectIdentifier> ids =
                    page.contents().stream().map(o -> ObjectIdentifier.builder().key(o.key()).build()).toList();
            if (!ids.isEmpty()) {
                s3.deleteObjects(b -> b.bucket(bucket).delete(d -> d.quiet(true).objects(ids)));
            }
        }
        s3.deleteBucket(b -> b.bucket(bucket));
    }

    // --- areas ---------------------------------------------------------------------

    static void buckets(String bucket) {
        check("HeadBucket", () -> eq("status", 200,
                s3.headBucket(b -> b.bucket(bucket)).sdkHttpResponse().statusCode()));
        check("ListBuckets names the bucket, with its creation date", () -> {
            Bucket listed = s3.listBuckets().buckets().stream().filter(x -> x.name().equals(bucket)).findFirst()
                    .orElseThrow(() -> new AssertionError("not listed"));
            expect(listed.creationDate() != null
                    && Duration.between(listed.creationDate(), Instant.now()).abs().toMinutes() < 2,
                    "creation date " + listed.creationDate());
        });
        s3.createBucket(b -> b.bucket(bucket + "-2"));
        check("listBucketsPaginator with maxBuckets 1: a page per bucket, ours among them", () -> {
            List<String> names = new ArrayList<>();
            int pages = 0;
            for (var page : s3.listBucketsPaginator(b -> b.maxBuckets(1))) {
                pages++;
                expect(page.buckets().size() <= 1, "a page of " + page.buckets().size());
                page.buckets().forEach(x -> names.add(x.name()));
            }
            expect(names.contains(bucket) && names.contains(bucket + "-2"), "listed " + names);
            eq("pages", names.size(), pages);
            eq("distinct names", names.size(), new TreeSet<>(names).size());
        });
        s3.deleteBucket(b -> b.bucket(bucket + "-2"));
        check("CreateBucket of it again is BucketAlreadyOwnedByYou", () -> expectError(S3Exception.class, 409,
                "BucketAlreadyOwnedByYou", () -> s3.createBucket(b -> b.bucket(bucket))));
        check("GetBucketLocation names no region (us-east-1)", () -> {
            String location = s3.getBucketLocation(b -> b.bucket(bucket)).locationConstraintAsString();
            expect(location == null || location.isEmpty(), "location " + location);
        });
        check("GetBucketVersioning: never enabled", () ->
                eq("status", null, s3.getBucketVersioning(b -> b.bucket(bucket)).status()));
        check("waitUntilBucketExists", () -> expect(s3.waiter().waitUntilBucketExists(b -> b.bucket(bucket))
                .matched().response().isPresent(), "no answer"));

        String missing = bucket + "-missing";
        check("GetObject in a missing bucket is NoSuchBucketException", () -> expectError(NoSuchBucketException.class,
                404, "NoSuchBucket", () -> read(missing, "k")));
        check("PutObject into a missing bucket is NoSuchBucketException", () -> expectError(
                NoSuchBucketException.class, 404, "NoSuchBucket",
                () -> s3.putObject(b -> b.bucket(missing).key("k"), RequestBody.fromString("x"))));
        check("ListObjectsV2 of a missing bucket is NoSuchBucketException", () -> expectError(
                NoSuchBucketException.class, 404, "NoSuchBucket", () -> s3.listObjectsV2(b -> b.bucket(missing))));
        check("HeadBucket of a missing bucket is NoSuchBucketException (404)", () -> expectError(
                NoSuchBucketException.class, 404, null, () -> s3.headBucket(b -> b.bucket(missing))));

        s3.putObject(b -> b.bucket(bucket).key("k"), RequestBody.fromString("x"));
        check("DeleteBucket of a bucket with an object is BucketNotEmpty", () -> expectError(S3Exception.class, 409,
                "BucketNotEmpty", () -> s3.deleteBucket(b -> b.bucket(bucket))));
        s3.deleteObject(b -> b.bucket(bucket).key("k"));
        check("DeleteBucket of the emptied bucket", () -> eq("status", 204,
                s3.deleteBucket(b -> b.bucket(bucket)).sdkHttpResponse().statusCode()));
        check("... and HeadBucket then is NoSuchBucketException", () -> expectError(NoSuchBucketException.class,
                404, null, () -> s3.headBucket(b -> b.bucket(bucket))));
    }

    static void put(String bucket) {
        check("PutObject of a string: the ETag is its MD5, the SDK's default CRC32 is answered", () -> {
            String text = "hello, depot \u00e9\u4e16\n";
            byte[] data = utf8(text);
            sent.clear();
            PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key("string"), RequestBody.fromString(text));
            eq("ETag", etagOf(data), r.eTag());
            eq("CRC32", checksum(ChecksumAlgorithm.CRC32, data), r.checksumCRC32());
            expectTrailer("PutObject", SIGNED_TRAILER, "x-amz-checksum-crc32");
            expectBody(data, read(bucket, "string"));
            keep(bucket, "string", data);
        });
        check("PutObject keeps Content-Type, Cache-Control, Content-Disposition, Content-Language and metadata", () -> {
            Map<String, String> metadata = Map.of("color", "blue", "owner-name", "Zoe");
            byte[] data = utf8("{\"a\":1}");
            s3.putObject(b -> b.bucket(bucket).key("meta.json").contentType("application/json; charset=utf-8")
                    .cacheControl("max-age=60").contentDisposition("attachment; filename=\"m.json\"")
                    .contentLanguage("en").metadata(metadata), RequestBody.fromBytes(data));
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("meta.json"));
            eq("Content-Type", "application/json; charset=utf-8", h.contentType());
            eq("Cache-Control", "max-age=60", h.cacheControl());
            eq("Content-Disposition", "attachment; filename=\"m.json\"", h.contentDisposition());
            eq("Content-Language", "en", h.contentLanguage());
            eq("metadata", metadata, h.metadata());
            eq("Content-Length", (long) data.length, h.contentLength());
            eq("ETag", etagOf(data), h.eTag());
            expect(Duration.between(h.lastModified(), Instant.now()).abs().toMinutes() < 2,
                    "Last-Modified " + h.lastModified());
            GetObjectResponse g = s3.getObjectAsBytes(b -> b.bucket(bucket).key("meta.json")).response();
            eq("GetObject's Content-Type", "application/json; charset=utf-8", g.contentType());
            eq("GetObject's metadata", metadata, g.metadata());
        });
        check("PutObject with Content-Encoding gzip, Expires and ACL private: kept, less the SDK's aws-chunked", () -> {
            byte[] data = randomBytes(4000);
            Instant expires = Instant.parse("2031-01-02T03:04:05Z");
            sent.clear();
            s3.putObject(b -> b.bucket(bucket).key("gz").contentEncoding("gzip").expires(expires)
                    .acl(ObjectCannedACL.PRIVATE), RequestBody.fromBytes(data));
            eq("Content-Encoding sent", List.of("gzip", "aws-chunked"), sentHeaders("PutObject", "Content-Encoding"));
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("gz"));
            eq("Content-Encoding", "gzip", h.contentEncoding());
            eq("Expires", "Thu, 02 Jan 2031 03:04:05 GMT", h.expiresString());
            expectBody(data, read(bucket, "gz"));
        });
        check("Metadata keys come back in lower case", () -> {
            s3.putObject(b -> b.bucket(bucket).key("meta-case").metadata(Map.of("MixedCase", "Value")),
                    RequestBody.fromString("m"));
            eq("metadata", Map.of("mixedcase", "Value"), s3.headObject(b -> b.bucket(bucket).key("meta-case"))
                    .metadata());
        });
        check("Metadata up to 2 KB is taken, more is MetadataTooLarge", () -> {
            s3.putObject(b -> b.bucket(bucket).key("meta-2k").metadata(Map.of("k", "v".repeat(2047))),
                    RequestBody.fromString("m"));
            expectError(S3Exception.class, 400, "MetadataTooLarge", () -> s3.putObject(
                    b -> b.bucket(bucket).key("meta-big").metadata(Map.of("k", "v".repeat(2100))),
                    RequestBody.fromString("m")));
        });
        check("PutObject with non-ASCII metadata is SignatureDoesNotMatch, as on S3 (the SDK signs UTF-8, Apache "
                + "sends ISO-8859-1)", () -> expectError(S3Exception.class, 403, "SignatureDoesNotMatch",
                        () -> s3.putObject(b -> b.bucket(bucket).key("meta-utf8").metadata(Map.of("name", "Zo\u00eb")),
                                RequestBody.fromString("x"))));

        byte[] bytes = randomBytes(100_000);
        check("PutObject RequestBody.fromBytes", () -> putAndRead(bucket, "bytes", bytes));
        keep(bucket, "bytes", bytes);
        check("PutObject RequestBody.fromBytes of no bytes", () -> putAndRead(bucket, "empty", new byte[0]));
        byte[] three = randomBytes(3 * MiB + 17);
        check("PutObject RequestBody.fromFile (3 MiB)", () -> {
            Path file = scratch.resolve("three.bin");
            Files.write(file, three);
            PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key("file"), RequestBody.fromFile(file));
            eq("ETag", etagOf(three), r.eTag());
            expectBody(three, read(bucket, "file"));
            Files.delete(file);
        });
        keep(bucket, "file", three);
        byte[] stream = randomBytes(17 * MiB + 5);
        check("PutObject RequestBody.fromInputStream with its length (17 MiB: many aws-chunked chunks)", () -> {
            PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key("stream"),
                    RequestBody.fromInputStream(new ByteArrayInputStream(stream), stream.length));
            eq("ETag", etagOf(stream), r.eTag());
            try (ResponseInputStream<GetObjectResponse> in = s3.getObject(b -> b.bucket(bucket).key("stream"))) {
                expectBody(stream, in.readAllBytes());
            }
        });
        keep(bucket, "stream", stream);
        byte[] provided = randomBytes(300_000);
        check("PutObject RequestBody.fromContentProvider of unknown length", () -> {
            PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key("provider"), RequestBody.fromContentProvider(
                    () -> new ByteArrayInputStream(provided), "application/octet-stream"));
            eq("ETag", etagOf(provided), r.eTag());
            expectBody(provided, read(bucket, "provider"));
        });
        keep(bucket, "provider", provided);

        String special = "special/sp ace+plus%25pct&amp=eq?q#hash~tilde \u00fc \u4e2d\u6587/ end.txt";
        check("PutObject of a key with spaces, reserved and non-ASCII characters; ListObjectsV2 names it as "
                + "written", () -> {
            putAndRead(bucket, special, utf8("special"));
            eq("listed", List.of(special), s3.listObjectsV2(b -> b.bucket(bucket).prefix("special/"))
                    .contents().stream().map(S3Object::key).toList());
        });
        keep(bucket, special, utf8("special"));
        for (String key : List.of("odd/folder/", "odd/a//b", "/odd-leading-slash", "odd/dots/./x/../y", "odd/..",
                "odd/trailing.")) {
            check("Key " + key + " is stored, listed and deleted as written", () -> {
                putAndRead(bucket, key, key.endsWith("/") ? new byte[0] : utf8(key));
                String prefix = key.substring(0, 4);
                List<String> listed = s3.listObjectsV2(b -> b.bucket(bucket).prefix(prefix)).contents().stream()
                        .map(S3Object::key).toList();
                expect(listed.contains(key), "ListObjectsV2 of prefix " + prefix + " names " + listed);
                s3.deleteObject(b -> b.bucket(bucket).key(key));
                expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key(key)));
            });
        }
    }

    static void checksums(String bucket) {
        byte[] data = randomBytes(200_000);
        for (ChecksumAlgorithm algorithm : COMPUTED) {
            String key = "trailer-" + algorithm;
            String want = checksum(algorithm, data);
            check("PutObject with checksumAlgorithm " + algorithm + ": sent as the trailer of a signed aws-chunked "
                    + "body, answered, and returned by GetObject and HeadObject", () -> {
                sent.clear();
                PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key(key).checksumAlgorithm(algorithm),
                        RequestBody.fromBytes(data));
                expectTrailer("PutObject", SIGNED_TRAILER, checksumHeader(algorithm));
                eq("ETag", etagOf(data), r.eTag());
                eq("PutObject's " + algorithm, want, answered(algorithm, r));
                ResponseBytes<GetObjectResponse> g = getWithChecksum(bucket, key);
                expectBody(data, g.asByteArray());
                eq("GetObject's " + algorithm, want, answered(algorithm, g.response()));
                HeadObjectResponse h = headWithChecksum(bucket, key);
                eq("HeadObject's " + algorithm, want, answered(algorithm, h));
                eq("HeadObject's checksum type", ChecksumType.FULL_OBJECT, h.checksumType());
            });
            keep(bucket, key, data);
        }
        for (ChecksumAlgorithm algorithm : List.of(ChecksumAlgorithm.CRC32, ChecksumAlgorithm.CRC32_C,
                ChecksumAlgorithm.CRC64_NVME, ChecksumAlgorithm.SHA1, ChecksumAlgorithm.SHA256)) {
            String key = "header-" + algorithm;
            String want = checksum(algorithm, data);
            check("PutObject with a precomputed " + algorithm + ": sent as a header, kept", () -> {
                PutObjectRequest.Builder request = PutObjectRequest.builder().bucket(bucket).key(key);
                switch (algorithm) {
                    case CRC32 -> request.checksumCRC32(want);
                    case CRC32_C -> request.checksumCRC32C(want);
                    case CRC64_NVME -> request.checksumCRC64NVME(want);
                    case SHA1 -> request.checksumSHA1(want);
                    case SHA256 -> request.checksumSHA256(want);
                    default -> throw new IllegalStateException();
                }
                sent.clear();
                PutObjectResponse r = s3.putObject(request.build(), RequestBody.fromBytes(data));
                String header = checksumHeader(algorithm);
                eq(header + " sent", want, sentHeader("PutObject", header));
                eq("x-amz-trailer sent", null, sentHeader("PutObject", "x-amz-trailer"));
                eq("PutObject's " + algorithm, want, answered(algorithm, r));
                ResponseBytes<GetObjectResponse> g = getWithChecksum(bucket, key);
                expectBody(data, g.asByteArray());
                eq("GetObject's " + algorithm, want, answered(algorithm, g.response()));
            });
            keep(bucket, key, data);
        }
        check("GetObject without checksumMode (the SDK's default) gets no checksum", () -> {
            sent.clear();
            ResponseBytes<GetObjectResponse> g = s3.getObjectAsBytes(b -> b.bucket(bucket).key("trailer-CRC32"));
            eq("x-amz-checksum-mode sent", null, sentHeader("GetObject", "x-amz-checksum-mode"));
            eq("CRC32", null, g.response().checksumCRC32());
            expectBody(data, g.asByteArray());
        });

        // The SDK computes SHA512 itself; S3 keeps no such checksum, and
        // depot refuses it rather than store it unchecked.
        check("PutObject with checksumAlgorithm SHA512 (a trailer) is NotImplemented, and stores nothing", () -> {
            sent.clear();
            expectError(S3Exception.class, 501, "NotImplemented", () -> s3.putObject(
                    b -> b.bucket(bucket).key("sha512").checksumAlgorithm(ChecksumAlgorithm.SHA512),
                    RequestBody.fromBytes(data)));
            expectTrailer("PutObject", SIGNED_TRAILER, "x-amz-checksum-sha512");
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key("sha512")));
        });
        check("PutObject with a precomputed SHA512 (a header, the right one) is NotImplemented, and stores "
                + "nothing", () -> {
            String sha512 = checksum(ChecksumAlgorithm.SHA512, data);
            sent.clear();
            expectError(S3Exception.class, 501, "NotImplemented", () -> s3.putObject(
                    b -> b.bucket(bucket).key("sha512").checksumSHA512(sha512), RequestBody.fromBytes(data)));
            eq("x-amz-checksum-sha512 sent", sha512, sentHeader("PutObject", "x-amz-checksum-sha512"));
            expectError(NoSuchKeyException.class, 404, null,
                    () -> s3.headObject(b -> b.bucket(bucket).key("sha512")));
        });
        check("PutObject with a wrong precomputed CRC32 is BadDigest, and stores nothing", () -> {
            String wrong = checksum(ChecksumAlgorithm.CRC32, utf8("other bytes"));
            expectError(S3Exception.class, 400, "BadDigest", () -> s3.putObject(
                    b -> b.bucket(bucket).key("bad").checksumCRC32(wrong), RequestBody.fromBytes(data)));
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key("bad")));
        });
        check("PutObject with a wrong Content-MD5 is BadDigest, and stores nothing", () -> {
            String wrong = b64(digest("MD5", utf8("other bytes")));
            expectError(S3Exception.class, 400, "BadDigest", () -> s3.putObject(
                    b -> b.bucket(bucket).key("bad").contentMD5(wrong), RequestBody.fromBytes(data)));
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key("bad")));
        });
        check("PutObject with the right Content-MD5 (and the default CRC32) stores the body", () -> {
            String md5 = b64(digest("MD5", data));
            PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key("md5").contentMD5(md5),
                    RequestBody.fromBytes(data));
            eq("ETag", etagOf(data), r.eTag());
            expectBody(data, read(bucket, "md5"));
        });
        check("A client with requestChecksumCalculation and responseChecksumValidation WHEN_REQUIRED: signed "
                + "aws-chunked without a checksum, none kept", () -> {
            try (S3Client plain = syncBuilder(accessKey, secretKey)
                    .requestChecksumCalculation(RequestChecksumCalculation.WHEN_REQUIRED)
                    .responseChecksumValidation(ResponseChecksumValidation.WHEN_REQUIRED).build()) {
                byte[] body = randomBytes(70_000);
                sent.clear();
                PutObjectResponse r = plain.putObject(b -> b.bucket(bucket).key("when-required"),
                        RequestBody.fromBytes(body));
                eq("x-amz-content-sha256 sent", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
                        sentHeader("PutObject", "x-amz-content-sha256"));
                eq("x-amz-trailer sent", null, sentHeader("PutObject", "x-amz-trailer"));
                eq("ETag", etagOf(body), r.eTag());
                eq("CRC32", null, r.checksumCRC32());
                expectBody(body, plain.getObjectAsBytes(b -> b.bucket(bucket).key("when-required"))
                        .asByteArray());
                HeadObjectResponse h = headWithChecksum(bucket, "when-required");
                eq("HeadObject's CRC32", null, h.checksumCRC32());
            }
        });
    }

    static void get(String bucket) {
        byte[] data = randomBytes(1_000_000);
        int n = data.length;
        s3.putObject(b -> b.bucket(bucket).key("range"), RequestBody.fromBytes(data));
        keep(bucket, "range", data);
        for (int[] range : new int[][] {{0, 9}, {10, 99}, {1000, n - 1}, {n - 100, n - 1}, {500_000, 500_000}}) {
            int from = range[0];
            int to = range[1];
            String header =
                    from == n - 100 ? "bytes=-100" : to == n - 1 ? "bytes=" + from + "-" : "bytes=" + from + "-" + to;
            check("GetObject Range " + header + " with checksumMode ENABLED: 206, those bytes, Content-Range, and "
                    + "not the whole object's CRC32", () -> {
                ResponseBytes<GetObjectResponse> g = s3.getObjectAsBytes(
                        b -> b.bucket(bucket).key("range").range(header).checksumMode(ChecksumMode.ENABLED));
                eq("status", 206, g.response().sdkHttpResponse().statusCode());
                expectBody(slice(data, from, to + 1), g.asByteArray());
                eq("Content-Range", "bytes " + from + "-" + to + "/" + n, g.response().contentRange());
                eq("Content-Length", (long) (to - from + 1), g.response().contentLength());
                eq("CRC32", null, g.response().checksumCRC32());
            });
        }
        check("GetObject Range past the end is InvalidRange (416)", () -> expectError(S3Exception.class, 416,
                "InvalidRange",
                () -> s3.getObjectAsBytes(b -> b.bucket(bucket).key("range").range("bytes=" + n + "-"))));
        check("HeadObject Range: 206 with Content-Range", () -> {
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("range").range("bytes=0-9"));
            eq("status", 206, h.sdkHttpResponse().statusCode());
            eq("Content-Length", 10L, h.contentLength());
            eq("Content-Range", "bytes 0-9/" + n, h.contentRange());
        });

        HeadObjectResponse head = s3.headObject(b -> b.bucket(bucket).key("range"));
        String etag = head.eTag();
        Instant modified = head.lastModified();
        check("GetObject ifNoneMatch(the ETag) is 304", () -> expectError(S3Exception.class, 304, null,
                () -> s3.getObjectAsBytes(b -> b.bucket(bucket).key("range").ifNoneMatch(etag))));
        check("GetObject ifModifiedSince(Last-Modified) and ifModifiedSince(an hour later) are 304", () -> {
            expectError(S3Exception.class, 304, null,
                    () -> s3.getObjectAsBytes(b -> b.bucket(bucket).key("range").ifModifiedSince(modified)));
            expectError(S3Exception.class, 304, null, () -> s3.getObjectAsBytes(
                    b -> b.bucket(bucket).key("range").ifModifiedSince(modified.plusSeconds(3600))));
        });
        check("HeadObject ifNoneMatch(the ETag) is 304", () -> expectError(S3Exception.class, 304, null,
                () -> s3.headObject(b -> b.bucket(bucket).key("range").ifNoneMatch(etag))));
        check("GetObject ifNoneMatch(another ETag) and ifModifiedSince(an hour before) return the object",
                () -> expectBody(data, s3.getObjectAsBytes(b -> b.bucket(bucket).key("range").ifNoneMatch(OTHER_ETAG)
                        .ifModifiedSince(modified.minusSeconds(3600))).asByteArray()));
        check("GetObject ifMatch(the ETag) returns the object", () -> expectBody(data,
                s3.getObjectAsBytes(b -> b.bucket(bucket).key("range").ifMatch(etag)).asByteArray()));
        check("GetObject ifMatch(another ETag) is PreconditionFailed", () -> expectError(S3Exception.class, 412,
                "PreconditionFailed",
                () -> s3.getObjectAsBytes(b -> b.bucket(bucket).key("range").ifMatch(OTHER_ETAG))));
        check("GetObject ifUnmodifiedSince(an hour before) is PreconditionFailed", () -> expectError(
                S3Exception.class, 412, "PreconditionFailed", () -> s3.getObjectAsBytes(
                        b -> b.bucket(bucket).key("range").ifUnmodifiedSince(modified.minusSeconds(3600)))));
        check("GetObject responseContentType, responseCacheControl, responseContentDisposition", () -> {
            GetObjectResponse r = s3.getObjectAsBytes(b -> b.bucket(bucket).key("range")
                    .responseContentType("image/png").responseCacheControl("no-store")
                    .responseContentDisposition("inline")).response();
            eq("Content-Type", "image/png", r.contentType());
            eq("Cache-Control", "no-store", r.cacheControl());
            eq("Content-Disposition", "inline", r.contentDisposition());
        });
        check("GetObjectAttributes: ETag, checksum and size", () -> {
            GetObjectAttributesResponse a = s3.getObjectAttributes(b -> b.bucket(bucket).key("range")
                    .objectAttributes(ObjectAttributes.E_TAG, ObjectAttributes.CHECKSUM, ObjectAttributes.OBJECT_SIZE));
            // S3 answers this ETag without its quotes; depot with them.
            eq("ETag", hex(digest("MD5", data)), a.eTag().replace("\"", ""));
            eq("size", (long) n, a.objectSize());
            eq("CRC32", checksum(ChecksumAlgorithm.CRC32, data), a.checksum().checksumCRC32());
            eq("checksum type", ChecksumType.FULL_OBJECT, a.checksum().checksumType());
            eq("parts", null, a.objectParts());
        });
    }

    static void listing(String bucket) {
        TreeSet<String> keys = new TreeSet<>();
        for (int i = 0; i < 15; i++) {
            keys.add(String.format("list/file-%02d", i));
        }
        for (int i = 0; i < 5; i++) {
            keys.add(String.format("list/dir-a/x-%02d", i));
        }
        keys.addAll(List.of("list/dir-b/y", "list/dir-b/z/deeper", "list/\u00e9"));
        for (String key : keys) {
            s3.putObject(b -> b.bucket(bucket).key(key), RequestBody.fromString(key));
        }
        s3.putObject(b -> b.bucket(bucket).key("listing-not-under-the-prefix"), RequestBody.fromString("x"));
        List<String> all = List.copyOf(keys);

        check("listObjectsV2Paginator with maxKeys 3: pages of 3, every key in UTF-8 order, sizes and ETags", () -> {
            List<String> got = new ArrayList<>();
            int pages = 0;
            for (ListObjectsV2Response page :
                    s3.listObjectsV2Paginator(b -> b.bucket(bucket).prefix("list/").maxKeys(3))) {
                pages++;
                expect(page.keyCount() <= 3 && page.contents().size() == page.keyCount(),
                        "a page of " + page.keyCount() + " keys");
                for (S3Object o : page.contents()) {
                    got.add(o.key());
                    eq("size of " + o.key(), (long) utf8(o.key()).length, o.size());
                    eq("ETag of " + o.key(), etagOf(utf8(o.key())), o.eTag());
                }
            }
            eq("keys", all, got);
            eq("pages", (all.size() + 2) / 3, pages);
        });
        check("listObjectsV2Paginator with delimiter / and maxKeys 2: the keys and the common prefixes", () -> {
            List<String> got = new ArrayList<>();
            List<String> prefixes = new ArrayList<>();
            for (ListObjectsV2Response page : s3.listObjectsV2Paginator(
                    b -> b.bucket(bucket).prefix("list/").delimiter("/").maxKeys(2))) {
                expect(page.keyCount() <= 2, "a page of " + page.keyCount());
                page.contents().forEach(o -> got.add(o.key()));
                page.commonPrefixes().forEach(p -> prefixes.add(p.prefix()));
            }
            eq("keys", all.stream().filter(k -> k.indexOf('/', 5) < 0).toList(), got);
            eq("common prefixes", List.of("list/dir-a/", "list/dir-b/"), prefixes);
        });
        check("ListObjectsV2 startAfter", () -> eq("keys", List.of("list/dir-a/x-03", "list/dir-a/x-04"),
                s3.listObjectsV2(b -> b.bucket(bucket).prefix("list/dir-a/").startAfter("list/dir-a/x-02")).contents()
                        .stream().map(S3Object::key).toList()));
        check("ListObjectsV2 of a prefix nothing has", () -> {
            ListObjectsV2Response r = s3.listObjectsV2(b -> b.bucket(bucket).prefix("nothing/"));
            eq("KeyCount", 0, r.keyCount());
            eq("keys", List.of(), r.contents());
        });
        check("ListObjectsV2 with encodingType URL: the SDK decodes the keys and prefixes back", () -> {
            String key = "enc/a b+c%d&e=f \u00fc/\u00e4.txt";
            s3.putObject(b -> b.bucket(bucket).key(key), RequestBody.fromString("x"));
            ListObjectsV2Response r = s3.listObjectsV2(b -> b.bucket(bucket).prefix("enc/a b+c").delimiter("/")
                    .encodingType(EncodingType.URL));
            eq("common prefixes", List.of("enc/a b+c%d&e=f \u00fc/"),
                    r.commonPrefixes().stream().map(CommonPrefix::prefix).toList());
            eq("keys", List.of(key),
                    s3.listObjectsV2(b -> b.bucket(bucket).prefix("enc/").encodingType(EncodingType.URL)).contents()
                            .stream().map(S3Object::key).toList());
        });
        check("ListObjects (v1) with maxKeys 4, page by page with its marker", () -> {
            List<String> got = new ArrayList<>();
            String marker = null;
            for (int page = 0; page < 50; page++) {
                String after = marker;
                var r = s3.listObjects(b -> b.bucket(bucket).prefix("list/").maxKeys(4).marker(after));
                expect(r.contents().size() <= 4, "a page of " + r.contents().size());
                r.contents().forEach(o -> got.add(o.key()));
                if (!r.isTruncated()) {
                    break;
                }
                marker = r.nextMarker() != null ? r.nextMarker() : got.get(got.size() - 1);
            }
            eq("keys", all, got);
        });
        check("ListObjectsV2 fetchOwner names an owner", () -> {
            List<S3Object> listed = s3.listObjectsV2(b -> b.bucket(bucket).prefix("list/file-00").fetchOwner(true))
                    .contents();
            expect(listed.size() == 1 && listed.get(0).owner() != null && listed.get(0).owner().id() != null
                    && !listed.get(0).owner().id().isEmpty(), "listed " + listed);
        });
    }

    static void copyAndDelete(String bucket) {
        byte[] data = randomBytes(123_456);
        String source = "src \u00fc+.bin";
        s3.putObject(b -> b.bucket(bucket).key(source).contentType("application/x-src").metadata(Map.of("a", "1")),
                RequestBody.fromBytes(data));
        check("CopyObject: the copy's ETag, bytes, Content-Type and metadata (of a key that needs encoding)", () -> {
            CopyObjectResponse c = s3.copyObject(b -> b.sourceBucket(bucket).sourceKey(source)
                    .destinationBucket(bucket).destinationKey("copy"));
            eq("ETag", etagOf(data), c.copyObjectResult().eTag());
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("copy"));
            eq("Content-Type", "application/x-src", h.contentType());
            eq("metadata", Map.of("a", "1"), h.metadata());
            expectBody(data, read(bucket, "copy"));
        });
        keep(bucket, "copy", data);
        check("CopyObject metadataDirective REPLACE: the new Content-Type and metadata", () -> {
            s3.copyObject(b -> b.sourceBucket(bucket).sourceKey(source)
                    .destinationBucket(bucket).destinationKey("replaced").metadataDirective(MetadataDirective.REPLACE)
                    .contentType("text/x-new").metadata(Map.of("b", "2")));
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("replaced"));
            eq("Content-Type", "text/x-new", h.contentType());
            eq("metadata", Map.of("b", "2"), h.metadata());
            expectBody(data, read(bucket, "replaced"));
        });
        String etag = etagOf(data);
        check("CopyObject copySourceIfMatch(another ETag) and copySourceIfNoneMatch(the ETag) are "
                + "PreconditionFailed", () -> {
            expectError(S3Exception.class, 412, "PreconditionFailed", () -> s3.copyObject(
                    b -> b.sourceBucket(bucket).sourceKey(source).destinationBucket(bucket)
                            .destinationKey("conditional").copySourceIfMatch(OTHER_ETAG)));
            expectError(S3Exception.class, 412, "PreconditionFailed", () -> s3.copyObject(
                    b -> b.sourceBucket(bucket).sourceKey(source).destinationBucket(bucket)
                            .destinationKey("conditional").copySourceIfNoneMatch(etag)));
            expectError(NoSuchKeyException.class, 404, null,
                    () -> s3.headObject(b -> b.bucket(bucket).key("conditional")));
        });
        check("CopyObject copySourceIfMatch(the ETag) copies", () -> {
            s3.copyObject(b -> b.sourceBucket(bucket).sourceKey(source).destinationBucket(bucket)
                    .destinationKey("conditional").copySourceIfMatch(etag));
            expectBody(data, read(bucket, "conditional"));
        });
        check("CopyObject with checksumAlgorithm SHA256 answers the bytes' SHA-256, and the copy keeps it", () -> {
            CopyObjectResponse c = s3.copyObject(b -> b.sourceBucket(bucket).sourceKey(source)
                    .destinationBucket(bucket).destinationKey("sha256").checksumAlgorithm(ChecksumAlgorithm.SHA256));
            String want = checksum(ChecksumAlgorithm.SHA256, data);
            eq("CopyObject's SHA256", want, c.copyObjectResult().checksumSHA256());
            HeadObjectResponse h = headWithChecksum(bucket, "sha256");
            eq("HeadObject's SHA256", want, h.checksumSHA256());
            ResponseBytes<GetObjectResponse> g = getWithChecksum(bucket, "sha256");
            eq("GetObject's SHA256", want, g.response().checksumSHA256());
            expectBody(data, g.asByteArray());
        });
        keep(bucket, "sha256", data);
        check("CopyObject keeps the source's CRC32 (the SDK sent one with it)", () -> {
            HeadObjectResponse h = headWithChecksum(bucket, "copy");
            eq("CRC32", checksum(ChecksumAlgorithm.CRC32, data), h.checksumCRC32());
        });
        check("CopyObject of a missing key is NoSuchKeyException", () -> expectError(NoSuchKeyException.class, 404,
                "NoSuchKey", () -> s3.copyObject(b -> b.sourceBucket(bucket).sourceKey("missing")
                        .destinationBucket(bucket).destinationKey("nothing"))));

        check("DeleteObject, and then GetObject is NoSuchKeyException", () -> {
            eq("status", 204, s3.deleteObject(b -> b.bucket(bucket).key("replaced")).sdkHttpResponse().statusCode());
            expectError(NoSuchKeyException.class, 404, "NoSuchKey", () -> read(bucket, "replaced"));
        });
        check("DeleteObject of a missing key is 204 too", () -> eq("status", 204,
                s3.deleteObject(b -> b.bucket(bucket).key("never-was")).sdkHttpResponse().statusCode()));
        check("DeleteObjects names every key deleted, a missing one too, and no errors; the others are left", () -> {
            List<String> keys = List.of("del/a", "del/b b", "del/c+\u00fc");
            for (String k : keys) {
                s3.putObject(b -> b.bucket(bucket).key(k), RequestBody.fromString(k));
            }
            List<String> asked = new ArrayList<>(keys);
            asked.add("del/missing");
            DeleteObjectsResponse r = s3.deleteObjects(b -> b.bucket(bucket).delete(d -> d.objects(
                    asked.stream().map(k -> ObjectIdentifier.builder().key(k).build()).toList())));
            eq("errors", List.of(), r.errors());
            eq("deleted", new TreeSet<>(asked), new TreeSet<>(r.deleted().stream().map(DeletedObject::key).toList()));
            eq("left under del/", List.of(), s3.listObjectsV2(b -> b.bucket(bucket).prefix("del/")).contents());
            expectBody(data, read(bucket, "copy"));
        });
        check("DeleteObjects quiet names nothing, and deletes", () -> {
            s3.putObject(b -> b.bucket(bucket).key("quiet"), RequestBody.fromString("q"));
            DeleteObjectsResponse r = s3.deleteObjects(b -> b.bucket(bucket)
                    .delete(d -> d.quiet(true).objects(ObjectIdentifier.builder().key("quiet").build())));
            eq("deleted", List.of(), r.deleted());
            eq("errors", List.of(), r.errors());
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key("quiet")));
        });
    }

    static void conditionalPut(String bucket) {
        byte[] first = randomBytes(5000);
        check("PutObject ifNoneMatch(*) of a new key stores it", () -> {
            PutObjectResponse r = s3.putObject(b -> b.bucket(bucket).key("once").ifNoneMatch("*"),
                    RequestBody.fromBytes(first));
            eq("ETag", etagOf(first), r.eTag());
        });
        check("PutObject ifNoneMatch(*) onto it is PreconditionFailed, and the object is as it was", () -> {
            expectError(S3Exception.class, 412, "PreconditionFailed", () -> s3.putObject(
                    b -> b.bucket(bucket).key("once").ifNoneMatch("*"), RequestBody.fromBytes(randomBytes(10))));
            expectBody(first, read(bucket, "once"));
        });
        byte[] second = randomBytes(777);
        check("PutObject ifMatch(the ETag) overwrites", () -> {
            s3.putObject(b -> b.bucket(bucket).key("once").ifMatch(etagOf(first)), RequestBody.fromBytes(second));
            expectBody(second, read(bucket, "once"));
        });
        keep(bucket, "once", second);
        check("PutObject ifMatch(the old ETag) is PreconditionFailed", () -> expectError(S3Exception.class, 412,
                "PreconditionFailed", () -> s3.putObject(b -> b.bucket(bucket).key("once").ifMatch(etagOf(first)),
                        RequestBody.fromBytes(randomBytes(10)))));
        check("Asynchronous PutObject ifNoneMatch(*) twice: the second is PreconditionFailed", () -> {
            async.putObject(b -> b.bucket(bucket).key("async-once").ifNoneMatch("*"),
                    AsyncRequestBody.fromString("first")).join();
            expectError(S3Exception.class, 412, "PreconditionFailed", () -> async.putObject(
                    b -> b.bucket(bucket).key("async-once").ifNoneMatch("*"), AsyncRequestBody.fromString("second"))
                    .join());
            expectBody(utf8("first"), read(bucket, "async-once"));
        });
    }

    static void asynchronous(String bucket) {
        byte[] bytes = randomBytes(2_500_000);
        check("Asynchronous PutObject AsyncRequestBody.fromBytes: the SDK's CRC32 as the trailer of an unsigned "
                + "aws-chunked body", () -> {
            sent.clear();
            PutObjectResponse r = async.putObject(b -> b.bucket(bucket).key("bytes"), AsyncRequestBody.fromBytes(bytes))
                    .join();
            expectTrailer("PutObject", UNSIGNED_TRAILER, "x-amz-checksum-crc32");
            eq("ETag", etagOf(bytes), r.eTag());
            eq("CRC32", checksum(ChecksumAlgorithm.CRC32, bytes), r.checksumCRC32());
            expectBody(bytes, read(bucket, "bytes"));
        });
        keep(bucket, "bytes", bytes);
        byte[] data = randomBytes(400_000);
        for (ChecksumAlgorithm algorithm : List.of(ChecksumAlgorithm.SHA256, ChecksumAlgorithm.CRC32_C)) {
            String key = "checksum-" + algorithm;
            check("Asynchronous PutObject with checksumAlgorithm " + algorithm + " (a trailer): answered, kept", () -> {
                sent.clear();
                PutObjectResponse r = async.putObject(b -> b.bucket(bucket).key(key).checksumAlgorithm(algorithm),
                        AsyncRequestBody.fromBytes(data)).join();
                expectTrailer("PutObject", UNSIGNED_TRAILER, checksumHeader(algorithm));
                eq("ETag", etagOf(data), r.eTag());
                eq(algorithm.toString(), checksum(algorithm, data), answered(algorithm, r));
                HeadObjectResponse h = headWithChecksum(bucket, key);
                eq("HeadObject's " + algorithm, checksum(algorithm, data), answered(algorithm, h));
            });
            keep(bucket, key, data);
        }
        check("Asynchronous GetObject (toBytes, checksumMode ENABLED): the body and its CRC32", () -> {
            ResponseBytes<GetObjectResponse> g = async.getObject(
                    b -> b.bucket(bucket).key("bytes").checksumMode(ChecksumMode.ENABLED),
                    AsyncResponseTransformer.toBytes()).join();
            expectBody(bytes, g.asByteArray());
            eq("CRC32", checksum(ChecksumAlgorithm.CRC32, bytes), g.response().checksumCRC32());
        });
        check("Multipart client, GetObject (toBytes): by part number, the body", () -> {
            sent.clear();
            ResponseBytes<GetObjectResponse> g = multipart.getObject(b -> b.bucket(bucket).key("bytes"),
                    AsyncResponseTransformer.toBytes()).join();
            eq("partNumber sent", List.of("1"), sent.get("GetObject").rawQueryParameters().get("partNumber"));
            expectBody(bytes, g.asByteArray());
        });
        byte[] small = randomBytes(MiB + 3);
        check("Multipart client, AsyncRequestBody.fromPublisher of unknown length, 1 MiB: one PutObject", () -> {
            PutObjectResponse r = putFromPublisher(multipart, bucket, "publisher-small", small, 64 * 1024);
            eq("ETag", etagOf(small), r.eTag());
            expectBody(small, read(bucket, "publisher-small"));
        });
        keep(bucket, "publisher-small", small);
        byte[] big = randomBytes(20 * MiB + 11);
        check("Multipart client, AsyncRequestBody.fromPublisher of unknown length, 20 MiB: a multipart upload of "
                + "8 MiB parts", () -> {
            PutObjectResponse r = putFromPublisher(multipart, bucket, "publisher-big", big, MiB);
            eq("ETag", multipartEtag(pieces(big, PART)), r.eTag());
            expectBody(big, getWithChecksum(bucket, "publisher-big").asByteArray());
        });
        keep(bucket, "publisher-big", big);
        check("Asynchronous GetObject of a missing key is NoSuchKeyException, on both clients", () -> {
            for (S3AsyncClient client : List.of(async, multipart)) {
                expectError(NoSuchKeyException.class, 404, "NoSuchKey", () -> client.getObject(
                        b -> b.bucket(bucket).key("missing"), AsyncResponseTransformer.toBytes()).join());
            }
        });
    }

    static void multipartUploads(String bucket) throws Exception {
        byte[] big = randomBytes(3 * PART + 12345);
        List<byte[]> parts = pieces(big, PART);
        Path file = scratch.resolve("big.bin");
        Files.write(file, big);
        check("Multipart client, putObject AsyncRequestBody.fromFile (24 MiB): 8 MiB parts with the SDK's "
                + "CRC32s", () -> {
            PutObjectResponse r = multipart.putObject(b -> b.bucket(bucket).key("async-file")
                    .contentType("video/mp4").metadata(Map.of("k", "v")), AsyncRequestBody.fromFile(file))
                    .join();
            eq("ETag", multipartEtag(parts), r.eTag());
            HeadObjectResponse h = headWithChecksum(bucket, "async-file");
            eq("Content-Type", "video/mp4", h.contentType());
            eq("metadata", Map.of("k", "v"), h.metadata());
            eq("Content-Length", (long) big.length, h.contentLength());
            eq("CRC32", composite(ChecksumAlgorithm.CRC32, parts), h.checksumCRC32());
            eq("checksum type", ChecksumType.COMPOSITE, h.checksumType());
            try (ResponseInputStream<GetObjectResponse> in = s3.getObject(
                    b -> b.bucket(bucket).key("async-file").checksumMode(ChecksumMode.ENABLED))) {
                expectBody(big, in.readAllBytes());
            }
        });
        keep(bucket, "async-file", big);
        check("GetObject Range across two parts (checksumMode ENABLED)", () -> expectBody(
                slice(big, PART - 1000, PART + 1000), s3.getObjectAsBytes(b -> b.bucket(bucket).key("async-file")
                        .range("bytes=" + (PART - 1000) + "-" + (PART + 999)).checksumMode(ChecksumMode.ENABLED))
                        .asByteArray()));
        check("HeadObject partNumber 1: the first part's length, and the number of parts", () -> {
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("async-file").partNumber(1));
            eq("Content-Length", (long) PART, h.contentLength());
            eq("parts", parts.size(), h.partsCount());
        });
        check("GetObject partNumber 2: 206, that part, its Content-Range and the number of parts", () -> {
            ResponseBytes<GetObjectResponse> g =
                    s3.getObjectAsBytes(b -> b.bucket(bucket).key("async-file").partNumber(2));
            eq("status", 206, g.response().sdkHttpResponse().statusCode());
            expectBody(parts.get(1), g.asByteArray());
            eq("parts", parts.size(), g.response().partsCount());
            eq("Content-Range", "bytes " + PART + "-" + (2 * PART - 1) + "/" + big.length, g.response().contentRange());
        });
        check("Multipart client, GetObject (toBytes) of the multipart object: a GetObject per part", () -> {
            operations.clear();
            ResponseBytes<GetObjectResponse> g = multipart.getObject(b -> b.bucket(bucket).key("async-file"),
                    AsyncResponseTransformer.toBytes()).join();
            eq("GetObjects sent", parts.size(), (int) operations.stream().filter("GetObject"::equals).count());
            expectBody(big, g.asByteArray());
        });
        check("GetObjectAttributes of the multipart object: the parts' numbers and sizes, its checksum", () -> {
            GetObjectAttributesResponse a = s3.getObjectAttributes(b -> b.bucket(bucket).key("async-file")
                    .objectAttributes(ObjectAttributes.OBJECT_PARTS, ObjectAttributes.CHECKSUM,
                            ObjectAttributes.E_TAG));
            eq("parts", parts.size(), a.objectParts().totalPartsCount());
            eq("part sizes", parts.stream().map(p -> (long) p.length).toList(),
                    a.objectParts().parts().stream().map(ObjectPart::size).toList());
            eq("CRC32 (without the number of parts)", composite(ChecksumAlgorithm.CRC32, parts).split("-")[0],
                    a.checksum().checksumCRC32());
            eq("ETag", multipartEtag(parts), "\"" + a.eTag().replace("\"", "") + "\"");
        });
        Files.delete(file);

        String key = "by-hand";
        byte[] p1 = randomBytes(5 * MiB);
        byte[] p2 = randomBytes(MiB + 1);
        String id = s3.createMultipartUpload(b -> b.bucket(bucket).key(key).contentType("application/x-hand")
                .metadata(Map.of("by", "hand"))).uploadId();
        UploadPartResponse[] uploaded = new UploadPartResponse[2];
        check("UploadPart of bytes and of an input stream: their ETags and the SDK's CRC32s", () -> {
            uploaded[0] = s3.uploadPart(b -> b.bucket(bucket).key(key).uploadId(id).partNumber(1),
                    RequestBody.fromBytes(p1));
            uploaded[1] = s3.uploadPart(b -> b.bucket(bucket).key(key).uploadId(id).partNumber(2),
                    RequestBody.fromInputStream(new ByteArrayInputStream(p2), p2.length));
            eq("ETags", List.of(etagOf(p1), etagOf(p2)), List.of(uploaded[0].eTag(), uploaded[1].eTag()));
            eq("CRC32s", List.of(checksum(ChecksumAlgorithm.CRC32, p1), checksum(ChecksumAlgorithm.CRC32, p2)),
                    List.of(uploaded[0].checksumCRC32(), uploaded[1].checksumCRC32()));
        });
        check("ListParts: numbers, sizes and ETags", () -> {
            ListPartsResponse lp = s3.listParts(b -> b.bucket(bucket).key(key).uploadId(id));
            eq("numbers", List.of(1, 2), lp.parts().stream().map(Part::partNumber).toList());
            eq("sizes", List.of((long) p1.length, (long) p2.length), lp.parts().stream().map(Part::size).toList());
            eq("ETags", List.of(uploaded[0].eTag(), uploaded[1].eTag()), lp.parts().stream().map(Part::eTag).toList());
        });
        check("ListMultipartUploads lists it", () -> expect(s3.listMultipartUploads(b -> b.bucket(bucket).prefix(key))
                .uploads().stream().anyMatch(u -> u.uploadId().equals(id) && u.key().equals(key)), "not listed"));
        byte[] whole = concat(p1, p2);
        check("CompleteMultipartUpload: the multipart ETag; the object has the parts in order, its Content-Type and "
                + "metadata", () -> {
            CompleteMultipartUploadResponse done = s3.completeMultipartUpload(b -> b.bucket(bucket).key(key)
                    .uploadId(id).multipartUpload(m -> m.parts(
                            CompletedPart.builder().partNumber(1).eTag(uploaded[0].eTag())
                                    .checksumCRC32(uploaded[0].checksumCRC32()).build(),
                            CompletedPart.builder().partNumber(2).eTag(uploaded[1].eTag())
                                    .checksumCRC32(uploaded[1].checksumCRC32()).build())));
            eq("ETag", multipartEtag(List.of(p1, p2)), done.eTag());
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key(key));
            eq("Content-Type", "application/x-hand", h.contentType());
            eq("metadata", Map.of("by", "hand"), h.metadata());
            expectBody(whole, getWithChecksum(bucket, key).asByteArray());
            expect(s3.listMultipartUploads(b -> b.bucket(bucket).prefix(key)).uploads().isEmpty(),
                    "ListMultipartUploads still lists it");
        });
        keep(bucket, key, whole);

        check("Multipart upload with checksumAlgorithm CRC32C: each part's, then the COMPOSITE one of the "
                + "object", () -> {
            String k = "crc32c";
            byte[] a = randomBytes(5 * MiB);
            byte[] b2 = randomBytes(4096);
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key(k)
                    .checksumAlgorithm(ChecksumAlgorithm.CRC32_C)).uploadId();
            List<CompletedPart> done = new ArrayList<>();
            int number = 1;
            for (byte[] body : List.of(a, b2)) {
                int n = number++;
                UploadPartResponse u = s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(n)
                        .checksumAlgorithm(ChecksumAlgorithm.CRC32_C), RequestBody.fromBytes(body));
                eq("part " + n + "'s CRC32C", checksum(ChecksumAlgorithm.CRC32_C, body), u.checksumCRC32C());
                done.add(CompletedPart.builder().partNumber(n).eTag(u.eTag()).checksumCRC32C(u.checksumCRC32C())
                        .build());
            }
            eq("ListParts' CRC32Cs", done.stream().map(CompletedPart::checksumCRC32C).toList(),
                    s3.listParts(b -> b.bucket(bucket).key(k).uploadId(upload)).parts().stream()
                            .map(Part::checksumCRC32C).toList());
            s3.completeMultipartUpload(b -> b.bucket(bucket).key(k).uploadId(upload)
                    .multipartUpload(m -> m.parts(done)));
            HeadObjectResponse h = headWithChecksum(bucket, k);
            eq("CRC32C", composite(ChecksumAlgorithm.CRC32_C, List.of(a, b2)), h.checksumCRC32C());
            eq("checksum type", ChecksumType.COMPOSITE, h.checksumType());
            expectBody(concat(a, b2), getWithChecksum(bucket, k).asByteArray());
        });
        check("Multipart upload with CRC32 FULL_OBJECT: Complete with the object's CRC32 and mpuObjectSize", () -> {
            String k = "full-object";
            byte[] a = randomBytes(5 * MiB);
            byte[] b2 = randomBytes(3333);
            byte[] all = concat(a, b2);
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key(k)
                    .checksumAlgorithm(ChecksumAlgorithm.CRC32).checksumType(ChecksumType.FULL_OBJECT)).uploadId();
            UploadPartResponse u1 = s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(1)
                    .checksumAlgorithm(ChecksumAlgorithm.CRC32), RequestBody.fromBytes(a));
            UploadPartResponse u2 = s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(2)
                    .checksumAlgorithm(ChecksumAlgorithm.CRC32), RequestBody.fromBytes(b2));
            CompleteMultipartUploadResponse done = s3.completeMultipartUpload(b -> b.bucket(bucket).key(k)
                    .uploadId(upload).checksumCRC32(checksum(ChecksumAlgorithm.CRC32, all))
                    .checksumType(ChecksumType.FULL_OBJECT).mpuObjectSize((long) all.length)
                    .multipartUpload(m -> m.parts(
                            CompletedPart.builder().partNumber(1).eTag(u1.eTag()).checksumCRC32(u1.checksumCRC32())
                                    .build(),
                            CompletedPart.builder().partNumber(2).eTag(u2.eTag()).checksumCRC32(u2.checksumCRC32())
                                    .build())));
            eq("CRC32", checksum(ChecksumAlgorithm.CRC32, all), done.checksumCRC32());
            eq("checksum type", ChecksumType.FULL_OBJECT, done.checksumType());
            ResponseBytes<GetObjectResponse> g = getWithChecksum(bucket, k);
            eq("GetObject's CRC32", checksum(ChecksumAlgorithm.CRC32, all), g.response().checksumCRC32());
            expectBody(all, g.asByteArray());
        });
        check("Multipart upload with CRC64NVME, precomputed for each part: the object's CRC64NVME", () -> {
            String k = "crc64nvme";
            byte[] a = randomBytes(5 * MiB);
            byte[] b2 = randomBytes(77);
            byte[] all = concat(a, b2);
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key(k)
                    .checksumAlgorithm(ChecksumAlgorithm.CRC64_NVME)).uploadId();
            UploadPartResponse u1 = s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(1)
                    .checksumCRC64NVME(checksum(ChecksumAlgorithm.CRC64_NVME, a)), RequestBody.fromBytes(a));
            UploadPartResponse u2 = s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(2)
                    .checksumCRC64NVME(checksum(ChecksumAlgorithm.CRC64_NVME, b2)), RequestBody.fromBytes(b2));
            CompleteMultipartUploadResponse done = s3.completeMultipartUpload(b -> b.bucket(bucket).key(k)
                    .uploadId(upload).multipartUpload(m -> m.parts(
                            CompletedPart.builder().partNumber(1).eTag(u1.eTag())
                                    .checksumCRC64NVME(u1.checksumCRC64NVME()).build(),
                            CompletedPart.builder().partNumber(2).eTag(u2.eTag())
                                    .checksumCRC64NVME(u2.checksumCRC64NVME()).build())));
            eq("CRC64NVME", checksum(ChecksumAlgorithm.CRC64_NVME, all), done.checksumCRC64NVME());
            HeadObjectResponse h = headWithChecksum(bucket, k);
            eq("HeadObject's CRC64NVME", checksum(ChecksumAlgorithm.CRC64_NVME, all), h.checksumCRC64NVME());
            expectBody(all, read(bucket, k));
        });
        check("listPartsPaginator with maxParts 1 and listMultipartUploadsPaginator with maxUploads 1", () -> {
            String k = "paged";
            List<String> ids = new ArrayList<>();
            for (int i = 0; i < 3; i++) {
                ids.add(s3.createMultipartUpload(b -> b.bucket(bucket).key(k)).uploadId());
            }
            for (int n = 1; n <= 3; n++) {
                int number = n;
                s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(ids.get(0)).partNumber(number),
                        RequestBody.fromBytes(randomBytes(100 + number)));
            }
            List<Integer> numbers = new ArrayList<>();
            int pages = 0;
            for (ListPartsResponse page : s3.listPartsPaginator(b -> b.bucket(bucket).key(k).uploadId(ids.get(0))
                    .maxParts(1))) {
                pages++;
                page.parts().forEach(p -> numbers.add(p.partNumber()));
            }
            eq("parts", List.of(1, 2, 3), numbers);
            eq("pages of parts", 3, pages);
            List<String> listed = new ArrayList<>();
            s3.listMultipartUploadsPaginator(b -> b.bucket(bucket).prefix(k).maxUploads(1)).uploads()
                    .forEach(u -> listed.add(u.uploadId()));
            eq("uploads", new TreeSet<>(ids), new TreeSet<>(listed));
            eq("uploads listed", ids.size(), listed.size());
            for (String upload : ids) {
                s3.abortMultipartUpload(b -> b.bucket(bucket).key(k).uploadId(upload));
            }
        });
        check("AbortMultipartUpload; then ListParts and UploadPart are NoSuchUploadException", () -> {
            String k = "aborted";
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key(k)).uploadId();
            s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(1),
                    RequestBody.fromBytes(randomBytes(1000)));
            eq("status", 204, s3.abortMultipartUpload(b -> b.bucket(bucket).key(k).uploadId(upload)).sdkHttpResponse()
                    .statusCode());
            expectError(NoSuchUploadException.class, 404, "NoSuchUpload",
                    () -> s3.listParts(b -> b.bucket(bucket).key(k).uploadId(upload)));
            expectError(NoSuchUploadException.class, 404, "NoSuchUpload", () -> s3.uploadPart(
                    b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(2), RequestBody.fromString("x")));
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key(k)));
        });
        check("CompleteMultipartUpload with a part under 5 MiB not last is EntityTooSmall; with a wrong ETag "
                + "InvalidPart", () -> {
            String k = "too-small";
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key(k)).uploadId();
            List<CompletedPart> done = new ArrayList<>();
            for (int n = 1; n <= 2; n++) {
                int number = n;
                String etag = s3.uploadPart(b -> b.bucket(bucket).key(k).uploadId(upload).partNumber(number),
                        RequestBody.fromBytes(randomBytes(1000))).eTag();
                done.add(CompletedPart.builder().partNumber(number).eTag(etag).build());
            }
            expectError(S3Exception.class, 400, "EntityTooSmall", () -> s3.completeMultipartUpload(
                    b -> b.bucket(bucket).key(k).uploadId(upload).multipartUpload(m -> m.parts(done))));
            expectError(S3Exception.class, 400, "InvalidPart", () -> s3.completeMultipartUpload(
                    b -> b.bucket(bucket).key(k).uploadId(upload).multipartUpload(m -> m.parts(
                            CompletedPart.builder().partNumber(1).eTag(OTHER_ETAG).build()))));
            s3.abortMultipartUpload(b -> b.bucket(bucket).key(k).uploadId(upload));
        });
        check("UploadPartCopy of a source range and of a whole object: the ETags, and the object joins them", () -> {
            String k = "part-copy";
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key(k)).uploadId();
            var c1 = s3.uploadPartCopy(b -> b.sourceBucket(bucket).sourceKey("async-file").destinationBucket(bucket)
                    .destinationKey(k).uploadId(upload).partNumber(1).copySourceRange("bytes=0-" + (5 * MiB - 1)));
            var c2 = s3.uploadPartCopy(b -> b.sourceBucket(bucket).sourceKey(key).destinationBucket(bucket)
                    .destinationKey(k).uploadId(upload).partNumber(2));
            byte[] first = slice(big, 0, 5 * MiB);
            eq("ETags", List.of(etagOf(first), etagOf(whole)),
                    List.of(c1.copyPartResult().eTag(), c2.copyPartResult().eTag()));
            s3.completeMultipartUpload(b -> b.bucket(bucket).key(k).uploadId(upload).multipartUpload(m -> m.parts(
                    CompletedPart.builder().partNumber(1).eTag(c1.copyPartResult().eTag()).build(),
                    CompletedPart.builder().partNumber(2).eTag(c2.copyPartResult().eTag()).build())));
            expectBody(concat(first, whole), read(bucket, k));
        });
    }

    static void transferManager(String bucket) throws Exception {
        byte[] big = randomBytes(3 * PART + 12345);
        List<byte[]> parts = pieces(big, PART);
        Path file = scratch.resolve("big.bin");
        Files.write(file, big);
        check("uploadFile (24 MiB) in 8 MiB parts, and downloadFile (by part number)", () -> {
            CompletedFileUpload up = tm.uploadFile(u -> u.source(file)
                    .putObjectRequest(p -> p.bucket(bucket).key("file"))).completionFuture().join();
            eq("ETag", multipartEtag(parts), up.response().eTag());
            Path out = scratch.resolve("download.bin");
            operations.clear();
            CompletedFileDownload down = tm.downloadFile(d -> d.destination(out)
                    .getObjectRequest(g -> g.bucket(bucket).key("file"))).completionFuture().join();
            // The SDK answers the first part's response, as against S3.
            eq("Content-Range", "bytes 0-" + (PART - 1) + "/" + big.length, down.response().contentRange());
            eq("GetObjects", parts.size(), (int) operations.stream().filter("GetObject"::equals).count());
            expectBody(big, Files.readAllBytes(out));
            Files.delete(out);
        });
        keep(bucket, "file", big);
        check("downloadFile of an object of uneven parts (5 MiB and 1 MiB, uploaded by hand)", () -> {
            byte[] a = randomBytes(5 * MiB);
            byte[] b2 = randomBytes(MiB + 7);
            String upload = s3.createMultipartUpload(b -> b.bucket(bucket).key("uneven")).uploadId();
            String e1 = s3.uploadPart(b -> b.bucket(bucket).key("uneven").uploadId(upload).partNumber(1),
                    RequestBody.fromBytes(a)).eTag();
            String e2 = s3.uploadPart(b -> b.bucket(bucket).key("uneven").uploadId(upload).partNumber(2),
                    RequestBody.fromBytes(b2)).eTag();
            s3.completeMultipartUpload(b -> b.bucket(bucket).key("uneven").uploadId(upload)
                    .multipartUpload(m -> m.parts(CompletedPart.builder().partNumber(1).eTag(e1).build(),
                            CompletedPart.builder().partNumber(2).eTag(e2).build())));
            Path out = scratch.resolve("uneven.bin");
            tm.downloadFile(d -> d.destination(out).getObjectRequest(g -> g.bucket(bucket).key("uneven")))
                    .completionFuture().join();
            expectBody(concat(a, b2), Files.readAllBytes(out));
            Files.delete(out);
        });
        check("downloadFile of an object of one PUT", () -> {
            byte[] small = randomBytes(1_000_000);
            s3.putObject(b -> b.bucket(bucket).key("small"), RequestBody.fromBytes(small));
            Path out = scratch.resolve("small.bin");
            tm.downloadFile(d -> d.destination(out).getObjectRequest(g -> g.bucket(bucket).key("small")))
                    .completionFuture().join();
            expectBody(small, Files.readAllBytes(out));
            Files.delete(out);
        });
        check("download toBytes of the multipart object", () -> expectBody(big, tm.download(DownloadRequest.builder()
                .getObjectRequest(g -> g.bucket(bucket).key("file"))
                .responseTransformer(AsyncResponseTransformer.toBytes()).build())
                .completionFuture().join().result().asByteArray()));
        check("uploadFile with checksumAlgorithm SHA256: the COMPOSITE SHA256 of the parts'", () -> {
            tm.uploadFile(u -> u.source(file).putObjectRequest(
                    p -> p.bucket(bucket).key("sha256").checksumAlgorithm(ChecksumAlgorithm.SHA256)))
                    .completionFuture().join();
            HeadObjectResponse h = headWithChecksum(bucket, "sha256");
            eq("SHA256", composite(ChecksumAlgorithm.SHA256, parts), h.checksumSHA256());
            eq("checksum type", ChecksumType.COMPOSITE, h.checksumType());
            expectBody(big, getWithChecksum(bucket, "sha256").asByteArray());
        });
        check("copy of the multipart object: UploadPartCopy in 8 MiB parts", () -> {
            operations.clear();
            CompletedCopy copy = tm.copy(c -> c.copyObjectRequest(r -> r.sourceBucket(bucket).sourceKey("file")
                    .destinationBucket(bucket).destinationKey("copy"))).completionFuture().join();
            eq("UploadPartCopies", parts.size(), (int) operations.stream().filter("UploadPartCopy"::equals).count());
            eq("ETag", multipartEtag(parts), copy.response().copyObjectResult().eTag());
            expectBody(big, read(bucket, "copy"));
        });
        keep(bucket, "copy", big);
        Files.delete(file);
        check("uploadDirectory and downloadDirectory", () -> {
            Path dir = scratch.resolve("up");
            Map<String, byte[]> files = new LinkedHashMap<>();
            files.put("a.txt", randomBytes(10));
            files.put("sub/b.bin", randomBytes(100_000));
            files.put("sub/deeper/c d.bin", randomBytes(1000));
            for (var e : files.entrySet()) {
                Path p = dir.resolve(e.getKey());
                Files.createDirectories(p.getParent());
                Files.write(p, e.getValue());
            }
            CompletedDirectoryUpload up = tm.uploadDirectory(r -> r.source(dir).bucket(bucket).s3Prefix("dir"))
                    .completionFuture().join();
            eq("failed uploads", List.of(), up.failedTransfers());
            eq("keys", files.keySet().stream().map(k -> "dir/" + k).sorted().toList(),
                    s3.listObjectsV2(b -> b.bucket(bucket).prefix("dir/")).contents().stream().map(S3Object::key)
                            .toList());
            Path out = scratch.resolve("down");
            CompletedDirectoryDownload down = tm.downloadDirectory(r -> r.destination(out).bucket(bucket)
                    .listObjectsV2RequestTransformer(l -> l.prefix("dir/"))).completionFuture().join();
            eq("failed downloads", List.of(), down.failedTransfers());
            for (var e : files.entrySet()) {
                expectBody(e.getValue(), Files.readAllBytes(out.resolve(e.getKey())));
            }
        });
    }

    static void presign(String bucket) throws Exception {
        byte[] data = randomBytes(200_000);
        s3.putObject(b -> b.bucket(bucket).key("get"), RequestBody.fromBytes(data));
        keep(bucket, "get", data);
        PresignedGetObjectRequest getUrl = presigner.presignGetObject(r -> r.signatureDuration(URL_LIFE)
                .getObjectRequest(g -> g.bucket(bucket).key("get")));
        check("A presigned GET URL works through java.net.http", () -> {
            HttpResponse<byte[]> r = send(getUrl.url().toURI(), "GET", null, getUrl.signedHeaders());
            eq("status", 200, r.statusCode());
            expectBody(data, r.body());
        });
        check("... with a Range too", () -> {
            HttpResponse<byte[]> r = send(getUrl.url().toURI(), "GET", null, Map.of("Range", List.of("bytes=0-3")));
            eq("status", 206, r.statusCode());
            expectBody(slice(data, 0, 4), r.body());
        });
        check("... and with a changed signature it is SignatureDoesNotMatch", () -> {
            String url = getUrl.url().toString();
            int at = url.indexOf("X-Amz-Signature=") + "X-Amz-Signature=".length();
            String changed = url.substring(0, at) + (url.charAt(at) == '0' ? '1' : '0') + url.substring(at + 1);
            HttpResponse<byte[]> r = send(URI.create(changed), "GET", null, Map.of());
            eq("status", 403, r.statusCode());
            expect(text(r).contains("<Code>SignatureDoesNotMatch</Code>"), "answered " + text(r));
        });
        String special = "sp ace+plus%25pct&amp=eq?q#hash~tilde \u00fc \u4e2d\u6587/ end.txt";
        check("A presigned GET URL of a key with spaces, reserved and non-ASCII characters", () -> {
            s3.putObject(b -> b.bucket(bucket).key(special), RequestBody.fromString("special"));
            PresignedGetObjectRequest p = presigner.presignGetObject(r -> r.signatureDuration(URL_LIFE)
                    .getObjectRequest(g -> g.bucket(bucket).key(special)));
            HttpResponse<byte[]> r = send(p.url().toURI(), "GET", null, p.signedHeaders());
            eq("status", 200, r.statusCode());
            expectBody(utf8("special"), r.body());
        });

        // A browser's multipart upload: the server signs a URL per part.
        String key = "parts";
        String id = s3.createMultipartUpload(b -> b.bucket(bucket).key(key)).uploadId();
        List<byte[]> bodies = List.of(randomBytes(5 * MiB), randomBytes(1234));
        List<CompletedPart> done = new ArrayList<>();
        for (int i = 0; i < bodies.size(); i++) {
            int number = i + 1;
            byte[] body = bodies.get(i);
            check("A presigned UploadPart URL works through java.net.http (part " + number + ")", () -> {
                PresignedUploadPartRequest p = presigner.presignUploadPart(r -> r.signatureDuration(URL_LIFE)
                        .uploadPartRequest(u -> u.bucket(bucket).key(key).uploadId(id).partNumber(number)));
                HttpResponse<byte[]> r = send(p.url().toURI(), "PUT", body, p.signedHeaders());
                eq("status (" + text(r) + ")", 200, r.statusCode());
                String etag = r.headers().firstValue("etag").orElse(null);
                eq("ETag", etagOf(body), etag);
                done.add(CompletedPart.builder().partNumber(number).eTag(etag).build());
            });
        }
        byte[] whole = concat(bodies.get(0), bodies.get(1));
        check("... and CompleteMultipartUpload joins the parts", () -> {
            CompleteMultipartUploadResponse r = s3.completeMultipartUpload(b -> b.bucket(bucket).key(key).uploadId(id)
                    .multipartUpload(m -> m.parts(done)));
            eq("ETag", multipartEtag(bodies), r.eTag());
            expectBody(whole, read(bucket, key));
        });
        keep(bucket, key, whole);

        byte[] typed = randomBytes(250_000);
        check("A presigned PUT URL with a Content-Type and metadata works through java.net.http, and stores "
                + "them", () -> {
            PresignedPutObjectRequest p = presigner.presignPutObject(r -> r.signatureDuration(URL_LIFE)
                    .putObjectRequest(x -> x.bucket(bucket).key("typed").contentType("image/png")
                            .metadata(Map.of("from", "presigner"))));
            HttpResponse<byte[]> r = send(p.url().toURI(), "PUT", typed, p.signedHeaders());
            eq("status (" + text(r) + ")", 200, r.statusCode());
            eq("ETag", etagOf(typed), r.headers().firstValue("etag").orElse(null));
            HeadObjectResponse h = s3.headObject(b -> b.bucket(bucket).key("typed"));
            eq("Content-Type", "image/png", h.contentType());
            eq("metadata", Map.of("from", "presigner"), h.metadata());
            expectBody(typed, read(bucket, "typed"));
        });
        keep(bucket, "typed", typed);
        byte[] plain = randomBytes(123_456);
        check("A presigned PUT URL (SDK default: no checksum in it) stores the bytes, and no checksum", () -> {
            PresignedPutObjectRequest p = presigner.presignPutObject(r -> r.signatureDuration(URL_LIFE)
                    .putObjectRequest(x -> x.bucket(bucket).key("plain")));
            expect(!p.url().getQuery().contains("x-amz-checksum") && !p.url().getQuery().contains("x-amz-sdk-checksum"),
                    "the URL carries a checksum: " + p.url());
            HttpResponse<byte[]> r = send(p.url().toURI(), "PUT", plain, p.signedHeaders());
            eq("status (" + text(r) + ")", 200, r.statusCode());
            expectBody(plain, read(bucket, "plain"));
            eq("CRC32", null, headWithChecksum(bucket, "plain")
                    .checksumCRC32());
        });
        keep(bucket, "plain", plain);
        byte[] summed = randomBytes(50_000);
        check("A presigned PUT URL with a precomputed CRC32 (a signed header): the right one is kept", () -> {
            String crc = checksum(ChecksumAlgorithm.CRC32, summed);
            PresignedPutObjectRequest p = presigner.presignPutObject(r -> r.signatureDuration(URL_LIFE)
                    .putObjectRequest(x -> x.bucket(bucket).key("summed").checksumCRC32(crc)));
            eq("signed x-amz-checksum-crc32", List.of(crc), p.signedHeaders().get("x-amz-checksum-crc32"));
            HttpResponse<byte[]> r = send(p.url().toURI(), "PUT", summed, p.signedHeaders());
            eq("status (" + text(r) + ")", 200, r.statusCode());
            eq("CRC32", crc, headWithChecksum(bucket, "summed")
                    .checksumCRC32());
            expectBody(summed, read(bucket, "summed"));
        });
        keep(bucket, "summed", summed);
        check("... and a wrong one is BadDigest, and stores nothing", () -> {
            String crc = checksum(ChecksumAlgorithm.CRC32, utf8("other bytes"));
            PresignedPutObjectRequest p = presigner.presignPutObject(r -> r.signatureDuration(URL_LIFE)
                    .putObjectRequest(x -> x.bucket(bucket).key("bad-sum").checksumCRC32(crc)));
            HttpResponse<byte[]> r = send(p.url().toURI(), "PUT", summed, p.signedHeaders());
            eq("status", 400, r.statusCode());
            expect(text(r).contains("<Code>BadDigest</Code>"), "answered " + text(r));
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key("bad-sum")));
        });
    }

    static void errors(String bucket) {
        byte[] data = randomBytes(100_000);
        s3.putObject(b -> b.bucket(bucket).key("k"), RequestBody.fromBytes(data));
        check("GetObject of a missing key is NoSuchKeyException, with a request ID", () -> {
            NoSuchKeyException e =
                    expectError(NoSuchKeyException.class, 404, "NoSuchKey", () -> read(bucket, "missing"));
            expect(e.requestId() != null && !e.requestId().isEmpty(), "no request ID");
        });
        check("HeadObject of a missing key is NoSuchKeyException (404)", () -> expectError(NoSuchKeyException.class,
                404, null, () -> s3.headObject(b -> b.bucket(bucket).key("missing"))));
        try (S3Client wrong = syncBuilder(accessKey, secretKey + "x").build()) {
            check("ListBuckets, GetObject, HeadObject, PutObject with a wrong secret are SignatureDoesNotMatch", () -> {
                expectError(S3Exception.class, 403, "SignatureDoesNotMatch", wrong::listBuckets);
                expectError(S3Exception.class, 403, "SignatureDoesNotMatch",
                        () -> wrong.getObjectAsBytes(b -> b.bucket(bucket).key("k")));
                expectError(S3Exception.class, 403, null, () -> wrong.headObject(b -> b.bucket(bucket).key("k")));
                expectError(S3Exception.class, 403, "SignatureDoesNotMatch", () -> wrong.putObject(
                        b -> b.bucket(bucket).key("k2"), RequestBody.fromBytes(randomBytes(300_000))));
            });
        }
        try (S3Client unknown = syncBuilder("nobody", secretKey).build()) {
            check("ListBuckets and GetObject with an unknown access key are InvalidAccessKeyId", () -> {
                expectError(S3Exception.class, 403, "InvalidAccessKeyId", unknown::listBuckets);
                expectError(S3Exception.class, 403, "InvalidAccessKeyId",
                        () -> unknown.getObjectAsBytes(b -> b.bucket(bucket).key("k")));
            });
        }
        check("Refused 5 MiB PUTs (a missing bucket, a failed condition, a wrong secret) leave the clients' "
                + "connections usable", () -> {
            byte[] body = randomBytes(5 * MiB);
            for (int i = 0; i < 3; i++) {
                expectError(NoSuchBucketException.class, 404, null, () -> s3.putObject(
                        b -> b.bucket(bucket + "-missing").key("k"), RequestBody.fromBytes(body)));
                expectError(S3Exception.class, 412, "PreconditionFailed", () -> s3.putObject(
                        b -> b.bucket(bucket).key("k").ifNoneMatch("*"), RequestBody.fromBytes(body)));
                expectBody(data, read(bucket, "k"));
                expectError(NoSuchBucketException.class, 404, null, () -> async.putObject(
                        b -> b.bucket(bucket + "-missing").key("k"), AsyncRequestBody.fromBytes(body)).join());
                expectBody(data, async.getObject(b -> b.bucket(bucket).key("k"),
                        AsyncResponseTransformer.toBytes()).join().asByteArray());
            }
            try (S3Client wrong = syncBuilder(accessKey, secretKey + "x").build()) {
                for (int i = 0; i < 3; i++) {
                    expectError(S3Exception.class, 403, "SignatureDoesNotMatch", () -> wrong.putObject(
                            b -> b.bucket(bucket).key("k"), RequestBody.fromBytes(body)));
                }
            }
            expectBody(data, read(bucket, "k"));
        });
        keep(bucket, "k", data);
        check("PutObjectTagging is NotImplemented", () -> expectError(S3Exception.class, 501, "NotImplemented",
                () -> s3.putObjectTagging(b -> b.bucket(bucket).key("k")
                        .tagging(t -> t.tagSet(Tag.builder().key("a").value("b").build())))));
        check("PutObject with tagging is NotImplemented, and stores nothing", () -> {
            expectError(S3Exception.class, 501, "NotImplemented", () -> s3.putObject(
                    b -> b.bucket(bucket).key("tagged").tagging("a=b"), RequestBody.fromString("x")));
            expectError(NoSuchKeyException.class, 404, null, () -> s3.headObject(b -> b.bucket(bucket).key("tagged")));
        });
        check("waitUntilObjectExists and waitUntilObjectNotExists", () -> {
            s3.putObject(b -> b.bucket(bucket).key("waited"), RequestBody.fromString("w"));
            expect(s3.waiter().waitUntilObjectExists(b -> b.bucket(bucket).key("waited")).matched().response()
                    .isPresent(), "not found");
            s3.deleteObject(b -> b.bucket(bucket).key("waited"));
            expect(s3.waiter().waitUntilObjectNotExists(b -> b.bucket(bucket).key("waited")).matched().exception()
                    .isPresent(), "still there");
        });
        check("A clock 30 minutes behind is RequestTimeTooSkewed; the SDK then corrects its clock and retries", () -> {
            try {
                SdkGlobalTime.setGlobalTimeOffset(1800);
                try (S3Client once = syncBuilder(accessKey, secretKey)
                        .overrideConfiguration(o -> o.retryStrategy(AwsRetryStrategy.doNotRetry())).build()) {
                    expectError(S3Exception.class, 403, "RequestTimeTooSkewed", () -> once.putObject(
                            b -> b.bucket(bucket).key("skewed"), RequestBody.fromString("skewed")));
                }
                SdkGlobalTime.setGlobalTimeOffset(1800);
                try (S3Client skewed = syncBuilder(accessKey, secretKey).build()) {
                    operations.clear();
                    skewed.putObject(b -> b.bucket(bucket).key("skewed"), RequestBody.fromString("skewed"));
                    eq("PutObjects sent", 2, (int) operations.stream().filter("PutObject"::equals).count());
                    expect(Math.abs(SdkGlobalTime.getGlobalTimeOffset()) < 60,
                            "the SDK's clock is " + SdkGlobalTime.getGlobalTimeOffset() + " s off");
                    eq("body", "skewed", skewed.getObjectAsBytes(b -> b.bucket(bucket).key("skewed")).asUtf8String());
                }
            } finally {
                SdkGlobalTime.setGlobalTimeOffset(0);
            }
        });
    }

    static void readBack(String unused) {
        for (Kept k : kept) {
            byte[] got = read(k.bucket(), k.key());
            if (!Arrays.equals(k.bytes(), got)) {
                throw new CheckFailed(k.bucket() + "/" + k.key() + " holds " + got.length + " other bytes");
            }
        }
        ok("every object the areas left reads back whole (" + kept.size() + ")");
    }

    // --- main ----------------------------------------------------------------------

    interface Area {
        void run(String bucket) throws Exception;
    }

    static String env(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            throw new IllegalStateException(name + " is not set");
        }
        return v;
    }

    public static void main(String[] args) throws Exception {
        // What the SDK logs (slf4j-simple writes to System.err as it is when
        // it writes), kept for the next check to fail on.
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        PrintStream stderr = System.err;
        System.setErr(new PrintStream(new OutputStream() {
            @Override
            public void write(int b) {
                synchronized (logged) {
                    logged.write(b);
                }
            }

            @Override
            public void write(byte[] b, int off, int len) {
                synchronized (logged) {
                    logged.write(b, off, len);
                }
            }
        }, true, StandardCharsets.UTF_8));

        endpoint = env("S3_ENDPOINT").replaceAll("/$", "");
        accessKey = env("S3_ACCESS_KEY");
        secretKey = env("S3_SECRET_KEY");
        s3 = syncBuilder(accessKey, secretKey).build();
        multipart = asyncBuilder().multipartEnabled(true).build();
        async = asyncBuilder().build();
        tm = S3TransferManager.builder().s3Client(multipart).build();
        presigner = S3Presigner.builder()
                .endpointOverride(URI.create(endpoint))
                .region(Region.US_EAST_1)
                .credentialsProvider(credentials(accessKey, secretKey))
                .serviceConfiguration(S3Configuration.builder().pathStyleAccessEnabled(true).build())
                .build();
        http = HttpClient.newHttpClient();
        scratch = Files.createTempDirectory("java-sdk-suite");

        Map<String, Area> areas = new LinkedHashMap<>();
        areas.put("buckets", JavaSdkSuite::buckets);
        areas.put("put", JavaSdkSuite::put);
        areas.put("checksums", JavaSdkSuite::checksums);
        areas.put("get", JavaSdkSuite::get);
        areas.put("listing", JavaSdkSuite::listing);
        areas.put("copyAndDelete", JavaSdkSuite::copyAndDelete);
        areas.put("conditionalPut", JavaSdkSuite::conditionalPut);
        areas.put("asynchronous", JavaSdkSuite::asynchronous);
        areas.put("multipartUploads", JavaSdkSuite::multipartUploads);
        areas.put("transferManager", JavaSdkSuite::transferManager);
        areas.put("presign", JavaSdkSuite::presign);
        areas.put("errors", JavaSdkSuite::errors);
        areas.put("readBack", JavaSdkSuite::readBack);

        String run = hex(randomBytes(3));
        System.out.println("AWS SDK for Java " + VersionInfo.SDK_VERSION + ", Java " + Runtime.version()
                + ", endpoint " + endpoint);
        List<String> made = new ArrayList<>();
        List<String> failures = new ArrayList<>();
        for (var area : areas.entrySet()) {
            String name = area.getKey();
            System.out.println("== " + name);
            lastOk = "";
            synchronized (logged) {
                logged.reset();
            }
            String bucket = "depot-t-" + run + "-" + name.replaceAll("([A-Z])", "-$1").toLowerCase(Locale.ROOT);
            try {
                if (!name.equals("readBack")) {
                    s3.createBucket(b -> b.bucket(bucket));
                    made.add(bucket);
                }
                area.getValue().run(bucket);
                String warned = logged.toString(StandardCharsets.UTF_8).strip();
                if (!warned.isEmpty()) {
                    throw new CheckFailed("the SDK logged after the last check: " + warned);
                }
            } catch (CheckFailed e) {
                System.out.println("  FAIL  " + e.getMessage());
                failures.add(name + ": " + e.getMessage());
            } catch (Throwable t) {
                String after = lastOk.isEmpty() ? "" : " (after the check '" + lastOk + "')";
                System.out.println("  FAIL  unexpected " + describe(t) + after);
                Arrays.stream(unwrap(t).getStackTrace()).limit(8).forEach(f -> System.out.println("        " + f));
                failures.add(name + ": unexpected " + describe(t) + after);
            }
        }
        for (String bucket : made) {
            try {
                emptyAndDelete(bucket);
            } catch (NoSuchBucketException e) {
                // The buckets area deletes its own.
            } catch (Exception e) {
                System.out.println("  note  could not remove bucket " + bucket + ": " + describe(e));
            }
        }
        tm.close();
        multipart.close();
        async.close();
        s3.close();
        presigner.close();
        try (var walk = Files.walk(scratch)) {
            for (Path p : walk.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(p);
            }
        }
        String warned = logged.toString(StandardCharsets.UTF_8).strip();
        if (!warned.isEmpty()) {
            stderr.println(warned);
        }
        if (!failures.isEmpty()) {
            System.out.println("\n" + failures.size() + " of " + areas.size() + " areas failed:");
            failures.forEach(f -> System.out.println("  " + f));
            System.exit(1);
        }
        System.out.println("\nall " + areas.size() + " areas passed");
        System.exit(0);
    }
}
