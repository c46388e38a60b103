//! A fault-injecting wrapper: any engine, with its reads, writes or syncs
//! made to fail always, after N operations, or with a probability drawn
//! from a seeded generator (so a failing run can be replayed). Tests use it
//! to check that a failure fails the request cleanly, that a failed sync
//! stops writes, and that a full device leaves no partial object.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, DynEngine, EngineError, Result};

/// When a class of operations fails.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    Never,
    Always,
    /// The next N operations succeed, every later one fails.
    After(u64),
    /// Each operation fails with this probability.
    Chance(f64),
}

/// One class of operations' trigger, with the count and generator it
/// draws from.
pub struct Switch {
    state: Mutex<SwitchState>,
}

struct SwitchState {
    trigger: Trigger,
    seen: u64,
    rng: StdRng,
}

impl Switch {
    pub fn new(seed: u64) -> Switch {
        Switch { state: Mutex::new(SwitchState { trigger: Trigger::Never, seen: 0, rng: StdRng::seed_from_u64(seed) }) }
    }

    /// Sets the trigger and restarts the count of operations.
    pub fn set(&self, trigger: Trigger) {
        let mut s = self.state.lock();
        s.trigger = trigger;
        s.seen = 0;
    }

    /// Counts one operation; whether it is to fail.
    pub fn fires(&self) -> bool {
        let mut s = self.state.lock();
        s.seen += 1;
        match s.trigger {
            Trigger::Never => false,
            Trigger::Always => true,
            Trigger::After(n) => s.seen > n,
            Trigger::Chance(p) => s.rng.random_bool(p.clamp(0.0, 1.0)),
        }
    }

    /// A coin from the same generator: which way a fault goes.
    pub fn coin(&self) -> bool {
        self.state.lock().rng.random_bool(0.5)
    }
}

/// The fault switches of one [`FaultyEngine`].
pub struct EngineFaults {
    /// `read` (when opened and for every chunk), `read_small`, `stat`,
    /// `list`, `disk_usage`: an I/O error.
    pub reads: Switch,
    /// `writer`, `write`: a full device; `delete`: an I/O error.
    pub writes: Switch,
    /// `finish`: a failed sync, before the inner engine finishes or after
    /// (the blob stored, the sync of its directory failed), at random.
    pub syncs: Switch,
    /// `list` alone: an I/O error.
    pub lists: Switch,
    /// How long `read` and `read_small` wait before they begin: a slow
    /// device.
    pub read_delay: Mutex<std::time::Duration>,
    /// How long after it is asked a `delete` lands, whether or not its
    /// caller still waits: a slow device under an engine that deletes on
    /// the blocking pool, where a dropped future does not stop the work.
    pub delete_delay: Mutex<std::time::Duration>,
}

impl EngineFaults {
    /// Every switch off.
    pub fn off(&self) {
        for s in [&self.reads, &self.writes, &self.syncs, &self.lists] {
            s.set(Trigger::Never);
        }
        *self.read_delay.lock() = std::time::Duration::ZERO;
        *self.delete_delay.lock() = std::time::Duration::ZERO;
    }
}

/// Wraps an engine; see [`EngineFaults`].
pub struct FaultyEngine {
    inner: DynEngine,
    pub faults: Arc<EngineFaults>,
}

fn read_error() -> EngineError {
    EngineError::io("faulty", std::io::Error::other("injected read failure"))
}

fn sync_error() -> EngineError {
    EngineError::SyncFailed(std::io::Error::other("injected fsync failure"))
}

impl FaultyEngine {
    /// No faults until a switch is set; `seed` seeds the switches' draws.
    pub fn new(inner: DynEngine, seed: u64) -> FaultyEngine {
        let faults = EngineFaults {
            reads: Switch::new(seed),
            writes: Switch::new(seed ^ 0x5752_4954),
            syncs: Switch::new(seed ^ 0x5359_4e43),
            lists: Switch::new(seed ^ 0x4c49_5354),
            read_delay: Mutex::new(std::time::Duration::ZERO),
            delete_delay: Mutex::new(std::time::Duration::ZERO),
        };
        FaultyEngine { inner, faults: Arc::new(faults) }
    }

    fn check_read(&self) -> Result<()> {
        if self.faults.reads.fires() { Err(read_error()) } else { Ok(()) }
    }

    async fn slow_read(&self) {
        let delay = *self.faults.read_delay.lock();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }
}

struct FaultyWriter {
    inner: Box<dyn BlobWriter>,
    faults: Arc<EngineFaults>,
}

#[async_trait]
impl BlobWriter for FaultyWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        if self.faults.writes.fires() {
            return Err(EngineError::NoSpace);
        }
        self.inner.write(chunk).await
    }

    async fn finish(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        if !self.faults.syncs.fires() {
            return self.inner.finish(digest).await;
        }
        if self.faults.syncs.coin() {
            self.inner.finish(digest).await?;
        } else {
            self.inner.abort().await;
        }
        Err(sync_error())
    }

    async fn finish_unsynced(self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        self.inner.finish_unsynced(digest).await
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
        if self.faults.writes.fires() {
            return Err(EngineError::NoSpace);
        }
        Ok(Box::new(FaultyWriter { inner: self.inner.writer(size_hint).await?, faults: self.faults.clone() }))
    }

    async fn sync(&self) -> Result<()> {
        if !self.faults.syncs.fires() {
            return self.inner.sync().await;
        }
        // Failed before, or after, the bytes reached the disk.
        if self.faults.syncs.coin() {
            self.inner.sync().await?;
        }
        Err(sync_error())
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        self.slow_read().await;
        self.check_read()?;
        let faults = self.faults.clone();
        let stream = self.inner.read(blob, range).await?;
        // A failure in the middle of a body, after the first bytes went out.
        Ok(Box::pin(stream.map(move |chunk| if faults.reads.fires() { Err(read_error()) } else { chunk })))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        if self.faults.writes.fires() {
            return Err(EngineError::io("faulty", std::io::Error::other("injected delete failure")));
        }
        let delay = *self.faults.delete_delay.lock();
        if delay.is_zero() {
            return self.inner.delete(blob).await;
        }
        let (inner, blob) = (self.inner.clone(), blob.clone());
        let landing = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            inner.delete(&blob).await
        });
        landing.await.map_err(|e| EngineError::io("faulty", std::io::Error::other(e.to_string())))?
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        self.check_read()?;
        self.inner.stat(blob).await
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        self.check_read()?;
        if self.faults.lists.fires() {
            return Err(read_error());
        }
        self.inner.list().await
    }

    async fn disk_usage(&self) -> Result<Option<u64>> {
        self.check_read()?;
        self.inner.disk_usage().await
    }

    async fn read_small(&self, blobs: &[BlobRef]) -> Result<Vec<Bytes>> {
        self.slow_read().await;
        self.check_read()?;
        self.inner.read_small(blobs).await
    }
}
