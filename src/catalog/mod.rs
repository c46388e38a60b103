//! The catalog: buckets, object records and blob reference counts.
//!
//! The catalog is the store's source of truth for names. Every change is a
//! transaction: an object record and the reference counts of the blobs it
//! gains and loses change together, or not at all, and a change is durable
//! when the call returns. A blob whose count falls to zero is remembered as
//! unreferenced from that moment; the collector removes it only after a
//! grace period, and a new reference before then revives it.

#[cfg(test)]
pub mod conformance;
#[cfg(test)]
pub mod faulty;
pub mod postgres;
pub mod rocks;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::engine::{BlobRef, Digest, Locator};

/// Milliseconds since the Unix epoch: how the catalog keeps time.
pub type Millis = u64;

/// The longest a delete of one blob's bytes may take between
/// [`Catalog::begin_delete`] and [`Catalog::end_delete`]: a shared catalog
/// lets writers of the digest go on some time after, in case the deleting
/// node crashed.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a delete's mark in a shared catalog counts
/// ([`Catalog::begin_delete`]): one older is a crashed node's, and another
/// node may mark the digest anew.
pub const DELETE_MARK_LIFE: Duration = Duration::from_secs(120);

/// A writer's claim on a digest, in a catalog shared by several nodes (see
/// [`Catalog::claim_blobs`]).
pub type ClaimId = i64;

/// How often a node serving a shared catalog says so
/// ([`Catalog::node_seen`]); one not heard from for [`NODE_LIFE`] is taken
/// for stopped.
pub const NODE_HEARTBEAT: Duration = Duration::from_secs(5);
/// [`NODE_LEASE`], then the longest a write checked within its lease may
/// take to commit ([`crate::pg::ANSWER_WITHIN`], its transaction's whole
/// budget), then 10 s to spare.
pub const NODE_LIFE: Duration = Duration::from_secs(40);
/// How long a node takes writes after the catalog last answered it that no
/// maintenance runs (see [`crate::store::Store::lease_writes`]): with the
/// commit of a write checked at its last moment, shorter than
/// [`NODE_LIFE`], so that no write lands after maintenance could take the
/// node for stopped.
pub const NODE_LEASE: Duration = Duration::from_secs(15);

pub fn now_millis() -> Millis {
    to_millis(SystemTime::now())
}

pub fn to_millis(t: SystemTime) -> Millis {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub fn from_millis(ms: Millis) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// A bucket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketRecord {
    #[serde(skip)]
    pub name: String,
    pub created: Millis,
    /// Anonymous clients may read and list.
    pub public_read: bool,
    /// The access key that created the bucket; empty for buckets made
    /// without credentials, which every credential may use.
    pub owner: String,
}

impl BucketRecord {
    /// A bucket created now.
    pub fn new(name: &str, owner: &str, public_read: bool) -> BucketRecord {
        BucketRecord { name: name.to_string(), created: now_millis(), public_read, owner: owner.to_string() }
    }
}

/// One blob of an object's body, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    pub digest: Digest,
    pub size: u64,
}

/// What the catalog knows of one object. Stored as postcard bytes (see
/// [`ObjectRecord::encode`]): the fields up to `metadata`, then `headers`
/// when there are any, then `body` when there is one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    #[serde(skip)]
    pub key: String,
    pub size: u64,
    /// The body is these blobs, concatenated.
    pub parts: Vec<Part>,
    /// Hex MD5 of the body (S3's `md5-of-md5s-N` for multipart uploads).
    pub etag: String,
    /// SHA-256 of the whole body.
    pub sha256: Digest,
    pub content_type: String,
    pub modified: Millis,
    /// User metadata (`x-amz-meta-*`), in the order given.
    pub metadata: Vec<(String, String)>,
    /// Response headers given with the body and sent back with it: some of
    /// [`STORED_HEADERS`], lower-case, in that order; then the checksum its
    /// uploader declared for the whole body, if any (an
    /// `x-amz-checksum-*`: see [`ObjectRecord::checksum`]).
    #[serde(skip)]
    pub headers: Vec<(String, String)>,
    /// The whole body, when it is at most [`BODY_IN_RECORD`] bytes and the
    /// record's one part: a copy of that blob's bytes, so a read needs no
    /// lookup beyond this record's. The blob is kept, counted and
    /// collected as any other; a record without the copy, or with one
    /// that does not fit it (see [`ObjectRecord::kept_body`]), is read
    /// through its blob as ever.
    #[serde(skip)]
    pub body: Option<bytes::Bytes>,
}

/// Largest body an object record carries (see [`ObjectRecord::body`]): no
/// more than the two hashes it keeps of every body anyway (the ETag's MD5
/// in hex, 32 bytes, and the SHA-256, 32), so the copy at most doubles
/// what a record spends on naming its body. A batch of such values (the
/// seeds' key-value store kept 50-byte values) then costs one lookup a
/// key rather than two.
pub const BODY_IN_RECORD: u64 = 64;

/// The headers an upload may set for its downloads, as S3 stores them.
pub const STORED_HEADERS: [&str; 5] =
    ["cache-control", "content-disposition", "content-encoding", "content-language", "expires"];

/// The stored header of a checksum of the whole body, as S3 names them
/// (`x-amz-checksum-crc32`, `-sha256`, ...). It describes the bytes, not
/// how they are served, so a copy keeps it whatever its metadata.
pub const CHECKSUM_HEADER_PREFIX: &str = "x-amz-checksum-";

impl ObjectRecord {
    /// When the object was last modified, as answers give it: never later
    /// than now (RFC 9110 section 8.8.2.1), whatever another node's clock
    /// said; a later date would keep every If-Modified-Since at 304.
    pub fn shown_modified(&self) -> Millis {
        self.modified.min(now_millis())
    }

    /// The record's stored form. Records without headers or a body end
    /// after the metadata, as every record did before headers were kept,
    /// so a store written earlier reads the same and needs no migration;
    /// a body follows the headers (an empty list when there are none),
    /// where a reader that predates it stops.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = postcard::to_stdvec(self).expect("records always serialise");
        if !self.headers.is_empty() || self.body.is_some() {
            bytes = postcard::to_extend(&self.headers, bytes).expect("records always serialise");
        }
        if let Some(body) = &self.body {
            bytes = postcard::to_extend(serde_bytes::Bytes::new(body), bytes).expect("records always serialise");
        }
        bytes
    }

    /// Reads [`ObjectRecord::encode`]'s bytes; the key is not in them.
    pub(crate) fn decode(bytes: &[u8], key: String) -> Result<ObjectRecord> {
        let (record, rest) = postcard::take_from_bytes::<ObjectRecord>(bytes).map_err(corrupt)?;
        let (headers, rest) =
            if rest.is_empty() { (Vec::new(), rest) } else { postcard::take_from_bytes(rest).map_err(corrupt)? };
        let body = if rest.is_empty() {
            None
        } else {
            let body: &serde_bytes::Bytes = postcard::from_bytes(rest).map_err(corrupt)?;
            Some(bytes::Bytes::copy_from_slice(body))
        };
        Ok(ObjectRecord { key, headers, body, ..record })
    }

    /// The record's copy of its body (see [`ObjectRecord::body`]) when it
    /// fits the record, the whole of its one part; one that does not is
    /// left unread, and the body read through its blob, as `depot verify`
    /// reports it. A record stays readable, listable and deletable
    /// whatever its copy.
    pub fn kept_body(&self) -> Option<&bytes::Bytes> {
        self.body.as_ref().filter(|b| b.len() as u64 == self.size && self.parts.len() == 1)
    }

    /// The parts whose blobs a read of the body needs: none when the
    /// record keeps the body itself.
    pub fn parts_to_read(&self) -> &[Part] {
        if self.kept_body().is_some() { &[] } else { &self.parts }
    }

    /// The stored header `name` (lower-case), if the object has it.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The checksum of the whole body its uploader declared, as a stored
    /// header: name (`x-amz-checksum-crc32`, ...) and value.
    pub fn checksum(&self) -> Option<(&str, &str)> {
        self.headers.iter().find(|(n, _)| n.starts_with(CHECKSUM_HEADER_PREFIX)).map(|(n, v)| (n.as_str(), v.as_str()))
    }
}

/// What the catalog knows of one blob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobRecord {
    #[serde(skip, default = "zero_digest")]
    pub digest: Digest,
    pub size: u64,
    /// Up to 4 KiB of content for the hybrid engine. Written as bytes, not
    /// byte by byte: the same encoding (a length, then the bytes), in one
    /// copy rather than a call per byte.
    #[serde(with = "serde_bytes")]
    pub locator: Locator,
    /// Object parts referring to the blob.
    pub refs: u64,
    /// When `refs` last fell to zero.
    pub unreferenced_since: Option<Millis>,
}

fn zero_digest() -> Digest {
    Digest([0; 32])
}

impl BlobRecord {
    pub fn blob_ref(&self) -> BlobRef {
        BlobRef { digest: self.digest, size: self.size, locator: self.locator.clone() }
    }
}

/// A condition a write must meet, checked inside the transaction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Precondition {
    /// `If-None-Match: *`: the key must not exist.
    pub if_absent: bool,
    /// `If-Match`: the current ETag must be one of these (`*` matches any
    /// existing object).
    pub if_match: Option<Vec<String>>,
    /// `If-None-Match` with tags: the current ETag must be none of these.
    pub if_none_match: Vec<String>,
    /// `If-Unmodified-Since` (without `If-Match`): an existing object must
    /// not have changed after this time, compared in whole seconds.
    pub if_unmodified_since: Option<Millis>,
}

impl Precondition {
    /// Whether the conditions hold for `current`, in the order RFC 9110
    /// (section 13.2.2) evaluates them.
    pub fn check(&self, current: Option<&ObjectRecord>) -> bool {
        if self.if_absent && current.is_some() {
            return false;
        }
        let holds = match (&self.if_match, current) {
            (Some(_), None) => false,
            (Some(tags), Some(obj)) => tags.iter().any(|t| t == "*" || *t == obj.etag),
            (None, Some(obj)) => {
                self.if_unmodified_since.is_none_or(|since| obj.shown_modified() / 1000 <= since / 1000)
            }
            (None, None) => true,
        };
        holds && !current.is_some_and(|obj| self.if_none_match.contains(&obj.etag))
    }
}

/// One object to write: its record, and the blobs its parts name, as the
/// engine stored them (used when a blob is new to the catalog).
#[derive(Clone, Debug)]
pub struct ObjectPut {
    pub bucket: String,
    pub record: ObjectRecord,
    pub blobs: Vec<BlobRef>,
    pub precondition: Precondition,
}

/// What a put changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PutOutcome {
    /// The record the put replaced, if the key existed.
    pub replaced: Option<ObjectRecord>,
    /// Every blob of the new record was already stored.
    pub deduplicated: bool,
    /// Blobs whose bytes the catalog already had under another locator: the
    /// bytes just written for them are redundant.
    pub redundant: Vec<BlobRef>,
}

/// A listing request.
#[derive(Clone, Debug, Default)]
pub struct ListQuery {
    pub prefix: String,
    /// Only keys after this one (exclusive). A common prefix of the
    /// listing also skips every key under it.
    pub after: Option<String>,
    /// Roll keys up to the first delimiter after the prefix (any string,
    /// as in S3; `/` for folders).
    pub delimiter: Option<String>,
    /// Entries plus common prefixes, at most.
    pub limit: usize,
}

/// The common prefix `key` rolls up to in a listing of the keys under
/// `prefix` with `delimiter`: the prefix, then the key up to and including
/// the first delimiter after it. None for a key listed as itself.
pub fn common_prefix<'k>(prefix: &str, delimiter: Option<&str>, key: &'k str) -> Option<&'k str> {
    let (d, rest) = (delimiter.filter(|d| !d.is_empty())?, key.strip_prefix(prefix)?);
    rest.find(d).map(|at| &key[..prefix.len() + at + d.len()])
}

/// The least string after every key that starts with `prefix`, in byte
/// order (which UTF-8 keeps for code points): the prefix with its last
/// character that can grow grown by one. None when no text follows.
pub fn past(prefix: &str) -> Option<String> {
    let mut p = prefix.to_string();
    while let Some(last) = p.pop() {
        // The next code point, over the surrogates, which no text holds.
        let next = (last as u32 + 1..=char::MAX as u32).find_map(char::from_u32);
        if let Some(next) = next {
            p.push(next);
            return Some(p);
        }
    }
    None
}

impl ListQuery {
    /// [`common_prefix`] in this listing.
    pub fn common_prefix<'k>(&self, key: &'k str) -> Option<&'k str> {
        common_prefix(&self.prefix, self.delimiter.as_deref(), key)
    }

    /// Whether `after` names a common prefix of this listing, so that every
    /// key under it has been listed already, as that prefix. A key equal
    /// to the prefix itself (a folder marker such as `photos/` listed
    /// under `photos/`) is an object like any other: the keys after it
    /// are still to come.
    fn after_is_common_prefix(&self) -> bool {
        self.after.as_deref().is_some_and(|a| self.common_prefix(a) == Some(a))
    }
}

/// One page of a listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListPage {
    pub objects: Vec<ObjectRecord>,
    /// Common prefixes, each ending in the delimiter.
    pub prefixes: Vec<String>,
    /// Where the next page starts (`after`), if the listing was cut short.
    pub next: Option<String>,
}

/// Totals the catalog keeps as it goes. Objects and their bytes count in
/// the buckets clients name; see [`counted`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogStats {
    pub objects: i64,
    /// Sum of object sizes.
    pub logical_bytes: i64,
    pub blobs: i64,
    /// Sum of blob sizes: what is stored once dedup is done.
    pub blob_bytes: i64,
}

/// Whether the objects of `bucket` count in [`CatalogStats`]: a bucket whose
/// name starts with `_` is the store's own (the records of multipart
/// uploads), which no client can name or list.
pub fn counted(bucket: &str) -> bool {
    !bucket.starts_with('_')
}

/// Errors from a catalog.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CatalogError {
    #[error("bucket {0:?} does not exist")]
    NoSuchBucket(String),
    #[error("bucket {0:?} already exists")]
    BucketExists(String),
    #[error("bucket {0:?} is not empty")]
    BucketNotEmpty(String),
    #[error("precondition failed")]
    PreconditionFailed,
    #[error("catalog unavailable: {0}")]
    Unavailable(String),
    #[error("catalog sync failed, writes are disabled until restart: {0}")]
    SyncFailed(String),
    /// The catalog's storage is full (507).
    #[error("no space left for the catalog")]
    NoSpace,
    #[error("catalog: {0}")]
    Internal(String),
}

pub type Result<T, E = CatalogError> = std::result::Result<T, E>;

/// A record stored whole by postcard. Object records are not: they have
/// their own [`ObjectRecord::encode`], and this keeps them out of the
/// generic one, which would drop their headers.
pub(crate) trait Record: Serialize + serde::de::DeserializeOwned {}

impl Record for BucketRecord {}
impl Record for BlobRecord {}

/// Records as stored by the catalogs: compact postcard bytes.
pub(crate) fn encode<T: Record>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("records always serialise")
}

pub(crate) fn decode<T: Record>(v: &[u8]) -> Result<T> {
    postcard::from_bytes(v).map_err(corrupt)
}

fn corrupt(e: postcard::Error) -> CatalogError {
    CatalogError::Internal(format!("corrupt record: {e}"))
}

impl From<crate::pg::PgError> for CatalogError {
    fn from(e: crate::pg::PgError) -> Self {
        match e {
            // Named, since the engine may be another server.
            e @ crate::pg::PgError::Unavailable(_) => CatalogError::Unavailable(format!("the catalog: {e}")),
            crate::pg::PgError::NoSpace(_) => CatalogError::NoSpace,
            e @ crate::pg::PgError::Query(_) => CatalogError::Internal(format!("the catalog: {e}")),
        }
    }
}

/// Maps bucket/key to object records and counts blob references.
#[async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// Creates a bucket; [`CatalogError::BucketExists`] if it is there.
    async fn create_bucket(&self, bucket: &BucketRecord) -> Result<()>;

    /// Makes a bucket readable by anonymous clients, or private again.
    async fn set_bucket_public(&self, name: &str, public_read: bool) -> Result<()>;

    /// Removes an empty bucket.
    async fn delete_bucket(&self, name: &str) -> Result<()>;

    async fn bucket(&self, name: &str) -> Result<Option<BucketRecord>>;

    /// Every bucket, by name.
    async fn buckets(&self) -> Result<Vec<BucketRecord>>;

    /// Records for `keys` of one bucket, in the same order.
    async fn get_objects(&self, bucket: &str, keys: &[String]) -> Result<Vec<Option<ObjectRecord>>>;

    /// Writes objects, all or none: each replaces its key's record, gains
    /// references to its blobs and releases those of the record it replaced.
    /// Fails with [`CatalogError::PreconditionFailed`] if any precondition
    /// fails, and with [`CatalogError::NoSuchBucket`] for a missing bucket.
    async fn put_objects(&self, puts: Vec<ObjectPut>) -> Result<Vec<PutOutcome>>;

    /// [`Catalog::put_objects`] that also ends `claims` of
    /// [`Catalog::claim_blobs`] (on the bytes the puts reference) as it
    /// commits, and commits nothing, failing with
    /// [`CatalogError::Unavailable`], if one has lapsed: a collector may
    /// then have deleted the bytes it guarded. A catalog that makes claims
    /// overrides this; one that makes none is given none to end.
    async fn put_objects_claimed(&self, puts: Vec<ObjectPut>, claims: &[ClaimId]) -> Result<Vec<PutOutcome>> {
        debug_assert!(claims.is_empty(), "claims given to a catalog that makes none");
        self.put_objects(puts).await
    }

    /// Deletes objects, releasing their blobs; returns the deleted records
    /// (`None` where a key was absent). All or none.
    async fn delete_objects(
        &self,
        bucket: &str,
        keys: &[String],
        precondition: &Precondition,
    ) -> Result<Vec<Option<ObjectRecord>>>;

    /// A page of a bucket's keys in byte order.
    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage>;

    /// Blob records, in the same order as `digests`.
    async fn get_blobs(&self, digests: &[Digest]) -> Result<Vec<Option<BlobRecord>>>;

    /// Up to `limit` blobs that have had no reference for `grace` or longer,
    /// by the catalog's clock: the database's for a shared catalog, so the
    /// nodes' clocks need not agree.
    async fn dead_blobs(&self, grace: Duration, limit: usize) -> Result<Vec<BlobRecord>>;

    /// Removes a blob record if it has still had no reference for `grace`
    /// (`None`: however long, for maintenance on a store nobody writes to)
    /// and no writer claims its digest; returns whether it did.
    /// The caller then deletes the bytes and calls [`Catalog::end_delete`],
    /// as after [`Catalog::begin_delete`].
    async fn remove_dead_blob(&self, digest: &Digest, grace: Option<Duration>) -> Result<bool>;

    /// Announces a writer about to make bytes of each of `digests` durable
    /// and then reference them: until a claim is released, or ended by the
    /// commit of the write ([`Catalog::put_objects_claimed`]), no node
    /// deletes bytes of its digest. Waits while a node is deleting bytes of
    /// one of them (between [`Catalog::begin_delete`] and
    /// [`Catalog::end_delete`]), so the writer's bytes land after that
    /// delete, never before it. Returns one claim per digest, in order.
    ///
    /// Only a catalog that several processes share needs this; within one
    /// process the store's guards keep writers and the collector apart, and
    /// a catalog only one process opens makes no claims (none returned).
    async fn claim_blobs(&self, digests: &[Digest]) -> Result<Vec<ClaimId>> {
        let _ = digests;
        Ok(Vec::new())
    }

    /// Ends claims of [`Catalog::claim_blobs`].
    async fn release_claims(&self, claims: &[ClaimId]) -> Result<()> {
        let _ = claims;
        Ok(())
    }

    /// Keeps claims of [`Catalog::claim_blobs`] from lapsing, as a claim of
    /// a crashed writer does after a while. Fails with
    /// [`CatalogError::Unavailable`] if any has lapsed already: a collector
    /// may then have deleted the bytes it guarded.
    async fn renew_claims(&self, claims: &[ClaimId]) -> Result<()> {
        let _ = claims;
        Ok(())
    }

    /// Whether bytes of `blob.digest` stored under `blob.locator` may be
    /// deleted: no record points at that locator and no writer claims the
    /// digest. When it answers yes, claims of the digest wait until the
    /// caller has deleted the bytes and called [`Catalog::end_delete`].
    async fn begin_delete(&self, blob: &BlobRef) -> Result<bool> {
        Ok(self.get_blobs(&[blob.digest]).await?.pop().flatten().is_none_or(|b| b.locator != blob.locator))
    }

    /// Ends a delete of [`Catalog::begin_delete`] or
    /// [`Catalog::remove_dead_blob`]: writers of the digest go on. Only the
    /// mark that call made is removed: once it lapsed, another node may
    /// have marked the digest anew.
    async fn end_delete(&self, digest: &Digest) -> Result<()> {
        let _ = digest;
        Ok(())
    }

    /// Says that `node` serves this catalog now. A catalog shared by
    /// several nodes keeps the time, so that maintenance which needs every
    /// node stopped can tell whether one is running
    /// ([`Catalog::live_nodes`]); an embedded catalog has one user at a
    /// time, and keeps nothing.
    async fn node_seen(&self, node: &str) -> Result<()> {
        let _ = node;
        Ok(())
    }

    /// Says that `node` stopped serving.
    async fn node_gone(&self, node: &str) -> Result<()> {
        let _ = node;
        Ok(())
    }

    /// The nodes seen within `within`.
    async fn live_nodes(&self, within: Duration) -> Result<Vec<String>> {
        let _ = within;
        Ok(Vec::new())
    }

    /// Which engine, and which of its databases or buckets, holds the
    /// bytes of a catalog shared by several nodes (an engine marker, see
    /// [`crate::engine::marker`]): every node must open the same one. An
    /// embedded catalog lives in one data directory, whose `ENGINE` file
    /// says so, and keeps nothing here.
    async fn engine_marker(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// Records `marker` as [`Catalog::engine_marker`] if the recorded one is
    /// still `previous`, and says whether it did: two nodes starting at
    /// once with different engines cannot both tie the catalog to theirs.
    async fn set_engine_marker(&self, previous: Option<&str>, marker: &str) -> Result<bool> {
        let _ = (previous, marker);
        Ok(true)
    }

    async fn stats(&self) -> Result<CatalogStats>;

    /// Up to `limit` blob records with digests greater than `after`, in
    /// digest order: for maintenance that visits every blob.
    async fn list_blobs(&self, after: Option<Digest>, limit: usize) -> Result<Vec<BlobRecord>>;

    /// Records that blobs now live at new locators, after their bytes moved
    /// to another engine. Digests without a record are skipped.
    async fn set_locators(&self, moved: &[(Digest, Locator)]) -> Result<()>;

    /// Sets blobs' reference counts to what a full scan counted (a count of
    /// zero starts the blob's grace period). Digests without a record are
    /// skipped. For repairs only: the store keeps counts right as it goes.
    async fn set_refs(&self, counted: &[(Digest, u64)]) -> Result<()>;

    /// Replaces the running totals with what a full scan counted.
    async fn set_stats(&self, stats: CatalogStats) -> Result<()>;

    /// Whether [`Catalog::checkpoint`] can copy this catalog.
    fn checkpoints(&self) -> bool {
        false
    }

    /// Writes a consistent point-in-time copy of the catalog into `dir`, a
    /// directory that does not exist yet, while writers go on.
    async fn checkpoint(&self, dir: &std::path::Path) -> Result<()> {
        let _ = dir;
        Err(CatalogError::Internal("this catalog cannot copy itself; back it up with its own server's tools".into()))
    }
}

/// Conveniences over the required operations.
#[async_trait]
pub trait CatalogExt: Catalog {
    async fn get_object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>> {
        Ok(self.get_objects(bucket, &[key.to_string()]).await?.pop().flatten())
    }

    async fn put_object(&self, put: ObjectPut) -> Result<PutOutcome> {
        let mut out = self.put_objects(vec![put]).await?;
        out.pop().ok_or_else(|| CatalogError::Internal("put returned no outcome".into()))
    }

    async fn delete_object(
        &self,
        bucket: &str,
        key: &str,
        precondition: &Precondition,
    ) -> Result<Option<ObjectRecord>> {
        Ok(self.delete_objects(bucket, &[key.to_string()], precondition).await?.pop().flatten())
    }

    async fn get_blob(&self, digest: &Digest) -> Result<Option<BlobRecord>> {
        Ok(self.get_blobs(&[*digest]).await?.pop().flatten())
    }
}

impl<T: Catalog + ?Sized> CatalogExt for T {}

/// The catalogs depot knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CatalogKind {
    Rocksdb,
    Postgres(String),
}

impl std::str::FromStr for CatalogKind {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        if s == "rocksdb" {
            Ok(CatalogKind::Rocksdb)
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(CatalogKind::Postgres(s.to_string()))
        } else {
            // Of a URL, only the scheme: the rest may hold a password.
            let named = match s.split_once("://") {
                Some((scheme, _)) => format!("a {scheme}:// URL"),
                None if s.contains(['@', '=']) => "(not shown: it may hold a password)".to_string(),
                None => format!("{s:?}"),
            };
            Err(format!("unknown catalog {named}: use \"rocksdb\" or a postgres:// URL"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_is_the_least_string_after_the_prefix() {
        assert_eq!(past("a/").as_deref(), Some("a0"));
        assert_eq!(past("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(past("\u{D7FF}").as_deref(), Some("\u{E000}"), "over the surrogates");
        assert_eq!(past("\u{10FFFF}\u{10FFFF}"), None);
    }

    fn record(headers: Vec<(String, String)>) -> ObjectRecord {
        ObjectRecord {
            key: "k".into(),
            size: 3,
            parts: vec![Part { digest: Digest([1; 32]), size: 3 }],
            etag: "e".into(),
            sha256: Digest([1; 32]),
            content_type: "text/plain".into(),
            modified: 7,
            metadata: vec![("m".into(), "v".into())],
            headers,
            body: None,
        }
    }

    /// Object records written before headers were kept: the same fields,
    /// nothing after the metadata.
    #[derive(Serialize)]
    struct WithoutHeaders<'a> {
        size: u64,
        parts: &'a [Part],
        etag: &'a str,
        sha256: Digest,
        content_type: &'a str,
        modified: Millis,
        metadata: &'a [(String, String)],
    }

    #[test]
    fn object_records_without_headers_keep_their_encoding() {
        let r = record(Vec::new());
        let old = postcard::to_stdvec(&WithoutHeaders {
            size: r.size,
            parts: &r.parts,
            etag: &r.etag,
            sha256: r.sha256,
            content_type: &r.content_type,
            modified: r.modified,
            metadata: &r.metadata,
        })
        .unwrap();
        assert_eq!(r.encode(), old);
        assert_eq!(ObjectRecord::decode(&old, "k".into()).unwrap(), r);
    }

    #[test]
    fn object_records_keep_their_headers_and_reject_damage() {
        let r = record(vec![("cache-control".into(), "no-cache".into()), ("expires".into(), "0".into())]);
        let bytes = r.encode();
        assert_eq!(ObjectRecord::decode(&bytes, "k".into()).unwrap(), r);
        assert_eq!(r.header("expires"), Some("0"));
        assert!(ObjectRecord::decode(&bytes[..bytes.len() - 1], "k".into()).is_err(), "a cut header list");
        assert!(ObjectRecord::decode(&bytes[..5], "k".into()).is_err(), "a cut record");
    }

    #[test]
    fn object_records_keep_their_bodies_after_their_headers() {
        for headers in [Vec::new(), vec![("expires".into(), "0".into())]] {
            let r = ObjectRecord { body: Some(bytes::Bytes::from_static(b"abc")), ..record(headers.clone()) };
            let bytes = r.encode();
            assert_eq!(ObjectRecord::decode(&bytes, "k".into()).unwrap(), r);
            // What a reader that knows no bodies reads: the rest, headers
            // and all.
            let (_, rest) = postcard::take_from_bytes::<ObjectRecord>(&bytes).unwrap();
            assert_eq!(postcard::from_bytes::<Vec<(String, String)>>(rest).unwrap(), headers);
            assert!(ObjectRecord::decode(&bytes[..bytes.len() - 1], "k".into()).is_err(), "a cut body");
        }
        // A copy that is not the whole of a one-part record is read back,
        // and not used.
        let r = record(Vec::new());
        let fits = ObjectRecord { body: Some(bytes::Bytes::from_static(b"abc")), ..r.clone() };
        assert!(fits.kept_body().is_some());
        let short = ObjectRecord { body: Some(bytes::Bytes::from_static(b"ab")), ..r.clone() };
        assert_eq!(ObjectRecord::decode(&short.encode(), "k".into()).unwrap(), short);
        assert_eq!(short.kept_body(), None);
        let parts = vec![r.parts[0], r.parts[0]];
        let two_parts = ObjectRecord { size: 6, parts, body: Some(bytes::Bytes::from_static(b"abcabc")), ..r };
        assert_eq!(two_parts.kept_body(), None);
    }
}
