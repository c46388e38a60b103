//! `depot bench smallfiles`, after a comment on the first seed asking for
//! 100 million files of 1-30 KB: many files of random sizes from 1 to 30 KB
//! written through depot's HTTP API by many connections at once, per
//! engine, and as plain files on the scratch disk (each written and
//! fsynced, by as many threads). Then the disk space they take per byte
//! stored, the time to list them all, and the rate of reads of random
//! files. Keys fan out like a careful user's directory tree: two levels of
//! two hex digits (`ab/cd/abcd…`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use http::Method;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::load::{self, Connection, Plan};
use super::stats::Summary;
use super::{DataDir, DepotServer, EngineChoice, ExperimentReport, Progress, Row, Settings, disk_usage, thousands};

const NAME: &str = "smallfiles";
/// Connections writing and reading at once (threads, for plain files).
const CONCURRENCY: usize = 32;
const MIN_SIZE: usize = 1024;
const MAX_SIZE: usize = 30 * 1024;
const RATE: &str = "files/s";
const BUCKET: &str = "files";
/// Where the files go under the bucket.
const PREFIX: &str = "small/";
/// Entries per listing page: the most depot gives.
const PAGE: usize = 10_000;
const PLAIN: &str = "plain files (ext4)";

/// How many files, and how long random reads run.
#[derive(Clone, Copy, Debug)]
struct Scale {
    files: usize,
    reads: Plan,
}

fn scale(settings: &Settings) -> Scale {
    let plan = |warmup, rounds, round| Plan { concurrency: CONCURRENCY, warmup, rounds, round };
    if settings.quick {
        Scale { files: 2_000, reads: plan(Duration::from_millis(300), 3, Duration::from_millis(500)) }
    } else if settings.full {
        Scale { files: 10_000_000, reads: plan(Duration::from_secs(5), 5, Duration::from_secs(10)) }
    } else {
        Scale { files: 100_000, reads: plan(Duration::from_secs(1), 3, Duration::from_secs(3)) }
    }
}

/// A well-mixed 64-bit number from `i` (splitmix64's finaliser).
fn mix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The name of file `i`, below the prefix: `ab/cd/abcd0123456789ef`.
fn name(i: usize) -> String {
    let h = mix(i as u64);
    format!("{:02x}/{:02x}/{h:016x}", h >> 56, (h >> 48) & 0xff)
}

/// The content of file `i`: 1 to 30 KB of random bytes, the same on every
/// run.
fn content(i: usize) -> Vec<u8> {
    let mut rng = rng_of(i);
    let mut bytes = vec![0u8; rng.random_range(MIN_SIZE..=MAX_SIZE)];
    rng.fill(&mut bytes[..]);
    bytes
}

/// The length of file `i`, as [`content`] makes it, without making it.
fn size(i: usize) -> usize {
    rng_of(i).random_range(MIN_SIZE..=MAX_SIZE)
}

fn rng_of(i: usize) -> SmallRng {
    SmallRng::seed_from_u64(mix(i as u64 ^ 0x736d_616c_6c00))
}

fn logical_bytes(files: usize) -> u64 {
    (0..files).map(|i| content(i).len() as u64).sum()
}

/// What was measured for one subject.
struct Measured {
    ingest: f64,
    disk_per_byte: f64,
    listing: Duration,
    listed: usize,
    reads: Summary,
    latency: Option<(f64, f64)>,
    peak_rss: Option<u64>,
}

pub async fn run(settings: &Settings) -> anyhow::Result<ExperimentReport> {
    let scale = scale(settings);
    let progress = Progress::new(NAME, settings.engines.len() as u64 + 1);
    let cases = Cases::new(scale.files);
    progress.doing("sizing the files");
    let logical = tokio::task::spawn_blocking(move || logical_bytes(scale.files)).await?;
    let mut rows = Vec::new();
    for (i, engine) in settings.engines.iter().enumerate() {
        let subject = engine.subject();
        progress.doing(&format!("{subject}: starting"));
        let measured = match &engine.serve_flags {
            Err(why) => Err(why.clone()),
            Ok(flags) => {
                measure_depot(engine, flags, i, scale, logical, settings, &progress).await.map_err(|e| format!("{e:#}"))
            }
        };
        rows.extend(cases.rows(&subject, measured));
        progress.done(1);
    }
    progress.doing("plain files: writing");
    let dir = settings.scratch.join("smallfiles-plain");
    let measured = measure_plain(dir.clone(), scale, logical, &progress).await.map_err(|e| format!("{e:#}"));
    let _ = std::fs::remove_dir_all(&dir);
    rows.extend(cases.rows(PLAIN, measured));
    progress.done(1);
    progress.finish();
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "Many small files (seed: comment on GridFS vs SQL Server vs local)".into(),
        method: vec![
            format!(
                "{} files of random sizes from 1 to 30 KB ({} MB in all), keys fanned out in two levels of two hex \
                 digits (ab/cd/abcd…), written {CONCURRENCY} at a time: PUTs over {CONCURRENCY} keep-alive \
                 connections to a fresh depot per engine (every answer durable), or for plain files \
                 {CONCURRENCY} threads each creating, writing and fsyncing a file (directories not fsynced). \
                 The seed's commenter asked for 100,000,000 such files (--full: 10,000,000).",
                thousands(scale.files as u64),
                thousands(logical / 1_000_000),
            ),
            "disk bytes per byte: the data directory's allocated blocks (catalog included; for an engine on its \
             own server, plus its /_/stats disk_bytes), or the plain tree's, over the bytes written, at rest: \
             once it has not changed for a second (at most 30 s after the writes), so that a compaction or \
             memtable flush under way, with its output file allocated ahead, is not counted. listing: \
             every key, walking the tree folder by folder (depot: GET /files/small/…/ with Accept: \
             application/json, 10,000 entries per page; plain: read_dir)."
                .into(),
            format!(
                "random reads: GETs of random files over {CONCURRENCY} connections (plain: {CONCURRENCY} threads \
                 reading whole files), page cache warm; {:.1} s warm-up, then {} rounds of {} s, median and \
                 spread of the rounds' rates. server peak RSS: the depot process's high-water mark over the run.",
                scale.reads.warmup.as_secs_f64(),
                scale.reads.rounds,
                scale.reads.round.as_secs_f64()
            ),
            "No seed figures: the commenter's experiment was never run.".into(),
        ],
        chart_metric: RATE.into(),
        ratio: None,
        also_charted: Vec::new(),
        rows,
    })
}

/// The cases of the report.
struct Cases {
    ingest: String,
    list: String,
    read: String,
}

impl Cases {
    fn new(files: usize) -> Cases {
        Cases {
            ingest: format!("write {} files", thousands(files as u64)),
            list: "list them all".into(),
            read: "read random files".into(),
        }
    }

    fn rows(&self, subject: &str, measured: Result<Measured, String>) -> Vec<Row> {
        let m = match measured {
            Ok(m) => m,
            Err(why) => {
                return [&self.ingest, &self.list, &self.read]
                    .into_iter()
                    .map(|case| Row::skipped(NAME, case, subject, RATE, &why))
                    .collect();
            }
        };
        let mut rows = vec![
            Row::single(NAME, &self.ingest, subject, RATE, m.ingest),
            Row::single(NAME, &self.ingest, subject, "disk bytes per byte", m.disk_per_byte),
        ];
        if let Some(b) = m.peak_rss {
            rows.push(Row::single(NAME, &self.ingest, subject, "server peak RSS MB", b as f64 / 1e6));
        }
        rows.push(Row::single(NAME, &self.list, subject, "s", m.listing.as_secs_f64()));
        rows.push(Row::single(NAME, &self.list, subject, RATE, m.files_listed_per_s()));
        rows.push(Row::measured(NAME, &self.read, subject, RATE, m.reads));
        if let Some((p50, p99)) = m.latency {
            rows.push(Row::single(NAME, &self.read, subject, "p50 ms", p50));
            rows.push(Row::single(NAME, &self.read, subject, "p99 ms", p99));
        }
        rows
    }
}

impl Measured {
    fn files_listed_per_s(&self) -> f64 {
        self.listed as f64 / self.listing.as_secs_f64()
    }
}

async fn measure_depot(
    engine: &EngineChoice,
    flags: &[String],
    index: usize,
    scale: Scale,
    logical: u64,
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<Measured> {
    let subject = engine.subject();
    let data = DataDir::new(settings.scratch.join(format!("smallfiles-{index}-{}", engine.name)));
    let server = DepotServer::start(&engine.name, flags, data.path(), settings.threads)?;
    let addr = server.addr;
    let usage_at_start = super::remote_usage(&server, &engine.name).await;
    progress.doing(&format!("{subject}: writing {} files", thousands(scale.files as u64)));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let writers: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let next = next.clone();
            tokio::spawn(async move {
                let mut conn = Connection::open(addr).await?;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= scale.files {
                        return anyhow::Ok(());
                    }
                    let path = format!("/{BUCKET}/{PREFIX}{}", name(i));
                    conn.expect_ok(load::request(Method::PUT, addr, &path, content(i).into())).await?;
                }
            })
        })
        .collect();
    for w in writers {
        w.await??;
    }
    let ingest = scale.files as f64 / started.elapsed().as_secs_f64();
    let disk_per_byte =
        at_rest(|| super::stored_bytes(&server, &engine.name, &usage_at_start)).await? as f64 / logical as f64;

    progress.doing(&format!("{subject}: listing"));
    let started = Instant::now();
    let listed = list_depot(addr).await?;
    let listing = started.elapsed();
    if listed != scale.files {
        bail!("the listing gave {listed} files of {}", scale.files);
    }

    progress.doing(&format!("{subject}: random reads"));
    let files = scale.files as u64;
    let make: load::MakeRequest = Arc::new(move |w, seq| {
        let i = (mix((w as u64) << 40 ^ seq) % files) as usize;
        load::expecting(
            load::request(Method::GET, addr, &format!("/{BUCKET}/{PREFIX}{}", name(i)), Bytes::new()),
            size(i),
        )
    });
    let outcome = load::run(addr, scale.reads, make).await?;
    let reads = outcome.rate().context("no read rounds")?;
    let latency = outcome.latency_ms(50.0).zip(outcome.latency_ms(99.0));
    let peak_rss = server.peak_rss();
    if super::stores_on_a_server(&engine.name) {
        progress.doing(&format!("{subject}: removing the files"));
        let keys = (0..scale.files).map(|i| format!("{PREFIX}{}", name(i)));
        super::purge(server, engine, BUCKET, keys).await.context("removing the files written")?;
    } else {
        drop(server);
    }
    Ok(Measured { ingest, disk_per_byte, listing, listed, reads, latency, peak_rss })
}

/// Lists every key under the prefix, folder by folder, page by page; the
/// number of keys.
async fn list_depot(addr: std::net::SocketAddr) -> anyhow::Result<usize> {
    let mut conn = Connection::open(addr).await?;
    let mut folders = vec![PREFIX.to_string()];
    let mut count = 0;
    while let Some(folder) = folders.pop() {
        let mut after: Option<String> = None;
        loop {
            let mut path = format!("/{BUCKET}/{folder}?limit={PAGE}");
            if let Some(a) = &after {
                let a = percent_encoding::utf8_percent_encode(a, percent_encoding::NON_ALPHANUMERIC);
                path.push_str(&format!("&after={a}"));
            }
            let mut req = load::request(Method::GET, addr, &path, Bytes::new());
            req.headers_mut().insert(http::header::ACCEPT, http::HeaderValue::from_static("application/json"));
            let page: serde_json::Value =
                serde_json::from_slice(&conn.expect_ok(req).await?).with_context(|| format!("listing {path}"))?;
            count += page["entries"].as_array().map_or(0, Vec::len);
            if let Some(dirs) = page["dirs"].as_array() {
                folders.extend(dirs.iter().filter_map(|d| d.as_str()).map(str::to_string));
            }
            match page["next"].as_str() {
                Some(next) => after = Some(next.to_string()),
                None => break,
            }
        }
    }
    Ok(count)
}

async fn measure_plain(dir: PathBuf, scale: Scale, logical: u64, progress: &Progress) -> anyhow::Result<Measured> {
    let root = dir.clone();
    let ingest = tokio::task::spawn_blocking(move || write_plain(&root, scale.files)).await??;
    let disk_per_byte = at_rest(|| async { Ok(disk_usage(&dir)) }).await? as f64 / logical as f64;
    progress.doing("plain files: listing");
    let root = dir.clone();
    let (listed, listing) = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        walk(&root).map(|n| (n, started.elapsed()))
    })
    .await??;
    if listed != scale.files {
        bail!("the walk found {listed} files of {}", scale.files);
    }
    progress.doing("plain files: random reads");
    let reads = tokio::task::spawn_blocking(move || read_plain(&dir, scale)).await??;
    Ok(Measured { ingest, disk_per_byte, listing, listed, reads, latency: None, peak_rss: None })
}

/// Writes the files under `root` from as many threads as depot has
/// connections; files per second.
fn write_plain(root: &Path, files: usize) -> anyhow::Result<f64> {
    use std::io::Write;
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..CONCURRENCY)
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= files {
                            return Ok(());
                        }
                        let path = root.join(name(i));
                        if let Some(parent) = path.parent() {
                            std::fs::create_dir_all(parent)?;
                        }
                        let mut f = std::fs::File::create(&path).with_context(|| format!("{}", path.display()))?;
                        f.write_all(&content(i))?;
                        f.sync_all()?;
                    }
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?)
    })?;
    Ok(files as f64 / started.elapsed().as_secs_f64())
}

/// The number of files in the tree under `dir`.
fn walk(dir: &Path) -> anyhow::Result<usize> {
    let mut count = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            count += walk(&entry.path())?;
        } else {
            count += 1;
        }
    }
    Ok(count)
}

/// Reads random whole files from as many threads as depot has connections,
/// by the rounds of `scale.reads`; the rate of the rounds.
fn read_plain(root: &Path, scale: Scale) -> anyhow::Result<Summary> {
    let plan = scale.reads;
    let per_round: Vec<AtomicU64> = (0..plan.rounds).map(|_| AtomicU64::new(0)).collect();
    let start = Instant::now();
    let (measured_from, end) = (start + plan.warmup, start + plan.total());
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..plan.concurrency)
            .map(|w| {
                let per_round = &per_round;
                s.spawn(move || -> anyhow::Result<()> {
                    let mut rng = SmallRng::seed_from_u64(w as u64);
                    while Instant::now() < end {
                        let i = rng.random_range(0..scale.files);
                        let path = root.join(name(i));
                        let bytes = std::fs::read(&path).with_context(|| format!("{}", path.display()))?;
                        if bytes.len() < MIN_SIZE {
                            bail!("{} is cut short", path.display());
                        }
                        let done = Instant::now();
                        if done >= measured_from && done < end {
                            let round = ((done - measured_from).as_secs_f64() / plan.round.as_secs_f64()) as usize;
                            if let Some(n) = per_round.get(round) {
                                n.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a reader panicked"))?)
    })?;
    let secs = plan.round.as_secs_f64();
    let rates: Vec<f64> = per_round.iter().map(|n| n.load(Ordering::Relaxed) as f64 / secs).collect();
    Summary::of(&rates).context("no read rounds")
}

/// The size `measure` gives once it has held still for a second (at most
/// 30 s): the writes are acknowledged, but the server may still be
/// flushing or compacting, with new files allocated ahead of their bytes.
async fn at_rest<F, Fut>(measure: F) -> anyhow::Result<u64>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    const STILL: Duration = Duration::from_secs(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = measure().await?;
    loop {
        tokio::time::sleep(STILL).await;
        let now = measure().await?;
        if now == last || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_one_to_thirty_kilobytes_and_stable() {
        for i in 0..500 {
            let c = content(i);
            assert!((MIN_SIZE..=MAX_SIZE).contains(&c.len()), "{}", c.len());
        }
        assert_eq!(content(7), content(7));
        assert_ne!(content(7), content(8));
    }

    #[test]
    fn names_fan_out_in_two_hex_levels() {
        let n = name(12345);
        let parts: Vec<&str> = n.split('/').collect();
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2].len(), 16);
        assert!(parts[2].starts_with(&format!("{}{}", parts[0], parts[1])));
        let distinct: std::collections::HashSet<String> = (0..10_000).map(name).collect();
        assert_eq!(distinct.len(), 10_000);
    }

    #[test]
    fn plain_files_are_written_walked_and_read() {
        let dir = tempfile::tempdir().unwrap();
        let scale = Scale {
            files: 200,
            reads: Plan {
                concurrency: 4,
                warmup: Duration::from_millis(10),
                rounds: 2,
                round: Duration::from_millis(50),
            },
        };
        assert!(write_plain(dir.path(), scale.files).unwrap() > 0.0);
        assert_eq!(walk(dir.path()).unwrap(), 200);
        assert!(read_plain(dir.path(), scale).unwrap().min > 0.0);
    }
}
