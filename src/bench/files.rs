//! `depot bench files`, after the seed "GridFS vs SQL Server vs Local": N
//! files of S bytes written through depot's HTTP API by one client, then N
//! more by 20 clients at once; then read back, all in order by one client,
//! and by 20 clients fetching random files. Per engine: time and MB/s of
//! each phase, the upload time spent registering in the catalog vs
//! streaming bytes (the split the seed measured), the server's and the
//! backend server's peak memory, and bytes on disk per byte stored. The
//! physical reference is plain files written and fsynced by this process
//! the same way (`cp` plus `fsync`), and read back the same way (`dd bs=1M`),
//! each phase right after the same phase through depot. The read phases
//! also run through nginx serving those plain files, right after them: how
//! fast any HTTP server delivers the disk's bytes on this machine.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use bytes::Bytes;
use http::Method;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::load::{self, Connection};
use super::nginx::{Nginx, Reads};
use super::stats::Summary;
use super::{
    DataDir, DepotServer, EngineChoice, ExperimentReport, Progress, Ratio, Row, Settings, disk_usage, drop_caches,
    purge, remote_usage, rss, server_stats, stored_bytes, stores_on_a_server,
};

const NAME: &str = "files";
const MBS: &str = "MB/s";
const DISK: &str = "disk bytes per byte";
const CLIENTS: usize = 20;
/// Runs of each read phase per subject.
const READ_ROUNDS: usize = 3;
const PLAIN: &str = "plain files (write + fsync)";
const RATIO: &str = "× plain files";
const NGINX: &str = "nginx (the plain files, sendfile, aio threads)";
const NGINX_RATIO: &str = "× nginx";
/// Where nginx serves the plain files.
const NGINX_DIR: &str = "plain";
/// Bytes per `read` of a plain file.
const READ_SIZE: usize = 1 << 20;

/// The seed's MB/s for NTFS, SQL Server and GridFS by phase: 10,000 MB
/// over its published seconds (165, 998, 921 by one thread; 170, 840, 668
/// by 20), to one decimal.
const SEED_WRITE_1: [(f64, &str); 3] = [(60.6, "NTFS"), (10.0, "SQL Server"), (10.9, "GridFS")];
const SEED_WRITE_20: [(f64, &str); 3] = [(58.8, "NTFS"), (11.9, "SQL Server"), (15.0, "GridFS")];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Write1,
    Write20,
    ReadSeq,
    Read20,
}

impl Phase {
    const ALL: [Phase; 4] = [Phase::Write1, Phase::Write20, Phase::ReadSeq, Phase::Read20];

    fn case(self) -> &'static str {
        match self {
            Phase::Write1 => "write, 1 client",
            Phase::Write20 => "write, 20 clients",
            Phase::ReadSeq => "read, 1 client in order",
            Phase::Read20 => "read, 20 clients at random",
        }
    }

    fn reads(self) -> bool {
        matches!(self, Phase::ReadSeq | Phase::Read20)
    }

    /// Runs per subject: reads leave nothing behind, so they repeat (each
    /// from a cold cache); writes run once.
    fn rounds(self) -> usize {
        if self.reads() { READ_ROUNDS } else { 1 }
    }

    fn round_label(self, round: usize) -> String {
        if self.rounds() > 1 { format!(", round {} of {}", round + 1, self.rounds()) } else { String::new() }
    }

    /// The seed's figure for a subject like the one measured.
    fn seed(self, like: Option<usize>) -> Option<(f64, &'static str)> {
        let like = like?;
        match self {
            Phase::Write1 => Some(SEED_WRITE_1[like]),
            Phase::Write20 => Some(SEED_WRITE_20[like]),
            _ => None,
        }
    }
}

/// Which of the seed's subjects an engine stands in for.
fn seed_like(engine: &str) -> Option<usize> {
    match engine {
        "fs" | PLAIN => Some(0),
        "sqlite" | "postgres" => Some(1),
        "gridfs" => Some(2),
        _ => None,
    }
}

#[derive(Clone, Copy, Debug)]
struct Scale {
    files: usize,
    size: usize,
}

/// (File counts are multiples of [`CLIENTS`], so every client has as many.)
fn scale(settings: &Settings) -> Scale {
    if settings.full {
        Scale { files: 1000, size: 10_000_000 }
    } else if settings.quick {
        Scale { files: 20, size: 2 << 20 }
    } else {
        Scale { files: 200, size: 10 << 20 }
    }
}

/// The bytes of file `n`: one random buffer, made distinct per file by its
/// first bytes, so no upload is a dedup hit and generating costs a copy.
fn file_bytes(base: &Bytes, n: usize) -> Bytes {
    let mut b = base.to_vec();
    b[..8].copy_from_slice(&(n as u64).to_le_bytes());
    b.into()
}

fn name(n: usize) -> String {
    format!("f{n:06}")
}

fn key(n: usize) -> String {
    format!("/files/bench/{}", name(n))
}

fn nginx_path(n: usize) -> String {
    format!("/{NGINX_DIR}/{}", name(n))
}

/// What one engine's run measured besides the phase rates.
#[derive(Default)]
struct Extra {
    catalog_secs: f64,
    bytes_secs: f64,
    server_peak: u64,
}

pub async fn run(settings: &Settings) -> anyhow::Result<ExperimentReport> {
    let scale = scale(settings);
    let base: Bytes = {
        let mut b = vec![0u8; scale.size];
        SmallRng::seed_from_u64(11).fill(&mut b[..]);
        b.into()
    };
    // Per engine: each run through depot, then the same run on plain files,
    // then the read runs through nginx.
    let runs: usize = Phase::ALL.iter().map(|p| p.rounds()).sum();
    let read_runs: usize = Phase::ALL.iter().filter(|p| p.reads()).map(|p| p.rounds()).sum();
    let per_engine = (2 * runs + read_runs) as u64;
    let progress = Progress::new(NAME, per_engine * settings.engines.len() as u64);
    let mut rows = Vec::new();
    let logical = (2 * scale.files * scale.size) as f64;
    let cold = drop_caches().is_ok();
    let plain = Plain::new(&settings.scratch.join("files-plain"), scale, base.clone(), cold);
    progress.doing("nginx: starting");
    let nginx = Nginx::start(&settings.scratch.join("files-nginx"), settings.threads, Reads::Cold)
        .and_then(|n| {
            std::os::unix::fs::symlink(&plain.dir, n.root.join(NGINX_DIR))?;
            Ok(n)
        })
        .map_err(|e| format!("{e:#}"));
    // Every phase of the peers runs right after the same phase through
    // depot, so all see the machine in the same state: runs of one subject
    // drift far apart on a shared machine.
    let mut all = Peers::new(&nginx);
    let mut nginx_vs_plain = PhaseSecs::default();
    for (i, engine) in settings.engines.iter().enumerate() {
        progress.part(per_engine);
        let subject = engine.subject();
        let skip_all = |rows: &mut Vec<Row>, why: &str| {
            for phase in Phase::ALL {
                rows.push(
                    Row::skipped(NAME, phase.case(), &subject, MBS, why).with_seed(phase.seed(seed_like(&engine.name))),
                );
            }
        };
        let flags = match &engine.serve_flags {
            Ok(f) => f,
            Err(why) => {
                skip_all(&mut rows, why);
                continue;
            }
        };
        progress.doing(&format!("{subject}: starting"));
        // At --full each engine's files take 20 GB: one engine's at a time.
        let data = DataDir::new(settings.scratch.join(format!("files-{i}-{}", engine.name)));
        let mut server = match DepotServer::start(&engine.name, flags, data.path(), settings.threads) {
            Ok(s) => s,
            Err(e) => {
                skip_all(&mut rows, &format!("{e:#}"));
                continue;
            }
        };
        let backend = engine.backend_port.and_then(rss::listener_pid).map(rss::Sampler::start);
        let usage_at_start = remote_usage(&server, &engine.name).await;
        match engine_phases(&mut server, engine, scale, &base, &plain, &nginx, &progress).await {
            Ok((secs, peers, extra)) => {
                for (slot, phase) in Phase::ALL.into_iter().enumerate() {
                    let seed = phase.seed(seed_like(&engine.name));
                    phase_rows(&mut rows, phase, &subject, &secs[slot], scale, seed);
                    // A ratio of rates is the inverse ratio of seconds.
                    for (peer, metric) in [(&peers.plain, RATIO), (&peers.nginx, NGINX_RATIO)] {
                        if let Ok(peer) = peer
                            && !peer[slot].is_empty()
                        {
                            let ratios: Vec<f64> = peer[slot].iter().zip(&secs[slot]).map(|(p, d)| p / d).collect();
                            rows.push(summary_row(phase, &subject, metric, &ratios));
                        }
                    }
                }
                all.absorb(&peers, &mut nginx_vs_plain);
                let case = "all phases";
                let upload = extra.catalog_secs + extra.bytes_secs;
                if upload > 0.0 {
                    let share = 100.0 * extra.catalog_secs / upload;
                    rows.push(Row::single(NAME, case, &subject, "% of upload time in the catalog", share));
                }
                rows.push(Row::single(NAME, case, &subject, "server peak RSS MB", extra.server_peak as f64 / 1e6));
                if let Some(sampler) = backend {
                    rows.push(Row::single(NAME, case, &subject, "backend peak RSS MB", sampler.finish() as f64 / 1e6));
                }
                match stored_bytes(&server, &engine.name, &usage_at_start).await {
                    Ok(disk) => rows.push(Row::single(NAME, case, &subject, DISK, disk as f64 / logical)),
                    Err(e) => rows.push(Row::skipped(NAME, case, &subject, DISK, &format!("{e:#}"))),
                }
            }
            Err(e) => {
                let why = format!("failed: {e:#}; server log: {}", server.log_tail());
                rows.push(Row::skipped(NAME, "all phases", &subject, MBS, &why));
            }
        }
        if stores_on_a_server(&engine.name) {
            progress.doing(&format!("{subject}: removing what was written"));
            if let Err(e) =
                purge(server, engine, "files", (0..2 * scale.files).map(|f| key(f)["/files/".len()..].to_string()))
                    .await
            {
                progress.doing(&format!("{subject}: could not remove what was written: {e:#}"));
            }
        } else {
            drop(server);
        }
    }
    if all.plain.as_ref().is_ok_and(|secs| secs[0].is_empty()) {
        // No engine ran: the peers alone, in a part of the bar of their own.
        progress.grow(per_engine);
        progress.part(per_engine);
        let mut peers = Peers::new(&nginx);
        for (slot, phase) in Phase::ALL.into_iter().enumerate() {
            for round in 0..phase.rounds() {
                progress.done(1); // no depot
                peers.run(&plain, &nginx, phase, slot, round, scale, &progress).await;
            }
        }
        all.absorb(&peers, &mut nginx_vs_plain);
    }
    match &all.plain {
        Ok(secs) => {
            for (phase, secs) in Phase::ALL.into_iter().zip(secs) {
                phase_rows(&mut rows, phase, PLAIN, secs, scale, phase.seed(seed_like(PLAIN)));
            }
            rows.push(Row::single(NAME, "all phases", PLAIN, DISK, disk_usage(&plain.dir) as f64 / logical));
        }
        Err(e) => rows.push(Row::skipped(NAME, "all phases", PLAIN, MBS, e)),
    }
    for (slot, phase) in Phase::ALL.into_iter().enumerate().filter(|(_, p)| p.reads()) {
        match &all.nginx {
            Ok(secs) => {
                phase_rows(&mut rows, phase, NGINX, &secs[slot], scale, None);
                if !nginx_vs_plain[slot].is_empty() {
                    rows.push(summary_row(phase, NGINX, RATIO, &nginx_vs_plain[slot]));
                }
            }
            Err(e) => rows.push(Row::skipped(NAME, phase.case(), NGINX, MBS, e)),
        }
    }
    drop(nginx);
    plain.remove();
    progress.finish();
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "Large files written and read through HTTP (seed: GridFS vs SQL Server vs Local)".into(),
        method: vec![
            format!(
                "{} files of {} bytes written by 1 client, then {} more by {CLIENTS} clients at once ({} each), \
                 over keep-alive connections (PUT, each answer durable); then the first {} read in order by 1 client \
                 and {} random ones by {CLIENTS} clients. The seed: 1000 files of 10,000,000 bytes.",
                scale.files,
                scale.size,
                scale.files,
                scale.files / CLIENTS,
                scale.files,
                scale.files
            ),
            format!(
                "Reads are {}. MB/s = 10^6 bytes per second of the phase's wall time; the seed column is the seed's \
                 time turned into MB/s (NTFS beside depot fs and plain files, SQL Server beside sqlite and postgres, \
                 GridFS beside gridfs).",
                if cold {
                    "cold: the page cache dropped and the server restarted before each read phase"
                } else {
                    "warm (the page cache could not be dropped: that needs root and a writable /proc/sys)"
                }
            ),
            "% of upload time in the catalog: the server's own split of upload time (depot_put_seconds_total) \
             between registering in the catalog and streaming bytes into the engine; the seed's program spent \
             32% (NTFS), 3% (SQL Server) and 7% (GridFS) of its time registering. Disk bytes per byte: the data \
             directory (and the backend's own figure for server engines) / bytes written."
                .into(),
            format!(
                "Plain files: the same bytes written with write + fsync per file by 1 and 20 threads, read back \
                 with the same pattern in reads of {} KiB into one buffer, as `dd bs=1M` does; depot's reader \
                 counts each answer's bytes as they arrive and keeps none. Each run of a phase through depot is \
                 followed by the same phase on plain files (beside every engine). Writes run once, each file \
                 synced as `dd conv=fsync` syncs it (its directory is not; depot's engines sync theirs too); \
                 each read phase runs {READ_ROUNDS} times, {}: median and spread of the runs. × plain files: \
                 depot's MB/s over that of the plain files' run right after it.",
                READ_SIZE >> 10,
                if cold { "every time from a cold cache" } else { "warm" }
            ),
            format!(
                "{NGINX}: each read run on plain files is followed by the same reads of the same files, from \
                 nginx serving them over HTTP (sendfile on, open_file_cache off, {} worker processes), by the same \
                 client as depot's, {}. × nginx: depot's MB/s over that of nginx's run in the same \
                 round; nginx's × plain files, its MB/s over the plain files' run right before it. What an HTTP \
                 server can make of the disk on this machine, its client on the same cores.",
                settings.threads,
                if cold { "from a cold cache" } else { "warm" }
            ),
        ],
        chart_metric: MBS.into(),
        ratio: Some(Ratio { metric: RATIO.into(), of_rates: true }),
        also_charted: Vec::new(),
        rows,
    })
}

/// The MB/s and seconds of a subject's runs of a phase: median and spread.
fn phase_rows(rows: &mut Vec<Row>, phase: Phase, subject: &str, secs: &[f64], scale: Scale, seed: Option<(f64, &str)>) {
    let bytes = (scale.files * scale.size) as f64;
    let rates: Vec<f64> = secs.iter().map(|s| bytes / 1e6 / s).collect();
    rows.push(summary_row(phase, subject, MBS, &rates).with_seed(seed));
    rows.push(summary_row(phase, subject, "s", secs));
}

/// One figure as it is, several as median and spread.
fn summary_row(phase: Phase, subject: &str, metric: &str, values: &[f64]) -> Row {
    match (values, Summary::of(values)) {
        ([one], _) => Row::single(NAME, phase.case(), subject, metric, *one),
        (_, Some(s)) => Row::measured(NAME, phase.case(), subject, metric, s),
        (_, None) => Row::skipped(NAME, phase.case(), subject, metric, "not measured"),
    }
}

/// Seconds of each run of each phase, in [`Phase::ALL`] order.
type PhaseSecs = [Vec<f64>; 4];

/// The peers' seconds in each phase (nginx: in the read phases), or why a
/// peer failed: it is then left out of the rest of the runs.
struct Peers {
    plain: Result<PhaseSecs, String>,
    nginx: Result<PhaseSecs, String>,
}

impl Peers {
    fn new(nginx: &Result<Nginx, String>) -> Peers {
        Peers {
            plain: Ok(PhaseSecs::default()),
            nginx: nginx.as_ref().map(|_| PhaseSecs::default()).map_err(Clone::clone),
        }
    }

    /// One run of `phase` (`round` of its rounds, at `slot` of
    /// [`Phase::ALL`]) on plain files, then, for reads, through nginx.
    #[allow(clippy::too_many_arguments)]
    async fn run(
        &mut self,
        plain: &Plain,
        nginx: &Result<Nginx, String>,
        phase: Phase,
        slot: usize,
        round: usize,
        scale: Scale,
        progress: &Progress,
    ) {
        if let Ok(secs) = &mut self.plain {
            progress.doing(&format!("{PLAIN}: {}{}", phase.case(), phase.round_label(round)));
            match plain.phase(phase).await {
                Ok(s) => secs[slot].push(s),
                Err(e) => self.plain = Err(format!("{e:#}")),
            }
        }
        progress.done(1);
        if !phase.reads() {
            return;
        }
        if let (Ok(nginx), Ok(secs)) = (nginx, &mut self.nginx) {
            progress.doing(&format!("{NGINX}: {}{}", phase.case(), phase.round_label(round)));
            let read = async {
                plain.make_cold()?;
                read_phase(nginx.addr, phase, scale, nginx_path).await
            };
            match read.await {
                Ok(s) => secs[slot].push(s),
                Err(e) => self.nginx = Err(format!("nginx failed: {e:#}")),
            }
        }
        progress.done(1);
    }

    /// Adds `more` (one engine's peers) to these, and the ratios of nginx's
    /// rates to plain files' in each pair of its runs to `nginx_vs_plain`.
    fn absorb(&mut self, more: &Peers, nginx_vs_plain: &mut PhaseSecs) {
        for (total, got) in [(&mut self.plain, &more.plain), (&mut self.nginx, &more.nginx)] {
            match (total.as_mut(), got) {
                (Ok(total), Ok(got)) => total.iter_mut().zip(got).for_each(|(t, g)| t.extend(g)),
                (Ok(_), Err(e)) => *total = Err(e.clone()),
                (Err(_), _) => {}
            }
        }
        if let (Ok(plain), Ok(nginx)) = (&more.plain, &more.nginx) {
            for (slot, ratios) in nginx_vs_plain.iter_mut().enumerate() {
                ratios.extend(plain[slot].iter().zip(&nginx[slot]).map(|(p, n)| p / n));
            }
        }
    }
}

/// The four phases against one server, each run followed by the same run
/// on the peers: the seconds of depot's runs, the peers', and the rest.
async fn engine_phases(
    server: &mut DepotServer,
    engine: &EngineChoice,
    scale: Scale,
    base: &Bytes,
    plain: &Plain,
    nginx: &Result<Nginx, String>,
    progress: &Progress,
) -> anyhow::Result<(PhaseSecs, Peers, Extra)> {
    let subject = engine.subject();
    let mut secs = PhaseSecs::default();
    let mut peers = Peers::new(nginx);
    let mut extra = Extra::default();
    for (slot, phase) in Phase::ALL.into_iter().enumerate() {
        for round in 0..phase.rounds() {
            progress.doing(&format!("{subject}: {}{}", phase.case(), phase.round_label(round)));
            if phase.reads() && plain.cold {
                extra.server_peak = extra.server_peak.max(server.peak_rss().unwrap_or(0));
                server.restart_cold()?;
            }
            secs[slot].push(depot_phase(server.addr, phase, scale, base).await?);
            if phase == Phase::Write20 {
                let put = &server_stats(server.addr).await?["put_seconds"];
                extra.catalog_secs = put["catalog"].as_f64().unwrap_or(0.0);
                extra.bytes_secs = put["bytes"].as_f64().unwrap_or(0.0);
            }
            progress.done(1);
            peers.run(plain, nginx, phase, slot, round, scale, progress).await;
        }
    }
    extra.server_peak = extra.server_peak.max(server.peak_rss().unwrap_or(0));
    Ok((secs, peers, extra))
}

/// One run of a phase through depot at `addr`: its seconds.
async fn depot_phase(addr: SocketAddr, phase: Phase, scale: Scale, base: &Bytes) -> anyhow::Result<f64> {
    let n = scale.files;
    let started = Instant::now();
    match phase {
        Phase::Write1 => {
            let mut c = Connection::open(addr).await?;
            for f in 0..n {
                c.expect_ok(load::request(Method::PUT, addr, &key(f), file_bytes(base, f))).await?;
            }
        }
        Phase::Write20 => {
            clients(addr, move |client, mut c| {
                let base = base.clone();
                async move {
                    for j in 0..n / CLIENTS {
                        let f = n + client * (n / CLIENTS) + j;
                        c.expect_ok(load::request(Method::PUT, addr, &key(f), file_bytes(&base, f))).await?;
                    }
                    anyhow::Ok(())
                }
            })
            .await?;
        }
        Phase::ReadSeq | Phase::Read20 => return read_phase(addr, phase, scale, key).await,
    }
    Ok(started.elapsed().as_secs_f64())
}

/// One run of a read phase from the HTTP server at `addr`, which serves
/// file `f` at `path(f)`: its seconds.
async fn read_phase(addr: SocketAddr, phase: Phase, scale: Scale, path: fn(usize) -> String) -> anyhow::Result<f64> {
    let n = scale.files;
    let started = Instant::now();
    if phase == Phase::ReadSeq {
        let mut c = Connection::open(addr).await?;
        for f in 0..n {
            read_one(&mut c, addr, &path(f), scale.size).await?;
        }
    } else {
        clients(addr, move |client, mut c| async move {
            let mut rng = SmallRng::seed_from_u64(client as u64);
            for _ in 0..n / CLIENTS {
                read_one(&mut c, addr, &path(rng.random_range(0..2 * n)), scale.size).await?;
            }
            anyhow::Ok(())
        })
        .await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

async fn read_one(c: &mut Connection, addr: SocketAddr, path: &str, size: usize) -> anyhow::Result<()> {
    let len = c.download(load::request(Method::GET, addr, path, Bytes::new())).await?;
    if len != size as u64 {
        bail!("{path} answered {len} bytes, not {size}");
    }
    Ok(())
}

/// Runs `work` on [`CLIENTS`] connections at once, each a task of its own
/// (so the runtime's threads share them); each gets its index and its own
/// connection.
async fn clients<F, Fut>(addr: SocketAddr, work: F) -> anyhow::Result<()>
where
    F: Fn(usize, Connection) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let mut conns = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        conns.push(Connection::open(addr).await?);
    }
    // Dropped on an error, the set stops the other clients.
    let mut tasks = tokio::task::JoinSet::new();
    for (i, c) in conns.into_iter().enumerate() {
        tasks.spawn(work(i, c));
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// The same phases on plain files, by threads of this process.
struct Plain {
    dir: PathBuf,
    paths: Arc<Vec<PathBuf>>,
    files: usize,
    base: Bytes,
    /// Whether every read phase, of every subject, starts from a dropped
    /// page cache: found once, as the run starts.
    cold: bool,
}

impl Plain {
    fn new(dir: &Path, scale: Scale, base: Bytes, cold: bool) -> Plain {
        let paths = (0..2 * scale.files).map(|f| dir.join(name(f))).collect();
        Plain { dir: dir.to_path_buf(), paths: Arc::new(paths), files: scale.files, base, cold }
    }

    /// Drops the page cache before a read phase of a cold run: one that
    /// cannot is an error, not a warm phase among cold ones.
    fn make_cold(&self) -> anyhow::Result<()> {
        if self.cold {
            drop_caches().map_err(anyhow::Error::msg)?;
        }
        Ok(())
    }

    /// Runs one phase: its seconds. Writes replace the files of an earlier
    /// run; reads start from a dropped page cache.
    async fn phase(&self, phase: Phase) -> anyhow::Result<f64> {
        std::fs::create_dir_all(&self.dir)?;
        if phase.reads() {
            self.make_cold()?;
        }
        let (paths, base, n) = (self.paths.clone(), self.base.clone(), self.files);
        let started = Instant::now();
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let threads = if matches!(phase, Phase::Write1 | Phase::ReadSeq) { 1 } else { CLIENTS };
            std::thread::scope(|scope| {
                let workers: Vec<_> = (0..threads)
                    .map(|t| {
                        let (paths, base) = (&paths, &base);
                        scope.spawn(move || -> anyhow::Result<()> {
                            let mut rng = SmallRng::seed_from_u64(t as u64);
                            let mut buf = vec![0; READ_SIZE];
                            for j in 0..n / threads {
                                match phase {
                                    Phase::Write1 => write_synced(&paths[j], &file_bytes(base, j))?,
                                    Phase::Write20 => {
                                        let f = n + t * (n / threads) + j;
                                        write_synced(&paths[f], &file_bytes(base, f))?
                                    }
                                    Phase::ReadSeq => read_through(&paths[j], &mut buf)?,
                                    Phase::Read20 => read_through(&paths[rng.random_range(0..2 * n)], &mut buf)?,
                                }
                            }
                            Ok(())
                        })
                    })
                    .collect();
                workers.into_iter().try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a worker panicked"))?)
            })
        })
        .await??;
        Ok(started.elapsed().as_secs_f64())
    }

    fn remove(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Reads a file from start to end into `buf`, one `read` at a time, as
/// `dd bs=1M` does.
fn read_through(path: &Path, buf: &mut [u8]) -> anyhow::Result<()> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    while f.read(buf)? > 0 {}
    Ok(())
}

fn write_synced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o644).open(path)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}
