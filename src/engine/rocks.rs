//! `rocksdb`: blobs as values in an embedded RocksDB, with BlobDB keeping
//! large values out of the LSM tree so compaction does not rewrite them.
//!
//! Keys (one column family, each kind under its own first byte):
//!
//! | key | value |
//! |---|---|
//! | `h` digest(32) | head: id(16) size(8) modified-ns(8) |
//! | `c` id(16) chunk-no(4, big-endian) | up to [`CHUNK`] bytes |
//! | `p` id(16) | empty: the blob `id` is still being written |
//!
//! A blob's chunks are written as they stream in under a fresh random id; the
//! head that names them by digest is written last, in a synced batch, so a
//! reader never finds a head without all its chunks. Blobs of one chunk (the
//! common case behind `hybrid`) are a single synced batch. A crash while
//! chunks stream leaves a `p` marker; opening the database removes those
//! chunks.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use rocksdb::{DB, Direction, IteratorMode, Options, WriteBatch, WriteOptions};

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result};

const NAME: &str = "rocksdb";
/// Size of one stored value of a blob.
pub const CHUNK: usize = 1024 * 1024;
const LOCK_STRIPES: usize = 64;

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
    opts
}

fn db_err(e: rocksdb::Error) -> EngineError {
    EngineError::other(NAME, e)
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

struct Head {
    id: [u8; 16],
    size: u64,
    modified_ns: u64,
}

impl Head {
    fn encode(&self) -> [u8; 32] {
        let mut v = [0u8; 32];
        v[..16].copy_from_slice(&self.id);
        v[16..24].copy_from_slice(&self.size.to_be_bytes());
        v[24..].copy_from_slice(&self.modified_ns.to_be_bytes());
        v
    }

    fn decode(v: &[u8]) -> Result<Head> {
        if v.len() != 32 {
            return Err(EngineError::other(NAME, "corrupt blob head"));
        }
        Ok(Head {
            id: v[..16].try_into().expect("16 bytes"),
            size: u64::from_be_bytes(v[16..24].try_into().expect("8 bytes")),
            modified_ns: u64::from_be_bytes(v[24..].try_into().expect("8 bytes")),
        })
    }
}

/// The RocksDB engine; clones share one database.
#[derive(Clone)]
pub struct RocksEngine {
    inner: Arc<Inner>,
}

struct Inner {
    db: DB,
    /// Serialises the check-then-write of a head per digest, so two writers
    /// of the same content agree on one set of chunks.
    heads: [Mutex<()>; LOCK_STRIPES],
}

impl RocksEngine {
    /// Opens (creating if needed) the database at `path` and removes chunks
    /// of blobs whose writing a crash interrupted.
    pub fn open(path: &Path) -> Result<RocksEngine> {
        let mut opts = base_options();
        opts.set_enable_blob_files(true);
        opts.set_min_blob_size(4096);
        opts.set_enable_blob_gc(true);
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
        Ok(RocksEngine { inner: Arc::new(Inner { db, heads: std::array::from_fn(|_| Mutex::new(())) }) })
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| EngineError::other(NAME, format!("blocking task failed: {e}")))?
}

struct RocksWriter {
    inner: Arc<Inner>,
    id: [u8; 16],
    buf: BytesMut,
    /// Chunks already written to the database.
    written: u32,
}

impl RocksWriter {
    /// Writes the full buffered chunk; the first one also marks the blob as
    /// in progress so a crash cannot strand its chunks.
    async fn spill(&mut self) -> Result<()> {
        let chunk = self.buf.split_to(CHUNK).freeze();
        let (inner, id, n) = (self.inner.clone(), self.id, self.written);
        blocking(move || {
            let mut batch = WriteBatch::default();
            if n == 0 {
                batch.put(pending_key(&id), b"");
            }
            batch.put(chunk_key(&id, n), &chunk);
            inner.db.write(batch).map_err(db_err)
        })
        .await?;
        self.written += 1;
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

    async fn finish(mut self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        let last = self.buf.split().freeze();
        let (inner, id, written) = (self.inner.clone(), self.id, self.written);
        self.written = 0; // from here on, finish owns the chunks
        let size = written as u64 * CHUNK as u64 + last.len() as u64;
        blocking(move || {
            let _guard = inner.heads[digest.0[0] as usize % LOCK_STRIPES].lock();
            let mut batch = WriteBatch::default();
            let head = match inner.db.get(head_key(&digest)).map_err(db_err)? {
                Some(existing) => {
                    // Same content already stored: keep it, refresh its age,
                    // and drop the chunks this writer staged.
                    if written > 0 {
                        batch.delete_range(chunk_key(&id, 0), chunk_key(&id, u32::MAX));
                    }
                    Head { modified_ns: now_ns(), ..Head::decode(&existing)? }
                }
                None => {
                    if !last.is_empty() || written == 0 {
                        batch.put(chunk_key(&id, written), &last);
                    }
                    Head { id, size, modified_ns: now_ns() }
                }
            };
            if written > 0 {
                batch.delete(pending_key(&id));
            }
            batch.put(head_key(&digest), head.encode());
            inner.db.write_opt(batch, &synced()).map_err(|e| EngineError::SyncFailed(std::io::Error::other(e)))?;
            Ok(BlobRef { digest, size: head.size, locator: Vec::new() })
        })
        .await
    }

    async fn abort(self: Box<Self>) {}
}

impl Drop for RocksWriter {
    fn drop(&mut self) {
        if self.written > 0 {
            let mut batch = WriteBatch::default();
            batch.delete_range(chunk_key(&self.id, 0), chunk_key(&self.id, u32::MAX));
            batch.delete(pending_key(&self.id));
            // Best effort: if this fails, the marker makes the next open clean up.
            let _ = self.inner.db.write(batch);
        }
    }
}

#[async_trait]
impl BlobEngine for RocksEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn writer(&self, _size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(RocksWriter { inner: self.inner.clone(), id: rand::random(), buf: BytesMut::new(), written: 0 }))
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        let digest = blob.digest;
        // The head is a few bytes: read on this thread.
        let head = {
            let v = self.inner.db.get_pinned(head_key(&digest)).map_err(db_err)?;
            Head::decode(&v.ok_or(EngineError::NotFound(digest))?)?
        };
        if range.end > head.size {
            return Err(EngineError::other(NAME, "range beyond the end of the blob"));
        }
        if range.is_empty() {
            return Ok(Box::pin(futures::stream::empty()));
        }
        let first = (range.start / CHUNK as u64) as u32;
        let last = ((range.end - 1) / CHUNK as u64) as u32;
        if first == last {
            // One value (at most a chunk): read it on this thread, where a
            // cached read costs less than a hand-off to the blocking pool.
            let v = self.inner.db.get_pinned(chunk_key(&head.id, first)).map_err(db_err)?;
            let v = v.ok_or_else(|| EngineError::other(NAME, "blob chunk missing"))?;
            let at = (range.start % CHUNK as u64) as usize;
            let bytes = v
                .get(at..at + range.len() as usize)
                .map(Bytes::copy_from_slice)
                .ok_or_else(|| EngineError::other(NAME, "blob chunk short"))?;
            return Ok(Box::pin(futures::stream::once(async { Ok(bytes) })));
        }
        let inner = self.inner.clone();
        Ok(super::read_blocking(first..=last, move |n| {
            let chunk_start = n as u64 * CHUNK as u64;
            let v = inner.db.get_pinned(chunk_key(&head.id, n)).map_err(db_err)?;
            let v = v.ok_or_else(|| EngineError::other(NAME, "blob chunk missing"))?;
            let from = range.start.saturating_sub(chunk_start) as usize;
            let to = ((range.end - chunk_start) as usize).min(v.len());
            v.get(from..to).map(Bytes::copy_from_slice).ok_or_else(|| EngineError::other(NAME, "blob chunk short"))
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
            let head = Head::decode(&v)?;
            let mut batch = WriteBatch::default();
            batch.delete_range(chunk_key(&head.id, 0), chunk_key(&head.id, u32::MAX));
            batch.delete(head_key(&digest));
            inner.db.write(batch).map_err(db_err)
        })
        .await
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        let digest = blob.digest;
        blocking(move || match inner.db.get_pinned(head_key(&digest)).map_err(db_err)? {
            Some(v) => Ok(Some(Head::decode(&v)?.size)),
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
                let head = Head::decode(&value)?;
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
        let digests: Vec<Digest> = blobs.iter().map(|b| b.digest).collect();
        blocking(move || {
            let heads = inner.db.multi_get(digests.iter().map(head_key));
            let mut keys = Vec::new();
            for (digest, head) in digests.iter().zip(heads) {
                let head = Head::decode(&head.map_err(db_err)?.ok_or(EngineError::NotFound(*digest))?)?;
                let chunks = head.size.div_ceil(CHUNK as u64).max(1) as u32;
                keys.push((0..chunks).map(|n| chunk_key(&head.id, n)).collect::<Vec<_>>());
            }
            let values = inner.db.multi_get(keys.iter().flatten());
            let mut values = values.into_iter();
            let mut out = Vec::with_capacity(keys.len());
            for chunk_keys in &keys {
                let mut blob = BytesMut::new();
                for value in values.by_ref().take(chunk_keys.len()) {
                    blob.extend_from_slice(
                        &value.map_err(db_err)?.ok_or_else(|| EngineError::other(NAME, "blob chunk missing"))?,
                    );
                }
                out.push(blob.freeze());
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
    use crate::engine::conformance;

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        conformance::run_all(&RocksEngine::open(dir.path()).unwrap()).await;
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
        let chunks = |e: &RocksEngine| {
            e.inner.db.iterator(IteratorMode::Start).filter(|i| i.as_ref().unwrap().0[0] == b'c').count()
        };
        assert_eq!(chunks(&engine), 3);
        drop(engine);
        let reopened = RocksEngine::open(dir.path()).unwrap();
        assert_eq!(chunks(&reopened), 0);
    }
}
