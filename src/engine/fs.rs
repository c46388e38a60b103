//! `fs`: one file per blob, at `blobs/ab/cd/<sha256>` under the engine's root.
//!
//! A blob is written to a staging file under `tmp/` on the same file system,
//! synced, renamed into place and the directory synced, so a blob is either
//! whole at its final path or absent. Staging in one directory (rather than
//! beside the final file, whose name is only known once the last byte is
//! hashed) lets start-up remove every abandoned upload with one directory scan.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use rustix::io::Errno;

use super::{BlobEngine, BlobInfo, BlobRef, BlobWriter, ByteRange, ByteStream, Digest, EngineError, Result, mapped};

const NAME: &str = "fs";
/// Bytes gathered before one write system call, and the size of read chunks.
const IO_CHUNK: usize = 256 * 1024;
/// Chunks of a file read at once while streaming it.
const READ_AHEAD: usize = 2;
/// The largest range sent as one mapped chunk when all of it is cached.
const SENT_WHOLE: u64 = 16 << 20;

/// The file-system engine; clones share one directory.
#[derive(Clone, Debug)]
pub struct FsEngine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    blobs: PathBuf,
    tmp: PathBuf,
    next_tmp: AtomicU64,
    /// `host-pid-token-`: names this engine's staging files.
    prefix: String,
    durable: DurableDirs,
}

/// The fan-out directories whose entries this process has made durable in
/// their parents, one bit each: the 256 of the first level, then the 65,536
/// of the second. A directory is synced into its parent once per process,
/// whoever created it: another writer, here or on a node sharing the
/// directory, may have created it and not synced it yet.
#[derive(Debug)]
struct DurableDirs(Box<[AtomicU64]>);

impl DurableDirs {
    fn new() -> DurableDirs {
        DurableDirs((0..(256 + 65_536) / 64).map(|_| AtomicU64::new(0)).collect())
    }

    /// The bits of the two directories above `digest`'s blob.
    fn of(digest: &Digest) -> [usize; 2] {
        let first = digest.0[0] as usize;
        [first, 256 + (first << 8 | digest.0[1] as usize)]
    }

    fn has(&self, bit: usize) -> bool {
        self.0[bit / 64].load(Ordering::Acquire) & (1 << (bit % 64)) != 0
    }

    fn set(&self, bit: usize, on: bool) {
        let mask = 1 << (bit % 64);
        if on {
            self.0[bit / 64].fetch_or(mask, Ordering::Release);
        } else {
            self.0[bit / 64].fetch_and(!mask, Ordering::Release);
        }
    }
}

/// Staging files of another host are left alone this long: several nodes
/// may share one directory, and only the host that wrote a file knows
/// whether its writer is still alive.
const STALE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// This machine's name.
pub(crate) fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

/// The random token sets apart engines that share a host name and a pid:
/// two containers of one host, both pid 1, or two engines of one process.
fn staging_prefix(host: &str) -> String {
    format!("{host}-{}-{:08x}-", std::process::id(), rand::random::<u32>())
}

/// How a staging file `name` (`host-pid-token-n`) of `host` (this one) is
/// told abandoned, or `None` for another host's, which are kept: only the
/// host that wrote a file can know whether its writer lives. A writer
/// holds its file locked, so a file nobody holds is abandoned, but for a
/// moment between its creation and its lock: a file of a writer that still
/// runs counts only once older than [`LOCK_WINDOW`]. Where the file system
/// has no locks, the pid must do: its writer is gone when it is not
/// running, or, `at_open`, is this process's (an earlier run, or another
/// container's pid 1). A live pid may be another process's since, which
/// is why the lock, where there is one, decides.
fn staged_here(name: &str, host: &str, at_open: bool) -> Option<Writer> {
    let mut parts = name.rsplitn(4, '-');
    let (Some(_n), Some(_token), Some(pid), Some(h)) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return None;
    };
    let ours = pid == std::process::id().to_string();
    (h == host).then(|| match (ours, at_open) {
        (true, true) => Writer::Gone,
        (true, false) => Writer::Running,
        (false, _) if Path::new("/proc").join(pid).exists() => Writer::MayRun,
        (false, _) => Writer::Gone,
    })
}

/// What the pid in a staging file's name tells of its writer.
#[derive(Clone, Copy, Debug)]
enum Writer {
    /// Not running, or an earlier run of this process: abandoned, unless
    /// the file is locked.
    Gone,
    /// This process, which removes its own staging files.
    Running,
    /// A running process, maybe another than the writer since.
    MayRun,
}

/// Longest a writer takes from creating its staging file to locking it.
const LOCK_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// Removes the staging files in `tmp` older than [`STALE`], whoever wrote
/// them, and this host's abandoned ones ([`staged_here`]): at open, and by
/// the collector, so that nodes sharing the directory that never restart
/// get the space of one another's crashes back too.
fn remove_abandoned(tmp: &Path, host: &str, at_open: bool) -> Result<()> {
    for entry in fs::read_dir(tmp).map_err(|e| EngineError::io(NAME, e))? {
        let entry = entry.map_err(|e| EngineError::io(NAME, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let age = entry.metadata().and_then(|m| m.modified()).map(|t| t.elapsed().unwrap_or_default());
        let age = age.unwrap_or_default();
        let removed = match staged_here(&name, host, at_open) {
            _ if age > STALE => fs::remove_file(entry.path()),
            Some(Writer::Gone) => remove_if_unlocked(&entry.path(), true),
            Some(Writer::MayRun) if age > LOCK_WINDOW => remove_if_unlocked(&entry.path(), false),
            _ => Ok(()),
        };
        // One gone meanwhile was removed by another node sharing the
        // directory, or was a live writer's, finished since.
        if let Err(e) = removed
            && e.kind() != io::ErrorKind::NotFound
        {
            return Err(EngineError::io(NAME, e));
        }
    }
    Ok(())
}

/// Removes the staging file at `path` unless its writer still holds it
/// locked. On a file system without locks, removes it only if `gone` (its
/// writer's pid said so).
fn remove_if_unlocked(path: &Path, gone: bool) -> io::Result<()> {
    use rustix::fs::{FlockOperation, flock};
    let file = File::open(path)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        // Held while removing, so no writer can take it meanwhile.
        Ok(()) => fs::remove_file(path),
        Err(Errno::WOULDBLOCK) => Ok(()),
        Err(_) if gone => fs::remove_file(path),
        Err(_) => Ok(()),
    }
}

impl FsEngine {
    /// Opens (creating if needed) an engine rooted at `root`, and removes the
    /// staging files that a previous process left behind.
    pub fn open(root: &Path) -> Result<FsEngine> {
        let blobs = root.join("blobs");
        let tmp = root.join("tmp");
        for dir in [&blobs, &tmp] {
            super::create_dir_durably(dir).map_err(|e| EngineError::io(NAME, e))?;
        }
        let host = hostname();
        remove_abandoned(&tmp, &host, true)?;
        Ok(FsEngine {
            inner: Arc::new(Inner {
                blobs,
                tmp,
                next_tmp: AtomicU64::new(0),
                prefix: staging_prefix(&host),
                durable: DurableDirs::new(),
            }),
        })
    }

    /// A writer into a new staging file.
    async fn staging_writer(&self) -> Result<FsWriter> {
        let n = self.inner.next_tmp.fetch_add(1, Ordering::Relaxed);
        let path = self.inner.tmp.join(format!("{}{n}", self.inner.prefix));
        let p = path.clone();
        let file = blocking(move || {
            let file = File::create_new(&p).map_err(|e| EngineError::io(NAME, e))?;
            // Held until the file is closed, it tells an engine opening on
            // this directory that the upload is alive. Without locks (some
            // network file systems) the pid in the name must do.
            let _ = rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive);
            Ok(file)
        })
        .await?;
        Ok(FsWriter {
            inner: self.inner.clone(),
            path,
            file: Arc::new(file),
            buf: Piece::new(),
            written: 0,
            direct: Direct::Untried,
            pending: None,
            failed: false,
        })
    }

    /// Opened on the calling thread, as nginx does: with the directories
    /// cached that costs less than a hand-off to the blocking pool.
    fn open_blob(&self, blob: &BlobRef) -> Result<File> {
        File::open(self.blob_path(&blob.digest)).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => EngineError::NotFound(blob.digest),
            _ => EngineError::io(NAME, e),
        })
    }

    /// The path of a blob's file. Only a digest, never a user's key, becomes
    /// part of a path.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.inner.blob_path(digest)
    }
}

impl Inner {
    fn blob_path(&self, digest: &Digest) -> PathBuf {
        blob_path_in(&self.blobs, digest)
    }
}

/// Where an engine whose blobs are under `blobs` keeps a blob's file: two
/// levels of fan-out by the digest's first bytes.
pub(crate) fn blob_path_in(blobs: &Path, digest: &Digest) -> PathBuf {
    let hex = digest.to_hex();
    blobs.join(&hex[0..2]).join(&hex[2..4]).join(hex)
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(task_failed)?
}

fn task_failed(e: tokio::task::JoinError) -> EngineError {
    EngineError::other(NAME, format!("blocking task failed: {e}"))
}

fn sync_dir(path: &Path) -> Result<()> {
    // Only a failed sync puts durability in doubt; a directory that cannot
    // be opened (out of file descriptors) fails this write alone.
    let dir = File::open(path).map_err(|e| EngineError::io(NAME, e))?;
    dir.sync_all().map_err(EngineError::SyncFailed)
}

/// Creates `dir` if missing, and makes its entry durable in its parent (once
/// per process: `bit` of `durable`), so a blob renamed into it cannot vanish
/// with a crash.
fn ensure_dir(dir: &Path, durable: &DurableDirs, bit: usize) -> Result<()> {
    if durable.has(bit) {
        return Ok(());
    }
    match fs::create_dir(dir) {
        Ok(()) => {}
        // A file in its place fails the write at the rename, unmarked.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !dir.is_dir() => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(EngineError::io(NAME, e)),
    }
    sync_dir(dir.parent().expect("blob directories have parents"))?;
    durable.set(bit, true);
    Ok(())
}

struct FsWriter {
    inner: Arc<Inner>,
    path: PathBuf,
    file: Arc<File>,
    /// The piece filling.
    buf: Piece,
    /// Bytes handed to the file so far.
    written: u64,
    direct: Direct,
    /// The last piece's write, still running while the next piece fills
    /// (receiving and hashing overlap with the write system call); it hands
    /// the piece back to be filled again.
    pending: Option<tokio::task::JoinHandle<Result<Written>>>,
    /// A piece's write failed, or the wait for it was cancelled: the file
    /// may have a hole, and the writer takes nothing more.
    failed: bool,
}

/// What a piece's write hands back.
struct Written {
    piece: Piece,
    /// Whether the file is still open for direct I/O.
    direct: bool,
}

/// Whether a staging file is open for direct I/O.
#[derive(Clone, Copy, PartialEq)]
enum Direct {
    /// Not yet: no whole piece was written.
    Untried,
    On,
    /// Refused by the file system, or done with for the last piece.
    Off,
}

/// Alignment of a direct write's memory, offset and length.
const DIRECT_ALIGN: usize = 4096;

/// [`IO_CHUNK`] bytes of memory aligned for direct I/O.
struct Piece {
    mem: Box<[u8]>,
    start: usize,
    len: usize,
}

impl Piece {
    fn new() -> Piece {
        let mem = vec![0; IO_CHUNK + DIRECT_ALIGN].into_boxed_slice();
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        Piece { mem, start, len: 0 }
    }

    /// Copies as much of `bytes` as fits; returns how much.
    fn fill(&mut self, bytes: &[u8]) -> usize {
        let n = (IO_CHUNK - self.len).min(bytes.len());
        let at = self.start + self.len;
        self.mem[at..at + n].copy_from_slice(&bytes[..n]);
        self.len += n;
        n
    }

    fn bytes(&self) -> &[u8] {
        &self.mem[self.start..self.start + self.len]
    }

    fn is_full(&self) -> bool {
        self.len == IO_CHUNK
    }
}

/// Turns direct I/O on or off for `file`: while it is on, writes go from
/// the piece to the disk without a copy into the page cache. `Ok(false)`
/// when a file system without direct I/O refuses to turn it on.
fn set_direct(file: &File, on: bool) -> io::Result<bool> {
    use rustix::fs::OFlags;
    let flags = rustix::fs::fcntl_getfl(file)?;
    let flags = if on { flags | OFlags::DIRECT } else { flags - OFlags::DIRECT };
    match rustix::fs::fcntl_setfl(file, flags) {
        Ok(()) => Ok(on),
        Err(Errno::INVAL) if on => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Writes `piece` at `offset`, directly if `direct`; a direct write the
/// file system refuses is made again through the page cache.
fn write_piece(file: &File, piece: Piece, offset: u64, mut direct: bool) -> Result<Written> {
    let io = |e| EngineError::io(NAME, e);
    let mut result = file.write_all_at(piece.bytes(), offset);
    if direct && result.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::EINVAL)) {
        set_direct(file, false).map_err(io)?;
        direct = false;
        result = file.write_all_at(piece.bytes(), offset);
    }
    result.map_err(io)?;
    if !direct {
        start_writeback(file, offset, piece.len);
    }
    Ok(Written { piece: Piece { len: 0, ..piece }, direct })
}

/// Starts writing a range of `file` back to the disk without waiting for
/// it, so a large blob's bytes reach the disk while the rest streams in and
/// the final sync waits for the last piece only.
fn start_writeback(file: &File, offset: u64, len: usize) {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor stays open for the call, which only starts
    // writeback of dirty pages; its failure costs speed, never data (the
    // final `sync_data` decides durability).
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
    }
}

impl FsWriter {
    /// Waits for the last piece's write; the piece, to fill again.
    async fn settle(&mut self) -> Result<Option<Piece>> {
        if self.failed {
            return Err(EngineError::other(
                NAME,
                "a piece of this blob was not written: its write failed or was cancelled",
            ));
        }
        let Some(write) = self.pending.take() else { return Ok(None) };
        self.failed = true;
        let written = write.await.map_err(task_failed)??;
        self.failed = false;
        if !written.direct {
            self.direct = Direct::Off;
        }
        Ok(Some(written.piece))
    }

    /// Starts writing the filled piece once the previous one is written.
    ///
    /// A blob's whole pieces go straight to the disk (direct I/O, as MinIO
    /// writes large objects): copying them into the page cache and writing
    /// them back from there took most of an upload's system time. The last
    /// piece, of any length, goes through the page cache, which takes
    /// lengths that are not whole disk blocks.
    async fn flush(&mut self) -> Result<()> {
        if self.buf.len == 0 {
            return Ok(());
        }
        let spare = self.settle().await?;
        let whole = self.buf.is_full();
        let toggle = if whole { self.direct == Direct::Untried } else { self.direct == Direct::On };
        if toggle {
            let on = set_direct(&self.file, whole).map_err(|e| EngineError::io(NAME, e))?;
            self.direct = if on { Direct::On } else { Direct::Off };
        }
        let piece = std::mem::replace(&mut self.buf, spare.unwrap_or_else(Piece::new));
        let (file, offset, direct) = (self.file.clone(), self.written, self.direct == Direct::On);
        self.written += piece.len as u64;
        self.pending = Some(tokio::task::spawn_blocking(move || write_piece(&file, piece, offset, direct)));
        Ok(())
    }
}

/// The error of a failed sync of a staging file. The file is discarded and
/// held nothing acknowledged, so running out of space (a quota, or a network
/// or thinly provisioned disk that reports it only at the sync) fails this
/// upload alone, as it would at a write; other errors disable writes.
fn staging_sync_err(e: io::Error) -> EngineError {
    match EngineError::io(NAME, e) {
        EngineError::Io { source, .. } => EngineError::SyncFailed(source),
        classified => classified,
    }
}

/// Syncs the staging file `tmp` and makes it the blob of `digest`, durably.
fn place(inner: &Inner, file: &File, tmp: &Path, digest: &Digest) -> Result<()> {
    file.sync_data().map_err(staging_sync_err)?;
    let dest = inner.blob_path(digest);
    let leaf = dest.parent().expect("blob path has a directory");
    let [first, second] = DurableDirs::of(digest);
    let ensure = || {
        ensure_dir(leaf.parent().expect("two levels"), &inner.durable, first)?;
        ensure_dir(leaf, &inner.durable, second)
    };
    ensure()?;
    // Renaming over an existing blob of the same digest replaces
    // identical bytes and refreshes the file's age for the collector.
    let renamed = match fs::rename(tmp, &dest) {
        // The directories were removed from outside since they were
        // made: made again.
        Err(e) if e.kind() == io::ErrorKind::NotFound && tmp.exists() => {
            inner.durable.set(first, false);
            inner.durable.set(second, false);
            ensure()?;
            fs::rename(tmp, &dest)
        }
        renamed => renamed,
    };
    renamed.map_err(|e| EngineError::io(NAME, e))?;
    sync_dir(leaf)
}

#[async_trait]
impl BlobWriter for FsWriter {
    async fn write(&mut self, chunk: Bytes) -> Result<()> {
        let mut rest = &chunk[..];
        while !rest.is_empty() {
            rest = &rest[self.buf.fill(rest)..];
            if self.buf.is_full() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>, digest: Digest) -> Result<BlobRef> {
        self.flush().await?;
        self.settle().await?;
        let (file, size) = (self.file.clone(), self.written);
        let tmp = std::mem::take(&mut self.path);
        let inner = self.inner.clone();
        blocking(move || {
            let placed = place(&inner, &file, &tmp, &digest);
            // A staging file that did not become the blob goes now, not at
            // the next start (gone already if only the last sync failed).
            if placed.is_err() {
                let _ = fs::remove_file(&tmp);
            }
            placed.map(|()| BlobRef { digest, size, locator: Vec::new() })
        })
        .await
    }

    async fn abort(mut self: Box<Self>) {
        let _ = self.settle().await;
        let _ = fs::remove_file(std::mem::take(&mut self.path));
    }
}

impl Drop for FsWriter {
    fn drop(&mut self) {
        // A writer dropped mid-stream (client gone) leaves no staging file.
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

#[async_trait]
impl BlobEngine for FsEngine {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn writer(&self, _size_hint: Option<u64>) -> Result<Box<dyn BlobWriter>> {
        Ok(Box::new(self.staging_writer().await?))
    }

    async fn remove_abandoned(&self) -> Result<()> {
        let tmp = self.inner.tmp.clone();
        blocking(move || remove_abandoned(&tmp, &hostname(), false)).await
    }

    async fn read(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        Ok(read_file_range(self.open_blob(blob)?, range, false))
    }

    async fn read_to_send(&self, blob: &BlobRef, range: ByteRange) -> Result<ByteStream> {
        Ok(read_file_range(self.open_blob(blob)?, range, true))
    }

    async fn delete(&self, blob: &BlobRef) -> Result<()> {
        let path = self.blob_path(&blob.digest);
        blocking(move || match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(EngineError::io(NAME, e)),
            _ => Ok(()),
        })
        .await
    }

    async fn stat(&self, blob: &BlobRef) -> Result<Option<u64>> {
        let path = self.blob_path(&blob.digest);
        blocking(move || match fs::metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(EngineError::io(NAME, e)),
        })
        .await
    }

    async fn list(&self) -> Result<Vec<BlobInfo>> {
        let inner = self.inner.clone();
        blocking(move || walk_blobs(&inner.blobs, |_, _| ())).await
    }

    async fn disk_usage(&self) -> Result<Option<u64>> {
        let inner = self.inner.clone();
        blocking(move || {
            let mut total = 0;
            walk_blobs(&inner.blobs, |_, m| total += m.blocks() * 512)?;
            Ok(Some(total))
        })
        .await
    }
}

/// Visits every blob file under `blobs/ab/cd/`, skipping names that are not
/// digests.
fn walk_blobs(blobs: &Path, mut visit: impl FnMut(&Path, &fs::Metadata)) -> Result<Vec<BlobInfo>> {
    let io = |e| EngineError::io(NAME, e);
    let mut out = Vec::new();
    for a in fs::read_dir(blobs).map_err(io)? {
        let a = a.map_err(io)?.path();
        if !a.is_dir() {
            continue;
        }
        for b in fs::read_dir(&a).map_err(io)? {
            let b = b.map_err(io)?.path();
            if !b.is_dir() {
                continue;
            }
            for f in fs::read_dir(&b).map_err(io)? {
                let f = f.map_err(io)?;
                let Some(digest) = f.file_name().to_str().and_then(Digest::from_hex) else {
                    continue;
                };
                let meta = match f.metadata() {
                    Ok(meta) => meta,
                    // Deleted since the directory was read: not there.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io(e)),
                };
                visit(&f.path(), &meta);
                out.push(BlobInfo {
                    digest,
                    size: meta.len(),
                    locator: Vec::new(),
                    modified: meta.modified().map_err(io)?,
                });
            }
        }
    }
    Ok(out)
}

/// Streams `range` of a file in chunks. The chunk after the one the
/// consumer takes is read meanwhile, so a cold file's next read waits on
/// the disk while the last one goes out to the client. The stream ends
/// after an error. To `send`, a chunk of [`mapped::SMALLEST`] or more is
/// given mapped (see [`mapped`]), not read: at once if the page cache holds
/// it whole, else once the blocking pool has brought it in.
fn read_file_range(file: File, range: ByteRange, send: bool) -> ByteStream {
    let file = Arc::new(file);
    // A file the page cache holds whole goes as one chunk: one mapping,
    // and as few `sendfile` calls as the socket takes.
    let len = range.end - range.start;
    if send
        && (mapped::SMALLEST as u64..=SENT_WHOLE).contains(&len)
        && let Some(whole) = mapped::cached(&file, range.start, len as usize)
    {
        return Box::pin(futures::stream::once(async { Ok(whole) }));
    }
    let reads = futures::stream::iter((range.start..range.end).step_by(IO_CHUNK))
        .map(move |at| {
            let file = file.clone();
            let n = (range.end - at).min(IO_CHUNK as u64) as usize;
            async move {
                if send && n >= mapped::SMALLEST {
                    if let Some(chunk) = mapped::cached(&file, at, n) {
                        return Ok(chunk);
                    }
                    // Cold: wait on the blocking pool for the disk to bring
                    // the chunk into the page cache, copying nothing, then
                    // send it from there. Where that fails (no descriptors
                    // for the pipe, say), the chunk is read instead: the
                    // read tells what, if anything, is wrong with the file.
                    let faulted = file.clone();
                    let brought = blocking(move || Ok(mapped::fault_in(&faulted, at, n).unwrap_or(false)));
                    if matches!(brought.await, Ok(true))
                        && let Some(chunk) = mapped::cached(&file, at, n)
                    {
                        return Ok(chunk);
                    }
                }
                read_chunk(&file, at, n).await
            }
        })
        .buffered(READ_AHEAD);
    Box::pin(super::ends_at_first_error(reads))
}

/// `n` bytes at `offset`. Bytes in the page cache are read on the calling
/// thread; the rest, which would wait for the disk, on the blocking pool,
/// so a cold file never stalls a worker that has warm requests to answer
/// (20 clients reading cold 10 MiB files at random went from 980–1,160
/// MB/s, when every read was made on the worker, to 1,150–1,390).
async fn read_chunk(file: &Arc<File>, offset: u64, n: usize) -> Result<Bytes> {
    let mut buf = BytesMut::with_capacity(n);
    let cached = match read_cached(file, &mut buf.spare_capacity_mut()[..n], offset) {
        Ok(0) => return Err(truncated()),
        Ok(k) => k,
        // Not cached, or no such flag on this file system: read it waiting.
        Err(Errno::AGAIN | Errno::OPNOTSUPP | Errno::INVAL) => 0,
        Err(e) => return Err(EngineError::io(NAME, e.into())),
    };
    // SAFETY: the kernel wrote the first `cached` bytes.
    unsafe { buf.set_len(cached) };
    if cached == n {
        return Ok(buf.freeze());
    }
    buf.resize(n, 0);
    let file = file.clone();
    blocking(move || match file.read_exact_at(&mut buf[cached..], offset + cached as u64) {
        Ok(()) => Ok(buf.freeze()),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(truncated()),
        Err(e) => Err(EngineError::io(NAME, e)),
    })
    .await
}

/// Reads what the page cache holds of `buf.len()` bytes at `offset`
/// (`preadv2` with `RWF_NOWAIT`) into memory not yet written: a chunk
/// zeroed first, only to be overwritten, took a fifth of the user time of
/// a 1 MB GET.
fn read_cached(file: &File, buf: &mut [std::mem::MaybeUninit<u8>], offset: u64) -> rustix::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: the one buffer is `buf`, writable for its length; the kernel
    // writes bytes only, and reports how many.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset as libc::off_t, libc::RWF_NOWAIT) };
    if n < 0 { Err(Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::IO)) } else { Ok(n as usize) }
}

fn truncated() -> EngineError {
    EngineError::damaged(NAME, "the blob file is shorter than its record: it was truncated on disk")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::BlobEngineExt;
    use crate::engine::conformance;

    #[tokio::test(flavor = "multi_thread")]
    async fn conformance() {
        let dir = tempfile::tempdir().unwrap();
        conformance::run_all(&FsEngine::open(dir.path()).unwrap()).await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn blobs_live_under_their_digest_and_staging_is_cleared_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let blob = engine.put_bytes(conformance::pattern(10, 1)).await.unwrap();
        let hex = blob.digest.to_hex();
        let expected = dir.path().join("blobs").join(&hex[..2]).join(&hex[2..4]).join(&hex);
        assert_eq!(engine.blob_path(&blob.digest), expected);
        assert!(expected.is_file());
        // A crash mid-upload leaves a staging file, unlocked; reopening
        // removes those of a gone pid and of this pid (an earlier run).
        let tmp = dir.path().join("tmp");
        std::fs::write(tmp.join(format!("{}-999999999-0000abcd-1", hostname())), b"x").unwrap();
        std::fs::write(tmp.join(format!("{}-{}-0000abcd-0", hostname(), std::process::id())), b"x").unwrap();
        drop(engine);
        // Another node sharing the directory is writing this one right now.
        let other_host = dir.path().join("tmp").join("some-other-host-1-0");
        std::fs::write(&other_host, b"in flight").unwrap();
        FsEngine::open(dir.path()).unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(left, vec![other_host], "only this host's abandoned staging files go");
    }

    /// While running, the collector's sweep removes staging files of this
    /// host's dead processes and stale ones of any host, and leaves this
    /// process's uploads in flight alone.
    #[tokio::test(flavor = "multi_thread")]
    async fn the_collector_removes_staging_files_dead_writers_left() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let mut live = engine.writer(None).await.unwrap();
        live.write(conformance::pattern(5000, 3)).await.unwrap();
        let tmp = dir.path().join("tmp");
        let dead = tmp.join(format!("{}-999999999-0000abcd-1", hostname()));
        let stale = tmp.join("some-other-host-1-0000abcd-1");
        for path in [&dead, &stale] {
            std::fs::write(path, b"x").unwrap();
        }
        let old = std::time::SystemTime::now() - STALE - std::time::Duration::from_secs(60);
        File::options().write(true).open(&stale).unwrap().set_modified(old).unwrap();
        let in_flight = tmp.join("another-host-1-0000abcd-2");
        std::fs::write(&in_flight, b"in flight").unwrap();
        // Of this host, under a pid that runs (pid 1, not this process):
        // a file past the lock's window that nobody holds was left by a
        // writer whose pid another process has since; one that is held, or
        // new enough to be about to be, is a live writer's.
        let running = |n: u32| tmp.join(format!("{}-1-0000abcd-{n}", hostname()));
        let (reused, held, new) = (running(1), running(2), running(3));
        for path in [&reused, &held, &new] {
            std::fs::write(path, b"x").unwrap();
        }
        let past_window = std::time::SystemTime::now() - LOCK_WINDOW - std::time::Duration::from_secs(1);
        for path in [&reused, &held] {
            File::options().write(true).open(path).unwrap().set_modified(past_window).unwrap();
        }
        let holder = File::open(&held).unwrap();
        rustix::fs::flock(&holder, rustix::fs::FlockOperation::NonBlockingLockExclusive).unwrap();
        engine.remove_abandoned().await.unwrap();
        let mut left: Vec<_> = std::fs::read_dir(&tmp).unwrap().map(|e| e.unwrap().path()).collect();
        left.sort();
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left.contains(&in_flight) && !left.contains(&dead) && !left.contains(&stale), "{left:?}");
        assert!(!left.contains(&reused) && left.contains(&held) && left.contains(&new), "{left:?}");
        let digest = Digest(crate::engine::sha2_digest(&conformance::pattern(5000, 3)));
        live.finish(digest).await.unwrap();
    }

    /// Two engines on one directory in one process look like two
    /// containers of one host, both pid 1: opening the second must leave
    /// the first's upload in flight alone, and both write.
    #[tokio::test(flavor = "multi_thread")]
    async fn an_engine_opened_beside_a_live_one_keeps_its_uploads() {
        let dir = tempfile::tempdir().unwrap();
        let first = FsEngine::open(dir.path()).unwrap();
        let (a, b) = (conformance::pattern(5000, 1), conformance::pattern(5000, 2));
        let mut wa = first.writer(None).await.unwrap();
        wa.write(a.clone()).await.unwrap();
        let second = FsEngine::open(dir.path()).unwrap();
        let mut wb = second.writer(None).await.unwrap();
        wb.write(b.clone()).await.unwrap();
        let blob_a = wa.finish(Digest(crate::engine::sha2_digest(&a))).await.unwrap();
        let blob_b = wb.finish(Digest(crate::engine::sha2_digest(&b))).await.unwrap();
        assert!(second.read_to_vec(&blob_a, ByteRange::full(5000)).await.unwrap() == a);
        assert!(first.read_to_vec(&blob_b, ByteRange::full(5000)).await.unwrap() == b);
    }

    /// Out of space reported by the sync of a staging file (a quota, a
    /// network file system) fails that upload alone; other sync errors
    /// still stop writes.
    #[test]
    fn a_staging_file_sync_out_of_space_is_no_space() {
        let err = |code| staging_sync_err(io::Error::from_raw_os_error(code));
        assert!(matches!(err(libc::ENOSPC), EngineError::NoSpace));
        assert!(matches!(err(libc::EDQUOT), EngineError::NoSpace));
        assert!(matches!(err(libc::EIO), EngineError::SyncFailed(_)));
    }

    /// A blob that cannot be put in place, its fan-out directory blocked by
    /// a file, fails its write and leaves no staging file behind.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_failed_finish_removes_its_staging_file() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        for (seed, level) in [(1, 1), (2, 2)] {
            let body = conformance::pattern(5000, seed);
            // The first level blocked: making the second fails (ENOTDIR);
            // the second blocked: renaming into it does.
            let dest = engine.blob_path(&Digest(crate::engine::sha2_digest(&body)));
            let blocked = dest.ancestors().nth(3 - level).unwrap();
            std::fs::create_dir_all(blocked.parent().unwrap()).unwrap();
            std::fs::write(blocked, b"not a directory").unwrap();
            let err = engine.put_bytes(body).await.unwrap_err();
            assert!(err.to_string().contains("Not a directory"), "{err}");
            let left: Vec<_> = std::fs::read_dir(dir.path().join("tmp")).unwrap().collect();
            assert!(left.is_empty(), "staging files left: {left:?}");
        }
    }

    /// Fan-out directories removed from outside while the engine runs (it
    /// remembers them as made) are made again by the next write into them.
    #[tokio::test(flavor = "multi_thread")]
    async fn directories_removed_under_a_running_engine_are_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let body = conformance::pattern(5000, 3);
        let blob = engine.put_bytes(body.clone()).await.unwrap();
        let first_level = engine.blob_path(&blob.digest).ancestors().nth(2).unwrap().to_path_buf();
        std::fs::remove_dir_all(&first_level).unwrap();
        assert_eq!(engine.put_bytes(body.clone()).await.unwrap(), blob);
        assert!(engine.read_to_vec(&blob, ByteRange::full(5000)).await.unwrap() == body);
    }

    /// Drops a file's pages from the page cache, written back first.
    fn evict(file: &File) {
        file.sync_all().unwrap();
        rustix::fs::fadvise(file, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    }

    /// Bytes not in the page cache come through the blocking pool, whole
    /// and in order, from any offset.
    #[tokio::test(flavor = "multi_thread")]
    async fn reads_of_evicted_files_come_whole() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let body = conformance::pattern(3 * IO_CHUNK + 1234, 7);
        let blob = engine.put_bytes(body.clone()).await.unwrap();
        for range in [ByteRange::full(body.len() as u64), ByteRange { start: 100_000, end: 2 * IO_CHUNK as u64 + 5 }] {
            evict(&File::open(engine.blob_path(&blob.digest)).unwrap());
            let read = engine.read_to_vec(&blob, range).await.unwrap();
            assert_eq!(read, body[range.start as usize..range.end as usize]);
        }
    }

    /// To be sent, chunks of a file come mapped, those not in the page
    /// cache once the disk has brought them in; a chunk too small to be
    /// worth a mapping is read. Either way they hold the file's bytes.
    #[tokio::test(flavor = "multi_thread")]
    async fn chunks_to_send_are_mapped_cold_or_cached() {
        use futures::TryStreamExt;
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let body = conformance::pattern(3 * IO_CHUNK + 1234, 8);
        let blob = engine.put_bytes(body.clone()).await.unwrap();
        let file = File::open(engine.blob_path(&blob.digest)).unwrap();
        let range = ByteRange { start: 1000, end: body.len() as u64 };
        for cached in [false, true] {
            if cached {
                engine.read_to_vec(&blob, ByteRange::full(body.len() as u64)).await.unwrap();
            } else {
                evict(&file);
            }
            let chunks: Vec<Bytes> = engine.read_to_send(&blob, range).await.unwrap().try_collect().await.unwrap();
            let mapped: Vec<bool> = chunks.iter().map(|c| mapped::find(c.as_ptr(), c.len()).is_some()).collect();
            // A cached file goes whole; an evicted one chunk by chunk, the
            // last, of 234 bytes, read.
            assert_eq!(mapped, if cached { vec![true] } else { vec![true, true, true, false] });
            assert_eq!(chunks.concat(), body[1000..]);
        }
    }

    /// Whole pieces go to the disk directly where the file system allows
    /// it (ext4 here), the last through the page cache; where it does not
    /// (tmpfs), every piece goes through the page cache. Either way the blob
    /// holds the bytes written, in chunks that straddle the pieces.
    #[tokio::test(flavor = "multi_thread")]
    async fn whole_pieces_are_written_directly_where_the_file_system_allows() {
        use std::os::unix::fs::OpenOptionsExt;
        let body = conformance::pattern(3 * IO_CHUNK + 1234, 10);
        let mut dirs = vec![tempfile::tempdir().unwrap()];
        if Path::new("/dev/shm").is_dir() {
            dirs.push(tempfile::tempdir_in("/dev/shm").unwrap());
        }
        for dir in &dirs {
            let probe = dir.path().join("probe");
            let allowed = File::options().write(true).create(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok();
            let engine = FsEngine::open(dir.path()).unwrap();
            let mut w = engine.staging_writer().await.unwrap();
            let mut chunks = body.chunks(100_003);
            for chunk in chunks.by_ref().take(8) {
                w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
            }
            w.settle().await.unwrap();
            let open_direct = rustix::fs::fcntl_getfl(&*w.file).unwrap().contains(rustix::fs::OFlags::DIRECT);
            assert_eq!((w.direct == Direct::On, open_direct), (allowed, allowed), "in {:?}", dir.path());
            for chunk in chunks {
                w.write(Bytes::copy_from_slice(chunk)).await.unwrap();
            }
            let digest = Digest(crate::engine::sha2_digest(&body));
            let blob = Box::new(w).finish(digest).await.unwrap();
            assert_eq!(blob.size, body.len() as u64);
            assert_eq!(std::fs::read(engine.blob_path(&digest)).unwrap(), body);
        }
    }

    /// A blob file cut short on disk ends its stream with an error rather
    /// than short data.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_truncated_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let blob = engine.put_bytes(conformance::pattern(2 * IO_CHUNK, 8)).await.unwrap();
        File::options()
            .write(true)
            .open(engine.blob_path(&blob.digest))
            .unwrap()
            .set_len(IO_CHUNK as u64 + 10)
            .unwrap();
        let err = engine.read_to_vec(&blob, ByteRange::full(blob.size)).await.unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_read_ends_at_its_first_error_though_later_chunks_were_read_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let engine = FsEngine::open(dir.path()).unwrap();
        let bytes = conformance::pattern(4 * IO_CHUNK, 9);
        let blob = engine.put_bytes(bytes.clone()).await.unwrap();
        File::options().write(true).open(engine.blob_path(&blob.digest)).unwrap().set_len(IO_CHUNK as u64).unwrap();
        let items: Vec<_> = engine.read(&blob, ByteRange::full(blob.size)).await.unwrap().collect().await;
        assert_eq!(items.len(), 2, "the first chunk, then one error");
        assert_eq!(items[0].as_ref().unwrap(), &bytes[..IO_CHUNK]);
        assert!(items[1].as_ref().is_err_and(|e| e.to_string().contains("truncated")));
    }
}
