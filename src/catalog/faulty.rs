//! A fault-injecting wrapper over any catalog: reads and commits fail
//! always, after N operations, or with a seeded probability (see
//! [`Trigger`]). A failed commit either changed nothing, or — when
//! ambiguous failures are on — was applied and then reported as failed, the
//! way a connection lost after `COMMIT` or a failed WAL sync leaves a client
//! that cannot tell.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::{
    BlobRecord, BucketRecord, Catalog, CatalogError, CatalogStats, ClaimId, ListPage, ListQuery, ObjectPut,
    ObjectRecord, Precondition, PutOutcome, Result,
};
pub use crate::engine::faulty::{Switch, Trigger};
use crate::engine::{BlobRef, Digest, Locator};

/// The fault switches of one [`FaultyCatalog`].
pub struct CatalogFaults {
    /// Every lookup, listing and count.
    pub reads: Switch,
    /// Every change.
    pub commits: Switch,
    /// A failed commit may have been applied: half of them are, and report
    /// a lost connection or a failed sync.
    pub ambiguous: AtomicBool,
}

impl CatalogFaults {
    /// Every switch off.
    pub fn off(&self) {
        self.reads.set(Trigger::Never);
        self.commits.set(Trigger::Never);
    }
}

/// Wraps a catalog; see [`CatalogFaults`].
pub struct FaultyCatalog {
    inner: Arc<dyn Catalog>,
    pub faults: Arc<CatalogFaults>,
}

impl FaultyCatalog {
    /// No faults until a switch is set; `seed` seeds the switches' draws.
    pub fn new(inner: Arc<dyn Catalog>, seed: u64) -> FaultyCatalog {
        let faults = CatalogFaults {
            reads: Switch::new(seed ^ 0x5245_4144),
            commits: Switch::new(seed ^ 0x434f_4d4d),
            ambiguous: AtomicBool::new(false),
        };
        FaultyCatalog { inner, faults: Arc::new(faults) }
    }

    fn read(&self) -> Result<()> {
        if self.faults.reads.fires() {
            Err(CatalogError::Internal("injected catalog read failure".into()))
        } else {
            Ok(())
        }
    }

    /// Runs a change, failing it as the commit switch says.
    async fn commit<T>(&self, change: impl Future<Output = Result<T>>) -> Result<T> {
        if !self.faults.commits.fires() {
            return change.await;
        }
        if !self.faults.ambiguous.load(Ordering::SeqCst) || self.faults.commits.coin() {
            return Err(CatalogError::Internal("injected catalog commit failure".into()));
        }
        change.await?;
        Err(if self.faults.commits.coin() {
            CatalogError::Unavailable("injected: the connection dropped after the commit".into())
        } else {
            CatalogError::SyncFailed("injected WAL sync failure after the commit".into())
        })
    }
}

#[async_trait]
impl Catalog for FaultyCatalog {
    async fn create_bucket(&self, bucket: &BucketRecord) -> Result<()> {
        self.commit(self.inner.create_bucket(bucket)).await
    }

    async fn set_bucket_public(&self, name: &str, public_read: bool) -> Result<()> {
        self.commit(self.inner.set_bucket_public(name, public_read)).await
    }

    async fn delete_bucket(&self, name: &str) -> Result<()> {
        self.commit(self.inner.delete_bucket(name)).await
    }

    async fn bucket(&self, name: &str) -> Result<Option<BucketRecord>> {
        self.read()?;
        self.inner.bucket(name).await
    }

    async fn buckets(&self) -> Result<Vec<BucketRecord>> {
        self.read()?;
        self.inner.buckets().await
    }

    async fn get_objects(&self, bucket: &str, keys: &[String]) -> Result<Vec<Option<ObjectRecord>>> {
        self.read()?;
        self.inner.get_objects(bucket, keys).await
    }

    async fn put_objects(&self, puts: Vec<ObjectPut>) -> Result<Vec<PutOutcome>> {
        self.commit(self.inner.put_objects(puts)).await
    }

    async fn put_objects_claimed(&self, puts: Vec<ObjectPut>, claims: &[ClaimId]) -> Result<Vec<PutOutcome>> {
        self.commit(self.inner.put_objects_claimed(puts, claims)).await
    }

    async fn delete_objects(
        &self,
        bucket: &str,
        keys: &[String],
        precondition: &Precondition,
    ) -> Result<Vec<Option<ObjectRecord>>> {
        self.commit(self.inner.delete_objects(bucket, keys, precondition)).await
    }

    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        self.read()?;
        self.inner.list_objects(bucket, query).await
    }

    async fn get_blobs(&self, digests: &[Digest]) -> Result<Vec<Option<BlobRecord>>> {
        self.read()?;
        self.inner.get_blobs(digests).await
    }

    async fn dead_blobs(&self, grace: Duration, limit: usize) -> Result<Vec<BlobRecord>> {
        self.read()?;
        self.inner.dead_blobs(grace, limit).await
    }

    async fn remove_dead_blob(&self, digest: &Digest, grace: Option<Duration>) -> Result<bool> {
        self.commit(self.inner.remove_dead_blob(digest, grace)).await
    }

    // Claims and deletes in progress pass through: the faults are those of
    // the records, and a delete begins with a lookup.
    async fn claim_blobs(&self, digests: &[Digest]) -> Result<Vec<ClaimId>> {
        self.inner.claim_blobs(digests).await
    }

    async fn release_claims(&self, claims: &[ClaimId]) -> Result<()> {
        self.inner.release_claims(claims).await
    }

    async fn renew_claims(&self, claims: &[ClaimId]) -> Result<()> {
        self.inner.renew_claims(claims).await
    }

    async fn begin_delete(&self, blob: &BlobRef) -> Result<bool> {
        self.read()?;
        self.inner.begin_delete(blob).await
    }

    async fn end_delete(&self, digest: &Digest) -> Result<()> {
        self.inner.end_delete(digest).await
    }

    async fn node_seen(&self, node: &str) -> Result<()> {
        self.inner.node_seen(node).await
    }

    async fn node_gone(&self, node: &str) -> Result<()> {
        self.inner.node_gone(node).await
    }

    async fn live_nodes(&self, within: Duration) -> Result<Vec<String>> {
        self.inner.live_nodes(within).await
    }

    async fn stats(&self) -> Result<CatalogStats> {
        self.read()?;
        self.inner.stats().await
    }

    async fn list_blobs(&self, after: Option<Digest>, limit: usize) -> Result<Vec<BlobRecord>> {
        self.read()?;
        self.inner.list_blobs(after, limit).await
    }

    async fn set_locators(&self, moved: &[(Digest, Locator)]) -> Result<()> {
        self.commit(self.inner.set_locators(moved)).await
    }

    async fn set_refs(&self, counted: &[(Digest, u64)]) -> Result<()> {
        self.commit(self.inner.set_refs(counted)).await
    }

    async fn set_stats(&self, stats: CatalogStats) -> Result<()> {
        self.commit(self.inner.set_stats(stats)).await
    }

    fn checkpoints(&self) -> bool {
        self.inner.checkpoints()
    }

    async fn checkpoint(&self, dir: &std::path::Path) -> Result<()> {
        self.read()?;
        self.inner.checkpoint(dir).await
    }
}
