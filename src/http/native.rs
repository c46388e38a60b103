//! The native REST API: URLs parsed into an [`Endpoint`], then one handler
//! per kind of request.

use std::io::Write as _;
use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use http_body_util::BodyExt;
use percent_encoding::percent_decode_str;
use serde_json::json;

use super::conditional::{self, Validators, Verdict};
use super::error::ApiError;
use super::range::{self, RangeAnswer};
use super::{
    App, Caller, Request, Response, batch, content_length, content_md5, empty, json, listing, may_use, streamed,
};
use crate::catalog::{ObjectRecord, Part, STORED_HEADERS, from_millis};
use crate::engine::{ByteRange, Digest};
use crate::store::{PutOptions, StoreError};

/// What a request's path names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/`: the buckets.
    Root,
    Health,
    Metrics,
    Stats,
    BatchGet,
    BatchPut,
    BatchDelete,
    /// `/_/backup?dir=DIR`: a copy of the store written on the server.
    Backup,
    /// `/_/blobs/{sha256}`.
    Blob(String),
    /// `/{bucket}` or `/{bucket}/`.
    Bucket(String),
    /// `/{bucket}/{key}`; a key ending in `/` is a folder for GET and HEAD.
    Object {
        bucket: String,
        key: String,
    },
    /// Anything else under `/_/`.
    UnknownInternal,
}

fn decode(raw: &str, what: &str) -> Result<String, ApiError> {
    // A '%' not followed by two hexadecimal digits is no escape (RFC 3986
    // section 2.1); taken literally, it would make two spellings of a key.
    let b = raw.as_bytes();
    let bad_escape = b.iter().enumerate().any(|(i, c)| {
        *c == b'%'
            && !(b.get(i + 1).is_some_and(u8::is_ascii_hexdigit) && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if bad_escape {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "InvalidURI",
            format!("the {what} has a '%' that is not followed by two hexadecimal digits"),
        ));
    }
    percent_decode_str(raw).decode_utf8().map(|s| s.into_owned()).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "InvalidKey",
            format!("the {what} is not valid UTF-8 once percent-decoded"),
        )
    })
}

impl Endpoint {
    /// Parses a request path (without the query). Keys are percent-decoded
    /// and taken as they are: `..`, `//` and `\` are ordinary characters.
    pub fn parse(path: &str) -> Result<Endpoint, ApiError> {
        let rest = path.strip_prefix('/').ok_or_else(|| ApiError::bad_request("the path must start with '/'"))?;
        let (first, key) = match rest.split_once('/') {
            Some((b, k)) => (b, Some(k)),
            None => (rest, None),
        };
        if first == "_" {
            return Ok(match key.unwrap_or("") {
                "health" => Endpoint::Health,
                "metrics" => Endpoint::Metrics,
                "stats" => Endpoint::Stats,
                "batch/get" => Endpoint::BatchGet,
                "batch/put" => Endpoint::BatchPut,
                "batch/delete" => Endpoint::BatchDelete,
                "backup" => Endpoint::Backup,
                other => match other.strip_prefix("blobs/") {
                    Some(hex) => Endpoint::Blob(hex.to_string()),
                    None => Endpoint::UnknownInternal,
                },
            });
        }
        if first.is_empty() && key.is_none() {
            return Ok(Endpoint::Root);
        }
        let bucket = decode(first, "bucket name")?;
        match key {
            None | Some("") => Ok(Endpoint::Bucket(bucket)),
            Some(k) => Ok(Endpoint::Object { bucket, key: decode(k, "key")? }),
        }
    }
}

/// With several credentials, a bucket is its owner's (as on the S3 API),
/// and the routes that see past owners are the operator's (the first
/// credential): a blob by its address may be anyone's bytes, totals count
/// everyone's, and a backup copies every bucket to a path of the server's.
async fn check_access(app: &App, caller: &Caller, endpoint: &Endpoint, req: &Request) -> Result<(), ApiError> {
    if !app.several_accounts() {
        return Ok(());
    }
    let bucket = match endpoint {
        Endpoint::Bucket(b) | Endpoint::Object { bucket: b, .. } => b.clone(),
        Endpoint::BatchGet | Endpoint::BatchPut | Endpoint::BatchDelete => match query_value(&query(req), "bucket") {
            Some(b) => b.to_string(),
            None => return Ok(()),
        },
        Endpoint::Blob(_) | Endpoint::Stats | Endpoint::Metrics | Endpoint::Backup if caller.operator => {
            return Ok(());
        }
        Endpoint::Blob(_) | Endpoint::Stats | Endpoint::Metrics | Endpoint::Backup => {
            return Err(ApiError::access_denied(
                "this route sees every account's data: it is the operator's (the first credential)",
            ));
        }
        Endpoint::Root | Endpoint::Health | Endpoint::UnknownInternal => return Ok(()),
    };
    // Creating a bucket needs none to exist; everything else, one the
    // caller may use.
    if matches!(endpoint, Endpoint::Bucket(_)) && req.method() == Method::PUT {
        return Ok(());
    }
    // Anyone may read a public-read bucket, as anonymous callers may, a
    // key at a time or in a batch.
    let reads = (matches!(endpoint, Endpoint::Bucket(_) | Endpoint::Object { .. })
        && matches!(*req.method(), Method::GET | Method::HEAD))
        || matches!(endpoint, Endpoint::BatchGet);
    match app.store.bucket(&bucket).await {
        Ok(b) if !(may_use(&b, &caller.access_key) || (b.public_read && reads)) => {
            Err(ApiError::access_denied(format!("the bucket {bucket} belongs to another account")))
        }
        Ok(_) => Ok(()),
        // A missing or invalid bucket is for the route to report.
        Err(StoreError::NoSuchBucket(_) | StoreError::InvalidBucketName(_)) => Ok(()),
        // Whose the bucket is cannot be told: nothing is let through.
        Err(e) => Err(e.into()),
    }
}

/// The query string's pairs.
pub(super) fn query(req: &Request) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()).into_owned().collect()
}

pub(super) fn query_value<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

impl Endpoint {
    /// The methods the endpoint takes.
    fn allow(&self) -> &'static str {
        match self {
            Endpoint::Root | Endpoint::Health | Endpoint::Metrics | Endpoint::Stats | Endpoint::Blob(_) => "GET, HEAD",
            Endpoint::BatchGet | Endpoint::BatchPut | Endpoint::BatchDelete | Endpoint::Backup => "POST",
            Endpoint::Bucket(_) | Endpoint::Object { .. } => "GET, HEAD, PUT, DELETE",
            Endpoint::UnknownInternal => "",
        }
    }
}

pub(super) async fn route(app: &Arc<App>, req: Request) -> Result<Response, ApiError> {
    let endpoint = Endpoint::parse(req.uri().path())?;
    let method = req.method().clone();
    let read = method == Method::GET || method == Method::HEAD;
    let caller = req.extensions().get::<Caller>().cloned().unwrap_or_default();
    check_access(app, &caller, &endpoint, &req).await?;
    // A future is as big as its biggest branch: uploads, batches, backups
    // and blob reads (kilobytes of state each) wait in boxes of their own,
    // so the box the caller puts a request's future in stays small.
    match endpoint {
        Endpoint::Health if read => Ok(json(StatusCode::OK, &json!({ "status": "ok" }))),
        Endpoint::Metrics if read => {
            let stats = app.store.stats().await?;
            let text =
                app.metrics.render(&stats, app.store.engine().name(), app.store.put_seconds(), app.store.hot_stats());
            Ok(super::full(StatusCode::OK, "text/plain; version=0.0.4", text))
        }
        Endpoint::Stats if read => stats(app).await,
        Endpoint::Root if read => listing::buckets(app, &req).await,
        Endpoint::BatchGet if method == Method::POST => Box::pin(batch::get(app, req)).await,
        Endpoint::BatchPut if method == Method::POST => Box::pin(batch::put(app, req)).await,
        Endpoint::BatchDelete if method == Method::POST => Box::pin(batch::delete(app, req)).await,
        Endpoint::Blob(hex) if read => Box::pin(get_blob(app, &req, &hex)).await,
        Endpoint::Backup if method == Method::POST => Box::pin(backup(app, &req)).await,
        Endpoint::UnknownInternal => {
            Err(ApiError::new(StatusCode::NOT_FOUND, "NoSuchRoute", format!("no route {}", req.uri().path())))
        }
        Endpoint::Bucket(bucket) if read => listing::objects(app, &req, &bucket, "").await,
        Endpoint::Bucket(bucket) if method == Method::PUT => {
            match app.store.create_bucket(&bucket, &caller.access_key, false).await {
                // Another account's bucket is not the caller's to own, as S3
                // tells the two apart.
                Err(StoreError::BucketExists(_))
                    if !super::may_use(&app.store.bucket(&bucket).await?, &caller.access_key) =>
                {
                    Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "BucketAlreadyExists",
                        format!("the bucket {bucket:?} belongs to another account"),
                    ))
                }
                created => {
                    created?;
                    Ok(json(StatusCode::CREATED, &json!({ "bucket": bucket })))
                }
            }
        }
        Endpoint::Bucket(bucket) if method == Method::DELETE => {
            app.store.delete_bucket(&bucket).await?;
            Ok(empty(StatusCode::NO_CONTENT))
        }
        Endpoint::Object { bucket, key } if read && key.ends_with('/') => {
            listing::objects(app, &req, &bucket, &key).await
        }
        Endpoint::Object { bucket, key } if read => {
            let record = app.store.head(&bucket, &key).await?;
            serve(app, &req, &record).await
        }
        Endpoint::Object { bucket, key } if method == Method::PUT => {
            Box::pin(put_object(app, req, &bucket, &key)).await
        }
        Endpoint::Object { bucket, key } if method == Method::DELETE => {
            app.store.delete(&bucket, &key, &conditional::write_precondition(req.headers())).await?;
            Ok(empty(StatusCode::NO_CONTENT))
        }
        _ => Err(ApiError::method_not_allowed(&method, endpoint.allow())),
    }
}

/// A header that may be given once: the body's digests and date. Two
/// lines that differ are refused rather than one of them checked.
fn one<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a HeaderValue>, ApiError> {
    let mut lines = headers.get_all(name).iter();
    let first = lines.next();
    match lines.find(|v| Some(*v) != first) {
        Some(_) => Err(ApiError::bad_request(format!("{name} is given twice, with different values"))),
        None => Ok(first),
    }
}

/// A GET of a key ending in `/` lists the folder: such a key holds an
/// empty folder marker, or bytes no native GET could give back.
pub(super) fn folder_not_empty(key: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{key:?} ends in /, which makes it a folder: its marker is empty (the S3 API stores bytes there)"
    ))
}

async fn put_object(app: &Arc<App>, req: Request, bucket: &str, key: &str) -> Result<Response, ApiError> {
    let headers = req.headers();
    // RFC 9110 section 9.3.4: a partial PUT must not be taken for the
    // whole object.
    if headers.contains_key(header::CONTENT_RANGE) {
        return Err(ApiError::bad_request("a PUT replaces the whole object: Content-Range is not supported"));
    }
    let folder = key.ends_with('/');
    if folder && content_length(headers).is_some_and(|n| n > 0) {
        return Err(folder_not_empty(key));
    }
    let expected_sha256 = match one(headers, "x-depot-sha256")? {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(Digest::from_hex)
                .ok_or_else(|| ApiError::bad_request("X-Depot-Sha256 must be 64 hexadecimal digits"))?,
        ),
    };
    let expected_md5 = match one(headers, "content-md5")? {
        None => None,
        Some(v) => Some(content_md5(v.to_str().unwrap_or(""))?),
    };
    let precondition = conditional::write_precondition(headers);
    let mut metadata = Vec::new();
    for (name, value) in headers {
        if let Some(meta) = name.as_str().strip_prefix("x-amz-meta-") {
            let value =
                value.to_str().map_err(|_| ApiError::bad_request(format!("metadata {name} is not visible ASCII")))?;
            metadata.push((meta.to_string(), value.to_string()));
        }
    }
    let stored = stored_headers(headers)?;
    let modified = match one(headers, "x-depot-modified")? {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|v| httpdate::parse_http_date(v).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                // A date to come is now: the object exists from now on.
                .map(|d| (d.as_millis() as u64).min(crate::catalog::now_millis()))
                .ok_or_else(|| ApiError::bad_request("X-Depot-Modified must be an HTTP date"))?,
        ),
    };
    let opts = PutOptions {
        // A folder's marker sent chunked must be empty too.
        content_length: if folder { Some(0) } else { content_length(headers) },
        content_type: match headers.get(header::CONTENT_TYPE) {
            None => None,
            Some(v) => {
                Some(v.to_str().map_err(|_| ApiError::bad_request("Content-Type is not visible ASCII"))?.to_string())
            }
        },
        expected_sha256,
        expected_md5,
        precondition,
        metadata,
        headers: stored,
        modified,
        ..PutOptions::default()
    };
    let body = req.into_body().into_data_stream();
    let put = match app.store.put(bucket, key, body, opts).await {
        Err(StoreError::IncompleteBody { .. }) if folder => return Err(folder_not_empty(key)),
        put => put?,
    };
    let r = &put.record;
    let status = if put.replaced { StatusCode::OK } else { StatusCode::CREATED };
    let mut answer = json!({
        "bucket": bucket,
        "key": key,
        "size": r.size,
        "etag": r.etag,
        "sha256": r.sha256.to_hex(),
        "deduplicated": put.deduplicated,
    });
    if app.several_accounts() {
        // Whether the bytes were stored already would tell one account
        // what another keeps.
        answer.as_object_mut().expect("an object").remove("deduplicated");
    }
    let mut response = json(status, &answer);
    response.headers_mut().insert(header::ETAG, quoted(&r.etag));
    Ok(response)
}

async fn get_blob(app: &Arc<App>, req: &Request, hex: &str) -> Result<Response, ApiError> {
    let digest =
        Digest::from_hex(hex).ok_or_else(|| ApiError::bad_request("a blob address is 64 hexadecimal digits"))?;
    let blob = app.store.blob(&digest).await?;
    // A blob served as an object of its own, named by its digest.
    let record = ObjectRecord {
        key: hex.to_string(),
        size: blob.size,
        parts: vec![Part { digest, size: blob.size }],
        etag: digest.to_hex(),
        sha256: digest,
        content_type: "application/octet-stream".into(),
        modified: 0,
        metadata: Vec::new(),
        headers: Vec::new(),
        body: None,
    };
    serve(app, req, &record).await
}

/// Totals for dashboards and benchmarks: what is stored, what it takes on
/// the engine's storage (walking an `fs` engine's files: not for scraping
/// every second), and where upload time went.
async fn stats(app: &Arc<App>) -> Result<Response, ApiError> {
    let stats = app.store.stats().await?;
    let engine = app.store.engine();
    let disk = engine.disk_usage().await.map_err(StoreError::from)?;
    Ok(json(
        StatusCode::OK,
        &json!({
            "engine": engine.name(),
            "objects": stats.objects,
            "logical_bytes": stats.logical_bytes,
            "blobs": stats.blobs,
            "blob_bytes": stats.blob_bytes,
            "dedup_saved_bytes": (stats.logical_bytes - stats.blob_bytes).max(0),
            "disk_bytes": disk,
            "put_seconds": app.store.put_seconds(),
            "hot": app.store.hot_stats(),
        }),
    ))
}

/// Writes a backup into a directory of the server's machine. Without
/// credentials only a client on the same machine, that may read the data
/// directory, may ask (see [`super::LOCAL_TOKEN_FILE`]): the path is the
/// server's, not the client's.
async fn backup(app: &Arc<App>, req: &Request) -> Result<Response, ApiError> {
    // Checked before anything of the request is looked at.
    if !app.auth_required() {
        if !app.sent_here(req) {
            return Err(ApiError::access_denied(
                "backups over the network need credentials; configure --access-key and --secret-key",
            ));
        }
        // A proxy on this machine forwards from a loopback address too.
        if !app.carries_local_token(req) {
            return Err(ApiError::access_denied(
                "without credentials, a backup is asked for by `depot backup --data DIR` on the server's machine, \
                 which sends the data directory's local token",
            ));
        }
    }
    let q = query(req);
    let dir = query_value(&q, "dir").map(std::path::Path::new).filter(|d| d.is_absolute()).ok_or_else(|| {
        ApiError::bad_request("name the backup directory as an absolute path of the server's machine: ?dir=/path")
    })?;
    // The client names the data directory it means; a server serving
    // another must not answer with a copy of its own store.
    if let Some(meant) = query_value(&q, "data") {
        let served = app.store.data_dir();
        let same = |served: &std::path::Path| {
            let canonical = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            canonical(served) == canonical(std::path::Path::new(meant))
        };
        if !served.is_some_and(same) {
            let served = served.map_or("no data directory".to_string(), |d| d.display().to_string());
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "WrongStore",
                format!("this server serves {served}, not {meant}: ask the server that holds {meant}"),
            ));
        }
    }
    // A backup runs to its end, or its failure's cleanup, even when the
    // client goes away meanwhile: cut off there, it left a partial copy.
    let (runner, at) = (app.clone(), dir.to_path_buf());
    let report = tokio::spawn(async move { runner.store.backup(&at, &indicatif::ProgressBar::hidden()).await })
        .await
        .map_err(|e| StoreError::Internal(format!("the backup stopped: {e}")))??;
    tracing::info!(dir = %dir.display(), ?report, "backup written");
    Ok(json(StatusCode::OK, &json!(report)))
}

fn quoted(etag: &str) -> HeaderValue {
    let mut v = Vec::with_capacity(etag.len() + 2);
    v.push(b'"');
    v.extend_from_slice(etag.as_bytes());
    v.push(b'"');
    HeaderValue::from_maybe_shared(bytes::Bytes::from(v)).unwrap_or_else(|_| HeaderValue::from_static("\"\""))
}

/// The headers of a PUT that are stored and sent back with the object
/// (S3's), checked as a later answer will carry them.
fn stored_headers(headers: &HeaderMap) -> Result<Vec<(String, String)>, ApiError> {
    let mut stored = Vec::new();
    let text = |name: &str, value: &HeaderValue| {
        value.to_str().map(str::to_string).map_err(|_| ApiError::bad_request(format!("{name} is not visible ASCII")))
    };
    for name in STORED_HEADERS {
        let value = match name {
            // One value each: two different ones are refused, as for the
            // digests, rather than the first kept.
            "content-disposition" | "expires" => match one(headers, name)? {
                None => continue,
                Some(v) => text(name, v)?,
            },
            // Lists (RFC 9110 section 5.3): their lines joined, as nginx
            // and S3 do, rather than all but the first dropped.
            _ => {
                let lines = headers.get_all(name).iter().map(|v| text(name, v)).collect::<Result<Vec<_>, _>>()?;
                if lines.is_empty() {
                    continue;
                }
                lines.join(", ")
            }
        };
        if name == "expires" && httpdate::parse_http_date(&value).is_err() {
            return Err(ApiError::bad_request("Expires must be an HTTP date"));
        }
        stored.push((name.to_string(), value));
    }
    Ok(stored)
}

/// Headers every answer about an object carries, 304 included (RFC 9110
/// section 15.4.5 names Cache-Control and Expires among them).
pub(super) fn validator_headers(h: &mut HeaderMap, record: &ObjectRecord) {
    h.insert(header::ETAG, quoted(&record.etag));
    let modified = record.shown_modified();
    if modified > 0 {
        // An HTTP date is 29 bytes: written in place, not into a String.
        let mut date = [0u8; 29];
        let written = write!(&mut date[..], "{}", httpdate::HttpDate::from(from_millis(modified)));
        if let (Ok(()), Ok(v)) = (written, HeaderValue::from_bytes(&date)) {
            h.insert(header::LAST_MODIFIED, v);
        }
    }
    h.insert("x-depot-sha256", HeaderValue::from_bytes(&record.sha256.hex_bytes()).expect("hex is ASCII"));
    copy_stored(h, record, [header::CACHE_CONTROL, header::EXPIRES]);
}

/// The stored headers `names` of the object, where it has them.
fn copy_stored<const N: usize>(h: &mut HeaderMap, record: &ObjectRecord, names: [header::HeaderName; N]) {
    for name in names {
        if let Some(v) = record.header(name.as_str()).and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(name, v);
        }
    }
}

fn object_headers(h: &mut HeaderMap, record: &ObjectRecord, req: &Request) {
    validator_headers(h, record);
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Ok(v) = HeaderValue::from_str(&record.content_type) {
        h.insert(header::CONTENT_TYPE, v);
    }
    super::object_safety(h, &record.content_type);
    copy_stored(h, record, [header::CONTENT_DISPOSITION, header::CONTENT_ENCODING, header::CONTENT_LANGUAGE]);
    for (name, value) in &record.metadata {
        if let (Ok(n), Ok(v)) =
            (header::HeaderName::from_bytes(format!("x-amz-meta-{name}").as_bytes()), HeaderValue::from_str(value))
        {
            h.append(n, v);
        }
    }
    if query_value(&query(req), "download").is_some() {
        let name = record.key.rsplit('/').next().unwrap_or(&record.key);
        let ascii: String =
            name.chars().map(|c| if c.is_ascii_graphic() && c != '"' && c != '\\' { c } else { '_' }).collect();
        let encoded = percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
        let v = format!("attachment; filename=\"{ascii}\"; filename*=UTF-8''{encoded}");
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(header::CONTENT_DISPOSITION, v);
        }
    }
}

/// Serves an object: conditionals, then ranges, then the body.
pub(super) async fn serve(app: &Arc<App>, req: &Request, record: &ObjectRecord) -> Result<Response, ApiError> {
    let method = req.method();
    let headers = req.headers();
    let validators = Validators::of(record);
    match conditional::evaluate(method, headers, Some(validators)) {
        Verdict::Proceed => {}
        Verdict::NotModified => {
            let mut r = empty(StatusCode::NOT_MODIFIED);
            validator_headers(r.headers_mut(), record);
            return Ok(r);
        }
        Verdict::Failed => return Err(StoreError::PreconditionFailed.into()),
    }
    let size = record.size;
    let head_only = method == Method::HEAD;
    let mut answer = RangeAnswer::Full;
    // A HEAD answers the headers its GET would, ranges included.
    if (method == Method::GET || head_only)
        && let Some(value) = headers.get(header::RANGE).and_then(|v| v.to_str().ok())
        && conditional::if_range_holds(headers, validators)
        && let Some(specs) = range::parse(value)
    {
        answer = range::resolve(&specs, size, app.limits.max_ranges);
    }
    let body = |range| async move {
        match head_only {
            true => Ok::<_, ApiError>(None),
            false => Ok(Some(app.store.read_to_send(record, range).await?)),
        }
    };
    let mut response = match answer {
        RangeAnswer::Full => body_response(StatusCode::OK, size, body(ByteRange::full(size)).await?),
        RangeAnswer::Unsatisfiable => {
            let mut r = super::error_response(&ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "InvalidRange",
                format!("the requested range is not satisfiable for an object of {size} bytes"),
            ));
            r.headers_mut()
                .insert(header::CONTENT_RANGE, HeaderValue::from_str(&format!("bytes */{size}")).expect("ASCII"));
            r.headers_mut().insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
            return Ok(r);
        }
        RangeAnswer::Partial(ranges) if ranges.len() == 1 => {
            let r = ranges[0];
            let mut resp = body_response(StatusCode::PARTIAL_CONTENT, r.len(), body(r).await?);
            let cr = format!("bytes {}-{}/{size}", r.start, r.end - 1);
            resp.headers_mut().insert(header::CONTENT_RANGE, HeaderValue::from_str(&cr).expect("ASCII"));
            resp
        }
        RangeAnswer::Partial(ranges) => return multipart_ranges(app, req, record, ranges).await,
    };
    object_headers(response.headers_mut(), record, req);
    Ok(response)
}

fn body_response(status: StatusCode, len: u64, body: Option<crate::engine::ByteStream>) -> Response {
    match body {
        Some(stream) => streamed(status, len, stream),
        None => {
            let mut r = empty(status);
            r.headers_mut().insert(header::CONTENT_LENGTH, len.into());
            r
        }
    }
}

/// A `multipart/byteranges` answer, streamed range by range.
async fn multipart_ranges(
    app: &Arc<App>,
    req: &Request,
    record: &ObjectRecord,
    ranges: Vec<ByteRange>,
) -> Result<Response, ApiError> {
    use futures::{StreamExt, TryStreamExt};
    let boundary = format!("depot-{:016x}", rand::random::<u64>());
    // A stored Content-Encoding describes the object, whose bytes each
    // part carries; the answer itself is the multipart document.
    let encoding = record.header(header::CONTENT_ENCODING.as_str()).map(|e| format!("Content-Encoding: {e}\r\n"));
    let head_only = req.method() == Method::HEAD;
    // The first range is opened before the status goes out, so a blob that
    // cannot be read fails the request with a status rather than cutting
    // the body after its 206, as a single range does.
    let mut first = if head_only { None } else { Some(app.store.read_to_send(record, ranges[0]).await?) };
    let mut total = 0u64;
    let mut pieces: Vec<crate::engine::ByteStream> = Vec::new();
    // One copy of the record for every later range: a record names each of
    // its parts, up to 10,000 of them.
    let shared = Arc::new(record.clone());
    for r in &ranges {
        let head = format!(
            "\r\n--{boundary}\r\nContent-Type: {}\r\n{}Content-Range: bytes {}-{}/{}\r\n\r\n",
            record.content_type,
            encoding.as_deref().unwrap_or(""),
            r.start,
            r.end - 1,
            record.size
        );
        total += head.len() as u64 + r.len();
        pieces.push(Box::pin(futures::stream::once(async move { Ok(bytes::Bytes::from(head)) })));
        if let Some(opened) = first.take() {
            pieces.push(opened);
            continue;
        }
        // Each later range is opened only when the previous one has been
        // sent.
        let (store_app, record, r) = (app.clone(), shared.clone(), *r);
        let lazy = futures::stream::once(async move { store_app.store.read_to_send(&record, r).await })
            .map(|res| res.map_err(|e| crate::engine::EngineError::other("store", e)))
            .try_flatten();
        pieces.push(Box::pin(lazy));
    }
    let tail = format!("\r\n--{boundary}--\r\n");
    total += tail.len() as u64;
    pieces.push(Box::pin(futures::stream::once(async move { Ok(bytes::Bytes::from(tail)) })));
    let body: crate::engine::ByteStream = match head_only {
        true => Box::pin(futures::stream::empty()),
        // Held whole: a later range is read long after the first, maybe
        // past the collector's grace for an object deleted meanwhile.
        false => app.store.holding_blobs_of(record, Box::pin(futures::stream::iter(pieces).flatten())).await,
    };
    let mut r = streamed(StatusCode::PARTIAL_CONTENT, total, body);
    object_headers(r.headers_mut(), record, req);
    r.headers_mut().remove(header::CONTENT_ENCODING);
    let ct = format!("multipart/byteranges; boundary={boundary}");
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_str(&ct).expect("ASCII"));
    // The policy for the type sent, a multipart document, not the type stored.
    super::object_safety(r.headers_mut(), &ct);
    Ok(r)
}

/// Reads a whole request body of at most `limit` bytes.
pub(super) async fn read_body(req: Request, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let limited = http_body_util::Limited::new(req.into_body(), limit);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "EntityTooLarge",
            format!("the request body is larger than {limit} bytes"),
        )),
        Err(e) => {
            Err(ApiError::new(StatusCode::BAD_REQUEST, "IncompleteBody", format!("reading the body failed: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint::{self, *};

    fn object(bucket: &str, key: &str) -> Endpoint {
        Object { bucket: bucket.into(), key: key.into() }
    }

    #[test]
    fn paths_map_to_endpoints() {
        let table = [
            ("/", Root),
            ("/_/health", Health),
            ("/_/metrics", Metrics),
            ("/_/stats", Stats),
            ("/_/batch/get", BatchGet),
            ("/_/batch/put", BatchPut),
            ("/_/batch/delete", BatchDelete),
            ("/_/blobs/abc", Blob("abc".into())),
            ("/_/nope", UnknownInternal),
            ("/files", Bucket("files".into())),
            ("/files/", Bucket("files".into())),
            ("/files/a/b.txt", object("files", "a/b.txt")),
            ("/files/dir/", object("files", "dir/")),
            ("/files/a//b", object("files", "a//b")),
            ("/files/../../etc/passwd", object("files", "../../etc/passwd")),
            ("/files/%2e%2e/x", object("files", "../x")),
            ("/files/%F0%9F%A6%80", object("files", "🦀")),
            ("/files/a%5Cb", object("files", "a\\b")),
        ];
        for (path, want) in table {
            assert_eq!(Endpoint::parse(path).unwrap(), want, "{path}");
        }
    }

    #[test]
    fn invalid_utf8_is_a_400() {
        let e = Endpoint::parse("/files/%FF%FE").unwrap_err();
        assert_eq!(e.status, http::StatusCode::BAD_REQUEST);
        assert!(Endpoint::parse("no-slash").is_err());
    }

    #[test]
    fn broken_percent_escapes_are_a_400() {
        for bad in ["/files/%", "/files/a%2", "/files/%zz", "/fi%g/x", "/files/%%41"] {
            let e = Endpoint::parse(bad).unwrap_err();
            assert_eq!((e.status, e.code), (http::StatusCode::BAD_REQUEST, "InvalidURI"), "{bad}");
        }
        assert_eq!(Endpoint::parse("/files/%25").unwrap(), object("files", "%"));
    }
}
