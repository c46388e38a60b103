//! `s3`: blobs as objects in an S3 bucket (AWS, or any server speaking its
//! API), so that depot nodes can share one store of bytes that someone else
//! keeps durable.
//!
//! Layout: a blob is the object whose key is its lowercase SHA-256 hex, at
//! the bucket's root. [`list`](BlobEngine::list) reports those keys only;
//! anything else in the bucket is left alone. Uploads in progress live under
//! `tmp/`.
//!
//! Writing: the digest is known only at [`finish`](BlobWriter::finish).
//! A blob of at most one part ([`DEFAULT_PART`]) is buffered in memory and
//! stored with one PUT under its key. A larger one streams as a multipart
//! upload to a staging key `tmp/<random>`, with at most [`PARTS_IN_FLIGHT`]
//! parts uploading while the next one fills; at `finish` the upload is
//! completed, copied to its key inside the server, and the staging object
//! deleted. Parts are at least [`MIN_PART`] (S3 refuses smaller ones but
//! the last).
//!
//! A blob stored already is not written again: `finish` first copies the
//! key onto itself (`x-amz-metadata-directive: REPLACE`, a request with no
//! body), which refreshes the object's last-modified time, so the garbage
//! collector of any node sees it as freshly written for its grace period
//! (without this, a node could collect an old orphan another node had just
//! found stored and is about to reference). Only if that copy finds no
//! object is the blob written; a multipart upload is then aborted instead.
//! Two nodes writing the same new content at once both write it, with the
//! same bytes: one object remains.
//!
//! Limits: a blob is at most [`MAX_BLOB`] (5 GiB), the largest object S3's
//! single CopyObject (and self-copy) accepts; larger copies need
//! UploadPartCopy, which `object_store` does not offer. Writes beyond it
//! fail as soon as the limit is crossed.
//!
//! Abandoned writes: `abort`, or dropping a writer (through a spawned task),
//! aborts its multipart upload or deletes its staging object. A crash can
//! leave a staging object (between completing an upload and deleting it);
//! [`S3Engine::connect`] deletes those older than [`STALE_AFTER`], since
//! other nodes may be finishing theirs right now. A crash can also leave a
//! multipart upload never completed: its parts are invisible to listing and
//! to this engine, and still billed; a bucket lifecycle rule
//! (`AbortIncompleteMultipartUpload`, e.g. after one day) removes them.
//!
//! Reading a range is one ranged GET of exactly that range, streamed as the
//! server sends it.
//!
//! Failures: every request is retried by `object_store` on connection errors,
//! timeouts and 5xx answers, at most [`MAX_RETRIES`] times within
//! [`RETRY_TIMEOUT`]; what still fails that way is
//! [`EngineError::Unavailable`] (503 to clients), so a store that is down
//! fails requests within seconds.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey, AwsAuthorizer};
use object_store::client::{HttpError, HttpErrorKind, HttpRequestBody};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, MultipartUpload, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig,
};
use tokio::task::JoinSet;

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result, S3Config};

const NAME: &str = "s3";

/// Bytes per multipart part, and the largest blob stored with a single PUT.
pub const DEFAULT_PART: usize = 8 * 1024 * 1024;
/// S3's smallest part (but the last).
pub const MIN_PART: usize = 5 * 1024 * 1024;
/// Parts of one upload sent at the same time; a writer holds at most these
/// and the part it is filling.
pub const PARTS_IN_FLIGHT: usize = 2;
/// The largest blob: S3's limit for one CopyObject.
pub const MAX_BLOB: u64 = 5 * 1024 * 1024 * 1024;
/// Age after which a staging object is taken for left by a crash. Long,
/// because S3 dates an object made by a multipart upload from the upload's
/// start, and a slow upload of gigabytes can take hours.
pub const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Retries of a request that failed on the network or with a 5xx.
pub const MAX_RETRIES: usize = 3;
/// No retry starts later than this after the first attempt.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a connection to the server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for the next bytes of an answer. There is no limit on a
/// whole request: a GET streams as fast as its client reads, however long.
/// The wait starts as a request is sent, so for an upload it covers sending
/// the body too: uploads of more than [`SMALL_UPLOAD`] have longer
/// ([`Tuning::upload_timeout`]).
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The slowest link to the server that uploads are given time for: a part
/// of 8 MiB may take a minute beyond [`READ_TIMEOUT`].
pub const MIN_UPLOAD_RATE: u64 = 128 * 1024;
/// The largest upload sent within [`READ_TIMEOUT`] alone: at
/// [`MIN_UPLOAD_RATE`] it takes 8 s. Smaller ones, the most, still find a
/// hung server out in that time.
const SMALL_UPLOAD: usize = 1024 * 1024;
/// Longest self-copy (a server-side copy of up to [`MAX_BLOB`]).
const COPY_TIMEOUT: Duration = Duration::from_secs(300);
/// Where uploads in progress live.
const STAGING: &str = "tmp";

/// How the engine cuts and cleans up uploads; tests use small values.
#[derive(Clone, Copy, Debug)]
pub struct Tuning {
    pub part_size: usize,
    /// Staging objects older than this are deleted at connect.
    pub stale_after: Duration,
    /// [`READ_TIMEOUT`].
    pub read_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { part_size: DEFAULT_PART, stale_after: STALE_AFTER, read_timeout: READ_TIMEOUT }
    }
}

impl Tuning {
    /// The wait for an upload's answer, from when it is sent: the read
    /// timeout, and the time a part takes at [`MIN_UPLOAD_RATE`].
    fn upload_timeout(&self) -> Duration {
        self.read_timeout + Duration::from_secs(self.part_size as u64 / MIN_UPLOAD_RATE)
    }
}

/// The S3 engine; clones share one client.
#[derive(Clone)]
pub struct S3Engine {
    inner: Arc<Inner>,
}

struct Inner {
    store: AmazonS3,
    /// The same store, for uploads of more than [`SMALL_UPLOAD`], which
    /// are given [`Tuning::upload_timeout`].
    uploads: AmazonS3,
    bucket: String,
    region: String,
    /// `http(s)://host[:port]/bucket`: path-style requests.
    bucket_url: String,
    /// For the requests `object_store` does not make (the self-copy).
    http: reqwest::Client,
    part_size: usize,
    /// Age at which a staged upload is taken for abandoned.
    stale_after: Duration,
}

impl std::fmt::Debug for S3Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Engine({}, part {})", self.inner.bucket_url, self.inner.part_size)
    }
}

/// The code of the S3 error document `body` holds, if it is one.
fn error_code(body: &str) -> Option<&str> {
    let error = &body[body.find("<Error>")?..];
    let code = &error[error.find("<Code>")? + "<Code>".len()..];
    Some(&code[..code.find("</Code>")?])
}

/// Whether an error S3 sent as a code (in the body of a 200 too) may pass
/// on its own, as its 5xx statuses do.
fn retried_code(code: &str) -> bool {
    matches!(code, "InternalError" | "SlowDown" | "ServiceUnavailable" | "RequestTimeout")
}

/// Whether a failed request may succeed later: the network, a timeout, or
/// the server's 5xx / 429. `object_store` keeps the status in a private
/// type, so it is read from the message it makes.
fn transient(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if let Some(http) = e.downcast_ref::<HttpError>()
            && matches!(
                http.kind(),
                HttpErrorKind::Connect | HttpErrorKind::Request | HttpErrorKind::Timeout | HttpErrorKind::Interrupted
            )
        {
            return true;
        }
        let message = e.to_string();
        if ["500", "502", "503", "504", "429"].iter().any(|s| message.contains(&format!("status code: {s}"))) {
            return true;
        }
        cause = e.source();
    }
    false
}

fn unavailable(e: impl std::fmt::Display) -> EngineError {
    EngineError::Unavailable(format!("{NAME} engine: the store is unavailable: {e}"))
}

/// Maps an `object_store` error; `NotFound` names `digest` when given.
fn store_err(e: object_store::Error, digest: Option<Digest>) -> EngineError {
    match (e, digest) {
        (object_store::Error::NotFound { .. }, Some(digest)) => EngineError::NotFound(digest),
        (e, _) if transient(&e) => unavailable(e),
        (e, _) => EngineError::other(NAME, e),
    }
}

fn blob_key(digest: &Digest) -> Path {
    Path::from(digest.to_hex())
}

/// The digest a key names, if it is one: 64 lowercase hex digits.
fn digest_of_key(key: &str) -> Option<Digest> {
    if key.len() == 64 && key.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Digest::from_hex(key)
    } else {
        None
    }
}

/// Whether `name` (under `tmp/`) is one a writer gives its staging object.
fn is_staging_name(name: &str) -> bool {
    name.len() == 32 && name.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A client builder for the bucket `config` names at `endpoint` (`None`:
/// AWS), the standard `AWS_*` variables filling what is not given.
pub fn builder(endpoint: Option<&str>, config: &S3Config) -> AmazonS3Builder {
    let mut builder = AmazonS3Builder::from_env().with_virtual_hosted_style_request(false).with_allow_http(true);
    if let Some(endpoint) = endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(bucket) = &config.bucket {
        builder = builder.with_bucket_name(bucket);
    }
    if let Some(region) = &config.region {
        builder = builder.with_region(region);
    }
    if let Some(key) = &config.access_key {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = &config.secret_key {
        builder = builder.with_secret_access_key(secret);
    }
    builder
}

/// Where the requests of a [`builder`] go.
pub struct Resolved {
    pub bucket: String,
    pub region: String,
    /// `http(s)://host[:port]/bucket`: path-style requests.
    pub bucket_url: String,
}

/// The bucket, region and endpoint `builder` was given or found in the
/// environment, for requests of our own.
pub fn resolve(builder: &AmazonS3Builder) -> Result<Resolved> {
    let bucket = builder
        .get_config_value(&AmazonS3ConfigKey::Bucket)
        .ok_or_else(|| EngineError::other(NAME, "needs a bucket: --s3-bucket NAME (or AWS_BUCKET)"))?;
    let region = builder.get_config_value(&AmazonS3ConfigKey::Region).unwrap_or_else(|| "us-east-1".into());
    let endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::Endpoint)
        .unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
    let bucket_url = format!("{}/{bucket}", endpoint.trim_end_matches('/'));
    Ok(Resolved { bucket, region, bucket_url })
}

/// The headers that sign a request without a body to `url` with `store`'s
/// credentials (AWS Signature Version 4).
pub async fn sign(
    store: &AmazonS3,
    region: &str,
    method: &Method,
    url: &str,
    headers: &HeaderMap,
) -> Result<HeaderMap> {
    let credential = store.credentials().get_credential().await.map_err(|e| store_err(e, None))?;
    let mut request = http::Request::builder()
        .method(method.clone())
        .uri(url)
        .body(HttpRequestBody::empty())
        .map_err(|e| EngineError::other(NAME, e))?;
    request.headers_mut().extend(headers.clone());
    AwsAuthorizer::new(&credential, "s3", region)
        .try_authorize(&mut request, None)
        .map_err(|e| EngineError::other(NAME, e))?;
    Ok(request.headers().clone())
}

/// Creates the bucket `config` names (`object_store` cannot); an existing
/// bucket of the same owner is fine.
pub async fn create_bucket(endpoint: Option<&str>, config: &S3Config) -> Result<()> {
    let engine = S3Engine::client(endpoint, config, Tuning::default())?;
    let (status, body) = engine.inner.send_signed(Method::PUT, &engine.inner.bucket_url, HeaderMap::new()).await?;
    if status.is_success() || body.contains("BucketAlreadyOwnedByYou") {
        return Ok(());
    }
    Err(EngineError::other(NAME, format!("creating bucket {:?}: {status}: {body}", engine.inner.bucket)))
}

/// Empties the bucket `config` names and deletes it: for buckets made for
/// one run (the bench's).
pub async fn delete_bucket(endpoint: Option<&str>, config: &S3Config) -> Result<()> {
    let engine = S3Engine::client(endpoint, config, Tuning::default())?;
    let store = &engine.inner.store;
    let listed: Vec<_> = store.list(None).try_collect().await.map_err(|e| store_err(e, None))?;
    for meta in listed {
        match store.delete(&meta.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(store_err(e, None)),
        }
    }
    let (status, body) = engine.inner.send_signed(Method::DELETE, &engine.inner.bucket_url, HeaderMap::new()).await?;
    if status.is_success() {
        return Ok(());
    }
    Err(EngineError::other(NAME, format!("deleting bucket {:?}: {status}: {body}", engine.inner.bucket)))
}

impl S3Engine {
    /// Connects to the bucket `config` names at `endpoint` (`None`: AWS), and
    /// deletes staging objects that crashed writers left long ago. An
    /// unreachable store is not an error here: requests fail with
    /// [`EngineError::Unavailable`] until it is back.
    pub async fn connect(endpoint: Option<&str>, config: &S3Config) -> Result<S3Engine> {
        S3Engine::connect_tuned(endpoint, config, Tuning::default()).await
    }

    pub async fn connect_tuned(endpoint: Option<&str>, config: &S3Config, tuning: Tuning) -> Result<S3Engine> {
        let engine = S3Engine::client(endpoint, config, tuning)?;
        match engine.remove_abandoned().await {
            Ok(()) => {}
            Err(EngineError::Unavailable(m)) => tracing::warn!("{m}; abandoned uploads will be removed later"),
            Err(e) => return Err(e),
        }
        Ok(engine)
    }

    /// The engine, without a request to the store yet.
    fn client(endpoint: Option<&str>, config: &S3Config, tuning: Tuning) -> Result<S3Engine> {
        if tuning.part_size < MIN_PART {
            return Err(EngineError::other(NAME, format!("parts must be at least {MIN_PART} bytes")));
        }
        let builder = builder(endpoint, config);
        let Resolved { bucket, region, bucket_url } = resolve(&builder)?;
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: MAX_RETRIES,
            retry_timeout: RETRY_TIMEOUT,
        };
        let store = |read_timeout: Duration| {
            let options = ClientOptions::new()
                .with_connect_timeout(CONNECT_TIMEOUT)
                .with_timeout_disabled()
                .with_config(object_store::ClientConfigKey::ReadTimeout, format!("{}ms", read_timeout.as_millis()))
                .with_allow_http(true);
            builder
                .clone()
                // One DeleteObject per blob: S3Proxy and others lack DeleteObjects.
                .with_disable_bulk_delete(true)
                .with_retry(retry.clone())
                .with_client_options(options)
                .build()
                .map_err(|e| EngineError::other(NAME, e))
        };
        let (uploads, store) = (store(tuning.upload_timeout())?, store(tuning.read_timeout)?);
        // A server silent for READ_TIMEOUT is taken for hung, copies
        // included (S3 keeps a long copy's answer alive with whitespace):
        // without it a stopped server held every write for COPY_TIMEOUT.
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(tuning.read_timeout)
            .timeout(COPY_TIMEOUT)
            .build()
            .map_err(|e| EngineError::other(NAME, e))?;
        let (part_size, stale_after) = (tuning.part_size, tuning.stale_after);
        let inner = Inner { store, uploads, bucket, region, bucket_url, http, part_size, stale_after };
        Ok(S3Engine { inner: Arc::new(inner) })
    }
}

impl Inner {
    /// Sends one request signed with the store's credentials, retried like
    /// `object_store`'s own; returns the status and the body.
    async fn send_signed(&self, method: Method, url: &str, headers: HeaderMap) -> Result<(StatusCode, String)> {
        let started = std::time::Instant::now();
        let mut backoff = Duration::from_millis(100);
        let mut retries = 0;
        loop {
            let signed = sign(&self.store, &self.region, &method, url, &headers).await?;
            let sent = self.http.request(method.clone(), url).headers(signed).send().await;
            let failure = match sent {
                Ok(response) => {
                    let status = response.status();
                    match response.text().await {
                        // S3 can report a failed copy in the body of a 200.
                        Ok(body) if status.is_server_error() || error_code(&body).is_some_and(retried_code) => {
                            format!("{method} {url}: {status}: {body}")
                        }
                        Ok(body) => return Ok((status, body)),
                        Err(e) => format!("{method} {url}: {e}"),
                    }
                }
                Err(e) => format!("{method} {url}: {e}"),
            };
            if retries >= MAX_RETRIES || started.elapsed() > RETRY_TIMEOUT {
                return Err(unavailable(failure));
            }
            retries += 1;
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }

    /// Refreshes the last-modified time of a stored object by copying it
    /// onto itself; `false` if there is no such object.
    async fn touch(&self, key: &Path) -> Result<bool> {
        let mut headers = HeaderMap::new();
        let source = format!("/{}/{key}", self.bucket);
        headers.insert("x-amz-copy-source", HeaderValue::from_str(&source).map_err(|e| EngineError::other(NAME, e))?);
        headers.insert("x-amz-metadata-directive", HeaderValue::from_static("REPLACE"));
        let (status, body) = self.send_signed(Method::PUT, &format!("{}/{key}", self.bucket_url), headers).await?;
        match status {
            // A 200 may carry any error (see `send_signed`).
            s if s.is_success() && error_code(&body).is_none() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            s => Err(EngineError::other(NAME, format!("refreshing {key}: {s}: {body}"))),
        }
    }

    /// Removes what an unfinished writer staged.
    async fn discard(&self, staging: Staging) {
        let Staging { path, mut upload, mut parts, completed } = staging;
        // Parts still arriving after the abort would be kept and billed.
        while parts.join_next().await.is_some() {}
        // A completion asked may or may not have reached the server: the
        // upload is aborted either way, and then its object deleted.
        let aborted = upload.abort().await;
        let result = if completed { self.store.delete(&path).await } else { aborted };
        match result {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) if completed => {
                tracing::warn!("{NAME} engine: deleting {path}: {e}; it will be removed at a later start-up")
            }
            Err(e) => tracing::warn!(
                "{NAME} engine: aborting the upload to {path}: {e}; a lifecycle rule on the bucket must remove it"
            ),
        }
    }
}

/// A multipart upload to a staging key.
struct Staging {
    path: Path,
    upload: Box<dyn MultipartUpload>,
    /// Parts being sent.
    parts: JoinSet<object_store::Result<()>>,
    /// Whether the upload's completion was asked: the staging object may
    /// exist.
    completed: bool,
}

struct S3Writer {
    inner: Arc<Inner>,
    /// Bytes not sent yet: less than a part, plus the chunk that filled it.
    pending: VecDeque<Bytes>,
    pending_len: usize,
    size: u64,
    /// From the first full part on; cleared once finished or discarded.
    staging: Option<Staging>,
}

impl S3Writer {
    /// The first `n` pending bytes, without copying.
    fn take_pending(&mut self, n: usize) -> PutPayload {
        let mut taken = Vec::new();
        let mut left = n;
        while left > 0 {
            let Some(mut chunk) = self.pending.pop_front() else { break };
            if chunk.len() > left {
                self.pending.push_front(chunk.split_off(left));
            }
            left -= chunk.len();
            taken.push(chunk);
        }
        self.pending_len -= n - left;
        taken.into_iter().collect()
    }

    /// Sends a part, starting the upload first if needed, and waiting while
    /// [`PARTS_IN_FLIGHT`] are on their way.
    async fn send_part(&mut self, part: PutPayload) -> Result<()> {
        if self.staging.is_none() {
            let path = Path::from(format!("{STAGING}/{}", hex::encode(rand::random::<[u8; 16]>())));
            let upload = self.inner.uploads.put_multipart(&path).await.map_err(|e| store_err(e, None))?;
            self.staging = Some(Staging { path, upload, parts: JoinSet::new(), completed: false });
        }
        let Some(staging) = self.staging.as_mut() else { return Ok(()) };
        while staging.parts.len() >= PARTS_IN_FLIGHT {
            join_part(&mut staging.parts).await?;
        }
        staging.parts.spawn(staging.upload.put_part(part));
        Ok(())
    }

    /// Turns the staged upload into the blob `key`.
    async fn finish_staged(&mut self, key: &Path) -> Result<()> {
        if self.pending_len > 0 {
            let last = self.take_pending(self.pending_len);
            self.send_part(last).await?;
        }
        let Some(staging) = self.staging.as_mut() else { return Ok(()) };
        while !staging.parts.is_empty() {
            join_part(&mut staging.parts).await?;
        }
        if self.inner.touch(key).await? {
            if let Some(staging) = self.staging.take() {
                self.inner.discard(staging).await;
            }
            return Ok(());
        }
        // Marked first: if this is cancelled after the server completed the
        // upload, the object is deleted rather than the upload aborted.
        staging.completed = true;
        staging.upload.complete().await.map_err(|e| store_err(e, None))?;
        self.inner.store.copy(&staging.path, key).await.map_err(|e| store_err(e, None))?;
        let path = staging.path.clone();
        self.staging = None;
        if let Err(e) = self.inner.store.delete(&path).await {
            tracing::warn!("{NAME} engine: deleting {path}: {e}; it will be removed at a later start-up");
        }
        Ok(())
    }
}

async fn join_part(parts: &mut JoinSet<object_store::Result<()>>) -> Result<()> {
    match parts.join_next().await {
        Some(Ok(sent)) => sent.map_err(|e| store_err(e, None)),
        Some(Err(e)) => Err(EngineError::other(NAME, format!("sending a part: {e}"))),
        None => Ok(()),
    }
}

#[async_trait]
impl BlobWriter for S3Writer {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.size += chunk.len() as u64;
        if self.size > MAX_BLOB {
            return Err(EngineError::TooLarge { engine: NAME, max: MAX_BLOB });
        }
        self.pending_len += chunk.len();
        self.pending.push_back(chunk);
        // Strictly more than a part: the last part is never empty, and a
        // blob of exactly one part is a single PUT.
        while self.pending_len > self.inner.part_size {
            let part = self.take_pending(self.inner.part_size);
            self.send_part(part).await?;
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        let key = blob_key(&digest);
        if self.staging.is_some() {
            self.finish_staged(&key).await?;
        } else if !self.inner.touch(&key).await? {
            let small = self.pending_len <= SMALL_UPLOAD;
            let payload = self.take_pending(self.pending_len);
            let store = if small { &self.inner.store } else { &self.inner.uploads };
            store.put(&key, payload).await.map_err(|e| store_err(e, None))?;
        }
        Ok(BlobRef { digest, size: self.size, locator: Vec::new() })
    }

    async fn abort(mut self: Box<Self>) {
        if let Some(staging) = self.staging.take() {
            self.inner.discard(staging).await;
        }
    }
}

impl Drop for S3Writer {
    fn drop(&mut self) {
        // A writer dropped mid-stream (client gone) cleans up in the
        // background; without a runtime, a lifecycle rule or a later start-up
        // has to.
        let Some(staging) = self.staging.take() else { return };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = self.inner.clone();
            runtime.spawn(async move { inner.discard(staging).await });
        }
    }
}

#[async_trait]
impl BlobEngine for S3Engine {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Deletes staging objects last modified longer than the cleanup age
    /// ago.
    async fn remove_abandoned(&self) -> Result<()> {
        let store = &self.inner.store;
        let cutoff = SystemTime::now() - self.inner.stale_after;
        let staged: Vec<_> = store.list(Some(&Path::from(STAGING))).try_collect().await.map_err(|e| match e {
            e if e.to_string().contains("NoSuchBucket") => {
                EngineError::other(NAME, format!("bucket {:?} does not exist", self.inner.bucket))
            }
            e => store_err(e, None),
        })?;
        let mut removed = 0;
        // Only names this engine gives: another program's `tmp/` is its own.
        for meta in staged.into_iter().filter(|m| m.location.filename().is_some_and(is_staging_name)) {
            if SystemTime::from(meta.last_modified) <= cutoff {
                match store.delete(&meta.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => removed += 1,
                    Err(e) => return Err(store_err(e, None)),
                }
            }
        }
        if removed > 0 {
            tracing::info!("{NAME} engine: removed {removed} abandoned staging objects");
        }
        Ok(())
    }

    async fn writer(&self, size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        // Refused before a byte is sent when the body says its length.
        if size_hint.is_some_and(|n| n > MAX_BLOB) {
            return Err(EngineError::TooLarge { engine: NAME, max: MAX_BLOB });
        }
        Ok(Box::new(S3Writer {
            inner: self.inner.clone(),
            pending: VecDeque::new(),
            pending_len: 0,
            size: 0,
            staging: None,
        }))
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        if range.end > blob.size || range.start > range.end {
            return Err(EngineError::other(NAME, "range beyond the end of the blob"));
        }
        if range.is_empty() {
            // Nothing to fetch, but a missing blob is still an error.
            self.stat(blob).await?.ok_or(EngineError::NotFound(blob.digest))?;
            return Ok(Box::pin(futures::stream::empty()));
        }
        let digest = blob.digest;
        let options = GetOptions { range: Some(GetRange::Bounded(range.start..range.end)), ..Default::default() };
        let result =
            self.inner.store.get_opts(&blob_key(&digest), options).await.map_err(|e| store_err(e, Some(digest)))?;
        if result.meta.size != blob.size {
            return Err(EngineError::damaged(
                NAME,
                format!("object {digest} holds {} bytes, its record says {}", result.meta.size, blob.size),
            ));
        }
        Ok(Box::pin(result.into_stream().map_err(move |e| store_err(e, Some(digest)))))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        match self.inner.store.delete(&blob_key(&blob.digest)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(store_err(e, None)),
        }
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        match self.inner.store.head(&blob_key(&blob.digest)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(store_err(e, None)),
        }
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        // Only the bucket's root: staging objects and anything else are
        // under prefixes.
        let listed = self.inner.store.list_with_delimiter(None).await.map_err(|e| store_err(e, None))?;
        Ok(listed
            .objects
            .into_iter()
            .filter_map(|meta| {
                let digest = digest_of_key(meta.location.as_ref())?;
                Some(BlobInfo {
                    digest,
                    size: meta.size,
                    locator: Vec::new(),
                    modified: SystemTime::from(meta.last_modified),
                })
            })
            .collect())
    }

    /// The bytes of every object in the bucket (blobs, staging objects and
    /// anything else), from one listing; parts of uncompleted multipart
    /// uploads are not listed and not counted.
    async fn disk_usage(&self) -> Result<Option<u64>> {
        let mut total = 0;
        let mut listed = self.inner.store.list(None);
        while let Some(meta) = listed.next().await {
            total += meta.map_err(|e| store_err(e, None))?.size;
        }
        Ok(Some(total))
    }
}

/// The S3 server tests use, from `DEPOT_TEST_S3` (its endpoint),
/// `DEPOT_TEST_S3_ACCESS_KEY` and `DEPOT_TEST_S3_SECRET_KEY`, which
/// `scripts/test.sh` sets after starting S3Proxy: the endpoint, and a
/// configuration with the credentials and `bucket`.
pub fn test_server(bucket: &str) -> (String, S3Config) {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: run scripts/test.sh, which starts S3Proxy and sets DEPOT_TEST_S3*")
        })
    };
    let config = S3Config {
        bucket: Some(bucket.into()),
        region: None,
        access_key: Some(var("DEPOT_TEST_S3_ACCESS_KEY")),
        secret_key: Some(var("DEPOT_TEST_S3_SECRET_KEY")),
    };
    (var("DEPOT_TEST_S3"), config)
}

/// Creates a bucket of a random name on the test server ([`test_server`])
/// for one test, and returns its name. (`object_store` cannot create one.)
pub async fn fresh_test_bucket() -> String {
    let bucket = format!("depot-t-{}", hex::encode(rand::random::<[u8; 6]>()));
    let (endpoint, config) = test_server(&bucket);
    create_bucket(Some(&endpoint), &config).await.expect("creating a test bucket");
    bucket
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    use super::*;
    use crate::engine::{BlobEngineExt, conformance, sha2_digest};

    fn endpoint() -> String {
        test_server("").0
    }

    fn config(bucket: &str) -> S3Config {
        test_server(bucket).1
    }

    async fn engine(part_size: usize) -> (S3Engine, String) {
        let bucket = fresh_test_bucket().await;
        let tuning = Tuning { part_size, ..Tuning::default() };
        (S3Engine::connect_tuned(Some(&endpoint()), &config(&bucket), tuning).await.unwrap(), bucket)
    }

    async fn keys(engine: &S3Engine, prefix: &str) -> Vec<String> {
        let prefix = Path::from(prefix);
        let listed: Vec<_> = engine.inner.store.list(Some(&prefix)).try_collect().await.unwrap();
        listed.into_iter().map(|m| m.location.to_string()).collect()
    }

    /// Multipart uploads begun and neither completed nor aborted.
    async fn open_uploads(engine: &S3Engine) -> usize {
        let url = format!("{}?uploads", engine.inner.bucket_url);
        let (status, body) = engine.inner.send_signed(Method::GET, &url, HeaderMap::new()).await.unwrap();
        assert!(status.is_success(), "{status}: {body}");
        body.matches("<UploadId>").count()
    }

    fn digest(bytes: &[u8]) -> Digest {
        Digest(sha2_digest(bytes))
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let (engine, _) = engine(DEFAULT_PART).await;
        conformance::run_all(&engine).await;
        assert!(keys(&engine, STAGING).await.is_empty());
    }

    /// S3's smallest parts are larger than the suite's blobs, so the
    /// multipart path gets promises of the suite on larger ones here.
    #[tokio::test(flavor = "multi_thread")]
    async fn large_blobs_go_through_a_multipart_upload_and_a_copy() {
        let (engine, _) = engine(MIN_PART).await;
        let part = MIN_PART as u64;
        for (len, seed) in [(MIN_PART, 20u8), (MIN_PART + 1, 21), (12 * 1024 * 1024 + 17, 22)] {
            let data = conformance::pattern(len, seed);
            let mut writer = engine.writer(None).await.unwrap();
            for piece in data.chunks(1_000_003) {
                writer.write(Bytes::copy_from_slice(piece)).await.unwrap();
            }
            let blob = writer.finish(digest(&data)).await.unwrap();
            assert_eq!(blob.size, len as u64);
            assert_eq!(engine.stat(&blob).await.unwrap(), Some(len as u64));
            let len = len as u64;
            for (start, end) in [(0, len), (0, 1), (part - 1, part + 1), (part, len), (len - 1, len), (7, 7)] {
                if start <= end && end <= len {
                    let got = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
                    assert!(got == data[start as usize..end as usize], "{len}-byte blob: range {start}..{end}");
                }
            }
        }
        let data = conformance::pattern(11_000_000, 23);
        let (a, b) = futures::join!(engine.put_bytes(data.clone()), engine.put_bytes(data.clone()));
        assert_eq!(a.unwrap(), b.unwrap());
        assert_eq!(engine.list().await.unwrap().len(), 4);
        assert!(keys(&engine, STAGING).await.is_empty());
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_uploads(&engine).await > 0 {
            assert!(Instant::now() < deadline, "multipart uploads remain");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn blobs_are_objects_named_by_their_digest() {
        let (engine, _) = engine(MIN_PART).await;
        let small = conformance::pattern(1000, 1);
        let large = conformance::pattern(6_000_000, 2);
        engine.put_bytes(small.clone()).await.unwrap();
        engine.put_bytes(large.clone()).await.unwrap();
        let mut expected = vec![digest(&small).to_hex(), digest(&large).to_hex()];
        expected.sort();
        let mut stored = keys(&engine, "").await;
        stored.sort();
        assert_eq!(stored, expected);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn list_skips_objects_that_are_not_blobs() {
        let (engine, _) = engine(DEFAULT_PART).await;
        let blob = engine.put_bytes(conformance::pattern(100, 3)).await.unwrap();
        let hex = blob.digest.to_hex();
        for other in ["notes.txt".to_string(), hex.to_uppercase(), format!("{hex}0"), format!("dir/{hex}")] {
            engine.inner.store.put(&Path::from(other), PutPayload::from_static(b"x")).await.unwrap();
        }
        let listed = engine.list().await.unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!((listed[0].digest, listed[0].size), (blob.digest, 100));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn storing_a_stored_blob_refreshes_it_without_rewriting() {
        for part_size in [DEFAULT_PART, MIN_PART] {
            let (engine, _) = engine(part_size).await;
            for data in [conformance::pattern(5000, 4), conformance::pattern(6_000_000, 5)] {
                let blob = engine.put_bytes(data.clone()).await.unwrap();
                let first = engine.list().await.unwrap().into_iter().find(|i| i.digest == blob.digest).unwrap();
                // Last-modified times have a resolution of one second.
                tokio::time::sleep(Duration::from_millis(1100)).await;
                assert_eq!(engine.put_bytes(data.clone()).await.unwrap(), blob);
                let second = engine.list().await.unwrap().into_iter().find(|i| i.digest == blob.digest).unwrap();
                assert!(second.modified > first.modified, "{:?} then {:?}", first.modified, second.modified);
                assert!(engine.read_to_vec(&blob, ByteRange::full(blob.size)).await.unwrap() == data);
            }
            assert!(keys(&engine, STAGING).await.is_empty());
            assert_eq!(open_uploads(&engine).await, 0);
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn abandoned_writers_abort_their_uploads() {
        let (engine, _) = engine(MIN_PART).await;
        let mut aborted = engine.writer(None).await.unwrap();
        aborted.write(conformance::pattern(11_000_000, 6)).await.unwrap();
        assert_eq!(open_uploads(&engine).await, 1);
        aborted.abort().await;
        assert_eq!(open_uploads(&engine).await, 0);
        let mut dropped = engine.writer(None).await.unwrap();
        dropped.write(conformance::pattern(11_000_000, 7)).await.unwrap();
        drop(dropped);
        let deadline = Instant::now() + Duration::from_secs(10);
        while open_uploads(&engine).await > 0 {
            assert!(Instant::now() < deadline, "a dropped writer's upload remains");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left = keys(&engine, "").await;
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn stale_staging_objects_are_removed_at_connect_and_fresh_ones_kept() {
        let (engine, bucket) = engine(DEFAULT_PART).await;
        let staged = Path::from(format!("{STAGING}/{}", "0f".repeat(16)));
        let foreign = Path::from(format!("{STAGING}/export.csv"));
        for path in [&staged, &foreign] {
            engine.inner.store.put(path, PutPayload::from_static(b"partial")).await.unwrap();
        }
        let url = endpoint();
        // Another node may be finishing this upload right now.
        S3Engine::connect(Some(&url), &config(&bucket)).await.unwrap();
        assert_eq!(keys(&engine, STAGING).await.len(), 2);
        let tuning = Tuning { stale_after: Duration::ZERO, ..Tuning::default() };
        S3Engine::connect_tuned(Some(&url), &config(&bucket), tuning).await.unwrap();
        assert_eq!(keys(&engine, STAGING).await, [foreign.to_string()], "another program's object is its own");
    }

    /// A TCP proxy to the test server that counts the bytes the server sends.
    async fn counting_proxy() -> (String, Arc<AtomicU64>) {
        proxy(None).await
    }

    /// A TCP proxy to the test server that counts the bytes the server
    /// sends, and passes what it is sent on at `rate` bytes a second, if
    /// given.
    async fn proxy(rate: Option<u64>) -> (String, Arc<AtomicU64>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let target = endpoint().trim_start_matches("http://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let counter = received.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let upstream = tokio::net::TcpStream::connect(&target).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut upstream_read, mut upstream_write) = upstream.into_split();
                tokio::spawn(async move {
                    let mut buf = vec![0; 16 * 1024];
                    while let Ok(n) = client_read.read(&mut buf).await {
                        if n == 0 || upstream_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                        if let Some(rate) = rate {
                            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
                        }
                    }
                });
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n) = upstream_read.read(&mut buf).await {
                        // Counted before the client can see them, so a
                        // count read after an answer includes all of it.
                        counter.fetch_add(n as u64, Ordering::SeqCst);
                        if n == 0 || client_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        (format!("http://{addr}"), received)
    }

    /// A blob past S3's copy limit is refused as too large (a 400), before
    /// any of it is sent when its length is known.
    #[tokio::test]
    async fn a_blob_past_the_limit_is_refused_before_a_byte_is_sent() {
        let engine = S3Engine::client(Some("http://127.0.0.1:1"), &config("depot-nowhere"), Tuning::default()).unwrap();
        let e = engine.writer(Some(MAX_BLOB + 1)).await.err().unwrap();
        assert!(matches!(e, EngineError::TooLarge { max: MAX_BLOB, .. }), "{e:?}");
        let e = crate::store::StoreError::from(e);
        assert!(matches!(e, crate::store::StoreError::EntityTooLarge(_)), "{e:?}");
    }

    /// The read timeout counts from when a request is sent, its body
    /// included: an upload on a slow link that keeps going is given the
    /// time its size needs, as a single PUT and as a part.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_slow_upload_that_keeps_going_is_not_cut_off() {
        let bucket = fresh_test_bucket().await;
        let (proxy, _) = proxy(Some(2 * 1024 * 1024)).await;
        let tuning = Tuning { part_size: MIN_PART, read_timeout: Duration::from_secs(1), ..Tuning::default() };
        let engine = S3Engine::connect_tuned(Some(&proxy), &config(&bucket), tuning).await.unwrap();
        for size in [MIN_PART, MIN_PART + 1] {
            let data = conformance::pattern(size, 4);
            let started = Instant::now();
            let blob = engine.put_bytes(data.clone()).await.unwrap();
            assert!(started.elapsed() > 2 * tuning.read_timeout, "the link was slow: {:?}", started.elapsed());
            assert!(engine.read_to_vec(&blob, ByteRange::full(blob.size)).await.unwrap() == data, "{size} bytes");
        }
    }

    /// A fake server answering each request, as a 200, with the next of
    /// `bodies`; and how many requests it took.
    async fn answering(bodies: Vec<&'static str>) -> (String, Arc<AtomicU64>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicU64::new(0));
        let counter = requests.clone();
        tokio::spawn(async move {
            for body in bodies {
                let Ok((mut stream, _)) = listener.accept().await else { return };
                let mut head = Vec::new();
                let mut buf = [0; 4096];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                counter.fetch_add(1, Ordering::SeqCst);
                let answer =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        (format!("http://{addr}"), requests)
    }

    /// S3 may answer a copy with 200 and an error in the body: a refresh
    /// retries one that passes (SlowDown) and fails on any other.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_refresh_answered_200_with_an_error_is_not_done() {
        let slow = "<?xml version=\"1.0\"?>\n<Error><Code>SlowDown</Code><Message>Reduce your rate</Message></Error>";
        let copied = "<CopyObjectResult><ETag>\"e\"</ETag></CopyObjectResult>";
        let denied = "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>";
        let (url, requests) = answering(vec![slow, copied, denied]).await;
        let engine = S3Engine::client(Some(&url), &config("depot-fake"), Tuning::default()).unwrap();
        let key = Path::from("blobs/x");
        assert!(engine.inner.touch(&key).await.unwrap());
        assert_eq!(requests.load(Ordering::SeqCst), 2, "the SlowDown was retried");
        let err = engine.inner.touch(&key).await.unwrap_err();
        assert!(err.to_string().contains("AccessDenied"), "{err}");
        assert_eq!(error_code(copied), None);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_ranged_read_fetches_only_the_range() {
        let (direct, bucket) = engine(DEFAULT_PART).await;
        let data = conformance::pattern(4_000_000, 8);
        let blob = direct.put_bytes(data.clone()).await.unwrap();
        let (proxy, received) = counting_proxy().await;
        let engine = S3Engine::connect(Some(&proxy), &config(&bucket)).await.unwrap();
        for (start, end) in [(1_000_000, 1_000_100), (3_999_000, 4_000_000), (0, 1), (2_000_000, 2_300_000)] {
            received.store(0, Ordering::SeqCst);
            let got = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
            assert!(got == data[start as usize..end as usize], "range {start}..{end}");
            let wire = received.load(Ordering::SeqCst);
            // The range and one answer's headers.
            assert!(wire >= end - start && wire < end - start + 4096, "{wire} bytes for range {start}..{end}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unreachable_store_is_unavailable_within_seconds() {
        let started = Instant::now();
        let engine = S3Engine::connect(Some("http://127.0.0.1:1"), &config("depot-nowhere")).await.unwrap();
        let blob = BlobRef { digest: Digest([0; 32]), size: 10, locator: Vec::new() };
        let read = engine.read(&blob, ByteRange::full(10)).await.err().unwrap();
        let write = engine.put_bytes(Bytes::from_static(b"0123456789")).await.unwrap_err();
        for err in [engine.stat(&blob).await.unwrap_err(), read, write, engine.list().await.unwrap_err()] {
            assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
            let message = err.to_string();
            assert!(message.contains("s3 engine") && message.contains("unavailable"), "{message}");
        }
        assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_missing_bucket_is_a_clear_error() {
        let url = endpoint();
        let mut unnamed = config("x");
        unnamed.bucket = None;
        // Without the flag, AWS_BUCKET would name it.
        let err = match std::env::var_os("AWS_BUCKET") {
            Some(_) => return,
            None => S3Engine::connect(Some(&url), &unnamed).await.unwrap_err(),
        };
        assert!(err.to_string().contains("--s3-bucket"), "{err}");
        let err = S3Engine::connect(Some(&url), &config("depot-no-such-bucket")).await.unwrap_err();
        assert!(err.to_string().contains("\"depot-no-such-bucket\" does not exist"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn disk_usage_counts_the_objects() {
        let (engine, _) = engine(DEFAULT_PART).await;
        assert_eq!(engine.disk_usage().await.unwrap(), Some(0));
        engine.put_bytes(conformance::pattern(300_000, 9)).await.unwrap();
        engine.put_bytes(conformance::pattern(1000, 10)).await.unwrap();
        assert_eq!(engine.disk_usage().await.unwrap(), Some(301_000));
    }
}
