//! A fault-injecting wrapper: any engine, with writes, syncs or reads made
//! to fail on demand. Tests use it to check that a failure fails the request
//! cleanly and that a failed sync stops writes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use async_trait::async_trait;
use bytes::Bytes;

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, DynEngine, EngineError, Result};

/// Which operation fails next, until changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    None = 0,
    /// `finish` reports a failed sync.
    Sync = 1,
    /// Writes report a full device.
    NoSpace = 2,
    /// Reads fail with an I/O error.
    Read = 3,
}

/// Wraps an engine; see [`Fault`].
pub struct FaultyEngine {
    inner: DynEngine,
    fault: Arc<AtomicU8>,
}

impl FaultyEngine {
    pub fn new(inner: DynEngine) -> FaultyEngine {
        FaultyEngine { inner, fault: Arc::new(AtomicU8::new(Fault::None as u8)) }
    }

    pub fn set(&self, fault: Fault) {
        self.fault.store(fault as u8, Ordering::SeqCst);
    }

    fn is(fault: &AtomicU8, f: Fault) -> bool {
        fault.load(Ordering::SeqCst) == f as u8
    }
}

struct FaultyWriter {
    inner: Box<dyn BlobWriter>,
    fault: Arc<AtomicU8>,
}

#[async_trait]
impl BlobWriter for FaultyWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if FaultyEngine::is(&self.fault, Fault::NoSpace) {
            return Err(EngineError::NoSpace);
        }
        self.inner.write(chunk).await
    }

    async fn finish(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        if FaultyEngine::is(&self.fault, Fault::Sync) {
            self.inner.abort().await;
            return Err(EngineError::SyncFailed(std::io::Error::other("injected fsync failure")));
        }
        self.inner.finish(digest).await
    }

    async fn abort(self: Box<Self>) {
        self.inner.abort().await
    }
}

#[async_trait]
impl BlobEngine for FaultyEngine {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn writer(&self, size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(FaultyWriter { inner: self.inner.writer(size_hint).await?, fault: self.fault.clone() }))
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        if Self::is(&self.fault, Fault::Read) {
            return Err(EngineError::io("faulty", std::io::Error::other("injected read failure")));
        }
        self.inner.read(blob, range).await
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        self.inner.delete(blob).await
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        self.inner.stat(blob).await
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        self.inner.list().await
    }
}
