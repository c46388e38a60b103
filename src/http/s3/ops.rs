//! The S3 operations depot answers, each a few store calls. Operations not
//! here get s3s's `NotImplemented` (501) error.

use std::sync::{Arc, Mutex};

use futures::StreamExt;
use percent_encoding::utf8_percent_encode;
use s3s::dto::*;
use s3s::{S3, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, s3_error};

use super::body::{self, Checked, Failure, declared};
use super::completion;
use super::to_s3;
use crate::catalog::{
    BucketRecord, CHECKSUM_HEADER_PREFIX, ListPage, ListQuery, ObjectRecord, Precondition, STORED_HEADERS, from_millis,
};
use crate::engine::ByteRange;
use crate::http::conditional::{self, Validators, Verdict};
use crate::http::may_use;
use crate::store::names::URL_PATH;
use crate::store::{LateHeaders, MAX_PART_NUMBER, NewMetadata, PartsPage, PutOptions, Store, StoreError, UploadQuery};

/// Keys per listing page at most, as S3 has it.
const MAX_KEYS: i32 = 1000;

pub struct DepotS3 {
    pub store: Arc<Store>,
}

fn ok<T>(output: T) -> S3Result<S3Response<T>> {
    Ok(S3Response::new(output))
}

/// An object's answer, with its SHA-256 as the native API gives it.
/// A GetObject or HeadObject answer, with the headers S3 has no field
/// for: the SHA-256, and those for the type served (`content_type`, which
/// a `response-content-type` may have changed).
fn object_response<T>(output: T, record: &ObjectRecord, content_type: &str) -> S3Result<S3Response<T>> {
    let mut r = S3Response::new(output);
    if let Ok(v) = http::HeaderValue::from_str(&record.sha256.to_hex()) {
        r.headers.insert("x-depot-sha256", v);
    }
    crate::http::object_safety(&mut r.headers, content_type);
    Ok(r)
}

fn etag(record: &ObjectRecord) -> ETag {
    ETag::Strong(record.etag.clone())
}

/// When an object was last modified, in whole seconds as S3 gives it:
/// Last-Modified has no milliseconds, and a listing that had them would
/// never equal the time a client took from a GET (`aws s3 sync
/// --exact-timestamps` would fetch every object every time).
fn modified(record: &ObjectRecord) -> Timestamp {
    Timestamp::from(from_millis(record.shown_modified() / 1000 * 1000))
}

fn metadata(record: &ObjectRecord) -> Option<Metadata> {
    (!record.metadata.is_empty()).then(|| record.metadata.iter().cloned().collect())
}

/// An answer of type `$ty` with the checksum `$c` in its five checksum
/// fields, besides the fields given.
macro_rules! with_checksum {
    ($c:expr, $ty:ident { $($field:ident $(: $value:expr)?),* $(,)? }) => {{
        let c: Checksum = $c;
        // CopyObjectResult is given every field, and needs no default.
        #[allow(clippy::needless_update)]
        let answer = $ty {
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_crc64nvme: c.checksum_crc64nvme,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            $($field $(: $value)?,)*
            ..Default::default()
        };
        answer
    }};
}

/// The object's checksum, and its type: of the whole body, or composite
/// (`<base64>-<parts>`: the checksum of its parts' checksums, see
/// [`completion`](super::completion)).
fn record_checksum(record: &ObjectRecord) -> (Checksum, Option<ChecksumType>) {
    match record.checksum() {
        Some((name, value)) => {
            let kind = if value.contains('-') { ChecksumType::COMPOSITE } else { ChecksumType::FULL_OBJECT };
            (body::from_header(name, value), Some(ChecksumType::from_static(kind)))
        }
        None => Default::default(),
    }
}

/// Whether `record` has a checksum of its whole body under the header
/// `name` (one of parts, `…-N`, is not of the whole).
fn has_checksum_in(record: &ObjectRecord, name: &str) -> bool {
    record.checksum().is_some_and(|(n, v)| n == name && !v.contains('-'))
}

/// [`record_checksum`] as GetObject and HeadObject answer it: only when
/// the request asks (`x-amz-checksum-mode: ENABLED`), and only with the
/// whole body, which a checksum of the whole cannot check a range of.
fn asked_checksum(record: &ObjectRecord, mode: Option<&ChecksumMode>, whole: bool) -> (Checksum, Option<ChecksumType>) {
    match mode {
        Some(m) if whole && m.as_str() == ChecksumMode::ENABLED => record_checksum(record),
        _ => Default::default(),
    }
}

/// User metadata in a stable order.
fn metadata_list(m: Option<Metadata>) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = m.unwrap_or_default().into_iter().collect();
    v.sort();
    v
}

/// What a writer says about its object besides the bytes: PutObject,
/// CopyObject (with REPLACE) and CreateMultipartUpload name these fields
/// alike.
macro_rules! about {
    ($input:expr) => {
        NewMetadata {
            content_type: $input.content_type.clone(),
            metadata: metadata_list($input.metadata.clone()),
            headers: stored_headers([
                $input.cache_control.clone(),
                $input.content_disposition.clone(),
                $input.content_encoding.as_deref().and_then(content_coding),
                $input.content_language.clone(),
                $input.expires.as_ref().map(http_date),
            ]),
        }
    };
}

/// The Content-Encoding to store for the body: the one given, less
/// `aws-chunked`, which names how the upload was framed (a signed or
/// checksummed stream, taken apart on arrival), not the body; `None` when
/// nothing else was given, as S3 has it.
fn content_coding(given: &str) -> Option<String> {
    let codings: Vec<&str> =
        given.split(',').map(str::trim).filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked")).collect();
    (!codings.is_empty()).then(|| codings.join(", "))
}

/// The given values of [`STORED_HEADERS`], in that order.
fn stored_headers(values: [Option<String>; STORED_HEADERS.len()]) -> Vec<(String, String)> {
    STORED_HEADERS.iter().zip(values).filter_map(|(name, value)| Some((name.to_string(), value?))).collect()
}

fn http_date(t: &Timestamp) -> String {
    let mut date = Vec::new();
    t.format(TimestampFormat::HttpDate, &mut date).expect("a timestamp formats as an HTTP date");
    String::from_utf8(date).expect("HTTP dates are ASCII")
}

/// The stored `Expires` of an object (an HTTP date, as stored).
fn expires(record: &ObjectRecord) -> Option<Timestamp> {
    record.header("expires").and_then(|v| Timestamp::parse(TimestampFormat::HttpDate, v).ok())
}

/// A stored header of the object, unless the request's `response-*`
/// parameter overrides it, as S3 lets presigned download links do.
fn stored(record: &ObjectRecord, name: &str, response: &Option<String>) -> Option<String> {
    response.clone().or_else(|| record.header(name).map(str::to_string))
}

/// The headers an object is served with, GET and HEAD alike: what is
/// stored, unless a `response-*` query parameter overrides it, as in S3
/// (presigned download links name the file this way).
struct Served {
    content_type: String,
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<Timestamp>,
}

/// GetObject's or HeadObject's answer: the fields both give, for `record`
/// served as `served` says, and those `$ty` names of its own.
macro_rules! object_answer {
    (
        $ty:ident { $($field:ident: $value:expr),* },
        ($record:expr, $served:expr, $range:expr, $content_range:expr),
        ($checksum:expr, $kind:expr, $parts_count:expr)
    ) => {{
        let (record, served): (&ObjectRecord, &Served) = ($record, &$served);
        with_checksum!(
            $checksum,
            $ty {
                $($field: $value,)*
                content_length: Some($range.len() as i64),
                content_range: $content_range,
                accept_ranges: Some("bytes".into()),
                content_type: Some(served.content_type.clone()),
                cache_control: served.cache_control.clone(),
                content_disposition: served.content_disposition.clone(),
                content_encoding: served.content_encoding.clone(),
                content_language: served.content_language.clone(),
                expires: served.expires.clone(),
                e_tag: Some(etag(record)),
                last_modified: Some(modified(record)),
                metadata: metadata(record),
                checksum_type: $kind,
                parts_count: $parts_count,
            }
        )
    }};
}

/// [`Served`] for a GetObject or HeadObject request. As S3: an unsigned
/// request may not change how the object is served, beyond naming the file
/// it downloads to (a type of its choosing would make any public object a
/// page of this origin).
macro_rules! served {
    ($req:expr, $record:expr) => {{
        let (input, record) = (&$req.input, $record);
        let restyled = input.response_content_type.is_some()
            || input.response_cache_control.is_some()
            || input.response_content_encoding.is_some()
            || input.response_content_language.is_some()
            || input.response_expires.is_some();
        if $req.credentials.is_none() && restyled {
            return Err(s3_error!(
                InvalidRequest,
                "request specific response headers other than response-content-disposition cannot be used for anonymous GET requests"
            ));
        }
        Served {
            content_type: input.response_content_type.clone().unwrap_or_else(|| record.content_type.clone()),
            cache_control: stored(record, "cache-control", &input.response_cache_control),
            content_disposition: stored(record, "content-disposition", &input.response_content_disposition),
            content_encoding: stored(record, "content-encoding", &input.response_content_encoding),
            content_language: stored(record, "content-language", &input.response_content_language),
            expires: input.response_expires.clone().or_else(|| expires(record)),
        }
    }};
}

fn caller<T>(req: &S3Request<T>) -> String {
    req.credentials.as_ref().map(|c| c.access_key.clone()).unwrap_or_default()
}

/// The conditional request headers checked against an object.
fn check_conditions<T>(req: &S3Request<T>, record: &ObjectRecord) -> S3Result<()> {
    let current = Validators::of(record);
    match conditional::evaluate(&req.method, &req.headers, Some(current)) {
        Verdict::Proceed => Ok(()),
        Verdict::NotModified => {
            // A 304 carries what the 200 would have for caches to update
            // (RFC 9110 section 15.4.5): the validators, Cache-Control and
            // Expires.
            let mut e = S3Error::new(S3ErrorCode::NotModified);
            let mut headers = http::HeaderMap::new();
            crate::http::native::validator_headers(&mut headers, record);
            e.set_headers(headers);
            Err(e)
        }
        Verdict::Failed => Err(s3_error!(PreconditionFailed, "a condition of the request does not hold")),
    }
}

/// The conditions on a copy source (`x-amz-copy-source-if-*`), evaluated
/// as the same conditions on a GET of the source would be; where that GET
/// would answer 304 or 412, the copy is refused with 412, as S3 does.
fn check_copy_source<T>(req: &S3Request<T>, source: &ObjectRecord) -> S3Result<()> {
    use http::header;
    let mut conditions = http::HeaderMap::new();
    for (name, as_get) in [
        ("x-amz-copy-source-if-match", header::IF_MATCH),
        ("x-amz-copy-source-if-none-match", header::IF_NONE_MATCH),
        ("x-amz-copy-source-if-modified-since", header::IF_MODIFIED_SINCE),
        ("x-amz-copy-source-if-unmodified-since", header::IF_UNMODIFIED_SINCE),
    ] {
        for v in req.headers.get_all(name) {
            conditions.append(as_get.clone(), v.clone());
        }
    }
    let current = Validators::of(source);
    match conditional::evaluate(&http::Method::GET, &conditions, Some(current)) {
        Verdict::Proceed => Ok(()),
        Verdict::NotModified | Verdict::Failed => {
            Err(s3_error!(PreconditionFailed, "a condition on the copy source does not hold"))
        }
    }
}

/// The Range of a request, unless an `If-Range` says the client's part is
/// of another version: then the whole object (RFC 9110 section 13.1.5),
/// so a resumed download never mixes two.
fn ranged<'a, T>(req: &S3Request<T>, range: Option<&'a Range>, record: &ObjectRecord) -> Option<&'a Range> {
    range.filter(|_| conditional::if_range_holds(&req.headers, Validators::of(record)))
}

/// The bytes a Range asks for, and their Content-Range; all of them
/// without one.
fn resolve_range(range: Option<&Range>, record: &ObjectRecord) -> S3Result<(ByteRange, Option<String>)> {
    let Some(r) = range else { return Ok((ByteRange::full(record.size), None)) };
    let within = r
        .check(record.size)
        .ok()
        .filter(|w| w.start < w.end)
        .ok_or_else(|| s3_error!(InvalidRange, "the range is not within the object's {} bytes", record.size))?;
    let content_range = format!("bytes {}-{}/{}", within.start, within.end - 1, record.size);
    Ok((ByteRange { start: within.start, end: within.end }, Some(content_range)))
}

/// The bytes a GetObject or HeadObject asks for: a Range (see [`ranged`]),
/// or one uploaded part by its number, as S3 serves it (an object not made
/// of parts is its one part); all of them for neither. With them, their
/// Content-Range, and for a part the object's number of parts.
fn requested_bytes<T>(
    req: &S3Request<T>,
    range: Option<&Range>,
    part_number: Option<i32>,
    record: &ObjectRecord,
) -> S3Result<(ByteRange, Option<String>, Option<i32>)> {
    let Some(n) = part_number else {
        let (bytes, content_range) = resolve_range(ranged(req, range, record), record)?;
        return Ok((bytes, content_range, None));
    };
    if range.is_some() {
        return Err(s3_error!(InvalidRequest, "Cannot specify both Range header and partNumber query parameter"));
    }
    checked_part_number(n)?;
    let count = uploaded_parts(record);
    let sizes = count.clone().unwrap_or_else(|| vec![record.size]);
    let Some(size) = sizes.get(n as usize - 1) else {
        let mut e = S3Error::with_message(
            S3ErrorCode::Custom("InvalidPartNumber".into()),
            "The requested partnumber is not satisfiable",
        );
        e.set_status_code(http::StatusCode::RANGE_NOT_SATISFIABLE);
        return Err(e);
    };
    let start: u64 = sizes[..n as usize - 1].iter().sum();
    let bytes = ByteRange { start, end: start + size };
    let content_range = (!bytes.is_empty()).then(|| format!("bytes {}-{}/{}", start, bytes.end - 1, record.size));
    Ok((bytes, content_range, count.map(|_| sizes.len() as i32)))
}

/// The sizes of the parts an object was completed from, if it was. Each
/// uploaded part is one blob of the object's body: an ETag ending in `-N`
/// names an object completed from N of them.
fn uploaded_parts(record: &ObjectRecord) -> Option<Vec<u64>> {
    let count = record.etag.rsplit_once('-').and_then(|(_, n)| n.parse::<usize>().ok())?;
    (count == record.parts.len()).then(|| record.parts.iter().map(|p| p.size).collect())
}

/// The attributes GetObjectAttributes answers, as S3 names them.
const ATTRIBUTES: [&str; 5] = [
    ObjectAttributes::CHECKSUM,
    ObjectAttributes::ETAG,
    ObjectAttributes::OBJECT_PARTS,
    ObjectAttributes::OBJECT_SIZE,
    ObjectAttributes::STORAGE_CLASS,
];

/// GetObjectAttributes' page of the parts an object was completed from:
/// their numbers and sizes (the parts' own checksums are not kept once
/// the object is complete; the object's is).
fn parts_page(
    record: &ObjectRecord,
    max: Option<i32>,
    marker: Option<i32>,
) -> S3Result<Option<GetObjectAttributesParts>> {
    let Some(sizes) = uploaded_parts(record) else {
        return Ok(None);
    };
    let max = page_size(max)?;
    let after =
        usize::try_from(marker.unwrap_or(0)).map_err(|_| bad_argument("the part number marker is negative".into()))?;
    let parts: Vec<ObjectPart> = (after + 1..=sizes.len())
        .take(max)
        .map(|n| ObjectPart { part_number: Some(n as i32), size: Some(sizes[n - 1] as i64), ..Default::default() })
        .collect();
    let last = parts.last().and_then(|p| p.part_number);
    let truncated = last.is_some_and(|n| (n as usize) < sizes.len());
    Ok(Some(GetObjectAttributesParts {
        total_parts_count: Some(sizes.len() as i32),
        part_number_marker: Some(after as i32),
        next_part_number_marker: last,
        max_parts: Some(max as i32),
        is_truncated: Some(truncated),
        parts: Some(parts),
    }))
}

/// Buckets are not versioned: the one version of an object is `null`, as
/// S3 names it in an unversioned bucket.
fn check_version(version_id: Option<&str>) -> S3Result<()> {
    match version_id {
        None | Some("null") => Ok(()),
        Some(other) => Err(bad_argument(format!("invalid version id {other:?}: buckets are not versioned"))),
    }
}

/// Where a completed object is, as S3 answers: an absolute URL, with the
/// host and path the request came with (encoded as the client sent them).
fn location(headers: &http::HeaderMap, uri: &http::Uri) -> String {
    let scheme = match headers.get("x-forwarded-proto").map(http::HeaderValue::as_bytes) {
        Some(b"https") => "https",
        _ => "http",
    };
    let host = headers.get(http::header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("localhost");
    format!("{scheme}://{host}{}", uri.path())
}

/// A DeleteObjects entry: its key and the version it names.
type Entry = (String, Option<String>);

/// One entry's error in a DeleteObjects answer.
fn key_error((key, version_id): Entry, e: &S3Error) -> Error {
    Error {
        code: Some(e.code().as_str().to_string()),
        message: e.message().map(str::to_string),
        key: Some(key),
        version_id,
    }
}

/// A DeleteObjects answer as it is made.
struct Deletes<'a> {
    store: &'a Store,
    bucket: &'a str,
    /// Entries without a condition, waiting to be deleted together.
    run: Vec<Entry>,
    deleted: Vec<DeletedObject>,
    errors: Vec<Error>,
}

impl<'a> Deletes<'a> {
    fn new(store: &'a Store, bucket: &'a str) -> Deletes<'a> {
        Deletes { store, bucket, run: Vec::new(), deleted: Vec::new(), errors: Vec::new() }
    }

    /// Deletes the run of unconditional entries in one transaction. Keys
    /// that are not there count as deleted, as in S3.
    async fn delete_run(&mut self) -> S3Result<()> {
        let run = std::mem::take(&mut self.run);
        if run.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = run.iter().map(|(key, _)| key.clone()).collect();
        match self.store.delete_many(self.bucket, &keys).await {
            Ok(_) => self.deleted.extend(run.into_iter().map(deleted_object)),
            Err(e @ StoreError::NoSuchBucket(_)) => return Err(to_s3(e)),
            Err(e) => {
                let e = to_s3(e);
                self.errors.extend(run.into_iter().map(|entry| key_error(entry, &e)));
            }
        }
        Ok(())
    }

    /// Deletes an entry's object if its ETag is one of `tags`; one that is
    /// gone is `NoSuchKey`, as S3 says.
    async fn delete_if(&mut self, entry: Entry, tags: Vec<String>) -> S3Result<()> {
        let condition = Precondition { if_match: Some(tags), ..Default::default() };
        match self.store.delete(self.bucket, &entry.0, &condition).await {
            Ok(_) => self.deleted.push(deleted_object(entry)),
            Err(e @ StoreError::NoSuchBucket(_)) => return Err(to_s3(e)),
            Err(e) => self.errors.push(key_error(entry, &to_s3(e))),
        }
        Ok(())
    }
}

fn deleted_object((key, version_id): Entry) -> DeletedObject {
    DeletedObject { key: Some(key), version_id, ..Default::default() }
}

/// A part number from 1 to [`MAX_PART_NUMBER`], else `InvalidArgument`
/// as S3 answers.
fn checked_part_number(n: i32) -> S3Result<u32> {
    u32::try_from(n).ok().filter(|n| (1..=MAX_PART_NUMBER).contains(n)).ok_or_else(|| {
        bad_argument(format!("Part number must be an integer between 1 and {MAX_PART_NUMBER}, inclusive"))
    })
}

fn bad_argument(message: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, message)
}

/// The bytes `x-amz-copy-source-range` names in a source of `size` bytes.
/// S3 answers a malformed range and one past the source alike, with 400
/// InvalidArgument rather than a read's 416.
fn copy_source_range(text: &str, size: u64) -> S3Result<ByteRange> {
    let (start, end) = text
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok()?)))
        .filter(|(a, b)| a <= b)
        .ok_or_else(|| {
            bad_argument(format!(
                "x-amz-copy-source-range {text:?} must be of the form bytes=first-last, \
                 the zero-based offsets of the first and last bytes to copy"
            ))
        })?;
    if end >= size {
        return Err(bad_argument(format!("Range specified is not valid for source object of size: {size}")));
    }
    Ok(ByteRange { start, end: end + 1 })
}

/// A page size from `max-keys` and the like.
fn page_size(max: Option<i32>) -> S3Result<usize> {
    match max {
        None => Ok(MAX_KEYS as usize),
        Some(n) if n < 0 => Err(bad_argument(format!("the page size {n} is negative"))),
        Some(n) => Ok(n.min(MAX_KEYS) as usize),
    }
}

/// A listing's delimiter: any string, as in S3; an empty one is none.
fn delimiter(d: Option<&str>) -> Option<String> {
    d.filter(|d| !d.is_empty()).map(str::to_string)
}

/// The catalog query of a listing request.
fn list_query(
    prefix: Option<&str>,
    after: Option<String>,
    delim: Option<&str>,
    max: Option<i32>,
) -> S3Result<ListQuery> {
    Ok(ListQuery {
        prefix: prefix.unwrap_or_default().to_string(),
        after: after.filter(|a| !a.is_empty()),
        delimiter: delimiter(delim),
        limit: page_size(max)?,
    })
}

/// Keys and prefixes as a listing answers them: URL-encoded on request.
struct Encoder(bool);

impl Encoder {
    fn new(encoding: Option<&EncodingType>) -> S3Result<Encoder> {
        match encoding.map(|e| e.as_str()) {
            None => Ok(Encoder(false)),
            Some("url") => Ok(Encoder(true)),
            Some(other) => Err(bad_argument(format!("encoding-type {other:?}: only \"url\" is supported"))),
        }
    }

    fn text(&self, s: &str) -> String {
        if self.0 { utf8_percent_encode(s, URL_PATH).to_string() } else { s.to_string() }
    }

    /// The page's objects, each with `owner` where the listing names it.
    fn objects(&self, page: &ListPage, owner: Option<&Owner>) -> Vec<Object> {
        page.objects
            .iter()
            .map(|r| Object {
                key: Some(self.text(&r.key)),
                size: Some(r.size as i64),
                e_tag: Some(etag(r)),
                last_modified: Some(modified(r)),
                storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
                owner: owner.cloned(),
                ..Default::default()
            })
            .collect()
    }

    fn prefixes(&self, page: &ListPage) -> Option<Vec<CommonPrefix>> {
        (!page.prefixes.is_empty())
            .then(|| page.prefixes.iter().map(|p| CommonPrefix { prefix: Some(self.text(p)) }).collect())
    }
}

impl DepotS3 {
    /// One listing page; an empty one when `limit` is 0.
    async fn list(&self, bucket: &str, query: ListQuery) -> S3Result<ListPage> {
        if query.limit == 0 {
            self.store.bucket(bucket).await.map_err(to_s3)?;
            return Ok(ListPage::default());
        }
        self.store.list(bucket, &query).await.map_err(to_s3)
    }

    /// The owner of a bucket's objects and uploads, as listings name it:
    /// the bucket's.
    async fn bucket_owner(&self, bucket: &str) -> S3Result<Owner> {
        Ok(owner(&self.store.bucket(bucket).await.map_err(to_s3)?.owner))
    }

    /// The record of a copy source the caller may read.
    async fn copy_source(&self, source: &CopySource, caller: &str) -> S3Result<ObjectRecord> {
        let CopySource::Bucket { bucket, key, version_id } = source else {
            return Err(s3_error!(NotImplemented, "copying from access points is not supported"));
        };
        check_version(version_id.as_deref())?;
        let b = self.store.bucket(bucket).await.map_err(to_s3)?;
        if !(b.public_read || may_use(&b, caller)) {
            return Err(s3_error!(AccessDenied, "the source bucket belongs to another access key"));
        }
        self.store.head(bucket, key).await.map_err(to_s3)
    }

    /// `source` with a checksum of its whole body in `algorithm`, as S3
    /// gives a copy that asks for one: its own, or computed from its bytes.
    async fn checksummed(&self, mut source: ObjectRecord, algorithm: &ChecksumAlgorithm) -> S3Result<ObjectRecord> {
        let name = completion::header_for(algorithm.as_str())?;
        if has_checksum_in(&source, name) {
            return Ok(source);
        }
        let body = self.store.read(&source, ByteRange::full(source.size)).await.map_err(to_s3)?;
        let mut hashed = body::Hashed::new(body, Some(name));
        while let Some(chunk) = hashed.next().await {
            chunk.map_err(|e| to_s3(e.into()))?;
            // Chunks in the page cache come at once: without this, hashing
            // a large source would hold up every connection of the thread.
            tokio::task::consume_budget().await;
        }
        let value = taken(&hashed.computed).and_then(|c| body::field(&c, name)).expect("the stream ended");
        source.headers.retain(|(n, _)| !n.starts_with(CHECKSUM_HEADER_PREFIX));
        source.headers.push((name.to_string(), value));
        Ok(source)
    }
}

/// Streams an upload body into `write`, checking the checksums it declares
/// (`values`, and trailers); an error the body met (a bad chunk signature,
/// a checksum mismatch) is the answer, rather than what the store made of
/// it. With `algorithm` (a multipart upload's), a body that declares a
/// checksum in another is refused, as S3 refuses it.
async fn upload<T, R, F, Fut>(
    req: &S3Request<T>,
    body: Option<StreamingBlob>,
    values: &Checksum,
    algorithm: Option<&str>,
    opts: PutOptions,
    write: F,
) -> S3Result<(R, Option<Checksum>)>
where
    F: FnOnce(Checked, PutOptions) -> Fut,
    Fut: std::future::Future<Output = Result<R, StoreError>>,
{
    let body = body.unwrap_or_else(|| StreamingBlob::from(s3s::Body::empty()));
    let len = s3s::stream::ByteStream::remaining_length(&body).exact().map(|n| n as u64);
    let failure = Failure::default();
    let checked = Checked::new(body, values, &req.headers, req.trailing_headers.clone(), failure.clone())?;
    if let (Some(expected), Some(declared)) = (algorithm, checked.algorithm())
        && expected != declared
    {
        return Err(s3_error!(
            InvalidRequest,
            "the part declares {declared}, but the upload's checksums are {expected}: each part must declare its \
             upload's algorithm"
        ));
    }
    let computed = checked.computed.clone();
    // The declared checksum, verified, is stored with the object.
    let opts = PutOptions { content_length: len, late_headers: Some(kept(&computed)), ..opts };
    match write(checked, opts).await {
        Ok(r) => Ok((r, taken(&computed))),
        Err(e) => Err(failure.take().unwrap_or_else(|| to_s3(e))),
    }
}

/// The checksum a body computes, once it has ended, as headers to store.
fn kept(computed: &Arc<Mutex<Option<Checksum>>>) -> LateHeaders {
    let computed = computed.clone();
    LateHeaders(Arc::new(move || {
        computed.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(body::headers_of).unwrap_or_default()
    }))
}

fn taken(computed: &Mutex<Option<Checksum>>) -> Option<Checksum> {
    computed.lock().unwrap_or_else(|p| p.into_inner()).take()
}

fn content_md5(value: Option<&str>) -> S3Result<Option<[u8; 16]>> {
    value.map(crate::http::content_md5).transpose().map_err(super::api_to_s3)
}

/// The owner an access key is shown as: an opaque id, as S3's canonical
/// user ids are, since anyone may list a public-read bucket and see its
/// owner. The same key always gives the same id.
fn owner(access_key: &str) -> Owner {
    Owner { id: Some(owner_id(access_key)), display_name: None }
}

fn owner_id(access_key: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::new().chain_update(b"depot owner\0").chain_update(access_key).finalize())
}

/// Who began an upload, as listings of uploads name it: the bucket's
/// owner, in whose name every upload into it is kept.
fn initiator(owner: &Owner) -> Initiator {
    Initiator { id: owner.id.clone(), display_name: owner.display_name.clone() }
}

/// Whether a canned ACL makes a bucket public-read; other ACLs are refused.
fn public_acl(acl: Option<&BucketCannedACL>) -> S3Result<Option<bool>> {
    match acl.map(|a| a.as_str()) {
        None => Ok(None),
        Some(BucketCannedACL::PRIVATE) => Ok(Some(false)),
        Some(BucketCannedACL::PUBLIC_READ) => Ok(Some(true)),
        Some(other) => Err(s3_error!(NotImplemented, "the ACL {other:?} is not supported: use private or public-read")),
    }
}

/// Refuses grants (`x-amz-grant-*`): only canned ACLs are kept, and a grant
/// dropped must not look given.
fn no_grants(grants: [&Option<String>; 5]) -> S3Result<()> {
    if grants.iter().any(|g| g.is_some()) {
        return Err(s3_error!(
            NotImplemented,
            "ACL grants (x-amz-grant-*) are not supported: use x-amz-acl: private or public-read"
        ));
    }
    Ok(())
}

/// Whether an ACL document is one of the canned ACLs depot keeps, as
/// s3cmd's `setacl` sends them: the owner's full control, and anyone's
/// read for public-read. `None` for any other.
fn canned_policy(policy: &AccessControlPolicy, owner: &str) -> Option<bool> {
    const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
    let owner = owner_id(owner);
    let (mut owner_controls, mut public) = (false, false);
    for grant in policy.grants.iter().flatten() {
        let (Some(grantee), Some(permission)) = (&grant.grantee, &grant.permission) else {
            return None;
        };
        match (grantee.type_.as_str(), permission.as_str()) {
            (Type::CANONICAL_USER, Permission::FULL_CONTROL) if grantee.id.as_deref() == Some(owner.as_str()) => {
                owner_controls = true
            }
            (Type::GROUP, Permission::READ) if grantee.uri.as_deref() == Some(ALL_USERS) => public = true,
            _ => return None,
        }
    }
    owner_controls.then_some(public)
}

/// What a write may ask that depot does not do, refused rather than
/// dropped, so no client believes an object tagged, encrypted, locked,
/// granted to others or archived when it is not. PutObject, CopyObject and
/// CreateMultipartUpload name these fields alike.
macro_rules! refuse_unsupported {
    ($input:expr) => {
        refuse_unsupported(
            [
                ("object tagging (x-amz-tagging)", $input.tagging.is_some()),
                (
                    "server-side encryption",
                    $input.server_side_encryption.is_some()
                        || $input.ssekms_key_id.is_some()
                        || $input.ssekms_encryption_context.is_some()
                        || $input.sse_customer_algorithm.is_some()
                        || $input.sse_customer_key.is_some(),
                ),
                (
                    "object lock",
                    $input.object_lock_mode.is_some()
                        || $input.object_lock_retain_until_date.is_some()
                        || $input.object_lock_legal_hold_status.is_some(),
                ),
                (
                    "x-amz-grant-* (objects take their bucket's access)",
                    $input.grant_full_control.is_some()
                        || $input.grant_read.is_some()
                        || $input.grant_read_acp.is_some()
                        || $input.grant_write_acp.is_some(),
                ),
                ("website redirects (x-amz-website-redirect-location)", $input.website_redirect_location.is_some()),
            ],
            $input.storage_class.as_ref(),
        )
    };
}

fn refuse_unsupported(asked: [(&str, bool); 5], class: Option<&StorageClass>) -> S3Result<()> {
    if let Some((what, _)) = asked.iter().find(|(_, given)| *given) {
        return Err(s3_error!(NotImplemented, "{what} is not supported"));
    }
    match class.map(StorageClass::as_str) {
        None | Some(StorageClass::STANDARD | StorageClass::REDUCED_REDUNDANCY) => Ok(()),
        Some(other) => Err(s3_error!(
            InvalidStorageClass,
            "objects are stored in one class, STANDARD: storage class {other:?} is not offered"
        )),
    }
}

/// Objects have no ACL of their own: they are as public as their bucket. A
/// canned ACL that says otherwise is refused rather than ignored, so an
/// object asked to be private is never left public.
fn check_object_acl(acl: Option<&ObjectCannedACL>, bucket: &BucketRecord) -> S3Result<()> {
    let Some(acl) = acl.map(|a| a.as_str()) else { return Ok(()) };
    let private =
        [ObjectCannedACL::PRIVATE, ObjectCannedACL::BUCKET_OWNER_READ, ObjectCannedACL::BUCKET_OWNER_FULL_CONTROL];
    let holds = match bucket.public_read {
        false => private.contains(&acl),
        true => acl == ObjectCannedACL::PUBLIC_READ,
    };
    if holds {
        return Ok(());
    }
    let access = if bucket.public_read { "public-read" } else { "private" };
    Err(s3_error!(
        NotImplemented,
        "objects take their bucket's access, and the bucket {:?} is {access}: x-amz-acl: {acl} cannot be given",
        bucket.name
    ))
}

impl DepotS3 {
    /// [`check_object_acl`] against the bucket as stored.
    async fn check_object_acl(&self, acl: Option<&ObjectCannedACL>, bucket: &str) -> S3Result<()> {
        if acl.is_none() {
            return Ok(());
        }
        check_object_acl(acl, &self.store.bucket(bucket).await.map_err(to_s3)?)
    }
}

#[async_trait::async_trait]
impl S3 for DepotS3 {
    // ----- buckets -----

    async fn list_buckets(&self, req: S3Request<ListBucketsInput>) -> S3Result<S3Response<ListBucketsOutput>> {
        let me = caller(&req);
        let input = req.input;
        // Pages in name order, when asked for (`max-buckets`, 1 to 10,000);
        // the continuation token is the last name given.
        let max = match input.max_buckets {
            None => usize::MAX,
            Some(n @ 1..=10_000) => n as usize,
            Some(n) => return Err(bad_argument(format!("max-buckets {n} is not between 1 and 10000"))),
        };
        let prefix = input.prefix.clone().unwrap_or_default();
        let after = input.continuation_token.unwrap_or_default();
        let mut buckets: Vec<BucketRecord> = self
            .store
            .buckets()
            .await
            .map_err(to_s3)?
            .into_iter()
            .filter(|b| may_use(b, &me) && b.name.starts_with(&prefix) && b.name > after)
            .collect();
        buckets.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        let continuation_token = (buckets.len() > max).then(|| buckets[max - 1].name.clone());
        let buckets = buckets
            .into_iter()
            .take(max)
            .map(|b| Bucket {
                name: Some(b.name),
                creation_date: Some(Timestamp::from(from_millis(b.created))),
                ..Default::default()
            })
            .collect();
        ok(ListBucketsOutput {
            buckets: Some(buckets),
            owner: Some(owner(&me)),
            prefix: input.prefix,
            continuation_token,
        })
    }

    async fn create_bucket(&self, req: S3Request<CreateBucketInput>) -> S3Result<S3Response<CreateBucketOutput>> {
        let me = caller(&req);
        let i = &req.input;
        no_grants([&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write, &i.grant_write_acp])?;
        if i.object_lock_enabled_for_bucket == Some(true) {
            return Err(s3_error!(
                NotImplemented,
                "object lock is not supported: objects may always be overwritten and deleted"
            ));
        }
        let public = public_acl(req.input.acl.as_ref())?.unwrap_or(false);
        let bucket = &req.input.bucket;
        match self.store.create_bucket(bucket, &me, public).await {
            Ok(()) => ok(CreateBucketOutput { location: Some(format!("/{bucket}")) }),
            Err(StoreError::BucketExists(_)) => {
                let existing = self.store.bucket(bucket).await.map_err(to_s3)?;
                Err(if may_use(&existing, &me) {
                    s3_error!(BucketAlreadyOwnedByYou, "you already own the bucket {bucket:?}")
                } else {
                    s3_error!(BucketAlreadyExists, "the bucket {bucket:?} belongs to someone else")
                })
            }
            Err(e) => Err(to_s3(e)),
        }
    }

    async fn head_bucket(&self, req: S3Request<HeadBucketInput>) -> S3Result<S3Response<HeadBucketOutput>> {
        self.store.bucket(&req.input.bucket).await.map_err(to_s3)?;
        ok(HeadBucketOutput { bucket_region: Some("us-east-1".into()), ..Default::default() })
    }

    async fn delete_bucket(&self, req: S3Request<DeleteBucketInput>) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.store.delete_bucket(&req.input.bucket).await.map_err(to_s3)?;
        ok(DeleteBucketOutput::default())
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.store.bucket(&req.input.bucket).await.map_err(to_s3)?;
        // No constraint: us-east-1, where every client looks first.
        ok(GetBucketLocationOutput::default())
    }

    async fn put_bucket_acl(&self, req: S3Request<PutBucketAclInput>) -> S3Result<S3Response<PutBucketAclOutput>> {
        let i = &req.input;
        no_grants([&i.grant_full_control, &i.grant_read, &i.grant_read_acp, &i.grant_write, &i.grant_write_acp])?;
        let canned = match (public_acl(req.input.acl.as_ref())?, &req.input.access_control_policy) {
            (Some(public), _) => Some(public),
            (None, Some(policy)) => {
                canned_policy(policy, &self.store.bucket(&req.input.bucket).await.map_err(to_s3)?.owner)
            }
            (None, None) => None,
        };
        let Some(public) = canned else {
            return Err(s3_error!(
                NotImplemented,
                "only canned ACLs (x-amz-acl: private or public-read, or the documents GetBucketAcl gives for \
                 them) are supported"
            ));
        };
        self.store.set_bucket_public(&req.input.bucket, public).await.map_err(to_s3)?;
        ok(PutBucketAclOutput::default())
    }

    /// Buckets are unversioned, which S3 answers with an empty
    /// configuration (tools ask before they delete).
    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        self.store.bucket(&req.input.bucket).await.map_err(to_s3)?;
        ok(GetBucketVersioningOutput::default())
    }

    async fn get_bucket_acl(&self, req: S3Request<GetBucketAclInput>) -> S3Result<S3Response<GetBucketAclOutput>> {
        let b = self.store.bucket(&req.input.bucket).await.map_err(to_s3)?;
        let grant = |grantee: Grantee, permission: &'static str| Grant {
            grantee: Some(grantee),
            permission: Some(Permission::from_static(permission)),
        };
        let owner_grantee = Grantee {
            display_name: None,
            email_address: None,
            id: Some(owner_id(&b.owner)),
            type_: Type::from_static(Type::CANONICAL_USER),
            uri: None,
        };
        let mut grants = vec![grant(owner_grantee, Permission::FULL_CONTROL)];
        if b.public_read {
            let all = Grantee {
                display_name: None,
                email_address: None,
                id: None,
                type_: Type::from_static(Type::GROUP),
                uri: Some("http://acs.amazonaws.com/groups/global/AllUsers".into()),
            };
            grants.push(grant(all, Permission::READ));
        }
        ok(GetBucketAclOutput { grants: Some(grants), owner: Some(owner(&b.owner)) })
    }

    // ----- objects -----

    async fn put_object(&self, req: S3Request<PutObjectInput>) -> S3Result<S3Response<PutObjectOutput>> {
        let mut req = req;
        let body = req.input.body.take();
        let input = &req.input;
        let about = about!(input);
        // From the headers, as the native API reads them: every tag of a
        // list, If-None-Match's tags besides `*`, and If-Match's weak
        // tags, which never match (RFC 9110 section 13.1.1).
        let precondition = conditional::write_precondition(&req.headers);
        let if_match = precondition.if_match.is_some();
        let opts = PutOptions {
            content_type: about.content_type,
            expected_md5: content_md5(input.content_md5.as_deref())?,
            precondition,
            metadata: about.metadata,
            headers: about.headers,
            ..PutOptions::default()
        };
        let (bucket, key) = (input.bucket.clone(), input.key.clone());
        refuse_unsupported!(input)?;
        if input.write_offset_bytes.is_some() {
            // An append: taking the body as the whole object would lose
            // what the key holds.
            return Err(s3_error!(NotImplemented, "appends (x-amz-write-offset-bytes) are not supported"));
        }
        self.check_object_acl(input.acl.as_ref(), &bucket).await?;
        let store = &self.store;
        if if_match {
            // S3 answers If-Match on a missing key with NoSuchKey, not 412.
            store.head(&bucket, &key).await.map_err(to_s3)?;
        }
        let values = declared!(input);
        let (put, checksum) =
            upload(
                &req,
                body,
                &values,
                None,
                opts,
                |body, opts| async move { store.put(&bucket, &key, body, opts).await },
            )
            .await?;
        ok(with_checksum!(checksum.unwrap_or_default(), PutObjectOutput { e_tag: Some(etag(&put.record)) }))
    }

    async fn get_object(&self, req: S3Request<GetObjectInput>) -> S3Result<S3Response<GetObjectOutput>> {
        let input = &req.input;
        check_version(input.version_id.as_deref())?;
        let record = self.store.head(&input.bucket, &input.key).await.map_err(to_s3)?;
        let served = served!(req, &record);
        check_conditions(&req, &record)?;
        let (range, content_range, parts_count) =
            requested_bytes(&req, input.range.as_ref(), input.part_number, &record)?;
        let body = self.store.read_to_send(&record, range).await.map_err(to_s3)?;
        let (checksum, kind) = asked_checksum(&record, input.checksum_mode.as_ref(), content_range.is_none());
        let output = object_answer!(
            GetObjectOutput { body: Some(StreamingBlob::wrap(sync_wrapper::SyncStream::new(body))) },
            (&record, served, range, content_range),
            (checksum, kind, parts_count)
        );
        object_response(output, &record, &served.content_type)
    }

    async fn head_object(&self, req: S3Request<HeadObjectInput>) -> S3Result<S3Response<HeadObjectOutput>> {
        check_version(req.input.version_id.as_deref())?;
        let record = self.store.head(&req.input.bucket, &req.input.key).await.map_err(to_s3)?;
        let served = served!(req, &record);
        check_conditions(&req, &record)?;
        // As S3 does: a range changes the length given (and the status, to
        // 206: see `handle`), and one not within the object is a 416.
        let (range, content_range, parts_count) =
            requested_bytes(&req, req.input.range.as_ref(), req.input.part_number, &record)?;
        let (checksum, kind) = asked_checksum(&record, req.input.checksum_mode.as_ref(), content_range.is_none());
        let output =
            object_answer!(HeadObjectOutput {}, (&record, served, range, content_range), (checksum, kind, parts_count));
        object_response(output, &record, &served.content_type)
    }

    async fn get_object_attributes(
        &self,
        req: S3Request<GetObjectAttributesInput>,
    ) -> S3Result<S3Response<GetObjectAttributesOutput>> {
        let input = &req.input;
        check_version(input.version_id.as_deref())?;
        let record = self.store.head(&input.bucket, &input.key).await.map_err(to_s3)?;
        // One header, its names separated by commas, which the protocol
        // layer leaves as one.
        let names: Vec<&str> =
            input.object_attributes.iter().flat_map(|a| a.as_str().split(',')).map(str::trim).collect();
        if names.iter().all(|n| n.is_empty()) {
            return Err(s3_error!(InvalidRequest, "x-amz-object-attributes names no attribute"));
        }
        if let Some(unknown) = names.iter().find(|n| !ATTRIBUTES.contains(n)) {
            return Err(bad_argument(format!("Invalid attribute name specified: {unknown:?}")));
        }
        let asked = |attribute: &str| names.contains(&attribute);
        let checksum = match record_checksum(&record) {
            // A composite checksum is answered without its `-<parts>`, the
            // parts being counted in ObjectParts.
            (c, Some(kind)) if asked(ObjectAttributes::CHECKSUM) => {
                let value = |v: Option<String>| v.map(|v| v.split('-').next().unwrap_or_default().to_string());
                Some(Checksum {
                    checksum_crc32: value(c.checksum_crc32),
                    checksum_crc32c: value(c.checksum_crc32c),
                    checksum_crc64nvme: value(c.checksum_crc64nvme),
                    checksum_sha1: value(c.checksum_sha1),
                    checksum_sha256: value(c.checksum_sha256),
                    checksum_type: Some(kind),
                })
            }
            _ => None,
        };
        let object_parts = match asked(ObjectAttributes::OBJECT_PARTS) {
            true => parts_page(&record, input.max_parts, input.part_number_marker)?,
            false => None,
        };
        ok(GetObjectAttributesOutput {
            checksum,
            e_tag: asked(ObjectAttributes::ETAG).then(|| etag(&record)),
            last_modified: Some(modified(&record)),
            object_parts,
            object_size: asked(ObjectAttributes::OBJECT_SIZE).then_some(record.size as i64),
            storage_class: asked(ObjectAttributes::STORAGE_CLASS)
                .then(|| StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        })
    }

    async fn delete_object(&self, req: S3Request<DeleteObjectInput>) -> S3Result<S3Response<DeleteObjectOutput>> {
        let input = &req.input;
        if input.if_match_size.is_some() || input.if_match_last_modified_time.is_some() {
            return Err(s3_error!(NotImplemented, "deletes conditional on size or time are not supported"));
        }
        // S3 deletes on If-Match alone: the other conditions are for
        // writes (If-None-Match: * would refuse every delete of a key that
        // exists).
        let condition =
            Precondition { if_match: conditional::write_precondition(&req.headers).if_match, ..Default::default() };
        check_version(input.version_id.as_deref())?;
        match self.store.delete(&input.bucket, &input.key, &condition).await {
            // Deleting what is not there succeeds, as in S3, unless the
            // delete was conditional: then S3 says NoSuchKey.
            Ok(_) => ok(DeleteObjectOutput::default()),
            Err(StoreError::NoSuchKey(_)) if condition.if_match.is_none() => ok(DeleteObjectOutput::default()),
            Err(e) => Err(to_s3(e)),
        }
    }

    async fn delete_objects(&self, req: S3Request<DeleteObjectsInput>) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        let objects = input.delete.objects;
        if objects.len() > 1000 {
            return Err(s3_error!(MalformedXML, "at most 1000 keys may be deleted at once"));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let mut answer = Deletes::new(&self.store, &input.bucket);
        // In the document's order: entries without an ETag are deleted a run
        // at a time, in one transaction; one with an ETag alone, and only
        // if its object still has that ETag.
        for o in objects {
            let refused = if self.store.check_stored_key(&o.key).is_err() {
                Some(bad_argument("the key is empty, too long or contains NUL".into()))
            } else if o.size.is_some() || o.last_modified_time.is_some() {
                Some(s3_error!(NotImplemented, "deletes conditional on size or time are not supported"))
            } else {
                check_version(o.version_id.as_deref()).err()
            };
            let entry = (o.key, o.version_id);
            match (refused, o.e_tag) {
                (Some(e), _) => answer.errors.push(key_error(entry, &e)),
                (None, None) => answer.run.push(entry),
                (None, Some(tag)) => {
                    answer.delete_run().await?;
                    // Only a strong ETag can match, as for If-Match.
                    let tags = match tag {
                        ETag::Strong(t) => vec![t],
                        ETag::Weak(_) => Vec::new(),
                    };
                    answer.delete_if(entry, tags).await?;
                }
            }
        }
        answer.delete_run().await?;
        if quiet {
            answer.deleted.clear();
        }
        ok(DeleteObjectsOutput { deleted: Some(answer.deleted), errors: Some(answer.errors), ..Default::default() })
    }

    async fn copy_object(&self, req: S3Request<CopyObjectInput>) -> S3Result<S3Response<CopyObjectOutput>> {
        let me = caller(&req);
        let source = self.copy_source(&req.input.copy_source, &me).await?;
        check_copy_source(&req, &source)?;
        let input = &req.input;
        let replace = match input.metadata_directive.as_ref().map(|d| d.as_str()) {
            None | Some(MetadataDirective::COPY) => None,
            Some(MetadataDirective::REPLACE) => Some(about!(input)),
            Some(other) => return Err(bad_argument(format!("metadata directive {other:?} is not COPY or REPLACE"))),
        };
        // A checksum in an algorithm the source has none in is a change,
        // as S3 takes it: how an object is given a checksum in place.
        let new_checksum = match &input.checksum_algorithm {
            Some(algorithm) => !has_checksum_in(&source, completion::header_for(algorithm.as_str())?),
            None => false,
        };
        if let CopySource::Bucket { bucket, key, .. } = &input.copy_source
            && **bucket == *input.bucket
            && **key == *input.key
            && replace.is_none()
            && !new_checksum
        {
            return Err(s3_error!(
                InvalidRequest,
                "copying an object onto itself needs a change: send x-amz-metadata-directive: REPLACE, or \
                 x-amz-checksum-algorithm naming an algorithm the object has no checksum in"
            ));
        }
        refuse_unsupported!(input)?;
        self.check_object_acl(input.acl.as_ref(), &input.bucket).await?;
        let source = match &input.checksum_algorithm {
            Some(algorithm) => self.checksummed(source, algorithm).await?,
            None => source,
        };
        // The destination's conditions, as for PutObject.
        let condition = conditional::write_precondition(&req.headers);
        if condition.if_match.is_some() {
            self.store.head(&input.bucket, &input.key).await.map_err(to_s3)?;
        }
        let put = self.store.copy(&source, &input.bucket, &input.key, replace, condition).await.map_err(to_s3)?;
        ok(CopyObjectOutput {
            copy_object_result: Some({
                let (checksum, kind) = record_checksum(&put.record);
                with_checksum!(
                    checksum,
                    CopyObjectResult {
                        e_tag: Some(etag(&put.record)),
                        last_modified: Some(modified(&put.record)),
                        checksum_type: kind,
                    }
                )
            }),
            ..Default::default()
        })
    }

    // ----- listings -----

    async fn list_objects(&self, req: S3Request<ListObjectsInput>) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let encoder = Encoder::new(input.encoding_type.as_ref())?;
        let query =
            list_query(input.prefix.as_deref(), input.marker.clone(), input.delimiter.as_deref(), input.max_keys)?;
        let page = self.list(&input.bucket, query).await?;
        // Version 1 names each object's owner.
        let owner = self.bucket_owner(&input.bucket).await?;
        ok(ListObjectsOutput {
            name: Some(input.bucket),
            contents: Some(encoder.objects(&page, Some(&owner))),
            common_prefixes: encoder.prefixes(&page),
            is_truncated: Some(page.next.is_some()),
            next_marker: page.next.as_deref().map(|n| encoder.text(n)),
            prefix: input.prefix.map(|p| encoder.text(&p)),
            marker: input.marker.map(|m| encoder.text(&m)),
            delimiter: input.delimiter.map(|d| encoder.text(&d)),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS)),
            encoding_type: input.encoding_type,
            ..Default::default()
        })
    }

    async fn list_objects_v2(&self, req: S3Request<ListObjectsV2Input>) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let encoder = Encoder::new(input.encoding_type.as_ref())?;
        let after = match &input.continuation_token {
            Some(token) => Some(
                hex::decode(token)
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| bad_argument("the continuation token is not one this server gave".into()))?,
            ),
            None => input.start_after.clone(),
        };
        let query = list_query(input.prefix.as_deref(), after, input.delimiter.as_deref(), input.max_keys)?;
        let page = self.list(&input.bucket, query).await?;
        let owner = match input.fetch_owner {
            Some(true) => Some(self.bucket_owner(&input.bucket).await?),
            _ => None,
        };
        let contents = encoder.objects(&page, owner.as_ref());
        let common_prefixes = encoder.prefixes(&page);
        let key_count = contents.len() + common_prefixes.as_ref().map_or(0, Vec::len);
        ok(ListObjectsV2Output {
            name: Some(input.bucket),
            key_count: Some(key_count as i32),
            contents: Some(contents),
            common_prefixes,
            is_truncated: Some(page.next.is_some()),
            next_continuation_token: page.next.map(hex::encode),
            continuation_token: input.continuation_token,
            start_after: input.start_after.map(|s| encoder.text(&s)),
            prefix: input.prefix.map(|p| encoder.text(&p)),
            delimiter: input.delimiter.map(|d| encoder.text(&d)),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS)),
            encoding_type: input.encoding_type,
            ..Default::default()
        })
    }

    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let input = req.input;
        let encoder = Encoder::new(input.encoding_type.as_ref())?;
        let query =
            list_query(input.prefix.as_deref(), input.key_marker.clone(), input.delimiter.as_deref(), input.max_keys)?;
        let page = self.list(&input.bucket, query).await?;
        // An unversioned bucket: one version of each key, named "null".
        let versions = page
            .objects
            .iter()
            .map(|r| ObjectVersion {
                key: Some(encoder.text(&r.key)),
                version_id: Some("null".into()),
                is_latest: Some(true),
                size: Some(r.size as i64),
                e_tag: Some(etag(r)),
                last_modified: Some(modified(r)),
                storage_class: Some(ObjectVersionStorageClass::from_static(ObjectVersionStorageClass::STANDARD)),
                ..Default::default()
            })
            .collect();
        ok(ListObjectVersionsOutput {
            name: Some(input.bucket),
            versions: Some(versions),
            common_prefixes: encoder.prefixes(&page),
            is_truncated: Some(page.next.is_some()),
            next_key_marker: page.next.as_deref().map(|n| encoder.text(n)),
            next_version_id_marker: page.next.as_ref().map(|_| "null".into()),
            prefix: input.prefix.map(|p| encoder.text(&p)),
            key_marker: input.key_marker.map(|m| encoder.text(&m)),
            delimiter: input.delimiter.map(|d| encoder.text(&d)),
            max_keys: Some(input.max_keys.unwrap_or(MAX_KEYS)),
            encoding_type: input.encoding_type,
            ..Default::default()
        })
    }

    // ----- multipart uploads -----

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        refuse_unsupported!(input)?;
        self.check_object_acl(input.acl.as_ref(), &input.bucket).await?;
        let checksum = completion::chosen(&input)?;
        let (checksum_algorithm, checksum_type) = completion::of_upload(&checksum);
        let mut about = about!(input);
        about.headers.extend(checksum);
        let upload_id = self.store.create_upload(&input.bucket, &input.key, about).await.map_err(to_s3)?;
        ok(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(upload_id),
            checksum_algorithm,
            checksum_type,
            ..Default::default()
        })
    }

    async fn upload_part(&self, req: S3Request<UploadPartInput>) -> S3Result<S3Response<UploadPartOutput>> {
        let mut req = req;
        let body = req.input.body.take();
        let input = &req.input;
        let part = checked_part_number(input.part_number)?;
        let opts = PutOptions { expected_md5: content_md5(input.content_md5.as_deref())?, ..PutOptions::default() };
        let (bucket, key, id) = (input.bucket.clone(), input.key.clone(), input.upload_id.clone());
        let store = &self.store;
        let upload_record = store.upload(&bucket, &key, &id).await.map_err(to_s3)?;
        let algorithm = completion::part_algorithm(&upload_record.headers);
        let values = declared!(input);
        let (record, checksum) = upload(&req, body, &values, algorithm, opts, |body, opts| async move {
            store.upload_part(&bucket, &key, &id, part, body, opts).await
        })
        .await?;
        ok(with_checksum!(checksum.unwrap_or_default(), UploadPartOutput { e_tag: Some(etag(&record)) }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let me = caller(&req);
        let source = self.copy_source(&req.input.copy_source, &me).await?;
        check_copy_source(&req, &source)?;
        let input = req.input;
        let part = checked_part_number(input.part_number)?;
        let range = match &input.copy_source_range {
            None => ByteRange::full(source.size),
            Some(text) => copy_source_range(text, source.size)?,
        };
        // The part gets a checksum in the upload's algorithm, as an
        // uploaded part does, for ListParts and the Complete request.
        let (bucket, key, id) = (&input.bucket, &input.key, &input.upload_id);
        let upload = self.store.upload(bucket, key, id).await.map_err(to_s3)?;
        let algorithm = completion::part_algorithm(&upload.headers);
        let body = self.store.read(&source, range).await.map_err(to_s3)?;
        let body = body::Hashed::new(body, algorithm);
        let computed = body.computed.clone();
        let opts = PutOptions {
            content_length: Some(range.len()),
            late_headers: Some(kept(&computed)),
            ..PutOptions::default()
        };
        let record = self.store.upload_part(bucket, key, id, part, body, opts).await.map_err(to_s3)?;
        let checksum = taken(&computed).unwrap_or_default();
        ok(UploadPartCopyOutput {
            copy_part_result: Some(with_checksum!(
                checksum,
                CopyPartResult { e_tag: Some(etag(&record)), last_modified: Some(modified(&record)) }
            )),
            ..Default::default()
        })
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let condition = conditional::write_precondition(&req.headers);
        let location = location(&req.headers, &req.uri);
        let input = req.input;
        let mut parts = Vec::new();
        for p in input.multipart_upload.iter().flat_map(|m| m.parts.iter().flatten()) {
            let (Some(n), Some(tag)) = (p.part_number, p.e_tag.clone()) else {
                return Err(s3_error!(MalformedXML, "every part needs a PartNumber and an ETag"));
            };
            let n = checked_part_number(n)?;
            let tag = match tag {
                ETag::Strong(t) | ETag::Weak(t) => t,
            };
            parts.push((n, tag));
        }
        if parts.is_empty() {
            return Err(s3_error!(MalformedXML, "a multipart upload is completed with at least one part"));
        }
        if condition.if_match.is_some() {
            // As for PutObject: NoSuchKey, not 412. A retried Complete
            // finds the object its first attempt made.
            self.store.head(&input.bucket, &input.key).await.map_err(to_s3)?;
        }
        let record = self
            .store
            .complete_upload(
                &input.bucket,
                &input.key,
                &input.upload_id,
                &parts,
                condition,
                Box::new(|upload| completion::checks(&input, upload)),
            )
            .await
            .map_err(to_s3)?;
        let (checksum, checksum_type) = record_checksum(&record);
        ok(with_checksum!(
            checksum,
            CompleteMultipartUploadOutput {
                location: Some(location),
                bucket: Some(input.bucket),
                key: Some(input.key),
                e_tag: Some(etag(&record)),
                checksum_type,
            }
        ))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = &req.input;
        self.store.abort_upload(&input.bucket, &input.key, &input.upload_id).await.map_err(to_s3)?;
        ok(AbortMultipartUploadOutput::default())
    }

    async fn list_parts(&self, req: S3Request<ListPartsInput>) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let after = u32::try_from(input.part_number_marker.unwrap_or(0))
            .map_err(|_| bad_argument("the part number marker is negative".into()))?;
        let limit = page_size(input.max_parts)?;
        let PartsPage { upload, parts, truncated } =
            self.store.list_parts(&input.bucket, &input.key, &input.upload_id, after, limit).await.map_err(to_s3)?;
        let (checksum_algorithm, checksum_type) = completion::of_upload(&upload.headers);
        let owner = self.bucket_owner(&input.bucket).await?;
        let next = parts.last().map(|(n, _)| *n as i32);
        let parts = parts
            .into_iter()
            .map(|(n, r)| {
                with_checksum!(
                    record_checksum(&r).0,
                    Part {
                        part_number: Some(n as i32),
                        e_tag: Some(etag(&r)),
                        size: Some(r.size as i64),
                        last_modified: Some(modified(&r)),
                    }
                )
            })
            .collect();
        ok(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            parts: Some(parts),
            is_truncated: Some(truncated),
            next_part_number_marker: truncated.then_some(next).flatten(),
            part_number_marker: input.part_number_marker,
            max_parts: Some(limit as i32),
            checksum_algorithm,
            checksum_type,
            initiator: Some(initiator(&owner)),
            owner: Some(owner),
            ..Default::default()
        })
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = req.input;
        let encoder = Encoder::new(input.encoding_type.as_ref())?;
        let limit = page_size(input.max_uploads)?;
        let query = UploadQuery {
            key_marker: input.key_marker.clone().unwrap_or_default(),
            id_marker: input.upload_id_marker.clone().unwrap_or_default(),
            prefix: input.prefix.clone().unwrap_or_default(),
            delimiter: delimiter(input.delimiter.as_deref()),
            limit,
        };
        let page = self.store.list_uploads(&input.bucket, &query).await.map_err(to_s3)?;
        let owner = self.bucket_owner(&input.bucket).await?;
        let truncated = page.next.is_some();
        let (next_key_marker, next_upload_id_marker) = match page.next {
            Some((key, id)) => (Some(encoder.text(&key)), id),
            None => (None, None),
        };
        let common_prefixes = (!page.prefixes.is_empty())
            .then(|| page.prefixes.iter().map(|p| CommonPrefix { prefix: Some(encoder.text(p)) }).collect());
        let uploads = page
            .uploads
            .into_iter()
            .map(|u| {
                let (checksum_algorithm, checksum_type) = completion::of_upload(&u.headers);
                MultipartUpload {
                    key: Some(encoder.text(&u.key)),
                    upload_id: Some(u.upload_id),
                    initiated: Some(Timestamp::from(from_millis(u.initiated))),
                    storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                    checksum_algorithm,
                    checksum_type,
                    initiator: Some(initiator(&owner)),
                    owner: Some(owner.clone()),
                }
            })
            .collect();
        ok(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            uploads: Some(uploads),
            is_truncated: Some(truncated),
            next_key_marker,
            next_upload_id_marker,
            common_prefixes,
            delimiter: input.delimiter.map(|d| encoder.text(&d)),
            key_marker: input.key_marker.map(|k| encoder.text(&k)),
            upload_id_marker: input.upload_id_marker,
            prefix: input.prefix.map(|p| encoder.text(&p)),
            max_uploads: Some(limit as i32),
            encoding_type: input.encoding_type,
            ..Default::default()
        })
    }
}
