//! `gridfs`: blobs as GridFS files in MongoDB, so that several depot nodes
//! can share one store of bytes, and so that the tools that read GridFS
//! (`mongofiles`, every official driver's `GridFSBucket`) read what depot
//! wrote, and the other way round.
//!
//! Layout, as the GridFS specification has it, in bucket `BUCKET` (default
//! `fs`) of the database named by the URL's path:
//!
//! | collection | one document per | fields |
//! |---|---|---|
//! | `BUCKET.files` | stored blob | `_id` (ObjectId), `length` (int64), `chunkSize` (int32), `uploadDate`, `filename`: the blob's SHA-256 in lowercase hex |
//! | `BUCKET.chunks` | chunk of a blob | `_id`, `files_id`, `n` (int32), `data` (binary): bytes `n * chunkSize..` of the file |
//!
//! The two indexes the specification asks for (`files`: `filename, uploadDate`;
//! `chunks`: `files_id, n`, unique) are created at connect when missing.
//! `chunkSize` is kept per file, so a restart with another chunk size still
//! reads the blobs written before it, and files from other tools whatever
//! their chunk size.
//!
//! Writing: a writer takes a fresh ObjectId for its file, buffers at most one
//! chunk and inserts each chunk as it fills. `finish` inserts the files
//! document last, as the specification's drivers do: no reader ever finds a
//! files document whose chunks are not all stored. If a file of that digest
//! is stored already, its `uploadDate` is refreshed (it counts as freshly
//! written for garbage collection) and the writer's chunks are deleted. Two
//! writers finishing the same content at the same moment may both insert a
//! files document; each then looks at all files of that name, and the one
//! with the smallest `_id` stays: the others are deleted, by whichever writer
//! sees them. Every write waits for a majority of the replica set and for
//! the journal (`w: majority, j: true`).
//!
//! Abandoned writes: `abort`, or dropping a writer (through a spawned task),
//! deletes its chunks. It first takes the writer's file id with a files
//! document named `depot-discarding`, so that a finish still on its way
//! fails rather than land a file whose chunks are going; a crash that
//! leaves such a hold is cleaned up as orphaned chunks are. What a crash leaves behind (chunks whose `files_id`
//! has no files document) is deleted when any node connects, but only when
//! the newest chunk of that file is older than [`ORPHAN_AGE`] (ObjectIds
//! carry the time they were made), because another node may be writing it
//! right now. A writer that stalls for longer than that between two chunks
//! may find its chunks gone: `finish` counts them before it inserts the files
//! document, and fails rather than keep a file with holes.
//!
//! Reading a range asks for the chunks that cover it only (`files_id` and
//! `n` between the first and the last needed), sorted by `n`, through a
//! cursor whose batches hold about [`READ_BATCH_BYTES`]; the first and the
//! last chunk are cut to the range. A missing chunk, or one of the wrong
//! length, is an error, never silently short data. Other tools may store
//! several files under one name; a read takes one whose chunks are all
//! there.
//!
//! Failures: a server that cannot be reached within [`CONNECT_TIMEOUT`]
//! (server selection and TCP connect), a dropped connection, a server
//! shutting down or stepping down, a majority that does not confirm a write
//! within [`MAJORITY_WITHIN`], or a request that gets no answer within
//! [`ANSWER_WITHIN`] ([`SCAN_WITHIN`] for scans, bulk deletes and index
//! builds) is [`EngineError::Unavailable`], which clients see as
//! 503. On a replica set the driver retries a failed read or
//! write once by itself; on a single server it does not, so the engine
//! retries the inserts of an upload (chunks, then the files document) on a
//! new connection when theirs broke: a reset connection costs a retry, not
//! the upload.

use std::collections::HashMap;
use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::{StreamExt, TryStreamExt};
use mongodb::bson::oid::ObjectId;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Binary, Bson, DateTime, Document, doc};
use mongodb::error::{ErrorKind, WriteFailure};
use mongodb::options::{Acknowledgment, ClientOptions, CollectionOptions, IndexOptions, WriteConcern};
use mongodb::{Client, Collection, Cursor, Database, IndexModel};

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result};

const NAME: &str = "gridfs";

/// Bytes per chunk when not configured: the GridFS drivers' default, which
/// keeps a chunk document under 256 KiB with its fields.
pub const DEFAULT_CHUNK: usize = 255 * 1024;
/// The bucket when not configured, as in every GridFS tool.
pub const DEFAULT_BUCKET: &str = "fs";
/// Chunk sizes accepted from the configuration: a chunk document must stay
/// under MongoDB's 16 MiB document limit.
const CHUNK_LIMITS: std::ops::RangeInclusive<usize> = 512..=15 * 1024 * 1024;
/// Age after which chunks without a files document are taken for the
/// leftovers of a crashed writer.
pub const ORPHAN_AGE: Duration = Duration::from_secs(3600);
/// The `filename` of a files document that holds a discarded writer's id
/// while its chunks go (see `discard`): not a digest, so no reader or writer
/// of a blob takes it, and the listing passes over it.
const DISCARDING: &str = "depot-discarding";
/// How long finding a server, or opening a connection, may take before the
/// engine reports it unavailable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a write waits for a majority of the replica set before the
/// server fails it: a replica set that lost its majority would otherwise
/// hold every write forever.
pub const MAJORITY_WITHIN: Duration = Duration::from_secs(15);
/// How long one request waits for its answer before the engine reports the
/// server unavailable: a server that keeps a connection open and never
/// answers would otherwise hold the request, and all that waits behind it,
/// forever. Longer than [`MAJORITY_WITHIN`], so that a missing majority is
/// reported by the server itself.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// [`ANSWER_WITHIN`] for the requests whose work grows with the data: the
/// orphan scan (which answers only once it has grouped every chunk), the
/// delete of a large file's chunks, an index built at start. Bounded still,
/// so that a server that stopped answering is found, but well past what
/// millions of chunks take.
pub const SCAN_WITHIN: Duration = Duration::from_secs(30 * 60);
/// About how many bytes of chunks one cursor batch of a read holds.
const READ_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Orphan candidates checked against the files collection per query.
const ORPHAN_BATCH: usize = 1000;
/// Attempts at each insert of an upload when its connection breaks.
const INSERT_ATTEMPTS: u32 = 3;
/// The pause before the first retry of an insert; it grows fourfold.
const INSERT_RETRY_DELAY: Duration = Duration::from_millis(50);
/// MongoDB's error code for a duplicate key.
const DUPLICATE_KEY: i32 = 11000;

/// Server error codes that mean "not now" rather than "never": the node is
/// shutting down, stepping down or not the primary any more, the network
/// failed, or a majority did not answer in time.
const TRANSIENT_CODES: &[i32] = &[
    6,     // HostUnreachable
    7,     // HostNotFound
    64,    // WriteConcernFailed
    89,    // NetworkTimeout
    91,    // ShutdownInProgress
    189,   // PrimarySteppedDown
    9001,  // SocketException
    10107, // NotWritablePrimary
    11600, // InterruptedAtShutdown
    11602, // InterruptedDueToReplStateChange
    13435, // NotPrimaryNoSecondaryOk
    13436, // NotPrimaryOrSecondary
];

/// The GridFS engine; clones share one client (and its connection pool).
#[derive(Clone)]
pub struct GridfsEngine {
    inner: Arc<Inner>,
}

struct Inner {
    db: Database,
    files: Collection<Document>,
    chunks: Collection<Document>,
    bucket: String,
    chunk: usize,
    /// Age at which chunks without a files document are taken for
    /// abandoned.
    orphan_age: Duration,
    /// How long each request may wait for its answer.
    answer_within: Duration,
    /// How long a request whose work grows with the data may take.
    scan_within: Duration,
    /// Chunks and chunk bytes that reads received from the server.
    fetched_chunks: AtomicU64,
    fetched_bytes: AtomicU64,
}

impl std::fmt::Debug for GridfsEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GridfsEngine({}.{}, chunk {})", self.inner.db.name(), self.inner.bucket, self.inner.chunk)
    }
}

/// MongoDB's `OutOfDiskSpace`.
const OUT_OF_DISK_SPACE: i32 = 14031;

fn mongo_err(e: mongodb::error::Error) -> EngineError {
    let code = match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        ErrorKind::Write(WriteFailure::WriteConcernError(c)) => Some(c.code),
        _ => None,
    };
    if code == Some(OUT_OF_DISK_SPACE) {
        return EngineError::NoSpace;
    }
    let transient = match &*e.kind {
        ErrorKind::ServerSelection { .. }
        | ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::DnsResolve { .. }
        | ErrorKind::Shutdown => true,
        // A command's, a write concern's or a single write's: a primary
        // stepping down fails the writes it was given with its code.
        _ => {
            code.is_some_and(|c| TRANSIENT_CODES.contains(&c))
                || e.contains_label("RetryableWriteError")
                || e.contains_label("TransientTransactionError")
        }
    };
    if transient {
        EngineError::Unavailable(format!("{NAME} engine: the server is unavailable: {e}"))
    } else {
        EngineError::other(NAME, e)
    }
}

/// Whether the connection an operation went out on broke under it (reset,
/// closed): the server may be well, and a new connection may do.
fn broken_connection(e: &mongodb::error::Error) -> bool {
    matches!(&*e.kind, ErrorKind::Io(_) | ErrorKind::ConnectionPoolCleared { .. })
}

fn duplicate_key(e: &mongodb::error::Error) -> bool {
    match &*e.kind {
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.code == DUPLICATE_KEY,
        ErrorKind::Command(c) => c.code == DUPLICATE_KEY,
        _ => false,
    }
}

/// A whole number stored as any BSON number (other tools write `length` and
/// `chunkSize` as int32, int64 or double).
fn whole(value: Option<&Bson>) -> Option<u64> {
    match value? {
        Bson::Int32(v) => u64::try_from(*v).ok(),
        Bson::Int64(v) => u64::try_from(*v).ok(),
        Bson::Double(v) if v.fract() == 0.0 && *v >= 0.0 && *v < u64::MAX as f64 => Some(*v as u64),
        _ => None,
    }
}

/// What a files document says about its file.
#[derive(Clone, Debug)]
struct FileDoc {
    id: Bson,
    length: u64,
    chunk_size: u64,
}

impl FileDoc {
    fn parse(doc: &Document) -> Result<FileDoc> {
        let bad = |what: &str| EngineError::other(NAME, format!("a files document has no valid {what}: {doc}"));
        let id = doc.get("_id").cloned().ok_or_else(|| bad("_id"))?;
        let length = whole(doc.get("length")).ok_or_else(|| bad("length"))?;
        let chunk_size = whole(doc.get("chunkSize")).ok_or_else(|| bad("chunkSize"))?;
        if chunk_size == 0 && length > 0 {
            return Err(bad("chunkSize"));
        }
        Ok(FileDoc { id, length, chunk_size })
    }

    /// How many chunks a complete file has.
    fn chunk_count(&self) -> u64 {
        if self.length == 0 { 0 } else { self.length.div_ceil(self.chunk_size) }
    }

    /// The length of chunk `n`.
    fn chunk_len(&self, n: u64) -> u64 {
        self.chunk_size.min(self.length - n * self.chunk_size)
    }
}

impl GridfsEngine {
    /// Connects to the database named by `url`'s path
    /// (`mongodb://host:port/database`), creates the GridFS indexes of
    /// `bucket` when missing, and removes chunks that crashed writers left
    /// more than [`ORPHAN_AGE`] ago (a failure there is only logged). New
    /// blobs are stored in chunks of `chunk_size` bytes.
    pub async fn connect(url: &str, bucket: &str, chunk_size: usize) -> Result<GridfsEngine> {
        GridfsEngine::connect_with(url, bucket, chunk_size, ORPHAN_AGE).await
    }

    /// [`connect`](GridfsEngine::connect), taking chunks without a files
    /// document for abandoned once their newest chunk is `orphan_age` old.
    pub async fn connect_with(
        url: &str,
        bucket: &str,
        chunk_size: usize,
        orphan_age: Duration,
    ) -> Result<GridfsEngine> {
        GridfsEngine::open(url, bucket, chunk_size, orphan_age, (ANSWER_WITHIN, SCAN_WITHIN)).await
    }

    /// [`connect_with`](GridfsEngine::connect_with), giving each request
    /// `answer_within` to be answered (`scan_within` for those whose work
    /// grows with the data).
    async fn open(
        url: &str,
        bucket: &str,
        chunk_size: usize,
        orphan_age: Duration,
        (answer_within, scan_within): (Duration, Duration),
    ) -> Result<GridfsEngine> {
        if !CHUNK_LIMITS.contains(&chunk_size) {
            return Err(EngineError::other(
                NAME,
                format!("chunk size {chunk_size} is outside {}..={} bytes", CHUNK_LIMITS.start(), CHUNK_LIMITS.end()),
            ));
        }
        if bucket.is_empty() || bucket.contains(['$', '\0']) {
            return Err(EngineError::other(NAME, format!("{bucket:?} is not a valid bucket name")));
        }
        let mut options = ClientOptions::parse(url).await.map_err(|e| {
            EngineError::other(NAME, format!("{e} (the URL is mongodb://[user:password@]host[:port]/database)"))
        })?;
        options.server_selection_timeout.get_or_insert(CONNECT_TIMEOUT);
        options.connect_timeout.get_or_insert(CONNECT_TIMEOUT);
        options.app_name.get_or_insert_with(|| "depot".to_string());
        let client = Client::with_options(options).map_err(mongo_err)?;
        let db = client
            .default_database()
            .ok_or_else(|| EngineError::other(NAME, "the URL names no database: use mongodb://host[:port]/database"))?;
        let durable = CollectionOptions::builder()
            .write_concern(
                WriteConcern::builder().w(Acknowledgment::Majority).journal(true).w_timeout(MAJORITY_WITHIN).build(),
            )
            .build();
        let files = db.collection_with_options(&format!("{bucket}.files"), durable.clone());
        let chunks = db.collection_with_options(&format!("{bucket}.chunks"), durable);
        let engine = GridfsEngine {
            inner: Arc::new(Inner {
                db,
                files,
                chunks,
                bucket: bucket.to_string(),
                chunk: chunk_size,
                orphan_age,
                answer_within,
                scan_within,
                fetched_chunks: AtomicU64::new(0),
                fetched_bytes: AtomicU64::new(0),
            }),
        };
        let inner = &engine.inner;
        inner.ensure_index(&inner.files, doc! { "filename": 1, "uploadDate": 1 }, false).await?;
        inner.ensure_index(&inner.chunks, doc! { "files_id": 1, "n": 1 }, true).await?;
        // Leftovers cost only space, and the next start-up tries again: a
        // store that can serve should not refuse to start over them.
        if let Err(e) = engine.remove_abandoned().await {
            tracing::warn!("{e}; abandoned uploads will be removed at a later start-up");
        }
        Ok(engine)
    }

    /// Chunks and chunk bytes that reads have received from the server.
    pub fn fetched(&self) -> (u64, u64) {
        (self.inner.fetched_chunks.load(Ordering::Relaxed), self.inner.fetched_bytes.load(Ordering::Relaxed))
    }
}

/// `op`, or the server unavailable once `within` has passed.
async fn bounded_by<T>(within: Duration, op: impl Future<Output = Result<T>>) -> Result<T> {
    tokio::time::timeout(within, op).await.unwrap_or_else(|_| {
        Err(EngineError::Unavailable(format!("{NAME} engine: the server did not answer within {within:?}")))
    })
}

impl Inner {
    /// `op` (a request, or the few of a cursor's batch), given
    /// `answer_within` to finish. Dropping a late request closes its
    /// connection: the driver never reuses one with a request in flight.
    async fn bounded<T>(&self, op: impl Future<Output = Result<T>>) -> Result<T> {
        bounded_by(self.answer_within, op).await
    }

    /// A request to the server, bounded, its error classified.
    async fn call<T>(&self, op: impl IntoFuture<Output = mongodb::error::Result<T>>) -> Result<T> {
        self.bounded(async { op.await.map_err(mongo_err) }).await
    }

    /// [`Inner::call`] for a request whose work grows with the data, given
    /// `scan_within`.
    async fn call_long<T>(&self, op: impl IntoFuture<Output = mongodb::error::Result<T>>) -> Result<T> {
        bounded_by(self.scan_within, async { op.await.map_err(mongo_err) }).await
    }

    /// All that `cursor` returns, each batch bounded.
    async fn collect<T: Send + Sync + serde::de::DeserializeOwned>(&self, mut cursor: Cursor<T>) -> Result<Vec<T>> {
        let mut all = Vec::new();
        while let Some(item) = self.call(cursor.try_next()).await? {
            all.push(item);
        }
        Ok(all)
    }

    /// Inserts a document of an upload, again on a new connection when the
    /// one it went out on broke. Its `_id` is fixed, so an attempt that
    /// landed but whose answer was lost shows on the next as a duplicate
    /// key: done, if what that id holds is this document. Anything else
    /// there (a discard's hold, taken meanwhile) fails the insert.
    async fn insert(&self, coll: &Collection<Document>, doc: &Document) -> Result<()> {
        let mut delay = INSERT_RETRY_DELAY;
        let mut attempt = 1;
        loop {
            match self.bounded(async { Ok(coll.insert_one(doc).await) }).await? {
                Ok(_) => return Ok(()),
                Err(e) if attempt > 1 && duplicate_key(&e) => {
                    let id = doc.get("_id").cloned().unwrap_or(Bson::Null);
                    let stored = self.call(coll.find_one(doc! { "_id": id.clone() })).await?;
                    if stored.as_ref() == Some(doc) {
                        return Ok(());
                    }
                    return Err(EngineError::other(NAME, format!("id {id} was taken by another document: {e}")));
                }
                Err(e) if attempt < INSERT_ATTEMPTS && broken_connection(&e) => {
                    tracing::debug!(attempt, "{NAME} engine: {e}; inserting again in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay *= 4;
                    attempt += 1;
                }
                Err(e) => return Err(mongo_err(e)),
            }
        }
    }

    /// Creates an index on `keys` unless one exists already: like the
    /// GridFS drivers, so that a user allowed to read and write but not to
    /// create indexes can use a bucket prepared for it.
    async fn ensure_index(&self, coll: &Collection<Document>, keys: Document, unique: bool) -> Result<()> {
        let same = |other: &Document| {
            other.len() == keys.len()
                && other.iter().zip(keys.iter()).all(|((a, x), (b, y))| a == b && whole(Some(x)) == whole(Some(y)))
        };
        let existing: Vec<IndexModel> = match self.bounded(async { Ok(coll.list_indexes().await) }).await? {
            Ok(cursor) => self.collect(cursor).await?,
            // The collection does not exist yet.
            Err(e) if matches!(&*e.kind, ErrorKind::Command(c) if c.code == 26) => Vec::new(),
            Err(e) => return Err(mongo_err(e)),
        };
        if existing.iter().any(|index| same(&index.keys)) {
            return Ok(());
        }
        let options = IndexOptions::builder().unique(unique.then_some(true)).build();
        self.call_long(coll.create_index(IndexModel::builder().keys(keys).options(options).build())).await?;
        Ok(())
    }

    /// The files of this name, oldest `_id` first.
    async fn files_named(&self, name: &str) -> Result<Vec<FileDoc>> {
        let find = self
            .files
            .find(doc! { "filename": name })
            .sort(doc! { "_id": 1 })
            .projection(doc! { "_id": 1, "length": 1, "chunkSize": 1 });
        let docs = self.collect(self.call(find).await?).await?;
        docs.iter().map(FileDoc::parse).collect()
    }

    /// A complete file of this name, if any. When other tools stored several,
    /// the first whose chunks are all there.
    async fn find_file(&self, name: &str) -> Result<Option<FileDoc>> {
        let mut files = self.files_named(name).await?;
        if files.len() <= 1 {
            return Ok(files.pop());
        }
        for file in &files {
            let count = self.call(self.chunks.count_documents(doc! { "files_id": file.id.clone() })).await?;
            if count == file.chunk_count() {
                return Ok(Some(file.clone()));
            }
        }
        // None complete: the first one, whose read reports what is missing.
        Ok(files.into_iter().next())
    }

    /// Deletes a file: its files document first, so that no new reader
    /// finds it, then its chunks.
    async fn delete_file(&self, id: &Bson) -> Result<()> {
        self.call(self.files.delete_one(doc! { "_id": id.clone() })).await?;
        self.call_long(self.chunks.delete_many(doc! { "files_id": id.clone() })).await?;
        Ok(())
    }

    /// Removes what an unfinished writer stored under `id`.
    ///
    /// The id is taken first, by a files document named [`DISCARDING`]: a
    /// finish still in flight (its writer dropped) then fails on the id,
    /// rather than land a files document over chunks that are going, which
    /// a writer of the same content could take up meanwhile. Taken already
    /// by a files document of the blob, the upload finished after all (its
    /// reply lost): it stays, and the answer is false.
    async fn discard(&self, id: ObjectId) -> Result<bool> {
        if !self.hold(id).await? {
            return Ok(false);
        }
        self.release_hold(id).await?;
        Ok(true)
    }

    /// Takes `id` for a discard (see [`Inner::discard`]); false when a
    /// files document of the blob has it.
    async fn hold(&self, id: ObjectId) -> Result<bool> {
        let hold = doc! {
            "_id": id,
            "length": 0i64,
            "chunkSize": 1i32,
            "uploadDate": DateTime::now(),
            "filename": DISCARDING,
        };
        if let Err(e) = self.bounded(async { Ok(self.files.insert_one(hold).await) }).await? {
            if !duplicate_key(&e) {
                return Err(mongo_err(e));
            }
            // A hold left by an earlier attempt is this discard's to finish.
            let held = doc! { "_id": id, "filename": DISCARDING };
            if self.call(self.files.find_one(held)).await?.is_none() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Deletes the chunks of a discarded writer's `id`, then its hold.
    async fn release_hold(&self, id: ObjectId) -> Result<()> {
        self.call_long(self.chunks.delete_many(doc! { "files_id": id })).await?;
        self.call(self.files.delete_one(doc! { "_id": id, "filename": DISCARDING })).await?;
        Ok(())
    }

    /// Refreshes the `uploadDate` of a stored file of this name and returns
    /// its length, if there is one.
    async fn refresh(&self, name: &str) -> Result<Option<u64>> {
        let update = self
            .files
            .find_one_and_update(doc! { "filename": name }, doc! { "$set": { "uploadDate": DateTime::now() } })
            .projection(doc! { "_id": 1, "length": 1, "chunkSize": 1 });
        let found = self.call(update).await?;
        found.map(|doc| FileDoc::parse(&doc).map(|f| f.length)).transpose()
    }

    /// After inserting file `mine` under `name`: if one of that name with a
    /// smaller `_id` is stored, it stays, refreshed, and `mine` goes.
    /// Returns the length of the file that stays. Only `mine` ever goes:
    /// another writer's file may be acknowledged and read already (a
    /// duplicate left by a race is read as one, and goes with the blob).
    async fn settle(&self, name: &str, mine: ObjectId, length: u64) -> Result<u64> {
        let files = self.files_named(name).await?;
        let Some(keep) = files.first().filter(|f| f.id != Bson::ObjectId(mine)) else {
            // Mine is the first, or was deleted meanwhile by a concurrent
            // delete of the same blob.
            return Ok(length);
        };
        self.delete_file(&Bson::ObjectId(mine)).await?;
        let fresh = doc! { "$set": { "uploadDate": DateTime::now() } };
        self.call(self.files.update_one(doc! { "_id": keep.id.clone() }, fresh)).await?;
        Ok(keep.length)
    }

    /// Deletes the chunks of files that have no files document and whose
    /// newest chunk is at least `age` old. Returns how many files' chunks.
    async fn remove_orphans(&self, age: Duration) -> Result<usize> {
        let cutoff = SystemTime::now().checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH);
        // Holds of discards that a crash cut short, with their chunks.
        let stale = doc! { "filename": DISCARDING, "uploadDate": { "$lte": DateTime::from_system_time(cutoff) } };
        let holds = self.collect(self.call(self.files.find(stale).projection(doc! { "_id": 1 })).await?).await?;
        for hold in &holds {
            if let Ok(id) = hold.get_object_id("_id") {
                self.release_hold(id).await?;
            }
        }
        // Sorted first so that MongoDB walks the `files_id, n` index.
        let grouped = self
            .chunks
            .aggregate([doc! { "$sort": { "files_id": 1 } }, doc! { "$group": { "_id": "$files_id" } }])
            .allow_disk_use(true);
        let mut ids = self
            .call_long(grouped)
            .await?
            .map(|doc| doc.map_err(mongo_err).map(|mut d| d.remove("_id").unwrap_or(Bson::Null)))
            .try_chunks(ORPHAN_BATCH)
            .map_err(|e| e.1);
        let mut orphans = Vec::new();
        while let Some(batch) = bounded_by(self.scan_within, ids.try_next()).await? {
            let find = self.files.find(doc! { "_id": { "$in": batch.clone() } }).projection(doc! { "_id": 1 });
            let present = self.collect(self.call(find).await?).await?;
            let present: Vec<&Bson> = present.iter().filter_map(|d| d.get("_id")).collect();
            for id in batch.into_iter().filter(|id| !present.contains(&id)) {
                let find = self
                    .chunks
                    .find_one(doc! { "files_id": id.clone() })
                    .sort(doc! { "n": -1 })
                    .projection(doc! { "_id": 1 });
                let newest = self.call(find).await?;
                // Without an ObjectId there is no telling its age: left alone.
                if let (Bson::ObjectId(id), Some(Ok(chunk))) = (id, newest.map(|d| d.get_object_id("_id")))
                    && chunk.timestamp().to_system_time() <= cutoff
                {
                    orphans.push(id);
                }
            }
        }
        // Each taken as a discard takes it: the age comes from the writer's
        // clock, and a writer whose clock is behind may still be finishing.
        // Its files document, landed since, keeps the chunks; one that
        // lands after the hold fails its upload, so no acknowledged blob
        // loses its chunks. The hold stays until it is as old as an orphan
        // (the sweep above): such a writer counts its chunks before it
        // lands its files document, and may count them before they go.
        let mut removed = 0;
        for id in orphans {
            if self.hold(id).await? {
                self.call_long(self.chunks.delete_many(doc! { "files_id": id })).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// The URL of a fresh, empty database on the MongoDB server of the
/// `DEPOT_TEST_MONGO` URL (which `scripts/test.sh` sets after starting its
/// test server), for one test. Panics with instructions when the variable is
/// missing: tests that need MongoDB never pass without one.
#[doc(hidden)]
pub fn fresh_test_url() -> String {
    let server = std::env::var("DEPOT_TEST_MONGO")
        .expect("DEPOT_TEST_MONGO is not set: run scripts/test.sh, which starts a MongoDB test server and sets it");
    if !server.contains("://") {
        panic!("DEPOT_TEST_MONGO must be a mongodb:// URL, not {server:?}");
    }
    with_database(&server, &format!("depot_t_{:016x}", rand::random::<u64>()))
}

/// `url` (`mongodb://[user:password@]hosts[/database][?options]`) naming
/// `database` instead of any it names, its options kept.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, options) = url.split_once('?').map_or((url, None), |(b, o)| (b, Some(o)));
    let authority = base.find("://").map_or(0, |i| i + 3);
    let base = base[authority..].find('/').map_or(base, |i| &base[..authority + i]);
    match options {
        Some(o) => format!("{base}/{database}?{o}"),
        None => format!("{base}/{database}"),
    }
}

fn reclaimed(found: u64, stored: i32) -> EngineError {
    EngineError::other(
        NAME,
        format!(
            "only {found} of the upload's {stored} chunks are stored (removed as abandoned after a stall?); \
             the blob was not kept"
        ),
    )
}

struct GridfsWriter {
    inner: Arc<Inner>,
    /// The file's id; `None` once the blob is finished or discarded.
    id: Option<ObjectId>,
    buf: BytesMut,
    /// Bytes written so far.
    size: u64,
    /// Chunks stored so far.
    stored: i32,
}

impl GridfsWriter {
    async fn store(&mut self, id: ObjectId, data: BytesMut) -> Result<()> {
        let chunk = doc! {
            "_id": ObjectId::new(),
            "files_id": id,
            "n": self.stored,
            "data": Binary { subtype: BinarySubtype::Generic, bytes: Vec::from(data) },
        };
        self.inner.insert(&self.inner.chunks, &chunk).await?;
        self.stored = self.stored.checked_add(1).ok_or_else(|| EngineError::other(NAME, "blob has too many chunks"))?;
        Ok(())
    }

    fn id(&self) -> Result<ObjectId> {
        self.id.ok_or_else(|| EngineError::other(NAME, "the upload was already finished"))
    }
}

#[async_trait]
impl BlobWriter for GridfsWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let id = self.id()?;
        self.size += chunk.len() as u64;
        self.buf.extend_from_slice(&chunk);
        while self.buf.len() >= self.inner.chunk {
            let full = self.buf.split_to(self.inner.chunk);
            self.store(id, full).await?;
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        let id = self.id()?;
        let name = digest.to_hex();
        if !self.buf.is_empty() {
            let last = self.buf.split();
            self.store(id, last).await?;
        }
        let inner = self.inner.clone();
        if let Some(size) = inner.refresh(&name).await? {
            inner.discard(id).await?;
            self.id = None;
            return Ok(BlobRef { digest, size, locator: Vec::new() });
        }
        let found = inner.call(inner.chunks.count_documents(doc! { "files_id": id })).await?;
        if found != self.stored as u64 {
            return Err(reclaimed(found, self.stored));
        }
        let length = i64::try_from(self.size).map_err(|_| EngineError::other(NAME, "blob too large"))?;
        let file = doc! {
            "_id": id,
            "length": length,
            "chunkSize": inner.chunk as i32,
            "uploadDate": DateTime::now(),
            "filename": &name,
        };
        inner.insert(&inner.files, &file).await?;
        self.id = None;
        let size = inner.settle(&name, id, self.size).await?;
        Ok(BlobRef { digest, size, locator: Vec::new() })
    }

    async fn abort(mut self: Box<Self>) {
        if let Some(id) = self.id.take() {
            super::discard_staged(async { self.inner.discard(id).await.map(drop) }).await;
        }
    }
}

impl Drop for GridfsWriter {
    fn drop(&mut self) {
        // A writer dropped mid-stream (client gone) removes its chunks in the
        // background; without a runtime, they remain for a later start-up.
        if let Some(id) = self.id.take() {
            let inner = self.inner.clone();
            super::discard_staged_later(async move { inner.discard(id).await.map(drop) });
        }
    }
}

/// Where a read stands in its file's chunks.
struct ChunkReader {
    cursor: mongodb::Cursor<Document>,
    inner: Arc<Inner>,
    file: FileDoc,
    range: ByteRange,
    /// The next chunk expected, and the last one needed.
    next: u64,
    last: u64,
}

impl ChunkReader {
    fn fail(&self, what: &str) -> EngineError {
        EngineError::damaged(NAME, format!("chunk {} of file {} is {what}", self.next, self.file.id))
    }

    /// The next piece of the range, or `None` after the last.
    async fn next_piece(&mut self) -> Result<Option<Bytes>> {
        if self.next > self.last {
            return Ok(None);
        }
        let Some(mut doc) = self.inner.call(self.cursor.try_next()).await? else {
            return Err(self.fail("missing"));
        };
        if whole(doc.get("n")) != Some(self.next) {
            return Err(self.fail("missing"));
        }
        let data = match doc.remove("data") {
            Some(Bson::Binary(b)) => Bytes::from(b.bytes),
            _ => return Err(self.fail("not binary data")),
        };
        if data.len() as u64 != self.file.chunk_len(self.next) {
            return Err(self.fail(&format!("{} bytes long, not {}", data.len(), self.file.chunk_len(self.next))));
        }
        self.inner.fetched_chunks.fetch_add(1, Ordering::Relaxed);
        self.inner.fetched_bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
        let at = self.next * self.file.chunk_size;
        let from = self.range.start.max(at) - at;
        let to = self.range.end.min(at + data.len() as u64) - at;
        self.next += 1;
        Ok(Some(data.slice(from as usize..to as usize)))
    }
}

#[async_trait]
impl BlobEngine for GridfsEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn remove_abandoned(&self) -> Result<()> {
        let removed = self.inner.remove_orphans(self.inner.orphan_age).await?;
        if removed > 0 {
            tracing::info!("{NAME} engine: removed the chunks of {removed} abandoned uploads");
        }
        Ok(())
    }

    async fn writer(&self, _size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(GridfsWriter {
            inner: self.inner.clone(),
            id: Some(ObjectId::new()),
            buf: BytesMut::new(),
            size: 0,
            stored: 0,
        }))
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        let file = self.inner.find_file(&blob.digest.to_hex()).await?.ok_or(EngineError::NotFound(blob.digest))?;
        if range.end > file.length || range.start > range.end {
            return Err(EngineError::beyond_end(NAME, blob, file.length));
        }
        if range.is_empty() {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let first = range.start / file.chunk_size;
        let last = (range.end - 1) / file.chunk_size;
        let (first_n, last_n) = (i64::try_from(first), i64::try_from(last));
        let (Ok(first_n), Ok(last_n)) = (first_n, last_n) else {
            return Err(EngineError::other(NAME, "range beyond the end of the blob"));
        };
        let batch = (READ_BATCH_BYTES as u64 / file.chunk_size).clamp(1, 1024) as u32;
        // A download paced by a slow client leaves the cursor idle between
        // batches for as long as the client takes: the server's ten-minute
        // timeout would cut it. The cursor is closed when the stream is
        // dropped, so none is left open.
        let find = self
            .inner
            .chunks
            .find(doc! { "files_id": file.id.clone(), "n": { "$gte": first_n, "$lte": last_n } })
            .sort(doc! { "n": 1 })
            .projection(doc! { "_id": 0, "n": 1, "data": 1 })
            .batch_size(batch)
            .no_cursor_timeout(true);
        let cursor = self.inner.call(find).await?;
        let reader = ChunkReader { cursor, inner: self.inner.clone(), file, range, next: first, last };
        // Ends after the first error.
        let stream = futures::stream::unfold(Some(reader), |state| async move {
            let mut reader = state?;
            match reader.next_piece().await {
                Ok(Some(bytes)) => Some((Ok(bytes), Some(reader))),
                Ok(None) => None,
                Err(e) => Some((Err(e), None)),
            }
        });
        Ok(Box::pin(stream))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        for file in self.inner.files_named(&blob.digest.to_hex()).await? {
            self.inner.delete_file(&file.id).await?;
        }
        Ok(())
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        let find = self
            .inner
            .files
            .find_one(doc! { "filename": blob.digest.to_hex() })
            .projection(doc! { "_id": 1, "length": 1, "chunkSize": 1 });
        let found = self.inner.call(find).await?;
        found.map(|doc| FileDoc::parse(&doc).map(|f| f.length)).transpose()
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        // Only depot's names: the bucket may hold other tools' files too.
        let find = self
            .inner
            .files
            .find(doc! { "filename": { "$regex": "^[0-9a-f]{64}$" } })
            .projection(doc! { "_id": 1, "filename": 1, "length": 1, "chunkSize": 1, "uploadDate": 1 });
        let docs = self.inner.collect(self.inner.call(find).await?).await?;
        let mut blobs: HashMap<Digest, BlobInfo> = HashMap::with_capacity(docs.len());
        for doc in &docs {
            let Some(digest) = doc
                .get_str("filename")
                .ok()
                .filter(|name| name.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
                .and_then(Digest::from_hex)
            else {
                continue;
            };
            let size = FileDoc::parse(doc)?.length;
            let modified = doc.get_datetime("uploadDate").map_or(SystemTime::UNIX_EPOCH, |d| d.to_system_time());
            let info = BlobInfo { digest, size, locator: Vec::new(), modified };
            // Duplicates (other tools' writes): one blob, as fresh as the freshest.
            blobs.entry(digest).and_modify(|b| b.modified = b.modified.max(modified)).or_insert(info);
        }
        Ok(blobs.into_values().collect())
    }

    /// The `collStats` of the two collections: their storage size (the data
    /// size where the server reports no storage, as in-memory servers do)
    /// plus their indexes.
    async fn disk_usage(&self) -> Result<Option<u64>> {
        let mut total = 0;
        for coll in [&self.inner.files, &self.inner.chunks] {
            let command = async { Ok(self.inner.db.run_command(doc! { "collStats": coll.name() }).await) };
            let stats = match self.inner.bounded(command).await? {
                Ok(stats) => stats,
                // Not created yet.
                Err(e) if matches!(&*e.kind, ErrorKind::Command(c) if c.code == 26) => continue,
                Err(e) => return Err(mongo_err(e)),
            };
            let storage = whole(stats.get("storageSize")).filter(|&s| s > 0).or_else(|| whole(stats.get("size")));
            total += storage.unwrap_or(0) + whole(stats.get("totalIndexSize")).unwrap_or(0);
        }
        Ok(Some(total))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use futures::io::{AsyncReadExt, AsyncWriteExt};
    use mongodb::options::GridFsBucketOptions;

    use super::*;
    use crate::engine::conformance::{self, pattern};
    use crate::engine::{BlobEngineExt, sha2_digest};

    /// A single write failed with a code a retry may cure (the primary
    /// stepped down) is the server's being unavailable (503), as the same
    /// code on a command is; another code is not.
    #[test]
    fn a_write_failed_by_a_stepping_down_primary_is_unavailable() {
        let write = |code: i32| {
            let failure: mongodb::error::WriteError =
                mongodb::bson::from_document(mongodb::bson::doc! {"code": code, "errmsg": "write failed"}).unwrap();
            mongo_err(mongodb::error::Error::from(ErrorKind::Write(WriteFailure::WriteError(failure))))
        };
        assert!(matches!(write(189), EngineError::Unavailable(_)));
        assert!(matches!(write(2), EngineError::Other { .. }));
    }

    #[test]
    fn a_database_replaces_any_the_url_names_and_keeps_its_options() {
        let db = "depot_bench_1";
        assert_eq!(with_database("mongodb://h:27017", db), "mongodb://h:27017/depot_bench_1");
        assert_eq!(with_database("mongodb://h:27017/", db), "mongodb://h:27017/depot_bench_1");
        assert_eq!(with_database("mongodb://u:p@h/mydb", db), "mongodb://u:p@h/depot_bench_1");
        assert_eq!(
            with_database("mongodb://h1,h2/?replicaSet=r&authSource=admin", db),
            "mongodb://h1,h2/depot_bench_1?replicaSet=r&authSource=admin"
        );
        assert_eq!(
            with_database("mongodb://h?directConnection=true", db),
            "mongodb://h/depot_bench_1?directConnection=true"
        );
    }

    async fn engine(chunk: usize) -> (GridfsEngine, String) {
        let url = fresh_test_url();
        (GridfsEngine::connect(&url, DEFAULT_BUCKET, chunk).await.unwrap(), url)
    }

    /// Drops the test's database: the test server keeps everything in memory.
    async fn done(engine: GridfsEngine) {
        engine.inner.db.drop().await.unwrap();
    }

    async fn count(coll: &Collection<Document>, filter: Document) -> u64 {
        coll.count_documents(filter).await.unwrap()
    }

    fn blob_of(data: &[u8]) -> BlobRef {
        BlobRef { digest: Digest(sha2_digest(data)), size: data.len() as u64, locator: Vec::new() }
    }

    /// The driver's own GridFS API on the engine's bucket, as another tool
    /// would use it, with chunks of `chunk_size`.
    fn driver_bucket(engine: &GridfsEngine, chunk_size: u32) -> mongodb::gridfs::GridFsBucket {
        let options =
            GridFsBucketOptions::builder().bucket_name(engine.inner.bucket.clone()).chunk_size_bytes(chunk_size);
        engine.inner.db.gridfs_bucket(options.build())
    }

    /// Stores a file through the driver's own GridFS API.
    async fn upload(bucket: &mongodb::gridfs::GridFsBucket, name: &str, data: &[u8]) {
        let mut upload = bucket.open_upload_stream(name).await.unwrap();
        upload.write_all(data).await.unwrap();
        upload.close().await.unwrap();
    }

    /// An ObjectId made `age` ago.
    fn object_id_aged(age: Duration) -> ObjectId {
        let mut bytes = ObjectId::new().bytes();
        let at = SystemTime::now().checked_sub(age).unwrap().duration_since(SystemTime::UNIX_EPOCH).unwrap();
        bytes[..4].copy_from_slice(&(at.as_secs() as u32).to_be_bytes());
        ObjectId::from_bytes(bytes)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let (engine, _) = engine(DEFAULT_CHUNK).await;
        conformance::run_all(&engine).await;
        // Nothing but finished files' chunks remains.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let files: Vec<Document> = engine.inner.files.find(doc! {}).await.unwrap().try_collect().await.unwrap();
        let expected: u64 = files.iter().map(|f| FileDoc::parse(f).unwrap().chunk_count()).sum();
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, expected);
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance_with_small_chunks() {
        let (engine, _) = engine(1000).await;
        conformance::run_all(&engine).await;
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn files_follow_the_gridfs_layout() {
        let (engine, url) = engine(10_000).await;
        let data = pattern(25_000, 1);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        let file = engine.inner.files.find_one(doc! {}).await.unwrap().unwrap();
        assert_eq!(file.get_str("filename").unwrap(), blob.digest.to_hex());
        assert!(matches!(file.get("_id"), Some(Bson::ObjectId(_))), "{file}");
        assert_eq!(file.get("length"), Some(&Bson::Int64(25_000)));
        assert_eq!(file.get("chunkSize"), Some(&Bson::Int32(10_000)));
        assert!(matches!(file.get("uploadDate"), Some(Bson::DateTime(_))), "{file}");
        let chunks: Vec<Document> =
            engine.inner.chunks.find(doc! {}).sort(doc! { "n": 1 }).await.unwrap().try_collect().await.unwrap();
        let layout: Vec<_> = chunks
            .iter()
            .map(|c| {
                (c.get("files_id") == file.get("_id"), c.get("n").cloned(), c.get_binary_generic("data").unwrap().len())
            })
            .collect();
        let n = |i| Some(Bson::Int32(i));
        assert_eq!(layout, [(true, n(0), 10_000), (true, n(1), 10_000), (true, n(2), 5_000)]);
        // The indexes every GridFS tool expects, created once however many
        // nodes connect.
        GridfsEngine::connect(&url, DEFAULT_BUCKET, 10_000).await.unwrap();
        let indexes: Vec<IndexModel> = engine.inner.chunks.list_indexes().await.unwrap().try_collect().await.unwrap();
        let unique = indexes.iter().find(|i| i.keys == doc! { "files_id": 1, "n": 1 }).expect("chunks index");
        assert_eq!(unique.options.as_ref().and_then(|o| o.unique), Some(true));
        let indexes: Vec<IndexModel> = engine.inner.files.list_indexes().await.unwrap().try_collect().await.unwrap();
        assert_eq!(indexes.iter().filter(|i| i.keys == doc! { "filename": 1, "uploadDate": 1 }).count(), 1);
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn range_reads_fetch_only_the_chunks_they_need() {
        let (engine, _) = engine(10_000).await;
        let data = pattern(100_000, 7);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        // (range, chunks fetched, bytes fetched): never more than the chunks
        // the range touches.
        let cases = [
            ((30_000, 55_000), 3, 30_000),
            ((31_234, 31_235), 1, 10_000),
            ((39_999, 50_001), 3, 30_000),
            ((99_999, 100_000), 1, 10_000),
            ((0, 100_000), 10, 100_000),
        ];
        for ((start, end), chunks, bytes) in cases {
            let before = engine.fetched();
            let got = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
            assert!(got == data[start as usize..end as usize], "range {start}..{end}");
            let after = engine.fetched();
            assert_eq!((after.0 - before.0, after.1 - before.1), (chunks, bytes), "range {start}..{end}");
        }
        // Without the chunks outside 30,000..60,000, those ranges still read.
        let outside = doc! { "n": { "$not": { "$gte": 3, "$lte": 5 } } };
        engine.inner.chunks.delete_many(outside).await.unwrap();
        for (start, end) in [(30_000, 55_000), (31_234, 31_235), (30_000, 60_000)] {
            let got = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap();
            assert!(got == data[start as usize..end as usize], "range {start}..{end}");
        }
        for (start, end) in [(29_999, 30_001), (55_000, 60_001), (0, 100_000)] {
            let err = engine.read_to_vec(&blob, ByteRange { start, end }).await.unwrap_err();
            assert!(err.to_string().contains("missing"), "{err}");
        }
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_chunk_of_the_wrong_length_is_an_error() {
        let (engine, _) = engine(10_000).await;
        let data = pattern(30_000, 8);
        let blob = engine.put_bytes(data).await.unwrap();
        let short = Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 9_999] };
        engine.inner.chunks.update_one(doc! { "n": 1 }, doc! { "$set": { "data": short } }).await.unwrap();
        engine.read_to_vec(&blob, ByteRange { start: 0, end: 10_000 }).await.unwrap();
        let err = engine.read_to_vec(&blob, ByteRange { start: 0, end: 30_000 }).await.unwrap_err();
        assert!(err.to_string().contains("9999 bytes long, not 10000"), "{err}");
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn the_drivers_gridfs_bucket_reads_and_writes_the_same_files() {
        let (engine, _) = engine(DEFAULT_CHUNK).await;
        let bucket = driver_bucket(&engine, 70_000);
        // Written by the driver, in chunks of its own size; read by depot.
        let theirs = pattern(1_000_000, 9);
        let blob = blob_of(&theirs);
        upload(&bucket, &blob.digest.to_hex(), &theirs).await;
        assert_eq!(engine.stat(&blob).await.unwrap(), Some(1_000_000));
        assert!(engine.read_to_vec(&blob, ByteRange::full(1_000_000)).await.unwrap() == theirs);
        let got = engine.read_to_vec(&blob, ByteRange { start: 69_999, end: 140_001 }).await.unwrap();
        assert!(got == theirs[69_999..140_001]);
        assert!(engine.list().await.unwrap().iter().any(|b| b.digest == blob.digest && b.size == 1_000_000));
        // Written by depot; read by the driver.
        let ours = pattern(600_000, 10);
        let written = engine.put_bytes(ours.clone()).await.unwrap();
        let mut download = bucket.open_download_stream_by_name(written.digest.to_hex()).await.unwrap();
        let mut back = Vec::new();
        download.read_to_end(&mut back).await.unwrap();
        assert!(back == ours, "the driver read {} bytes, not depot's blob", back.len());
        // Another tool's file with a name that is not a digest is left alone.
        upload(&bucket, "notes.txt", b"hello").await;
        let mut listed: Vec<_> = engine.list().await.unwrap().into_iter().map(|b| b.digest).collect();
        listed.sort();
        let mut expected = vec![blob.digest, written.digest];
        expected.sort();
        assert_eq!(listed, expected);
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn duplicate_files_of_other_tools_read_as_one_blob() {
        let (engine, _) = engine(DEFAULT_CHUNK).await;
        let bucket = driver_bucket(&engine, 4_000);
        let data = pattern(10_000, 11);
        let blob = blob_of(&data);
        for _ in 0..3 {
            upload(&bucket, &blob.digest.to_hex(), &data).await;
        }
        // The oldest copy lost a chunk; a read takes a complete one.
        let oldest = engine.inner.files.find_one(doc! {}).sort(doc! { "_id": 1 }).await.unwrap().unwrap();
        let oldest = oldest.get("_id").unwrap().clone();
        engine.inner.chunks.delete_one(doc! { "files_id": oldest, "n": 1 }).await.unwrap();
        assert!(engine.read_to_vec(&blob, ByteRange::full(10_000)).await.unwrap() == data);
        assert_eq!(engine.list().await.unwrap().len(), 1);
        engine.delete(&blob).await.unwrap();
        assert_eq!(engine.stat(&blob).await.unwrap(), None);
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, 0);
        done(engine).await;
    }

    /// Two writers of one content leave one file, or, when each looked for
    /// the other before the other's file was there, two: one blob either
    /// way, read as one and deleted whole.
    #[tokio::test(flavor = "multi_thread")]
    async fn two_nodes_writing_the_same_content_leave_one_file() {
        let (a, url) = engine(64 * 1024).await;
        let b = GridfsEngine::connect(&url, DEFAULT_BUCKET, 64 * 1024).await.unwrap();
        let data = pattern(1_000_000, 12);
        let blob = blob_of(&data);
        for _ in 0..5 {
            let (x, y) = futures::join!(a.put_bytes(data.clone()), b.put_bytes(data.clone()));
            assert_eq!(x.unwrap(), y.unwrap());
            let files = count(&a.inner.files, doc! {}).await;
            assert!((1..=2).contains(&files), "{files} files");
            // Only the kept files' chunks remain: 1,000,000 bytes in 64 KiB chunks.
            assert_eq!(count(&a.inner.chunks, doc! {}).await, 16 * files);
            assert_eq!(a.list().await.unwrap().len(), 1);
        }
        assert!(b.read_to_vec(&blob, ByteRange::full(1_000_000)).await.unwrap() == data);
        a.delete(&blob).await.unwrap();
        assert_eq!((count(&a.inner.files, doc! {}).await, count(&a.inner.chunks, doc! {}).await), (0, 0));
        done(a).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn writing_stored_content_again_refreshes_it() {
        let (engine, _) = engine(10_000).await;
        let data = pattern(25_000, 13);
        engine.put_bytes(data.clone()).await.unwrap();
        let old = DateTime::from_millis(DateTime::now().timestamp_millis() - 7_200_000);
        engine.inner.files.update_one(doc! {}, doc! { "$set": { "uploadDate": old } }).await.unwrap();
        engine.put_bytes(data).await.unwrap();
        let listed = engine.list().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert!(listed[0].modified.elapsed().unwrap_or_default() < Duration::from_secs(60), "{listed:?}");
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, 3);
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn abandoned_writers_remove_their_chunks() {
        let (engine, _) = engine(64 * 1024).await;
        let mut aborted = engine.writer(None).await.unwrap();
        aborted.write(pattern(300_000, 14)).await.unwrap();
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, 4);
        aborted.abort().await;
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, 0);
        let mut dropped = engine.writer(None).await.unwrap();
        dropped.write(pattern(300_000, 15)).await.unwrap();
        drop(dropped);
        // Its cleanup runs in the background: the chunks go, then the hold
        // on their id that it took first.
        let deadline = Instant::now() + Duration::from_secs(10);
        while count(&engine.inner.chunks, doc! {}).await + count(&engine.inner.files, doc! {}).await > 0 {
            assert!(Instant::now() < deadline, "a dropped writer's chunks, or its cleanup's hold, remain");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        done(engine).await;
    }

    /// A writer that has stored `data` and not finished.
    async fn writing(engine: &GridfsEngine, data: &Bytes) -> Box<dyn BlobWriter> {
        let mut writer = engine.writer(None).await.unwrap();
        writer.write(data.clone()).await.unwrap();
        writer
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_writer_that_lost_chunks_keeps_no_file() {
        let (engine, _) = engine(64 * 1024).await;
        let data = pattern(200_000, 16);
        let writer = writing(&engine, &data).await;
        // What orphan cleanup does to an upload that stalled for too long.
        engine.inner.chunks.delete_one(doc! { "n": 1 }).await.unwrap();
        let err = writer.finish(Digest(sha2_digest(&data))).await.unwrap_err();
        assert!(err.to_string().contains("only 3 of the upload's 4 chunks"), "{err}");
        assert!(engine.list().await.unwrap().is_empty());
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn discarding_an_upload_whose_finish_landed_keeps_the_file() {
        // A writer dropped while its files document was on its way.
        let (engine, _) = engine(64 * 1024).await;
        let data = pattern(200_000, 17);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        let file = engine.inner.files.find_one(doc! {}).await.unwrap().unwrap();
        engine.inner.discard(file.get_object_id("_id").unwrap()).await.unwrap();
        assert!(engine.read_to_vec(&blob, ByteRange::full(200_000)).await.unwrap() == data);
        done(engine).await;
    }

    /// A finish still on its way when its dropped writer's chunks are
    /// discarded fails on the discard's hold of its id, rather than land a
    /// files document over chunks that are gone, which a writer of the same
    /// content would then take up; and the hold goes with the chunks.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_finish_that_lands_during_its_discard_leaves_no_file() {
        let (engine, _) = engine(64 * 1024).await;
        let data = pattern(200_000, 19);
        let writer = writing(&engine, &data).await;
        let id = engine.inner.chunks.find_one(doc! {}).await.unwrap().unwrap().get_object_id("files_id").unwrap();
        let file = doc! {
            "_id": id,
            "length": 200_000i64,
            "chunkSize": 64 * 1024i32,
            "uploadDate": DateTime::now(),
            "filename": Digest(sha2_digest(&data)).to_hex(),
        };
        // The discard takes the id just before the finish's insert lands.
        let hold = doc! { "_id": id, "length": 0i64, "chunkSize": 1i32, "filename": DISCARDING };
        engine.inner.files.insert_one(hold).await.unwrap();
        assert!(engine.inner.insert(&engine.inner.files, &file).await.is_err(), "the finish landed over a discard");
        // The discard goes on from its hold.
        writer.abort().await;
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, 0, "the discarded writer's chunks remain");
        assert_eq!(count(&engine.inner.files, doc! {}).await, 0, "a files document outlived its discard");
        // A writer of the same content stores its own file, whole.
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        assert!(engine.read_to_vec(&blob, ByteRange::full(200_000)).await.unwrap() == data);
        done(engine).await;
    }

    /// A hold that a crash left behind goes, with its chunks, once as old
    /// as orphaned chunks.
    #[tokio::test(flavor = "multi_thread")]
    async fn holds_left_by_a_crash_go_once_old_enough() {
        let (engine, _) = engine(64 * 1024).await;
        let (old, new) = (ObjectId::new(), ObjectId::new());
        for (id, age) in [(old, Duration::from_secs(7200)), (new, Duration::ZERO)] {
            let at = DateTime::from_system_time(SystemTime::now() - age);
            let hold = doc! { "_id": id, "length": 0i64, "chunkSize": 1i32, "uploadDate": at, "filename": DISCARDING };
            engine.inner.files.insert_one(hold).await.unwrap();
            let data = Binary { subtype: BinarySubtype::Generic, bytes: vec![1; 100] };
            engine.inner.chunks.insert_one(doc! { "files_id": id, "n": 0, "data": data }).await.unwrap();
        }
        engine.inner.remove_orphans(ORPHAN_AGE).await.unwrap();
        assert_eq!(count(&engine.inner.files, doc! { "_id": old }).await, 0);
        assert_eq!(count(&engine.inner.chunks, doc! { "files_id": old }).await, 0);
        assert_eq!(count(&engine.inner.files, doc! { "_id": new }).await, 1, "a discard in progress lost its hold");
        assert!(engine.list().await.unwrap().is_empty(), "a hold is listed as a blob");
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn orphaned_chunks_are_removed_at_connect_once_old_enough() {
        let (engine, url) = engine(64 * 1024).await;
        let kept = engine.put_bytes(pattern(200_000, 18)).await.unwrap();
        // A writer that crashed two hours ago, and one on another node that
        // is writing right now.
        let (crashed, live) = (object_id_aged(Duration::from_secs(7200)), ObjectId::new());
        for (files_id, made) in [(crashed, Duration::from_secs(7200)), (live, Duration::ZERO)] {
            for n in 0..3 {
                let data = Binary { subtype: BinarySubtype::Generic, bytes: vec![n as u8; 100] };
                let chunk = doc! { "_id": object_id_aged(made), "files_id": files_id, "n": n, "data": data };
                engine.inner.chunks.insert_one(chunk).await.unwrap();
            }
        }
        GridfsEngine::connect(&url, DEFAULT_BUCKET, 64 * 1024).await.unwrap();
        assert_eq!(count(&engine.inner.chunks, doc! { "files_id": crashed }).await, 0);
        assert_eq!(count(&engine.inner.chunks, doc! { "files_id": live }).await, 3);
        // A late finish of the crashed writer, whose clock was behind, fails
        // on the id its orphans' hold keeps: no file without its chunks.
        let late = doc! { "_id": crashed, "length": 300i64, "chunkSize": 100i32, "filename": "0".repeat(64) };
        assert!(engine.inner.insert(&engine.inner.files, &late).await.is_err(), "a files document over no chunks");
        assert!(engine.list().await.unwrap().len() == 1, "a hold is listed as a blob");
        GridfsEngine::connect_with(&url, DEFAULT_BUCKET, 64 * 1024, Duration::ZERO).await.unwrap();
        assert_eq!(count(&engine.inner.chunks, doc! { "files_id": live }).await, 0);
        // The finished blob is untouched.
        assert_eq!(count(&engine.inner.chunks, doc! {}).await, 4);
        assert_eq!(engine.read_to_vec(&kept, ByteRange::full(200_000)).await.unwrap().len(), 200_000);
        done(engine).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn buckets_are_apart() {
        let url = fresh_test_url();
        let a = GridfsEngine::connect(&url, "depot", 10_000).await.unwrap();
        let b = GridfsEngine::connect(&url, DEFAULT_BUCKET, 10_000).await.unwrap();
        a.put_bytes(pattern(5_000, 19)).await.unwrap();
        assert_eq!(a.list().await.unwrap().len(), 1);
        assert!(b.list().await.unwrap().is_empty());
        let names = a.inner.db.list_collection_names().await.unwrap();
        assert!(names.contains(&"depot.files".to_string()) && names.contains(&"depot.chunks".to_string()), "{names:?}");
        done(a).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn bad_settings_are_clear_errors() {
        let server = std::env::var("DEPOT_TEST_MONGO").expect("DEPOT_TEST_MONGO is not set: run scripts/test.sh");
        let err = GridfsEngine::connect(server.trim_end_matches('/'), DEFAULT_BUCKET, DEFAULT_CHUNK).await.unwrap_err();
        assert!(err.to_string().contains("names no database"), "{err}");
        let err = GridfsEngine::connect("http://example.com/db", DEFAULT_BUCKET, DEFAULT_CHUNK).await.unwrap_err();
        assert!(err.to_string().contains("mongodb://"), "{err}");
        let err = GridfsEngine::connect(&fresh_test_url(), DEFAULT_BUCKET, 100).await.unwrap_err();
        assert!(err.to_string().contains("chunk size 100"), "{err}");
        let err = GridfsEngine::connect(&fresh_test_url(), "", DEFAULT_CHUNK).await.unwrap_err();
        assert!(err.to_string().contains("bucket name"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_unreachable_server_is_unavailable_within_seconds() {
        let started = Instant::now();
        let err =
            GridfsEngine::connect("mongodb://127.0.0.1:1/depot", DEFAULT_BUCKET, DEFAULT_CHUNK).await.unwrap_err();
        assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
        let message = err.to_string();
        assert!(message.contains("gridfs engine") && message.contains("unavailable"), "{message}");
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    }

    /// `url` through a TCP proxy that resets the first connection to carry
    /// more than `cut_after` bytes to the server, once; and whether it has.
    async fn resetting_proxy(url: &str, cut_after: usize) -> (String, Arc<AtomicBool>) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let authority = url.trim_start_matches("mongodb://").split(['/', '?']).next().unwrap().to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxied = url.replacen(&authority, &listener.local_addr().unwrap().to_string(), 1);
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = cut.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut server = tokio::net::TcpStream::connect(&authority).await.unwrap();
                let cut = cutting.clone();
                tokio::spawn(async move {
                    let (mut up, mut down) = (vec![0; 64 * 1024], vec![0; 64 * 1024]);
                    let mut sent = 0;
                    loop {
                        tokio::select! {
                            n = client.read(&mut up) => {
                                let Ok(n @ 1..) = n else { break };
                                sent += n;
                                if sent > cut_after && !cut.swap(true, Ordering::SeqCst) {
                                    // Closing with no lingering sends a reset.
                                    client.set_zero_linger().unwrap();
                                    server.set_zero_linger().unwrap();
                                    break;
                                }
                                if server.write_all(&up[..n]).await.is_err() { break }
                            }
                            n = server.read(&mut down) => {
                                let Ok(n @ 1..) = n else { break };
                                if client.write_all(&down[..n]).await.is_err() { break }
                            }
                        }
                    }
                });
            }
        });
        (proxied, cut)
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_upload_goes_on_after_its_connection_is_reset() {
        let (direct, url) = engine(DEFAULT_CHUNK).await;
        let (proxied, cut) = resetting_proxy(&url, 3 * DEFAULT_CHUNK).await;
        let engine = GridfsEngine::connect(&proxied, DEFAULT_BUCKET, DEFAULT_CHUNK).await.unwrap();
        let data = pattern(10 * DEFAULT_CHUNK, 22);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        assert!(cut.load(Ordering::SeqCst), "the proxy never reset the upload's connection");
        assert!(engine.read_to_vec(&blob, ByteRange::full(blob.size)).await.unwrap() == data);
        // One chunk per piece, none twice.
        assert_eq!(count(&direct.inner.chunks, doc! {}).await, 10);
        done(direct).await;
    }

    /// A files document as `finish` writes it, padded to `padding` bytes so
    /// that the resetting proxy cuts its first attempt, not what comes
    /// before it on the connection.
    fn padded_file(id: ObjectId, name: &str, padding: usize) -> Document {
        let padding = Binary { subtype: BinarySubtype::Generic, bytes: vec![7; padding] };
        doc! {
            "_id": id,
            "length": 0i64,
            "chunkSize": 1i32,
            "uploadDate": DateTime::now(),
            "filename": name,
            "metadata": { "padding": padding },
        }
    }

    /// A retried insert whose id is taken by another document (a discard's
    /// hold, taken while its first attempt's connection broke) fails, rather
    /// than take that document for its own; one that finds its own, landed
    /// by the first attempt, succeeds.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_retried_insert_takes_no_other_document_for_its_own() {
        let (direct, url) = engine(64 * 1024).await;
        let files = &direct.inner.files;
        let id = ObjectId::new();
        files.insert_one(doc! { "_id": id, "length": 0i64, "chunkSize": 1i32, "filename": DISCARDING }).await.unwrap();
        let (proxied, cut) = resetting_proxy(&url, 1_000_000).await;
        let engine = GridfsEngine::connect(&proxied, DEFAULT_BUCKET, 64 * 1024).await.unwrap();
        let err = engine.inner.insert(&engine.inner.files, &padded_file(id, "a", 2_000_000)).await.unwrap_err();
        assert!(cut.load(Ordering::SeqCst), "the proxy never reset the insert's connection");
        assert!(err.to_string().contains("taken by another document"), "{err}");
        assert_eq!(count(files, doc! { "_id": id, "filename": DISCARDING }).await, 1);

        let mine = padded_file(ObjectId::new(), "b", 2_000_000);
        files.insert_one(&mine).await.unwrap();
        let (proxied, cut) = resetting_proxy(&url, 1_000_000).await;
        let engine = GridfsEngine::connect(&proxied, DEFAULT_BUCKET, 64 * 1024).await.unwrap();
        engine.inner.insert(&engine.inner.files, &mine).await.unwrap();
        assert!(cut.load(Ordering::SeqCst), "the proxy never reset the insert's connection");
        done(direct).await;
    }

    /// `url` through a TCP proxy that passes everything on, except that a
    /// connection whose client sends a request containing `stall_on` never
    /// answers again, as a hung server does; its socket stays open.
    async fn stalling_proxy(url: &str, stall_on: &'static [u8]) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let authority = url.trim_start_matches("mongodb://").split(['/', '?']).next().unwrap().to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxied = url.replacen(&authority, &listener.local_addr().unwrap().to_string(), 1);
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut server = tokio::net::TcpStream::connect(&authority).await.unwrap();
                tokio::spawn(async move {
                    let (mut up, mut down) = (vec![0; 64 * 1024], vec![0; 64 * 1024]);
                    loop {
                        tokio::select! {
                            n = client.read(&mut up) => {
                                let Ok(n @ 1..) = n else { break };
                                if up[..n].windows(stall_on.len()).any(|w| w == stall_on) {
                                    std::future::pending::<()>().await;
                                }
                                if server.write_all(&up[..n]).await.is_err() { break }
                            }
                            n = server.read(&mut down) => {
                                let Ok(n @ 1..) = n else { break };
                                if client.write_all(&down[..n]).await.is_err() { break }
                            }
                        }
                    }
                });
            }
        });
        proxied
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_server_that_stops_answering_fails_requests_within_the_bound() {
        let (direct, url) = engine(64 * 1024).await;
        // A lost majority fails a write on the server's side in time too.
        assert_eq!(direct.inner.chunks.write_concern().and_then(|c| c.w_timeout), Some(MAJORITY_WITHIN));
        assert_eq!(direct.inner.files.write_concern().and_then(|c| c.w_timeout), Some(MAJORITY_WITHIN));
        let proxied = stalling_proxy(&url, b"insert").await;
        let bound = Duration::from_secs(1);
        let engine = GridfsEngine::open(&proxied, DEFAULT_BUCKET, 64 * 1024, ORPHAN_AGE, (bound, bound)).await.unwrap();
        let started = Instant::now();
        let put = tokio::time::timeout(Duration::from_secs(20), engine.put_bytes(pattern(100_000, 23))).await;
        let err = put.expect("a write waited for a server that never answers").unwrap_err();
        assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("did not answer within 1s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
        // What the server does answer still goes through.
        assert_eq!(engine.stat(&blob_of(b"x")).await.unwrap(), None);
        done(direct).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_cleanup_that_fails_at_connect_does_not_stop_the_engine() {
        let (direct, url) = engine(64 * 1024).await;
        // The orphan scan's aggregation never gets an answer.
        let proxied = stalling_proxy(&url, b"aggregate").await;
        let bound = Duration::from_secs(1);
        let connect = GridfsEngine::open(&proxied, DEFAULT_BUCKET, 64 * 1024, ORPHAN_AGE, (bound, bound));
        let engine = tokio::time::timeout(Duration::from_secs(20), connect).await.expect("connect hung").unwrap();
        assert_eq!(engine.stat(&blob_of(b"x")).await.unwrap(), None);
        done(direct).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn disk_usage_grows_with_the_blobs() {
        let (engine, _) = engine(DEFAULT_CHUNK).await;
        let before = engine.disk_usage().await.unwrap().unwrap();
        engine.put_bytes(pattern(3_000_000, 20)).await.unwrap();
        let after = engine.disk_usage().await.unwrap().unwrap();
        assert!(after >= before + 3_000_000, "{before} -> {after}");
        done(engine).await;
    }
}
