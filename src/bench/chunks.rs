//! `depot bench chunks`, after the seed "GridFS chunk size": large files
//! written through depot's HTTP API into each chunking engine (gridfs,
//! postgres, sqlite: `depot serve --chunk-size`) at chunk sizes of 256 KB to
//! 8 MB, then read back with the client reading the answer in pieces of
//! 8 KB, 64 KB and 1 MB (the seed's `fread` size). Per engine and chunk
//! size: write and read rates per file, the depot server's CPU seconds per
//! phase and peak memory, and the peak memory of the engine's own server
//! when it runs on this machine (what the seed's readers asked for).
//!
//! The client speaks HTTP/1.1 over a plain socket so that the read size is
//! the size of each `read(2)`, and sends the bodies from one random block
//! held in memory (each file made distinct by its first bytes), so that
//! neither generating nor buffering data is timed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::rss::{self, Sampler};
use super::stats::Summary;
use super::{DataDir, DepotServer, EngineChoice, ExperimentReport, Progress, Row, Settings, drop_caches, thousands};

const NAME: &str = "chunks";
/// The engines that store a blob as chunks of `--chunk-size` bytes.
const CHUNKING: [&str; 3] = ["gridfs", "postgres", "sqlite"];
const KB: usize = 1024;
const MB: usize = 1024 * 1024;
const CHUNK_SIZES: [(&str, usize); 6] =
    [("256 KB", 256 * KB), ("512 KB", 512 * KB), ("1 MB", MB), ("2 MB", 2 * MB), ("4 MB", 4 * MB), ("8 MB", 8 * MB)];
/// The size of each read of the answer's body.
const READ_SIZES: [(&str, usize); 3] = [("8 KB", 8 * KB), ("64 KB", 64 * KB), ("1 MB", MB)];
/// The largest random block the bodies are cut from.
const BLOCK: usize = 64 * MB;
const WRITE: &str = "write MB/s";
/// Bytes at the start of each file that make it distinct: run, chunk size
/// and file number (depot stores equal content once).
const HEAD: usize = 24;

/// How many files of what size.
#[derive(Clone, Copy, Debug)]
struct Scale {
    files: usize,
    size: u64,
}

fn scale(settings: &Settings) -> Scale {
    if settings.quick {
        Scale { files: 2, size: 16 * MB as u64 }
    } else if settings.full {
        // The seed's files: dd bs=1M count=2000.
        Scale { files: 50, size: 2000 * MB as u64 }
    } else {
        Scale { files: 4, size: 256 * MB as u64 }
    }
}

fn case(chunk_label: &str) -> String {
    format!("chunk {chunk_label}")
}

fn read_metric(read_label: &str, cold: bool) -> String {
    format!("read MB/s, {read_label} reads{}", if cold { " (cold)" } else { "" })
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// What one engine at one chunk size gave.
struct Measured {
    /// MB/s per file.
    write: Vec<f64>,
    /// Per read size, MB/s per file; page cache warm.
    warm: Vec<Vec<f64>>,
    /// The same after dropping the page cache before each file.
    cold: Option<Vec<Vec<f64>>>,
    cpu_write: Option<f64>,
    cpu_read: Option<f64>,
    peak_rss: Option<u64>,
    /// The engine's own server, when it has one.
    backend_rss: Option<Result<u64, String>>,
}

pub async fn run(settings: &Settings) -> anyhow::Result<ExperimentReport> {
    let scale = scale(settings);
    let engines: Vec<&EngineChoice> = settings.engines.iter().filter(|e| CHUNKING.contains(&e.name.as_str())).collect();
    let progress = Progress::new(NAME, (engines.len() * CHUNK_SIZES.len()) as u64);
    let cold_possible = drop_caches();
    let block = {
        let mut b = vec![0u8; BLOCK.min(scale.size as usize)];
        rand::rngs::SmallRng::seed_from_u64(0x6368_756e).fill(&mut b[..]);
        Bytes::from(b)
    };
    let run_id: u64 = rand::rng().random();
    let mut rows = Vec::new();
    if settings.engines_named {
        for e in settings.engines.iter().filter(|e| !CHUNKING.contains(&e.name.as_str())) {
            let why = "stores each blob whole: --chunk-size does not apply";
            rows.push(Row::skipped(NAME, &case(CHUNK_SIZES[0].0), &e.subject(), WRITE, why));
        }
    }
    for (i, engine) in engines.iter().enumerate() {
        let subject = engine.subject();
        let flags = match &engine.serve_flags {
            Ok(flags) => flags,
            Err(why) => {
                for (label, _) in CHUNK_SIZES {
                    rows.push(Row::skipped(NAME, &case(label), &subject, WRITE, why));
                }
                progress.done(CHUNK_SIZES.len() as u64);
                continue;
            }
        };
        if let Err(why) = room_for(engine, scale, settings) {
            for (label, _) in CHUNK_SIZES {
                rows.push(Row::skipped(NAME, &case(label), &subject, WRITE, &why));
            }
            progress.done(CHUNK_SIZES.len() as u64);
            continue;
        }
        for (c, (label, chunk)) in CHUNK_SIZES.into_iter().enumerate() {
            let case = case(label);
            progress.doing(&format!("{subject}: {case}"));
            let step = Step { engine, flags, index: i, chunk, run_id, scale, block: &block };
            match step.measure(&cold_possible, settings, &progress).await {
                Ok(m) => rows.extend(measured_rows(&case, &subject, &m)),
                Err(e) => rows.push(Row::skipped(NAME, &case, &subject, WRITE, &format!("failed: {e:#}"))),
            }
            if c == 0
                && let Err(why) = &cold_possible
            {
                let metric = read_metric(READ_SIZES[0].0, true);
                rows.push(Row::skipped(NAME, &case, &subject, &metric, &format!("cold reads: {why}")));
            }
            progress.done(1);
        }
    }
    progress.finish();
    let total = scale.files as u64 * scale.size;
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "Chunk size of the chunking engines (seed: GridFS chunk size)".into(),
        method: vec![
            format!(
                "Per engine and chunk size, a fresh depot (`depot serve --chunk-size`) takes {} files of {} MiB \
                 ({} MB in all; the seed wrote 50 files of 2000 MB{}), one PUT at a time over HTTP/1.1 with \
                 Content-Length, then reads each back once per read size (8 KB, 64 KB, 1 MB: the size of every \
                 read(2) the client does on the socket, the seed's fread size). MB/s per file, median and \
                 spread (min..max) over the files. Rates and totals count MB = 10^6 bytes; chunk and read \
                 sizes, KB = 1024 bytes and MB = 1024 KB.",
                scale.files,
                scale.size / MB as u64,
                thousands(mb(total) as u64),
                if settings.full { "" } else { "; --full runs those" }
            ),
            "Reads come warm from the page cache right after the writes (the seed's reads came from disk: 100 \
             GB of files); with root, each file is also read cold, after syncing and dropping the page cache \
             (depot's and the engine server's own caches are kept)."
                .into(),
            "server CPU s: user + system time of the depot process over the phase (/proc/PID/stat), writes and \
             the warm reads of all three read sizes; server peak RSS: its high-water mark over the whole step; \
             backend peak RSS: the engine's own server and its children (a PostgreSQL cluster, with every \
             other session it serves), sampled every 50 ms, when it listens on this machine."
                .into(),
            "The seed published its results only as charts: writes got markedly faster at chunk sizes of 2 MB \
             and above, reads showed no trend; no figures to put beside ours."
                .into(),
        ],
        chart_metric: WRITE.into(),
        ratio: None,
        also_charted: Vec::new(),
        rows,
    })
}

/// Why there is no room for the files on the scratch disk, for an engine
/// that keeps them there.
fn room_for(engine: &EngineChoice, scale: Scale, settings: &Settings) -> Result<(), String> {
    if super::stores_on_a_server(&engine.name) {
        return Ok(());
    }
    // Chunked rows, pages and the write-ahead log: some slack beyond the bytes.
    let needed = scale.files as u64 * scale.size / 10 * 12;
    match free_bytes(&settings.scratch) {
        Some(free) if free < needed => Err(format!(
            "needs about {} GB free on the scratch disk, {} GB are",
            needed.div_ceil(1_000_000_000),
            free / 1_000_000_000
        )),
        _ => Ok(()),
    }
}

/// Free bytes on the file system holding `dir`, as `df` sees them.
fn free_bytes(dir: &std::path::Path) -> Option<u64> {
    let out = std::process::Command::new("df").args(["-B1", "--output=avail"]).arg(dir).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().nth(1)?.trim().parse().ok()
}

/// One engine at one chunk size.
struct Step<'a> {
    engine: &'a EngineChoice,
    flags: &'a [String],
    index: usize,
    chunk: usize,
    run_id: u64,
    scale: Scale,
    block: &'a Bytes,
}

impl Step<'_> {
    fn key(&self, file: usize) -> String {
        format!("chunks/{}/{file}", self.chunk)
    }

    fn head(&self, file: usize) -> [u8; HEAD] {
        let mut head = [0u8; HEAD];
        head[..8].copy_from_slice(&self.run_id.to_le_bytes());
        head[8..16].copy_from_slice(&(self.chunk as u64).to_le_bytes());
        head[16..].copy_from_slice(&(file as u64).to_le_bytes());
        head
    }

    async fn measure(
        &self,
        cold_possible: &Result<(), String>,
        settings: &Settings,
        progress: &Progress,
    ) -> anyhow::Result<Measured> {
        let subject = self.engine.subject();
        let name = &self.engine.name;
        let data = DataDir::new(settings.scratch.join(format!("chunks-{}-{name}-{}", self.index, self.chunk)));
        let mut flags = self.flags.to_vec();
        flags.extend(["--chunk-size".to_string(), self.chunk.to_string()]);
        let server = DepotServer::start(name, &flags, data.path(), settings.threads)?;
        let backend = backend_server(self.flags);
        let sampler = backend.as_ref().ok().copied().flatten().map(Sampler::start);
        let pid = server.pid();
        let (addr, size) = (server.addr, self.scale.size);
        let cpu_start = rss::cpu_seconds(pid);
        let mut write = Vec::new();
        for f in 0..self.scale.files {
            progress.doing(&format!("{subject}: chunk {} KB, writing file {}", self.chunk / KB, f + 1));
            let path = format!("/files/{}", self.key(f));
            let took = put_file(addr, &path, &self.head(f), size, self.block).await?;
            write.push(mb(size) / took.as_secs_f64());
        }
        let cpu_written = rss::cpu_seconds(pid);
        let mut warm = Vec::new();
        for (label, read_size) in READ_SIZES {
            progress.doing(&format!("{subject}: chunk {} KB, {label} reads", self.chunk / KB));
            let mut rates = Vec::new();
            for f in 0..self.scale.files {
                let took = get_file(addr, &format!("/files/{}", self.key(f)), read_size, size, &self.head(f)).await?;
                rates.push(mb(size) / took.as_secs_f64());
            }
            warm.push(rates);
        }
        let cpu_read = rss::cpu_seconds(pid);
        let cold = match cold_possible {
            Err(_) => None,
            Ok(()) => {
                let mut cold = Vec::new();
                for (label, read_size) in READ_SIZES {
                    progress.doing(&format!("{subject}: chunk {} KB, {label} reads, cold", self.chunk / KB));
                    let mut rates = Vec::new();
                    for f in 0..self.scale.files {
                        drop_caches().map_err(anyhow::Error::msg)?;
                        let path = format!("/files/{}", self.key(f));
                        let took = get_file(addr, &path, read_size, size, &self.head(f)).await?;
                        rates.push(mb(size) / took.as_secs_f64());
                    }
                    cold.push(rates);
                }
                Some(cold)
            }
        };
        let peak_rss = server.peak_rss();
        let backend_rss = match (backend, sampler) {
            (Ok(None), _) => None,
            (Err(why), _) => Some(Err(why)),
            (Ok(Some(_)), Some(s)) => Some(Ok(s.finish())),
            (Ok(Some(_)), None) => None,
        };
        if super::stores_on_a_server(name) {
            let keys = (0..self.scale.files).map(|f| self.key(f));
            super::purge(server, self.engine, "files", keys).await.context("removing the files written")?;
        } else {
            drop(server);
        }
        let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
        Ok(Measured {
            write,
            warm,
            cold,
            cpu_write: delta(cpu_start, cpu_written),
            cpu_read: delta(cpu_written, cpu_read),
            peak_rss,
            backend_rss,
        })
    }
}

/// The process of the engine's own server, found by the port of the URL in
/// its flags: `Ok(None)` when the engine has no server, why it cannot be
/// measured otherwise.
fn backend_server(flags: &[String]) -> Result<Option<u32>, String> {
    let Some(url) = flags.iter().find(|f| f.contains("://")) else { return Ok(None) };
    let port = rss::loopback_port(url)?;
    rss::listener_pid(port).map(Some).ok_or_else(|| format!("no process of ours listens on port {port}"))
}

fn measured_rows(case: &str, subject: &str, m: &Measured) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut rate = |metric: &str, values: &[f64]| {
        if let Some(s) = Summary::of(values) {
            rows.push(Row::measured(NAME, case, subject, metric, s));
        }
    };
    rate(WRITE, &m.write);
    for ((label, _), values) in READ_SIZES.iter().zip(&m.warm) {
        rate(&read_metric(label, false), values);
    }
    if let Some(cold) = &m.cold {
        for ((label, _), values) in READ_SIZES.iter().zip(cold) {
            rate(&read_metric(label, true), values);
        }
    }
    if let Some(s) = m.cpu_write {
        rows.push(Row::single(NAME, case, subject, "server CPU s, writes", s));
    }
    if let Some(s) = m.cpu_read {
        rows.push(Row::single(NAME, case, subject, "server CPU s, warm reads", s));
    }
    if let Some(b) = m.peak_rss {
        rows.push(Row::single(NAME, case, subject, "server peak RSS MB", mb(b)));
    }
    match &m.backend_rss {
        Some(Ok(b)) => rows.push(Row::single(NAME, case, subject, "backend peak RSS MB", mb(*b))),
        Some(Err(why)) => rows.push(Row::skipped(NAME, case, subject, "backend peak RSS MB", why)),
        None => {}
    }
    rows
}

async fn connect(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// The status line and headers of an answer, once `buf` holds them all:
/// the status code and the header block's length.
fn answer_head(buf: &[u8]) -> anyhow::Result<Option<(u16, usize, Option<u64>)>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { return Ok(None) };
    let text = std::str::from_utf8(&buf[..end]).context("the answer's headers are not UTF-8")?;
    let mut lines = text.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("status line {:?}", text.lines().next().unwrap_or("")))?;
    let length = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("content-length").then(|| v.trim().parse().ok()).flatten()
    });
    Ok(Some((status, end + 4, length)))
}

/// PUTs a file of `size` bytes (`head`, then `block` over and over) and
/// waits for the answer; the time from connecting to the answer.
async fn put_file(addr: SocketAddr, path: &str, head: &[u8], size: u64, block: &Bytes) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut s = connect(addr).await?;
    let request = format!("PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {size}\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    s.write_all(head).await?;
    let mut left = size - head.len() as u64;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        s.write_all(&block[..n]).await.with_context(|| format!("PUT {path}: sending the body"))?;
        left -= n as u64;
    }
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).await.with_context(|| format!("PUT {path}: reading the answer"))?;
    let took = started.elapsed();
    match answer_head(&answer)? {
        Some((status, _, _)) if (200..300).contains(&status) => Ok(took),
        _ => bail!("PUT {path}: {}", String::from_utf8_lossy(&answer[..answer.len().min(300)])),
    }
}

/// GETs a file of `size` bytes reading the socket `read_size` bytes at a
/// time; checks its length and first bytes; the time from connecting to
/// the last byte.
async fn get_file(addr: SocketAddr, path: &str, read_size: usize, size: u64, head: &[u8]) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut s = connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut buf = vec![0u8; read_size];
    // The headers and the body's first bytes, until both are in.
    let mut start = Vec::new();
    let mut body = 0u64;
    let mut length = None;
    loop {
        let n = s.read(&mut buf).await.with_context(|| format!("GET {path}"))?;
        if n == 0 {
            break;
        }
        if length.is_some() && start.len() >= HEAD {
            body += n as u64;
            continue;
        }
        start.extend_from_slice(&buf[..n]);
        if length.is_none() {
            match answer_head(&start)? {
                None if start.len() > 64 * KB => bail!("GET {path}: headers without end"),
                None => {}
                Some((200, end, Some(len))) => {
                    length = Some(len);
                    start.drain(..end);
                }
                Some(_) => bail!("GET {path}: {}", String::from_utf8_lossy(&start[..start.len().min(300)])),
            }
        }
    }
    let took = started.elapsed();
    body += start.len() as u64;
    if length != Some(size) || body != size {
        bail!("GET {path}: {body} bytes (Content-Length {length:?}), expected {size}");
    }
    if !start.starts_with(head) {
        bail!("GET {path}: not the file written");
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_heads_are_parsed() {
        let a = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nx: y\r\n\r\nhello";
        assert_eq!(answer_head(a).unwrap(), Some((200, a.len() - 5, Some(5))));
        assert_eq!(answer_head(b"HTTP/1.1 201 Created\r\n\r\n").unwrap(), Some((201, 24, None)));
        assert_eq!(answer_head(b"HTTP/1.1 200 OK\r\nContent-Le").unwrap(), None);
        assert!(answer_head(b"garbage\r\n\r\n").is_err());
    }

    #[tokio::test]
    async fn files_go_through_a_server_and_come_back_whole() {
        // A server of this test: takes one PUT, then answers one GET with
        // the bytes it took.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let size = 300_000u64;
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            while got.windows(4).position(|w| w == b"\r\n\r\n").is_none_or(|end| got.len() < end + 4 + 300_000) {
                let mut buf = [0u8; 65536];
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n").await.unwrap();
            drop(s);
            let body = got.split_off(got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4);
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).as_bytes()).await.unwrap();
            s.write_all(&body).await.unwrap();
        });
        let block = Bytes::from(vec![7u8; 100_000]);
        let head = [1u8; HEAD];
        put_file(addr, "/files/x", &head, size, &block).await.unwrap();
        get_file(addr, "/files/x", 8 * KB, size, &head).await.unwrap();
        server.await.unwrap();
    }

    #[test]
    fn engines_without_a_server_have_no_backend() {
        assert_eq!(backend_server(&[]), Ok(None));
        let remote = ["--engine-url".to_string(), "postgres://x@db.example.com/d".to_string()];
        assert!(backend_server(&remote).unwrap_err().contains("not on this machine"));
    }
}
