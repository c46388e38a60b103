//! Blob engines: where the bytes of immutable, content-addressed blobs live.
//!
//! A [`BlobEngine`] stores blobs named by the SHA-256 of their content. It
//! knows nothing of buckets, keys or HTTP; the [`Store`](crate::store::Store)
//! decides which blobs exist and when they may go. Every engine:
//!
//! - takes a blob as a stream through a [`BlobWriter`] and makes it durable in
//!   [`BlobWriter::finish`] before returning: a blob that `finish` returned for
//!   survives a crash, a blob whose writer was aborted or dropped leaves no
//!   bytes behind once the engine has been reopened;
//! - reads any byte range without reading what comes before it, as a stream of
//!   bounded chunks: no engine holds a whole blob in memory (but `memory`);
//! - is safe to write the same content twice, concurrently: both writers
//!   succeed and one blob remains.
//!
//! The same conformance suite (`engine::conformance`, in tests) runs
//! against every engine.

#[cfg(test)]
pub mod conformance;
#[cfg(test)]
pub mod faulty;
pub mod fs;
pub mod gridfs;
pub(crate) mod group_commit;
pub mod hybrid;
pub mod mapped;
pub mod memory;
pub mod postgres;
pub mod rocks;
pub mod s3;
pub mod sqlite;

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

/// The SHA-256 of a blob's content: its address.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    pub fn to_hex(&self) -> String {
        String::from_utf8(self.hex_bytes().to_vec()).expect("hex is ASCII")
    }

    /// The 64 lower-case hex digits, without an allocation.
    pub fn hex_bytes(&self) -> [u8; 64] {
        let mut out = [0; 64];
        hex::encode_to_slice(self.0, &mut out).expect("64 digits for 32 bytes");
        out
    }

    /// Parses 64 hex digits (either case).
    pub fn from_hex(s: &str) -> Option<Digest> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", &self.to_hex()[..12])
    }
}

/// Where an engine put a blob, beyond its digest: opaque to everyone else and
/// kept in the catalog's blob record. Most engines leave it empty; a tiered
/// engine records the tier.
pub type Locator = Vec<u8>;

/// A blob as the catalog knows it: enough for an engine to find it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobRef {
    pub digest: Digest,
    pub size: u64,
    pub locator: Locator,
}

/// A half-open byte range `start..end` within a blob, already resolved
/// against the blob's size (`start <= end <= size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn full(size: u64) -> ByteRange {
        ByteRange { start: 0, end: size }
    }

    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// What engines report about one stored blob when listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobInfo {
    pub digest: Digest,
    pub size: u64,
    pub locator: Locator,
    /// When the bytes were last written; the garbage collector leaves blobs
    /// younger than its grace period alone.
    pub modified: SystemTime,
}

impl BlobInfo {
    /// The blob as the engine's calls name it.
    pub fn blob_ref(&self) -> BlobRef {
        BlobRef { digest: self.digest, size: self.size, locator: self.locator.clone() }
    }
}

/// Errors from an engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error("blob {0} not found")]
    NotFound(Digest),
    /// Durability can no longer be promised: a sync failed. The store stops
    /// taking writes, because retrying an fsync can silently lose data.
    #[error("sync failed, writes are disabled until restart: {0}")]
    SyncFailed(std::io::Error),
    #[error("no space left on the storage device")]
    NoSpace,
    /// A blob larger than the engine can keep (the `s3` engine's 5 GiB).
    #[error("{engine} engine: blobs are limited to {max} bytes")]
    TooLarge { engine: &'static str, max: u64 },
    /// The engine's server is unreachable; the request may succeed later.
    #[error("{0}")]
    Unavailable(String),
    #[error("{engine} engine: {source}")]
    Io {
        engine: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The stored bytes are not as written: cut short, or their chunks
    /// missing or of the wrong size. The blob is lost; the engine is not.
    #[error("{engine} engine: damaged blob: {message}")]
    Damaged { engine: &'static str, message: String },
    #[error("{engine} engine: {message}")]
    Other { engine: &'static str, message: String },
}

impl EngineError {
    /// Classifies an I/O error, keeping out-of-space apart from the rest,
    /// and the process (or system) out of file descriptors: that passes as
    /// connections close, so the request may succeed later (503).
    pub fn io(engine: &'static str, source: std::io::Error) -> EngineError {
        match source.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => EngineError::NoSpace,
            Some(libc::EMFILE | libc::ENFILE) => EngineError::Unavailable(format!("{engine} engine: {source}")),
            _ if source.kind() == std::io::ErrorKind::StorageFull => EngineError::NoSpace,
            _ => EngineError::Io { engine, source },
        }
    }

    pub fn other(engine: &'static str, message: impl fmt::Display) -> EngineError {
        EngineError::Other { engine, message: message.to_string() }
    }

    pub fn damaged(engine: &'static str, message: impl fmt::Display) -> EngineError {
        EngineError::Damaged { engine, message: message.to_string() }
    }

    /// A read of `range` past the `held` bytes an engine keeps for `blob`:
    /// damage when its record says the blob is longer (its bytes were cut,
    /// which `verify` names), else the caller's mistake.
    pub fn beyond_end(engine: &'static str, blob: &BlobRef, held: u64) -> EngineError {
        match held < blob.size {
            true => EngineError::damaged(
                engine,
                format!("blob {} holds {held} bytes, its record says {}", blob.digest, blob.size),
            ),
            false => EngineError::other(engine, "range beyond the end of the blob"),
        }
    }
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// A stream of a blob's bytes in chunks of bounded size.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes>> + Send>>;

/// Receives one blob's bytes. Dropping a writer without calling
/// [`finish`](BlobWriter::finish) abandons the blob: no bytes of it remain
/// visible, and any staged bytes are removed by the writer or on reopen.
#[async_trait]
pub trait BlobWriter: Send {
    /// Appends bytes to the blob.
    async fn write(&mut self, chunk: Bytes) -> Result<()>;

    /// Makes the blob durable under `digest`, the SHA-256 of everything
    /// written, and returns where it is. If a blob with that digest exists
    /// already, the result is one blob; it still counts as freshly written
    /// for the garbage collector's grace period.
    async fn finish(self: Box<Self>, digest: Digest) -> Result<BlobRef>;

    /// [`BlobWriter::finish`], except that the blob may become durable only
    /// at the engine's next [`BlobEngine::sync`]: a batch of blobs then
    /// waits for one sync rather than one each.
    async fn finish_unsynced(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        self.finish(digest).await
    }

    /// Abandons the blob and removes whatever was staged for it.
    async fn abort(self: Box<Self>);
}

/// A store of immutable blobs addressed by SHA-256.
#[async_trait]
pub trait BlobEngine: Send + Sync + 'static {
    /// The engine's name as given to `--engine`.
    fn name(&self) -> &'static str;

    /// Starts a new blob. `size_hint` is the expected length when known,
    /// which lets a tiered engine choose a tier before the first byte.
    async fn writer(&self, size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>>;

    /// Makes every blob finished so far durable, those of
    /// [`BlobWriter::finish_unsynced`] included.
    async fn sync(&self) -> Result<()> {
        Ok(())
    }

    /// Reads `range` of a blob as a stream, without reading the bytes
    /// before `range.start`.
    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream>;

    /// [`BlobEngine::read`] for an answer about to go out on a socket: an
    /// engine may give chunks [`mapped`] from its files, which the socket
    /// sends from the page cache without their being copied.
    async fn read_to_send(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        self.read(blob, range).await
    }

    /// Deletes a blob. Deleting a blob that is not there is not an error.
    /// A blob an engine carries in its locator (`hybrid`'s smallest) lives
    /// as long as the catalog's record of it: deleting it frees nothing.
    async fn delete(&self, blob: &BlobRef) -> Result<()>;

    /// Whether a blob is stored, and its size.
    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>>;

    /// Every stored blob, in no particular order (those carried in their
    /// locators are the catalog's, and not listed). Used by garbage
    /// collection and verification, never on a request path.
    async fn list(&self) -> Result<Vec<BlobInfo>>;

    /// Removes what writers that crashed, or lost the engine's server for
    /// good, left staged: parts of blobs never finished, older than the
    /// engine's cleanup age. Run when the engine opens, and by the
    /// collector.
    async fn remove_abandoned(&self) -> Result<()> {
        Ok(())
    }

    /// Bytes the engine occupies on its storage, when it can tell.
    async fn disk_usage(&self) -> Result<Option<u64>> {
        Ok(None)
    }

    /// Many small blobs whole, in order, for batch answers (the answer is
    /// held in memory, so callers pass small blobs only). The default reads
    /// them one after another; an engine that can fetch many values in one
    /// call does so.
    async fn read_small(&self, blobs: &[BlobRef]) -> Result<Vec<Bytes>> {
        let mut out = Vec::with_capacity(blobs.len());
        for blob in blobs {
            out.push(self.read_to_vec(blob, ByteRange::full(blob.size)).await?.into());
        }
        Ok(out)
    }
}

/// Conveniences every engine gets from the required operations.
#[async_trait]
pub trait BlobEngineExt: BlobEngine {
    /// Stores a whole blob held in memory: for tests and tiny values.
    async fn put_bytes(&self, bytes: Bytes) -> Result<BlobRef> {
        let digest = Digest(sha2_digest(&bytes));
        let mut writer = self.writer(Some(bytes.len() as u64)).await?;
        if !bytes.is_empty() {
            writer.write(bytes).await?;
        }
        writer.finish(digest).await
    }

    /// Reads a range into memory: for tests and tiny values.
    async fn read_to_vec(&self, blob: &BlobRef, range: ByteRange) -> Result<Vec<u8>> {
        use futures::TryStreamExt;
        let mut stream = self.read(blob, range).await?;
        let mut out = Vec::with_capacity(range.len() as usize);
        while let Some(chunk) = stream.try_next().await? {
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }
}

impl<T: BlobEngine + ?Sized> BlobEngineExt for T {}

/// A stream of what a channel receives: how blocking readers hand chunks
/// to async consumers, one bounded channel ahead.
pub(crate) fn channel_stream<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Reads a blob's pieces on the blocking pool, each in a task of its own,
/// one piece ahead of the consumer: `read` is called for each of `pieces`
/// in order. A consumer that reads slowly holds no thread of the pool
/// while it lags: with a thread parked per slow download, a few hundred
/// of them would stall every blocking task of the runtime, the catalog's
/// lookups included. The stream ends after the first error, and reading
/// stops when the consumer goes away.
pub(crate) fn read_blocking<P, F>(engine: &'static str, pieces: P, read: F) -> ByteStream
where
    P: IntoIterator + 'static,
    P::IntoIter: Send,
    P::Item: Send + 'static,
    F: Fn(P::Item) -> Result<Bytes> + Send + Sync + 'static,
{
    use futures::StreamExt;
    let read = Arc::new(read);
    let reads = futures::stream::iter(pieces)
        .map(move |piece| {
            let read = read.clone();
            async move {
                tokio::task::spawn_blocking(move || read(piece))
                    .await
                    .map_err(|e| EngineError::other(engine, format!("blocking task failed: {e}")))?
            }
        })
        .buffered(2);
    Box::pin(ends_at_first_error(reads))
}

/// `stream` up to and including its first error: what comes after a
/// failed piece (read ahead of it) is not sent.
pub(crate) fn ends_at_first_error<T: Send>(
    stream: impl futures::Stream<Item = Result<T>> + Send,
) -> impl futures::Stream<Item = Result<T>> + Send {
    use futures::StreamExt;
    let mut failed = false;
    stream.take_while(move |item| {
        let go = !failed;
        failed |= item.is_err();
        futures::future::ready(go)
    })
}

/// Bytes a directory tree occupies on disk (allocated blocks, not lengths).
pub fn dir_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => m.blocks() * 512 + dir_usage(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// Removes what an abandoned writer staged on a server: `abort` awaits the
/// returned future, a dropped writer gets it spawned (`Drop` cannot wait).
/// A failure is logged, not returned: the engine removes the leftovers at a
/// later start-up, as it would after a crash.
pub(crate) async fn discard_staged(cleanup: impl std::future::Future<Output = Result<()>>) {
    if let Err(e) = cleanup.await {
        tracing::warn!("{e}; the upload's chunks will be removed at a later start-up");
    }
}

/// [`discard_staged`] in the background, for a writer's `Drop`; without a
/// runtime the leftovers wait for a later start-up.
pub(crate) fn discard_staged_later(cleanup: impl std::future::Future<Output = Result<()>> + Send + 'static) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(discard_staged(cleanup));
    }
}

/// SHA-256 of a byte slice.
pub fn sha2_digest(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes).into()
}

/// The engines depot has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    Fs,
    Rocksdb,
    Hybrid,
    Memory,
    Sqlite,
    Postgres,
    Gridfs,
    S3,
}

impl EngineKind {
    pub const ALL: [EngineKind; 8] = [
        EngineKind::Fs,
        EngineKind::Rocksdb,
        EngineKind::Hybrid,
        EngineKind::Memory,
        EngineKind::Sqlite,
        EngineKind::Postgres,
        EngineKind::Gridfs,
        EngineKind::S3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Fs => "fs",
            EngineKind::Rocksdb => "rocksdb",
            EngineKind::Hybrid => "hybrid",
            EngineKind::Memory => "memory",
            EngineKind::Sqlite => "sqlite",
            EngineKind::Postgres => "postgres",
            EngineKind::Gridfs => "gridfs",
            EngineKind::S3 => "s3",
        }
    }

    /// Whether the engine keeps its bytes in the data directory (rather
    /// than in memory or in a server of its own).
    pub fn is_embedded(self) -> bool {
        matches!(self, EngineKind::Fs | EngineKind::Rocksdb | EngineKind::Hybrid | EngineKind::Sqlite)
    }
}

/// The file in a data directory that names the engine it was created with:
/// the catalog points into that engine, so opening it with another would
/// lose data.
pub const ENGINE_MARKER: &str = "ENGINE";

/// The [`ENGINE_MARKER`] file's text for `kind` opened with `config`: the
/// engine's name and, for an engine with a server, which of the server's
/// databases or buckets holds the bytes. The server's address is left
/// out: a server may move.
pub fn marker(kind: EngineKind, config: &EngineConfig) -> String {
    let place = match kind {
        EngineKind::Postgres => config
            .url
            .as_deref()
            .and_then(|u| u.parse::<tokio_postgres::Config>().ok())
            .and_then(|c| c.get_dbname().or(c.get_user()).map(|db| format!("database {db}"))),
        EngineKind::Gridfs => config
            .url
            .as_deref()
            .and_then(|u| mongodb::options::ConnectionString::parse(u).ok())
            .and_then(|c| c.default_database)
            .map(|db| format!("database {db}, bucket {}", config.gridfs_bucket.as_deref().unwrap_or("fs"))),
        EngineKind::S3 => {
            config.s3.bucket.clone().or_else(|| std::env::var("AWS_BUCKET").ok()).map(|b| format!("bucket {b}"))
        }
        _ => None,
    };
    match place {
        Some(place) => format!("{}\n{place}\n", kind.name()),
        None => format!("{}\n", kind.name()),
    }
}

/// Why a store whose [`ENGINE_MARKER`] says `found` cannot be opened as
/// `wanted` (both [`marker`]s); `None` when it can. A marker that names
/// the engine alone (as stores made before places were recorded have)
/// fits any place of that engine.
pub fn marker_mismatch(data: &std::path::Path, found: &str, wanted: &str) -> Option<String> {
    let mut found_lines = found.lines();
    let mut wanted_lines = wanted.lines();
    let (kind, place) = (found_lines.next().unwrap_or_default(), found_lines.next());
    if kind != wanted_lines.next().unwrap_or_default() {
        return Some(format!(
            "{} holds a store of the {kind} engine; start it with --engine {kind} (or use a new --data directory)",
            data.display()
        ));
    }
    match (place, wanted_lines.next()) {
        (Some(place), Some(asked)) if place != asked => Some(format!(
            "{} keeps its bytes in the {kind} engine's {place}, not its {asked}: give the settings it was made \
             with (--engine-url, --gridfs-bucket, --s3-bucket), or a new --data directory (if the bytes were moved \
             there, write the new place into {})",
            data.display(),
            data.join(ENGINE_MARKER).display()
        )),
        _ => None,
    }
}

/// What a catalog names as its engine while a migration switches its
/// records over to the engine of marker `to`: no node serves it meanwhile,
/// as its records point into both engines. The migration's own data
/// directory says so too, but only to that node.
pub fn switching_marker(to: &str) -> String {
    format!("{SWITCHING}{to}")
}

/// The marker a catalog's [`switching_marker`] names, if it is one.
pub fn switching_to(marker: &str) -> Option<&str> {
    marker.strip_prefix(SWITCHING)
}

const SWITCHING: &str = "switching to\n";

/// A [`marker`] in words: "the s3 engine's bucket photos".
pub fn describe_marker(marker: &str) -> String {
    let mut lines = marker.lines();
    let kind = lines.next().unwrap_or_default();
    match lines.next() {
        Some(place) => format!("the {kind} engine's {place}"),
        None => format!("the {kind} engine"),
    }
}

/// Records durably that the data directory `data` holds a store as
/// `marker` (see [`marker`]) describes it.
pub fn write_engine_marker(data: &std::path::Path, marker: &str) -> std::io::Result<()> {
    write_durably(data, ENGINE_MARKER, marker)
}

/// Creates `dir` and any missing parents, and makes the entry of `dir` and
/// of each new parent durable in its own parent: a store whose directory a
/// crash took away would come back empty, its acknowledged writes gone with
/// it. The entry of `dir` is synced even when it was there, as a start that
/// crashed may have left it unsynced.
pub fn create_dir_durably(dir: &std::path::Path) -> std::io::Result<()> {
    use std::path::Path;
    let missing = dir.ancestors().skip(1).take_while(|d| !d.as_os_str().is_empty() && !d.exists()).count();
    std::fs::create_dir_all(dir)?;
    for entry in dir.ancestors().take(missing + 1) {
        let parent = entry.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// Writes `dir/name` whole or not at all: a file beside it, synced, then
/// renamed over it, then the directory synced. A crash leaves the old
/// contents or the new, never an empty file.
pub fn write_durably(dir: &std::path::Path, name: &str, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = dir.join(format!("{name}.tmp"));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

impl std::str::FromStr for EngineKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EngineKind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| {
            let names: Vec<_> = EngineKind::ALL.iter().map(|k| k.name()).collect();
            format!("unknown engine {s:?}; engines: {}", names.join(", "))
        })
    }
}

/// A shared handle to any engine.
pub type DynEngine = Arc<dyn BlobEngine>;

/// How to open an engine, beyond its kind.
#[derive(Clone, Debug, Default)]
pub struct EngineConfig {
    /// Largest blob `hybrid` keeps in RocksDB.
    pub inline_threshold: u64,
    /// The server of engines that use one (`postgres://...`,
    /// `mongodb://.../database`, `http://s3-host:port`).
    pub url: Option<String>,
    /// Bytes per stored chunk for the chunking engines (sqlite, postgres,
    /// gridfs); `None`: the engine's default.
    pub chunk_size: Option<usize>,
    /// The GridFS bucket (collection prefix); `None`: `fs`.
    pub gridfs_bucket: Option<String>,
    pub s3: S3Config,
    /// RocksDB (the rocksdb engine, the hybrid engine's small blobs) opened
    /// without compactions of its own, for `verify`: a compaction that
    /// meets a damaged blob file stops the database's writes until it is
    /// opened again, and `--repair` would then fail to remove the damaged
    /// blobs it found.
    pub without_compactions: bool,
}

/// Where the `s3` engine keeps blobs and how it signs in. Fields left
/// `None` fall back to the standard `AWS_*` environment variables.
#[derive(Clone, Default)]
pub struct S3Config {
    pub bucket: Option<String>,
    pub region: Option<String>,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
}

impl fmt::Debug for S3Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "hidden"))
            .finish()
    }
}

/// Opens an engine of `kind`, with its files (if any) under `root`.
pub async fn open(kind: EngineKind, root: &std::path::Path, config: &EngineConfig) -> Result<DynEngine> {
    Ok(match kind {
        EngineKind::Fs => Arc::new(fs::FsEngine::open(root)?),
        EngineKind::Rocksdb => Arc::new(rocks::RocksEngine::open_with(root, !config.without_compactions)?),
        EngineKind::Hybrid => {
            Arc::new(hybrid::HybridEngine::open_with(root, config.inline_threshold, !config.without_compactions)?)
        }
        EngineKind::Memory => Arc::new(memory::MemoryEngine::new()),
        EngineKind::Sqlite => Arc::new(sqlite::SqliteEngine::open(
            &root.join("blobs.sqlite"),
            config.chunk_size.unwrap_or(sqlite::DEFAULT_CHUNK),
        )?),
        EngineKind::Postgres => {
            let url = config.url.as_deref().ok_or_else(|| {
                EngineError::other("postgres", "needs --engine-url postgres://user:password@host/database")
            })?;
            Arc::new(
                postgres::PostgresEngine::connect(url, config.chunk_size.unwrap_or(postgres::DEFAULT_CHUNK)).await?,
            )
        }
        EngineKind::Gridfs => {
            let url = config.url.as_deref().ok_or_else(|| {
                EngineError::other("gridfs", "needs --engine-url mongodb://[user:password@]host[:port]/database")
            })?;
            Arc::new(
                gridfs::GridfsEngine::connect(
                    url,
                    config.gridfs_bucket.as_deref().unwrap_or(gridfs::DEFAULT_BUCKET),
                    config.chunk_size.unwrap_or(gridfs::DEFAULT_CHUNK),
                )
                .await?,
            )
        }
        EngineKind::S3 => Arc::new(s3::S3Engine::connect(config.url.as_deref(), &config.s3).await?),
    })
}

#[cfg(test)]
mod tests {
    use super::EngineError;

    /// A full device and a user's exhausted quota are both no space (507);
    /// out of file descriptors passes as connections close (503).
    #[test]
    fn io_errors_are_classified_by_what_cures_them() {
        let io = |code| EngineError::io("test", std::io::Error::from_raw_os_error(code));
        assert!(matches!(io(libc::ENOSPC), EngineError::NoSpace));
        assert!(matches!(io(libc::EDQUOT), EngineError::NoSpace));
        assert!(matches!(io(libc::EMFILE), EngineError::Unavailable(_)));
        assert!(matches!(io(libc::EIO), EngineError::Io { .. }));
    }

    /// What a power cut would show cannot be tested here; that the levels
    /// are made, again without harm, and that a file in the way is an
    /// error, can.
    #[test]
    fn directories_are_made_at_every_level_once() {
        let dir = tempfile::tempdir().unwrap();
        let deep = dir.path().join("a/b/c");
        super::create_dir_durably(&deep).unwrap();
        assert!(deep.is_dir());
        std::fs::write(deep.join("kept"), b"x").unwrap();
        super::create_dir_durably(&deep).unwrap();
        assert!(deep.join("kept").exists(), "an existing directory is left as it is");
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        assert!(super::create_dir_durably(&dir.path().join("file/d")).is_err());
    }
}
