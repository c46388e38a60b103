//! Multipart uploads, kept in the catalog itself so they need nothing the
//! catalogs do not already do transactionally.
//!
//! Uploads live in the store's own bucket [`UPLOADS`], which no client can
//! name (bucket names cannot start with `_`):
//!
//! | key | record |
//! |---|---|
//! | `u/{bucket}/{upload}` | the upload: target key, content type, user metadata, start time |
//! | `i/{bucket}/{key}\x01\x01{start:012x}{upload}` | the upload's place in its bucket's listing: by key, then start time |
//! | `p/{upload}/{part:05}` | one uploaded part, an ordinary object (its blob referenced, ETag = MD5) |
//! | `d/{upload}` | a completed upload: its ETag, so a repeated Complete answers the same |
//!
//! An upload ID is its start time (milliseconds, 12 hex digits) and 20
//! random hex digits. An upload's `u/` and `i/` records are written and
//! removed together. The `i/` key spells the target key with each `\x01`
//! written `\x01\x02`, so that the `\x01\x01` after it sorts a key's
//! uploads before those of every longer key, as S3 lists them.
//!
//! Completing writes the object and the `d/` record in one catalog
//! transaction, then removes the upload's records and then its parts; a
//! crash in between leaves records the next Abort or the collector removes
//! (a Complete again answers from the `d/` record; parts whose upload's
//! record is gone wait for the uploads' expiry). The
//! object's parts are the uploaded parts' blobs: nothing is copied.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use md5::Digest as _;
use rand::Rng;

use super::maintenance::DamagedObject;
use super::{NewMetadata, PutOptions, Result, Store, StoreError, names};
use crate::catalog::{
    CHECKSUM_HEADER_PREFIX, CatalogError, CatalogExt, ListQuery, Millis, ObjectPut, ObjectRecord, Part, Precondition,
    now_millis,
};
use crate::engine::{ByteRange, Digest};

/// The store's bucket of multipart uploads.
pub const UPLOADS: &str = "_uploads";

/// Smallest part but the last, as S3 has it.
pub const MIN_PART_SIZE: u64 = 5 << 20;

/// Largest part, as S3 has it.
pub const MAX_PART_SIZE: u64 = 5 << 30;

/// Highest part number, as S3 has it.
pub const MAX_PART_NUMBER: u32 = 10_000;

/// The metadata entry of an upload record that holds the target key.
const TARGET: &str = "key";

/// The checksum of an object completed from parts, made by whoever knows
/// its algorithm (the S3 API) from the upload's record. Completion shows it
/// each part listed, then every byte of the assembled object, and stores
/// the header it finishes with as the object's checksum (see
/// [`ObjectRecord::checksum`]); an error from any step refuses the
/// completion and writes nothing.
pub trait CompletionChecksum: Send {
    /// Part `number`, as listed and stored.
    fn part(&mut self, number: u32, record: &ObjectRecord) -> Result<()>;
    /// The next bytes of the assembled object.
    fn update(&mut self, bytes: &[u8]) -> Result<()>;
    /// The object's checksum, as a stored header (name and value).
    fn finish(&mut self) -> Result<Option<(String, String)>>;
}

/// Makes the [`CompletionChecksum`] of an upload from its record, or none.
pub type MakeChecksum<'a> = Box<dyn FnOnce(&ObjectRecord) -> Result<Option<Box<dyn CompletionChecksum>>> + Send + 'a>;

/// A page of an upload's parts.
pub struct PartsPage {
    /// The upload's record: what CreateMultipartUpload said.
    pub upload: ObjectRecord,
    pub parts: Vec<(u32, ObjectRecord)>,
    /// More parts follow.
    pub truncated: bool,
}

/// An upload in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated: Millis,
    /// The headers CreateMultipartUpload stored with the upload.
    pub headers: Vec<(String, String)>,
}

/// Where a listing of uploads starts, and how it rolls keys up, as
/// ListMultipartUploads asks.
#[derive(Clone, Debug, Default)]
pub struct UploadQuery {
    /// After this key: its uploads after `id_marker`, then later keys; a
    /// common prefix skips every key under it.
    pub key_marker: String,
    pub id_marker: String,
    /// Only uploads of keys under this prefix.
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Uploads plus common prefixes, at most.
    pub limit: usize,
}

impl UploadQuery {
    /// [`crate::catalog::common_prefix`] in this listing.
    fn common_prefix<'k>(&self, key: &'k str) -> Option<&'k str> {
        crate::catalog::common_prefix(&self.prefix, self.delimiter.as_deref(), key)
    }
}

/// One page of uploads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UploadPage {
    pub uploads: Vec<UploadInfo>,
    pub prefixes: Vec<String>,
    /// The key (or common prefix) and upload ID to go on after, if cut short.
    pub next: Option<(String, Option<String>)>,
}

fn upload_key(bucket: &str, upload_id: &str) -> String {
    format!("u/{bucket}/{upload_id}")
}

/// Where the listing of a bucket's uploads begins.
fn index_base(bucket: &str) -> String {
    format!("i/{bucket}/")
}

/// Where the entries of a bucket's uploads of keys starting with
/// `key_prefix` begin in the listing.
fn index_prefix(bucket: &str, key_prefix: &str) -> String {
    format!("{}{}", index_base(bucket), escaped(key_prefix))
}

/// What ends a key in the listing of uploads.
const KEY_END: &str = "\x01\x01";

/// A key as the listing of uploads spells it: in the same order, and
/// never holding [`KEY_END`].
fn escaped(key: &str) -> String {
    key.replace('\x01', "\x01\x02")
}

/// The key of an upload's entry in the listing, from its `u/` record.
fn index_key(upload: &ObjectRecord) -> String {
    let (bucket, upload_id) = upload_of(upload);
    entry_key(bucket, target(upload), upload.modified, upload_id)
}

/// The key of the entry in the listing of an upload of bucket/key that
/// began at `started`.
fn entry_key(bucket: &str, key: &str, started: Millis, upload_id: &str) -> String {
    format!("{}{KEY_END}{started:012x}{upload_id}", index_prefix(bucket, key))
}

/// The bucket and upload ID an upload's `u/` record is kept under.
fn upload_of(upload: &ObjectRecord) -> (&str, &str) {
    let rest = upload.key.strip_prefix("u/").unwrap_or("");
    rest.split_once('/').unwrap_or(("", rest))
}

/// The key and upload ID of an entry in the listing of a bucket's uploads,
/// its base stripped.
fn listed_upload(entry: &str) -> Option<(String, &str)> {
    let (key, rest) = entry.split_once(KEY_END)?;
    let upload_id = rest.get(12..)?;
    Some((key.replace("\x01\x02", "\x01"), upload_id))
}

fn part_prefix(upload_id: &str) -> String {
    format!("p/{upload_id}/")
}

fn part_key(upload_id: &str, part: u32) -> String {
    format!("p/{upload_id}/{part:05}")
}

fn done_key(upload_id: &str) -> String {
    format!("d/{upload_id}")
}

/// A record with no body, made now.
fn bare_record(key: String) -> ObjectRecord {
    ObjectRecord {
        key,
        size: 0,
        parts: Vec::new(),
        etag: String::new(),
        sha256: Digest([0; 32]),
        content_type: String::new(),
        modified: now_millis(),
        metadata: Vec::new(),
        headers: Vec::new(),
        body: None,
    }
}

/// A record of the uploads bucket written as it is.
fn upload_put(record: ObjectRecord) -> ObjectPut {
    ObjectPut { bucket: UPLOADS.into(), record, blobs: Vec::new(), precondition: Precondition::default() }
}

/// The upload's record rewritten unchanged, on the condition that it is
/// still there: committed beside a write that needs the upload.
fn still_there(upload: ObjectRecord) -> ObjectPut {
    let exists = Precondition { if_match: Some(vec!["*".into()]), ..Precondition::default() };
    ObjectPut { precondition: exists, ..upload_put(upload) }
}

/// The upload's entry in the listing of its bucket's uploads.
fn index_entry(upload: &ObjectRecord) -> ObjectPut {
    upload_put(ObjectRecord { modified: upload.modified, ..bare_record(index_key(upload)) })
}

/// When uploads began to have IDs that start with their start time
/// (milliseconds, 12 hex digits); earlier IDs are random.
const IDS_WITH_TIMES: Millis = 1_795_824_000_000;

/// The start time an upload ID begins with, if it is one that does.
fn started_at(upload_id: &str) -> Option<Millis> {
    check_upload_id(upload_id).ok()?;
    let started = Millis::from_str_radix(&upload_id[..12], 16).ok()?;
    (IDS_WITH_TIMES..=now_millis() + 86_400_000).contains(&started).then_some(started)
}

/// Upload ids are 32 hex digits; anything else names no upload (and could
/// otherwise reach other uploads' records through the key layout).
fn check_upload_id(upload_id: &str) -> Result<()> {
    if upload_id.len() == 32 && upload_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(StoreError::NoSuchUpload(upload_id.to_string()))
    }
}

fn check_part_number(part: u32) -> Result<()> {
    if (1..=MAX_PART_NUMBER).contains(&part) {
        Ok(())
    } else {
        Err(StoreError::InvalidArgument(format!("part number {part} is not between 1 and {MAX_PART_NUMBER}")))
    }
}

/// The target key of an upload record.
fn target(record: &ObjectRecord) -> &str {
    record.metadata.first().filter(|(k, _)| k == TARGET).map(|(_, v)| v.as_str()).unwrap_or("")
}

impl Store {
    /// Starts a multipart upload of bucket/key; returns its id.
    pub async fn create_upload(&self, bucket: &str, key: &str, about: NewMetadata) -> Result<String> {
        self.check_key(key)?;
        super::check_about(about.content_type.as_deref(), &about.metadata, &about.headers)?;
        self.bucket(bucket).await?;
        self.check_writable()?;
        let started = now_millis();
        let upload_id = format!("{started:012x}{}", hex::encode(rand::rng().random::<[u8; 10]>()));
        let mut meta = vec![(TARGET.to_string(), key.to_string())];
        meta.extend(about.metadata);
        let record = ObjectRecord {
            content_type: super::content_type_for(about.content_type, key),
            metadata: meta,
            headers: about.headers,
            modified: started,
            ..bare_record(upload_key(bucket, &upload_id))
        };
        let puts = vec![index_entry(&record), upload_put(record)];
        let r = self.catalog.put_objects(puts).await.map_err(Into::into);
        self.note(r)?;
        Ok(upload_id)
    }

    /// The record of an upload in progress for bucket/key: what
    /// CreateMultipartUpload said. One completed is gone, though a crash
    /// may have left its record.
    pub async fn upload(&self, bucket: &str, key: &str, upload_id: &str) -> Result<ObjectRecord> {
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        check_upload_id(upload_id)?;
        let wanted = [upload_key(bucket, upload_id), done_key(upload_id)];
        let mut found = self.catalog.get_objects(UPLOADS, &wanted).await?.into_iter();
        match (found.next().flatten(), found.next().flatten()) {
            (Some(r), None) if target(&r) == key => Ok(r),
            _ => Err(StoreError::NoSuchUpload(upload_id.to_string())),
        }
    }

    /// Stores one part; returns its record (size, ETag = hex MD5).
    pub async fn upload_part<S, E>(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: S,
        opts: PutOptions,
    ) -> Result<ObjectRecord>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + Unpin,
        E: std::fmt::Display,
    {
        check_part_number(part)?;
        let upload = self.upload(bucket, key, upload_id).await?;
        // A bucket deleted as the upload began (its delete found no upload
        // record yet to remove) takes no parts, whose space nothing would
        // use until the upload expired.
        self.bucket(bucket).await?;
        // A part takes no conditions of its own: a failed one below is its
        // upload's.
        let opts = PutOptions {
            content_type: Some("application/octet-stream".into()),
            precondition: Precondition::default(),
            max_length: Some(MAX_PART_SIZE),
            ..opts
        };
        // The part is recorded only if its upload is still there when the
        // body has streamed: an abort, completion or expiry meanwhile would
        // not see a part recorded after it, which nothing would release.
        match self.put_unchecked(UPLOADS, &part_key(upload_id, part), body, opts, Some(still_there(upload))).await {
            Ok(put) => Ok(put.record),
            Err(StoreError::PreconditionFailed) => Err(StoreError::NoSuchUpload(upload_id.to_string())),
            Err(e) => Err(e),
        }
    }

    /// Parts uploaded so far with numbers above `after`, at most `limit`.
    pub async fn list_parts(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        after: u32,
        limit: usize,
    ) -> Result<PartsPage> {
        let upload = self.upload(bucket, key, upload_id).await?;
        if limit == 0 {
            return Ok(PartsPage { upload, parts: Vec::new(), truncated: false });
        }
        let query = ListQuery {
            prefix: part_prefix(upload_id),
            after: (after > 0).then(|| part_key(upload_id, after)),
            delimiter: None,
            limit,
        };
        let page = self.catalog.list_objects(UPLOADS, &query).await?;
        let parts =
            page.objects.into_iter().filter_map(|r| Some((r.key.rsplit('/').next()?.parse().ok()?, r))).collect();
        Ok(PartsPage { upload, parts, truncated: page.next.is_some() })
    }

    /// A page of the uploads in progress in a bucket, by key, then by when
    /// they began, as ListMultipartUploads asks: read from the listing's
    /// entries after the markers, so a page costs about as many catalog
    /// reads as it holds uploads. The uploads of the marker key are those
    /// after the marker upload; if that upload is gone, those after where
    /// its ID says it was (IDs begin with their start time), or for an ID
    /// of an earlier version, the uploads of the next key.
    pub async fn list_uploads(&self, bucket: &str, query: &UploadQuery) -> Result<UploadPage> {
        super::check_listing(&[&query.prefix, &query.key_marker, query.delimiter.as_deref().unwrap_or("")])?;
        self.bucket(bucket).await?;
        let mut page = UploadPage::default();
        let Some(mut after) = self.uploads_after(bucket, query).await? else {
            return Ok(page);
        };
        let base = index_base(bucket);
        let mut last: Option<(String, Option<String>)> = None;
        'listing: loop {
            let entries = ListQuery {
                prefix: index_prefix(bucket, &query.prefix),
                after: after.clone(),
                delimiter: None,
                limit: (query.limit + 1 - page.uploads.len() - page.prefixes.len()).min(1000),
            };
            let entries = self.catalog.list_objects(UPLOADS, &entries).await?;
            let listed: Vec<(String, String)> = entries
                .objects
                .iter()
                .filter_map(|e| listed_upload(e.key.strip_prefix(&base)?).map(|(key, id)| (key, id.to_string())))
                .collect();
            // An upload is in progress while its record is there and no
            // completion's is: a crash between a completion and the removal
            // of its upload's records leaves them.
            let wanted: Vec<String> =
                listed.iter().flat_map(|(_, id)| [upload_key(bucket, id), done_key(id)]).collect();
            let mut records = self.catalog.get_objects(UPLOADS, &wanted).await?.into_iter();
            for (key, upload_id) in listed {
                let (Some(upload), None) = (records.next().flatten(), records.next().flatten()) else {
                    continue;
                };
                if page.uploads.len() + page.prefixes.len() >= query.limit {
                    page.next = last;
                    return Ok(page);
                }
                if let Some(prefix) = query.common_prefix(&key) {
                    last = Some((prefix.to_string(), None));
                    page.prefixes.push(prefix.to_string());
                    // On past every key under the prefix.
                    match crate::catalog::past(&index_prefix(bucket, prefix)) {
                        Some(past) => after = Some(past),
                        None => return Ok(page),
                    }
                    continue 'listing;
                }
                last = Some((key.clone(), Some(upload_id.clone())));
                page.uploads.push(UploadInfo { key, upload_id, initiated: upload.modified, headers: upload.headers });
            }
            match entries.next {
                Some(next) => after = Some(next),
                None => return Ok(page),
            }
        }
    }

    /// Where a listing of uploads starts: after this entry (none for the
    /// first), or nowhere if nothing can follow its markers.
    async fn uploads_after(&self, bucket: &str, query: &UploadQuery) -> Result<Option<Option<String>>> {
        let marker = &query.key_marker;
        if marker.is_empty() {
            return Ok(Some(None));
        }
        if check_upload_id(&query.id_marker).is_ok()
            && let Some(upload) = self.catalog.get_object(UPLOADS, &upload_key(bucket, &query.id_marker)).await?
            && target(&upload) == marker
        {
            return Ok(Some(Some(index_key(&upload))));
        }
        if let Some(started) = started_at(&query.id_marker) {
            // The marker upload is gone (completed or aborted since the
            // page that named it): its ID still says where it was.
            return Ok(Some(Some(entry_key(bucket, marker, started, &query.id_marker))));
        }
        let at = index_prefix(bucket, marker);
        Ok(if query.common_prefix(marker) == Some(marker.as_str()) {
            // Past every key under the marker's common prefix.
            crate::catalog::past(&at).map(Some)
        } else {
            // Past the marker key's own uploads: `~` follows every digit
            // of their start times.
            Some(Some(format!("{at}{KEY_END}~")))
        })
    }

    /// Calls `f` on every record of the uploads bucket under `prefix`.
    async fn each_upload_record(&self, prefix: &str, mut f: impl FnMut(&ObjectRecord)) -> Result<()> {
        let mut query = ListQuery { prefix: prefix.to_string(), after: None, delimiter: None, limit: 1000 };
        loop {
            let page = self.catalog.list_objects(UPLOADS, &query).await?;
            page.objects.iter().for_each(&mut f);
            match page.next {
                Some(next) => query.after = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// What the part records `keys` (`p/<upload id>/<part>`) are parts of:
    /// their uploads' buckets and keys. Parts of an upload whose record is
    /// gone (a crash cut its abort or completion short) name the store's
    /// own bucket and the record's key.
    pub(super) async fn upload_parts_named(&self, keys: &[String]) -> Result<Vec<DamagedObject>> {
        let mut uploads = HashMap::new();
        self.each_upload_record("u/", |r| {
            let (bucket, id) = upload_of(r);
            uploads.insert(id.to_string(), (bucket.to_string(), target(r).to_string()));
        })
        .await?;
        Ok(keys
            .iter()
            .map(|record_key| {
                let mut words = record_key.split('/').skip(1);
                let (id, part) = (words.next().unwrap_or(""), words.next().and_then(|p| p.parse().ok()));
                match (uploads.get(id), part) {
                    (Some((bucket, key)), Some(part)) => {
                        DamagedObject { bucket: bucket.clone(), key: key.clone(), part: Some((id.to_string(), part)) }
                    }
                    _ => DamagedObject { bucket: UPLOADS.to_string(), key: record_key.clone(), part: None },
                }
            })
            .collect())
    }

    /// Removes an upload's records (given its `u/` record): that record,
    /// its entry in the listing and its parts, which are released.
    ///
    /// The upload's record goes first: every part commits only while it is
    /// there, so the listing of parts after it finds every part recorded,
    /// where one recorded while they were listed used to outlive the
    /// upload, answered 200 and kept until the uploads' expiry. A crash
    /// between the two leaves parts that the expiry removes.
    async fn remove_upload(&self, upload: &ObjectRecord) -> Result<()> {
        self.remove_upload_records(&[upload.key.clone(), index_key(upload)]).await?;
        let mut parts = Vec::new();
        self.each_upload_record(&part_prefix(upload_of(upload).1), |r| parts.push(r.key.clone())).await?;
        self.remove_upload_records(&parts).await
    }

    /// Writes the entries in the listing of uploads that have none: those
    /// begun by an earlier version, which kept no listing (or, with a
    /// shared catalog, by a node still running one); returns how many.
    pub async fn list_unlisted_uploads(&self) -> Result<u64> {
        self.check_writable()?;
        let mut uploads = Vec::new();
        self.each_upload_record("u/", |r| uploads.push(r.clone())).await?;
        self.list_uploads_of(&uploads).await
    }

    /// Writes the entries in the listing that `uploads` lack, for those
    /// still there; returns how many.
    async fn list_uploads_of(&self, uploads: &[ObjectRecord]) -> Result<u64> {
        let mut written = 0;
        for uploads in uploads.chunks(1000) {
            let entries: Vec<String> = uploads.iter().map(index_key).collect();
            let listed = self.catalog.get_objects(UPLOADS, &entries).await?;
            for (upload, _) in uploads.iter().zip(listed).filter(|(_, listed)| listed.is_none()) {
                // Only while the upload is there: one completed or aborted
                // meanwhile is not listed again.
                match self.catalog.put_objects(vec![index_entry(upload), still_there(upload.clone())]).await {
                    Ok(_) => written += 1,
                    Err(CatalogError::PreconditionFailed) => {}
                    Err(e) => return self.note(Err(e.into())),
                }
            }
        }
        Ok(written)
    }

    /// Removes the uploads in progress into `bucket`, which was just
    /// deleted: as in S3, they do not keep a bucket without objects from
    /// going.
    pub(super) async fn remove_uploads_into(&self, bucket: &str) -> Result<()> {
        let mut uploads = Vec::new();
        self.each_upload_record(&format!("u/{bucket}/"), |r| uploads.push(r.clone())).await?;
        for upload in &uploads {
            self.remove_upload(upload).await?;
        }
        Ok(())
    }

    async fn remove_upload_records(&self, keys: &[String]) -> Result<()> {
        let r = self.catalog.delete_objects(UPLOADS, keys, &Precondition::default()).await.map_err(Into::into);
        self.note(r).map(drop)
    }

    /// Abandons an upload and releases its parts. Racing a completion,
    /// one of the two wins: the completion writes its object only while
    /// the upload's record is there, and an abort that finds the
    /// completion's record afterwards says the upload is gone.
    pub async fn abort_upload(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        self.check_writable()?;
        let upload = self.upload(bucket, key, upload_id).await?;
        self.remove_upload(&upload).await?;
        if self.catalog.get_object(UPLOADS, &done_key(upload_id)).await?.is_some() {
            return Err(StoreError::NoSuchUpload(upload_id.into()));
        }
        Ok(())
    }

    /// Completes an upload from `parts` (number, ETag), in ascending order:
    /// writes bucket/key and returns its record. Completing an upload that
    /// was already completed returns the record written then.
    pub async fn complete_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        precondition: Precondition,
        checksum: MakeChecksum<'_>,
    ) -> Result<ObjectRecord> {
        self.check_writable()?;
        names::check_bucket(bucket).map_err(StoreError::InvalidBucketName)?;
        check_upload_id(upload_id)?;
        let wanted = [done_key(upload_id), upload_key(bucket, upload_id)];
        let [done, upload] =
            <[Option<ObjectRecord>; 2]>::try_from(self.catalog.get_objects(UPLOADS, &wanted).await?)
                .map_err(|_| StoreError::Internal("the catalog answered the wrong number of records".into()))?;
        // The object a complete of this upload made, answered to a retry.
        let made = |d: ObjectRecord| {
            (target(&d) == key && d.content_type == bucket).then(|| ObjectRecord { key: key.to_string(), ..d })
        };
        if let Some(done) = done.and_then(made) {
            if let Some(upload) = upload {
                // A crash after completing left the upload's records.
                self.remove_completed(&upload).await;
            }
            return Ok(done);
        }
        let upload = upload.filter(|u| target(u) == key).ok_or_else(|| StoreError::NoSuchUpload(upload_id.into()))?;
        let mut checksum = checksum(&upload)?;
        if parts.is_empty() {
            return Err(StoreError::BadRequest("a multipart upload is completed with at least one part".into()));
        }
        if parts.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(StoreError::InvalidPartOrder);
        }
        let keys: Vec<String> = parts.iter().map(|(n, _)| part_key(upload_id, *n)).collect();
        let records = self.catalog.get_objects(UPLOADS, &keys).await?;
        if records.iter().any(Option::is_none) {
            let mut now = self.catalog.get_objects(UPLOADS, &wanted).await?.into_iter();
            let (done, upload) = (now.next().flatten(), now.next().flatten());
            if let Some(done) = done.and_then(made) {
                // A complete of the same upload that ran meanwhile has taken
                // its parts: answer the object it made.
                return Ok(done);
            }
            if upload.is_none() {
                // An abort that ran meanwhile has taken them.
                return Err(StoreError::NoSuchUpload(upload_id.into()));
            }
        }
        let mut body_parts: Vec<Part> = Vec::new();
        let mut md5s = Vec::with_capacity(16 * parts.len());
        for (i, ((n, etag), record)) in parts.iter().zip(records).enumerate() {
            let etag = etag.trim().trim_matches('"');
            let record = record.filter(|r| r.etag == etag).ok_or_else(|| {
                StoreError::InvalidPart(format!("part {n} was not uploaded, or its ETag is not {etag:?}"))
            })?;
            if i + 1 < parts.len() && record.size < MIN_PART_SIZE {
                return Err(StoreError::EntityTooSmall(format!(
                    "part {n} has {} bytes; every part but the last needs at least {MIN_PART_SIZE}",
                    record.size
                )));
            }
            if let Some(c) = checksum.as_deref_mut() {
                c.part(*n, &record)?;
            }
            md5s.extend(
                hex::decode(&record.etag).map_err(|_| StoreError::Internal("a part's ETag is not hex".into()))?,
            );
            body_parts.extend(record.parts);
        }
        let mut object = ObjectRecord {
            key: key.to_string(),
            size: body_parts.iter().map(|p| p.size).sum(),
            etag: format!("{}-{}", hex::encode(md5::Md5::digest(&md5s)), parts.len()),
            sha256: Digest([0; 32]),
            content_type: upload.content_type.clone(),
            modified: now_millis(),
            metadata: upload.metadata[1..].to_vec(),
            // The upload's own checksum headers said how its parts are
            // checked; the object's checksum is made below.
            headers: upload.headers.iter().filter(|(n, _)| !n.starts_with(CHECKSUM_HEADER_PREFIX)).cloned().collect(),
            parts: body_parts,
            body: None,
        };
        object.sha256 = self.sha256_of(&object, checksum.as_deref_mut()).await?;
        if let Some(header) = checksum.map(|mut c| c.finish()).transpose()?.flatten() {
            object.headers.push(header);
        }
        // The parts' blobs are held from the collectors until the object's
        // references are recorded, as a copy's are: a part uploaded again
        // meanwhile may have left them unreferenced.
        let missing = |d| StoreError::Internal(format!("the blob {d} of a part is missing"));
        let (_held, claims, blobs) = self.hold_blobs(&object.parts, missing).await?;
        // The completion record: enough to answer a repeated Complete. The
        // bucket goes in its content type, the key in its metadata, the
        // object's checksum in its headers.
        let done = ObjectRecord {
            key: done_key(upload_id),
            size: 0,
            parts: Vec::new(),
            content_type: bucket.to_string(),
            metadata: vec![(TARGET.to_string(), key.to_string())],
            headers: object.headers.iter().filter(|(n, _)| n.starts_with(CHECKSUM_HEADER_PREFIX)).cloned().collect(),
            body: None,
            ..object.clone()
        };
        // The upload must still be there when the object is written: an
        // abort that removed it first wins (see `abort_upload`).
        // Its record of completion only if no other Complete wrote one
        // first: the later then answers with the earlier's object, rather
        // than both answering 200 with different ETags.
        let first = Precondition { if_absent: true, ..Precondition::default() };
        let puts = vec![
            ObjectPut { bucket: bucket.to_string(), record: object.clone(), blobs, precondition },
            ObjectPut { precondition: first, ..upload_put(done) },
            still_there(upload.clone()),
        ];
        match self.commit_held(puts, &claims).await {
            // Another Complete of this upload (a client's retry while the
            // first still ran) got there first: answered as it was. So is a
            // commit whose answer a shared catalog lost, and which it found
            // applied when it ran it again (it then cannot tell).
            Err(e @ (StoreError::PreconditionFailed | StoreError::Unavailable(_))) => {
                let done = self.catalog.get_object(UPLOADS, &done_key(upload_id)).await?;
                if let Some(done) = done.filter(|d| target(d) == key && d.content_type == bucket) {
                    if matches!(e, StoreError::Unavailable(_)) {
                        self.remove_completed(&upload).await;
                    }
                    return Ok(ObjectRecord { key: key.to_string(), ..done });
                }
                if matches!(e, StoreError::Unavailable(_)) {
                    return Err(e);
                }
                return Err(match self.upload(bucket, key, upload_id).await {
                    Err(_) => StoreError::NoSuchUpload(upload_id.into()),
                    Ok(_) => e,
                });
            }
            r => r?,
        };
        self.remove_completed(&upload).await;
        Ok(object)
    }

    /// Removes the records of an upload its completion has recorded: one
    /// that fails leaves them to expire, and the completion stands.
    async fn remove_completed(&self, upload: &ObjectRecord) {
        if let Err(e) = self.remove_upload(upload).await {
            let (_, upload_id) = upload_of(upload);
            tracing::warn!("upload {upload_id} completed; its records stay until they expire: {e}");
        }
    }

    /// SHA-256 of an object's whole body, read back from its parts, which
    /// `checksum` sees too.
    async fn sha256_of(
        &self,
        record: &ObjectRecord,
        mut checksum: Option<&mut (dyn CompletionChecksum + '_)>,
    ) -> Result<Digest> {
        let mut body = self.read(record, ByteRange::full(record.size)).await?;
        let mut sha = sha2::Sha256::new();
        while let Some(chunk) = body.try_next().await? {
            sha.update(&chunk);
            if let Some(c) = checksum.as_deref_mut() {
                c.update(&chunk)?;
            }
        }
        Ok(Digest(sha.finalize().into()))
    }

    /// Aborts uploads started before `cutoff`, lists those kept that lack
    /// their entry in the listing, forgets completions older than the
    /// cutoff and releases parts and entries older than that whose upload
    /// is gone; returns how many uploads it aborted.
    pub(super) async fn expire_uploads(&self, cutoff: Millis) -> Result<u64> {
        let (mut stale, mut kept) = (Vec::new(), Vec::new());
        self.each_upload_record("u/", |r| if r.modified < cutoff { &mut stale } else { &mut kept }.push(r.clone()))
            .await?;
        // Each write checks again that the store may be written (a node
        // paused since the pass began may have lost its lease meanwhile).
        for upload in &stale {
            self.check_writable()?;
            self.remove_upload(upload).await?;
        }
        self.check_writable()?;
        self.list_uploads_of(&kept).await?;
        let kept: HashSet<&str> = kept.iter().map(|u| upload_of(u).1).collect();
        // Completions old enough to forget, and entries in the listing
        // that outlived their upload's record (every upload begun before
        // the cutoff is gone by now).
        let mut gone = Vec::new();
        for prefix in ["d/", "i/"] {
            self.each_upload_record(prefix, |r| {
                if r.modified < cutoff {
                    gone.push(r.key.clone());
                }
            })
            .await?;
        }
        // Parts left by a crash between an upload's removal and its parts',
        // or recorded while an abort listed them. A part of an upload begun
        // after the listing above is newer than the cutoff.
        self.each_upload_record("p/", |r| {
            let id = r.key.split('/').nth(1).unwrap_or("");
            if r.modified < cutoff && !kept.contains(id) {
                gone.push(r.key.clone());
            }
        })
        .await?;
        for keys in gone.chunks(1000) {
            self.check_writable()?;
            self.remove_upload_records(keys).await?;
        }
        Ok(stale.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::BODY_IN_RECORD;
    use crate::catalog::rocks::RocksCatalog;
    use crate::engine::memory::MemoryEngine;
    use crate::store::StoreConfig;
    use futures::StreamExt;
    use std::sync::Arc;

    /// Every upload in progress in `bucket`, in one page.
    async fn in_progress(s: &Store, bucket: &str) -> Vec<UploadInfo> {
        let page = s.list_uploads(bucket, &UploadQuery { limit: 10_000, ..Default::default() }).await.unwrap();
        assert_eq!(page.next, None);
        page.uploads
    }

    /// Pages `limit` entries at a time, following the markers each page
    /// gives: uploads as "key id", common prefixes as themselves.
    async fn every_page(s: &Store, limit: usize, prefix: &str, delimiter: Option<&str>) -> Vec<String> {
        let mut query = UploadQuery {
            prefix: prefix.into(),
            delimiter: delimiter.map(str::to_string),
            limit,
            ..Default::default()
        };
        let mut seen = Vec::new();
        loop {
            let page = s.list_uploads("files", &query).await.unwrap();
            assert!(page.uploads.len() + page.prefixes.len() <= limit);
            seen.extend(page.uploads.iter().map(|u| format!("{} {}", u.key, u.upload_id)));
            seen.extend(page.prefixes);
            match page.next {
                Some((key, id)) => (query.key_marker, query.id_marker) = (key, id.unwrap_or_default()),
                None => return seen,
            }
        }
    }

    /// Lists uploads of keys that sort close together (`\x01` is the
    /// least character a key may hold) and a delimiter that the start
    /// times spell too; pages of every size.
    async fn uploads_are_listed_by_key_then_start(s: &Store) {
        let keys = ["k", "l", "k", "k\x01", "k\x01\x01", "k0", "j", "d/a", "k", "d/b", "e/c", "f", "k\x01\x02"];
        let mut begun = Vec::new();
        for key in keys {
            let id = s.create_upload("files", key, NewMetadata::default()).await.unwrap();
            begun.push(format!("{key} {id}"));
            // Uploads begun in one millisecond are listed in any order.
            tokio::time::sleep(std::time::Duration::from_millis(3)).await;
        }
        let mut by_key = begun.clone();
        by_key.sort_by(|a, b| a.rsplit_once(' ').unwrap().0.cmp(b.rsplit_once(' ').unwrap().0));
        let listed: Vec<String> =
            in_progress(s, "files").await.iter().map(|u| format!("{} {}", u.key, u.upload_id)).collect();
        assert_eq!(listed, by_key, "by key, then in the order they began");
        for limit in [1, 2, 5] {
            assert_eq!(every_page(s, limit, "", None).await, by_key, "{limit} at a time");
        }
        let named =
            |key: &str| by_key.iter().filter(|u| u.rsplit_once(' ').unwrap().0 == key).cloned().collect::<Vec<_>>();
        let mut rolled = vec!["d/".to_string(), "e/".to_string()];
        rolled.extend(by_key[3..].iter().cloned());
        assert_eq!(every_page(s, 1, "", Some("/")).await, rolled);
        assert_eq!(every_page(s, 2, "d/", Some("/")).await, [named("d/a"), named("d/b")].concat());
        // The start times are hex digits: "0" rolls up only the key "k0".
        let under_k = every_page(s, 2, "k", Some("0")).await;
        let mut expected = [named("k"), named("k\x01"), named("k\x01\x01"), named("k\x01\x02")].concat();
        expected.push("k0".into());
        assert_eq!(under_k, expected);
        // A marker upload that is gone: the listing goes on with the next key.
        let gone = UploadQuery { key_marker: "k".into(), id_marker: "0".repeat(32), limit: 1, ..Default::default() };
        let page = s.list_uploads("files", &gone).await.unwrap();
        assert_eq!(page.uploads[0].key, "k\x01");
        // A marker common prefix skips the keys under it.
        let past_d =
            UploadQuery { key_marker: "d/".into(), delimiter: Some("/".into()), limit: 1, ..Default::default() };
        assert_eq!(s.list_uploads("files", &past_d).await.unwrap().prefixes, ["e/"]);
        // A marker upload aborted since the page that named it: the
        // listing goes on with the next upload of its key.
        let from_k = UploadQuery { key_marker: "j".into(), limit: 1, ..Default::default() };
        let page = s.list_uploads("files", &from_k).await.unwrap();
        let (key, id) = page.next.unwrap();
        let id = id.unwrap();
        assert_eq!(format!("{key} {id}"), named("k")[0]);
        let upload = s.upload("files", &key, &id).await.unwrap();
        assert_eq!(started_at(&id), Some(upload.modified), "an upload ID begins with its start time");
        s.abort_upload("files", &key, &id).await.unwrap();
        let after_gone = UploadQuery { key_marker: key, id_marker: id, limit: 1, ..Default::default() };
        let page = s.list_uploads("files", &after_gone).await.unwrap();
        assert_eq!(format!("{} {}", page.uploads[0].key, page.uploads[0].upload_id), named("k")[1]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn uploads_are_listed_by_key_then_start_with_a_local_catalog() {
        let (s, _dir) = store().await;
        uploads_are_listed_by_key_then_start(&s).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn uploads_are_listed_by_key_then_start_with_a_shared_catalog() {
        let url = crate::pg::fresh_test_database().await;
        let catalog = Arc::new(crate::catalog::postgres::PostgresCatalog::connect(&url).await.unwrap());
        let s = Store::open(catalog, Arc::new(MemoryEngine::new()), StoreConfig::default()).await.unwrap();
        uploads_are_listed_by_key_then_start(&s).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn uploads_begun_by_an_earlier_version_are_listed() {
        let (s, _dir) = store().await;
        // An earlier version writes an upload's record alone.
        let earlier = |key: &str, id: &str| {
            let record =
                ObjectRecord { metadata: vec![(TARGET.into(), key.into())], ..bare_record(upload_key("files", id)) };
            s.catalog.put_object(upload_put(record))
        };
        let listed =
            || async { in_progress(&s, "files").await.into_iter().map(|u| (u.key, u.upload_id)).collect::<Vec<_>>() };
        let (a, b) = ("a".repeat(32), "b".repeat(32));
        earlier("old", &a).await.unwrap();
        assert!(listed().await.is_empty());
        assert_eq!(s.list_unlisted_uploads().await.unwrap(), 1, "as a server starts");
        assert_eq!(listed().await, [("old".to_string(), a.clone())]);
        assert_eq!(s.list_unlisted_uploads().await.unwrap(), 0);
        // One begun later by a node still running the earlier version is
        // listed by the next expiry pass.
        earlier("older", &b).await.unwrap();
        assert_eq!(s.expire_uploads(now_millis() - 60_000).await.unwrap(), 0);
        assert_eq!(listed().await, [("old".to_string(), a.clone()), ("older".to_string(), b.clone())]);
        s.abort_upload("files", "old", &a).await.unwrap();
        s.abort_upload("files", "older", &b).await.unwrap();
        assert!(listed().await.is_empty());
        assert_eq!(records_under(&s, "").await, 0, "no record is left");
    }

    async fn store() -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        (Store::open(catalog, Arc::new(MemoryEngine::new()), StoreConfig::default()).await.unwrap(), dir)
    }

    fn body(bytes: Vec<u8>) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin {
        futures::stream::iter(vec![Ok(Bytes::from(bytes))])
    }

    async fn part(s: &Store, id: &str, n: u32, bytes: Vec<u8>) -> (u32, String) {
        let r = s.upload_part("files", "k", id, n, body(bytes), PutOptions::default()).await.unwrap();
        (n, format!("\"{}\"", r.etag))
    }

    async fn read(s: &Store, key: &str) -> Vec<u8> {
        let r = s.head("files", key).await.unwrap();
        let chunks: Vec<Bytes> = s.read(&r, ByteRange::full(r.size)).await.unwrap().try_collect().await.unwrap();
        chunks.concat()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_completed_upload_is_its_parts_in_order_and_completing_again_answers_the_same() {
        let (s, _dir) = store().await;
        let about = NewMetadata {
            content_type: Some("text/plain".into()),
            metadata: vec![("m".into(), "v".into())],
            headers: vec![("cache-control".into(), "max-age=60".into())],
        };
        let id = s.create_upload("files", "k", about.clone()).await.unwrap();
        let upload_record = s.upload("files", "k", &id).await.unwrap();
        let big = vec![7u8; MIN_PART_SIZE as usize];
        let parts = vec![part(&s, &id, 1, big.clone()).await, part(&s, &id, 3, b"tail".to_vec()).await];
        part(&s, &id, 2, b"never used".to_vec()).await;
        let counted = |s: crate::catalog::CatalogStats| (s.objects, s.logical_bytes);
        assert_eq!(counted(s.stats().await.unwrap()), (0, 0), "an upload's records are not objects");
        let done = s
            .complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None)))
            .await
            .unwrap();
        let mut whole = big.clone();
        whole.extend_from_slice(b"tail");
        assert_eq!(read(&s, "k").await, whole);
        let md5s: Vec<u8> = [md5::Md5::digest(&big).to_vec(), md5::Md5::digest(b"tail").to_vec()].concat();
        assert_eq!(done.etag, format!("{}-2", hex::encode(md5::Md5::digest(&md5s))));
        assert_eq!(done.sha256, Digest(sha2::Sha256::digest(&whole).into()));
        let head = s.head("files", "k").await.unwrap();
        assert_eq!(
            (Some(head.content_type.clone()), &head.metadata, &head.headers),
            (about.content_type, &about.metadata, &about.headers)
        );
        let again = s
            .complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None)))
            .await
            .unwrap();
        assert_eq!(again.etag, done.etag);
        assert_eq!(counted(s.stats().await.unwrap()), (1, whole.len() as i64));
        // The upload's records are gone; only the object holds blobs: the
        // part never used is unreferenced.
        assert!(in_progress(&s, "files").await.is_empty());
        // As a crash right after the completion would leave it: the upload's
        // record is back, and still the upload is not listed.
        let put = ObjectPut {
            bucket: UPLOADS.into(),
            record: upload_record,
            blobs: Vec::new(),
            precondition: Precondition::default(),
        };
        s.catalog.put_object(put).await.unwrap();
        assert!(in_progress(&s, "files").await.is_empty(), "a completed upload is not listed");
        // Nor does it take parts, or list them.
        let late = s.upload_part("files", "k", &id, 1, body(b"late".to_vec()), PutOptions::default()).await;
        assert!(matches!(late, Err(StoreError::NoSuchUpload(_))), "{late:?}");
        assert!(matches!(s.list_parts("files", "k", &id, 0, 10).await, Err(StoreError::NoSuchUpload(_))));
        assert!(matches!(s.abort_upload("files", "k", &id).await, Err(StoreError::NoSuchUpload(_))));
        let unused = s.catalog.get_blob(&Digest(sha2::Sha256::digest(b"never used").into())).await.unwrap().unwrap();
        assert_eq!(unused.refs, 0);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_part_over_five_gibibytes_is_refused_before_its_body() {
        let (s, _dir) = store().await;
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let declared = |n| PutOptions { content_length: Some(n), ..PutOptions::default() };
        let over = s.upload_part("files", "k", &id, 1, body(Vec::new()), declared(MAX_PART_SIZE + 1)).await;
        assert!(matches!(over, Err(StoreError::EntityTooLarge(_))), "{over:?}");
        let exact = s.upload_part("files", "k", &id, 1, body(Vec::new()), declared(MAX_PART_SIZE)).await;
        assert!(matches!(exact, Err(StoreError::IncompleteBody { .. })), "the limit itself is allowed: {exact:?}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn completion_checks_etags_sizes_and_order() {
        let (s, _dir) = store().await;
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let small = [part(&s, &id, 1, b"small".to_vec()).await, part(&s, &id, 2, b"last".to_vec()).await];
        let complete = |parts: Vec<(u32, String)>| {
            let (s, id) = (&s, id.clone());
            async move {
                s.complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None))).await
            }
        };
        assert!(matches!(complete(small.to_vec()).await, Err(StoreError::EntityTooSmall(_))));
        assert!(matches!(complete(vec![(1, "\"00\"".into())]).await, Err(StoreError::InvalidPart(_))));
        assert!(matches!(complete(vec![small[1].clone(), small[0].clone()]).await, Err(StoreError::InvalidPartOrder)));
        assert!(matches!(complete(Vec::new()).await, Err(StoreError::BadRequest(_))));
        assert!(matches!(s.head("files", "k").await, Err(StoreError::NoSuchKey(_))));
        let other = s
            .complete_upload("files", "other-key", &id, &small[..1], Precondition::default(), Box::new(|_| Ok(None)))
            .await;
        assert!(matches!(other, Err(StoreError::NoSuchUpload(_))), "an upload completes only its own key");
        assert!(matches!(
            s.upload_part("files", "k", "../../x", 1, body(vec![1]), PutOptions::default()).await,
            Err(StoreError::NoSuchUpload(_))
        ));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_bucket_without_objects_goes_with_its_uploads_in_progress() {
        let (s, _dir) = store().await;
        s.create_bucket("work", "", false).await.unwrap();
        s.put("work", "kept", body(b"object".to_vec()), PutOptions::default()).await.unwrap();
        let id = s.create_upload("work", "k", NewMetadata::default()).await.unwrap();
        s.upload_part("work", "k", &id, 1, body(b"in progress".to_vec()), PutOptions::default()).await.unwrap();
        // An object keeps the bucket, and the upload stays.
        assert!(matches!(s.delete_bucket("work").await, Err(StoreError::BucketNotEmpty(_))));
        assert_eq!(in_progress(&s, "work").await.len(), 1);
        s.delete("work", "kept", &Precondition::default()).await.unwrap();
        s.delete_bucket("work").await.unwrap();
        let blob = s.catalog.get_blob(&Digest(sha2::Sha256::digest(b"in progress").into())).await.unwrap().unwrap();
        assert_eq!(blob.refs, 0, "the part is released");
        s.create_bucket("work", "", false).await.unwrap();
        assert!(in_progress(&s, "work").await.is_empty(), "a new bucket of that name starts empty");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn aborted_and_expired_uploads_release_their_parts() {
        let (s, _dir) = store().await;
        let aborted = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        part(&s, &aborted, 1, b"aborted".to_vec()).await;
        s.abort_upload("files", "k", &aborted).await.unwrap();
        let expired = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        part(&s, &expired, 1, b"expired".to_vec()).await;
        assert_eq!(in_progress(&s, "files").await.len(), 1);
        assert_eq!(s.expire_uploads(now_millis() + 1).await.unwrap(), 1);
        assert!(in_progress(&s, "files").await.is_empty());
        for bytes in [&b"aborted"[..], b"expired"] {
            let blob = s.catalog.get_blob(&Digest(sha2::Sha256::digest(bytes).into())).await.unwrap().unwrap();
            assert_eq!(blob.refs, 0, "{:?}", String::from_utf8_lossy(bytes));
        }
        assert!(s.buckets().await.unwrap().iter().all(|b| !b.name.starts_with('_')), "the uploads bucket is hidden");
    }

    /// Part records of an upload, whoever's they are.
    async fn part_records(s: &Store, id: &str) -> usize {
        records_under(s, &part_prefix(id)).await
    }

    async fn records_under(s: &Store, prefix: &str) -> usize {
        let query = ListQuery { prefix: prefix.into(), after: None, delimiter: None, limit: 100 };
        s.catalog.list_objects(UPLOADS, &query).await.unwrap().objects.len()
    }

    async fn refs(s: &Store, bytes: &[u8]) -> u64 {
        let blob = s.catalog.get_blob(&Digest(sha2::Sha256::digest(bytes).into())).await.unwrap();
        blob.map_or(0, |b| b.refs)
    }

    /// A part whose body still streams when its upload is aborted is not
    /// recorded: nothing would ever release it.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_part_that_outlasts_the_abort_of_its_upload_is_not_kept() {
        let (s, _dir) = store().await;
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let (streaming, seen) = tokio::sync::oneshot::channel();
        let (go, aborted) = tokio::sync::oneshot::channel::<()>();
        let first = futures::stream::once(async move {
            let _ = streaming.send(());
            Ok::<_, std::io::Error>(Bytes::from_static(b"a part "))
        });
        let rest = futures::stream::once(async move {
            let _ = aborted.await;
            Ok(Bytes::from_static(b"finished late"))
        });
        let (put, ()) = tokio::join!(
            s.upload_part("files", "k", &id, 1, Box::pin(first.chain(rest)), PutOptions::default()),
            async {
                seen.await.unwrap();
                s.abort_upload("files", "k", &id).await.unwrap();
                go.send(()).unwrap();
            }
        );
        assert!(matches!(put, Err(StoreError::NoSuchUpload(_))), "{put:?}");
        assert_eq!(part_records(&s, &id).await, 0);
        assert_eq!(refs(&s, b"a part finished late").await, 0);
    }

    /// Parts left behind by an upload's removal (a crash between the two)
    /// are released by the expiry pass.
    #[tokio::test(flavor = "multi_thread")]
    async fn expiry_releases_parts_whose_upload_is_gone() {
        let (s, _dir) = store().await;
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        part(&s, &id, 1, b"left behind".to_vec()).await;
        s.catalog.delete_objects(UPLOADS, &[upload_key("files", &id)], &Precondition::default()).await.unwrap();
        assert_eq!((part_records(&s, &id).await, records_under(&s, "i/").await), (1, 1));
        assert!(in_progress(&s, "files").await.is_empty(), "an entry without its upload is not listed");
        assert_eq!(s.expire_uploads(now_millis() - 60_000).await.unwrap(), 0, "not old enough yet");
        assert_eq!((part_records(&s, &id).await, records_under(&s, "i/").await), (1, 1));
        assert_eq!(s.expire_uploads(now_millis() + 1).await.unwrap(), 0, "no upload to abort");
        assert_eq!((part_records(&s, &id).await, records_under(&s, "i/").await), (0, 0));
        assert_eq!(refs(&s, b"left behind").await, 0);
    }

    /// A batch naming a key, or a content, many times looks each up and
    /// holds it once, yet answers every key in order.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_batch_holds_each_object_and_content_once() {
        let (s, _dir) = store().await;
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let same = vec![3u8; MIN_PART_SIZE as usize];
        let mut parts = Vec::new();
        for n in 1..=3 {
            parts.push(part(&s, &id, n, same.clone()).await);
        }
        // Longer than a record keeps: "other" is read through its blob too.
        let tail = vec![4u8; BODY_IN_RECORD as usize + 1];
        parts.push(part(&s, &id, 4, tail.clone()).await);
        s.complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None))).await.unwrap();
        s.put("files", "other", body(tail), PutOptions::default()).await.unwrap();

        let keys: Vec<String> = ["k", "missing", "k", "other", "k"].map(String::from).into();
        let found = s.get_many("files", &keys).await.unwrap();
        assert_eq!(found.objects.len(), 3, "k, missing and other, once each");
        assert_eq!(found.blobs.len(), 2, "the repeated part and the tail, once each");
        let sizes: Vec<Option<(u64, Vec<u64>)>> =
            found.entries().map(|e| e.map(|(r, blobs)| (r.size, blobs.map(|b| b.size).collect()))).collect();
        let t = BODY_IN_RECORD + 1;
        let whole = (3 * MIN_PART_SIZE + t, vec![MIN_PART_SIZE, MIN_PART_SIZE, MIN_PART_SIZE, t]);
        assert_eq!(sizes, [Some(whole.clone()), None, Some(whole.clone()), Some((t, vec![t])), Some(whole)]);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_upload_whose_bucket_went_as_it_began_takes_no_parts() {
        let (s, _dir) = store().await;
        s.create_bucket("work", "", false).await.unwrap();
        let id = s.create_upload("work", "k", NewMetadata::default()).await.unwrap();
        // As a delete of the bucket that ran before the upload's record was
        // written, and so removed no upload.
        s.catalog.delete_bucket("work").await.unwrap();
        let r = s.upload_part("work", "k", &id, 1, body(b"held".to_vec()), PutOptions::default()).await;
        assert!(matches!(r, Err(StoreError::NoSuchBucket(_))), "{:?}", r.map(|_| ()));
        let digest = Digest(sha2::Sha256::digest(b"held").into());
        assert!(s.catalog.get_blob(&digest).await.unwrap().is_none(), "no bytes were kept for it");
    }

    /// The key limit is the client's keys': the records a store keeps of an
    /// upload's parts are named by the store, whatever the limit.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_short_key_limit_leaves_multipart_uploads_working() {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let config = StoreConfig { max_key_bytes: 8, ..StoreConfig::default() };
        let s = Store::open(catalog, Arc::new(MemoryEngine::new()), config).await.unwrap();
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let parts = vec![part(&s, &id, 1, b"under a short limit".to_vec()).await];
        s.complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None))).await.unwrap();
        assert_eq!(read(&s, "k").await, b"under a short limit");
        let long = s.create_upload("files", "longer-key", NewMetadata::default()).await;
        assert!(matches!(long, Err(StoreError::KeyTooLong(_))), "{long:?}");
        let put = s.put("files", "longer-key", body(b"x".to_vec()), PutOptions::default()).await;
        assert!(matches!(put, Err(StoreError::KeyTooLong(_))), "{:?}", put.map(|_| ()));
    }

    /// A store whose collector takes blobs as soon as nothing refers to them,
    /// with files/k of two parts: the record, and each part's bytes.
    async fn two_parts_collected_at_once() -> (Store, tempfile::TempDir, ObjectRecord, Vec<u8>, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(RocksCatalog::open(dir.path()).unwrap());
        let config = StoreConfig { gc_grace: std::time::Duration::ZERO, ..StoreConfig::default() };
        let s = Store::open(catalog, Arc::new(MemoryEngine::new()), config).await.unwrap();
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let (first, second) = (vec![1u8; MIN_PART_SIZE as usize], vec![2u8; 300_000]);
        let parts = vec![part(&s, &id, 1, first.clone()).await, part(&s, &id, 2, second.clone()).await];
        s.complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None))).await.unwrap();
        let record = s.head("files", "k").await.unwrap();
        (s, dir, record, first, second)
    }

    /// A download that outlives its object still gets every byte: the
    /// collector leaves the parts alone until the stream is dropped.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_in_progress_keeps_its_blobs_from_the_collector() {
        let (s, _dir, record, first, second) = two_parts_collected_at_once().await;
        let mut stream = s.read(&record, ByteRange::full(record.size)).await.unwrap();
        let mut got = stream.try_next().await.unwrap().unwrap().to_vec();
        s.delete("files", "k", &Precondition::default()).await.unwrap();
        s.gc().await.unwrap();
        while let Some(chunk) = stream.try_next().await.unwrap() {
            got.extend_from_slice(&chunk);
        }
        assert!(got == [first, second].concat(), "the whole body, after the delete and a collection");
        drop(stream);
        s.gc().await.unwrap();
        assert!(s.engine().list().await.unwrap().is_empty(), "collected once the read is over");
    }

    /// An answer in several ranges holds every blob of its object, not
    /// only the one its current range reads: a range of the first part
    /// read while the object is deleted and collected leaves the second
    /// part's bytes for the range after it.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_answer_in_ranges_holds_every_blob_of_its_object() {
        let (s, _dir, record, _, second) = two_parts_collected_at_once().await;
        let answer = s.holding_blobs_of(&record, Box::pin(futures::stream::empty())).await;
        s.delete("files", "k", &Precondition::default()).await.unwrap();
        s.gc().await.unwrap();
        let later = ByteRange { start: MIN_PART_SIZE, end: record.size };
        let rest: Vec<Bytes> = s.read(&record, later).await.unwrap().try_collect().await.unwrap();
        assert!(rest.concat() == second, "the later range, after the delete and a collection");
        drop(answer);
        s.gc().await.unwrap();
        assert!(s.engine().list().await.unwrap().is_empty(), "collected once the answer is over");
    }

    /// Complete and Abort racing on one upload: exactly one succeeds, and
    /// the object exists exactly when Complete did.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn complete_and_abort_racing_have_one_winner() {
        let (s, _dir) = store().await;
        let s = Arc::new(s);
        for round in 0..40 {
            let key = format!("race-{round}");
            let id = s.create_upload("files", &key, NewMetadata::default()).await.unwrap();
            let r = s.upload_part("files", &key, &id, 1, body(vec![round as u8; 100]), PutOptions::default());
            let parts = vec![(1, format!("\"{}\"", r.await.unwrap().etag))];
            let (a, b, k, i) = (s.clone(), s.clone(), key.clone(), id.clone());
            // The loser, either of them, finds no upload.
            let won = move |r: Result<()>| match r {
                Ok(()) => true,
                Err(StoreError::NoSuchUpload(_)) => false,
                Err(e) => panic!("round {round}: {e:?}"),
            };
            let complete = tokio::spawn(async move {
                a.complete_upload("files", &k, &i, &parts, Precondition::default(), Box::new(|_| Ok(None)))
                    .await
                    .map(drop)
            });
            let (k, i) = (key.clone(), id.clone());
            let abort = tokio::spawn(async move { b.abort_upload("files", &k, &i).await });
            let (completed, aborted) = (won(complete.await.unwrap()), won(abort.await.unwrap()));
            assert!(completed != aborted, "round {round}: completed {completed}, aborted {aborted}");
            assert_eq!(s.head("files", &key).await.is_ok(), completed, "round {round}");
        }
    }

    /// Completes of one upload at once (an SDK's retry while the first
    /// still runs) all answer the one object.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn completes_racing_answer_alike() {
        let (s, _dir) = store().await;
        let s = Arc::new(s);
        for round in 0..50 {
            let key = format!("twice-{round}");
            let id = s.create_upload("files", &key, NewMetadata::default()).await.unwrap();
            // Half of them complete with the first part, half with the
            // second: whichever wins, every answer is the object written.
            let mut lists = Vec::new();
            for (n, len) in [(1, 100), (2, 50)] {
                let r = s.upload_part("files", &key, &id, n, body(vec![round as u8; len]), PutOptions::default());
                lists.push(vec![(n, format!("\"{}\"", r.await.unwrap().etag))]);
            }
            let completes = (0..8).map(|i| {
                let (s, key, id, parts) = (s.clone(), key.clone(), id.clone(), lists[i % 2].clone());
                tokio::spawn(async move {
                    s.complete_upload("files", &key, &id, &parts, Precondition::default(), Box::new(|_| Ok(None)))
                        .await
                        .map(|r| r.etag)
                })
            });
            let etags: Vec<String> = futures::future::join_all(completes)
                .await
                .into_iter()
                .map(|r| r.unwrap().unwrap_or_else(|e| panic!("round {round}: {e}")))
                .collect();
            assert!(etags.iter().all(|e| *e == etags[0]), "round {round}: {etags:?}");
            assert_eq!(s.head("files", &key).await.unwrap().etag, etags[0], "round {round}");
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_copy_shares_the_blobs() {
        let (s, _dir) = store().await;
        s.put("files", "src", body(b"shared bytes".to_vec()), PutOptions::default()).await.unwrap();
        let src = s.head("files", "src").await.unwrap();
        let new = NewMetadata {
            content_type: Some("text/x".into()),
            metadata: vec![("a".into(), "b".into())],
            headers: vec![("content-language".into(), "de".into())],
        };
        let copy = s.copy(&src, "files", "dst", Some(new), Precondition::default()).await.unwrap();
        assert_eq!((copy.record.etag.as_str(), copy.record.content_type.as_str()), (src.etag.as_str(), "text/x"));
        assert_eq!(s.head("files", "dst").await.unwrap().header("content-language"), Some("de"));
        assert_eq!(read(&s, "dst").await, b"shared bytes");
        assert_eq!(s.catalog.get_blob(&src.sha256).await.unwrap().unwrap().refs, 2);
        assert_eq!(s.engine().list().await.unwrap().len(), 1, "no byte was copied");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn an_engine_that_cannot_read_fails_the_read_of_a_completed_upload_before_its_first_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (s, engine, _) = crate::store::model_tests::open_faulty(
            dir.path(),
            crate::engine::EngineKind::Hybrid,
            3,
            StoreConfig::default(),
        )
        .await;
        let id = s.create_upload("files", "k", NewMetadata::default()).await.unwrap();
        let first = vec![5u8; MIN_PART_SIZE as usize];
        let parts = vec![part(&s, &id, 1, first.clone()).await, part(&s, &id, 2, b"tail".to_vec()).await];
        s.complete_upload("files", "k", &id, &parts, Precondition::default(), Box::new(|_| Ok(None))).await.unwrap();
        assert_eq!(read(&s, "k").await, [first.as_slice(), b"tail"].concat());

        engine.reads.set(crate::engine::faulty::Trigger::Always);
        let record = s.head("files", "k").await.unwrap();
        let opened = s.read(&record, ByteRange::full(record.size)).await;
        assert!(opened.is_err(), "the read began although no part could be opened");
        // A range within the second part alone fails the same way.
        assert!(s.read(&record, ByteRange { start: MIN_PART_SIZE, end: record.size }).await.is_err());
    }
}
