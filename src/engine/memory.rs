//! `memory`: blobs in RAM, for tests. Unlike every other engine it holds
//! whole blobs in memory, and nothing survives a restart.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use parking_lot::RwLock;

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result};

const NAME: &str = "memory";
const READ_CHUNK: usize = 64 * 1024;

type Blobs = Arc<RwLock<HashMap<Digest, (Bytes, SystemTime)>>>;

/// The in-memory engine.
#[derive(Debug, Default)]
pub struct MemoryEngine {
    blobs: Blobs,
}

impl MemoryEngine {
    pub fn new() -> MemoryEngine {
        MemoryEngine::default()
    }
}

struct MemoryWriter {
    blobs: Blobs,
    buf: BytesMut,
}

#[async_trait]
impl BlobWriter for MemoryWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        self.buf.extend_from_slice(&chunk);
        Ok(())
    }

    async fn finish(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        let size = self.buf.len() as u64;
        self.blobs.write().insert(digest, (self.buf.freeze(), SystemTime::now()));
        Ok(BlobRef { digest, size, locator: Vec::new() })
    }

    async fn abort(self: Box<Self>) {}
}

#[async_trait]
impl BlobEngine for MemoryEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn writer(&self, _size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(MemoryWriter { blobs: self.blobs.clone(), buf: BytesMut::new() }))
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        let bytes = self.blobs.read().get(&blob.digest).map(|(b, _)| b.clone());
        let bytes = bytes.ok_or(EngineError::NotFound(blob.digest))?;
        if range.end > bytes.len() as u64 {
            return Err(EngineError::other(NAME, "range beyond the end of the blob"));
        }
        let slice = bytes.slice(range.start as usize..range.end as usize);
        let chunks: Vec<Result<Bytes>> = (0..slice.len())
            .step_by(READ_CHUNK)
            .map(|at| Ok(slice.slice(at..(at + READ_CHUNK).min(slice.len()))))
            .collect();
        Ok(Box::pin(futures::stream::iter(chunks)))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        self.blobs.write().remove(&blob.digest);
        Ok(())
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        Ok(self.blobs.read().get(&blob.digest).map(|(b, _)| b.len() as u64))
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        Ok(self
            .blobs
            .read()
            .iter()
            .map(|(digest, (bytes, modified))| BlobInfo {
                digest: *digest,
                size: bytes.len() as u64,
                locator: Vec::new(),
                modified: *modified,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn conformance() {
        crate::engine::conformance::run_all(&super::MemoryEngine::new()).await;
    }
}
