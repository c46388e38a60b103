//! `depot import SOURCE BUCKET[/PREFIX]`: copies what another store holds
//! into depot through its HTTP API, so it works against any running server
//! (one node or several) and every upload gets the checks a client's would.
//!
//! Sources: a directory tree (relative paths become keys), a GridFS bucket
//! (`mongodb://host/database`; filename becomes the key, contentType and
//! uploadDate are kept) and an S3 bucket (`s3://bucket/folder`; whole keys, content
//! types and dates are kept). Each object keeps its source's modification
//! time, so a re-run skips what is already there the way `rsync` does: same
//! key, same size, same modification time.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use indicatif::{HumanBytes, ProgressBar};
use mongodb::bson::{Bson, Document, doc};

use super::client::{Client, ClientArgs, printable, printable_path, split_target};
use super::s3_source::S3Source;
use crate::engine::S3Config;

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// What to import: a directory, mongodb://host:port/database (a GridFS
    /// bucket) or s3://bucket[/prefix].
    pub source: String,
    /// Where in depot: BUCKET or BUCKET/PREFIX/ (the bucket is created when
    /// missing).
    pub target: String,
    /// Uploads in flight at once.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub jobs: usize,
    /// The GridFS bucket of a mongodb:// source.
    #[arg(long, default_value = "fs", value_name = "NAME")]
    pub gridfs_bucket: String,
    /// The endpoint of an s3:// source (default: AWS_ENDPOINT_URL, else AWS).
    #[arg(long, value_name = "URL")]
    pub s3_endpoint: Option<String>,
    /// The region of an s3:// source (default: AWS_REGION, else us-east-1).
    #[arg(long, value_name = "REGION")]
    pub s3_region: Option<String>,
    /// Access key id for an s3:// source (default: AWS_ACCESS_KEY_ID).
    #[arg(long, value_name = "KEY")]
    pub s3_access_key: Option<String>,
    /// Secret for an s3:// source (default: AWS_SECRET_ACCESS_KEY).
    #[arg(long, value_name = "SECRET")]
    pub s3_secret_key: Option<String>,
}

/// One thing to copy, as the source lists it.
struct Item {
    /// The key below the target prefix.
    key: String,
    size: u64,
    modified: Option<SystemTime>,
    content_type: Option<String>,
    origin: Origin,
}

/// One entry of a source's listing, as the listing goes.
enum Listed {
    Item(Item),
    /// An entry that could not be listed or named as a key: the import
    /// fails.
    Problem(String),
    /// An entry with nothing of its own to copy (a symbolic link to
    /// nothing, or back into the tree): said, and left out.
    LeftOut(String),
}

/// How far a listing may run ahead of the uploads, in entries: what waits
/// is held in memory, so never the whole source (a few hundred bytes an
/// entry, gigabytes for tens of millions of files).
const LISTED_AHEAD: usize = 4096;

/// Where a listing puts what it finds: on to the uploads, with the
/// progress bar's length grown by each item's size as it is found.
#[derive(Clone)]
struct Found {
    out: tokio::sync::mpsc::Sender<Listed>,
    bar: ProgressBar,
    /// Items listed so far.
    items: Arc<AtomicU64>,
}

impl Found {
    /// Passes `listed` on; false once the uploads have stopped taking
    /// entries, when listing further is of no use.
    async fn send(&self, listed: Listed) -> bool {
        self.count(&listed);
        self.out.send(listed).await.is_ok()
    }

    /// [`Found::send`] from a thread outside the runtime.
    fn send_blocking(&self, listed: Listed) -> bool {
        self.count(&listed);
        self.out.blocking_send(listed).is_ok()
    }

    fn count(&self, listed: &Listed) {
        if let Listed::Item(item) = listed {
            self.bar.inc_length(item.size);
            self.items.fetch_add(1, Ordering::Relaxed);
        }
    }
}

enum Origin {
    File(PathBuf),
    GridFs(Bson),
    S3(String),
}

enum Source {
    Dir(PathBuf),
    GridFs(mongodb::gridfs::GridFsBucket, mongodb::Collection<Document>),
    S3(S3Source),
}

type Body = std::pin::Pin<Box<dyn Stream<Item = anyhow::Result<Bytes>> + Send>>;

impl Source {
    async fn open(args: &ImportArgs) -> anyhow::Result<Source> {
        let source = args.source.as_str();
        if source.starts_with("mongodb://") || source.starts_with("mongodb+srv://") {
            let client = mongodb::Client::with_uri_str(source).await.context("connecting to the GridFS source")?;
            let db = client.default_database().with_context(|| {
                format!("{} names no database: use mongodb://host:port/DATABASE", without_password(source))
            })?;
            let bucket = db.gridfs_bucket(
                mongodb::options::GridFsBucketOptions::builder().bucket_name(args.gridfs_bucket.clone()).build(),
            );
            // A mistyped database or bucket would read as an empty one.
            let files_name = format!("{}.files", args.gridfs_bucket);
            let names = db.list_collection_names().await.context("listing the GridFS source's collections")?;
            if !names.contains(&files_name) {
                bail!(
                    "the database {:?} has no GridFS bucket {:?} (no collection {files_name}): check the URL and --gridfs-bucket",
                    db.name(),
                    args.gridfs_bucket
                );
            }
            let files = db.collection::<Document>(&files_name);
            return Ok(Source::GridFs(bucket, files));
        }
        if let Some(rest) = source.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                bail!("give the S3 source as s3://BUCKET or s3://BUCKET/PREFIX");
            }
            let config = S3Config {
                bucket: Some(bucket.to_string()),
                region: args.s3_region.clone(),
                access_key: args.s3_access_key.clone(),
                secret_key: args.s3_secret_key.clone(),
            };
            return Ok(Source::S3(S3Source::open(args.s3_endpoint.as_deref(), &config, prefix)?));
        }
        let dir = PathBuf::from(source);
        if !dir.is_dir() {
            bail!("{} is not a directory, a mongodb:// URL or an s3:// URL", printable(source));
        }
        Ok(Source::Dir(dir))
    }

    /// Lists what the source holds into `found`, as it goes; an error
    /// when the listing cannot go on.
    async fn list(&self, found: Found) -> anyhow::Result<()> {
        match self {
            Source::Dir(root) => {
                let root = root.clone();
                tokio::task::spawn_blocking(move || walk(&root, |listed| found.send_blocking(listed))).await?
            }
            Source::GridFs(_, files) => {
                // Several files may share a name (revisions); the newest
                // wins. Sorted so, each name's files come together, the
                // newest last. Read whole before the first upload: a cursor
                // left waiting on the uploads for longer than the server's
                // idle limit (ten minutes) is closed under it.
                let mut cursor = files.find(doc! {}).sort(doc! { "filename": 1, "uploadDate": 1 }).await?;
                let (mut items, mut problems): (Vec<Item>, Vec<Listed>) = (Vec::new(), Vec::new());
                while let Some(file) = cursor.try_next().await? {
                    match gridfs_item(&file) {
                        Ok(item) => {
                            if items.last().is_some_and(|last| last.key == item.key) {
                                items.pop();
                            }
                            items.push(item);
                        }
                        Err(e) => problems.push(Listed::Problem(e.to_string())),
                    }
                }
                for entry in problems.into_iter().chain(items.into_iter().map(Listed::Item)) {
                    if !found.send(entry).await {
                        break;
                    }
                }
                Ok(())
            }
            Source::S3(source) => {
                let mut pages = source.pages();
                while let Some(page) = pages.next().await? {
                    for listed in page {
                        let listed = match listed {
                            Ok(l) => Listed::Item(Item {
                                key: l.key.clone(),
                                size: l.size,
                                modified: l.modified,
                                content_type: None,
                                origin: Origin::S3(l.key),
                            }),
                            Err(problem) => Listed::Problem(problem),
                        };
                        if !found.send(listed).await {
                            return Ok(());
                        }
                    }
                }
                Ok(())
            }
        }
    }

    /// The item's bytes as a stream, and the headers to store with them
    /// that only the read tells; `None` if the item is gone.
    async fn open_item(&self, item: &Item) -> anyhow::Result<Option<(Body, Vec<(String, String)>)>> {
        match (&item.origin, self) {
            (Origin::File(path), _) => {
                let f = match tokio::fs::File::open(path).await {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(e).with_context(|| format!("opening {}", path.display())),
                };
                let body = tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024).map_err(anyhow::Error::from);
                Ok(Some((Box::pin(body), Vec::new())))
            }
            (Origin::GridFs(id), Source::GridFs(bucket, _)) => {
                use tokio_util::compat::FuturesAsyncReadCompatExt;
                let download = bucket.open_download_stream(id.clone()).await?;
                let body = tokio_util::io::ReaderStream::with_capacity(download.compat(), 256 * 1024)
                    .map_err(anyhow::Error::from);
                Ok(Some((Box::pin(body), Vec::new())))
            }
            (Origin::S3(key), Source::S3(source)) => {
                let Some(got) = source.get(key).await? else { return Ok(None) };
                let headers = s3_headers(got.headers());
                Ok(Some((Box::pin(got.bytes_stream().map_err(anyhow::Error::from)), headers)))
            }
            _ => bail!("an item from another source"),
        }
    }
}

/// What an S3 object says of itself that depot keeps: its Content-Type,
/// the headers it is served with, and its user metadata.
fn s3_headers(headers: &reqwest::header::HeaderMap) -> Vec<(String, String)> {
    const KEPT: [&str; 5] =
        ["content-type", "cache-control", "content-disposition", "content-encoding", "content-language"];
    headers
        .iter()
        .filter(|(name, _)| KEPT.contains(&name.as_str()) || name.as_str().starts_with("x-amz-meta-"))
        .filter_map(|(name, value)| Some((name.to_string(), value.to_str().ok()?.to_string())))
        .collect()
}

/// Every regular file under `root`, keyed by its relative path with `/`.
/// Symbolic links are followed, as `cp -rL` and aws-cli do: a directory
/// reached through two links is imported under both names (its content is
/// stored once). A link back up to a directory being walked is a loop, and
/// a link to nothing holds nothing: both are left out, not failures, since
/// no run could ever import them (as rsync skips what is not a file).
/// Each entry goes to `found` as the walk reaches it, until `found` says
/// no more.
fn walk(root: &Path, mut found: impl FnMut(Listed) -> bool) -> anyhow::Result<()> {
    for entry in walkdir::WalkDir::new(root).follow_links(true).sort_by_file_name() {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                let path = e.path().unwrap_or(root);
                let shown = printable_path(path);
                let listed = if let Some(ancestor) = e.loop_ancestor() {
                    let ancestor = printable_path(ancestor);
                    Listed::LeftOut(format!("{shown}: a link back to {ancestor}, a loop (imported from there)"))
                } else if let Some(why) = link_to_nowhere(path, &e) {
                    Listed::LeftOut(format!("{shown}: {why}"))
                } else {
                    let why = e.io_error().map_or(e.to_string(), ToString::to_string);
                    Listed::Problem(format!("{shown}: {}", printable(&why)))
                };
                if !found(listed) {
                    return Ok(());
                }
                continue;
            }
        };
        let kind = entry.file_type();
        if !kind.is_file() {
            // Directories are walked; anything else has no bytes to import,
            // and says so.
            if !kind.is_dir()
                && !found(Listed::LeftOut(format!("{}: {}", printable_path(entry.path()), special_kind(kind))))
            {
                return Ok(());
            }
            continue;
        }
        let relative = entry.path().strip_prefix(root).expect("walked paths are under the root");
        let listed = match (entry.metadata(), relative.to_str()) {
            (Err(e), _) => Listed::Problem(format!("{}: {e}", printable_path(entry.path()))),
            (_, None) => Listed::Problem(format!("{}: the name is not UTF-8", printable_path(entry.path()))),
            (Ok(meta), Some(key)) => Listed::Item(Item {
                key: key.replace(std::path::MAIN_SEPARATOR, "/"),
                size: meta.len(),
                modified: meta.modified().ok(),
                content_type: None,
                origin: Origin::File(entry.path().to_path_buf()),
            }),
        };
        if !found(listed) {
            return Ok(());
        }
    }
    Ok(())
}

/// What a file that is neither a regular file nor a directory is.
fn special_kind(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_fifo() {
        "a named pipe, not a file"
    } else if kind.is_socket() {
        "a socket, not a file"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device, not a file"
    } else {
        "not a regular file"
    }
}

/// Why `path` leads nowhere, if it is a symbolic link to nothing, or to
/// links that never end.
fn link_to_nowhere(path: &Path, e: &walkdir::Error) -> Option<String> {
    let errno = e.io_error()?.raw_os_error()?;
    let target = printable_path(&std::fs::read_link(path).ok()?);
    match errno {
        libc::ENOENT | libc::ENOTDIR => Some(format!("a symbolic link to {target}, which does not exist")),
        libc::ELOOP => Some(format!("a symbolic link to {target}, which links on without end")),
        _ => None,
    }
}

fn gridfs_item(file: &Document) -> anyhow::Result<Item> {
    let id = file.get("_id").context("a GridFS file without _id")?.clone();
    let key = file
        .get_str("filename")
        .ok()
        .filter(|name| !name.is_empty())
        .with_context(|| format!("GridFS file {id} has no filename"))?
        .to_string();
    let length = match file.get("length") {
        Some(Bson::Int64(n)) => Some(*n as f64),
        Some(Bson::Int32(n)) => Some(f64::from(*n)),
        Some(Bson::Double(n)) => Some(*n),
        _ => None,
    };
    // A length that is no count of bytes (negative, fractional, NaN) is a
    // damaged file document, said so here rather than as a failed upload.
    let size = match length {
        Some(n) if n >= 0.0 && n.fract() == 0.0 && n < u64::MAX as f64 => n as u64,
        Some(n) => bail!("GridFS file {key:?} has a length of {n}, which is no count of bytes"),
        None => bail!("GridFS file {key:?} has no length"),
    };
    let modified = file.get_datetime("uploadDate").ok().map(|d| d.to_system_time());
    // The spec moved contentType into metadata; older writers put it on top.
    let content_type = file
        .get_str("contentType")
        .or_else(|_| file.get_document("metadata").and_then(|m| m.get_str("contentType")))
        .ok()
        .map(str::to_string);
    Ok(Item { key, size, modified, content_type, origin: Origin::GridFs(id) })
}

#[derive(Default)]
struct Tally {
    imported: AtomicU64,
    bytes: AtomicU64,
    deduplicated: AtomicU64,
    skipped: AtomicU64,
    vanished: AtomicU64,
    markers: AtomicU64,
    failed: AtomicU64,
    /// Of `failed`, the entries the listing could not take.
    unlisted: AtomicU64,
}

enum Outcome {
    Imported {
        deduplicated: bool,
    },
    Skipped,
    /// Listed, but gone when read (deleted meanwhile).
    Vanished,
    /// An S3 key ending in `/`: a folder marker, not a file.
    Marker,
}

/// `depot import`.
pub fn import(args: &ImportArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let (bucket, prefix) = split_target(&args.target);
    let prefix = if prefix.is_empty() || prefix.ends_with('/') { prefix.to_string() } else { format!("{prefix}/") };
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        let source = Arc::new(Source::open(args).await?);
        // The bar grows as the listing finds items, while the uploads go.
        let bar = super::progress_bar(0, super::BYTES_BAR);
        let listed = Arc::new(AtomicU64::new(0));
        let (out, mut found) = tokio::sync::mpsc::channel(LISTED_AHEAD);
        let listing = tokio::spawn({
            let (source, found) = (source.clone(), Found { out, bar: bar.clone(), items: listed.clone() });
            async move { source.list(found).await }
        });
        let listing_failed =
            |e: anyhow::Error| e.context(format!("listing {}", printable(&without_password(&args.source))));
        // A listing that fails before it finds anything (a mistyped source)
        // leaves no bucket made for it.
        let (first, listing) = match found.recv().await {
            None => {
                listing.await?.map_err(listing_failed)?;
                (None, None)
            }
            first => (first, Some(listing)),
        };
        ensure_bucket(&client, bucket).await?;
        let tally = Tally::default();
        let left_out = AtomicU64::new(0);
        let done = AtomicU64::new(0);
        let started = Instant::now();
        let entries = futures::stream::iter(first).chain(futures::stream::poll_fn(move |cx| found.poll_recv(cx)));
        entries
            .for_each_concurrent(args.jobs.max(1), |entry| {
                let (client, source, bar, tally, prefix, done) = (&client, &source, &bar, &tally, &prefix, &done);
                let (listed, left_out) = (&listed, &left_out);
                async move {
                    let item = match entry {
                        Listed::Item(item) => item,
                        Listed::Problem(p) => {
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                            tally.unlisted.fetch_add(1, Ordering::Relaxed);
                            bar.suspend(|| eprintln!("failed: {p}"));
                            return;
                        }
                        Listed::LeftOut(p) => {
                            left_out.fetch_add(1, Ordering::Relaxed);
                            bar.suspend(|| eprintln!("skipped: {p}"));
                            return;
                        }
                    };
                    let key = format!("{prefix}{}", item.key);
                    let sent = Arc::new(AtomicU64::new(0));
                    match import_one(client, source, (bucket, &key), &item, (bar, &sent)).await {
                        Ok(Outcome::Imported { deduplicated }) => {
                            tally.imported.fetch_add(1, Ordering::Relaxed);
                            tally.bytes.fetch_add(item.size, Ordering::Relaxed);
                            tally.deduplicated.fetch_add(deduplicated as u64, Ordering::Relaxed);
                        }
                        Ok(Outcome::Skipped) => {
                            tally.skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Outcome::Vanished) => {
                            tally.vanished.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Outcome::Marker) => {
                            tally.markers.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                            bar.suspend(|| eprintln!("failed: {}: {}", printable(&key), printable(&format!("{e:#}"))));
                        }
                    }
                    // What was not sent (skipped, gone, failed) counts done.
                    bar.inc(item.size.saturating_sub(sent.load(Ordering::Relaxed)));
                    let done = done.fetch_add(1, Ordering::Relaxed) + 1;
                    bar.set_message(format!("{done}/{} files", listed.load(Ordering::Relaxed)));
                }
            })
            .await;
        // The uploads end once the listing has, however it ended.
        let listing = match listing {
            Some(task) => task.await?.map_err(listing_failed),
            None => Ok(()),
        };
        bar.finish_and_clear();
        let elapsed = started.elapsed().as_secs_f64();
        let bytes = tally.bytes.load(Ordering::Relaxed);
        say!(
            "imported {} files ({}) in {elapsed:.1} s, {}/s; {} deduplicated, {} already there, {} failed",
            tally.imported.load(Ordering::Relaxed),
            HumanBytes(bytes),
            HumanBytes((bytes as f64 / elapsed.max(1e-3)) as u64),
            tally.deduplicated.load(Ordering::Relaxed),
            tally.skipped.load(Ordering::Relaxed),
            tally.failed.load(Ordering::Relaxed),
        )?;
        match tally.vanished.load(Ordering::Relaxed) {
            0 => {}
            n => say!("{n} listed entries were gone when read (deleted meanwhile)")?,
        }
        match tally.markers.load(Ordering::Relaxed) {
            0 => {}
            n => say!("{n} folder markers (S3 keys ending in /) left out")?,
        }
        match left_out.load(Ordering::Relaxed) {
            0 => {}
            n => say!(
                "{n} entries left out: symbolic links that lead nowhere or back into the tree, pipes, sockets or \
                 devices"
            )?,
        }
        // A listing cut short fails the import: what it did not reach was
        // not imported.
        listing?;
        // What the listing could not take fails again until it is fixed;
        // an upload that failed may succeed on the next run.
        let unlisted = tally.unlisted.load(Ordering::Relaxed);
        match tally.failed.load(Ordering::Relaxed) {
            0 => Ok(()),
            n if n == unlisted => bail!("{n} files could not be imported (see above)"),
            n if unlisted == 0 => bail!("{n} files could not be imported; run the import again to retry them"),
            n => bail!(
                "{n} files could not be imported (see above); run the import again to retry the {} that failed \
                 to upload",
                n - unlisted
            ),
        }
    })
}

/// Creates the bucket, unless it exists.
async fn ensure_bucket(client: &Client, bucket: &str) -> anyhow::Result<()> {
    let req = client.request(reqwest::Method::PUT, &format!("{}/{bucket}", client.base));
    client
        .send_accepting(req, Some(reqwest::StatusCode::CONFLICT))
        .await
        .with_context(|| format!("creating bucket {}", printable(bucket)))?;
    Ok(())
}

/// A modification time as an HTTP date, which can only name the years
/// 1970 to 9999: a file dated outside them keeps the time of its import.
fn http_date(t: SystemTime) -> Option<String> {
    const YEAR_10000: Duration = Duration::from_secs(253_402_300_800);
    let since_epoch = t.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    (since_epoch < YEAR_10000).then(|| httpdate::fmt_http_date(t))
}

/// A source as it may be shown: a URL's password left out
/// (`mongodb://user:secret@host` → `mongodb://user:xxx@host`), read as
/// text, for URLs of several hosts that no URL parser takes.
fn without_password(source: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = source.split_once("://") else { return source.into() };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let Some((user_info, hosts)) = authority.rsplit_once('@') else { return source.into() };
    let Some((user, _)) = user_info.split_once(':') else { return source.into() };
    format!("{scheme}://{user}:xxx@{hosts}{}", &rest[authority.len()..]).into()
}

/// Imports one item; the bytes it sends are counted on `progress` as they
/// go, and added to `sent`.
async fn import_one(
    client: &Client,
    source: &Source,
    (bucket, key): (&str, &str),
    item: &Item,
    (progress, sent): (&ProgressBar, &Arc<AtomicU64>),
) -> anyhow::Result<Outcome> {
    // Whatever its size: S3 servers over a file system list each directory
    // so, with the directory's size (4096).
    if matches!(item.origin, Origin::S3(_)) && item.key.ends_with('/') {
        return Ok(Outcome::Marker);
    }
    let url = client.url(bucket, key)?;
    let modified = item.modified.and_then(http_date);
    let head = client.request(reqwest::Method::HEAD, &url).send().await?;
    // (A HEAD response's length is in its header: it has no body to size.)
    let header = |name| head.headers().get(name).and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok());
    if head.status().is_success()
        && header(reqwest::header::CONTENT_LENGTH) == Some(item.size.to_string().as_str())
        && modified.is_some()
        && header(reqwest::header::LAST_MODIFIED) == modified.as_deref()
    {
        return Ok(Outcome::Skipped);
    }
    let Some((body, mut headers)) = source.open_item(item).await? else { return Ok(Outcome::Vanished) };
    let (progress, sent) = (progress.clone(), sent.clone());
    let body = body.inspect_ok(move |chunk| {
        progress.inc(chunk.len() as u64);
        sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
    });
    // A file changed in place while it is read fails before its end.
    let unchanged = match &item.origin {
        Origin::File(path) => std::fs::metadata(path).ok().map(|meta| super::client::Unchanged::new(path, &meta)),
        _ => None,
    };
    let mut req = client.upload_request(&url);
    headers.extend(item.content_type.iter().map(|t| ("content-type".to_string(), t.clone())));
    for (name, value) in headers {
        req = req.header(name, value);
    }
    if let Some(m) = modified {
        req = req.header("x-depot-modified", m);
    }
    let put = client.send_upload(req, Some(item.size), super::client::exactly(item.size, body, unchanged)).await?;
    Ok(Outcome::Imported { deduplicated: put["deduplicated"].as_bool() == Some(true) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(without_password("mongodb://app:s3cret@db:27017/x"), "mongodb://app:xxx@db:27017/x");
        assert_eq!(
            without_password("mongodb://u:p@w@h1:27017,h2:27017/db?rs=a"),
            "mongodb://u:xxx@h1:27017,h2:27017/db?rs=a"
        );
        assert_eq!(without_password("mongodb://db/x"), "mongodb://db/x");
        assert_eq!(without_password("/srv/files"), "/srv/files");
    }

    #[test]
    fn a_gridfs_length_must_count_bytes() {
        use mongodb::bson::doc;
        let file = |length: Bson| doc! { "_id": 1, "filename": "f", "length": length };
        assert_eq!(gridfs_item(&file(Bson::Int64(5))).unwrap().size, 5);
        assert_eq!(gridfs_item(&file(Bson::Double(7.0))).unwrap().size, 7);
        for bad in [Bson::Int64(-1), Bson::Int32(-3), Bson::Double(f64::NAN), Bson::Double(1.5)] {
            let err = gridfs_item(&file(bad.clone())).err().unwrap().to_string();
            assert!(err.contains("which is no count of bytes"), "{bad}: {err}");
        }
    }

    /// Entries go on as the walk finds them, and the walk ends when told
    /// that no more are taken.
    #[test]
    fn a_walk_passes_entries_on_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..10 {
            std::fs::write(dir.path().join(format!("f{i}")), b"x").unwrap();
        }
        let mut seen = 0;
        walk(dir.path(), |listed| {
            assert!(matches!(listed, Listed::Item(_)));
            seen += 1;
            seen < 3
        })
        .unwrap();
        assert_eq!(seen, 3);
        let mut all = 0;
        walk(dir.path(), |_| {
            all += 1;
            true
        })
        .unwrap();
        assert_eq!(all, 10);
    }

    #[test]
    fn a_walk_follows_links_and_stops_at_loops() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("d")).unwrap();
        std::fs::write(root.join("d/z"), b"z").unwrap();
        std::fs::write(root.join("outside"), b"o").unwrap();
        std::os::unix::fs::symlink("..", root.join("d/up")).unwrap();
        std::os::unix::fs::symlink(".", root.join("self")).unwrap();
        std::os::unix::fs::symlink("d", root.join("alias")).unwrap();
        std::os::unix::fs::symlink("missing", root.join("dangling")).unwrap();
        std::os::unix::fs::symlink("circle", root.join("circle")).unwrap();
        let (fifo, mode) = (rustix::fs::FileType::Fifo, rustix::fs::Mode::from_raw_mode(0o600));
        rustix::fs::mknodat(rustix::fs::CWD, root.join("pipe"), fifo, mode, 0).unwrap();
        let (mut items, mut problems, mut left_out) = (Vec::new(), Vec::new(), Vec::new());
        walk(root, |listed| {
            match listed {
                Listed::Item(item) => items.push(item),
                Listed::Problem(p) => problems.push(p),
                Listed::LeftOut(p) => left_out.push(p),
            }
            true
        })
        .unwrap();
        let keys: Vec<&str> = items.iter().map(|i| i.key.as_str()).collect();
        // The link to `d` does not keep `d` itself from being walked.
        assert_eq!(keys, ["alias/z", "d/z", "outside"]);
        let loops = left_out.iter().filter(|p| p.contains("a loop")).count();
        assert_eq!(loops, 3, "self, d/up and alias/up lead back up: {left_out:?}");
        assert!(left_out.iter().any(|p| p.contains("circle: a symbolic link to circle, which links on")));
        assert!(left_out.iter().any(|p| p.contains("dangling: a symbolic link to missing, which does not exist")));
        assert!(left_out.iter().any(|p| p.ends_with("pipe: a named pipe, not a file")), "{left_out:?}");
        assert_eq!(left_out.len(), 6, "{left_out:?}");
        assert!(problems.is_empty(), "links that lead nowhere are no failures: {problems:?}");
    }
}
