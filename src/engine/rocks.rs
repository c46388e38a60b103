//! `rocksdb`: blobs as values in an embedded RocksDB, with BlobDB keeping
//! large values out of the LSM tree so compaction does not rewrite them.
//!
//! Keys (one column family, each kind under its own first byte):
//!
//! | key | value |
//! |---|---|
//! | `h` digest(32) | head: id(16) size(8) modified-ns(8), then the bytes of a blob of at most [`INLINE`] |
//! | `c` id(16) chunk-no(4, big-endian) | up to [`CHUNK`] bytes |
//! | `p` id(16) | empty: the blob `id` is still being written |
//!
//! A blob's chunks are written as they stream in under a fresh random id; the
//! head that names them by digest is written last, in one batch, so a reader
//! never finds a head without all its chunks. Blobs of one chunk (the common
//! case behind `hybrid`) are that batch alone; the smallest live in their
//! head, so reading one is a single lookup. The writer returns once a sync
//! of the write-ahead log, shared with concurrent writers, covers the batch. A crash while
//! chunks stream leaves a `p` marker; opening the database removes those
//! chunks.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rocksdb::{BlockBasedOptions, DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};

use super::group_commit::GroupCommit;
use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result};

const NAME: &str = "rocksdb";
/// Size of one stored value of a blob.
pub const CHUNK: usize = 1024 * 1024;
const LOCK_STRIPES: usize = 64;
/// Largest single-chunk blob written on the calling thread rather than the
/// blocking pool: an unsynced write of this much takes microseconds.
const INLINE_WRITE: u64 = 64 * 1024;
/// Largest blob kept in its head rather than in a chunk: a head under
/// `min_blob_size` (4 KiB) stays in the LSM tree, beside its key (one of
/// exactly 4 KiB would go to a blob file, where listing the heads reads
/// it; heads so written earlier still read as they are).
pub const INLINE: u64 = 4095 - HEAD as u64;

/// RocksDB options shared by every database depot opens.
pub(crate) fn base_options() -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
    // Bounded memory: two 16 MiB memtables rather than RocksDB's 64 MiB.
    opts.set_write_buffer_size(16 * 1024 * 1024);
    opts.set_max_write_buffer_number(2);
    opts.set_keep_log_file_num(4);
    // A column family that rarely fills its memtable (the catalog's totals)
    // would keep every log file alive, up to four times all the memtables:
    // past 64 MiB of logs it is flushed, so the logs can go.
    opts.set_max_total_wal_size(64 << 20);
    opts.set_block_based_table_factory(&table_options());
    opts.set_memtable_whole_key_filtering(true);
    opts.set_memtable_prefix_bloom_ratio(0.1);
    opts
}

/// The table settings of [`base_options`], for a database that adds its own.
pub(crate) fn table_options() -> BlockBasedOptions {
    // Most lookups on a write miss (a new key, new content): bloom filters,
    // in the tables and in the memtable, answer those without searching.
    let mut table = BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    table
}

fn db_err(e: rocksdb::Error) -> EngineError {
    // RocksDB reports a full device only in its message.
    if e.as_ref().contains("No space left on device") {
        EngineError::NoSpace
    } else if e.kind() == rocksdb::ErrorKind::Corruption {
        // Outside a read of one blob, damage is most often what a
        // compaction met: RocksDB then refuses every write until the
        // database is opened again, and the message alone would not say
        // where to look.
        EngineError::other(
            NAME,
            format!(
                "{e} (damaged data: once a compaction meets it, RocksDB takes no writes until it is opened \
                 again; `depot verify` names the damaged blobs)"
            ),
        )
    } else {
        EngineError::other(NAME, e)
    }
}

/// An error from reading one blob's head or chunks in the database at
/// `dir`: that blob is damaged when what failed is its own stored bytes,
/// and anything else is the database's trouble, as [`db_err`] says.
///
/// Two kinds of error name the blob's own bytes. `Corruption` is what
/// RocksDB answers when a checksum of the block or blob-file record it
/// read for this key does not match, or the record does not parse: the
/// bytes it has for this key are wrong, while those of other keys are
/// still checked on their own reads. (Damage to the database's structure,
/// its manifest or log, is found when it opens, not on a read.) An
/// `IO error` is damage only when the file missing is a blob file, which
/// holds values and nothing the database needs to find its other keys,
/// and only while the directory still holds the database (its `CURRENT`
/// file): a directory removed or unmounted under a running database would
/// otherwise make every blob look lost, and `verify --repair` would then
/// delete every blob's record of bytes. Every other error, a failing disk
/// (`EIO`), too many open files, a permission, stays the database's: it
/// says nothing about this blob, and may pass.
fn read_err(dir: &Path, e: rocksdb::Error) -> EngineError {
    let message = e.as_ref();
    let missing_blob_file = e.kind() == rocksdb::ErrorKind::IOError
        && message.contains("No such file or directory")
        && message.contains(".blob")
        && dir.join("CURRENT").is_file();
    if missing_blob_file {
        EngineError::damaged(NAME, format!("the blob file that held it is gone ({e})"))
    } else if e.kind() == rocksdb::ErrorKind::Corruption {
        EngineError::damaged(NAME, e)
    } else {
        db_err(e)
    }
}

fn synced() -> WriteOptions {
    let mut wo = WriteOptions::default();
    wo.set_sync(true);
    wo
}

fn head_key(digest: &Digest) -> [u8; 33] {
    let mut k = [0u8; 33];
    k[0] = b'h';
    k[1..].copy_from_slice(&digest.0);
    k
}

fn chunk_key(id: &[u8; 16], n: u32) -> [u8; 21] {
    let mut k = [0u8; 21];
    k[0] = b'c';
    k[1..17].copy_from_slice(id);
    k[17..].copy_from_slice(&n.to_be_bytes());
    k
}

fn pending_key(id: &[u8; 16]) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = b'p';
    k[1..].copy_from_slice(id);
    k
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

#[derive(Clone, Copy)]
struct Head {
    id: [u8; 16],
    size: u64,
    modified_ns: u64,
}

/// Length of a head without bytes.
const HEAD: usize = 32;

impl Head {
    /// The head's value, holding `inline` (the whole blob) when given.
    fn encode(&self, inline: Option<&[u8]>) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEAD + inline.map_or(0, <[u8]>::len));
        v.extend_from_slice(&self.id);
        v.extend_from_slice(&self.size.to_be_bytes());
        v.extend_from_slice(&self.modified_ns.to_be_bytes());
        v.extend_from_slice(inline.unwrap_or_default());
        v
    }

    /// The head and, when the blob lives in it, its bytes.
    fn decode(v: &[u8]) -> Result<(Head, Option<&[u8]>)> {
        let (fixed, rest) = v.split_at_checked(HEAD).ok_or_else(|| EngineError::damaged(NAME, "corrupt blob head"))?;
        let head = Head {
            id: fixed[..16].try_into().expect("16 bytes"),
            size: u64::from_be_bytes(fixed[16..24].try_into().expect("8 bytes")),
            modified_ns: u64::from_be_bytes(fixed[24..].try_into().expect("8 bytes")),
        };
        // A blob in chunks has a bare head (an empty one too, either way).
        match rest.len() as u64 {
            0 => Ok((head, (head.size == 0).then_some(rest))),
            n if n == head.size => Ok((head, Some(rest))),
            _ => Err(EngineError::damaged(NAME, "corrupt blob head")),
        }
    }
}

/// The RocksDB engine; clones share one database.
#[derive(Clone)]
pub struct RocksEngine {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<DB>,
    /// Makes the final write of each blob durable; dropped after `db`, it
    /// holds the database open until its last sync.
    group: GroupCommit,
    /// Serialises the check-then-write of a head per digest, so two writers
    /// of the same content agree on one set of chunks.
    heads: [Mutex<()>; LOCK_STRIPES],
}

impl RocksEngine {
    /// Opens (creating if needed) the database at `path` and removes chunks
    /// of blobs whose writing a crash interrupted.
    pub fn open(path: &Path) -> Result<RocksEngine> {
        RocksEngine::open_with(path, true)
    }

    /// [`RocksEngine::open`]; without `compactions`, RocksDB compacts
    /// nothing by itself (for `verify`: see
    /// [`EngineConfig::without_compactions`](super::EngineConfig)).
    pub fn open_with(path: &Path, compactions: bool) -> Result<RocksEngine> {
        let mut opts = base_options();
        opts.set_disable_auto_compactions(!compactions);
        opts.set_enable_blob_files(true);
        opts.set_min_blob_size(4096);
        opts.set_enable_blob_gc(true);
        // RocksDB syncs what it makes inside its directory, not the
        // directory's own entry.
        super::create_dir_durably(path).map_err(|e| EngineError::io(NAME, e))?;
        let db = DB::open(&opts, path).map_err(db_err)?;
        let mut batch = WriteBatch::default();
        for item in db.iterator(IteratorMode::From(b"p", Direction::Forward)) {
            let (key, _) = item.map_err(db_err)?;
            if key.first() != Some(&b'p') {
                break;
            }
            let id: [u8; 16] = key[1..].try_into().map_err(|_| EngineError::other(NAME, "corrupt marker"))?;
            batch.delete_range(chunk_key(&id, 0), chunk_key(&id, u32::MAX));
            batch.delete(key);
        }
        if !batch.is_empty() {
            db.write_opt(batch, &synced()).map_err(db_err)?;
        }
        let db = Arc::new(db);
        let group = GroupCommit::start(db.clone(), NAME).map_err(|e| EngineError::other(NAME, e))?;
        Ok(RocksEngine { inner: Arc::new(Inner { db, group, heads: std::array::from_fn(|_| Mutex::new(())) }) })
    }
}

impl Inner {
    /// [`read_err`] for this database.
    fn read_err(&self, e: rocksdb::Error) -> EngineError {
        read_err(self.db.path(), e)
    }

    /// Waits until every write so far is durable.
    async fn durable(&self) -> Result<()> {
        self.group.durable().await.map_err(|e| EngineError::SyncFailed(std::io::Error::other(e)))
    }

    /// Removes the first `written` chunks of upload `id` and its pending
    /// marker, best effort: if this fails, the marker makes the next open
    /// clean up.
    fn discard_staged(&self, id: &[u8; 16], written: u32) {
        let mut batch = WriteBatch::default();
        delete_chunks(&mut batch, id, written);
        batch.delete(pending_key(id));
        let _ = self.db.write(batch);
    }

    /// Writes, unsynced, the head naming blob `id` by `digest` after its
    /// `written` chunks and the `last` one; when the content is stored
    /// already, keeps that copy (refreshing its age) and drops these chunks.
    fn commit_head(&self, digest: Digest, id: [u8; 16], written: u32, last: &[u8], size: u64) -> Result<Head> {
        let _guard = self.heads[digest.0[0] as usize % LOCK_STRIPES].lock();
        let mut batch = WriteBatch::default();
        let head = match self.db.get_pinned(head_key(&digest)).map_err(db_err)? {
            Some(existing) => {
                delete_chunks(&mut batch, &id, written);
                let (old, inline) = Head::decode(&existing)?;
                let head = Head { modified_ns: now_ns(), ..old };
                batch.put(head_key(&digest), head.encode(inline));
                head
            }
            None => {
                let head = Head { id, size, modified_ns: now_ns() };
                if written == 0 && size <= INLINE {
                    batch.put(head_key(&digest), head.encode(Some(last)));
                } else {
                    if !last.is_empty() || written == 0 {
                        batch.put(chunk_key(&id, written), last);
                    }
                    batch.put(head_key(&digest), head.encode(None));
                }
                head
            }
        };
        if written > 0 {
            batch.delete(pending_key(&id));
        }
        self.db.write(batch).map_err(db_err)?;
        Ok(head)
    }
}

/// Deletes chunks `0..count` of blob `id`, each by its key. (A range
/// deletion would say it in one, but every range tombstone in the
/// memtable is consulted again by each read after it: deleting tens of
/// thousands of small blobs between reads grew quadratic, 40,000 taking
/// over three minutes.)
fn delete_chunks(batch: &mut WriteBatch, id: &[u8; 16], count: u32) {
    for n in 0..count {
        batch.delete(chunk_key(id, n));
    }
}

/// A blob whose head names chunk `n`, which is not there.
fn chunk_missing(n: impl fmt::Display) -> EngineError {
    EngineError::damaged(NAME, format!("chunk {n} of the blob is missing"))
}

/// Chunk `n` of a blob of `size` bytes, if it holds what the head says:
/// every chunk but the last is whole, and the last holds the rest.
fn whole_chunk<V: AsRef<[u8]>>(chunk: V, size: u64, n: u32) -> Result<V> {
    let want = size.saturating_sub(n as u64 * CHUNK as u64).min(CHUNK as u64);
    let got = chunk.as_ref().len() as u64;
    if got == want {
        return Ok(chunk);
    }
    let how = if got < want { "shorter" } else { "longer" };
    Err(EngineError::damaged(
        NAME,
        format!("chunk {n} of the blob is {how} than its head says ({got} bytes, not {want})"),
    ))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| EngineError::other(NAME, format!("blocking task failed: {e}")))?
}

struct RocksWriter {
    inner: Arc<Inner>,
    id: [u8; 16],
    buf: BytesMut,
    /// Chunks handed to the database, the one being written included.
    written: u32,
    /// A chunk failed to be written, or its write was cancelled: the blob
    /// cannot be finished.
    failed: bool,
    /// Set when the writer is dropped with chunks: a chunk write still in
    /// flight then removes what it wrote.
    abandoned: Arc<AtomicBool>,
}

impl RocksWriter {
    fn check_written(&self) -> Result<()> {
        if self.failed {
            return Err(EngineError::other(
                NAME,
                "a chunk of this blob was not written: its write failed or was cancelled",
            ));
        }
        Ok(())
    }

    /// Writes the full buffered chunk; the first one also marks the blob as
    /// in progress so a crash cannot strand its chunks.
    async fn spill(&mut self) -> Result<()> {
        // Once failed, failed for good: a later chunk written whole would
        // otherwise clear the flag over the hole.
        self.check_written()?;
        let chunk = self.buf.split_to(CHUNK).freeze();
        let (inner, id, n, abandoned) = (self.inner.clone(), self.id, self.written, self.abandoned.clone());
        // Counted before the write, so a writer dropped while it is in
        // flight removes this chunk too; failed until the write is done.
        self.written += 1;
        self.failed = true;
        blocking(move || {
            let mut batch = WriteBatch::default();
            if n == 0 {
                batch.put(pending_key(&id), b"");
            }
            batch.put(chunk_key(&id, n), &chunk);
            inner.db.write(batch).map_err(db_err)?;
            // Dropped meanwhile, the writer may have removed its chunks
            // before this one was there: this one goes, and the marker with
            // it. (Dropped after this check, it removes this chunk itself.)
            if abandoned.load(Ordering::SeqCst) {
                let mut batch = WriteBatch::default();
                batch.delete(chunk_key(&id, n));
                batch.delete(pending_key(&id));
                // Best effort: if this fails, the next open removes it.
                let _ = inner.db.write(batch);
            }
            Ok(())
        })
        .await?;
        self.failed = false;
        Ok(())
    }
}

#[async_trait]
impl BlobWriter for RocksWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.buf.extend_from_slice(&chunk);
        while self.buf.len() >= CHUNK {
            self.spill().await?;
        }
        Ok(())
    }

    async fn finish(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        let inner = self.inner.clone();
        let blob = self.finish_unsynced(digest).await?;
        // One sync, shared with every other writer (see `GroupCommit`).
        inner.durable().await?;
        Ok(blob)
    }

    async fn finish_unsynced(mut self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        self.check_written()?;
        let last = self.buf.split().freeze();
        let (inner, id, written) = (self.inner.clone(), self.id, self.written);
        self.written = 0; // from here on, finish owns the chunks
        let size = written as u64 * CHUNK as u64 + last.len() as u64;
        let commit = move || {
            let head = inner.commit_head(digest, id, written, &last, size);
            // A failed commit wrote nothing, and the writer no longer owns
            // the chunks: they go now, not at the next start.
            if head.is_err() && written > 0 {
                inner.discard_staged(&id, written);
            }
            head
        };
        // A small blob is one unsynced write: done on this thread.
        let head = if written == 0 && size <= INLINE_WRITE { commit()? } else { blocking(commit).await? };
        Ok(BlobRef { digest, size: head.size, locator: Vec::new() })
    }

    async fn abort(self: Box<Self>) {}
}

impl Drop for RocksWriter {
    fn drop(&mut self) {
        if self.written > 0 {
            self.abandoned.store(true, Ordering::SeqCst);
            self.inner.discard_staged(&self.id, self.written);
        }
    }
}

#[async_trait]
impl BlobEngine for RocksEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn writer(&self, _size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(RocksWriter {
            inner: self.inner.clone(),
            id: rand::random(),
            buf: BytesMut::new(),
            written: 0,
            failed: false,
            abandoned: Arc::new(AtomicBool::new(false)),
        }))
    }

    async fn sync(&self) -> Result<()> {
        self.inner.durable().await
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        let digest = blob.digest;
        // The head is a few bytes (or a small blob whole): read on this thread.
        let head = {
            let v = self.inner.db.get_pinned(head_key(&digest)).map_err(|e| self.inner.read_err(e))?;
            let v = v.ok_or(EngineError::NotFound(digest))?;
            let (head, inline) = Head::decode(&v)?;
            if range.end > head.size {
                // Ranges are resolved against the catalog's record of the
                // blob's size: a shorter blob here lost bytes.
                return Err(EngineError::damaged(
                    NAME,
                    format!("{} bytes stored, fewer than the {} recorded", head.size, range.end),
                ));
            }
            if let Some(bytes) = inline {
                let bytes = Bytes::copy_from_slice(&bytes[range.start as usize..range.end as usize]);
                return Ok(Box::pin(futures::stream::once(async { Ok(bytes) })));
            }
            head
        };
        if range.is_empty() {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let first = (range.start / CHUNK as u64) as u32;
        let last = ((range.end - 1) / CHUNK as u64) as u32;
        if first == last {
            // One value (at most a chunk): read it on this thread, where a
            // cached read costs less than a hand-off to the blocking pool.
            let v = self.inner.db.get_pinned(chunk_key(&head.id, first)).map_err(|e| self.inner.read_err(e))?;
            let v = whole_chunk(v.ok_or_else(|| chunk_missing(first))?, head.size, first)?;
            let at = (range.start % CHUNK as u64) as usize;
            let bytes = Bytes::copy_from_slice(&v[at..at + range.len() as usize]);
            return Ok(Box::pin(futures::stream::once(async { Ok(bytes) })));
        }
        let inner = self.inner.clone();
        Ok(super::read_blocking(NAME, first..=last, move |n| {
            let chunk_start = n as u64 * CHUNK as u64;
            let v = inner.db.get_pinned(chunk_key(&head.id, n)).map_err(|e| inner.read_err(e))?;
            let v = whole_chunk(v.ok_or_else(|| chunk_missing(n))?, head.size, n)?;
            let from = range.start.saturating_sub(chunk_start) as usize;
            let to = ((range.end - chunk_start) as usize).min(CHUNK);
            Ok(Bytes::copy_from_slice(&v[from..to]))
        }))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        let inner = self.inner.clone();
        let digest = blob.digest;
        blocking(move || {
            let _guard = inner.heads[digest.0[0] as usize % LOCK_STRIPES].lock();
            let Some(v) = inner.db.get(head_key(&digest)).map_err(db_err)? else {
                return Ok(());
            };
            let (head, inline) = Head::decode(&v)?;
            let mut batch = WriteBatch::default();
            if inline.is_none() {
                // Every chunk but the last is whole; a blob has one at least.
                delete_chunks(&mut batch, &head.id, head.size.div_ceil(CHUNK as u64).max(1) as u32);
            }
            batch.delete(head_key(&digest));
            inner.db.write(batch).map_err(db_err)
        })
        .await
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        let digest = blob.digest;
        blocking(move || match inner.db.get_pinned(head_key(&digest)).map_err(|e| inner.read_err(e))? {
            Some(v) => Ok(Some(Head::decode(&v)?.0.size)),
            None => Ok(None),
        })
        .await
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        let inner = self.inner.clone();
        blocking(move || {
            let mut out = Vec::new();
            for item in inner.db.iterator(IteratorMode::From(b"h", Direction::Forward)) {
                let (key, value) = item.map_err(db_err)?;
                if key.first() != Some(&b'h') {
                    break;
                }
                let digest = Digest(key[1..].try_into().map_err(|_| EngineError::other(NAME, "corrupt head key"))?);
                let (head, _) = Head::decode(&value)?;
                out.push(BlobInfo {
                    digest,
                    size: head.size,
                    locator: Vec::new(),
                    modified: UNIX_EPOCH + Duration::from_nanos(head.modified_ns),
                });
            }
            Ok(out)
        })
        .await
    }

    /// Heads, then chunks, each fetched with one `multi_get` on one trip to
    /// the blocking pool.
    async fn read_small(&self, blobs: &[BlobRef]) -> Result<Vec<Bytes>> {
        let inner = self.inner.clone();
        let wanted: Vec<(Digest, u64)> = blobs.iter().map(|b| (b.digest, b.size)).collect();
        blocking(move || {
            let heads = inner.db.multi_get(wanted.iter().map(|(digest, _)| head_key(digest)));
            // Blobs in their heads are done; the others need their chunks.
            let mut out = Vec::with_capacity(wanted.len());
            let mut chunked = Vec::new();
            for (i, ((digest, size), head)) in wanted.iter().zip(heads).enumerate() {
                let v = head.map_err(|e| inner.read_err(e))?.ok_or(EngineError::NotFound(*digest))?;
                let (head, inline) = Head::decode(&v)?;
                if head.size != *size {
                    let message = format!("{} bytes stored, where {size} are recorded", head.size);
                    return Err(EngineError::damaged(NAME, message));
                }
                out.push(inline.map(Bytes::copy_from_slice).unwrap_or_default());
                if inline.is_none() {
                    let chunks = head.size.div_ceil(CHUNK as u64) as u32;
                    let keys = (0..chunks).map(|n| chunk_key(&head.id, n)).collect::<Vec<_>>();
                    chunked.push((i, head.size, keys));
                }
            }
            let values = inner.db.multi_get(chunked.iter().flat_map(|(_, _, keys)| keys));
            let mut values = values.into_iter();
            for (i, size, keys) in &chunked {
                let mut blob = BytesMut::new();
                for (n, value) in values.by_ref().take(keys.len()).enumerate() {
                    let chunk = value.map_err(|e| inner.read_err(e))?.ok_or_else(|| chunk_missing(n))?;
                    blob.extend_from_slice(&whole_chunk(chunk, *size, n as u32)?);
                }
                out[*i] = blob.freeze();
            }
            Ok(out)
        })
        .await
    }

    async fn disk_usage(&self) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        // Everything in the database's directory: tables, blob files and the
        // write-ahead log holding what is not flushed yet.
        blocking(move || Ok(Some(super::dir_usage(inner.db.path())))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{BlobEngineExt, conformance};

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        conformance::run_all(&RocksEngine::open(dir.path()).unwrap()).await;
    }

    fn chunk_count(engine: &RocksEngine) -> usize {
        engine.inner.db.iterator(IteratorMode::Start).filter(|i| i.as_ref().unwrap().0[0] == b'c').count()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn small_blobs_live_in_their_head() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        let data = conformance::pattern(INLINE as usize, 1);
        let blob = engine.put_bytes(data.clone()).await.unwrap();
        // Stored again: the copy in the head is kept.
        engine.put_bytes(data.clone()).await.unwrap();
        assert_eq!(chunk_count(&engine), 0, "no chunk for a blob of {INLINE} bytes");
        let part = engine.read_to_vec(&blob, ByteRange { start: 10, end: 20 }).await.unwrap();
        assert_eq!(part, data[10..20]);
        assert_eq!(engine.read_small(std::slice::from_ref(&blob)).await.unwrap(), vec![data]);
        // One byte more takes a chunk.
        engine.put_bytes(conformance::pattern(INLINE as usize + 1, 2)).await.unwrap();
        assert_eq!(chunk_count(&engine), 1);
    }

    /// Chunks are deleted each by its key, so every one must be named:
    /// none is left behind, whatever the blob's size.
    #[tokio::test(flavor = "multi_thread")]
    async fn deleted_blobs_and_stored_copies_leave_no_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        let sizes = [INLINE as usize + 1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK, 3 * CHUNK + 5];
        let mut blobs = Vec::new();
        for (i, size) in sizes.into_iter().enumerate() {
            let data = conformance::pattern(size, i as u8);
            blobs.push(engine.put_bytes(data.clone()).await.unwrap());
            // Stored again: the new copy's chunks go at once.
            engine.put_bytes(data).await.unwrap();
        }
        assert!(chunk_count(&engine) > 0);
        for blob in &blobs {
            engine.delete(blob).await.unwrap();
        }
        assert_eq!(chunk_count(&engine), 0);
        // A writer dropped after two chunks takes them with it.
        let mut writer = engine.writer(None).await.unwrap();
        writer.write(conformance::pattern(2 * CHUNK + 10, 9)).await.unwrap();
        drop(writer);
        assert_eq!(chunk_count(&engine), 0);
    }

    /// Runs `test` on a new engine, in a runtime whose blocking pool has
    /// `threads` threads.
    fn with_blocking_threads<F: Future<Output = ()>>(threads: usize, test: impl FnOnce(RocksEngine) -> F) {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().max_blocking_threads(threads).enable_all().build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        runtime.block_on(async { test(RocksEngine::open(dir.path()).unwrap()).await });
    }

    /// Downloads whose clients have stopped reading hold no thread of the
    /// blocking pool: other blocking work still runs, on a pool of two
    /// threads with two such downloads open.
    #[test]
    fn stalled_downloads_hold_no_blocking_thread() {
        with_blocking_threads(2, |engine| async move {
            let body = conformance::pattern(8 * CHUNK, 5);
            let blob = engine.put_bytes(body.clone()).await.unwrap();
            let mut stalled = Vec::new();
            for _ in 0..2 {
                let mut read = engine.read(&blob, ByteRange::full(blob.size)).await.unwrap();
                let first = futures::TryStreamExt::try_next(&mut read).await.unwrap().unwrap();
                assert_eq!(first[..], body[..CHUNK]);
                stalled.push(read);
            }
            let other = tokio::time::timeout(Duration::from_secs(5), blocking(|| Ok(42)));
            assert_eq!(other.await.expect("the pool's threads are held by stalled downloads").unwrap(), 42);
            // And the stalled downloads go on where they stopped.
            for read in stalled {
                let rest: Vec<Bytes> = futures::TryStreamExt::try_collect(read).await.unwrap();
                assert_eq!(rest.concat(), body[CHUNK..]);
            }
        });
    }

    /// A writer dropped while a chunk after the first is being written
    /// (its client gone mid-upload), or just after, leaves neither that
    /// chunk nor the others behind.
    #[test]
    fn a_writer_dropped_mid_chunk_leaves_no_chunk() {
        // One blocking thread, held until the chunk's write is to run: the
        // write is then in flight whatever the machine's load.
        with_blocking_threads(1, |engine| async move {
            let markers =
                || engine.inner.db.iterator(IteratorMode::Start).filter(|i| i.as_ref().unwrap().0[0] == b'p').count();
            for written_before_the_drop in [false, true] {
                let mut writer = engine.writer(None).await.unwrap();
                writer.write(conformance::pattern(CHUNK + 10, 1)).await.unwrap();
                let (release, held) = std::sync::mpsc::channel::<()>();
                let blocker = tokio::task::spawn_blocking(move || held.recv());
                let second = futures::FutureExt::now_or_never(writer.write(conformance::pattern(CHUNK, 2)));
                assert!(second.is_none(), "the second chunk waits for the blocking thread");
                // Tasks on the one blocking thread run in turn: once this
                // one has, the chunk's write is done.
                let after_the_write = || tokio::task::spawn_blocking(|| ());
                if written_before_the_drop {
                    release.send(()).unwrap();
                    after_the_write().await.unwrap();
                    assert_eq!(chunk_count(&engine), 2);
                    // Its write cancelled, the writer cannot tell what it
                    // holds: it takes no more (a chunk written whole after
                    // it would hide the hole), refuses to finish, and goes.
                    let more = writer.write(conformance::pattern(CHUNK, 3)).await;
                    assert!(more.is_err_and(|e| e.to_string().contains("was not written")));
                    let refused = writer.finish(Digest([0; 32])).await;
                    assert!(refused.is_err_and(|e| e.to_string().contains("was not written")));
                } else {
                    drop(writer);
                    release.send(()).unwrap();
                    after_the_write().await.unwrap();
                }
                blocker.await.unwrap().unwrap();
                assert_eq!(
                    (chunk_count(&engine), markers()),
                    (0, 0),
                    "written before the drop: {written_before_the_drop}"
                );
            }
        });
    }

    /// A finish whose commit fails (here on a damaged head of the same
    /// content) leaves neither its chunks nor its pending marker.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_commit_leaves_no_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        let body = conformance::pattern(2 * CHUNK + 10, 6);
        let digest = Digest(crate::engine::sha2_digest(&body));
        engine.inner.db.put(head_key(&digest), b"damaged").unwrap();
        let mut writer = engine.writer(None).await.unwrap();
        writer.write(body).await.unwrap();
        let err = writer.finish(digest).await.unwrap_err();
        assert!(matches!(err, EngineError::Damaged { .. }), "{err}");
        let left =
            engine.inner.db.iterator(IteratorMode::Start).filter(|i| matches!(i.as_ref().unwrap().0[0], b'c' | b'p'));
        assert_eq!(left.count(), 0);
    }

    /// A chunk of a blob shorter than a whole one, where a whole one
    /// belongs, is damage: a read across it fails rather than come short.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_short_middle_chunk_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        let blob = engine.put_bytes(conformance::pattern(3 * CHUNK, 4)).await.unwrap();
        let head = engine.inner.db.get(head_key(&blob.digest)).unwrap().unwrap();
        let id = Head::decode(&head).unwrap().0.id;
        engine.inner.db.put(chunk_key(&id, 1), conformance::pattern(CHUNK / 2, 5)).unwrap();
        let read = engine.read_to_vec(&blob, ByteRange::full(blob.size)).await;
        assert!(
            matches!(&read, Err(EngineError::Damaged { message, .. }) if message.contains("chunk 1 of the blob is shorter")),
            "{:?}",
            read.map(|v| v.len())
        );
        // Batch reads check every chunk's length too, short or long.
        let small = engine.read_small(std::slice::from_ref(&blob)).await;
        assert!(
            matches!(&small, Err(EngineError::Damaged { message, .. }) if message.contains("chunk 1 of the blob is shorter")),
            "{:?}",
            small.map(|v| v.len())
        );
        // One too long is damage too, to a batch and to a read within it.
        engine.inner.db.put(chunk_key(&id, 1), conformance::pattern(CHUNK + 1, 5)).unwrap();
        assert!(matches!(engine.read_small(std::slice::from_ref(&blob)).await, Err(EngineError::Damaged { .. })));
        let within = engine.read_to_vec(&blob, ByteRange { start: CHUNK as u64 + 1, end: CHUNK as u64 + 9 }).await;
        assert!(matches!(&within, Err(EngineError::Damaged { message, .. }) if message.contains("is longer")));
        // A head whose size is not the recorded one is damage, not a plan to
        // read that many chunks.
        let wrong = BlobRef { size: blob.size + 1, ..blob };
        assert!(matches!(engine.read_small(&[wrong]).await, Err(EngineError::Damaged { .. })));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn small_blobs_stored_in_a_chunk_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        // A bare head and one chunk: how small blobs were once stored.
        let data = conformance::pattern(50, 3);
        let digest = Digest(crate::engine::sha2_digest(&data));
        let head = Head { id: [9; 16], size: 50, modified_ns: now_ns() };
        let mut batch = WriteBatch::default();
        batch.put(chunk_key(&head.id, 0), &data);
        batch.put(head_key(&digest), head.encode(None));
        engine.inner.db.write(batch).unwrap();
        let blob = BlobRef { digest, size: 50, locator: Vec::new() };
        assert_eq!(engine.read_to_vec(&blob, ByteRange::full(50)).await.unwrap(), data);
        assert_eq!(engine.read_small(std::slice::from_ref(&blob)).await.unwrap(), vec![data]);
        engine.delete(&blob).await.unwrap();
        assert_eq!(chunk_count(&engine), 0);
    }

    /// The blob files in the database's directory.
    fn blob_files(dir: &Path) -> Vec<std::path::PathBuf> {
        let files = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path());
        files.filter(|p| p.extension().is_some_and(|e| e == "blob")).collect()
    }

    /// A blob whose bytes RocksDB finds damaged, or whose blob file is
    /// gone, is a damaged blob (which `verify` names and carries on); a
    /// blob file gone with the whole database is not.
    #[tokio::test(flavor = "multi_thread")]
    async fn unreadable_blob_files_are_damaged_blobs() {
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (corrupt, gone) = (RocksEngine::open(one.path()).unwrap(), RocksEngine::open(two.path()).unwrap());
        let data = conformance::pattern(100_000, 5);
        let (a, b) = (corrupt.put_bytes(data.clone()).await.unwrap(), gone.put_bytes(data).await.unwrap());
        corrupt.inner.db.flush().unwrap();
        gone.inner.db.flush().unwrap();
        let (corrupt_file, gone_file) = (blob_files(one.path()), blob_files(two.path()));
        assert_eq!((corrupt_file.len(), gone_file.len()), (1, 1), "the chunk is in a blob file");

        let mut bytes = std::fs::read(&corrupt_file[0]).unwrap();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(&corrupt_file[0], bytes).unwrap();
        let read = corrupt.read_to_vec(&a, ByteRange::full(a.size)).await;
        assert!(
            matches!(&read, Err(EngineError::Damaged { message, .. }) if message.contains("Corruption")),
            "{read:?}"
        );

        std::fs::remove_file(&gone_file[0]).unwrap();
        let read = gone.read_to_vec(&b, ByteRange::full(b.size)).await;
        assert!(matches!(&read, Err(EngineError::Damaged { message, .. }) if message.contains("is gone")), "{read:?}");
        // With its CURRENT file gone too, the directory no longer holds
        // the database (removed, or unmounted): that is no blob's damage.
        std::fs::remove_file(two.path().join("CURRENT")).unwrap();
        let read = gone.read_to_vec(&b, ByteRange::full(b.size)).await;
        assert!(
            matches!(&read, Err(EngineError::Other { message, .. }) if message.contains("No such file")),
            "{read:?}"
        );
    }

    /// A compaction that meets a damaged blob file stops RocksDB's writes
    /// until it is opened again; opened without compactions (as `verify`
    /// opens it), the damaged blob can still be removed.
    #[tokio::test(flavor = "multi_thread")]
    async fn without_compactions_a_damaged_blob_file_stops_no_write() {
        for compactions in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let engine = RocksEngine::open_with(dir.path(), compactions).unwrap();
            let damaged = engine.put_bytes(conformance::pattern(100_000, 1)).await.unwrap();
            engine.inner.db.flush().unwrap();
            let file = blob_files(dir.path()).pop().unwrap();
            let mut bytes = std::fs::read(&file).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xff;
            std::fs::write(&file, bytes).unwrap();
            // Enough tables on the first level for RocksDB to compact
            // them, collecting the oldest blob files' live values.
            let mut removed = Ok(());
            for seed in 2..8 {
                if removed.is_ok() {
                    removed = engine.put_bytes(conformance::pattern(100_000, seed)).await.map(|_| ());
                    let _ = engine.inner.db.flush();
                }
            }
            if removed.is_ok() {
                removed = engine.delete(&damaged).await;
            }
            for _ in 0..50 {
                if removed.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                removed = engine.put_bytes(Bytes::from_static(&[7; 5000])).await.map(|_| ());
            }
            match compactions {
                true => assert!(removed.is_err(), "the compaction did not stop the writes"),
                false => removed.unwrap(),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn chunks_of_an_interrupted_write_are_removed_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let engine = RocksEngine::open(dir.path()).unwrap();
        // What a writer leaves when the process dies after three chunks.
        let id = [7u8; 16];
        let mut batch = WriteBatch::default();
        batch.put(pending_key(&id), b"");
        for n in 0..3 {
            batch.put(chunk_key(&id, n), conformance::pattern(CHUNK, n as u8));
        }
        engine.inner.db.write(batch).unwrap();
        assert_eq!(chunk_count(&engine), 3);
        drop(engine);
        let reopened = RocksEngine::open(dir.path()).unwrap();
        assert_eq!(chunk_count(&reopened), 0);
    }
}
