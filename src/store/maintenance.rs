//! Whole-store maintenance: verifying (and repairing) every record and
//! every blob, and consistent backups taken while the store serves.
//!
//! Both hold the store's maintenance lock, which the collector takes too: a
//! backup copies the blobs a catalog checkpoint points at, and the collector
//! must not delete one of them in between.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use futures::TryStreamExt;
use indicatif::ProgressBar;
use sha2::Digest as _;

use super::{Result, Store, StoreError};
use crate::catalog::rocks::RocksCatalog;
use crate::catalog::{BlobRecord, Catalog, CatalogExt, CatalogStats, ListQuery, ObjectRecord};
use crate::engine::{
    self, BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, Digest, DynEngine, EngineError, Locator,
};

/// Records read per catalog call while scanning.
const PAGE: usize = 1000;
/// The file a backup holds its directory by while it writes there, made
/// with `O_EXCL` before the directory is seen empty and removed at the end.
pub(crate) const BACKUP_CLAIM: &str = ".depot-backup-in-progress";

/// Something wrong with a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// An object refers to a blob the catalog has no record of.
    DanglingPart { bucket: String, key: String, digest: Digest },
    /// An object's parts do not add up to its size, or a part's size is
    /// not its blob's.
    WrongSize { bucket: String, key: String },
    /// A one-part object whose SHA-256 is not its blob's.
    WrongDigest { bucket: String, key: String },
    /// An object record's copy of its body (see
    /// [`ObjectRecord::body`](crate::catalog::ObjectRecord::body)) is not
    /// its blob's content, or not the whole of its one part; reads go to
    /// the blob instead. Uploading the object again replaces it.
    WrongBody { bucket: String, key: String },
    /// A blob's bytes are gone from the engine.
    MissingBytes { digest: Digest },
    /// A blob's bytes no longer hash to its digest (or have another length).
    CorruptBytes { digest: Digest, actual: Digest, size: u64 },
    /// A blob's bytes cannot be read whole (cut short, chunks missing).
    DamagedBytes { digest: Digest, reason: String },
    /// More of a blob's bytes are stored than were written, though the
    /// first of them, which every read takes, are its content whole. Not
    /// removed: they are still what the blob's objects are read from.
    LongerBytes { digest: Digest, stored: u64 },
    /// The engine holds bytes of a blob objects refer to where its record
    /// does not point (or it has no record), and the record's own bytes
    /// are not whole. Kept, not removed as a leftover: they may be the only
    /// copy of the content left.
    StrayBytes { digest: Digest },
    /// A blob's reference count is not the number of parts referring to it.
    WrongRefs { digest: Digest, recorded: u64, counted: u64 },
    /// The running totals disagree with what the scan counted.
    WrongTotals { recorded: CatalogStats, counted: CatalogStats },
    /// The engine could not list its blobs, so bytes no record points at
    /// were not looked for.
    Unlisted { reason: String },
}

impl Problem {
    /// Whether `--repair` fixes it. Lost or damaged bytes cannot be
    /// recreated: those objects need their data uploaded again (`--repair`
    /// removes damaged bytes, so that the upload stores them afresh).
    pub fn repairable(&self) -> bool {
        matches!(self, Problem::WrongRefs { .. } | Problem::WrongTotals { .. })
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::DanglingPart { bucket, key, digest } => {
                write!(f, "{bucket}/{key}: refers to blob {digest}, which the catalog does not have")
            }
            Problem::WrongSize { bucket, key } => write!(f, "{bucket}/{key}: its parts' sizes do not add up"),
            Problem::WrongDigest { bucket, key } => write!(f, "{bucket}/{key}: its SHA-256 is not its blob's"),
            Problem::WrongBody { bucket, key } => {
                write!(f, "{bucket}/{key}: its record's copy of the body is not its blob's content")
            }
            Problem::MissingBytes { digest } => write!(f, "blob {digest}: its bytes are missing from the engine"),
            Problem::CorruptBytes { digest, actual, size } => {
                write!(f, "blob {digest}: its bytes hash to {actual} ({size} bytes)")
            }
            Problem::DamagedBytes { digest, reason } => write!(f, "blob {digest}: {reason}"),
            Problem::LongerBytes { digest, stored } => {
                write!(f, "blob {digest}: {stored} bytes stored, more than were written (the content is whole; kept)")
            }
            Problem::StrayBytes { digest } => write!(
                f,
                "blob {digest}: objects refer to it, and the engine holds bytes of it its record does not point \
                 at (kept: they may be the content's only copy; where the content has a record, `--repair` points \
                 it at them if they are whole)"
            ),
            Problem::WrongRefs { digest, recorded, counted } => {
                write!(f, "blob {digest}: {recorded} references recorded, {counted} counted")
            }
            Problem::WrongTotals { recorded, counted } => {
                write!(f, "totals: recorded {recorded:?}, counted {counted:?}")
            }
            Problem::Unlisted { reason } => {
                write!(f, "the engine's blobs could not be listed, so leftovers were not looked for: {reason}")
            }
        }
    }
}

/// What `verify` saw and did.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    pub objects: u64,
    pub blobs: u64,
    /// Bytes read back and hashed.
    pub bytes_read: u64,
    pub problems: Vec<Problem>,
    /// Problems fixed (with `repair`).
    pub repaired: u64,
    /// Bytes in the engine that no record points at: left by writes that
    /// a crash interrupted before their record, and wasting space only.
    /// The collector removes them after the grace period; `repair` now.
    pub leftovers: Vec<BlobInfo>,
    /// Leftovers and unreferenced blobs `repair` removed.
    pub removed: u64,
    /// Blobs whose damaged bytes `repair` removed from the engine: an
    /// engine that keeps the first copy of a content would otherwise keep
    /// them through every upload of that content. Their objects still need
    /// uploading again, unless their records were relinked.
    pub cleared: u64,
    /// Blobs whose records `repair` pointed at whole bytes of theirs found
    /// elsewhere in the engine, in place of lost or damaged ones.
    pub relinked: u64,
    /// Objects whose bytes are lost or damaged, and parts of uploads in
    /// progress: they need uploading again.
    pub damaged_objects: Vec<DamagedObject>,
}

/// An object, or a part of a multipart upload in progress, that refers to
/// lost or damaged bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedObject {
    pub bucket: String,
    pub key: String,
    /// The upload and part number, for a part of an upload in progress.
    pub part: Option<(String, u32)>,
}

impl fmt::Display for DamagedObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((upload_id, part)) = &self.part {
            write!(f, "part {part} of the multipart upload {upload_id} of ")?;
        }
        write!(f, "{}/{}", self.bucket, self.key)
    }
}

impl VerifyReport {
    /// Problems still there after the run.
    pub fn unresolved(&self) -> usize {
        self.problems.len() - self.repaired as usize
    }
}

/// Every object of every bucket, a page at a time; hidden buckets too
/// (pending multipart parts hold references like any object).
struct ObjectPages<'a> {
    catalog: &'a dyn Catalog,
    buckets: std::vec::IntoIter<String>,
    current: Option<(String, ListQuery)>,
}

impl<'a> ObjectPages<'a> {
    async fn new(catalog: &'a dyn Catalog) -> Result<ObjectPages<'a>> {
        let buckets: Vec<String> = catalog.buckets().await?.into_iter().map(|b| b.name).collect();
        Ok(ObjectPages { catalog, buckets: buckets.into_iter(), current: None })
    }

    /// The next page and its bucket; `None` after the last.
    async fn next(&mut self) -> Result<Option<(String, Vec<ObjectRecord>)>> {
        loop {
            let (bucket, query) = match self.current.take() {
                Some(current) => current,
                None => match self.buckets.next() {
                    Some(bucket) => (bucket, ListQuery { limit: PAGE, ..ListQuery::default() }),
                    None => return Ok(None),
                },
            };
            let page = self.catalog.list_objects(&bucket, &query).await?;
            if let Some(next) = page.next {
                self.current = Some((bucket.clone(), ListQuery { after: Some(next), ..query }));
            }
            if !page.objects.is_empty() {
                return Ok(Some((bucket, page.objects)));
            }
        }
    }
}

/// What a verification pass found that a repair acts on.
#[derive(Default)]
struct Scan {
    /// Blobs whose recorded count is wrong, with the counted one.
    wrong_refs: Vec<(Digest, u64)>,
    /// Blob records nothing refers to.
    unreferenced: Vec<BlobRecord>,
    /// Blobs whose bytes are there but damaged.
    damaged: Vec<BlobRef>,
    /// Bytes of contents objects refer to, where their records do not
    /// point (or that have no record), while the records' own are lost or
    /// damaged.
    strays: Vec<BlobInfo>,
}

/// What a backup copied.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct BackupReport {
    pub objects: i64,
    pub blobs: u64,
    pub bytes: u64,
}

/// Streams a blob through SHA-256 into `sink`, if given; returns the digest
/// and length of what the engine gave back.
async fn stream_blob(
    engine: &dyn BlobEngine,
    blob: &BlobRef,
    mut sink: Option<&mut Box<dyn BlobWriter>>,
    progress: &ProgressBar,
) -> engine::Result<(Digest, u64)> {
    let mut reader = engine.read(blob, ByteRange::full(blob.size)).await?;
    let mut hasher = sha2::Sha256::new();
    let mut size = 0u64;
    while let Some(chunk) = reader.try_next().await? {
        hasher.update(&chunk);
        size += chunk.len() as u64;
        progress.inc(chunk.len() as u64);
        if let Some(sink) = sink.as_mut() {
            sink.write(chunk).await?;
        }
    }
    Ok((Digest(hasher.finalize().into()), size))
}

/// Whether `engine` holds `blob`'s recorded bytes: read whole, they are
/// its size and hash to its digest.
pub(crate) async fn holds_blob(
    engine: &dyn BlobEngine,
    blob: &BlobRef,
    progress: &ProgressBar,
) -> engine::Result<bool> {
    let (actual, size) = stream_blob(engine, blob, None, progress).await?;
    Ok(actual == blob.digest && size == blob.size)
}

/// Copies one blob from `source` to `target`, checking that what was read
/// is the recorded content; returns where `target` put it.
pub(crate) async fn copy_blob(
    source: &dyn BlobEngine,
    target: &DynEngine,
    blob: &BlobRef,
    progress: &ProgressBar,
) -> engine::Result<Locator> {
    let mut writer = target.writer(Some(blob.size)).await?;
    let (actual, size) = match stream_blob(source, blob, Some(&mut writer), progress).await {
        Ok(read) => read,
        Err(e) => {
            writer.abort().await;
            return Err(e);
        }
    };
    if actual != blob.digest || size != blob.size {
        writer.abort().await;
        return Err(EngineError::other(
            source.name(),
            format!("blob {}: read back {size} bytes hashing to {actual}, not the recorded content", blob.digest),
        ));
    }
    Ok(writer.finish(blob.digest).await?.locator)
}

impl Store {
    /// Checks every object's references, every blob's bytes and reference
    /// count, the engine for bytes no record points at, and the totals.
    /// With `repair`, sets wrong counts and totals to what was counted and
    /// removes orphaned bytes and unreferenced blobs. Run it on a store no
    /// server is writing to: concurrent writes look like wrong counts.
    pub async fn verify(&self, repair: bool, progress: &ProgressBar) -> Result<VerifyReport> {
        let _maintenance = self.maintenance.lock().await;
        let mut report = VerifyReport::default();
        let mut counted_totals = CatalogStats::default();
        let refs = self.count_references(&mut report, &mut counted_totals).await?;

        // By a hash of the locator: a locator may carry a small blob's bytes.
        let mut known: HashMap<Digest, u64> = HashMap::new();
        // Blobs whose recorded bytes were read whole: another copy of one
        // is a leftover even when objects refer to it.
        let mut whole: HashSet<Digest> = HashSet::new();
        let mut scan = Scan::default();
        let mut after = None;
        loop {
            let page = self.catalog.list_blobs(after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.digest);
            for blob in page {
                report.blobs += 1;
                let counted = refs.get(&blob.digest).copied().unwrap_or(0);
                if counted != blob.refs {
                    report.problems.push(Problem::WrongRefs { digest: blob.digest, recorded: blob.refs, counted });
                    scan.wrong_refs.push((blob.digest, counted));
                }
                if counted == 0 {
                    scan.unreferenced.push(blob.clone());
                }
                match stream_blob(self.engine.as_ref(), &blob.blob_ref(), None, progress).await {
                    Ok((actual, size)) => {
                        report.bytes_read += size;
                        if actual != blob.digest || size != blob.size {
                            report.problems.push(Problem::CorruptBytes { digest: blob.digest, actual, size });
                            scan.damaged.push(blob.blob_ref());
                        } else {
                            whole.insert(blob.digest);
                            if let Some(stored) = self
                                .engine
                                .stat(&blob.blob_ref())
                                .await
                                .map_err(|e| naming_blob("reading", &blob.digest, e))?
                                && stored != blob.size
                            {
                                report.problems.push(Problem::LongerBytes { digest: blob.digest, stored });
                            }
                        }
                    }
                    Err(EngineError::NotFound(_)) => {
                        report.problems.push(Problem::MissingBytes { digest: blob.digest })
                    }
                    Err(e @ EngineError::Damaged { .. }) => {
                        report.problems.push(Problem::DamagedBytes { digest: blob.digest, reason: e.to_string() });
                        scan.damaged.push(blob.blob_ref());
                    }
                    // Trouble of the engine as a whole (a failing disk, a
                    // server gone) says nothing about this blob: the scan
                    // stops, rather than calling every blob after it lost.
                    Err(e) => return Err(naming_blob("reading", &blob.digest, e)),
                }
                counted_totals.blobs += 1;
                counted_totals.blob_bytes += blob.size as i64;
                known.insert(blob.digest, hash_of(&blob.locator));
            }
        }

        // Listing reads what the per-blob pass may have found damaged (a
        // damaged RocksDB blob file holds heads too): the report of that
        // pass, and the repair of what it found, go on without it.
        match self.engine.list().await {
            Ok(listed) => {
                for info in listed.into_iter().filter(|info| known.get(&info.digest) != Some(&hash_of(&info.locator))) {
                    if refs.get(&info.digest).is_some_and(|n| *n > 0) && !whole.contains(&info.digest) {
                        report.problems.push(Problem::StrayBytes { digest: info.digest });
                        scan.strays.push(info);
                    } else {
                        report.leftovers.push(info);
                    }
                }
            }
            Err(e) => report.problems.push(Problem::Unlisted { reason: e.to_string() }),
        }

        let recorded = self.catalog.stats().await?;
        if recorded != counted_totals {
            report.problems.push(Problem::WrongTotals { recorded, counted: counted_totals });
        }

        let relinked = match repair {
            true => self.repair(&mut report, counted_totals, scan).await?,
            false => HashSet::new(),
        };
        let damaged: HashSet<Digest> = report
            .problems
            .iter()
            .filter_map(|p| match p {
                Problem::MissingBytes { digest }
                | Problem::CorruptBytes { digest, .. }
                | Problem::DamagedBytes { digest, .. } => Some(*digest),
                _ => None,
            })
            .filter(|digest| !relinked.contains(digest))
            .collect();
        if !damaged.is_empty() {
            report.damaged_objects = self.objects_using(&damaged).await?;
        }
        Ok(report)
    }

    /// Walks every object, checking each against its blob records; returns
    /// how many parts refer to each blob.
    async fn count_references(
        &self,
        report: &mut VerifyReport,
        totals: &mut CatalogStats,
    ) -> Result<HashMap<Digest, u64>> {
        let mut refs: HashMap<Digest, u64> = HashMap::new();
        let mut pages = ObjectPages::new(self.catalog.as_ref()).await?;
        while let Some((bucket, objects)) = pages.next().await? {
            let mut digests: Vec<Digest> = objects.iter().flat_map(|o| o.parts.iter().map(|p| p.digest)).collect();
            digests.sort_unstable();
            digests.dedup();
            let blobs: HashMap<Digest, BlobRecord> =
                self.catalog.get_blobs(&digests).await?.into_iter().flatten().map(|b| (b.digest, b)).collect();
            let counted = crate::catalog::counted(&bucket);
            for object in objects {
                if counted {
                    report.objects += 1;
                    totals.objects += 1;
                    totals.logical_bytes += object.size as i64;
                }
                let wrong_body = object.body.is_some()
                    && (object.kept_body())
                        .is_none_or(|b| <[u8; 32]>::from(sha2::Sha256::digest(b)) != object.parts[0].digest.0);
                let (bucket, key) = (bucket.clone(), object.key);
                let mut sizes_agree = object.parts.iter().map(|p| p.size).sum::<u64>() == object.size;
                for part in &object.parts {
                    *refs.entry(part.digest).or_default() += 1;
                    match blobs.get(&part.digest) {
                        Some(blob) => sizes_agree &= blob.size == part.size,
                        None => report.problems.push(Problem::DanglingPart {
                            bucket: bucket.clone(),
                            key: key.clone(),
                            digest: part.digest,
                        }),
                    }
                }
                if !sizes_agree {
                    report.problems.push(Problem::WrongSize { bucket: bucket.clone(), key: key.clone() });
                }
                if wrong_body {
                    report.problems.push(Problem::WrongBody { bucket: bucket.clone(), key: key.clone() });
                }
                if let [only] = object.parts.as_slice()
                    && only.digest != object.sha256
                {
                    report.problems.push(Problem::WrongDigest { bucket, key });
                }
            }
        }
        Ok(refs)
    }

    /// The objects, and the parts of uploads in progress, with a part in
    /// `damaged`.
    async fn objects_using(&self, damaged: &HashSet<Digest>) -> Result<Vec<DamagedObject>> {
        let mut found = Vec::new();
        let mut parts = Vec::new();
        let mut pages = ObjectPages::new(self.catalog.as_ref()).await?;
        while let Some((bucket, objects)) = pages.next().await? {
            for o in objects.into_iter().filter(|o| o.parts.iter().any(|p| damaged.contains(&p.digest))) {
                match bucket.as_str() {
                    super::multipart::UPLOADS => parts.push(o.key),
                    _ => found.push(DamagedObject { bucket: bucket.clone(), key: o.key, part: None }),
                }
            }
        }
        if !parts.is_empty() {
            found.extend(self.upload_parts_named(&parts).await?);
        }
        Ok(found)
    }

    /// Fixes what can be fixed, and says in `report` how many problems
    /// that was and how many blobs went. `counted` are the totals the scan
    /// found. Returns the blobs whose records now point at whole bytes
    /// found elsewhere in the engine.
    async fn repair(&self, report: &mut VerifyReport, counted: CatalogStats, scan: Scan) -> Result<HashSet<Digest>> {
        for batch in scan.wrong_refs.chunks(PAGE) {
            self.catalog.set_refs(batch).await?;
        }
        for leftover in &report.leftovers {
            self.engine.delete(&leftover.blob_ref()).await?;
        }
        let mut totals = counted;
        let mut removed = HashSet::new();
        for blob in &scan.unreferenced {
            // Verification runs on a store nobody writes to: the grace
            // period protects writers that are not there. A shared
            // catalog may still hold a claim a node that crashed left on
            // the content: then the blob stays, and stays counted.
            if self.collect_dead(blob, None).await? {
                totals.blobs -= 1;
                totals.blob_bytes -= blob.size as i64;
                removed.insert(blob.digest);
            }
        }
        self.catalog.set_stats(totals).await?;
        // Lost bytes of a blob nothing refers to went with its record.
        let dropped = |d: &Digest| removed.contains(d);
        // Another copy of a content whose record points at lost or damaged
        // bytes is its whole copy when it reads back as the content: the
        // record is pointed there. (Copies of one content differ only in
        // where an engine keeps them, the hybrid engine's tiers, and the
        // removal of the damaged one below goes to its own place.)
        let mut relinked = HashSet::new();
        for stray in scan.strays.iter().filter(|s| !dropped(&s.digest)) {
            if relinked.contains(&stray.digest) {
                continue;
            }
            let Some(record) = self.catalog.get_blob(&stray.digest).await? else { continue };
            if stray.size != record.size {
                continue;
            }
            let found = BlobRef { digest: stray.digest, size: record.size, locator: stray.locator.clone() };
            let whole = match holds_blob(self.engine.as_ref(), &found, &ProgressBar::hidden()).await {
                Ok(whole) => whole,
                Err(EngineError::NotFound(_) | EngineError::Damaged { .. }) => false,
                // Trouble of the engine as a whole says nothing of these bytes.
                Err(e) => return Err(naming_blob("reading another copy of", &stray.digest, e)),
            };
            if whole {
                self.catalog.set_locators(&[(stray.digest, stray.locator.clone())]).await?;
                relinked.insert(stray.digest);
            }
        }
        report.relinked = relinked.len() as u64;
        // Damaged bytes of a blob still referred to cannot be mended, only
        // removed: then the next upload of the content stores it afresh,
        // where engines that keep the first copy of a content (sqlite,
        // postgres, gridfs, s3) would keep the damaged one.
        for blob in scan.damaged.iter().filter(|b| !dropped(&b.digest)) {
            self.engine
                .delete(blob)
                .await
                .map_err(|e| naming_blob("removing the damaged bytes of", &blob.digest, e))?;
            report.cleared += 1;
        }
        let fixed = report.problems.iter().filter(|p| match p {
            Problem::MissingBytes { digest }
            | Problem::CorruptBytes { digest, .. }
            | Problem::DamagedBytes { digest, .. } => dropped(digest) || relinked.contains(digest),
            Problem::StrayBytes { digest } => relinked.contains(digest),
            p => p.repairable(),
        });
        report.repaired = fixed.count() as u64;
        report.removed = (report.leftovers.len() + removed.len()) as u64;
        Ok(relinked)
    }

    /// Writes a copy of the store into `dir` (which must not exist, or be
    /// empty) that `depot serve --data DIR` opens: a checkpoint of the
    /// catalog, then every blob it points at copied into a new engine of
    /// the same kind. Writers go on meanwhile; what they write after the
    /// checkpoint is not in the copy. Only stores with the embedded
    /// catalog and an embedded engine can be copied this way. A backup
    /// that fails removes what it wrote, and `dir` if it made it, so that
    /// it can be tried again on the same directory.
    pub async fn backup(&self, dir: &Path, progress: &ProgressBar) -> Result<BackupReport> {
        let Some((kind, config)) = self.config.engine.clone() else {
            return Err(StoreError::Internal("this store does not know how its engine was opened".into()));
        };
        if !kind.is_embedded() {
            return Err(StoreError::InvalidArgument(format!(
                "the {} engine keeps its bytes in its own server: back that up with its own tools",
                kind.name()
            )));
        }
        if !self.catalog.checkpoints() {
            return Err(StoreError::InvalidArgument(
                "the catalog lives in its own server (PostgreSQL): back it up with its own tools, and the bytes \
                 with a copy of the engine's directory taken meanwhile"
                    .into(),
            ));
        }
        let created = match std::fs::create_dir(dir) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            // The directory is the caller's choice: what is wrong with it
            // is theirs to fix (400), not the server's failure.
            Err(e) => return Err(StoreError::InvalidArgument(format!("creating {}: {e}", dir.display()))),
        };
        // The claim is taken before the directory is seen empty, so that of
        // two backups into one directory only one writes there; the other
        // used to wait for the first and then remove its finished copy.
        let refuse = |why: String| {
            if created {
                let _ = std::fs::remove_dir(dir);
            }
            Err(StoreError::InvalidArgument(why))
        };
        match std::fs::OpenOptions::new().write(true).create_new(true).open(dir.join(BACKUP_CLAIM)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                return refuse(format!(
                    "{} is taken by another backup, or holds one that did not finish: remove the directory",
                    dir.display()
                ));
            }
            Err(e) => return refuse(format!("writing into {}: {e}", dir.display())),
        }
        let mut claim = DirClaim { dir, created, copying: false };
        let used =
            std::fs::read_dir(dir).map(|entries| entries.flatten().any(|entry| entry.file_name() != BACKUP_CLAIM));
        match used {
            Ok(false) => {}
            Ok(true) => return Err(StoreError::InvalidArgument(format!("{} is not empty", dir.display()))),
            Err(e) => return Err(StoreError::InvalidArgument(format!("reading {}: {e}", dir.display()))),
        }
        // A copy inside the data directory would share its fate, and a
        // migration removes engine directories whole. Compared once both
        // exist, with links and `..` resolved.
        if let Some(data) = self.data_dir()
            && let (Ok(at), Ok(data)) = (std::fs::canonicalize(dir), std::fs::canonicalize(data))
            && at.starts_with(&data)
        {
            return Err(StoreError::InvalidArgument(format!(
                "{} is inside the data directory {}: a backup goes elsewhere",
                dir.display(),
                data.display()
            )));
        }

        let _maintenance = self.maintenance.lock().await;
        claim.copying = true;
        let out = match self.copy_into(dir, kind, &config, progress).await {
            Ok(report) => Ok(report),
            Err(e) => Err(self.backup_failed(dir, kind, e).await),
        };
        claim.copying = false;
        out
    }

    /// The work of [`Store::backup`], into `dir`, which exists and is
    /// empty (the caller holds the maintenance lock).
    async fn copy_into(
        &self,
        dir: &Path,
        kind: engine::EngineKind,
        config: &engine::EngineConfig,
        progress: &ProgressBar,
    ) -> Result<BackupReport> {
        self.catalog.checkpoint(&dir.join("catalog")).await?;
        let at = dir.join("catalog");
        let opened = tokio::task::spawn_blocking(move || RocksCatalog::open(&at)).await;
        let copy: Arc<dyn Catalog> = Arc::new(opened.map_err(|e| StoreError::Internal(e.to_string()))??);
        let target = engine::open(kind, &dir.join(kind.name()), config).await?;
        let totals = copy.stats().await?;
        let mut report = BackupReport { objects: totals.objects, ..BackupReport::default() };
        progress.set_length(totals.blob_bytes.max(0) as u64);
        let mut after = None;
        loop {
            let page = copy.list_blobs(after, PAGE).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.digest);
            let mut moved = Vec::new();
            for blob in page {
                match copy_blob(self.engine.as_ref(), &target, &blob.blob_ref(), progress).await {
                    Ok(locator) => {
                        if locator != blob.locator {
                            moved.push((blob.digest, locator));
                        }
                        report.blobs += 1;
                        report.bytes += blob.size;
                    }
                    // Only the collector deletes recorded bytes, and it
                    // is held off; a blob nothing refers to may already
                    // have gone before the checkpoint.
                    Err(EngineError::NotFound(_)) if blob.refs == 0 => {
                        if copy.remove_dead_blob(&blob.digest, None).await? {
                            copy.end_delete(&blob.digest).await?;
                        }
                    }
                    Err(e) => return Err(naming_blob("copying", &blob.digest, e)),
                }
            }
            copy.set_locators(&moved).await?;
        }
        engine::write_engine_marker(dir, &engine::marker(kind, config)).map_err(|e| {
            if e.raw_os_error() == Some(28) || e.kind() == std::io::ErrorKind::StorageFull {
                StoreError::NoSpace
            } else {
                StoreError::Internal(format!("writing the engine marker: {e}"))
            }
        })?;
        Ok(report)
    }

    /// Removes what a failed backup wrote into `dir` (its [`DirClaim`] then
    /// removes `dir` itself when the backup made it), and says why it
    /// failed. Only the entries a backup writes are removed, by name: `dir`
    /// was empty when the backup began, but whatever else is there now is
    /// not the backup's to delete.
    async fn backup_failed(&self, dir: &Path, kind: engine::EngineKind, e: StoreError) -> StoreError {
        // A full disk is checked before the partial copy goes and frees it.
        // Only the copy writes anything: the engine's `NoSpace` is the
        // target's (reading the store takes no space), and a RocksDB error
        // names the file it failed on, the copy's or the store's (a
        // checkpoint flushes the store's catalog first).
        let full = match &e {
            StoreError::NoSpace => true,
            StoreError::Internal(m) => m.contains("No space left on device") && m.contains(&*dir.to_string_lossy()),
            _ => false,
        };
        // Millions of files, maybe: off the thread that serves requests.
        let paths = ["catalog", kind.name(), engine::ENGINE_MARKER].map(|name| dir.join(name));
        let left = tokio::task::spawn_blocking(move || {
            let mut left = Vec::new();
            for path in paths {
                let removed = match std::fs::symlink_metadata(&path) {
                    Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(&path),
                    Ok(_) => std::fs::remove_file(&path),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(e),
                };
                if let Err(e) = removed {
                    left.push(format!("{}: {e}", path.display()));
                }
            }
            left
        })
        .await
        .unwrap_or_else(|e| vec![format!("removing what it wrote stopped: {e}")]);
        let cleanup = if left.is_empty() {
            "; what it wrote was removed".to_string()
        } else {
            format!("; removing what it wrote failed ({}): remove it before trying again", left.join("; "))
        };
        if full {
            let needs = match self.catalog.stats().await {
                Ok(totals) => {
                    format!(" (the store's blobs take {})", indicatif::HumanBytes(totals.blob_bytes.max(0) as u64))
                }
                Err(_) => String::new(),
            };
            return StoreError::LowSpace(format!(
                "no space left on the device of the backup directory {}, not the store's{needs}: \
                 the backup stopped{cleanup}; free space there or back up elsewhere",
                dir.display()
            ));
        }
        match e {
            // A failed sync is the copy's: the store's writes go on.
            StoreError::Internal(m) | StoreError::WritesDisabled(m) => {
                StoreError::Internal(format!("the backup into {} failed: {m}{cleanup}", dir.display()))
            }
            e => e,
        }
    }
}

/// A backup's hold on its directory (the [`BACKUP_CLAIM`] file in it).
/// Dropped, it removes the file, and the directory when the backup made it
/// and left it empty; but not when dropped in the middle of the copy (a
/// server stopping), so that what it wrote is not taken for a backup nor
/// its directory for an empty one.
struct DirClaim<'a> {
    dir: &'a Path,
    created: bool,
    copying: bool,
}

impl Drop for DirClaim<'_> {
    fn drop(&mut self) {
        if self.copying {
            return;
        }
        let claim = self.dir.join(BACKUP_CLAIM);
        if let Err(e) = std::fs::remove_file(&claim) {
            tracing::warn!("could not remove {}: {e}", claim.display());
        }
        if self.created {
            let _ = std::fs::remove_dir(self.dir);
        }
    }
}

/// An engine error that stops a whole-store pass, naming the blob it was
/// `doing` (reading, removing…) when the message would not say.
fn naming_blob(doing: &str, digest: &Digest, e: EngineError) -> StoreError {
    match StoreError::from(e) {
        StoreError::Internal(m) => StoreError::Internal(format!("{doing} blob {digest}: {m}")),
        e => e,
    }
}

fn hash_of(locator: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    BuildHasherDefault::<DefaultHasher>::default().hash_one(locator)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{CatalogExt, ObjectPut};
    use crate::engine::memory::MemoryEngine;
    use crate::engine::{BlobEngineExt, EngineConfig, EngineKind};
    use crate::store::tests::{body, read_all, store_over};
    use crate::store::{PutOptions, StoreConfig};

    async fn put(store: &Store, key: &str, bytes: &'static [u8]) -> Digest {
        store.put("files", key, body(bytes), PutOptions::default()).await.unwrap().record.sha256
    }

    fn hidden() -> ProgressBar {
        ProgressBar::hidden()
    }

    #[tokio::test]
    async fn a_healthy_store_verifies_clean() {
        let (store, _dir) = store_over(Arc::new(MemoryEngine::new())).await;
        put(&store, "a", b"alpha").await;
        put(&store, "b", b"alpha").await;
        put(&store, "c", b"gamma").await;
        let report = store.verify(false, &hidden()).await.unwrap();
        assert_eq!(report.problems, vec![]);
        assert_eq!((report.objects, report.blobs, report.bytes_read), (3, 2, 10));
    }

    #[tokio::test]
    async fn repair_sets_counts_and_totals_and_drops_orphans() {
        let engine: DynEngine = Arc::new(MemoryEngine::new());
        let (store, _dir) = store_over(engine.clone()).await;
        let shared = put(&store, "a", b"alpha").await;
        put(&store, "b", b"alpha").await;
        let dropped = put(&store, "c", b"gamma").await;
        store.delete("files", "c", &Default::default()).await.unwrap();
        store.catalog.set_refs(&[(shared, 5)]).await.unwrap();
        store.catalog.set_stats(CatalogStats { objects: 40, ..Default::default() }).await.unwrap();
        let orphan = engine.put_bytes(bytes::Bytes::from_static(b"nobody's")).await.unwrap();

        let report = store.verify(false, &hidden()).await.unwrap();
        assert!(report.problems.contains(&Problem::WrongRefs { digest: shared, recorded: 5, counted: 2 }));
        assert!(report.problems.iter().any(|p| matches!(p, Problem::WrongTotals { .. })));
        assert_eq!(report.unresolved(), 2, "{:?}", report.problems);
        let leftovers: Vec<_> = report.leftovers.iter().map(|b| (b.digest, b.size)).collect();
        assert_eq!(leftovers, [(orphan.digest, 8)], "bytes no record points at are leftovers, not damage");

        let repaired = store.verify(true, &hidden()).await.unwrap();
        assert_eq!((repaired.repaired, repaired.unresolved(), repaired.removed), (2, 0, 2));
        let after = store.verify(false, &hidden()).await.unwrap();
        assert_eq!((after.problems, after.leftovers.len()), (vec![], 0));
        assert_eq!(store.catalog.get_blob(&shared).await.unwrap().unwrap().refs, 2);
        // The unreferenced blob went with the orphan; the objects stayed.
        assert!(store.catalog.get_blob(&dropped).await.unwrap().is_none());
        assert_eq!(engine.list().await.unwrap().len(), 1);
        assert_eq!(read_all(&store, "files", "b").await, b"alpha");
        let totals = store.stats().await.unwrap();
        assert_eq!((totals.objects, totals.logical_bytes, totals.blobs, totals.blob_bytes), (2, 10, 1, 5));
    }

    /// A record's copy of its body that is not its blob's content is
    /// reported; uploading the object again mends it.
    #[tokio::test]
    async fn a_record_whose_copy_of_its_body_is_wrong_is_reported() {
        let (store, _dir) = store_over(Arc::new(MemoryEngine::new())).await;
        // Bytes of the right length but another content, and a copy that
        // is not the whole body, which reads leave aside.
        for (key, copy) in [("a", &b"omega"[..]), ("b", b"alp")] {
            let stored = store.put("files", key, body(b"alpha"), PutOptions::default()).await.unwrap().record;
            assert_eq!(stored.body.as_deref(), Some(&b"alpha"[..]));
            let blob = store.catalog.get_blob(&stored.sha256).await.unwrap().unwrap().blob_ref();
            let wrong = ObjectRecord { body: Some(bytes::Bytes::from_static(copy)), ..stored };
            let planted = ObjectPut {
                bucket: "files".into(),
                record: wrong,
                blobs: vec![blob],
                precondition: Default::default(),
            };
            store.catalog.put_objects(vec![planted]).await.unwrap();
        }
        assert_eq!(read_all(&store, "files", "b").await, b"alpha");

        let report = store.verify(true, &hidden()).await.unwrap();
        let wrong = |key: &str| Problem::WrongBody { bucket: "files".into(), key: key.into() };
        assert_eq!(report.problems, vec![wrong("a"), wrong("b")]);
        assert_eq!(report.unresolved(), 2);
        put(&store, "a", b"alpha").await;
        put(&store, "b", b"alpha").await;
        assert_eq!(store.verify(false, &hidden()).await.unwrap().problems, vec![]);
        assert_eq!(read_all(&store, "files", "a").await, b"alpha");
    }

    /// Bytes objects refer to, whose record is gone, are not a leftover:
    /// repair keeps them, as the only copy of the content.
    #[tokio::test]
    async fn bytes_objects_need_are_kept_when_their_record_is_lost() {
        let engine: DynEngine = Arc::new(MemoryEngine::new());
        let (store, _dir) = store_over(engine.clone()).await;
        let digest = put(&store, "a", b"alpha").await;
        store.catalog.set_refs(&[(digest, 0)]).await.unwrap();
        assert!(store.catalog.remove_dead_blob(&digest, None).await.unwrap());
        store.catalog.end_delete(&digest).await.unwrap();

        let report = store.verify(true, &hidden()).await.unwrap();
        assert!(report.problems.contains(&Problem::StrayBytes { digest }), "{:?}", report.problems);
        assert_eq!((report.leftovers.len(), report.removed), (0, 0));
        assert_eq!(engine.list().await.unwrap().len(), 1, "the bytes are still there");
    }

    #[tokio::test]
    async fn lost_bytes_are_reported_and_not_repairable() {
        let engine: DynEngine = Arc::new(MemoryEngine::new());
        let (store, _dir) = store_over(engine.clone()).await;
        let lost = put(&store, "a", b"alpha").await;
        put(&store, "b", b"beta").await;
        let blob = store.catalog.get_blob(&lost).await.unwrap().unwrap();
        engine.delete(&blob.blob_ref()).await.unwrap();
        let report = store.verify(true, &hidden()).await.unwrap();
        assert_eq!(report.problems, vec![Problem::MissingBytes { digest: lost }]);
        assert_eq!(report.unresolved(), 1);
        assert_eq!(report.damaged_objects, vec![damaged("a", None)]);
        // The record stays: the object's bytes may yet be restored.
        assert!(store.head("files", "a").await.is_ok());
    }

    /// An engine that cannot list its blobs costs the search for leftovers,
    /// not the report: the damage found blob by blob is still named, and
    /// repaired.
    #[tokio::test]
    async fn an_engine_that_cannot_list_keeps_the_report() {
        use crate::engine::faulty::{FaultyEngine, Trigger};
        let faulty = Arc::new(FaultyEngine::new(Arc::new(MemoryEngine::new()), 0));
        let (store, _dir) = store_over(faulty.clone()).await;
        let lost = put(&store, "a", b"alpha").await;
        put(&store, "b", b"beta").await;
        let blob = store.catalog.get_blob(&lost).await.unwrap().unwrap();
        faulty.delete(&blob.blob_ref()).await.unwrap();
        faulty.faults.lists.set(Trigger::Always);
        let report = store.verify(true, &hidden()).await.unwrap();
        assert_eq!(report.problems.len(), 2, "{:?}", report.problems);
        assert_eq!(report.problems[0], Problem::MissingBytes { digest: lost });
        assert!(matches!(&report.problems[1], Problem::Unlisted { reason } if reason.contains("injected")));
        assert_eq!(report.damaged_objects, vec![damaged("a", None)]);
    }

    fn damaged(key: &str, part: Option<(&str, u32)>) -> DamagedObject {
        DamagedObject { bucket: "files".into(), key: key.into(), part: part.map(|(id, n)| (id.to_string(), n)) }
    }

    #[tokio::test]
    async fn lost_parts_of_uploads_in_progress_are_named_by_their_upload() {
        let engine: DynEngine = Arc::new(MemoryEngine::new());
        let (store, _dir) = store_over(engine.clone()).await;
        let id = store.create_upload("files", "movie", Default::default()).await.unwrap();
        let part = |n, bytes| store.upload_part("files", "movie", &id, n, body(bytes), PutOptions::default());
        part(1, b"first part").await.unwrap();
        let lost = part(2, b"second part").await.unwrap().sha256;
        put(&store, "copy", b"second part").await;
        engine.delete(&store.catalog.get_blob(&lost).await.unwrap().unwrap().blob_ref()).await.unwrap();

        let report = store.verify(false, &hidden()).await.unwrap();
        assert_eq!(report.damaged_objects, vec![damaged("copy", None), damaged("movie", Some((&id, 2)))]);
        assert_eq!(
            report.damaged_objects[1].to_string(),
            format!("part 2 of the multipart upload {id} of files/movie")
        );
    }

    /// The fs engine puts an upload's bytes in place of damaged ones: a
    /// read that kept the damaged ones in memory before does not outlive it.
    #[tokio::test]
    async fn an_upload_replaces_damaged_bytes_kept_in_memory() {
        // Too long for its record to keep a copy: reads come from the file.
        const BYTES: &[u8] = &[b'a'; 100];
        let damaged = [&BYTES[1..], b"A"].concat();
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = fs_store(dir.path()).await;
        put(&store, "a", BYTES).await;
        fn files_holding(dir: &Path, bytes: &[u8], found: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    files_holding(&path, bytes, found);
                } else if std::fs::read(&path).is_ok_and(|b| b == bytes) {
                    found.push(path);
                }
            }
        }
        let mut found = Vec::new();
        files_holding(&dir.path().join("fs"), BYTES, &mut found);
        let [file] = found.as_slice() else { panic!("one file holds the blob: {found:?}") };
        std::fs::write(file, &damaged).unwrap();
        assert_eq!(read_all(&store, "files", "a").await, damaged, "a GET does not hash what it serves");
        put(&store, "a", BYTES).await;
        assert_eq!(read_all(&store, "files", "a").await, BYTES);
    }

    #[tokio::test]
    async fn repair_removes_damaged_bytes_so_that_an_upload_replaces_them() {
        // An engine that keeps the first copy of a content.
        let dir = tempfile::tempdir().unwrap();
        let engine = engine::open(EngineKind::Sqlite, dir.path(), &EngineConfig::default()).await.unwrap();
        let (store, _catalog) = store_over(engine).await;
        let digest = put(&store, "a", b"alpha").await;
        let db = rusqlite::Connection::open(dir.path().join("blobs.sqlite")).unwrap();
        assert_eq!(db.execute("UPDATE chunks SET data = ?1", [b"alphA".to_vec()]).unwrap(), 1);

        let found = store.verify(false, &hidden()).await.unwrap();
        assert!(matches!(found.problems.as_slice(), [Problem::CorruptBytes { digest: d, .. }] if *d == digest));
        // Uploading the content again keeps the damaged copy...
        put(&store, "a", b"alpha").await;
        assert_eq!(store.verify(false, &hidden()).await.unwrap().problems.len(), 1);
        // ...until the repair removes it: the objects still need uploading.
        let repaired = store.verify(true, &hidden()).await.unwrap();
        assert_eq!((repaired.cleared, repaired.unresolved()), (1, 1));
        assert_eq!(repaired.damaged_objects, vec![damaged("a", None)]);
        let after = store.verify(false, &hidden()).await.unwrap();
        assert_eq!(after.problems, vec![Problem::MissingBytes { digest }]);
        put(&store, "a", b"alpha").await;
        assert_eq!(store.verify(false, &hidden()).await.unwrap().problems, vec![]);
        assert_eq!(read_all(&store, "files", "a").await, b"alpha");
    }

    /// A record pointing where its content's bytes are not, while they are
    /// whole elsewhere in the engine: repair points the record at them.
    /// Bytes that do not hash right are left alone, and their object
    /// reported.
    #[tokio::test]
    async fn repair_points_a_record_at_its_whole_bytes_found_elsewhere() {
        let dir = tempfile::tempdir().unwrap();
        let store = hybrid_store(dir.path(), 16).await;
        // Over the threshold, and a page, so kept as files.
        let (whole, spoilt): (&'static [u8], &'static [u8]) = (vec![7u8; 5000].leak(), vec![9u8; 5000].leak());
        let (a, b) = (put(&store, "a", whole).await, put(&store, "b", spoilt).await);
        let mut bytes = std::fs::read(hybrid_file(dir.path(), &b)).unwrap();
        bytes[100] ^= 1;
        std::fs::write(hybrid_file(dir.path(), &b), bytes).unwrap();
        // Both records point into the RocksDB tier, which has neither.
        store.catalog.set_locators(&[(a, b"r".to_vec()), (b, b"r".to_vec())]).await.unwrap();

        let found = store.verify(false, &hidden()).await.unwrap();
        for d in [a, b] {
            assert!(found.problems.contains(&Problem::MissingBytes { digest: d }), "{:?}", found.problems);
            assert!(found.problems.contains(&Problem::StrayBytes { digest: d }), "{:?}", found.problems);
        }
        assert_eq!(found.damaged_objects, vec![damaged("a", None), damaged("b", None)]);

        let repaired = store.verify(true, &hidden()).await.unwrap();
        assert_eq!((repaired.relinked, repaired.repaired, repaired.unresolved()), (1, 2, 2));
        assert_eq!(repaired.damaged_objects, vec![damaged("b", None)], "a is whole again");
        assert_eq!(read_all(&store, "files", "a").await, whole);
        let after = store.verify(false, &hidden()).await.unwrap();
        assert_eq!(after.problems, vec![Problem::MissingBytes { digest: b }, Problem::StrayBytes { digest: b }]);
    }

    /// The record points at damaged bytes, and a whole copy is elsewhere:
    /// repair points the record at the whole copy, then removes the
    /// damaged one, which is in another place and leaves the copy alone.
    #[tokio::test]
    async fn repair_relinks_past_damaged_bytes_and_removes_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = hybrid_store(dir.path(), 256 * 1024).await;
        // Under the threshold and over a page: kept in the RocksDB tier.
        let content: &'static [u8] = vec![5u8; 5000].leak();
        let digest = put(&store, "a", content).await;
        // A damaged copy in the file tier, where the record now points.
        let file = hybrid_file(dir.path(), &digest);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, [&content[1..], b"x"].concat()).unwrap();
        store.catalog.set_locators(&[(digest, b"f".to_vec())]).await.unwrap();

        let repaired = store.verify(true, &hidden()).await.unwrap();
        assert!(matches!(repaired.problems[0], Problem::CorruptBytes { .. }), "{:?}", repaired.problems);
        assert!(repaired.problems.contains(&Problem::StrayBytes { digest }), "{:?}", repaired.problems);
        assert_eq!((repaired.relinked, repaired.cleared, repaired.unresolved()), (1, 1, 0));
        assert!(repaired.damaged_objects.is_empty(), "{:?}", repaired.damaged_objects);
        assert!(!file.exists(), "the damaged copy is still there");
        assert_eq!(read_all(&store, "files", "a").await, content);
        assert_eq!(store.verify(false, &hidden()).await.unwrap().problems, vec![]);
    }

    #[tokio::test]
    async fn a_backup_is_a_store_as_of_its_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let store = hybrid_store(dir.path(), 16).await;
        put(&store, "small", b"tiny").await;
        put(&store, "large", b"more than sixteen bytes, kept as a file").await;
        put(&store, "gone", b"deleted before the backup").await;
        store.delete("files", "gone", &Default::default()).await.unwrap();

        let target = dir.path().join("backup");
        let report = store.backup(&target, &hidden()).await.unwrap();
        assert_eq!((report.objects, report.blobs), (2, 3));
        put(&store, "later", b"written after the backup").await;
        let refused = store.backup(&target, &hidden()).await;
        assert!(matches!(refused, Err(StoreError::InvalidArgument(m)) if m.contains("not empty")));

        let copy = hybrid_store(&target, 16).await;
        assert_eq!(read_all(&copy, "files", "small").await, b"tiny");
        assert_eq!(read_all(&copy, "files", "large").await, b"more than sixteen bytes, kept as a file");
        assert!(matches!(copy.head("files", "later").await, Err(StoreError::NoSuchKey(_))));
        assert_eq!(copy.verify(false, &hidden()).await.unwrap().problems, vec![]);
        assert_eq!(std::fs::read_to_string(target.join(engine::ENGINE_MARKER)).unwrap(), "hybrid\n");
    }

    /// A store over the hybrid engine in `dir`, blobs over `threshold`
    /// bytes kept as files, which knows how its engine was opened (as a
    /// backup needs).
    async fn hybrid_store(dir: &Path, threshold: u64) -> Store {
        let config = EngineConfig { inline_threshold: threshold, ..EngineConfig::default() };
        let engine = engine::open(EngineKind::Hybrid, &dir.join("hybrid"), &config).await.unwrap();
        let catalog = Arc::new(RocksCatalog::open(&dir.join("catalog")).unwrap());
        let store_config = StoreConfig { engine: Some((EngineKind::Hybrid, config)), ..StoreConfig::default() };
        Store::open(catalog, engine, store_config).await.unwrap()
    }

    /// Where a [`hybrid_store`] in `dir` keeps a blob as a file.
    fn hybrid_file(dir: &Path, digest: &Digest) -> std::path::PathBuf {
        crate::engine::fs::blob_path_in(&dir.join("hybrid/files/blobs"), digest)
    }

    /// A store over the fs engine in `dir`, which knows how its engine was
    /// opened (as a backup needs), and the engine.
    async fn fs_store(dir: &Path) -> (Store, DynEngine) {
        let engine = engine::open(EngineKind::Fs, &dir.join("fs"), &EngineConfig::default()).await.unwrap();
        let catalog = Arc::new(RocksCatalog::open(&dir.join("catalog")).unwrap());
        let store_config =
            StoreConfig { engine: Some((EngineKind::Fs, EngineConfig::default())), ..StoreConfig::default() };
        (Store::open(catalog, engine.clone(), store_config).await.unwrap(), engine)
    }

    /// Of two backups into one directory at once, one writes there and the
    /// other is refused; the one refused used to wait for the first to
    /// finish, fail on its copy, and remove it.
    #[tokio::test]
    async fn two_backups_into_one_directory_leave_one_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = fs_store(dir.path()).await;
        put(&store, "kept", b"kept in the backup").await;

        let target = dir.path().join("backup");
        let bar = hidden();
        let (first, second) = tokio::join!(store.backup(&target, &bar), store.backup(&target, &bar));
        let refused = match (&first, &second) {
            (Ok(_), Err(e)) | (Err(e), Ok(_)) => e,
            _ => panic!("one backup is taken and one refused: {first:?}, {second:?}"),
        };
        assert!(matches!(refused, StoreError::InvalidArgument(m) if m.contains("another backup")), "{refused:?}");
        assert!(!target.join(BACKUP_CLAIM).exists(), "the finished backup let its directory go");
        let (copy, _) = fs_store(&target).await;
        assert_eq!(read_all(&copy, "files", "kept").await, b"kept in the backup");
        assert_eq!(std::fs::read_to_string(target.join(engine::ENGINE_MARKER)).unwrap(), "fs\n");
    }

    /// A backup dropped before its end (its client went away) lets its
    /// directory go: a retry there is not refused as taken.
    #[tokio::test]
    async fn a_backup_dropped_midway_lets_its_directory_go() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = fs_store(dir.path()).await;
        put(&store, "kept", b"kept in the backup").await;
        let target = dir.path().join("backup");
        let bar = hidden();
        let held = store.maintenance.lock().await;
        {
            let backup = store.backup(&target, &bar);
            tokio::pin!(backup);
            let waited = tokio::time::timeout(std::time::Duration::from_millis(200), &mut backup).await;
            assert!(waited.is_err(), "the backup waits for the collector's lock");
            assert!(target.join(BACKUP_CLAIM).exists());
        }
        assert!(!target.exists(), "the directory the dropped backup made is left");
        std::fs::create_dir(&target).unwrap();
        {
            let backup = store.backup(&target, &bar);
            tokio::pin!(backup);
            assert!(tokio::time::timeout(std::time::Duration::from_millis(200), &mut backup).await.is_err());
        }
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "a directory that was there stays, empty");
        drop(held);
        store.backup(&target, &bar).await.unwrap();
        assert!(target.join(engine::ENGINE_MARKER).exists());
    }

    /// A backup that fails midway (here on a blob whose bytes are lost)
    /// removes what it wrote: the directory when it made it, the entries
    /// it wrote when the directory was there before. The error names the
    /// blob.
    #[tokio::test]
    async fn a_failed_backup_removes_what_it_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let (store, engine) = fs_store(dir.path()).await;
        put(&store, "kept", b"kept").await;
        let lost = put(&store, "lost", b"bytes lost from the engine").await;
        engine.delete(&store.catalog.get_blob(&lost).await.unwrap().unwrap().blob_ref()).await.unwrap();

        let made = dir.path().join("made");
        let failed = store.backup(&made, &hidden()).await;
        assert!(
            matches!(&failed, Err(StoreError::Internal(m)) if m.contains(&format!("copying blob {lost}"))),
            "{failed:?}"
        );
        assert!(!made.exists(), "the directory the backup made is left");
        let there = dir.path().join("there");
        std::fs::create_dir(&there).unwrap();
        assert!(store.backup(&there, &hidden()).await.is_err());
        assert_eq!(std::fs::read_dir(&there).unwrap().count(), 0, "the backup left entries in {}", there.display());
    }
}
