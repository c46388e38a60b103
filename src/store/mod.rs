//! The store: the one place that combines a [`Catalog`] and a
//! [`BlobEngine`]. It hashes bodies while they stream into the engine,
//! deduplicates by SHA-256, assembles ranges across parts, and collects
//! garbage.
//!
//! Order of a write: bytes first, made durable by the engine; then the
//! catalog transaction that points at them. A crash between the two leaves
//! unreferenced bytes, which [`Store::gc`] removes; it never leaves a record
//! pointing at missing bytes.

mod guards;
mod hashes;
mod hot;
pub mod maintenance;
#[cfg(test)]
pub(crate) mod model_tests;
mod multipart;
pub mod names;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt, TryStreamExt};
use tracing::Instrument;

use crate::catalog::{
    BODY_IN_RECORD, BlobRecord, BucketRecord, Catalog, CatalogError, CatalogExt, CatalogStats, ClaimId, DELETE_TIMEOUT,
    ListPage, ListQuery, Millis, ObjectPut, ObjectRecord, Part, Precondition, now_millis, to_millis,
};
use crate::engine::{
    BlobEngine, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, DynEngine, EngineConfig, EngineError, EngineKind,
};
use guards::BlobGuards;
use hot::HotBlobs;
pub use hot::HotStats;
pub use multipart::{
    CompletionChecksum, MAX_PART_NUMBER, MIN_PART_SIZE, MakeChecksum, PartsPage, UploadInfo, UploadQuery,
};

/// The bucket every store has from its first start.
pub const DEFAULT_BUCKET: &str = "files";

/// Errors of store operations; the HTTP layers map each to a status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{0}")]
    InvalidBucketName(String),
    #[error("{0}")]
    InvalidKey(String),
    /// A key longer than the store's limit (`--max-key-bytes`), which S3
    /// names apart from other invalid keys.
    #[error("{0}")]
    KeyTooLong(String),
    #[error("the bucket {0:?} does not exist")]
    NoSuchBucket(String),
    #[error("the key {0:?} does not exist")]
    NoSuchKey(String),
    #[error("no blob has the SHA-256 {0}")]
    NoSuchBlob(String),
    #[error("the bucket {0:?} already exists")]
    BucketExists(String),
    #[error("the bucket {0:?} is not empty")]
    BucketNotEmpty(String),
    #[error("the multipart upload {0:?} does not exist: it was completed, aborted or expired")]
    NoSuchUpload(String),
    #[error("{0}")]
    InvalidPart(String),
    #[error("the parts must be listed in ascending order of part number")]
    InvalidPartOrder,
    #[error("{0}")]
    EntityTooSmall(String),
    #[error("{0}")]
    EntityTooLarge(String),
    #[error("a precondition of the request failed")]
    PreconditionFailed,
    #[error("the user metadata takes {0} bytes; at most {MAX_METADATA_BYTES} are allowed")]
    MetadataTooLarge(usize),
    #[error(
        "the Content-Type and the headers kept with the object take {0} bytes; at most {MAX_KEPT_HEADER_BYTES} are allowed"
    )]
    HeadersTooLarge(usize),
    #[error("the body's {hash} is {actual}, not the declared {declared}")]
    BadDigest { hash: &'static str, declared: String, actual: String },
    #[error("the body ended after {got} of {expected} bytes")]
    IncompleteBody { expected: u64, got: u64 },
    #[error("reading the request body failed: {0}")]
    Body(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("no space left on the storage device")]
    NoSpace,
    /// Too little space: less than `--min-free-space` keeps for the
    /// catalog, or none left where a backup writes (507, as `NoSpace`, but
    /// with a message saying where).
    #[error("{0}")]
    LowSpace(String),
    #[error("writes are disabled until restart: {0}")]
    WritesDisabled(String),
    #[error("the storage backend is unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

impl From<CatalogError> for StoreError {
    fn from(e: CatalogError) -> Self {
        match e {
            CatalogError::NoSuchBucket(b) => StoreError::NoSuchBucket(b),
            CatalogError::BucketExists(b) => StoreError::BucketExists(b),
            CatalogError::BucketNotEmpty(b) => StoreError::BucketNotEmpty(b),
            CatalogError::PreconditionFailed => StoreError::PreconditionFailed,
            CatalogError::Unavailable(m) => StoreError::Unavailable(m),
            CatalogError::SyncFailed(m) => StoreError::WritesDisabled(m),
            CatalogError::NoSpace => StoreError::NoSpace,
            e => StoreError::Internal(e.to_string()),
        }
    }
}

impl From<EngineError> for StoreError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NoSpace => StoreError::NoSpace,
            e @ EngineError::TooLarge { .. } => StoreError::EntityTooLarge(e.to_string()),
            EngineError::SyncFailed(e) => StoreError::WritesDisabled(e.to_string()),
            EngineError::Unavailable(m) => StoreError::Unavailable(m),
            e => StoreError::Internal(e.to_string()),
        }
    }
}

/// Store settings.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// How long an unreferenced blob stays before the collector removes it.
    pub gc_grace: Duration,
    /// How long a multipart upload may stay incomplete before the collector
    /// aborts it.
    pub upload_expiry: Duration,
    /// How the engine was opened: a backup opens its copy the same way.
    pub engine: Option<(EngineKind, EngineConfig)>,
    /// Longest key, in bytes.
    pub max_key_bytes: usize,
    /// The data directory it was opened from, if any: a backup asked of a
    /// server checks that the server serves the directory meant.
    pub data: Option<std::path::PathBuf>,
    /// Bytes uploads leave free on the data directory's file system (0:
    /// none), so that the catalog can always record deletes and start:
    /// RocksDB on a full disk can do neither.
    pub min_free_space: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            gc_grace: Duration::from_secs(3600),
            upload_expiry: Duration::from_secs(24 * 3600),
            engine: None,
            max_key_bytes: names::MAX_KEY_BYTES,
            data: None,
            min_free_space: 0,
        }
    }
}

/// What a put is told besides the body.
#[derive(Clone, Debug, Default)]
pub struct PutOptions {
    /// The declared body length, if known.
    pub content_length: Option<u64>,
    /// The Content-Type; guessed from the key when absent.
    pub content_type: Option<String>,
    /// A declared SHA-256 the body must have.
    pub expected_sha256: Option<Digest>,
    /// A declared MD5 the body must have (`Content-MD5`).
    pub expected_md5: Option<[u8; 16]>,
    pub precondition: Precondition,
    pub metadata: Vec<(String, String)>,
    /// Response headers to store with the object: some of
    /// [`crate::catalog::STORED_HEADERS`], lower-case, in that order.
    pub headers: Vec<(String, String)>,
    /// Headers known only once the body has ended, such as a checksum sent
    /// after it: stored after `headers`.
    pub late_headers: Option<LateHeaders>,
    /// The modification time to record instead of now: imports keep their
    /// source's dates.
    pub modified: Option<Millis>,
    /// The most bytes the body may hold, declared or not.
    pub max_length: Option<u64>,
}

/// Gives headers to store once the body's last byte has been read.
#[derive(Clone)]
pub struct LateHeaders(pub Arc<dyn Fn() -> Vec<(String, String)> + Send + Sync>);

impl std::fmt::Debug for LateHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LateHeaders")
    }
}

/// Most bytes of user metadata an object may carry (names and values, as
/// S3 counts them).
pub const MAX_METADATA_BYTES: usize = 2048;

/// Most bytes of Content-Type and kept headers (`Cache-Control` and the
/// rest of [`STORED_HEADERS`](crate::catalog::STORED_HEADERS), names and
/// values) an object may carry: S3 takes a PUT's headers up to 8 KB in
/// all. Every answer about the object and every listing entry carries
/// them, so they are kept small.
pub const MAX_KEPT_HEADER_BYTES: usize = 8192;

/// Checks what a writer says about an object besides its bytes: it all goes
/// back out in the headers of every answer about the object, so it must fit
/// in them, in size and in characters. (Names and values that came in as
/// headers always fit; the fields of a form upload need not.)
fn check_about(content_type: Option<&str>, metadata: &[(String, String)], headers: &[(String, String)]) -> Result<()> {
    let unfit = |what: &str| {
        StoreError::InvalidArgument(format!(
            "{what} holds a character no header may carry (a line break or another control character)"
        ))
    };
    let values = content_type.map(|v| ("Content-Type", v)).into_iter();
    let values = values.chain(headers.iter().chain(metadata).map(|(name, value)| (name.as_str(), value.as_str())));
    for (name, value) in values {
        if http::HeaderValue::from_str(value).is_err() {
            return Err(unfit(&format!("the value of {name}")));
        }
    }
    for (name, _) in metadata {
        if !name.is_empty() && http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(unfit(&format!("the metadata name {name:?}")));
        }
    }
    let pairs = |list: &[(String, String)]| list.iter().map(|(name, value)| name.len() + value.len()).sum::<usize>();
    let bytes = pairs(metadata);
    if bytes > MAX_METADATA_BYTES {
        return Err(StoreError::MetadataTooLarge(bytes));
    }
    let bytes = content_type.map_or(0, str::len) + pairs(headers);
    if bytes > MAX_KEPT_HEADER_BYTES { Err(StoreError::HeadersTooLarge(bytes)) } else { Ok(()) }
}

/// What a writer says about an object besides its bytes: what a copy gets
/// instead of its source's, and a multipart upload gives its object.
#[derive(Clone, Debug, Default)]
pub struct NewMetadata {
    /// Guessed from the key when absent.
    pub content_type: Option<String>,
    pub metadata: Vec<(String, String)>,
    /// As [`PutOptions::headers`].
    pub headers: Vec<(String, String)>,
}

/// What a put did.
#[derive(Clone, Debug)]
pub struct PutResult {
    pub record: ObjectRecord,
    /// The key existed before.
    pub replaced: bool,
    /// No new bytes were stored.
    pub deduplicated: bool,
}

/// What a body must turn out to be.
#[derive(Clone, Copy, Debug, Default)]
struct Expected {
    len: Option<u64>,
    sha256: Option<Digest>,
    md5: Option<[u8; 16]>,
    max: Option<u64>,
}

/// A body streamed into the engine and hashed, not yet kept under its
/// digest.
struct Staged {
    writer: Box<dyn BlobWriter>,
    digest: Digest,
    md5: [u8; 16],
    /// The bytes, when an object record keeps them (see
    /// [`ObjectRecord::body`]).
    body: Option<Bytes>,
}

/// A blob written and durable, not yet in the catalog.
struct Written {
    blob: BlobRef,
    md5: [u8; 16],
    body: Option<Bytes>,
    /// Keeps this node's collector away from the digest until the catalog
    /// has the reference, and `claim` other nodes' (the commit that records
    /// the reference ends it; [`Store::forget`] when there is none).
    guard: guards::Guard,
    claim: Option<ClaimId>,
}

impl Written {
    /// The record of a one-blob object holding these bytes.
    fn record(&self, key: &str, about: NewMetadata) -> ObjectRecord {
        ObjectRecord {
            key: key.to_string(),
            size: self.blob.size,
            parts: vec![Part { digest: self.blob.digest, size: self.blob.size }],
            etag: hex::encode(self.md5),
            sha256: self.blob.digest,
            content_type: content_type_for(about.content_type, key),
            modified: now_millis(),
            metadata: about.metadata,
            headers: about.headers,
            body: self.body.clone(),
        }
    }
}

/// `range` of a body already in memory, as a stream of one chunk.
fn slice_of(body: Bytes, range: ByteRange) -> ByteStream {
    let part = if range.end <= body.len() as u64 {
        Ok(body.slice(range.start as usize..range.end as usize))
    } else {
        Err(EngineError::other(
            "store",
            format!("a blob of {} bytes has no bytes {}..{}", body.len(), range.start, range.end),
        ))
    };
    Box::pin(futures::stream::once(async { part }))
}

/// Opens `within` of a blob, [mapped for a socket](BlobEngine::read_to_send)
/// if it is to be sent.
async fn open_part(engine: DynEngine, blob: BlobRef, within: ByteRange, send: bool) -> Result<ByteStream, EngineError> {
    if send { engine.read_to_send(&blob, within).await } else { engine.read(&blob, within).await }
}

/// An engine's "not found" for a blob the catalog has: lost bytes, a 500.
fn missing_bytes(e: EngineError) -> StoreError {
    match e {
        EngineError::NotFound(d) => {
            StoreError::Internal(format!("blob {d} is in the catalog but its bytes are missing"))
        }
        e => e.into(),
    }
}

/// What one pass of the collector did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Blobs that lost their last reference longer ago than the grace.
    pub dead_blobs: u64,
    /// Bytes in the engine that no catalog record pointed at.
    pub orphans: u64,
    /// Multipart uploads left incomplete for longer than the expiry.
    pub uploads_expired: u64,
    pub bytes_freed: u64,
}

/// Milliseconds on the clock of write leases: the boot-time clock, which
/// goes on while the machine is suspended, so that a lease lapses during a
/// suspend too (the monotonic clock stops).
pub fn lease_clock() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

/// Buckets, objects and blobs over one catalog and one engine.
pub struct Store {
    catalog: Arc<dyn Catalog>,
    engine: DynEngine,
    config: StoreConfig,
    guards: BlobGuards,
    /// Small blobs read lately, served without a lookup.
    hot: HotBlobs,
    /// Set after a failed sync, or by [`Store::refuse_writes`]: writes stay
    /// refused until restart, for the reason it holds.
    poisoned: std::sync::OnceLock<String>,
    /// With a shared catalog, writes are leased (see [`Store::lease_writes`]):
    /// the end of the lease on the [`lease_clock`], `u64::MAX` for none.
    lease_ends: AtomicU64,
    put_time: PutTime,
    /// Held by the collector, verification and backups, one at a time.
    maintenance: tokio::sync::Mutex<()>,
    /// The data directory's free bytes as last looked up, and when.
    free_space: parking_lot::Mutex<Option<(Instant, u64)>>,
    /// Bytes that uploads in progress claimed and have not written yet:
    /// space they will take, which the file system does not count as used.
    promised: AtomicU64,
    /// The free space tests pretend the data directory has.
    #[cfg(test)]
    fake_free: parking_lot::Mutex<Option<u64>>,
}

/// How long small uploads go by the free space last looked up (a lookup
/// costs about a microsecond, 2 % of a small PUT's CPU).
const FREE_SPACE_AGE: Duration = Duration::from_millis(100);
/// Uploads of more than this, or of unknown length, look it up afresh.
const FREE_SPACE_FRESH_OVER: u64 = 64 * 1024;
/// How far ahead of what it has written an upload claims free space.
const CLAIM_WINDOW: u64 = 8 << 20;

/// An upload's claim on the free space ([`Store::claim_space`]): up to
/// [`CLAIM_WINDOW`] bytes it will write next, which the file system does
/// not count as used yet. Settled as it writes, claimed again window by
/// window, and given back when it ends, whichever way.
struct SpaceClaim<'a> {
    store: &'a Store,
    /// Whether claims are counted: a free-space limit on a file system
    /// that holds the bytes.
    counted: bool,
    /// Claimed and not written yet.
    left: u64,
    /// Announced and not written yet; `None` when the length is unknown.
    rest: Option<u64>,
}

impl SpaceClaim<'_> {
    /// `n` more bytes written: the next window is claimed once this one
    /// is, and refused if it would take the space kept free.
    fn wrote(&mut self, n: u64) -> Result<()> {
        if !self.counted {
            return Ok(());
        }
        let settled = n.min(self.left);
        self.left -= settled;
        self.store.promised.fetch_sub(settled, Ordering::AcqRel);
        self.rest = self.rest.map(|r| r.saturating_sub(n));
        if self.left == 0 && self.rest != Some(0) {
            let window = self.rest.unwrap_or(CLAIM_WINDOW).min(CLAIM_WINDOW);
            self.store.claim(window, window, true)?;
            self.left = window;
        }
        Ok(())
    }
}

impl Drop for SpaceClaim<'_> {
    fn drop(&mut self) {
        self.store.promised.fetch_sub(self.left, Ordering::AcqRel);
    }
}

/// Where the time of uploads went, summed over every put since start:
/// streaming the bytes into the engine (hashing included) and registering
/// them in the catalog, the split the seed write-ups measured.
#[derive(Debug, Default)]
struct PutTime {
    bytes_ns: AtomicU64,
    catalog_ns: AtomicU64,
}

/// Seconds spent on uploads since start, by phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct PutSeconds {
    pub bytes: f64,
    pub catalog: f64,
}

/// Refuses a listing's prefix, marker or delimiter that holds a NUL
/// character, which no key does (and a PostgreSQL text cannot).
fn check_listing(texts: &[&str]) -> Result<()> {
    match texts.iter().any(|t| t.contains('\0')) {
        true => {
            Err(StoreError::InvalidArgument("a listing's prefix, marker or delimiter holds a NUL character".into()))
        }
        false => Ok(()),
    }
}

impl Store {
    /// A store over `catalog` and `engine`; creates the default bucket.
    pub async fn open(catalog: Arc<dyn Catalog>, engine: DynEngine, config: StoreConfig) -> Result<Store> {
        for name in [DEFAULT_BUCKET, multipart::UPLOADS] {
            match catalog.create_bucket(&BucketRecord::new(name, "", false)).await {
                Ok(()) | Err(CatalogError::BucketExists(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Store {
            catalog,
            engine,
            config,
            guards: BlobGuards::default(),
            hot: HotBlobs::default(),
            poisoned: std::sync::OnceLock::new(),
            lease_ends: AtomicU64::new(u64::MAX),
            put_time: PutTime::default(),
            maintenance: tokio::sync::Mutex::new(()),
            free_space: parking_lot::Mutex::new(None),
            promised: AtomicU64::new(0),
            #[cfg(test)]
            fake_free: parking_lot::Mutex::new(None),
        })
    }

    /// Where the time of uploads went since start.
    pub fn put_seconds(&self) -> PutSeconds {
        let secs = |n: &AtomicU64| n.load(Ordering::Relaxed) as f64 / 1e9;
        PutSeconds { bytes: secs(&self.put_time.bytes_ns), catalog: secs(&self.put_time.catalog_ns) }
    }

    /// What the cache of small bodies did since start, and holds.
    pub fn hot_stats(&self) -> HotStats {
        self.hot.stats()
    }

    pub fn engine(&self) -> &dyn BlobEngine {
        self.engine.as_ref()
    }

    /// Longest key this store accepts, in bytes.
    pub fn max_key_bytes(&self) -> usize {
        self.config.max_key_bytes
    }

    /// Checks a key against the rules of [`names::check_key`] and this
    /// store's length limit: for keys being written.
    pub fn check_key(&self, key: &str) -> Result<()> {
        let max = self.config.max_key_bytes;
        names::check_key(key, max)
            .map_err(|m| if key.len() > max { StoreError::KeyTooLong(m) } else { StoreError::InvalidKey(m) })
    }

    /// Checks a key that is read or deleted: the length limit is left
    /// out, so keys stored under a higher limit stay reachable.
    pub fn check_stored_key(&self, key: &str) -> Result<()> {
        names::check_key(key, usize::MAX).map_err(StoreError::InvalidKey)
    }

    /// The data directory the store was opened from, if any.
    pub fn data_dir(&self) -> Option<&std::path::Path> {
        self.config.data.as_deref()
    }

    pub fn catalog(&self) -> &dyn Catalog {
        self.catalog.as_ref()
    }

    /// Records a failure; a failed sync disables writes from now on.
    fn note<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(StoreError::WritesDisabled(m)) = &r
            && self.poisoned.set("an earlier sync failed; restart the server".into()).is_ok()
        {
            tracing::error!("a sync failed; refusing writes until restart: {m}");
        }
        r
    }

    /// Refuses every write from now on (503 with `why`), until restart;
    /// reads go on.
    pub fn refuse_writes(&self, why: String) {
        if self.poisoned.set(why.clone()).is_ok() {
            tracing::error!("refusing writes until restart: {why}");
        }
    }

    /// Takes writes for [`NODE_LEASE`] from `from` (a [`lease_clock`]
    /// reading taken before the catalog was asked) and no longer, unless
    /// the lease is renewed meanwhile: a node of a shared catalog renews it
    /// each time the catalog, having noted the node live, says no
    /// maintenance runs. A node the catalog has not heard from for
    /// [`NODE_LIFE`] is taken for stopped, and maintenance may then begin;
    /// a lease shorter than that has lapsed by then, so a node cut off or
    /// paused takes no write when it is back until it has looked for
    /// maintenance again.
    ///
    /// [`NODE_LEASE`]: crate::catalog::NODE_LEASE
    /// [`NODE_LIFE`]: crate::catalog::NODE_LIFE
    pub fn lease_writes(&self, from: u64) {
        let ends = from + crate::catalog::NODE_LEASE.as_millis() as u64;
        self.lease_ends.store(ends, Ordering::Relaxed);
    }

    /// Whether the lease on writes holds (or writes are not leased).
    pub fn lease_holds(&self) -> bool {
        self.lapsed_for().is_none()
    }

    /// Milliseconds since the lease on writes lapsed; `None` while it
    /// holds, and with no lease (an embedded catalog).
    fn lapsed_for(&self) -> Option<u64> {
        let ends = self.lease_ends.load(Ordering::Relaxed);
        if ends == u64::MAX {
            return None;
        }
        lease_clock().checked_sub(ends).filter(|&ago| ago > 0)
    }

    fn check_writable(&self) -> Result<()> {
        if let Some(why) = self.poisoned.get() {
            return Err(StoreError::WritesDisabled(why.clone()));
        }
        match self.lapsed_for() {
            Some(ago) => Err(StoreError::Unavailable(format!(
                "the shared catalog has not answered this node for {} s: writes wait until it does",
                ago / 1000 + crate::catalog::NODE_LEASE.as_secs()
            ))),
            None => Ok(()),
        }
    }

    // ----- buckets -----

    /// Creates a bucket owned by `owner` (an access key; empty: anyone's).
    pub async fn create_bucket(&self, name: &str, owner: &str, public_read: bool) -> Result<()> {
        names::check_new_bucket(name).map_err(StoreError::InvalidBucketName)?;
        self.check_writable()?;
        let r = self.catalog.create_bucket(&BucketRecord::new(name, owner, public_read)).await.map_err(Into::into);
        self.note(r)
    }

    pub async fn set_bucket_public(&self, name: &str, public_read: bool) -> Result<()> {
        names::check_bucket(name).map_err(StoreError::InvalidBucketName)?;
        self.check_writable()?;
        let r = self.catalog.set_bucket_public(name, public_read).await.map_err(Into::into);
        self.note(r)
    }

    pub async fn delete_bucket(&self, name: &str) -> Result<()> {
        names::check_bucket(name).map_err(StoreError::InvalidBucketName)?;
        self.check_writable()?;
        let r = self.catalog.delete_bucket(name).await.map_err(Into::into);
        self.note(r)?;
        // Uploads left behind here are aborted when they expire.
        if let Err(e) = self.remove_uploads_into(name).await {
            tracing::warn!(bucket = name, error = %e, "the deleted bucket's uploads in progress stay until they expire");
        }
        Ok(())
    }

    pub async fn bucket(&self, name: &str) -> Result<BucketRecord> {
        names::check_bucket(name).map_err(StoreError::InvalidBucketName)?;
        self.catalog.bucket(name).await?.ok_or_else(|| StoreError::NoSuchBucket(name.to_string()))
    }

    /// Every bucket clients can see (not the store's own, whose names
    /// start with `_`, which no client bucket can).
    pub async fn buckets(&self) -> Result<Vec<BucketRecord>> {
        let mut all = self.catalog.buckets().await?;
        all.retain(|b| !b.name.starts_with('_'));
        Ok(all)
    }

    // ----- objects -----

    /// Stores `body` under bucket/key. The body streams through the hashes
    /// into the engine; nothing is visible until the bytes are durable and
    /// the catalog has committed.
    pub async fn put<S, E>(&self, bucket: &str, key: &str, body: S, opts: PutOptions) -> Result<PutResult>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        self.check_key(key)?;
        check_about(opts.content_type.as_deref(), &opts.metadata, &opts.headers)?;
        self.put_unchecked(bucket, key, body, opts, None).await
    }

    /// [`Store::put`] into any bucket, the store's own included, with
    /// `along` (a record and its own precondition) committed in the same
    /// transaction.
    async fn put_unchecked<S, E>(
        &self,
        bucket: &str,
        key: &str,
        body: S,
        opts: PutOptions,
        along: Option<ObjectPut>,
    ) -> Result<PutResult>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        self.check_writable()?;
        if self.catalog.bucket(bucket).await?.is_none() {
            return Err(StoreError::NoSuchBucket(bucket.to_string()));
        }
        if opts.precondition != Precondition::default() {
            // Fail before streaming when we already know; the catalog checks
            // again inside its transaction.
            let current = self.catalog.get_object(bucket, key).await?;
            if !opts.precondition.check(current.as_ref()) {
                return Err(StoreError::PreconditionFailed);
            }
        }
        let started = Instant::now();
        let expected = Expected {
            len: opts.content_length,
            sha256: opts.expected_sha256,
            md5: opts.expected_md5,
            max: opts.max_length,
        };
        let written = self.note(self.write_blob(body, expected, true).await)?;
        let registering = Instant::now();
        self.put_time.bytes_ns.fetch_add((registering - started).as_nanos() as u64, Ordering::Relaxed);
        let mut headers = opts.headers;
        if let Some(LateHeaders(late)) = &opts.late_headers {
            headers.extend(late());
        }
        let about = NewMetadata { content_type: opts.content_type, metadata: opts.metadata, headers };
        let mut record = written.record(key, about);
        if let Some(modified) = opts.modified {
            // 0 means undated (a blob served by its address): the epoch
            // itself is kept as its first millisecond.
            record.modified = modified.max(1);
        }
        let put = ObjectPut {
            bucket: bucket.to_string(),
            record: record.clone(),
            blobs: vec![written.blob.clone()],
            precondition: opts.precondition,
        };
        // An engine's finish can outlast a claim (an S3 engine copies a
        // large object into place): one that lapsed meanwhile fails the
        // commit, as a collector may have taken a dead blob of the content
        // since.
        let puts = std::iter::once(put).chain(along).collect();
        let recorded = self.commit(puts, written.claim.as_slice()).await;
        let outcome = recorded.and_then(|outcomes| {
            outcomes.into_iter().next().ok_or_else(|| StoreError::Internal("the catalog answered no put".into()))
        });
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(e) => {
                // Refused (a precondition lost to another writer, the bucket
                // gone) or failed.
                self.forget(written).await;
                return Err(e);
            }
        };
        self.put_time.catalog_ns.fetch_add(registering.elapsed().as_nanos() as u64, Ordering::Relaxed);
        // The commit ended the claim; the collector here may take the
        // digest again.
        drop(written);
        self.drop_redundant(&outcome.redundant).await;
        Ok(PutResult { record, replaced: outcome.replaced.is_some(), deduplicated: outcome.deduplicated })
    }

    /// Writes bucket/key as a copy of `source`: the same blobs, referenced
    /// once more, no byte read or written. `replace` gives a new content
    /// type and metadata; without it the source's are kept.
    pub async fn copy(
        &self,
        source: &ObjectRecord,
        bucket: &str,
        key: &str,
        replace: Option<NewMetadata>,
        precondition: Precondition,
    ) -> Result<PutResult> {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        self.check_key(key)?;
        self.check_writable()?;
        let mut record = ObjectRecord { key: key.to_string(), modified: now_millis(), ..source.clone() };
        if let Some(new) = replace {
            check_about(new.content_type.as_deref(), &new.metadata, &new.headers)?;
            record.content_type = content_type_for(new.content_type, key);
            record.metadata = new.metadata;
            let checksum = record.checksum().map(|(n, v)| (n.to_string(), v.to_string()));
            record.headers = new.headers;
            record.headers.extend(checksum);
        }
        // A copy brings no bytes: its blobs are held from the collectors, as
        // a writer's are, until their new references are recorded, or the
        // source's being deleted meanwhile could let them go under the copy.
        let missing = |d| StoreError::NoSuchKey(format!("{} (its bytes {d} are gone)", source.key));
        let (_guards, claims, blobs) = self.hold_blobs(&record.parts, missing).await?;
        let put = ObjectPut { bucket: bucket.to_string(), record: record.clone(), blobs, precondition };
        let outcome = self.commit_held(vec![put], &claims).await?.pop();
        let outcome = outcome.ok_or_else(|| StoreError::Internal("the catalog answered no put".into()))?;
        Ok(PutResult { record, replaced: outcome.replaced.is_some(), deduplicated: true })
    }

    /// [`Store::hold`] for each blob of `parts`, and their stored blobs
    /// ([`Store::blob_refs`]): for a record about to reference blobs
    /// already stored.
    async fn hold_blobs(
        &self,
        parts: &[Part],
        missing: impl Fn(Digest) -> StoreError,
    ) -> Result<(Vec<guards::Guard>, Vec<ClaimId>, Vec<BlobRef>)> {
        let (held, claims) = self.hold(&distinct(parts)).await?;
        match self.blob_refs(parts, missing).await {
            Ok(blobs) => Ok((held, claims, blobs)),
            Err(e) => {
                self.release(&claims).await;
                Err(e)
            }
        }
    }

    /// Commits `puts`, which end `claims` ([`Store::hold_blobs`]), or
    /// releases them.
    async fn commit_held(&self, puts: Vec<ObjectPut>, claims: &[ClaimId]) -> Result<Vec<crate::catalog::PutOutcome>> {
        let committed = self.commit(puts, claims).await;
        if committed.is_err() {
            self.release(claims).await;
        }
        committed
    }

    /// Commits `puts`, which end `claims`
    /// ([`Catalog::put_objects_claimed`]), if writes are still taken: what
    /// came before (a body streamed, holds waited on collectors, parts read
    /// back) may have taken minutes, and a sync failed, maintenance begun
    /// or a lease lapsed meanwhile.
    async fn commit(&self, puts: Vec<ObjectPut>, claims: &[ClaimId]) -> Result<Vec<crate::catalog::PutOutcome>> {
        self.check_writable()?;
        self.note(self.catalog.put_objects_claimed(puts, claims).await.map_err(Into::into))
    }

    /// Holds each of `digests` from this node's collector and claims it
    /// from the other nodes', waiting for a delete of one in progress to
    /// end: for a writer about to reference their bytes. One guard per
    /// digest, and one claim per digest in order, or none from a catalog
    /// that makes none.
    async fn hold(&self, digests: &[Digest]) -> Result<(Vec<guards::Guard>, Vec<ClaimId>)> {
        let mut held = Vec::with_capacity(digests.len());
        for digest in digests {
            // A delete of the content that hangs in the engine holds it as
            // long.
            let guard = tokio::time::timeout(DELETE_TIMEOUT, self.guards.writing(*digest)).await.map_err(|_| {
                StoreError::Unavailable(format!(
                    "the same content ({digest}) is being deleted, and that is slow: try again"
                ))
            })?;
            held.push(guard);
        }
        let claims = self.catalog.claim_blobs(digests).await?;
        Ok((held, claims))
    }

    /// The stored blobs of `parts`, each once, for a record that refers to
    /// blobs already in the catalog; `missing` names a blob that is not.
    async fn blob_refs(&self, parts: &[Part], missing: impl Fn(Digest) -> StoreError) -> Result<Vec<BlobRef>> {
        let digests = distinct(parts);
        let blobs = self.catalog.get_blobs(&digests).await?;
        digests.iter().zip(blobs).map(|(d, b)| b.map(|b| b.blob_ref()).ok_or_else(|| missing(*d))).collect()
    }

    /// Claims the space an upload of `len` bytes will take next, refusing
    /// it if the whole of it would leave less than `min_free_space` free on
    /// the data directory's file system, counting what uploads in progress
    /// have claimed. The body counts where the engine keeps it there. Only
    /// a window is claimed at a time ([`SpaceClaim::wrote`]), so an upload
    /// that trickles in holds little; one of unknown length claims window
    /// by window.
    fn claim_space(&self, len: Option<u64>) -> Result<SpaceClaim<'_>> {
        let local = self.config.engine.as_ref().is_some_and(|(kind, _)| kind.is_embedded());
        let counted = local && self.config.data.is_some() && self.config.min_free_space > 0;
        let window = match len {
            _ if !counted => 0,
            Some(n) => n.min(CLAIM_WINDOW),
            None => CLAIM_WINDOW,
        };
        // Where the bytes are kept elsewhere, the space kept is still
        // checked: the catalog grows here.
        let needed = if counted { len.unwrap_or(CLAIM_WINDOW) } else { 0 };
        self.claim(needed, window, len.is_none_or(|n| n > FREE_SPACE_FRESH_OVER))?;
        Ok(SpaceClaim { store: self, counted, left: window, rest: len })
    }

    /// Claims `window` bytes if `needed` fit in the free space less what is
    /// kept free and what is claimed; `fresh` looks the free space up anew
    /// rather than trusting a look of the last [`FREE_SPACE_AGE`].
    fn claim(&self, needed: u64, window: u64, fresh: bool) -> Result<()> {
        let (Some(data), keep) = (&self.config.data, self.config.min_free_space) else {
            return Ok(());
        };
        if keep == 0 {
            return Ok(());
        }
        let Some(free) = self.free_space(data, fresh) else {
            // Not known: let the upload go, but count its window all the
            // same, as the claim that holds it will give it back.
            self.promised.fetch_add(window, Ordering::AcqRel);
            return Ok(());
        };
        let fits = |promised: u64| free >= keep.saturating_add(promised).saturating_add(needed);
        let Err(promised) =
            self.promised.fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| fits(p).then(|| p + window))
        else {
            return Ok(());
        };
        let pending = match promised {
            0 => String::new(),
            p => format!(" (uploads in progress will take {} of it)", indicatif::HumanBytes(p)),
        };
        Err(StoreError::LowSpace(format!(
            "not enough space: {} free on the data directory's file system{pending}, and uploads leave {} \
             free (--min-free-space) for deletes to go on; delete objects or add space",
            indicatif::HumanBytes(free),
            indicatif::HumanBytes(keep)
        )))
    }

    /// The data directory's free bytes, or `None` when the file system
    /// does not say.
    fn free_space(&self, data: &std::path::Path, fresh: bool) -> Option<u64> {
        #[cfg(test)]
        if let Some(free) = *self.fake_free.lock() {
            return Some(free);
        }
        let mut last = self.free_space.lock();
        match *last {
            Some((at, free)) if !fresh && at.elapsed() < FREE_SPACE_AGE => Some(free),
            _ => {
                let fs = rustix::fs::statvfs(data).ok()?;
                let free = fs.f_bavail.saturating_mul(fs.f_frsize);
                *last = Some((Instant::now(), free));
                Some(free)
            }
        }
    }

    /// Streams a body into a new blob, hashing as it goes; `synced` false
    /// leaves the blob's durability to the engine's next sync.
    async fn write_blob<S, E>(&self, body: S, expected: Expected, synced: bool) -> Result<Written>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let staged = self.stage_blob(body, expected).await?;
        let (mut guards, claims) = match self.hold(&[staged.digest]).await {
            Ok(held) => held,
            Err(e) => {
                staged.writer.abort().await;
                return Err(e);
            }
        };
        let guard = guards.pop().expect("one guard a digest");
        self.settle(staged, guard, claims.first().copied(), synced).await
    }

    /// Streams a body into the engine, hashing as it goes, and checks it
    /// against what it must be; [`Store::settle`] then keeps it.
    async fn stage_blob<S, E>(&self, mut body: S, expected: Expected) -> Result<Staged>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        let max = expected.max.unwrap_or(u64::MAX);
        if let Some(n) = expected.len.filter(|n| *n > max) {
            return Err(StoreError::EntityTooLarge(format!("a body of {n} bytes; at most {max} are allowed")));
        }
        let mut space = self.claim_space(expected.len)?;
        let mut writer = self.engine.writer(expected.len).await?;
        let mut hashes = hashes::BodyHashes::new();
        let mut read = 0;
        let mut small = BytesMut::new();
        let failure = loop {
            match body.next().await {
                None => break None,
                Some(Err(e)) => break Some(StoreError::Body(e.to_string())),
                Some(Ok(chunk)) => {
                    let len = chunk.len() as u64;
                    read += len;
                    // Past its declared length, a body is refused at once:
                    // its free space was claimed for that length alone.
                    if let Some(n) = expected.len
                        && read > n
                    {
                        break Some(StoreError::IncompleteBody { expected: n, got: read });
                    }
                    if read > max {
                        break Some(StoreError::EntityTooLarge(format!(
                            "the body is longer than the {max} bytes allowed"
                        )));
                    }
                    hashes.update(&chunk).await;
                    if read <= BODY_IN_RECORD {
                        small.extend_from_slice(&chunk);
                    }
                    if let Err(e) = writer.write(chunk).await {
                        break Some(e.into());
                    }
                    if let Err(e) = space.wrote(len) {
                        break Some(e);
                    }
                }
            }
        };
        drop(space);
        let (digest, md5, size) = hashes.finish().await?;
        let failure = failure.or_else(|| match expected {
            Expected { len: Some(n), .. } if n != size => Some(StoreError::IncompleteBody { expected: n, got: size }),
            Expected { sha256: Some(e), .. } if e != digest => {
                Some(StoreError::BadDigest { hash: "SHA-256", declared: e.to_hex(), actual: digest.to_hex() })
            }
            Expected { md5: Some(e), .. } if e != md5 => {
                Some(StoreError::BadDigest { hash: "MD5", declared: hex::encode(e), actual: hex::encode(md5) })
            }
            _ => None,
        });
        if let Some(e) = failure {
            writer.abort().await;
            return Err(e);
        }
        let body = (size <= BODY_IN_RECORD).then(|| small.freeze());
        Ok(Staged { writer, digest, md5, body })
    }

    /// Makes a staged blob durable under its digest (`synced` false: at
    /// the engine's next sync), once its digest is held (`guard`, and
    /// `claim` unless the catalog makes none) from the collectors.
    async fn settle(
        &self,
        staged: Staged,
        guard: guards::Guard,
        claim: Option<ClaimId>,
        synced: bool,
    ) -> Result<Written> {
        let Staged { writer, digest, md5, body } = staged;
        let finished = if synced { writer.finish(digest).await } else { writer.finish_unsynced(digest).await };
        // The engine may have put these bytes in place of damaged ones a
        // read kept.
        self.hot.forget(&digest);
        match finished {
            Ok(blob) => Ok(Written { blob, md5, body, guard, claim }),
            Err(e) => {
                self.release(claim.as_slice()).await;
                Err(e.into())
            }
        }
    }

    async fn release(&self, claims: &[ClaimId]) {
        if claims.is_empty() {
            return;
        }
        if let Err(e) = self.catalog.release_claims(claims).await {
            tracing::warn!("could not release claims on blobs (they lapse by themselves): {e}");
        }
    }

    /// Deletes a blob that has had no reference for `grace`
    /// ([`Catalog::remove_dead_blob`]), unless a writer (here or on another
    /// node) or a reader here holds its digest. Whether it did. Readers on
    /// other nodes make no claims: a download still running there when the
    /// grace period has passed since its object went can lose its bytes.
    async fn collect_dead(&self, blob: &BlobRecord, grace: Option<Duration>) -> Result<bool> {
        let Some(hold) = self.guards.collecting(blob.digest) else {
            return Ok(false);
        };
        if !self.catalog.remove_dead_blob(&blob.digest, grace).await? {
            return Ok(false);
        }
        self.delete_bytes(&blob.blob_ref(), hold, false).await?;
        Ok(true)
    }

    /// Deletes bytes no catalog record points at, unless a writer (here or
    /// on another node) or a reader here holds their digest. Whether it
    /// did.
    async fn drop_if_orphan(&self, blob: &BlobRef) -> Result<bool> {
        let Some(hold) = self.guards.collecting(blob.digest) else {
            return Ok(false);
        };
        // Begun in the delete's own task: a caller cancelled between the
        // catalog's mark and its end (its client gone) would leave the mark
        // to lapse, every node's writers of the content waiting on it.
        self.delete_bytes(blob, hold, true).await
    }

    /// Deletes bytes the catalog gave up ([`Catalog::remove_dead_blob`], or
    /// [`Catalog::begin_delete`], asked here first with `begin`) while
    /// `hold` keeps this node's writers and readers of the digest waiting,
    /// then lets writers on other nodes go on; returns whether they went.
    ///
    /// The delete runs to its end whoever waits for it, and the hold lasts
    /// until it has: an engine's delete can land after its caller stopped
    /// waiting (the local engines' run on the blocking pool), and a writer
    /// let in before then could store the same content only to have it
    /// removed. A delete that takes too long fails its caller; writers here
    /// wait on (see [`Store::hold`]), and other nodes' writers wait for the
    /// catalog's mark, which ends when the delete does, or lapses (an end
    /// after that removes no mark another node made since).
    async fn delete_bytes(&self, blob: &BlobRef, hold: guards::Guard, begin: bool) -> Result<bool> {
        let (engine, catalog, blob) = (self.engine.clone(), self.catalog.clone(), blob.clone());
        let digest = blob.digest;
        let delete = tokio::spawn(
            async move {
                if begin && !catalog.begin_delete(&blob).await? {
                    return Ok(false);
                }
                let deleted = engine.delete(&blob).await;
                let ended = catalog.end_delete(&blob.digest).await;
                drop(hold);
                ended?;
                deleted?;
                Ok::<_, StoreError>(true)
            }
            .in_current_span(),
        );
        match tokio::time::timeout(DELETE_TIMEOUT, delete).await {
            Err(_) => Err(StoreError::Unavailable(format!("deleting blob {digest} took too long"))),
            Ok(Err(e)) => Err(StoreError::Internal(format!("deleting blob {digest} failed: {e}"))),
            Ok(Ok(deleted)) => deleted,
        }
    }

    /// Gives up bytes written for a write that will not be recorded: they
    /// go, unless the catalog shows a record for them after all (a commit
    /// whose answer was lost) or another writer holds them.
    async fn forget(&self, written: Written) {
        // The collector, here and on the other nodes, may take the digest
        // again.
        let Written { blob, guard, claim, .. } = written;
        drop(guard);
        self.release(claim.as_slice()).await;
        if let Err(e) = self.drop_if_orphan(&blob).await {
            tracing::warn!("could not remove the bytes of an unrecorded write {}: {e}", blob.digest);
        }
    }

    /// Deletes bytes the catalog said it already had under another
    /// locator, unless a writer holds them (they are then a leftover for
    /// the collector).
    async fn drop_redundant(&self, redundant: &[BlobRef]) {
        for blob in redundant {
            if let Err(e) = self.drop_if_orphan(blob).await {
                tracing::warn!("could not delete a redundant copy of {}: {e}", blob.digest);
            }
        }
    }

    /// The record of bucket/key.
    pub async fn head(&self, bucket: &str, key: &str) -> Result<ObjectRecord> {
        self.check_stored_key(key)?;
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        self.catalog.get_object(bucket, key).await?.ok_or_else(|| StoreError::NoSuchKey(key.to_string()))
    }

    /// Streams `range` of an object's body, across its parts, to be read
    /// in this process.
    pub async fn read(&self, record: &ObjectRecord, range: ByteRange) -> Result<ByteStream> {
        self.read_parts(record, range, false).await
    }

    /// [`Store::read`] for an answer on a socket: chunks of files may come
    /// [`mapped`](crate::engine::mapped), which only the socket's writer
    /// may be given (see there).
    pub async fn read_to_send(&self, record: &ObjectRecord, range: ByteRange) -> Result<ByteStream> {
        self.read_parts(record, range, true).await
    }

    async fn read_parts(&self, record: &ObjectRecord, range: ByteRange, send: bool) -> Result<ByteStream> {
        if range.is_empty() {
            return Ok(Box::pin(futures::stream::empty()));
        }
        if let Some(body) = record.kept_body() {
            return Ok(slice_of(body.clone(), range));
        }
        let mut pieces = Vec::new();
        let mut at = 0u64;
        for part in &record.parts {
            let (start, end) = (at, at + part.size);
            at = end;
            if end <= range.start || start >= range.end {
                continue;
            }
            let within = ByteRange { start: range.start.max(start) - start, end: range.end.min(end) - start };
            pieces.push((part.digest, within));
        }
        if let [(digest, within)] = pieces.as_slice()
            && let Some(body) = self.hot.get(digest)
        {
            return Ok(slice_of(body, *within));
        }
        let digests: Vec<Digest> = pieces.iter().map(|(d, _)| *d).collect();
        let blobs = self.catalog.get_blobs(&digests).await?;
        let mut refs = Vec::with_capacity(pieces.len());
        for ((digest, within), blob) in pieces.into_iter().zip(blobs) {
            let blob =
                blob.ok_or_else(|| StoreError::Internal(format!("blob {digest} of an object is not in the catalog")))?;
            refs.push((blob.blob_ref(), within));
        }
        if let [(blob, within)] = refs.as_slice()
            && blob.size <= hot::LARGEST
        {
            let began = self.hot.read_begins(&blob.digest);
            let whole = self.read_blob_range(blob, ByteRange::full(blob.size)).await?;
            let body = self.hot.fill(blob.digest, blob.size, began, whole).await.map_err(missing_bytes)?;
            return Ok(slice_of(body, *within));
        }
        // A long download may outlive its object: the collector leaves the
        // blobs alone until the last byte is sent.
        let mut held = Vec::with_capacity(refs.len());
        for (blob, _) in &refs {
            held.push(self.guards.reading(blob.digest).await);
        }
        // The first part opens before the answer starts, so an engine that
        // cannot read fails the request with a status rather than cutting a
        // body after its 200; the other parts open as the body reaches them.
        let mut refs = refs.into_iter();
        let Some((first, within)) = refs.next() else {
            return Ok(Box::pin(futures::stream::empty()));
        };
        let mut stream = open_part(self.engine.clone(), first, within, send).await.map_err(missing_bytes)?;
        if refs.len() > 0 {
            let engine = self.engine.clone();
            let rest = futures::stream::iter(refs)
                .then(move |(blob, within)| open_part(engine.clone(), blob, within, send))
                .try_flatten();
            stream = Box::pin(stream.chain(rest));
        }
        Ok(holding(stream, held))
    }

    /// `stream`, holding the collector off every blob of `record` until it
    /// goes: for an answer that reads the object range by range, each range
    /// holding only its own blobs while it is read.
    pub async fn holding_blobs_of(&self, record: &ObjectRecord, stream: ByteStream) -> ByteStream {
        let mut held = Vec::new();
        for digest in distinct(record.parts_to_read()) {
            held.push(self.guards.reading(digest).await);
        }
        holding(stream, held)
    }

    async fn read_blob_range(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        self.engine.read(blob, range).await.map_err(missing_bytes)
    }

    pub async fn delete(&self, bucket: &str, key: &str, precondition: &Precondition) -> Result<ObjectRecord> {
        self.check_stored_key(key)?;
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        self.check_writable()?;
        let r = self.catalog.delete_object(bucket, key, precondition).await.map_err(Into::into);
        self.note(r)?.ok_or_else(|| StoreError::NoSuchKey(key.to_string()))
    }

    pub async fn list(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        check_listing(&[
            &query.prefix,
            query.after.as_deref().unwrap_or(""),
            query.delimiter.as_deref().unwrap_or(""),
        ])?;
        Ok(self.catalog.list_objects(bucket, query).await?)
    }

    // ----- batches -----

    /// The records of many keys at once, and of their blobs (but for
    /// records that carry their bodies). A key or a content named more than
    /// once is looked up and held once.
    pub async fn get_many(&self, bucket: &str, keys: &[String]) -> Result<Found> {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        let mut first = HashMap::with_capacity(keys.len());
        let entries: Vec<usize> = keys
            .iter()
            .map(|k| {
                let next = first.len();
                *first.entry(k.as_str()).or_insert(next)
            })
            .collect();
        let records = if first.len() == keys.len() {
            self.catalog.get_objects(bucket, keys).await?
        } else {
            let mut distinct = vec![String::new(); first.len()];
            for (key, at) in first {
                distinct[at] = key.to_string();
            }
            self.catalog.get_objects(bucket, &distinct).await?
        };
        let (mut digests, mut at) = (Vec::new(), HashMap::new());
        let objects: Vec<Option<(ObjectRecord, Vec<usize>)>> = records
            .into_iter()
            .map(|record| {
                record.map(|r| {
                    let blobs = (r.parts_to_read().iter())
                        .map(|p| {
                            *at.entry(p.digest).or_insert_with(|| {
                                digests.push(p.digest);
                                digests.len() - 1
                            })
                        })
                        .collect();
                    (r, blobs)
                })
            })
            .collect();
        // As for a single GET's parts: the collector leaves the blobs alone
        // until the answer has sent them (not only from when it reads them:
        // a batch looks windows up well ahead of sending them).
        let held = self.guards.reading_all(&digests).await;
        let blobs = self.catalog.get_blobs(&digests).await?;
        if let Some(lost) = blobs.iter().position(Option::is_none) {
            let key = objects.iter().flatten().find(|(_, b)| b.contains(&lost)).map(|(r, _)| r.key.as_str());
            return Err(StoreError::Internal(format!("a blob of {:?} is missing", key.unwrap_or_default())));
        }
        Ok(Found { entries, objects, blobs: blobs.into_iter().flatten().collect(), _held: held })
    }

    /// Reads a whole blob given its record: for batch answers.
    pub async fn read_blob(&self, blob: &BlobRecord) -> Result<ByteStream> {
        // As for an object's parts: the collector leaves the blob alone
        // until the stream goes.
        let held = self.guards.reading(blob.digest).await;
        let stream = self.read_blob_range(&blob.blob_ref(), ByteRange::full(blob.size)).await?;
        Ok(holding(stream, held))
    }

    /// Many small blobs whole, in order, in as few engine calls as the
    /// engine allows: for batch answers.
    pub async fn read_small<'a>(&self, blobs: impl IntoIterator<Item = &'a BlobRecord>) -> Result<Vec<Bytes>> {
        let refs: Vec<BlobRef> = blobs.into_iter().map(BlobRecord::blob_ref).collect();
        self.engine.read_small(&refs).await.map_err(missing_bytes)
    }

    /// Starts a batch of puts that commit together.
    pub fn batch(&self, bucket: &str) -> Result<PutBatch<'_>> {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        self.check_writable()?;
        Ok(PutBatch {
            store: self,
            bucket: bucket.to_string(),
            staged: Vec::new(),
            staged_bytes: 0,
            puts: Vec::new(),
            written: Vec::new(),
            renewed: Instant::now(),
        })
    }

    pub async fn delete_many(&self, bucket: &str, keys: &[String]) -> Result<Vec<bool>> {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        for key in keys {
            self.check_stored_key(key)?;
        }
        self.check_writable()?;
        let r = self.catalog.delete_objects(bucket, keys, &Precondition::default()).await.map_err(Into::into);
        Ok(self.note(r)?.iter().map(Option::is_some).collect())
    }

    // ----- blobs and maintenance -----

    pub async fn blob(&self, digest: &Digest) -> Result<BlobRecord> {
        self.catalog.get_blob(digest).await?.ok_or_else(|| StoreError::NoSuchBlob(digest.to_hex()))
    }

    pub async fn stats(&self) -> Result<CatalogStats> {
        Ok(self.catalog.stats().await?)
    }

    /// Aborts multipart uploads older than the expiry, removes blobs
    /// unreferenced for longer than the grace period, then
    /// bytes in the engine that the catalog does not know and that are
    /// older than the grace period (left by a crash between write and
    /// commit).
    ///
    /// Refused after a failed sync, like any write: the catalog's state in
    /// memory may not be what a restart finds, and collecting by it could
    /// delete bytes that the restarted catalog still refers to.
    pub async fn gc(&self) -> Result<GcReport> {
        self.check_writable()?;
        // A sync the pass saw fail refuses every later write, as one a
        // request saw does: a later pass would otherwise act on the state
        // in memory.
        let r = self.collect_garbage().await;
        self.note(r)
    }

    async fn collect_garbage(&self) -> Result<GcReport> {
        let _maintenance = self.maintenance.lock().await;
        // Staged parts of writes that died with their server connection
        // (their cleanup could not reach it) go once they are old enough.
        self.engine.remove_abandoned().await?;
        let mut report = GcReport::default();
        // Expired uploads first: the blobs they release join the dead ones.
        let expiry = to_millis(std::time::UNIX_EPOCH + self.config.upload_expiry);
        report.uploads_expired = self.expire_uploads(now_millis().saturating_sub(expiry)).await?;
        let grace = self.config.gc_grace;
        // The oldest dead blobs come first, and those held (read, or
        // claimed by a writer) come again every time: a window they fill
        // widens, so that the dead behind them are reached.
        let mut window = 512;
        loop {
            let dead = self.catalog.dead_blobs(grace, window).await?;
            let full = dead.len() == window;
            let mut progressed = false;
            for blob in dead {
                // A pass can be long: writes (a collection is one) may have
                // been refused since it began.
                self.check_writable()?;
                if self.collect_dead(&blob, Some(grace)).await? {
                    report.dead_blobs += 1;
                    report.bytes_freed += blob.size;
                    progressed = true;
                }
            }
            if progressed {
                window = 512;
            } else if full && window < 1 << 16 {
                window = (window * 4).min(1 << 16);
            } else {
                break;
            }
        }
        let cutoff = std::time::SystemTime::now() - self.config.gc_grace;
        for info in self.engine.list().await? {
            if info.modified > cutoff {
                continue;
            }
            self.check_writable()?;
            if self.drop_if_orphan(&info.blob_ref()).await? {
                report.orphans += 1;
                report.bytes_freed += info.size;
            }
        }
        Ok(report)
    }
}

/// Puts collected one by one (each body streamed to the engine as it
/// arrives) and committed to the catalog in one transaction.
pub struct PutBatch<'a> {
    store: &'a Store,
    bucket: String,
    /// Bodies streamed, waiting to be held from the collectors and kept
    /// together ([`PutBatch::settle`]), with their keys.
    staged: Vec<(String, Staged)>,
    /// How many bytes `staged` holds.
    staged_bytes: u64,
    puts: Vec<ObjectPut>,
    /// The bytes of each put, held from the collector until the commit.
    written: Vec<Written>,
    /// When the claims of `written` were last renewed: a batch can stream
    /// for longer than a claim lasts (see [`Catalog::renew_claims`]).
    renewed: Instant,
}

/// How often a batch renews the claims on the bytes it holds, well within
/// their life.
const RENEW_CLAIMS: Duration = Duration::from_secs(60);

/// How many bodies, and how many bytes of them, a batch stages before it
/// holds and keeps them together: one claim on a shared catalog for them
/// all, where one each took most of a 10,000-entry batch's time. Few
/// enough that the open files of staged bodies (an `fs` engine stages each
/// in a file of its own, with a buffer) stay well within the process's
/// descriptors when many batches run at once.
const SETTLE_ENTRIES: usize = 64;
const SETTLE_BYTES: u64 = 8 << 20;

impl PutBatch<'_> {
    pub async fn add<S, E>(&mut self, key: &str, len: u64, body: S) -> Result<()>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        self.store.check_key(key)?;
        if self.renewed.elapsed() >= RENEW_CLAIMS {
            self.renew_claims().await?;
        }
        let expected = Expected { len: Some(len), ..Expected::default() };
        // Renewed while the body streams too, however long it takes: a claim
        // that lapsed meanwhile would fail the whole batch at its commit.
        let (store, claims) = (self.store, self.claims());
        let renewing = async {
            if claims.is_empty() {
                return std::future::pending::<Result<()>>().await;
            }
            loop {
                tokio::time::sleep(RENEW_CLAIMS).await;
                store.catalog.renew_claims(&claims).await?;
            }
        };
        let staged = tokio::select! {
            staged = store.stage_blob(body, expected) => store.note(staged)?,
            Err(e) = renewing => return Err(e),
        };
        self.staged.push((key.to_string(), staged));
        self.staged_bytes += len;
        if self.staged.len() >= SETTLE_ENTRIES || self.staged_bytes >= SETTLE_BYTES {
            self.settle().await?;
        }
        Ok(())
    }

    /// Holds the staged bodies from the collectors and keeps them, to be
    /// recorded at the commit. The blobs of a batch share one sync, at
    /// commit.
    async fn settle(&mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        self.staged_bytes = 0;
        let digests: Vec<Digest> = staged.iter().map(|(_, s)| s.digest).collect();
        let (guards, claims) = match self.store.hold(&digests).await {
            Ok(held) => held,
            Err(e) => {
                abort_all(staged).await;
                return Err(e);
            }
        };
        let mut claims = claims.into_iter();
        let mut staged = staged.into_iter().zip(guards);
        while let Some(((key, body), guard)) = staged.next() {
            let written = match self.store.settle(body, guard, claims.next(), false).await {
                Ok(written) => written,
                Err(e) => {
                    abort_all(staged.map(|(staged, _)| staged)).await;
                    self.store.release(&claims.collect::<Vec<_>>()).await;
                    return self.store.note(Err(e));
                }
            };
            self.puts.push(ObjectPut {
                bucket: self.bucket.clone(),
                record: written.record(&key, NewMetadata::default()),
                blobs: vec![written.blob.clone()],
                precondition: Precondition::default(),
            });
            self.written.push(written);
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.puts.len() + self.staged.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Gives up every entry: nothing is recorded, and their bytes go.
    pub async fn abandon(self) {
        abort_all(self.staged).await;
        for written in self.written {
            self.store.forget(written).await;
        }
    }

    /// Commits every entry, or none; how many were stored.
    pub async fn commit(mut self) -> Result<usize> {
        let recorded = self.record().await;
        match recorded {
            Ok(outcomes) => {
                // The commit ended the claims.
                drop(self.written);
                for o in &outcomes {
                    self.store.drop_redundant(&o.redundant).await;
                }
                Ok(outcomes.len())
            }
            Err(e) => {
                self.abandon().await;
                Err(e)
            }
        }
    }

    fn claims(&self) -> Vec<ClaimId> {
        self.written.iter().filter_map(|w| w.claim).collect()
    }

    /// Renews the claims on the bytes written so far; fails if one has
    /// lapsed.
    async fn renew_claims(&mut self) -> Result<()> {
        let claims = self.claims();
        if !claims.is_empty() {
            self.store.catalog.renew_claims(&claims).await?;
        }
        self.renewed = Instant::now();
        Ok(())
    }

    async fn record(&mut self) -> Result<Vec<crate::catalog::PutOutcome>> {
        self.settle().await?;
        self.store.check_writable()?;
        self.store.note(self.store.engine.sync().await.map_err(Into::into))?;
        if self.renewed.elapsed() >= RENEW_CLAIMS {
            self.renew_claims().await?;
        }
        let puts = std::mem::take(&mut self.puts);
        self.store.commit(puts, &self.claims()).await
    }
}

/// Gives up staged bodies: their bytes go.
async fn abort_all(staged: impl IntoIterator<Item = (String, Staged)>) {
    for (_, staged) in staged {
        staged.writer.abort().await;
    }
}

/// `stream`, keeping `held` (guards from the collector) until it is
/// dropped.
fn holding<T: Send + 'static>(stream: ByteStream, held: T) -> ByteStream {
    Box::pin(stream.inspect(move |_| {
        let _ = &held;
    }))
}

/// The digests of `parts`, each once, in order.
fn distinct(parts: &[Part]) -> Vec<Digest> {
    let mut digests: Vec<Digest> = parts.iter().map(|p| p.digest).collect();
    digests.sort_unstable_by_key(|d| d.0);
    digests.dedup();
    digests
}

/// The Content-Type given with an object, or when none was (or an empty
/// one, which is no media type) one from the key's extension,
/// `application/octet-stream` when that says nothing.
fn content_type_for(given: Option<String>, key: &str) -> String {
    match given {
        Some(t) if !t.trim().is_empty() => t,
        _ => mime_guess::from_path(key).first_raw().unwrap_or("application/octet-stream").to_string(),
    }
}

/// What a batch of keys names (see [`Store::get_many`]): each key's object
/// and its blobs' records. A key or a content the batch names again is
/// held once, so memory follows what is stored rather than how often a
/// batch asks for it: 4,096 keys naming one object of 10,000 parts would
/// otherwise hold 41 million part records.
pub struct Found {
    /// Per key, in order: its place in `objects`.
    entries: Vec<usize>,
    /// Per distinct key: its record and its parts' places in `blobs`.
    objects: Vec<Option<(ObjectRecord, Vec<usize>)>>,
    /// Per distinct content.
    blobs: Vec<BlobRecord>,
    /// Kept from the collector while this lives.
    _held: guards::Guards,
}

impl Found {
    /// Each key's object and its blobs' records, in the keys' order (no
    /// blobs for a record with its [body](ObjectRecord::body)); `None` for
    /// a key not stored.
    pub fn entries(&self) -> impl Iterator<Item = Option<(&ObjectRecord, impl Iterator<Item = &BlobRecord>)>> {
        self.entries.iter().map(|&at| {
            let (record, blobs) = self.objects[at].as_ref()?;
            Some((record, blobs.iter().map(|&b| &self.blobs[b])))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::rocks::RocksCatalog;
    use crate::engine::faulty::{FaultyEngine, Trigger};
    use crate::engine::memory::MemoryEngine;

    pub(super) fn body(bytes: &'static [u8]) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin {
        futures::stream::iter(vec![Ok(Bytes::from_static(bytes))])
    }

    pub(super) async fn store_over(engine: DynEngine) -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        (Store::open(catalog, engine, StoreConfig::default()).await.unwrap(), dir)
    }

    /// Bytes `start..end` of `record`'s body.
    async fn read_range(store: &Store, record: &ObjectRecord, start: u64, end: u64) -> Vec<u8> {
        let chunks: Vec<Bytes> =
            store.read(record, ByteRange { start, end }).await.unwrap().try_collect().await.unwrap();
        chunks.concat()
    }

    pub(super) async fn read_all(store: &Store, bucket: &str, key: &str) -> Vec<u8> {
        let record = store.head(bucket, key).await.unwrap();
        let mut s = store.read(&record, ByteRange::full(record.size)).await.unwrap();
        let mut out = Vec::new();
        while let Some(c) = s.try_next().await.unwrap() {
            out.extend_from_slice(&c);
        }
        out
    }

    /// Two nodes over one PostgreSQL catalog and one directory of blobs:
    /// node `b` collects bytes that were dead past the grace period while
    /// node `a` uploads them anew. `a`'s upload waits until `b`'s delete is
    /// done, so its bytes land after it: none of `a`'s bytes are lost.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_collector_on_another_node_never_deletes_bytes_just_uploaded() {
        use crate::catalog::postgres::PostgresCatalog;
        use crate::engine::fs::FsEngine;
        let url = crate::pg::fresh_test_database().await;
        let dir = tempfile::tempdir().unwrap();
        let node = || async {
            let catalog = Arc::new(PostgresCatalog::connect(&url).await.unwrap());
            let engine: DynEngine = Arc::new(FsEngine::open(dir.path()).unwrap());
            let config = StoreConfig { gc_grace: Duration::ZERO, ..StoreConfig::default() };
            Arc::new(Store::open(catalog, engine, config).await.unwrap())
        };
        let (a, b) = (node().await, node().await);
        a.create_bucket("shared", "", false).await.unwrap();
        let first = a.put("shared", "old", body(b"the same bytes, twice"), PutOptions::default()).await.unwrap();
        a.delete("shared", "old", &Precondition::default()).await.unwrap();
        let digest = first.record.sha256;
        let dead = b.catalog.get_blob(&digest).await.unwrap().unwrap();

        // `b`'s collector takes the dead blob; `a` stores the same bytes.
        assert!(b.catalog.remove_dead_blob(&digest, None).await.unwrap());
        let upload = tokio::spawn({
            let a = a.clone();
            async move { a.put("shared", "new", body(b"the same bytes, twice"), PutOptions::default()).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!upload.is_finished(), "the upload went on while another node deleted its bytes");
        b.delete_bytes(&dead.blob_ref(), b.guards.collecting(digest).unwrap(), false).await.unwrap();
        let put = tokio::time::timeout(Duration::from_secs(10), upload).await.unwrap().unwrap().unwrap();
        assert!(!put.deduplicated);
        assert_eq!(read_all(&b, "shared", "new").await, b"the same bytes, twice");
        assert_eq!(b.gc().await.unwrap(), GcReport::default());
        assert_eq!(read_all(&a, "shared", "new").await, b"the same bytes, twice");
        assert!(a.verify(false, &indicatif::ProgressBar::hidden()).await.unwrap().problems.is_empty());
    }

    /// Dead blobs held from the collector (here read; on a shared catalog
    /// also claimed by a writer) come first in every pass: a full window of
    /// them must not hide the dead behind them.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_window_of_held_dead_blobs_hides_none_behind_it() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let config = StoreConfig { gc_grace: Duration::ZERO, ..StoreConfig::default() };
        let s = Store::open(catalog, Arc::new(MemoryEngine::new()), config).await.unwrap();
        for i in 0..520 {
            let key = format!("k{i}");
            let bytes = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(format!("body {i}")))]);
            s.put("files", &key, bytes, PutOptions::default()).await.unwrap();
            s.delete("files", &key, &Precondition::default()).await.unwrap();
        }
        let first = s.catalog.dead_blobs(Duration::ZERO, 512).await.unwrap();
        let mut held = Vec::new();
        for blob in &first {
            held.push(s.guards.reading(blob.digest).await);
        }
        let report = s.gc().await.unwrap();
        assert_eq!(report.dead_blobs, 8, "the dead behind a held window were left");
        drop(held);
        assert_eq!(s.gc().await.unwrap().dead_blobs, 512);
    }

    /// A copy whose source is deleted and its blob collected meanwhile
    /// fails rather than refer to bytes that are gone: it waits for the
    /// collection in progress, then finds the blob gone.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_copy_never_refers_to_bytes_collected_under_it() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let config = StoreConfig { gc_grace: Duration::ZERO, ..StoreConfig::default() };
        let s = Arc::new(Store::open(catalog, Arc::new(MemoryEngine::new()), config).await.unwrap());
        let source = s.put("files", "source", body(b"copied while collected"), PutOptions::default()).await.unwrap();
        let source = source.record;
        let blob = s.catalog.get_blob(&source.sha256).await.unwrap().unwrap().blob_ref();
        s.delete("files", "source", &Precondition::default()).await.unwrap();
        // The collector has taken the dead blob when the copy starts.
        let collecting = s.guards.collecting(source.sha256).unwrap();
        let copy = tokio::spawn({
            let (s, source) = (s.clone(), source.clone());
            async move { s.copy(&source, "files", "copy", None, Precondition::default()).await }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!copy.is_finished(), "the copy went on while its blob was being collected");
        assert!(s.catalog.remove_dead_blob(&source.sha256, None).await.unwrap());
        s.delete_bytes(&blob, collecting, false).await.unwrap();
        let copied = copy.await.unwrap();
        assert!(matches!(copied, Err(StoreError::NoSuchKey(_))), "{copied:?}");
        assert!(matches!(s.head("files", "copy").await, Err(StoreError::NoSuchKey(_))));
        assert!(s.verify(false, &indicatif::ProgressBar::hidden()).await.unwrap().problems.is_empty());
    }

    /// A batch that outlasted the claims on its bytes (another node's
    /// collector no longer saw them) records nothing: those bytes may be
    /// gone.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_whose_claims_lapsed_is_not_recorded() {
        use crate::catalog::postgres::PostgresCatalog;
        let url = crate::pg::fresh_test_database().await;
        let catalog = Arc::new(PostgresCatalog::connect(&url).await.unwrap());
        let store = Store::open(catalog, Arc::new(MemoryEngine::new()), StoreConfig::default()).await.unwrap();
        let mut batch = store.batch("files").unwrap();
        batch.add("slow", 4, body(b"slow")).await.unwrap();
        // Kept, and claimed, as a batch's entries are after every few
        // hundred.
        batch.settle().await.unwrap();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let aged = "UPDATE depot_catalog_claims SET since = now() - interval '11 minutes'";
        assert_eq!(client.execute(aged, &[]).await.unwrap(), 1);
        assert!(matches!(batch.commit().await, Err(StoreError::Unavailable(_))));
        assert!(matches!(store.head("files", "slow").await, Err(StoreError::NoSuchKey(_))));
    }

    /// A batch holds and claims its entries a few hundred at a time: every
    /// one is recorded, and no claim outlives the commit. One given up
    /// leaves neither claims nor bytes.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_claims_its_entries_together_and_ends_every_claim() {
        use crate::catalog::postgres::PostgresCatalog;
        let url = crate::pg::fresh_test_database().await;
        let catalog = Arc::new(PostgresCatalog::connect(&url).await.unwrap());
        let engine = Arc::new(MemoryEngine::new());
        let store = Store::open(catalog, engine.clone(), StoreConfig::default()).await.unwrap();
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        let claims = || async {
            let row = client.query_one("SELECT count(*) FROM depot_catalog_claims", &[]).await.unwrap();
            row.get::<_, i64>(0) as usize
        };
        async fn add(batch: &mut PutBatch<'_>, key: String, content: String) {
            let len = content.len() as u64;
            let body = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(content))]);
            batch.add(&key, len, body).await.unwrap()
        }

        let n = SETTLE_ENTRIES * 2 + 10;
        let mut batch = store.batch("files").unwrap();
        for i in 0..n {
            add(&mut batch, format!("k{i}"), format!("entry {i}")).await;
        }
        assert_eq!(claims().await, SETTLE_ENTRIES * 2, "the entries kept so far are claimed");
        assert_eq!(batch.commit().await.unwrap(), n);
        assert_eq!(claims().await, 0);
        for i in [0, SETTLE_ENTRIES, n - 1] {
            assert_eq!(read_all(&store, "files", &format!("k{i}")).await, format!("entry {i}").as_bytes());
        }

        let mut batch = store.batch("files").unwrap();
        for i in 0..SETTLE_ENTRIES + 5 {
            add(&mut batch, format!("gone{i}"), format!("given up {i}")).await;
        }
        assert_eq!(claims().await, SETTLE_ENTRIES);
        batch.abandon().await;
        assert_eq!(claims().await, 0);
        assert_eq!(engine.list().await.unwrap().len(), n, "bytes of entries given up are left");
        assert!(matches!(store.head("files", "gone0").await, Err(StoreError::NoSuchKey(_))));
    }

    /// A write the catalog refuses (a lost race for a condition, a bucket
    /// deleted meanwhile, a failure) leaves no bytes behind.
    #[tokio::test(flavor = "multi_thread")]
    async fn bytes_of_writes_the_catalog_refuses_are_removed() {
        use crate::catalog::faulty::FaultyCatalog;
        let dir = tempfile::tempdir().unwrap();
        let rocks: Arc<dyn Catalog> = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let catalog = Arc::new(FaultyCatalog::new(rocks, 7));
        let engine: DynEngine = Arc::new(MemoryEngine::new());
        let store = Store::open(catalog.clone(), engine.clone(), StoreConfig::default()).await.unwrap();
        store.put("files", "kept", body(b"kept"), PutOptions::default()).await.unwrap();
        catalog.faults.commits.set(Trigger::Always);
        assert!(store.put("files", "refused", body(b"refused"), PutOptions::default()).await.is_err());
        let mut batch = store.batch("files").unwrap();
        batch.add("a", 1, body(b"a")).await.unwrap();
        batch.add("b", 1, body(b"b")).await.unwrap();
        assert!(batch.commit().await.is_err());
        catalog.faults.off();
        let mut batch = store.batch("files").unwrap();
        batch.add("c", 1, body(b"c")).await.unwrap();
        batch.abandon().await;
        let left: Vec<Digest> = engine.list().await.unwrap().into_iter().map(|b| b.digest).collect();
        assert_eq!(
            left,
            [Digest(<sha2::Sha256 as sha2::Digest>::digest(b"kept").into())],
            "only the recorded write's bytes"
        );
    }

    /// A collection given up on mid-delete (a timeout, a request gone)
    /// leaves the engine's delete to land later: a writer of the same
    /// content must not store its bytes before it has.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_delete_left_running_keeps_writers_of_its_content_waiting() {
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let config = StoreConfig { gc_grace: Duration::ZERO, ..StoreConfig::default() };
        let s = Store::open(catalog, faulty.clone(), config).await.unwrap();
        s.put("files", "old", body(b"deleted, then stored again"), PutOptions::default()).await.unwrap();
        s.delete("files", "old", &Precondition::default()).await.unwrap();
        *faulty.faults.delete_delay.lock() = Duration::from_secs(1);
        let gave_up = tokio::time::timeout(Duration::from_millis(200), s.gc()).await;
        assert!(gave_up.is_err(), "the collection ended before its delete landed");
        let put = s.put("files", "new", body(b"deleted, then stored again"), PutOptions::default()).await.unwrap();
        assert!(!put.deduplicated);
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(read_all(&s, "files", "new").await, b"deleted, then stored again");
        assert!(s.verify(false, &indicatif::ProgressBar::hidden()).await.unwrap().problems.is_empty());
    }

    /// A body of up to [`BODY_IN_RECORD`] bytes is read from its object's
    /// record, whole, in ranges and in batches: the engine is not asked.
    #[tokio::test(flavor = "multi_thread")]
    async fn small_bodies_are_read_from_their_records() {
        const SMALL: &[u8] = &[b's'; BODY_IN_RECORD as usize];
        const LARGER: &[u8] = &[b'l'; BODY_IN_RECORD as usize + 1];
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let (store, _dir) = store_over(faulty.clone()).await;
        for (key, bytes) in [("small", SMALL), ("larger", LARGER), ("empty", &b""[..])] {
            store.put("files", key, body(bytes), PutOptions::default()).await.unwrap();
            let record = store.head("files", key).await.unwrap();
            assert_eq!(record.body.as_deref(), (bytes.len() as u64 <= BODY_IN_RECORD).then_some(bytes), "{key}");
        }
        let source = store.head("files", "small").await.unwrap();
        let copy = store.copy(&source, "files", "copy", None, Precondition::default()).await.unwrap().record;
        assert_eq!(copy.body.as_deref(), Some(SMALL), "a copy keeps the body");

        faulty.faults.reads.set(Trigger::Always);
        assert_eq!(read_all(&store, "files", "small").await, SMALL);
        let record = store.head("files", "small").await.unwrap();
        assert_eq!(read_range(&store, &record, 10, 20).await, &SMALL[10..20]);
        let found = store.get_many("files", &["small".into(), "copy".into(), "small".into()]).await.unwrap();
        for entry in found.entries() {
            let (record, mut blobs) = entry.unwrap();
            assert_eq!((record.body.as_deref(), blobs.next()), (Some(SMALL), None));
        }
        // A larger body is read through its blob, from the failing engine.
        let record = store.head("files", "larger").await.unwrap();
        let r = store.read(&record, ByteRange::full(record.size)).await;
        assert!(matches!(r, Err(StoreError::Internal(_))), "the engine was not asked");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_sync_stops_writes_but_not_reads() {
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let (store, _dir) = store_over(faulty.clone()).await;
        store.put("files", "before", body(b"kept"), PutOptions::default()).await.unwrap();
        faulty.faults.syncs.set(Trigger::Always);
        let r = store.put("files", "during", body(b"lost"), PutOptions::default()).await;
        assert!(matches!(r, Err(StoreError::WritesDisabled(_))), "{r:?}");
        // Even once the device would work again, writes stay refused.
        faulty.faults.off();
        let r = store.put("files", "after", body(b"x"), PutOptions::default()).await;
        assert!(matches!(r, Err(StoreError::WritesDisabled(_))), "{r:?}");
        assert!(matches!(
            store.delete("files", "before", &Precondition::default()).await,
            Err(StoreError::WritesDisabled(_))
        ));
        assert_eq!(read_all(&store, "files", "before").await, b"kept");
        assert!(matches!(store.head("files", "during").await, Err(StoreError::NoSuchKey(_))));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_syncs_its_blobs_once_and_commits_nothing_when_that_fails() {
        let dir = tempfile::tempdir().unwrap();
        let hybrid = crate::engine::hybrid::HybridEngine::open(dir.path(), 1024).unwrap();
        let faulty = Arc::new(FaultyEngine::new(Arc::new(hybrid), 0));
        let (store, _catalog_dir) = store_over(faulty.clone()).await;
        let mut batch = store.batch("files").unwrap();
        batch.add("a", 1, body(b"a")).await.unwrap();
        batch.add("b", 1, body(b"b")).await.unwrap();
        assert_eq!(batch.commit().await.unwrap(), 2);
        assert_eq!(read_all(&store, "files", "b").await, b"b");
        // Adding never syncs; the commit does, and fails as a whole.
        faulty.faults.syncs.set(Trigger::Always);
        let mut batch = store.batch("files").unwrap();
        batch.add("c", 1, body(b"c")).await.unwrap();
        batch.add("d", 2000, body(&[7; 2000])).await.unwrap();
        assert!(batch.commit().await.is_err());
        for key in ["c", "d"] {
            assert!(matches!(store.head("files", key).await, Err(StoreError::NoSuchKey(_))), "{key} is visible");
        }
        let r = store.put("files", "e", body(b"e"), PutOptions::default()).await;
        assert!(matches!(r, Err(StoreError::WritesDisabled(_))), "{r:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_full_disk_fails_the_write_and_keeps_serving() {
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let (store, _dir) = store_over(faulty.clone()).await;
        store.put("files", "old", body(b"old"), PutOptions::default()).await.unwrap();
        faulty.faults.writes.set(Trigger::Always);
        let r = store.put("files", "new", body(b"new"), PutOptions::default()).await;
        assert!(matches!(r, Err(StoreError::NoSpace)), "{r:?}");
        assert!(matches!(store.head("files", "new").await, Err(StoreError::NoSuchKey(_))));
        assert_eq!(read_all(&store, "files", "old").await, b"old");
        faulty.faults.off();
        store.put("files", "new", body(b"new"), PutOptions::default()).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn uploads_leave_the_free_space_kept_and_deletes_go_on() {
        let dir = tempfile::tempdir().unwrap();
        // More than any disk has, whatever else frees space meanwhile.
        let beyond = u64::MAX / 4;
        let engine = Arc::new(MemoryEngine::new());
        let open = |min_free_space: u64| {
            let catalog = Arc::new(RocksCatalog::open(&dir.path().join("catalog")).unwrap());
            let engine = engine.clone();
            let kind = (EngineKind::Fs, Default::default());
            let data = Some(dir.path().to_path_buf());
            let config = StoreConfig { data, engine: Some(kind), min_free_space, ..StoreConfig::default() };
            Store::open(catalog, engine, config)
        };
        let store = open(1).await.unwrap();
        store.put("files", "kept", body(b"kept"), PutOptions::default()).await.unwrap();
        // An upload that would eat into the space kept is refused whole.
        let big = PutOptions { content_length: Some(beyond), ..PutOptions::default() };
        let r = store.put("files", "big", body(b"x"), big).await;
        assert!(matches!(&r, Err(StoreError::LowSpace(m)) if m.contains("--min-free-space")), "{r:?}");
        drop(store);
        // With less than the space kept free, no upload goes in...
        let store = open(beyond).await.unwrap();
        let r = store.put("files", "new", body(b"new"), PutOptions::default()).await;
        assert!(matches!(r, Err(StoreError::LowSpace(_))), "{r:?}");
        assert!(matches!(store.head("files", "new").await, Err(StoreError::NoSuchKey(_))));
        // ...and deletes and reads go on.
        assert_eq!(read_all(&store, "files", "kept").await, b"kept");
        store.delete("files", "kept", &Default::default()).await.unwrap();
    }

    const MIB: u64 = 1 << 20;

    /// A store over the memory engine that counts uploads as written to a
    /// file system with `free` bytes free, keeping 1 byte free.
    async fn counting_space(dir: &std::path::Path, free: u64) -> Arc<Store> {
        let store = counting_space_of(dir, dir.to_path_buf()).await;
        *store.fake_free.lock() = Some(1 + free);
        Arc::new(store)
    }

    /// A store over the memory engine, its catalog in `dir`, that counts
    /// uploads against the free space of `data`, keeping 1 byte free.
    async fn counting_space_of(dir: &std::path::Path, data: std::path::PathBuf) -> Store {
        let catalog = Arc::new(RocksCatalog::open(&dir.join("catalog")).unwrap());
        let config = StoreConfig {
            data: Some(data),
            engine: Some((EngineKind::Fs, Default::default())),
            min_free_space: 1,
            ..StoreConfig::default()
        };
        Store::open(catalog, Arc::new(MemoryEngine::new()), config).await.unwrap()
    }

    fn sized(n: u64) -> PutOptions {
        PutOptions { content_length: Some(n), ..PutOptions::default() }
    }

    /// Starts an upload of `len` bytes that sends one and then waits,
    /// holding its claim; returns once it holds it.
    async fn trickling(store: &Arc<Store>, key: &str, len: u64) -> tokio::task::JoinHandle<Result<PutResult>> {
        let before = store.promised.load(Ordering::Acquire);
        let upload = tokio::spawn({
            let (store, key) = (store.clone(), key.to_string());
            let body = body(b"x").chain(futures::stream::pending());
            async move { store.put("files", &key, body, sized(len)).await }
        });
        let claimed = async {
            while store.promised.load(Ordering::Acquire) == before {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), claimed).await.expect("the upload claims its space");
        upload
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn uploads_in_progress_count_against_the_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let store = counting_space(dir.path(), 20 * MIB).await;
        let r = store.put("files", "huge", body(b"x"), sized(100 * MIB)).await;
        assert!(matches!(&r, Err(StoreError::LowSpace(m)) if !m.contains("in progress")), "{r:?}");
        // An upload under way holds a window of what it will write...
        let first = trickling(&store, "first", 12 * MIB).await;
        assert!((8 * MIB - 1..=8 * MIB).contains(&store.promised.load(Ordering::Acquire)));
        let r = store.put("files", "second", body(b"x"), sized(16 * MIB)).await;
        assert!(matches!(&r, Err(StoreError::LowSpace(m)) if m.contains("in progress")), "{r:?}");
        let r = store.put("files", "second", body(b"x"), sized(12 * MIB)).await;
        assert!(matches!(r, Err(StoreError::IncompleteBody { .. })), "{r:?}");
        // ...and gives it back when it is cut off.
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(store.promised.load(Ordering::Acquire), 0);
        let r = store.put("files", "second", body(b"x"), sized(16 * MIB)).await;
        assert!(matches!(r, Err(StoreError::IncompleteBody { .. })), "{r:?}");
    }

    /// An upload made while the free space cannot be looked up gives back
    /// no more than it claimed: the uploads after it are not refused once
    /// the look-up works again.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_upload_while_the_free_space_is_unknown_leaves_the_count_even() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        // No directory to look at: the free space is not known.
        let store = counting_space_of(dir.path(), data.clone()).await;
        let bytes = vec![5u8; 100_000];
        let sent = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(bytes.clone()))]);
        store.put("files", "unknown", sent, sized(100_000)).await.unwrap();
        assert_eq!(store.promised.load(Ordering::Acquire), 0);
        std::fs::create_dir(&data).unwrap();
        let sent = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from(bytes))]);
        store.put("files", "known", sent, sized(100_000)).await.unwrap();
        assert_eq!(store.promised.load(Ordering::Acquire), 0);
    }

    /// A body longer than declared is refused as soon as it passes its
    /// length, without waiting for the rest (a chunked body sent on and on
    /// to an empty folder marker would otherwise fill the disk).
    #[tokio::test(flavor = "multi_thread")]
    async fn a_body_longer_than_declared_is_refused_as_it_passes_its_length() {
        let (s, _dir) = store_over(Arc::new(MemoryEngine::new())).await;
        let endless = body(b"0123456789").chain(futures::stream::pending());
        let r = tokio::time::timeout(Duration::from_secs(10), s.put("files", "k/", endless, sized(0))).await;
        let r = r.expect("refused without reading on");
        assert!(matches!(r, Err(StoreError::IncompleteBody { expected: 0, got: 10 })), "{r:?}");
        assert!(matches!(s.head("files", "k/").await, Err(StoreError::NoSuchKey(_))));
    }

    /// A body over its limit is refused, declared so or not, and leaves
    /// nothing.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_body_over_its_limit_is_refused_and_leaves_nothing() {
        let (s, _dir) = store_over(Arc::new(MemoryEngine::new())).await;
        let at_most =
            |n: u64, len: Option<u64>| PutOptions { max_length: Some(n), content_length: len, ..Default::default() };
        let r = s.put("files", "k", body(b"0123456789"), at_most(4, Some(10))).await;
        assert!(matches!(&r, Err(StoreError::EntityTooLarge(_))), "declared: {r:?}");
        let r = s.put("files", "k", body(b"0123456789"), at_most(4, None)).await;
        assert!(matches!(&r, Err(StoreError::EntityTooLarge(_))), "streamed: {r:?}");
        assert!(matches!(s.head("files", "k").await, Err(StoreError::NoSuchKey(_))));
        assert_eq!(s.stats().await.unwrap().blobs, 0);
        s.put("files", "k", body(b"0123456789"), at_most(10, None)).await.unwrap();
    }

    /// A large upload trickling in holds one window, not all it announced.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_slow_upload_holds_a_window_of_the_free_space() {
        let dir = tempfile::tempdir().unwrap();
        let store = counting_space(dir.path(), 2048 * MIB).await;
        let slow = trickling(&store, "slow", 1024 * MIB).await;
        let r = store.put("files", "other", body(b"x"), sized(1536 * MIB)).await;
        assert!(matches!(r, Err(StoreError::IncompleteBody { .. })), "{r:?}");
        slow.abort();
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_upload_of_unknown_length_stops_at_the_space_kept() {
        use futures::SinkExt as _;
        let dir = tempfile::tempdir().unwrap();
        let store = counting_space(dir.path(), 20 * MIB).await;
        // A channel that takes a chunk only once the last one was read.
        let (mut tx, rx) = futures::channel::mpsc::channel::<Result<Bytes, std::io::Error>>(0);
        let upload = tokio::spawn({
            let store = store.clone();
            async move { store.put("files", "streamed", rx, PutOptions::default()).await }
        });
        let chunk = Bytes::from(vec![7u8; MIB as usize]);
        for _ in 0..2 {
            tx.send(Ok(chunk.clone())).await.unwrap();
        }
        // The upload is under way, in its first window; meanwhile the disk
        // fills, leaving less than a window.
        assert!((6 * MIB..=7 * MIB).contains(&store.promised.load(Ordering::Acquire)));
        *store.fake_free.lock() = Some(1 + 4 * MIB);
        for _ in 0..CLAIM_WINDOW / MIB {
            // Refused, the upload stops reading.
            let _ = tx.send(Ok(chunk.clone())).await;
        }
        let r = tokio::time::timeout(Duration::from_secs(10), upload).await.expect("refused as it writes").unwrap();
        assert!(matches!(&r, Err(StoreError::LowSpace(_))), "{r:?}");
        assert_eq!(store.promised.load(Ordering::Acquire), 0);
        assert!(matches!(store.head("files", "streamed").await, Err(StoreError::NoSuchKey(_))));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn twenty_concurrent_puts_of_one_content_make_one_blob() {
        let (store, _dir) = store_over(Arc::new(MemoryEngine::new())).await;
        let puts = (0..20).map(|i| {
            let key = format!("k{i}");
            let store = &store;
            async move { store.put("files", &key, body(b"same bytes"), PutOptions::default()).await.unwrap() }
        });
        let results = futures::future::join_all(puts).await;
        assert_eq!(results.iter().filter(|r| !r.deduplicated).count(), 1);
        let stats = store.stats().await.unwrap();
        assert_eq!((stats.objects, stats.blobs), (20, 1));
        let digest = results[0].record.sha256;
        assert_eq!(store.blob(&digest).await.unwrap().refs, 20);
        assert_eq!(store.engine().list().await.unwrap().len(), 1);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_failure_is_an_error_not_a_panic() {
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let (store, _dir) = store_over(faulty.clone()).await;
        // Longer than a record keeps, so the engine is asked.
        store.put("files", "k", body(&[7; BODY_IN_RECORD as usize + 1]), PutOptions::default()).await.unwrap();
        faulty.faults.reads.set(Trigger::Always);
        let record = store.head("files", "k").await.unwrap();
        assert!(matches!(store.read(&record, ByteRange::full(5)).await, Err(StoreError::Internal(_))));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_small_object_once_read_is_answered_from_memory() {
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let (store, _dir) = store_over(faulty.clone()).await;
        let big: &'static [u8] = Box::leak(vec![7; hot::LARGEST as usize + 1].into_boxed_slice());
        // Both longer than a record keeps, so only the engine has them.
        const HOT: &[u8] = &[b'h'; BODY_IN_RECORD as usize + 1];
        const UNREAD: &[u8] = &[b'u'; BODY_IN_RECORD as usize + 1];
        for (key, bytes) in [("hot", HOT), ("unread", UNREAD), ("big", big)] {
            store.put("files", key, body(bytes), PutOptions::default()).await.unwrap();
        }
        assert_eq!(read_all(&store, "files", "hot").await, HOT);
        assert_eq!(read_all(&store, "files", "big").await, big);
        faulty.faults.reads.set(Trigger::Always);
        assert_eq!(read_all(&store, "files", "hot").await, HOT);
        let record = store.head("files", "hot").await.unwrap();
        assert_eq!(read_range(&store, &record, 4, 9).await, &HOT[4..9]);
        // Never read, or too large to keep: the engine is asked, and fails.
        for key in ["unread", "big"] {
            let record = store.head("files", key).await.unwrap();
            let r = store.read(&record, ByteRange::full(record.size)).await;
            assert!(matches!(r, Err(StoreError::Internal(_))), "{key}");
        }
    }

    /// Bodies read in this process never come mapped, however much of
    /// their files is cached; bodies read to be sent on a socket may.
    #[tokio::test(flavor = "multi_thread")]
    async fn only_bodies_to_send_come_mapped() {
        use crate::engine::mapped;
        let files = tempfile::tempdir().unwrap();
        let (store, _dir) = store_over(Arc::new(crate::engine::fs::FsEngine::open(files.path()).unwrap())).await;
        let big: &'static [u8] = Box::leak(vec![9; 3 * hot::LARGEST as usize].into_boxed_slice());
        store.put("files", "big", body(big), PutOptions::default()).await.unwrap();
        let record = store.head("files", "big").await.unwrap();
        let full = ByteRange::full(record.size);
        let any_mapped = |chunks: &[Bytes]| chunks.iter().any(|c| mapped::find(c.as_ptr(), c.len()).is_some());
        for send in [false, true, false] {
            let body = if send { store.read_to_send(&record, full).await } else { store.read(&record, full).await };
            let chunks: Vec<Bytes> = body.unwrap().try_collect().await.unwrap();
            assert_eq!(chunks.concat(), big);
            // The first read brought the file into the page cache.
            assert_eq!(any_mapped(&chunks), send);
        }
    }
}
