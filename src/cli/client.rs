//! `depot put|get|ls|rm`: a client for people who don't live in curl.
//! Bodies stream from and to files; transfers over a megabyte show a
//! progress bar.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::StreamExt;
use indicatif::{HumanBytes, ProgressBar};
use serde::Deserialize;
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};

use super::s3_source::ListBucketResult;
use crate::store::names;

/// Where the server is and how to authenticate.
#[derive(Clone, Debug, clap::Args)]
pub struct ClientArgs {
    /// The server's base URL.
    #[arg(long, env = "DEPOT_SERVER", default_value = "http://127.0.0.1:8080", global = true)]
    pub server: String,
    /// Secret sent as `Authorization: Bearer` when the server needs one.
    #[arg(long = "secret-key", env = "DEPOT_SECRET_KEY", hide_env_values = true, global = true)]
    pub secret: Option<String>,
}

const BAR_FROM: u64 = 1024 * 1024;

pub(crate) struct Client {
    pub(crate) base: String,
    http: reqwest::Client,
    /// For uploads, watched by [`Client::send_upload`] instead.
    uploads: reqwest::Client,
    /// How long an exchange may go with nothing moving.
    stall: Duration,
    secret: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: String,
    message: String,
}

impl Client {
    pub(crate) fn new(args: &ClientArgs) -> anyhow::Result<Client> {
        let base = args.server.trim_end_matches('/').to_string();
        if !base.starts_with("http://") && !base.starts_with("https://") {
            bail!("--server must be an http:// or https:// URL (a proxy in front of depot), got {base:?}");
        }
        Client::with_stall(base, args.secret.clone(), Duration::from_secs(120))
    }

    /// A server that accepts and never answers is an error, not a wait
    /// without end: no connection within 10 s, or nothing moving for
    /// `stall` (a download that keeps coming never times out).
    fn with_stall(base: String, secret: Option<String>, stall: Duration) -> anyhow::Result<Client> {
        let builder = || reqwest::Client::builder().connect_timeout(Duration::from_secs(10));
        let http = builder().read_timeout(stall).build()?;
        // reqwest's read timeout counts from the request's start to its
        // answer's head: an upload's answer comes after its whole body, and
        // would have to fit in it.
        let uploads = builder().build()?;
        Ok(Client { base, http, uploads, stall, secret })
    }

    pub(crate) fn url(&self, bucket: &str, key: &str) -> anyhow::Result<String> {
        // Checked here, as the key is by `key_path`: a bucket of `.` or
        // `..` would be a dot segment, which the URL would drop, sending
        // the request somewhere else (`./photos` to the bucket `photos`).
        crate::store::names::check_bucket(bucket).map_err(anyhow::Error::msg)?;
        Ok(format!("{}/{}/{}", self.base, bucket, key_path(key)?))
    }

    pub(crate) fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.authorized(self.http.request(method, url))
    }

    fn authorized(&self, r: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.secret {
            Some(s) => r.bearer_auth(s),
            None => r,
        }
    }

    /// A PUT of `body` to `url`, for [`Client::send_upload`].
    pub(crate) fn upload_request(&self, url: &str) -> reqwest::RequestBuilder {
        self.authorized(self.uploads.put(url))
    }

    /// Sends an upload ([`Client::upload_request`]) with `body`, and reads
    /// the object's record the server answers with. Given up as stalled
    /// when no byte of the body has gone for as long as reads may wait, or
    /// no answer came five times that long after its last: the server
    /// hashes, syncs and records the object meanwhile, and may wait for
    /// another writer or a delete of the same content.
    /// `len` is the body's length, if known: declared in `Content-Length`
    /// (the sending ends with its last byte then, not with the body's end).
    pub(crate) async fn send_upload(
        &self,
        mut req: reqwest::RequestBuilder,
        len: Option<u64>,
        body: impl futures::Stream<Item = anyhow::Result<bytes::Bytes>> + Send + 'static,
    ) -> anyhow::Result<serde_json::Value> {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        if let Some(len) = len.filter(|n| *n > 0) {
            req = req.header(reqwest::header::CONTENT_LENGTH, len);
        }
        let start = tokio::time::Instant::now();
        // When a byte last went, in milliseconds from the start, and
        // whether it was the last.
        let (moved, ended) = (std::sync::Arc::new(AtomicU64::new(0)), std::sync::Arc::new(AtomicBool::new(false)));
        let mut sent = 0;
        let body = body
            .inspect({
                let (moved, ended) = (moved.clone(), ended.clone());
                move |chunk| {
                    moved.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                    sent += chunk.as_ref().map_or(0, |c| c.len() as u64);
                    if Some(sent) == len {
                        ended.store(true, Ordering::Relaxed);
                    }
                }
            })
            .chain(futures::stream::poll_fn({
                let ended = ended.clone();
                move |_| {
                    ended.store(true, Ordering::Relaxed);
                    std::task::Poll::Ready(None)
                }
            }));
        let stalled = async {
            loop {
                let wait = if ended.load(Ordering::Relaxed) { self.stall * 5 } else { self.stall };
                let due = start + Duration::from_millis(moved.load(Ordering::Relaxed)) + wait;
                if tokio::time::Instant::now() >= due {
                    return wait;
                }
                tokio::time::sleep_until(due).await;
            }
        };
        let answered = async {
            let answer = self.send(req.body(reqwest::Body::wrap_stream(body))).await?;
            self.json(answer, "an upload's record").await
        };
        tokio::select! {
            answered = answered => answered,
            waited = stalled => bail!(
                "the upload stalled: nothing moved for {} s, to or from the depot server at {}",
                waited.as_secs_f64(),
                self.base
            ),
        }
    }

    /// Reads a JSON answer. One that is not what a depot server sends
    /// most likely means `--server` names something else (or a path).
    pub(crate) async fn json<T: serde::de::DeserializeOwned>(
        &self,
        resp: reqwest::Response,
        what: &str,
    ) -> anyhow::Result<T> {
        let url = resp.url().to_string();
        resp.json().await.with_context(|| self.not_depot(&url, what))
    }

    /// What to say when `url` did not answer with `what`.
    fn not_depot(&self, url: &str, what: &str) -> String {
        format!("{url} did not answer with {what}: is --server {} the address of a depot server?", self.base)
    }

    /// Whether the server has credentials: a request without a secret is
    /// then an anonymous S3 request, which may read public-read buckets
    /// and nothing else. A server that does not say is taken to have none.
    async fn needs_credentials(&self) -> bool {
        #[derive(Deserialize)]
        struct UiConfig {
            auth_required: bool,
        }
        let req = self.request(reqwest::Method::GET, &format!("{}/_/ui/config", self.base));
        match self.send(req).await {
            Ok(resp) => resp.json::<UiConfig>().await.is_ok_and(|c| c.auth_required),
            Err(_) => false,
        }
    }

    /// Sends a request; an answer other than a success is an error that
    /// says what the server said.
    pub(crate) async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        self.send_accepting(req, None).await
    }

    /// As [`Client::send`], with `also` taken for an answer too (a 409 to
    /// the creation of a bucket that exists).
    pub(crate) async fn send_accepting(
        &self,
        req: reqwest::RequestBuilder,
        also: Option<reqwest::StatusCode>,
    ) -> anyhow::Result<reqwest::Response> {
        // A body that fails while it is read (a file that shrank, a source
        // that broke off) is not the server's doing.
        let resp = req.send().await.map_err(|e| {
            let what = if e.is_connect() { "cannot reach" } else { "the request broke off, to" };
            anyhow::Error::new(e).context(format!("{what} the depot server at {}", self.base))
        })?;
        if resp.status().is_success() || Some(resp.status()) == also {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        if let Ok(e) = serde_json::from_str::<ErrorBody>(&text) {
            bail!("{} ({}): {}", printable(&e.error), status.as_u16(), printable(&e.message));
        }
        // An S3 error document (an anonymous request is answered as one).
        let tag = |name: &str| {
            let open = format!("<{name}>");
            let start = text.find(&open)? + open.len();
            let raw = text[start..].split(&format!("</{name}>")).next()?;
            // The document's five escapes, `&amp;` last.
            let escapes = [("&lt;", "<"), ("&gt;", ">"), ("&quot;", "\""), ("&apos;", "'"), ("&amp;", "&")];
            Some(escapes.iter().fold(raw.to_string(), |t, (from, to)| t.replace(from, to)))
        };
        match (tag("Code"), tag("Message")) {
            (Some(code), Some(message)) => bail!("{} ({}): {}", printable(&code), status.as_u16(), printable(&message)),
            _ => bail!("the server answered {status}"),
        }
    }
}

/// A key as a URL path that reaches the server unchanged (see
/// [`names::key_path`]).
fn key_path(key: &str) -> anyhow::Result<String> {
    names::key_path(key)
        .ok_or_else(|| anyhow::anyhow!("the key {key:?} cannot be put in a URL: clients remove it; use the S3 API"))
}

/// Splits `bucket/key` (the key may be empty).
pub(crate) fn split_target(target: &str) -> (&str, &str) {
    target.split_once('/').unwrap_or((target, ""))
}

fn bar(len: u64, what: &str) -> ProgressBar {
    if len < BAR_FROM {
        return ProgressBar::hidden();
    }
    let bar = super::progress_bar(len, super::BYTES_BAR);
    bar.set_message(what.to_string());
    bar
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread().enable_all().build()?)
}

/// `depot put FILE... [BUCKET/KEY]`: the last argument names the target
/// when there are several and it is not a local file (a local directory,
/// which could not be uploaded, is taken for the bucket of that name). A
/// target ending in `/` (or a bare bucket) takes each file's name as its
/// key. A last argument that is a local file and a key of a bucket on the
/// server is refused as unclear, and so are two files for one key.
pub fn put(args: &ClientArgs, paths: &[PathBuf]) -> anyhow::Result<()> {
    let client = Client::new(args)?;
    runtime()?.block_on(async {
        let (files, target) = match paths {
            [] => bail!("nothing to upload: give one or more files"),
            [one] => (vec![one.clone()], "files/".to_string()),
            [files @ .., last] if !last.exists() || last.is_dir() => {
                (files.to_vec(), last.to_string_lossy().into_owned())
            }
            [.., last] if names_a_bucket(&client, last).await => bail!(
                "{0} is a file here and a key in the bucket of that name on the server: write ./{0} to upload \
                 the file, or run the command elsewhere to upload to that key",
                printable_path(last)
            ),
            all => (all.to_vec(), "files/".to_string()),
        };
        let (bucket, key) = split_target(&target);
        if files.len() > 1 && !(key.is_empty() || key.ends_with('/')) {
            bail!("several files need a target ending in '/', like {}/", printable(&target));
        }
        // A file's name is needed only when the target ends in `/`.
        let mut keys = Vec::with_capacity(files.len());
        for file in &files {
            keys.push(match key.is_empty() || key.ends_with('/') {
                true => {
                    let name = file
                        .file_name()
                        .and_then(|n| n.to_str())
                        .with_context(|| format!("{} has no usable file name: give the key", printable_path(file)))?;
                    format!("{key}{name}")
                }
                false => key.to_string(),
            });
        }
        let mut first = HashMap::new();
        for (file, key) in files.iter().zip(&keys) {
            if let Some(other) = first.insert(key, file) {
                bail!(
                    "{} and {} would both be uploaded to {bucket}/{}: upload them to different keys",
                    printable_path(other),
                    printable_path(file),
                    printable(key)
                );
            }
        }
        let pairs: Vec<(&PathBuf, &String)> = files.iter().zip(&keys).collect();
        each_of(&pairs, "uploaded", |(file, key)| put_one(&client, file, bucket, key)).await
    })
}

/// Whether `path`, relative and of two parts or more, names a bucket on
/// the server as its first part (as `files/report.txt` names `files`).
async fn names_a_bucket(client: &Client, path: &Path) -> bool {
    let mut parts = path.components();
    let (Some(std::path::Component::Normal(first)), Some(_)) = (parts.next(), parts.next()) else {
        return false;
    };
    let Some(bucket) = first.to_str() else { return false };
    match client.url(bucket, "") {
        Ok(url) => client.request(reqwest::Method::HEAD, &url).send().await.is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

/// Runs `each` over the arguments as cp and rm do: a failure is told and
/// the rest go on, and the command fails at the end. With one argument,
/// its error is the command's.
async fn each_of<'a, T, Fut>(items: &'a [T], what: &str, each: impl Fn(&'a T) -> Fut) -> anyhow::Result<()>
where
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    if let [one] = items {
        return each(one).await;
    }
    let mut failed = 0;
    for item in items {
        if let Err(e) = each(item).await {
            eprintln!("error: {e:#}");
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} of {} could not be {what} (see above)", items.len());
    }
    Ok(())
}

/// A local file being uploaded, as it was when opened: changed in place
/// while it is read, the upload fails before its body ends, so that the
/// server stores nothing.
pub(crate) struct Unchanged {
    path: PathBuf,
    inode: (u64, u64),
    modified: Option<std::time::SystemTime>,
}

impl Unchanged {
    /// `meta` is the opened file's (`File::metadata`).
    pub(crate) fn new(path: &Path, meta: &std::fs::Metadata) -> Unchanged {
        use std::os::unix::fs::MetadataExt;
        Unchanged { path: path.to_path_buf(), inode: (meta.dev(), meta.ino()), modified: meta.modified().ok() }
    }

    /// Fails if the file at the path is still the one opened, with another
    /// modification time. One renamed over it, or deleted, leaves what was
    /// read whole.
    async fn check(&self) -> anyhow::Result<()> {
        use std::os::unix::fs::MetadataExt;
        match tokio::fs::metadata(&self.path).await {
            Ok(now) if (now.dev(), now.ino()) == self.inode && now.modified().ok() != self.modified => {
                bail!("{} changed while it was read: upload it again", printable_path(&self.path))
            }
            _ => Ok(()),
        }
    }

    async fn at_end(unchanged: &Option<Unchanged>) -> anyhow::Result<()> {
        match unchanged {
            Some(u) => u.check().await,
            None => Ok(()),
        }
    }
}

/// `body` as it goes out declared `len` bytes long: one that turns out
/// longer or shorter (a file that grew or shrank while it was read), or a
/// file `unchanged` finds changed, fails the upload before its end, so
/// that the server stores nothing. hyper sends no more than the length
/// declared, so a file that grew used to be stored cut short, as a
/// success; the last chunk is held back until the body is seen to end.
/// (A body of 0 bytes must go without a `Content-Length`, chunked, or hyper
/// would not read it at all.)
pub(crate) fn exactly<E: Into<anyhow::Error> + Send + 'static>(
    len: u64,
    body: impl futures::Stream<Item = Result<bytes::Bytes, E>> + Send + 'static,
    unchanged: Option<Unchanged>,
) -> impl futures::Stream<Item = anyhow::Result<bytes::Bytes>> + Send + 'static {
    let grew = move || anyhow::anyhow!("the source grew past its {len} bytes while it was read: upload it again");
    let state = (Box::pin(body), 0u64, unchanged, false);
    futures::stream::unfold(state, move |(mut body, mut sent, unchanged, done)| async move {
        if done {
            return None;
        }
        let item = match body.next().await {
            Some(Ok(chunk)) => {
                sent += chunk.len() as u64;
                if sent > len {
                    Err(grew())
                } else if sent == len {
                    loop {
                        match body.next().await {
                            Some(Ok(more)) if more.is_empty() => {}
                            Some(Ok(_)) => break Err(grew()),
                            Some(Err(e)) => break Err(e.into()),
                            None => break Unchanged::at_end(&unchanged).await.map(|()| chunk),
                        }
                    }
                } else {
                    return Some((Ok(chunk), (body, sent, unchanged, false)));
                }
            }
            Some(Err(e)) => Err(e.into()),
            None if sent < len => Err(anyhow::anyhow!(
                "the source ended after {sent} of its {len} bytes while it was read: upload it again"
            )),
            None => match Unchanged::at_end(&unchanged).await {
                Ok(()) => return None,
                Err(e) => Err(e),
            },
        };
        Some((item, (body, sent, unchanged, true)))
    })
}

async fn put_one(client: &Client, file: &Path, bucket: &str, key: &str) -> anyhow::Result<()> {
    let shown = printable_path(file);
    let f = tokio::fs::File::open(file).await.with_context(|| format!("opening {shown}"))?;
    let meta = f.metadata().await?;
    if meta.is_dir() {
        bail!("{shown} is a directory: upload its files, or import it with depot import");
    }
    let target = printable(&format!("{bucket}/{key}")).into_owned();
    // A pipe or a device has no length to declare: its bytes go chunked.
    let len = meta.is_file().then_some(meta.len());
    let progress = bar(len.unwrap_or(0), &target);
    let p = progress.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(f, 256 * 1024).inspect(move |c| {
        if let Ok(c) = c {
            p.inc(c.len() as u64);
        }
    });
    let req = client.upload_request(&client.url(bucket, key)?);
    let answered = match len {
        Some(len) => client.send_upload(req, Some(len), exactly(len, stream, Some(Unchanged::new(file, &meta)))).await,
        None => client.send_upload(req, None, stream.map(|c| c.map_err(Into::into))).await,
    };
    progress.finish_and_clear();
    let body = answered?;
    let Some(sha256) = body["sha256"].as_str() else {
        bail!("uploading {target}: the server's answer names no stored content ({body})");
    };
    let dedup = if body["deduplicated"].as_bool() == Some(true) { ", deduplicated" } else { "" };
    let size = HumanBytes(body["size"].as_u64().unwrap_or(0));
    say(format_args!("{target}  {size}  sha256 {sha256}{dedup}"))
}

/// `depot get BUCKET/KEY [FILE]`: to FILE (`-` for standard output), or a
/// file named after the key in the current directory. The file appears
/// only once complete.
pub fn get(args: &ClientArgs, target: &str, out: Option<&Path>) -> anyhow::Result<()> {
    let (bucket, key) = split_target(target);
    if key.is_empty() {
        bail!("give BUCKET/KEY, e.g. files/photo.jpg");
    }
    let target = printable(target);
    if key.ends_with('/') {
        bail!("{target} names a folder: list it with depot ls {target}");
    }
    let client = Client::new(args)?;
    runtime()?.block_on(async {
        let resp = client.send(client.request(reqwest::Method::GET, &client.url(bucket, key)?)).await?;
        let len = resp.content_length().unwrap_or(0);
        // The digest the server stored: what is written is checked against
        // it, so bytes damaged on its disk, or on the way, are never taken
        // for the object.
        let sha256 = resp.headers().get("x-depot-sha256").and_then(|v| v.to_str().ok()).map(str::to_string);
        let mut body = resp.bytes_stream();
        if out == Some(Path::new("-")) {
            return write_body(&mut body, &mut tokio::io::stdout(), &ProgressBar::hidden(), sha256).await;
        }
        let name = key.rsplit('/').find(|s| !s.is_empty()).unwrap_or("download");
        let dest = match out {
            // Into a directory under the object's name, as cp does.
            Some(p) if p.is_dir() => p.join(name),
            Some(p) => p.to_path_buf(),
            None => PathBuf::from(name),
        };
        let progress = bar(len, &target);
        let existing = std::fs::metadata(&dest).ok();
        if existing.as_ref().is_some_and(|m| !m.is_file()) {
            // A device, a FIFO or a socket (`/dev/null`, `/dev/stdout`) is
            // written into, as curl -o does, never replaced.
            let mut f = tokio::fs::OpenOptions::new()
                .write(true)
                .open(&dest)
                .await
                .with_context(|| format!("opening {}", printable_path(&dest)))?;
            let written = write_body(&mut body, &mut f, &progress, sha256).await;
            progress.finish_and_clear();
            return written;
        }
        // A file is replaced only once the download is whole: the bytes go
        // to a temporary file beside the file the path finally names (a
        // symbolic link's target, which stays linked), with the old file's
        // permissions, and are renamed over it.
        let dest = if existing.is_some() { std::fs::canonicalize(&dest)? } else { dest };
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let partial = dir.join(format!(".depot-part-{:016x}", rand::random::<u64>()));
        // Interrupted (Ctrl-C, or SIGTERM from kill, timeout or systemd),
        // the partial file goes too: the handlers are in place before it
        // exists.
        let mut interrupt = signal(SignalKind::interrupt()).context("watching for Ctrl-C")?;
        let mut terminate = signal(SignalKind::terminate()).context("watching for SIGTERM")?;
        let mut f = tokio::fs::File::create(&partial)
            .await
            .with_context(|| format!("creating {}", printable_path(&partial)))?;
        let download = async {
            write_body(&mut body, &mut f, &progress, sha256).await?;
            if let Some(m) = &existing {
                f.set_permissions(m.permissions()).await?;
            }
            f.sync_all().await?;
            tokio::fs::rename(&partial, &dest).await.with_context(|| format!("writing {}", printable_path(&dest)))?;
            Ok(())
        };
        let result: anyhow::Result<()> = tokio::select! {
            r = download => r,
            _ = interrupt.recv() => Err(anyhow::anyhow!("interrupted")),
            _ = terminate.recv() => Err(anyhow::anyhow!("terminated")),
        };
        progress.finish_and_clear();
        if let Err(e) = result {
            let _ = tokio::fs::remove_file(&partial).await;
            return Err(e);
        }
        say(format_args!("{}  {}", printable_path(&dest), HumanBytes(len)))
    })
}

/// An error writing a download out: [`ReaderGone`] for a pipe nobody
/// reads any more.
fn written(e: std::io::Error) -> anyhow::Error {
    match e.kind() {
        std::io::ErrorKind::BrokenPipe => ReaderGone.into(),
        _ => e.into(),
    }
}

/// Writes a download's body to `out` as it comes, counting it on
/// `progress`, and fails if its SHA-256 is not the `sha256` (hexadecimal)
/// the server gave for it.
async fn write_body(
    body: &mut (impl futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    out: &mut (impl tokio::io::AsyncWrite + Unpin),
    progress: &ProgressBar,
    sha256: Option<String>,
) -> anyhow::Result<()> {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.context("the download was cut off")?;
        out.write_all(&chunk).await.map_err(written)?;
        hasher.update(&chunk);
        progress.inc(chunk.len() as u64);
    }
    out.flush().await.map_err(written)?;
    let got = hex::encode(hasher.finalize());
    match sha256 {
        Some(want) if !want.eq_ignore_ascii_case(&got) => {
            bail!("the bytes received have SHA-256 {got}, not the object's {want}: damaged on the server or on the way")
        }
        _ => Ok(()),
    }
}

#[derive(Deserialize)]
struct Listing {
    entries: Vec<Entry>,
    dirs: Vec<String>,
    next: Option<String>,
}

#[derive(Deserialize)]
struct Entry {
    key: String,
    size: u64,
    modified: String,
}

#[derive(Deserialize)]
struct Buckets {
    buckets: Vec<BucketEntry>,
}

#[derive(Deserialize)]
struct BucketEntry {
    name: String,
    created: String,
}

/// `depot ls [BUCKET[/PREFIX]]`: buckets, one folder of a bucket, or
/// what starts with PREFIX.
pub fn ls(args: &ClientArgs, target: Option<&str>) -> anyhow::Result<()> {
    let client = Client::new(args)?;
    runtime()?.block_on(async {
        let Some(target) = target else {
            let req =
                client.request(reqwest::Method::GET, &format!("{}/", client.base)).header("accept", "application/json");
            let list: Buckets = client.json(client.send(req).await?, "a list of buckets").await?;
            for b in list.buckets {
                say(format_args!("{:<24}  {}/", b.created, b.name))?;
            }
            return Ok(());
        };
        let (bucket, prefix) = split_target(target);
        // Without a secret, a server with credentials lists a public-read
        // bucket as S3 does, and nothing else.
        let anonymous = client.secret.is_none() && client.needs_credentials().await;
        // A folder's contents, as `ls DIR`; when no folder has that name,
        // as `aws s3 ls`: what in the folder up to the last `/` starts
        // with the rest (`photos/2024` lists `photos/2024-01.jpg`).
        let folder = if prefix.is_empty() || prefix.ends_with('/') { prefix.to_string() } else { format!("{prefix}/") };
        if !list(&client, anonymous, bucket, &folder, "").await? && !prefix.ends_with('/') {
            let (folder, start) = prefix.split_at(prefix.rfind('/').map_or(0, |i| i + 1));
            list(&client, anonymous, bucket, folder, start).await?;
        }
        Ok(())
    })
}

/// Prints the entries of `folder` that start with `start`, page by page,
/// through the S3 API when `anonymous`; whether there were any.
async fn list(client: &Client, anonymous: bool, bucket: &str, folder: &str, start: &str) -> anyhow::Result<bool> {
    let (mut after, mut any): (Option<String>, bool) = (None, false);
    loop {
        let page = match anonymous {
            true => s3_page(client, bucket, &format!("{folder}{start}"), after.as_deref()).await?,
            false => native_page(client, bucket, folder, start, after.as_deref()).await?,
        };
        for d in &page.dirs {
            say(format_args!("{:>10}  {:<24}  {}", "-", "", printable(d)))?;
        }
        for e in &page.entries {
            say(format_args!("{:>10}  {:<24}  {}", HumanBytes(e.size).to_string(), e.modified, printable(&e.key)))?;
        }
        any |= !page.dirs.is_empty() || !page.entries.is_empty();
        match page.next {
            Some(_) if reader_gone() => return Ok(true),
            Some(n) => after = Some(n),
            None => return Ok(any),
        }
    }
}

fn query_value(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A page of the native listing of `folder`: the entries that start with
/// `start`, from after the key `after`.
async fn native_page(
    client: &Client,
    bucket: &str,
    folder: &str,
    start: &str,
    after: Option<&str>,
) -> anyhow::Result<Listing> {
    let mut query = Vec::new();
    if !start.is_empty() {
        query.push(format!("prefix={}", query_value(start)));
    }
    if let Some(a) = after {
        query.push(format!("after={}", query_value(a)));
    }
    let mut url = client.url(bucket, folder)?;
    if !query.is_empty() {
        url.push_str(&format!("?{}", query.join("&")));
    }
    let req = client.request(reqwest::Method::GET, &url).header("accept", "application/json");
    client.json(client.send(req).await?, "a listing").await
}

/// A page of the S3 listing (ListObjectsV2, folder-style by `/`) of what
/// starts with `prefix`, from the continuation `token`: what a server with
/// credentials gives a request without them.
async fn s3_page(client: &Client, bucket: &str, prefix: &str, token: Option<&str>) -> anyhow::Result<Listing> {
    let mut url =
        format!("{}/{bucket}?list-type=2&delimiter=%2F&encoding-type=url&prefix={}", client.base, query_value(prefix));
    if let Some(token) = token {
        url.push_str(&format!("&continuation-token={}", query_value(token)));
    }
    let text = client.send(client.request(reqwest::Method::GET, &url)).await?.text().await?;
    let page: ListBucketResult = quick_xml::de::from_str(&text).with_context(|| client.not_depot(&url, "a listing"))?;
    // Asked for URL-encoded, since XML cannot hold every control character.
    let encoded = page.encoding_type.as_deref() == Some("url");
    let decode = |s: &str| match encoded {
        true => percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned(),
        false => s.to_string(),
    };
    Ok(Listing {
        entries: page
            .contents
            .iter()
            .map(|c| Entry { key: decode(&c.key), size: c.size, modified: c.last_modified.clone().unwrap_or_default() })
            .collect(),
        dirs: page.common_prefixes.iter().map(|p| decode(&p.prefix)).collect(),
        next: page.next_continuation_token.filter(|t| !t.is_empty()),
    })
}

/// `depot rm BUCKET/KEY...`.
pub fn rm(args: &ClientArgs, targets: &[String]) -> anyhow::Result<()> {
    let client = Client::new(args)?;
    runtime()?.block_on(each_of(targets, "removed", |target| {
        let client = &client;
        async move {
            let (bucket, key) = split_target(target);
            if key.is_empty() {
                bail!("give BUCKET/KEY, e.g. files/photo.jpg (to remove a bucket: curl -X DELETE)");
            }
            client.send(client.request(reqwest::Method::DELETE, &client.url(bucket, key)?)).await?;
            say(format_args!("removed {}", printable(target)))
        }
    }))
}

/// Set once stdout's reader has gone away.
static READER_GONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// One line of output. Once the reader has gone away (`depot ls | head`,
/// `depot rm ... | grep -q`) nothing more is printed, but the work goes
/// on and the command's status is the work's: it used to exit 0 on the
/// spot, with files not uploaded or removed. A listing stops early (see
/// [`reader_gone`]), as `ls` would.
pub(crate) fn say(line: std::fmt::Arguments) -> anyhow::Result<()> {
    use std::io::Write;
    if reader_gone() {
        return Ok(());
    }
    match writeln!(std::io::stdout().lock(), "{line}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            READER_GONE.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
        result => Ok(result?),
    }
}

/// Whether stdout's reader has gone away.
pub(crate) fn reader_gone() -> bool {
    READER_GONE.load(std::sync::atomic::Ordering::Relaxed)
}

/// The error of a download written to a pipe whose reader went away
/// (`depot get files/log - | head`): the command ends quietly, as `cat`
/// would. Only a write of ours says so: a broken connection to the server
/// is a failure.
#[derive(Debug)]
pub struct ReaderGone;

impl std::fmt::Display for ReaderGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the reader of the output went away")
    }
}

impl std::error::Error for ReaderGone {}

/// A key for a terminal: control characters (a newline, an escape
/// sequence) are shown escaped rather than acted on.
pub(crate) fn printable(key: &str) -> std::borrow::Cow<'_, str> {
    if !key.chars().any(char::is_control) {
        return key.into();
    }
    key.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// A path for a terminal, as [`printable`] shows a key.
pub(crate) fn printable_path(path: &Path) -> String {
    printable(&path.to_string_lossy()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `exactly(len, chunks)` gives: the bytes, or the error.
    fn sent(len: u64, chunks: &[&'static [u8]]) -> Result<Vec<u8>, String> {
        let chunks: Vec<_> = chunks.iter().map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from_static(c))).collect();
        let body = futures::stream::iter(chunks);
        let all: Vec<anyhow::Result<bytes::Bytes>> =
            futures::executor::block_on(exactly(len, body, None).collect::<Vec<_>>());
        let mut out = Vec::new();
        for item in all {
            out.extend_from_slice(&item.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    /// A file changed in place while it is read fails its upload; one
    /// renamed over it or deleted leaves what was read whole.
    #[tokio::test]
    async fn a_file_changed_while_read_fails_before_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").unwrap();
        let opened = || Some(Unchanged::new(&path, &std::fs::metadata(&path).unwrap()));
        async fn send(unchanged: Option<Unchanged>) -> Result<Vec<bytes::Bytes>, String> {
            let body = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"abc"))]);
            let all: Vec<_> = exactly(3, body, unchanged).collect().await;
            all.into_iter().map(|r| r.map_err(|e| e.to_string())).collect()
        }
        assert!(send(opened()).await.is_ok());
        let unchanged = opened();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        assert!(send(unchanged).await.unwrap_err().contains("changed while it was read"));
        let unchanged = opened();
        std::fs::write(dir.path().join("g"), b"xyz").unwrap();
        std::fs::rename(dir.path().join("g"), &path).unwrap();
        assert!(send(unchanged).await.is_ok(), "another file in its place");
        let unchanged = opened();
        std::fs::remove_file(&path).unwrap();
        assert!(send(unchanged).await.is_ok(), "deleted");
    }

    /// An upload that keeps moving may take longer than a stall, and its
    /// answer may come later than that after its last byte; one the server
    /// stops reading, or never answers, is given up.
    #[tokio::test]
    async fn an_upload_is_given_up_only_when_it_stalls() {
        use tokio::io::AsyncReadExt;
        let stall = Duration::from_millis(400);
        // Reads the request's head and `read` bytes of its body, then
        // answers after `answer_after`, or never.
        let serve = |read: usize, answer_after: Option<Duration>| async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            tokio::spawn(async move {
                let (mut socket, _) = listener.accept().await.unwrap();
                let (mut got, mut buf) = (Vec::new(), vec![0u8; 64 * 1024]);
                loop {
                    let head = got.windows(4).position(|w| w == b"\r\n\r\n").map(|at| at + 4);
                    if head.is_some_and(|head| got.len() - head >= read) {
                        break;
                    }
                    let n = socket.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client went away");
                    got.extend_from_slice(&buf[..n]);
                }
                let Some(after) = answer_after else { return tokio::time::sleep(Duration::from_secs(60)).await };
                tokio::time::sleep(after).await;
                let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                socket.write_all(answer).await.unwrap();
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
            Client::with_stall(base, None, stall).unwrap()
        };
        // `n` pieces of `size` bytes, `pace` apart.
        let body = |n: usize, size: usize, pace: Duration| {
            let stream = futures::stream::iter((0..n).map(move |_| Ok(bytes::Bytes::from(vec![b'x'; size]))));
            stream.then(move |piece| async move {
                tokio::time::sleep(pace).await;
                piece
            })
        };
        let upload = |client: Client, n: usize, size: usize, pace: Duration| async move {
            let req = client.upload_request(&client.url("bkt", "k").unwrap());
            let started = std::time::Instant::now();
            (client.send_upload(req, Some((n * size) as u64), body(n, size, pace)).await, started.elapsed())
        };
        let (sent, took) = upload(serve(8 * 1024, Some(stall * 3)).await, 8, 1024, stall / 2).await;
        sent.unwrap();
        assert!(took > stall * 6, "the upload took {took:?}");

        let (sent, _) = upload(serve(8 * 1024, None).await, 8, 1024, Duration::ZERO).await;
        assert!(sent.unwrap_err().to_string().contains("stalled"), "never answered");

        // More than the sockets' buffers hold, of which the server reads
        // one piece.
        let (sent, took) = upload(serve(64 * 1024, None).await, 64, 1 << 20, Duration::ZERO).await;
        assert!(sent.unwrap_err().to_string().contains("stalled"), "not read");
        assert!(took < stall * 4, "given up after {took:?}, not when the answer would be late");
    }

    #[test]
    fn a_body_must_be_as_long_as_declared() {
        assert_eq!(sent(6, &[b"abc", b"", b"def"]).unwrap(), b"abcdef");
        assert_eq!(sent(6, &[b"abcdef", b""]).unwrap(), b"abcdef");
        assert_eq!(sent(0, &[]).unwrap(), b"");
        assert!(sent(6, &[b"abcdef", b"g"]).unwrap_err().contains("grew"), "more after the length");
        assert!(sent(5, &[b"abc", b"def"]).unwrap_err().contains("grew"));
        assert!(sent(0, &[b"x"]).unwrap_err().contains("grew"));
        assert!(sent(7, &[b"abc", b"def"]).unwrap_err().contains("ended after 6 of its 7 bytes"));
    }

    #[test]
    fn control_characters_are_shown_escaped() {
        assert_eq!(printable("a\nb\u{1b}]0;x\u{7}"), "a\\nb\\u{1b}]0;x\\u{7}");
        assert_eq!(printable("plain é"), "plain é");
    }
}
