//! `hybrid` (the default): small blobs in RocksDB, large ones as files.
//!
//! "To BLOB or Not To BLOB" found databases faster below about 256 KB and
//! file systems faster above about 1 MB; small values in an LSM tree also
//! avoid a file's 4 KiB block and inode each. A blob goes to RocksDB when it
//! is at most `threshold` bytes, to a file otherwise. The writer buffers up to
//! the threshold in memory, so it never holds more than that per upload; when
//! the client declares a larger length, it goes straight to a file.
//!
//! The tier is kept in the blob's locator (`r` or `f`), so changing the
//! threshold later leaves existing blobs readable where they are.
//!
//! A blob of at most [`IN_LOCATOR`] bytes (and within the threshold) goes
//! in its locator itself (`i` and the bytes), which the catalog keeps in the
//! blob's record: storing it is part of the catalog's commit (no write or
//! sync of its own), and reading it needs no lookup beyond the catalog's.
//! It is still one blob per content. Deleting such a blob frees nothing
//! here: its bytes go with the catalog's record.

use std::path::Path;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};

use super::fs::FsEngine;
use super::rocks::RocksEngine;
use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result};

const NAME: &str = "hybrid";
const SMALL: &[u8] = b"r";
const LARGE: &[u8] = b"f";
const IN_LOCATOR_TAG: u8 = b'i';

/// Largest blob carried in its locator: a page.
pub const IN_LOCATOR: u64 = 4096;

/// Default largest blob kept in RocksDB.
pub const DEFAULT_THRESHOLD: u64 = 256 * 1024;

/// The largest threshold allowed: an upload of up to the threshold is held
/// in memory until it is complete.
pub const MAX_THRESHOLD: u64 = 64 << 20;

/// The tiered engine.
#[derive(Clone)]
pub struct HybridEngine {
    small: RocksEngine,
    large: FsEngine,
    threshold: u64,
}

impl HybridEngine {
    /// Opens the tiers under `root`: `root/rocksdb` and `root/files`.
    pub fn open(root: &Path, threshold: u64) -> Result<HybridEngine> {
        HybridEngine::open_with(root, threshold, true)
    }

    /// [`HybridEngine::open`], with or without RocksDB's own compactions
    /// (see [`RocksEngine::open_with`]).
    pub fn open_with(root: &Path, threshold: u64, compactions: bool) -> Result<HybridEngine> {
        if threshold > MAX_THRESHOLD {
            return Err(EngineError::other(
                NAME,
                format!(
                    "the inline threshold may be at most {MAX_THRESHOLD} bytes (64 MiB): an upload up to it is \
                     held in memory"
                ),
            ));
        }
        Ok(HybridEngine {
            small: RocksEngine::open_with(&root.join("rocksdb"), compactions)?,
            large: FsEngine::open(&root.join("files"))?,
            threshold,
        })
    }

    fn tier(&self, blob: &BlobRef) -> Result<&dyn BlobEngine> {
        match blob.locator.as_slice() {
            SMALL => Ok(&self.small),
            LARGE => Ok(&self.large),
            _ => Err(unknown_tier(blob)),
        }
    }
}

fn unknown_tier(blob: &BlobRef) -> EngineError {
    match blob.locator.split_first() {
        // Damage to this blob's record, not trouble of the engine's: the
        // rest of a `verify` goes on.
        Some((&IN_LOCATOR_TAG, bytes)) => {
            EngineError::damaged(NAME, format!("its record holds {} bytes of it, not {}", bytes.len(), blob.size))
        }
        _ => EngineError::other(NAME, format!("unknown tier {:?}", blob.locator.first())),
    }
}

/// The bytes of a blob carried in its locator.
fn in_locator(blob: &BlobRef) -> Option<&[u8]> {
    match blob.locator.split_first() {
        Some((&IN_LOCATOR_TAG, bytes)) if bytes.len() as u64 == blob.size => Some(bytes),
        _ => None,
    }
}

enum Tier {
    /// Still small enough for RocksDB: the bytes so far.
    Buffered(BytesMut),
    Large(Box<dyn BlobWriter>),
}

struct HybridWriter {
    engine: HybridEngine,
    tier: Tier,
}

impl HybridWriter {
    /// Finishes in the chosen tier; a large blob is always synced (the file
    /// system has no shared sync to wait for).
    async fn end(self: Box<Self>, digest: Digest, synced: bool) -> Result<BlobRef> {
        let (mut blob, locator) = match self.tier {
            Tier::Buffered(buf) if buf.len() as u64 <= IN_LOCATOR.min(self.engine.threshold) => {
                let size = buf.len() as u64;
                let mut locator = Vec::with_capacity(1 + buf.len());
                locator.push(IN_LOCATOR_TAG);
                locator.extend_from_slice(&buf);
                return Ok(BlobRef { digest, size, locator });
            }
            Tier::Buffered(buf) => {
                let mut w = self.engine.small.writer(Some(buf.len() as u64)).await?;
                w.write(buf.freeze()).await?;
                let blob = if synced { w.finish(digest).await? } else { w.finish_unsynced(digest).await? };
                (blob, SMALL)
            }
            Tier::Large(w) => (w.finish(digest).await?, LARGE),
        };
        blob.locator = locator.to_vec();
        Ok(blob)
    }
}

#[async_trait]
impl BlobWriter for HybridWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        match &mut self.tier {
            Tier::Buffered(buf) if (buf.len() + chunk.len()) as u64 <= self.engine.threshold => {
                buf.extend_from_slice(&chunk);
            }
            Tier::Buffered(buf) => {
                let mut large = self.engine.large.writer(None).await?;
                large.write(buf.split().freeze()).await?;
                large.write(chunk).await?;
                self.tier = Tier::Large(large);
            }
            Tier::Large(w) => w.write(chunk).await?,
        }
        Ok(())
    }

    async fn finish(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        self.end(digest, true).await
    }

    async fn finish_unsynced(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        self.end(digest, false).await
    }

    async fn abort(self: Box<Self>) {
        if let Tier::Large(w) = self.tier {
            w.abort().await;
        }
    }
}

#[async_trait]
impl BlobEngine for HybridEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn writer(&self, size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        let tier = match size_hint {
            Some(n) if n > self.threshold => Tier::Large(self.large.writer(size_hint).await?),
            Some(n) => Tier::Buffered(BytesMut::with_capacity(n as usize)),
            None => Tier::Buffered(BytesMut::new()),
        };
        Ok(Box::new(HybridWriter { engine: self.clone(), tier }))
    }

    async fn sync(&self) -> Result<()> {
        self.small.sync().await
    }

    /// The file tier's: RocksDB's are removed when it opens, as only this
    /// process writes there.
    async fn remove_abandoned(&self) -> Result<()> {
        self.large.remove_abandoned().await
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        if let Some(bytes) = in_locator(blob) {
            if range.end > blob.size {
                return Err(EngineError::other(NAME, "range beyond the end of the blob"));
            }
            let bytes = Bytes::copy_from_slice(&bytes[range.start as usize..range.end as usize]);
            return Ok(Box::pin(futures::stream::once(async { Ok(bytes) })));
        }
        self.tier(blob)?.read(blob, range).await
    }

    async fn read_to_send(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        if in_locator(blob).is_some() {
            return self.read(blob, range).await;
        }
        self.tier(blob)?.read_to_send(blob, range).await
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        // Bytes in the locator are nowhere else, whatever size the caller
        // knows (a migration's journal knows none).
        if blob.locator.first() == Some(&IN_LOCATOR_TAG) {
            return Ok(());
        }
        self.tier(blob)?.delete(blob).await
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        if in_locator(blob).is_some() {
            return Ok(Some(blob.size));
        }
        self.tier(blob)?.stat(blob).await
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        let mut all = self.small.list().await?;
        all.iter_mut().for_each(|b| b.locator = SMALL.to_vec());
        let mut large = self.large.list().await?;
        large.iter_mut().for_each(|b| b.locator = LARGE.to_vec());
        all.append(&mut large);
        Ok(all)
    }

    async fn read_small(&self, blobs: &[BlobRef]) -> Result<Vec<Bytes>> {
        let mut out = vec![Bytes::new(); blobs.len()];
        let (mut small, mut large) = (Vec::new(), Vec::new());
        for (i, blob) in blobs.iter().enumerate() {
            match blob.locator.as_slice() {
                SMALL => small.push(i),
                LARGE => large.push(i),
                _ => out[i] = Bytes::copy_from_slice(in_locator(blob).ok_or_else(|| unknown_tier(blob))?),
            }
        }
        let picked = |idx: &[usize]| idx.iter().map(|i| blobs[*i].clone()).collect::<Vec<_>>();
        for (i, bytes) in small.iter().zip(self.small.read_small(&picked(&small)).await?) {
            out[*i] = bytes;
        }
        for (i, bytes) in large.iter().zip(self.large.read_small(&picked(&large)).await?) {
            out[*i] = bytes;
        }
        Ok(out)
    }

    async fn disk_usage(&self) -> Result<Option<u64>> {
        let small = self.small.disk_usage().await?.unwrap_or(0);
        let large = self.large.disk_usage().await?.unwrap_or(0);
        Ok(Some(small + large))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::BlobEngineExt;
    use crate::engine::conformance;

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        conformance::run_all(&HybridEngine::open(dir.path(), DEFAULT_THRESHOLD).unwrap()).await;
    }

    /// Bytes kept in a record that are not the blob's length are damage
    /// to that blob (which `verify` names and goes on), not an error of
    /// the engine.
    #[tokio::test]
    async fn bytes_in_a_record_of_the_wrong_length_are_damage() {
        let dir = tempfile::tempdir().unwrap();
        let engine = HybridEngine::open(dir.path(), DEFAULT_THRESHOLD).unwrap();
        let mut blob = engine.put_bytes(conformance::pattern(100, 1)).await.unwrap();
        assert_eq!(blob.locator.first(), Some(&IN_LOCATOR_TAG));
        blob.locator.truncate(50);
        let e = engine.read_to_vec(&blob, ByteRange::full(100)).await.unwrap_err();
        assert!(matches!(e, EngineError::Damaged { .. }), "{e}");
    }

    #[test]
    fn a_threshold_held_in_memory_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let too_large = HybridEngine::open(dir.path(), MAX_THRESHOLD + 1).err().unwrap();
        assert!(too_large.to_string().contains("at most 67108864 bytes"), "{too_large}");
        assert!(HybridEngine::open(dir.path(), MAX_THRESHOLD).is_ok());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn size_picks_the_tier() {
        let dir = tempfile::tempdir().unwrap();
        let engine = HybridEngine::open(dir.path(), 10_000).unwrap();
        let small = engine.put_bytes(conformance::pattern(10_000, 1)).await.unwrap();
        let large = engine.put_bytes(conformance::pattern(10_001, 2)).await.unwrap();
        assert_eq!((small.locator.as_slice(), large.locator.as_slice()), (SMALL, LARGE));
        // At most a page travels in its locator, in neither tier.
        let tiny = engine.put_bytes(conformance::pattern(300, 4)).await.unwrap();
        assert_eq!(tiny.locator[0], IN_LOCATOR_TAG);
        assert_eq!(
            engine.read_to_vec(&tiny, ByteRange { start: 10, end: 20 }).await.unwrap(),
            conformance::pattern(300, 4)[10..20]
        );
        assert!(!engine.list().await.unwrap().iter().any(|b| b.digest == tiny.digest));
        assert!(engine.large.blob_path(&large.digest).is_file());
        assert!(!engine.large.blob_path(&small.digest).exists());
        // A size declared up front also picks the file tier, unbuffered.
        let mut w = engine.writer(Some(50_000)).await.unwrap();
        w.write(conformance::pattern(50_000, 3)).await.unwrap();
        let hinted = w.finish(Digest(crate::engine::sha2_digest(&conformance::pattern(50_000, 3)))).await.unwrap();
        assert_eq!(hinted.locator, LARGE);
    }
}
