//! The embedded catalog, in RocksDB.
//!
//! Column families:
//!
//! | family | key | value |
//! |---|---|---|
//! | `buckets` | name | [`BucketRecord`] |
//! | `objects` | bucket `0x00` key | [`ObjectRecord`] |
//! | `blobs` | digest(32) | [`BlobRecord`] |
//! | `dead` | unreferenced-since(8, big-endian) digest(32) | empty: blobs waiting for the collector |
//! | `meta` | `stats` | [`CatalogStats`], summed by a merge operator |
//!
//! Bucket names cannot hold `0x00` and keys cannot hold NUL, so one bucket's
//! keys are contiguous and in byte order. A transaction takes striped locks
//! on the object keys and blob digests it touches (in one global order, so
//! transactions never deadlock), reads, and writes one batch; it is answered
//! once a sync of the write-ahead log, shared by every transaction written
//! before it, has made the batch durable.
//!
//! Records looked up one at a time (a GET or HEAD) are kept in memory: this
//! process is the catalog's only writer (RocksDB locks the directory), so
//! every change passes through [`Txn::commit`], which drops the records it
//! changed. See [`Inner::object`] for why a reader never puts back a record
//! a writer has just replaced.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::{Mutex, MutexGuard, RwLock};
use rocksdb::{ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, MergeOperands, WriteBatch};

use super::{
    BlobRecord, BucketRecord, Catalog, CatalogError, CatalogStats, ListPage, ListQuery, Millis, ObjectPut,
    ObjectRecord, Precondition, PutOutcome, Result, now_millis,
};
use super::{decode, encode};
use crate::engine::group_commit::GroupCommit;
use crate::engine::{BlobRef, Digest, Locator};

const STRIPES: usize = 1024;
/// Bytes of object records kept for single lookups: some 20,000 records
/// of a short key and one part (see `RecordWeight`).
const HOT_RECORDS: u64 = 8 << 20;
const STATS_KEY: &[u8] = b"stats";
/// Most point reads (or records of a transaction) handled on the calling
/// thread rather than the blocking pool.
const INLINE_WORK: usize = 8;

fn err(e: impl std::fmt::Display) -> CatalogError {
    CatalogError::Internal(e.to_string())
}

/// Opens the catalog after a crash as after a clean stop, but refuses a
/// write-ahead log damaged before its end.
///
/// A crash in the middle of a write (a power cut most of all) leaves the
/// log's last records cut short or torn: they were never acknowledged, and
/// recovering to the point before them is right. Damage further in (a bad
/// sector) would be recovered past the same way, dropping every later
/// record without a word, and records lost from the catalog leave their
/// bytes looking like leftovers to `verify`, which would remove them. So
/// when the log is not read whole, its records are looked at: whole ones
/// after the damage mean it is not a torn end, and the catalog is refused.
fn open_recovered(opts: &rocksdb::Options, path: &Path, cfs: impl Fn() -> Vec<ColumnFamilyDescriptor>) -> Result<DB> {
    use rocksdb::DBRecoveryMode::{PointInTime, TolerateCorruptedTailRecords};
    let with = |mode| {
        let mut opts = opts.clone();
        opts.set_wal_recovery_mode(mode);
        opts
    };
    // RocksDB syncs what it makes inside its directory, not the directory's
    // own entry: without it, a crash could leave a new store no catalog.
    crate::engine::create_dir_durably(path).map_err(err)?;
    let first = match DB::open_cf_descriptors(&with(TolerateCorruptedTailRecords), path, cfs()) {
        Err(e) if e.kind() == rocksdb::ErrorKind::Corruption => e,
        opened => return opened.map_err(err),
    };
    let mut logs: Vec<_> = std::fs::read_dir(path)
        .map_err(err)?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "log") && p.file_stem().is_some_and(|n| n != "LOG"))
        .collect();
    oldest_first(&mut logs);
    let mut damaged_within = false;
    for (i, log) in logs.iter().enumerate() {
        let bytes = std::fs::read(log).map_err(err)?;
        // Damage in any log but the newest is followed by the newer ones.
        damaged_within |=
            wal::first_damage(&bytes).is_some_and(|bad| i + 1 < logs.len() || wal::whole_record_after(&bytes, bad));
    }
    if damaged_within {
        return Err(CatalogError::Internal(format!(
            "the catalog in {} is damaged ({first}): records follow the damage in its log, and opening it \
             would drop them; depot does not, so serve a copy made by `depot backup` instead",
            path.display()
        )));
    }
    let db = DB::open_cf_descriptors(&with(PointInTime), path, cfs()).map_err(err)?;
    tracing::warn!("the catalog's log ended in a record a crash cut short, never acknowledged: {first}");
    Ok(db)
}

/// RocksDB's write-ahead log format, read only to tell a torn end from
/// damage within: blocks of 32 KiB holding records, each a masked CRC32C
/// of its type and payload (4 bytes), the payload's length (2 bytes,
/// little-endian), its type (1 byte: 1 whole, 2 first, 3 middle and
/// 4 last piece of a write), then the payload.
mod wal {
    const BLOCK: usize = 32 * 1024;
    const HEADER: usize = 7;

    /// The record at `at`, if it is whole and its checksum holds: its end.
    fn record_at(log: &[u8], at: usize) -> Option<usize> {
        let room = BLOCK - at % BLOCK;
        let header = log.get(at..at + HEADER).filter(|_| room >= HEADER)?;
        let len = u16::from_le_bytes([header[4], header[5]]) as usize;
        let kind = header[6];
        if !(1..=4).contains(&kind) || HEADER + len > room {
            return None;
        }
        let payload = log.get(at + HEADER..at + HEADER + len)?;
        let stored = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        (stored == masked_crc(kind, payload)).then_some(at + HEADER + len)
    }

    fn masked_crc(kind: u8, payload: &[u8]) -> u32 {
        let mut crc = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        crc.update(&[kind]);
        crc.update(payload);
        (crc.finalize() as u32).rotate_right(15).wrapping_add(0xa282_ead8)
    }

    /// Where the first record that does not hold begins, if one does not.
    /// A block's last bytes too few for a header are padding, as are the
    /// zeros after a log's last record.
    pub fn first_damage(log: &[u8]) -> Option<usize> {
        let mut at = 0;
        while at < log.len() {
            if BLOCK - at % BLOCK < HEADER {
                at += BLOCK - at % BLOCK;
                continue;
            }
            if log[at..].iter().all(|&b| b == 0) {
                return None;
            }
            at = match record_at(log, at) {
                Some(end) => end,
                None => return Some(at),
            };
        }
        None
    }

    /// Whether a whole record follows the damage at `bad`: a crash leaves
    /// a torn end, with nothing whole after it.
    pub fn whole_record_after(log: &[u8], bad: usize) -> bool {
        (bad + 1..log.len()).any(|at| record_at(log, at).is_some())
    }

    #[cfg(test)]
    fn damaged_within(log: &[u8]) -> bool {
        first_damage(log).is_some_and(|bad| whole_record_after(log, bad))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// A log of `payloads`, one whole record each.
        fn log_of(payloads: &[&[u8]]) -> Vec<u8> {
            let mut log = Vec::new();
            for p in payloads {
                log.extend_from_slice(&masked_crc(1, p).to_le_bytes());
                log.extend_from_slice(&(p.len() as u16).to_le_bytes());
                log.push(1);
                log.extend_from_slice(p);
            }
            log
        }

        #[test]
        fn a_whole_log_and_its_torn_ends() {
            let log = log_of(&[b"first record", b"second record", b"third record"]);
            assert_eq!(first_damage(&log), None);
            let mut padded = log.clone();
            padded.resize(log.len() + 4096, 0);
            assert_eq!(first_damage(&padded), None, "preallocated zeros");
            let cut = &log[..log.len() - 5];
            assert!(first_damage(cut).is_some() && !damaged_within(cut));
            let mut torn = log.clone();
            let n = torn.len();
            torn[n - 6..].fill(0);
            assert!(first_damage(&torn).is_some() && !damaged_within(&torn));
        }

        #[test]
        fn damage_before_whole_records_is_within() {
            let mut log = log_of(&[b"first record", b"second record", b"third record"]);
            log[10] ^= 1;
            assert_eq!(first_damage(&log), Some(0));
            assert!(damaged_within(&log));
        }
    }
}

fn object_key(bucket: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(bucket.len() + 1 + key.len());
    k.extend_from_slice(bucket.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// What a kept record costs: its key twice (in the cache and the record),
/// its strings and parts, and bookkeeping.
#[derive(Clone)]
struct RecordWeight;

impl quick_cache::Weighter<Vec<u8>, Arc<ObjectRecord>> for RecordWeight {
    fn weight(&self, id: &Vec<u8>, r: &Arc<ObjectRecord>) -> u64 {
        let strings: usize = r.metadata.iter().chain(&r.headers).map(|(n, v)| n.len() + v.len() + 48).sum();
        let parts = r.parts.len() * std::mem::size_of::<super::Part>();
        let body = r.body.as_ref().map_or(0, |b| b.len());
        (2 * id.len() + r.etag.len() + r.content_type.len() + parts + strings + body + 256) as u64
    }
}

/// The latest `unreferenced_since` of a blob dead for `grace` or longer.
fn unreferenced_before(grace: Duration) -> Millis {
    now_millis().saturating_sub(u64::try_from(grace.as_millis()).unwrap_or(u64::MAX))
}

fn dead_key(since: Millis, digest: &Digest) -> [u8; 40] {
    let mut k = [0u8; 40];
    k[..8].copy_from_slice(&since.to_be_bytes());
    k[8..].copy_from_slice(&digest.0);
    k
}

fn stats_bytes(s: &CatalogStats) -> [u8; 32] {
    let mut v = [0u8; 32];
    for (i, n) in [s.objects, s.logical_bytes, s.blobs, s.blob_bytes].into_iter().enumerate() {
        v[i * 8..i * 8 + 8].copy_from_slice(&n.to_le_bytes());
    }
    v
}

fn stats_from(v: &[u8]) -> [i64; 4] {
    let mut out = [0i64; 4];
    for (i, n) in out.iter_mut().enumerate() {
        if let Some(b) = v.get(i * 8..i * 8 + 8) {
            *n = i64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
    }
    out
}

/// Sums stats deltas, so writers never read-modify-write the totals.
fn merge_stats(_key: &[u8], existing: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    let mut total = existing.map(stats_from).unwrap_or_default();
    for op in operands {
        for (t, d) in total.iter_mut().zip(stats_from(op)) {
            *t += d;
        }
    }
    let s = CatalogStats { objects: total[0], logical_bytes: total[1], blobs: total[2], blob_bytes: total[3] };
    Some(stats_bytes(&s).to_vec())
}

/// The RocksDB catalog.
#[derive(Clone)]
pub struct RocksCatalog {
    inner: Arc<Inner>,
}

struct Inner {
    db: Arc<DB>,
    /// Makes transactions durable; dropped after `db`, it holds the database
    /// open until its last sync.
    group: GroupCommit,
    key_stripes: Box<[Mutex<()>]>,
    digest_stripes: Box<[Mutex<()>]>,
    hasher: std::collections::hash_map::RandomState,
    /// Object records read lately by single lookups, by their key in the
    /// `objects` family.
    records: quick_cache::sync::Cache<Vec<u8>, Arc<ObjectRecord>, RecordWeight>,
    /// Every bucket, as stored: they are few and change rarely, and every
    /// request asks after one. Object writes hold it shared; creating,
    /// changing or deleting a bucket holds it alone while it writes both
    /// the table and this copy, so no object lands in a bucket being
    /// deleted.
    buckets: RwLock<HashMap<String, BucketRecord>>,
}

/// The options of the catalog's records, for reads.
///
/// Most requests are point lookups of small records (an object record,
/// then its blob record), and a batch makes thousands. Read through
/// RocksDB's block cache, each lookup copied a block out of the page cache
/// with `pread`, checksummed and decompressed it, and inserted it into the
/// cache, evicting another: most of a 100,000-key batch's time.
/// Uncompressed tables read through a memory map are searched in place,
/// and the page cache is their only cache; a hash index in each block
/// finds the key without a binary search. (An I/O error under a map ends
/// the process rather than the request: see RELIABILITY.md.)
pub(crate) fn lookup_options() -> rocksdb::Options {
    let mut opts = crate::engine::rocks::base_options();
    opts.set_compression_type(rocksdb::DBCompressionType::None);
    opts.set_allow_mmap_reads(true);
    let mut table = crate::engine::rocks::table_options();
    table.set_data_block_index_type(rocksdb::DataBlockIndexType::BinaryAndHash);
    table.disable_cache();
    opts.set_block_based_table_factory(&table);
    opts
}

impl RocksCatalog {
    /// Opens (creating if needed) the catalog at `path`.
    pub fn open(path: &Path) -> Result<RocksCatalog> {
        let mut opts = lookup_options();
        // Every write is made durable by the group's sync (`transact`), so
        // the log is written there too, once per group, rather than by a
        // `write` call per transaction on the server's threads.
        opts.set_manual_wal_flush(true);
        let mut meta = crate::engine::rocks::base_options();
        meta.set_merge_operator_associative("stats", merge_stats);
        let cfs = || {
            vec![
                ColumnFamilyDescriptor::new("buckets", opts.clone()),
                ColumnFamilyDescriptor::new("objects", opts.clone()),
                ColumnFamilyDescriptor::new("blobs", opts.clone()),
                ColumnFamilyDescriptor::new("dead", opts.clone()),
                ColumnFamilyDescriptor::new("meta", meta.clone()),
            ]
        };
        let db = Arc::new(open_recovered(&opts, path, cfs)?);
        let mut buckets = HashMap::new();
        for item in db.iterator_cf(db.cf_handle("buckets").expect("created at open"), IteratorMode::Start) {
            let (k, v) = item.map_err(err)?;
            let name = String::from_utf8_lossy(&k).into_owned();
            buckets.insert(name.clone(), BucketRecord { name, ..decode(&v)? });
        }
        let group = GroupCommit::start(db.clone(), "catalog").map_err(err)?;
        Ok(RocksCatalog {
            inner: Arc::new(Inner {
                db,
                group,
                key_stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
                digest_stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
                hasher: Default::default(),
                records: quick_cache::sync::Cache::with_weighter(
                    (HOT_RECORDS / 400) as usize,
                    HOT_RECORDS,
                    RecordWeight,
                ),
                buckets: RwLock::new(buckets),
            }),
        })
    }

    async fn blocking<T: Send + 'static>(&self, f: impl FnOnce(&Inner) -> Result<T> + Send + 'static) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner)).await.map_err(err)?
    }

    /// Runs a few point reads on the calling thread: a lookup that hits
    /// RocksDB's caches takes microseconds, less than handing it to the
    /// blocking pool and back (two thread wake-ups). Bigger reads go to
    /// the pool.
    async fn point_reads<T: Send + 'static>(
        &self,
        reads: usize,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        if reads <= INLINE_WORK { f(&self.inner) } else { self.blocking(f).await }
    }

    /// Runs a transaction touching `records` records (on this thread when
    /// they are few, as for point reads), then waits until its unsynced
    /// write is durable. The wait is shared: one sync of the write-ahead log
    /// answers every transaction written before it (see `GroupCommit`), and
    /// no thread is parked per transaction meanwhile.
    async fn transact<T: Send + 'static>(
        &self,
        records: usize,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let out = self.point_reads(records, f).await?;
        self.inner.group.durable().await.map_err(CatalogError::SyncFailed)?;
        Ok(out)
    }
}

impl Inner {
    fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).expect("column families are created at open")
    }

    fn stripe_of(&self, item: impl Hash) -> usize {
        (self.hasher.hash_one(item) % STRIPES as u64) as usize
    }

    /// Locks stripes in index order. Transactions lock object keys first,
    /// then (once they know which blobs they touch) digests, so no two
    /// transactions ever wait on each other in a cycle.
    fn lock<'a, T: Hash>(&'a self, stripes: &'a [Mutex<()>], items: &[T]) -> Vec<MutexGuard<'a, ()>> {
        let mut idx: Vec<usize> = items.iter().map(|k| self.stripe_of(k)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| stripes[i].lock()).collect()
    }

    /// Writes a transaction's batch, unsynced: [`RocksCatalog::transact`]
    /// waits for the shared sync that makes it durable.
    fn commit(&self, batch: WriteBatch) -> Result<()> {
        self.db.write(batch).map_err(|e| CatalogError::SyncFailed(e.to_string()))
    }

    fn bucket_exists(&self, name: &str) -> bool {
        self.buckets.read().contains_key(name)
    }

    fn read_object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>> {
        let raw = self.db.get_pinned_cf(self.cf("objects"), object_key(bucket, key)).map_err(err)?;
        raw.map(|v| ObjectRecord::decode(&v, key.to_string())).transpose()
    }

    /// The record of bucket/key, from memory when it was read lately.
    ///
    /// A writer changes records holding their keys' stripes, and drops them
    /// from memory before it lets go (`Txn::commit`). A miss reads and keeps
    /// the record holding its key's stripe too, so it reads either before
    /// the write, and the writer then drops what it kept, or after, and
    /// keeps the new record: never an old record kept after the write.
    fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>> {
        if !self.bucket_exists(bucket) {
            return Err(CatalogError::NoSuchBucket(bucket.to_string()));
        }
        let id = object_key(bucket, key);
        if let Some(record) = self.records.get(&id) {
            return Ok(Some(ObjectRecord::clone(&record)));
        }
        let _stripe = self.key_stripes[self.stripe_of(&id)].lock();
        let found = self.read_object(bucket, key)?;
        if let Some(record) = &found {
            self.records.insert(id, Arc::new(record.clone()));
        }
        Ok(found)
    }

    fn read_blob(&self, digest: &Digest) -> Result<Option<BlobRecord>> {
        let raw = self.db.get_pinned_cf(self.cf("blobs"), digest.0).map_err(err)?;
        raw.map(|v| decode::<BlobRecord>(&v).map(|r| BlobRecord { digest: *digest, ..r })).transpose()
    }
}

/// Reads and changes made inside one transaction, applied as one batch.
struct Txn<'a> {
    inner: &'a Inner,
    now: Millis,
    objects: HashMap<(String, String), Option<ObjectRecord>>,
    blobs: HashMap<Digest, Option<BlobRecord>>,
    /// `unreferenced_since` of each blob as stored, to keep `dead` in step.
    dead_before: HashMap<Digest, Option<Millis>>,
    stats: CatalogStats,
}

impl<'a> Txn<'a> {
    fn new(inner: &'a Inner) -> Txn<'a> {
        Txn {
            inner,
            now: now_millis(),
            objects: HashMap::new(),
            blobs: HashMap::new(),
            dead_before: HashMap::new(),
            stats: CatalogStats::default(),
        }
    }

    fn object(&mut self, bucket: &str, key: &str) -> Result<Option<ObjectRecord>> {
        let id = (bucket.to_string(), key.to_string());
        if let Some(o) = self.objects.get(&id) {
            return Ok(o.clone());
        }
        let o = self.inner.read_object(bucket, key)?;
        self.objects.insert(id, o.clone());
        Ok(o)
    }

    fn blob(&mut self, digest: &Digest) -> Result<&mut Option<BlobRecord>> {
        if !self.blobs.contains_key(digest) {
            let b = self.inner.read_blob(digest)?;
            self.dead_before.insert(*digest, b.as_ref().and_then(|b| b.unreferenced_since));
            self.blobs.insert(*digest, b);
        }
        Ok(self.blobs.get_mut(digest).expect("just inserted"))
    }

    /// Adds a reference; returns whether the blob was already stored, and
    /// under which locator.
    fn add_ref(&mut self, stored: &BlobRef) -> Result<Option<BlobRef>> {
        let slot = self.blob(&stored.digest)?;
        match slot {
            Some(b) => {
                b.refs += 1;
                b.unreferenced_since = None;
                Ok(Some(b.blob_ref()))
            }
            None => {
                *slot = Some(BlobRecord {
                    digest: stored.digest,
                    size: stored.size,
                    locator: stored.locator.clone(),
                    refs: 1,
                    unreferenced_since: None,
                });
                self.stats.blobs += 1;
                self.stats.blob_bytes += stored.size as i64;
                Ok(None)
            }
        }
    }

    fn release(&mut self, digest: &Digest) -> Result<()> {
        let now = self.now;
        if let Some(b) = self.blob(digest)?.as_mut() {
            b.refs = b.refs.saturating_sub(1);
            if b.refs == 0 {
                b.unreferenced_since = Some(now);
            }
        }
        Ok(())
    }

    fn set_object(&mut self, bucket: &str, key: &str, record: Option<ObjectRecord>) -> Result<Option<ObjectRecord>> {
        let old = self.object(bucket, key)?;
        let counted = super::counted(bucket) as i64;
        if let Some(o) = &old {
            self.stats.objects -= counted;
            self.stats.logical_bytes -= counted * o.size as i64;
            for p in &o.parts {
                self.release(&p.digest)?;
            }
        }
        if let Some(r) = &record {
            self.stats.objects += counted;
            self.stats.logical_bytes += counted * r.size as i64;
        }
        self.objects.insert((bucket.to_string(), key.to_string()), record);
        Ok(old)
    }

    /// Turns the overlay into one batch, diffing blob records against what
    /// is stored so the dead-blob index follows every change.
    fn commit(self) -> Result<()> {
        let inner = self.inner;
        let mut batch = WriteBatch::default();
        let mut changed = Vec::with_capacity(self.objects.len());
        for ((bucket, key), record) in &self.objects {
            let k = object_key(bucket, key);
            match record {
                Some(r) => batch.put_cf(inner.cf("objects"), &k, r.encode()),
                None => batch.delete_cf(inner.cf("objects"), &k),
            }
            changed.push(k);
        }
        for (digest, record) in &self.blobs {
            if let Some(since) = self.dead_before[digest] {
                batch.delete_cf(inner.cf("dead"), dead_key(since, digest));
            }
            match record {
                Some(r) => {
                    if let Some(since) = r.unreferenced_since {
                        batch.put_cf(inner.cf("dead"), dead_key(since, digest), b"");
                    }
                    batch.put_cf(inner.cf("blobs"), digest.0, encode(r));
                }
                None => batch.delete_cf(inner.cf("blobs"), digest.0),
            }
        }
        if self.stats != CatalogStats::default() {
            batch.merge_cf(inner.cf("meta"), STATS_KEY, stats_bytes(&self.stats));
        }
        let written = inner.commit(batch);
        // The keys' stripes are still held: see `Inner::object`.
        for k in &changed {
            inner.records.remove(k);
        }
        written
    }
}

#[async_trait]
impl Catalog for RocksCatalog {
    async fn create_bucket(&self, bucket: &BucketRecord) -> Result<()> {
        let record = bucket.clone();
        self.transact(usize::MAX, move |inner| {
            let mut buckets = inner.buckets.write();
            if buckets.contains_key(&record.name) {
                return Err(CatalogError::BucketExists(record.name));
            }
            let mut batch = WriteBatch::default();
            batch.put_cf(inner.cf("buckets"), &record.name, encode(&record));
            inner.commit(batch)?;
            buckets.insert(record.name.clone(), record);
            Ok(())
        })
        .await
    }

    async fn set_bucket_public(&self, name: &str, public_read: bool) -> Result<()> {
        let name = name.to_string();
        self.transact(usize::MAX, move |inner| {
            let mut buckets = inner.buckets.write();
            let Some(current) = buckets.get(&name) else {
                return Err(CatalogError::NoSuchBucket(name));
            };
            let record = BucketRecord { public_read, ..current.clone() };
            let mut batch = WriteBatch::default();
            batch.put_cf(inner.cf("buckets"), &name, encode(&record));
            inner.commit(batch)?;
            buckets.insert(name, record);
            Ok(())
        })
        .await
    }

    async fn delete_bucket(&self, name: &str) -> Result<()> {
        let name = name.to_string();
        self.transact(usize::MAX, move |inner| {
            let mut buckets = inner.buckets.write();
            if !buckets.contains_key(&name) {
                return Err(CatalogError::NoSuchBucket(name));
            }
            let prefix = object_key(&name, "");
            let mut it = inner.db.iterator_cf(inner.cf("objects"), IteratorMode::From(&prefix, Direction::Forward));
            if let Some(item) = it.next() {
                let (k, _) = item.map_err(err)?;
                if k.starts_with(&prefix) {
                    return Err(CatalogError::BucketNotEmpty(name));
                }
            }
            let mut batch = WriteBatch::default();
            batch.delete_cf(inner.cf("buckets"), &name);
            inner.commit(batch)?;
            buckets.remove(&name);
            Ok(())
        })
        .await
    }

    async fn bucket(&self, name: &str) -> Result<Option<BucketRecord>> {
        Ok(self.inner.buckets.read().get(name).cloned())
    }

    async fn buckets(&self) -> Result<Vec<BucketRecord>> {
        let mut out: Vec<BucketRecord> = self.inner.buckets.read().values().cloned().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn get_objects(&self, bucket: &str, keys: &[String]) -> Result<Vec<Option<ObjectRecord>>> {
        if let [key] = keys {
            return Ok(vec![self.inner.object(bucket, key)?]);
        }
        let bucket = bucket.to_string();
        let keys = keys.to_vec();
        self.point_reads(keys.len(), move |inner| {
            if !inner.bucket_exists(&bucket) {
                return Err(CatalogError::NoSuchBucket(bucket));
            }
            let cf = inner.cf("objects");
            let wanted: Vec<Vec<u8>> = keys.iter().map(|k| object_key(&bucket, k)).collect();
            let raw = inner.db.batched_multi_get_cf(cf, &wanted, false);
            raw.into_iter()
                .zip(keys)
                .map(|(r, key)| match r.map_err(err)? {
                    Some(v) => Ok(Some(ObjectRecord::decode(&v, key)?)),
                    None => Ok(None),
                })
                .collect()
        })
        .await
    }

    async fn put_objects(&self, puts: Vec<ObjectPut>) -> Result<Vec<PutOutcome>> {
        self.transact(puts.len(), move |inner| {
            let buckets = inner.buckets.read();
            let keys: Vec<_> = puts.iter().map(|p| object_key(&p.bucket, &p.record.key)).collect();
            let _keys = inner.lock(&inner.key_stripes, &keys);
            let mut txn = Txn::new(inner);
            // The records being replaced release their blobs too.
            let mut digests: Vec<Digest> = puts.iter().flat_map(|p| p.record.parts.iter().map(|x| x.digest)).collect();
            for p in &puts {
                if let Some(old) = txn.object(&p.bucket, &p.record.key)? {
                    digests.extend(old.parts.iter().map(|x| x.digest));
                }
            }
            let _digests = inner.lock(&inner.digest_stripes, &digests);
            let mut outcomes = Vec::with_capacity(puts.len());
            for put in puts {
                if !buckets.contains_key(&put.bucket) {
                    return Err(CatalogError::NoSuchBucket(put.bucket));
                }
                let current = txn.object(&put.bucket, &put.record.key)?;
                if !put.precondition.check(current.as_ref()) {
                    return Err(CatalogError::PreconditionFailed);
                }
                let mut deduplicated = true;
                let mut redundant = Vec::new();
                for part in &put.record.parts {
                    let stored = put
                        .blobs
                        .iter()
                        .find(|b| b.digest == part.digest)
                        .cloned()
                        .ok_or_else(|| CatalogError::Internal(format!("no blob given for part {}", part.digest)))?;
                    match txn.add_ref(&stored)? {
                        None => deduplicated = false,
                        Some(existing) if existing.locator != stored.locator => {
                            if !redundant.contains(&stored) {
                                redundant.push(stored);
                            }
                        }
                        Some(_) => {}
                    }
                }
                let (bucket, key) = (put.bucket.clone(), put.record.key.clone());
                let replaced = txn.set_object(&bucket, &key, Some(put.record))?;
                outcomes.push(PutOutcome { replaced, deduplicated, redundant });
            }
            txn.commit()?;
            Ok(outcomes)
        })
        .await
    }

    async fn delete_objects(
        &self,
        bucket: &str,
        keys: &[String],
        precondition: &Precondition,
    ) -> Result<Vec<Option<ObjectRecord>>> {
        let bucket = bucket.to_string();
        let keys = keys.to_vec();
        let precondition = precondition.clone();
        self.transact(keys.len(), move |inner| {
            let buckets = inner.buckets.read();
            if !buckets.contains_key(&bucket) {
                return Err(CatalogError::NoSuchBucket(bucket));
            }
            let object_keys: Vec<_> = keys.iter().map(|k| object_key(&bucket, k)).collect();
            let _keys = inner.lock(&inner.key_stripes, &object_keys);
            let mut txn = Txn::new(inner);
            let mut digests = Vec::new();
            for k in &keys {
                if let Some(old) = txn.object(&bucket, k)? {
                    digests.extend(old.parts.iter().map(|x| x.digest));
                }
            }
            let _digests = inner.lock(&inner.digest_stripes, &digests);
            let mut out = Vec::with_capacity(keys.len());
            for key in &keys {
                let current = txn.object(&bucket, key)?;
                if current.is_some() && !precondition.check(current.as_ref()) {
                    return Err(CatalogError::PreconditionFailed);
                }
                out.push(if current.is_some() { txn.set_object(&bucket, key, None)? } else { None });
            }
            txn.commit()?;
            Ok(out)
        })
        .await
    }

    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        let bucket = bucket.to_string();
        let query = query.clone();
        self.blocking(move |inner| {
            if !inner.bucket_exists(&bucket) {
                return Err(CatalogError::NoSuchBucket(bucket));
            }
            list_page(inner, &bucket, &query)
        })
        .await
    }

    async fn get_blobs(&self, digests: &[Digest]) -> Result<Vec<Option<BlobRecord>>> {
        let digests = digests.to_vec();
        self.point_reads(digests.len(), move |inner| {
            let raw = inner.db.batched_multi_get_cf(inner.cf("blobs"), digests.iter().map(|d| &d.0), false);
            raw.into_iter()
                .zip(digests)
                .map(|(r, digest)| match r.map_err(err)? {
                    Some(v) => Ok(Some(BlobRecord { digest, ..decode(&v)? })),
                    None => Ok(None),
                })
                .collect()
        })
        .await
    }

    async fn dead_blobs(&self, grace: Duration, limit: usize) -> Result<Vec<BlobRecord>> {
        let before = unreferenced_before(grace);
        self.blocking(move |inner| {
            let mut out = Vec::new();
            for item in inner.db.iterator_cf(inner.cf("dead"), IteratorMode::Start) {
                let (k, _) = item.map_err(err)?;
                let since = u64::from_be_bytes(k[..8].try_into().map_err(err)?);
                if since > before || out.len() >= limit {
                    break;
                }
                let digest = Digest(k[8..].try_into().map_err(err)?);
                if let Some(b) = inner.read_blob(&digest)? {
                    out.push(b);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn remove_dead_blob(&self, digest: &Digest, grace: Option<Duration>) -> Result<bool> {
        let (digest, before) = (*digest, grace.map_or(Millis::MAX, unreferenced_before));
        self.transact(usize::MAX, move |inner| {
            let _lock = inner.lock(&inner.digest_stripes, &[digest]);
            let Some(b) = inner.read_blob(&digest)? else {
                return Ok(false);
            };
            match b.unreferenced_since {
                Some(since) if b.refs == 0 && since <= before => {
                    let mut batch = WriteBatch::default();
                    batch.delete_cf(inner.cf("blobs"), digest.0);
                    batch.delete_cf(inner.cf("dead"), dead_key(since, &digest));
                    let delta = CatalogStats { blobs: -1, blob_bytes: -(b.size as i64), ..Default::default() };
                    batch.merge_cf(inner.cf("meta"), STATS_KEY, stats_bytes(&delta));
                    inner.commit(batch)?;
                    Ok(true)
                }
                _ => Ok(false),
            }
        })
        .await
    }

    async fn list_blobs(&self, after: Option<Digest>, limit: usize) -> Result<Vec<BlobRecord>> {
        self.blocking(move |inner| {
            let mode = match &after {
                Some(d) => IteratorMode::From(&d.0, rocksdb::Direction::Forward),
                None => IteratorMode::Start,
            };
            let mut out = Vec::new();
            for item in inner.db.iterator_cf(inner.cf("blobs"), mode) {
                let (k, v) = item.map_err(err)?;
                let digest = Digest(k[..].try_into().map_err(err)?);
                if Some(digest) == after {
                    continue;
                }
                if out.len() >= limit {
                    break;
                }
                out.push(BlobRecord { digest, ..decode(&v)? });
            }
            Ok(out)
        })
        .await
    }

    async fn set_locators(&self, moved: &[(Digest, Locator)]) -> Result<()> {
        let moved = moved.to_vec();
        self.transact(usize::MAX, move |inner| {
            let digests: Vec<Digest> = moved.iter().map(|(d, _)| *d).collect();
            let _lock = inner.lock(&inner.digest_stripes, &digests);
            let mut batch = WriteBatch::default();
            for (digest, locator) in moved {
                if let Some(b) = inner.read_blob(&digest)? {
                    batch.put_cf(inner.cf("blobs"), digest.0, encode(&BlobRecord { locator, ..b }));
                }
            }
            inner.commit(batch)
        })
        .await
    }

    async fn set_refs(&self, counted: &[(Digest, u64)]) -> Result<()> {
        let counted = counted.to_vec();
        self.transact(usize::MAX, move |inner| {
            let digests: Vec<Digest> = counted.iter().map(|(d, _)| *d).collect();
            let _lock = inner.lock(&inner.digest_stripes, &digests);
            let mut txn = Txn::new(inner);
            let now = txn.now;
            for (digest, refs) in counted {
                if let Some(b) = txn.blob(&digest)?.as_mut() {
                    b.refs = refs;
                    b.unreferenced_since = if refs == 0 { b.unreferenced_since.or(Some(now)) } else { None };
                }
            }
            txn.commit()
        })
        .await
    }

    async fn set_stats(&self, stats: CatalogStats) -> Result<()> {
        self.transact(usize::MAX, move |inner| {
            let mut batch = WriteBatch::default();
            batch.put_cf(inner.cf("meta"), STATS_KEY, stats_bytes(&stats));
            inner.commit(batch)
        })
        .await
    }

    fn checkpoints(&self) -> bool {
        true
    }

    async fn checkpoint(&self, dir: &Path) -> Result<()> {
        let dir = dir.to_path_buf();
        self.blocking(move |inner| {
            let checkpoint = rocksdb::checkpoint::Checkpoint::new(&inner.db).map_err(err)?;
            checkpoint.create_checkpoint(&dir).map_err(err)
        })
        .await
    }

    async fn stats(&self) -> Result<CatalogStats> {
        self.blocking(|inner| {
            let v = inner.db.get_cf(inner.cf("meta"), STATS_KEY).map_err(err)?.unwrap_or_default();
            let [objects, logical_bytes, blobs, blob_bytes] = stats_from(&v);
            Ok(CatalogStats { objects, logical_bytes, blobs, blob_bytes })
        })
        .await
    }
}

/// Puts write-ahead logs in the order they were written: by number, as
/// past 999999 their names grow a digit.
fn oldest_first(logs: &mut [std::path::PathBuf]) {
    logs.sort_by_key(|p| p.file_stem().and_then(|n| n.to_str()).and_then(|n| n.parse::<u64>().ok()));
}

/// The smallest string greater than every string starting with `prefix`
/// (for a prefix ending in an ASCII delimiter: bump the last byte).
fn past_prefix(prefix: &[u8]) -> Vec<u8> {
    let mut p = prefix.to_vec();
    while let Some(last) = p.pop() {
        if last < 0xFF {
            p.push(last + 1);
            return p;
        }
    }
    vec![0xFF; prefix.len() + 1]
}

fn list_page(inner: &Inner, bucket: &str, query: &ListQuery) -> Result<ListPage> {
    let base = object_key(bucket, "");
    let full_prefix = object_key(bucket, &query.prefix);
    let mut seek = full_prefix.clone();
    if let Some(after) = &query.after {
        let a = object_key(bucket, after);
        let from = if query.after_is_common_prefix() {
            past_prefix(&a)
        } else {
            let mut a = a;
            a.push(0); // the first key after `after`
            a
        };
        if from > seek {
            seek = from;
        }
    }
    let limit = query.limit.max(1);
    let mut page = ListPage::default();
    let cf = inner.cf("objects");
    let mut it = inner.db.raw_iterator_cf(cf);
    it.seek(&seek);
    while it.valid() {
        let k = it.key().expect("valid iterator has a key");
        if !k.starts_with(&full_prefix) {
            break;
        }
        if page.objects.len() + page.prefixes.len() >= limit {
            // Something remains: say where to continue.
            page.next =
                page.objects.last().map(|o| o.key.clone()).into_iter().chain(page.prefixes.last().cloned()).max();
            return Ok(page);
        }
        let key = std::str::from_utf8(&k[base.len()..]).map_err(err)?.to_string();
        if let Some(common) = query.common_prefix(&key).map(str::to_string) {
            it.seek(past_prefix(&object_key(bucket, &common)));
            page.prefixes.push(common);
            continue;
        }
        page.objects.push(ObjectRecord::decode(it.value().expect("valid iterator has a value"), key)?);
        it.next();
    }
    it.status().map_err(err)?;
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_are_ordered_by_number() {
        let mut logs: Vec<std::path::PathBuf> =
            ["/c/1000002.log", "/c/999999.log", "/c/000012.log"].iter().map(Into::into).collect();
        oldest_first(&mut logs);
        assert_eq!(logs, ["/c/000012.log", "/c/999999.log", "/c/1000002.log"].map(std::path::PathBuf::from));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        super::super::conformance::run_all(&RocksCatalog::open(dir.path()).unwrap()).await;
    }

    /// Blob records stored before their locator was written as bytes (a
    /// call per byte) have the same encoding: both read either.
    #[test]
    fn blob_records_keep_their_encoding() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct ByteByByte {
            size: u64,
            locator: Vec<u8>,
            refs: u64,
            unreferenced_since: Option<Millis>,
        }
        let locator: Vec<u8> = (0..=255).chain(0..=255).collect();
        let old = ByteByByte { size: 512, locator: locator.clone(), refs: 3, unreferenced_since: Some(7) };
        let new = BlobRecord { digest: Digest([0; 32]), size: 512, locator, refs: 3, unreferenced_since: Some(7) };
        let old_bytes = postcard::to_stdvec(&old).unwrap();
        assert_eq!(encode(&new), old_bytes);
        assert_eq!(decode::<BlobRecord>(&old_bytes).unwrap(), new);
        assert_eq!(postcard::from_bytes::<ByteByByte>(&encode(&new)).unwrap(), old);
    }

    /// A catalog holding buckets `names`, closed; the path of its log.
    async fn closed_with_buckets(dir: &Path, names: &[&str]) -> std::path::PathBuf {
        let c = RocksCatalog::open(dir).unwrap();
        for name in names {
            c.create_bucket(&BucketRecord::new(name, "", false)).await.unwrap();
        }
        drop(c);
        let logs: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log") && std::fs::metadata(p).unwrap().len() > 0)
            .collect();
        assert_eq!(logs.len(), 1, "{logs:?}");
        logs[0].clone()
    }

    async fn bucket_names(c: &RocksCatalog) -> Vec<String> {
        c.buckets().await.unwrap().into_iter().map(|b| b.name).collect()
    }

    /// A record damaged in the middle of the log would, recovered to the
    /// point before it, take every later record with it, unseen.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_log_damaged_within_is_refused_whole() {
        let dir = tempfile::tempdir().unwrap();
        let log = closed_with_buckets(dir.path(), &["first-of-three", "second", "third"]).await;
        let mut bytes = std::fs::read(&log).unwrap();
        let at = bytes.windows(14).position(|w| w == b"first-of-three").expect("the record is in the log");
        bytes[at] ^= 0x20;
        std::fs::write(&log, bytes).unwrap();
        let e = RocksCatalog::open(dir.path()).err().expect("a damaged catalog is refused");
        assert!(e.to_string().contains("is damaged") && e.to_string().contains("depot backup"), "{e}");
        // Refused, it is left as it was: a second start says the same.
        assert!(RocksCatalog::open(dir.path()).is_err());
    }

    /// A crash in the middle of a write leaves its record cut short, or
    /// torn (whole in length, not in content), at the log's end: the
    /// catalog opens without it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_last_record_cut_short_or_torn_is_passed_over() {
        for torn in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let log = closed_with_buckets(dir.path(), &["first", "second", "last-of-three"]).await;
            let mut bytes = std::fs::read(&log).unwrap();
            let at = bytes.windows(13).position(|w| w == b"last-of-three").expect("the record is in the log");
            if torn {
                bytes[at..].fill(0);
            } else {
                bytes.truncate(at + 4);
            }
            std::fs::write(&log, &bytes).unwrap();
            let c = RocksCatalog::open(dir.path()).unwrap();
            assert_eq!(bucket_names(&c).await, ["first", "second"], "torn: {torn}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn records_and_totals_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        {
            let c = RocksCatalog::open(dir.path()).unwrap();
            super::super::conformance::objects_and_references(&c).await;
        }
        let c = RocksCatalog::open(dir.path()).unwrap();
        let stats = c.stats().await.unwrap();
        // Three blobs: the last, of a record in the store's own bucket,
        // unreferenced now and left to the collector.
        assert_eq!((stats.objects, stats.blobs), (2, 3));
        use super::super::CatalogExt;
        assert!(c.get_object("refs", "a").await.unwrap().is_some());
    }

    /// A record read by a single lookup is kept, and every write or delete
    /// answered before a lookup is what the lookup sees, though readers keep
    /// refilling the record meanwhile.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_kept_record_never_outlives_its_replacement() {
        use super::super::CatalogExt;
        use super::super::conformance::{blob, bucket, put};
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let c = RocksCatalog::open(dir.path()).unwrap();
        c.create_bucket(&bucket("hot")).await.unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (c, stop) = (c.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        c.get_object("hot", "k").await.unwrap();
                        reads += 1;
                        tokio::task::yield_now().await;
                    }
                    reads
                })
            })
            .collect();
        let kept = |c: &RocksCatalog| c.inner.records.contains_key(&object_key("hot", "k"));
        for i in 1..=600u64 {
            c.put_object(put("hot", "k", &[blob(i as u8, i)])).await.unwrap();
            assert_eq!(c.get_object("hot", "k").await.unwrap().map(|r| r.size), Some(i), "write {i}");
            assert!(kept(&c), "a record just read is kept");
            if i % 100 == 0 {
                c.delete_object("hot", "k", &Default::default()).await.unwrap();
                assert_eq!(c.get_object("hot", "k").await.unwrap(), None, "delete after write {i}");
            }
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.await.unwrap() > 0);
        }
        // Batches and missing keys read the tables and keep nothing.
        assert!(!kept(&c));
        c.get_objects("hot", &["k".into(), "other".into()]).await.unwrap();
        assert!(!kept(&c));
        assert!(matches!(c.get_object("nope", "k").await, Err(CatalogError::NoSuchBucket(_))));
    }

    /// Records flushed to the tables are read back through their memory map,
    /// one by one and in batches, and the buckets as they were last written.
    #[tokio::test(flavor = "multi_thread")]
    async fn records_read_back_from_the_tables_after_reopening() {
        use super::super::CatalogExt;
        use super::super::conformance::{blob, bucket, digest, put};
        let dir = tempfile::tempdir().unwrap();
        let keys: Vec<String> = (0..3000).map(|i| format!("key/{i:05}")).collect();
        let content = |i: usize| blob((i % 251) as u8, i as u64 + 1);
        {
            let c = RocksCatalog::open(dir.path()).unwrap();
            for name in ["kept", "gone"] {
                c.create_bucket(&bucket(name)).await.unwrap();
            }
            c.set_bucket_public("kept", true).await.unwrap();
            c.delete_bucket("gone").await.unwrap();
            let puts = keys.iter().enumerate().map(|(i, k)| put("kept", k, &[content(i)])).collect();
            c.put_objects(puts).await.unwrap();
            for cf in ["buckets", "objects", "blobs"] {
                c.inner.db.flush_cf(c.inner.cf(cf)).unwrap();
            }
        }
        let c = RocksCatalog::open(dir.path()).unwrap();
        let names: Vec<(String, bool)> =
            c.buckets().await.unwrap().into_iter().map(|b| (b.name, b.public_read)).collect();
        assert_eq!(names, [("kept".to_string(), true)]);
        assert!(matches!(c.create_bucket(&bucket("kept")).await, Err(CatalogError::BucketExists(_))));
        assert!(matches!(c.get_objects("gone", &keys[..1]).await, Err(CatalogError::NoSuchBucket(_))));
        let mut asked = keys.clone();
        asked.insert(1500, "key/missing".into());
        let found = c.get_objects("kept", &asked).await.unwrap();
        assert!(found[1500].is_none());
        for (i, record) in found.into_iter().flatten().enumerate() {
            assert_eq!((record.key.as_str(), record.parts[0].digest), (keys[i].as_str(), content(i).digest));
        }
        let blobs = c.get_blobs(&[digest(0), digest(250)]).await.unwrap();
        // Content n is shared by keys n, n + 251, ...: 12 of them for 0, 11 for 250.
        assert_eq!(blobs.iter().map(|b| b.as_ref().unwrap().refs).collect::<Vec<_>>(), [12, 11]);
        assert_eq!(c.get_object("kept", "key/02999").await.unwrap().unwrap().size, 3000);
    }

    #[test]
    fn past_prefix_is_the_next_string() {
        assert_eq!(past_prefix(b"a/"), b"a0");
        assert_eq!(past_prefix(b"a\xff"), b"b");
    }
}
