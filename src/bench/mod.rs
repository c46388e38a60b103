//! `depot bench`: re-runs the experiments of the seed write-ups on this
//! machine, every engine side by side with outside peers, and writes a
//! report (Markdown tables, JSON, CSV and charts).
//!
//! Shared machinery lives here: the settings, the result [`Row`], the
//! [`DepotServer`] child (`depot serve` of this very executable on a free
//! port with a scratch data directory), page-cache dropping for cold runs
//! and disk usage. Each experiment is a module with one `run` function
//! returning rows: [`files`] (large files written and read back, depot vs
//! plain files and nginx), [`http`] (files served at concurrency 100, depot vs
//! nginx), [`mget`] (batch gets of random small values, depot vs RocksDB's
//! own `multi_get`), [`chunks`] (large files through the chunking engines
//! at chunk sizes from 256 KB to 8 MB) and [`smallfiles`] (many files of
//! 1-30 KB, depot vs plain files on the scratch disk). The load generator
//! is [`load`], the peers [`nginx`] and `wrk`, the writers [`report`] and
//! [`chart`].

pub mod chart;
pub mod chunks;
pub mod files;
pub mod http;
pub mod load;
pub mod machine;
pub mod mget;
pub mod nginx;
pub mod report;
pub mod rss;
pub mod scale;
pub mod smallfiles;
pub mod stats;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

pub use crate::engine::dir_usage as disk_usage;
use crate::engine::{EngineKind, S3Config};
use stats::Summary;

/// The experiments, in report order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Experiment {
    /// Large files written by 1 and 20 clients and read back, each engine
    /// beside plain files, and the reads beside nginx serving those files.
    Files,
    /// Files of 1 KB, 100 KB and 1 MB over HTTP at concurrency 100, and PUTs
    /// of new 1 KB keys: depot with each engine vs nginx.
    Http,
    /// Batch gets of random keys among many small values: depot with each
    /// engine vs RocksDB's in-process multi_get.
    Mget,
    /// Large files written and read through the chunking engines (gridfs,
    /// postgres, sqlite) at chunk sizes from 256 KB to 8 MB, read with
    /// buffers of 8 KB, 64 KB and 1 MB.
    Chunks,
    /// Many files of 1-30 KB: ingest, disk use, listing and random reads,
    /// depot with each engine vs plain files on the scratch disk.
    Smallfiles,
    /// The server's memory idle, while streaming a 10 GB upload and
    /// download, and per million objects; start-up with 10,000,000 objects.
    Scale,
    /// Every experiment above.
    All,
}

impl Experiment {
    const EACH: [Experiment; 6] = [
        Experiment::Files,
        Experiment::Http,
        Experiment::Mget,
        Experiment::Chunks,
        Experiment::Smallfiles,
        Experiment::Scale,
    ];

    fn expand(self) -> Vec<Experiment> {
        match self {
            Experiment::All => Experiment::EACH.to_vec(),
            e => vec![e],
        }
    }
}

/// `depot bench` as given on the command line.
#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Which experiment to run.
    #[arg(value_enum)]
    pub experiment: Experiment,
    /// Scaled down: every experiment in about three minutes, with the same engines as without it.
    #[arg(long, conflicts_with = "full")]
    pub quick: bool,
    /// At the seeds' own sizes where the default is scaled down (files: 1000 of 10 MB;
    /// chunks: 50 of 2 GB; smallfiles: 10,000,000). Takes hours.
    #[arg(long)]
    pub full: bool,
    /// Where the report goes (default: bench-results/<UTC time>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Engines to measure, comma-separated (default: all of them; mget runs fs, gridfs and s3
    /// only when named, and chunks measures only the chunking engines).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub engines: Option<Vec<String>>,
    /// Worker threads of each server, and nginx worker processes
    /// (default: the number of CPU cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// The PostgreSQL server for the postgres engine (postgres://...,
    /// without options=); each run uses a schema of its own there and
    /// drops it.
    #[arg(long, env = "DEPOT_BENCH_POSTGRES", value_name = "URL", hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// The MongoDB server for the gridfs engine (mongodb://host:port, any
    /// ?options kept); each run uses a database of its own and drops it.
    #[arg(long, env = "DEPOT_BENCH_MONGO", value_name = "URL", hide_env_values = true)]
    pub mongo_url: Option<String>,
    /// The S3 server for the s3 engine (http://host:port); each run creates
    /// a bucket of its own and deletes it. Credentials: --s3-access-key and --s3-secret-key,
    /// or the standard AWS_* variables.
    #[arg(long, env = "DEPOT_BENCH_S3", value_name = "URL")]
    pub s3_url: Option<String>,
    #[arg(long, env = "DEPOT_BENCH_S3_ACCESS_KEY", value_name = "KEY")]
    pub s3_access_key: Option<String>,
    #[arg(long, env = "DEPOT_BENCH_S3_SECRET_KEY", value_name = "SECRET", hide_env_values = true)]
    pub s3_secret_key: Option<String>,
}

/// Engines measured when none are named.
pub const DEFAULT_ENGINES: [&str; 7] = ["hybrid", "fs", "rocksdb", "sqlite", "postgres", "gridfs", "s3"];

/// One engine to measure: the extra `serve` flags it needs, or why it
/// cannot be measured here.
#[derive(Clone, Debug)]
pub struct EngineChoice {
    pub name: String,
    pub serve_flags: Result<Vec<String>, String>,
    /// The loopback port of the engine's own server, whose memory is
    /// measured too.
    pub backend_port: Option<u16>,
}

impl EngineChoice {
    /// How the engine appears in the report.
    pub fn subject(&self) -> String {
        format!("depot {}", self.name)
    }
}

/// Validated settings of a bench run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub quick: bool,
    /// The seeds' own sizes where the default is scaled down.
    pub full: bool,
    pub threads: usize,
    pub engines: Vec<EngineChoice>,
    /// Whether the engines were named by the user (then experiments run
    /// them even where they would be skipped by default).
    pub engines_named: bool,
    /// Where scratch data lives: on the disk the report describes.
    pub scratch: PathBuf,
    /// The bucket the s3 engine needs, made before the first experiment.
    s3_bucket: Option<(String, S3Config)>,
    /// The gridfs engine's database, made by its first write.
    gridfs_url: Option<String>,
    /// The PostgreSQL server given and the schema of this run there, made
    /// before the first experiment: the postgres engine's tables are the
    /// run's own, whatever else the database holds.
    postgres_schema: Option<(String, String)>,
}

impl Settings {
    /// The settings `args` give; `scratch` is set once the output
    /// directory is made.
    fn resolve(args: &BenchArgs) -> anyhow::Result<Settings> {
        let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()));
        if threads == 0 {
            bail!("--threads must be at least 1");
        }
        let names: Vec<String> = match &args.engines {
            Some(list) => list.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            None => DEFAULT_ENGINES.iter().map(|s| s.to_string()).collect(),
        };
        if names.is_empty() {
            bail!("--engines names no engine; engines: {}", EngineKind::ALL.map(EngineKind::name).join(", "));
        }
        let mut engines = Vec::new();
        let (mut s3_bucket, mut gridfs_url, mut postgres_schema) = (None, None, None);
        let run_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        for name in names {
            let kind: EngineKind = name.parse().map_err(anyhow::Error::msg)?;
            let url = match kind {
                EngineKind::Postgres => match &args.postgres_url {
                    None => Err("no PostgreSQL given (--postgres-url)".to_string()),
                    Some(url) if url.contains("options=") => Err(
                        "the bench sets the search path to a schema of its own: give --postgres-url without options="
                            .to_string(),
                    ),
                    Some(url) => {
                        let schema = format!("depot_bench_{run_id}");
                        let separator = if url.contains('?') { '&' } else { '?' };
                        postgres_schema = Some((url.clone(), schema.clone()));
                        Ok(format!("{url}{separator}options=-c%20search_path%3D{schema}"))
                    }
                },
                EngineKind::Gridfs => {
                    gridfs_url = args
                        .mongo_url
                        .as_deref()
                        .map(|u| crate::engine::gridfs::with_database(u, &format!("depot_bench_{run_id}")));
                    gridfs_url.clone().ok_or_else(|| "no MongoDB given (--mongo-url)".to_string())
                }
                EngineKind::S3 => args.s3_url.clone().ok_or_else(|| "no S3 server given (--s3-url)".to_string()),
                _ => Ok(String::new()),
            };
            let backend_port = url.as_deref().ok().and_then(|u| rss::loopback_port(u).ok());
            let mut serve_flags =
                url.map(|u| if u.is_empty() { Vec::new() } else { vec!["--engine-url".to_string(), u] });
            if let (EngineKind::S3, Ok(flags)) = (kind, &mut serve_flags) {
                let config = S3Config {
                    bucket: Some(format!("depot-bench-{run_id}")),
                    region: None,
                    access_key: args.s3_access_key.clone(),
                    secret_key: args.s3_secret_key.clone(),
                };
                let pairs = [
                    ("--s3-bucket", &config.bucket),
                    ("--s3-access-key", &config.access_key),
                    ("--s3-secret-key", &config.secret_key),
                ];
                for (flag, value) in pairs {
                    if let Some(v) = value {
                        flags.extend([flag.to_string(), v.clone()]);
                    }
                }
                s3_bucket = args.s3_url.clone().map(|u| (u, config));
            }
            engines.push(EngineChoice { name, serve_flags, backend_port });
        }
        Ok(Settings {
            quick: args.quick,
            full: args.full,
            threads,
            engines,
            engines_named: args.engines.is_some(),
            scratch: PathBuf::new(),
            s3_bucket,
            gridfs_url,
            postgres_schema,
        })
    }
}

/// Makes the postgres engine's schema for this run; an engine that cannot
/// have it is skipped, saying why.
async fn make_remote_scratch(settings: &mut Settings) {
    let Some((url, schema)) = &settings.postgres_schema else { return };
    if let Err(e) = on_postgres(url, &format!("CREATE SCHEMA {schema}")).await {
        let why = format!("cannot create the schema {schema}: {e}");
        for engine in settings.engines.iter_mut().filter(|e| e.name == "postgres") {
            engine.serve_flags = Err(why.clone());
        }
        settings.postgres_schema = None;
    }
}

/// Runs `sql` on a connection of its own to `url`, within
/// [`crate::pg::ANSWER_WITHIN`].
async fn on_postgres(url: &str, sql: &str) -> Result<(), String> {
    let run = async {
        let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        db.batch_execute(sql).await
    };
    match tokio::time::timeout(crate::pg::ANSWER_WITHIN, run).await {
        Ok(done) => done.map_err(|e| crate::pg::PgError::from(e).to_string()),
        Err(_) => Err(format!("no answer within {} s", crate::pg::ANSWER_WITHIN.as_secs())),
    }
}

/// Drops what the run made on the engines' servers: the gridfs engine's
/// database, the s3 engine's bucket and the postgres engine's schema, each
/// named for this run alone.
async fn remove_remote_scratch(settings: &Settings) {
    if let Some((url, schema)) = &settings.postgres_schema
        && let Err(e) = on_postgres(url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await
    {
        eprintln!("could not drop the bench's PostgreSQL schema {schema}: {e}");
    }
    if let Some(url) = &settings.gridfs_url {
        let dropped = async {
            let client = mongodb::Client::with_uri_str(url).await?;
            match client.default_database() {
                Some(db) => db.drop().await,
                None => Ok(()),
            }
        };
        if let Err(e) = dropped.await {
            eprintln!("could not drop the bench's MongoDB database {url}: {e}");
        }
    }
    if let Some((endpoint, config)) = &settings.s3_bucket
        && let Err(e) = crate::engine::s3::delete_bucket(Some(endpoint), config).await
    {
        eprintln!("could not delete the bench's S3 bucket at {endpoint}: {e}");
    }
}

/// One figure of the report, or the reason it could not be measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    pub experiment: String,
    /// What was done: "GET 1 KB", "1,000 keys".
    pub case: String,
    /// Who did it: "depot hybrid", "nginx", "rocksdb multi_get".
    pub subject: String,
    /// What was measured, with its unit: "ms/request", "req/s".
    pub metric: String,
    /// The median over the rounds.
    pub value: Option<f64>,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// The seed write-up's published figure for the same case and metric.
    pub seed: Option<f64>,
    /// Whose figure `seed` is.
    pub seed_source: Option<String>,
    /// Why there is no value.
    pub skipped: Option<String>,
}

impl Row {
    pub fn measured(experiment: &str, case: &str, subject: &str, metric: &str, s: Summary) -> Row {
        Row {
            experiment: experiment.into(),
            case: case.into(),
            subject: subject.into(),
            metric: metric.into(),
            value: Some(s.median),
            min: Some(s.min),
            max: Some(s.max),
            seed: None,
            seed_source: None,
            skipped: None,
        }
    }

    /// A figure without spread (a percentile, a ratio).
    pub fn single(experiment: &str, case: &str, subject: &str, metric: &str, value: f64) -> Row {
        Row { min: None, max: None, ..Row::measured(experiment, case, subject, metric, Summary::single(value)) }
    }

    pub fn skipped(experiment: &str, case: &str, subject: &str, metric: &str, why: &str) -> Row {
        let why = if why.trim().is_empty() { "no reason given" } else { why.trim() };
        Row {
            value: None,
            min: None,
            max: None,
            skipped: Some(why.to_string()),
            ..Row::measured(experiment, case, subject, metric, Summary::single(0.0))
        }
    }

    pub fn with_seed(mut self, seed: Option<(f64, &str)>) -> Row {
        if let Some((value, source)) = seed {
            self.seed = Some(value);
            self.seed_source = Some(source.to_string());
        }
        self
    }
}

/// What an experiment produced.
#[derive(Clone, Debug, Serialize)]
pub struct ExperimentReport {
    pub name: String,
    pub title: String,
    /// How it was measured, for the reader of the report.
    pub method: Vec<String>,
    /// The metric drawn in the chart.
    pub chart_metric: String,
    /// Depot's figures over those of a peer measured beside them, drawn in
    /// a chart of their own.
    pub ratio: Option<Ratio>,
    /// Further metrics drawn each in a chart of its own,
    /// `<name>-<stem>.svg`: (stem, metric).
    pub also_charted: Vec<(String, String)>,
    pub rows: Vec<Row>,
}

/// The rows of an experiment that give depot's figure over a peer's, pair
/// by pair (`× nginx`).
#[derive(Clone, Debug, Serialize)]
pub struct Ratio {
    pub metric: String,
    /// A ratio of rates (larger is faster) rather than of times.
    pub of_rates: bool,
}

/// A `depot serve` child of this executable, on a free loopback port.
pub struct DepotServer {
    child: Child,
    pub addr: SocketAddr,
    pub data: PathBuf,
    args: Vec<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl DepotServer {
    /// Starts `depot serve --engine ENGINE` on `data` with `threads` workers
    /// and the engine's extra flags; fails with the server's own error
    /// when it refuses to start.
    pub fn start(engine: &str, flags: &[String], data: &Path, threads: usize) -> anyhow::Result<DepotServer> {
        let mut args: Vec<String> =
            vec!["serve".into(), "--engine".into(), engine.into(), "--threads".into(), threads.to_string()];
        args.extend(["--listen", "127.0.0.1:0", "--gc-interval", "0"].map(String::from));
        args.extend(flags.iter().cloned());
        let (child, addr, log) = spawn_depot(&args, data)?;
        Ok(DepotServer { child, addr, data: data.to_path_buf(), args, log })
    }

    /// Stops the server, runs `between` (dropping caches, say) and starts
    /// it again on the same data (on a new port).
    pub fn restart(&mut self, between: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
        self.stop();
        between()?;
        let (child, addr, log) = spawn_depot(&self.args, &self.data)?;
        (self.child, self.addr, self.log) = (child, addr, log);
        Ok(())
    }

    /// Restarts the server with the page cache dropped in between, so its
    /// next reads come from the disk (needs root).
    pub fn restart_cold(&mut self) -> anyhow::Result<()> {
        self.restart(|| drop_caches().map_err(anyhow::Error::msg))
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        running::stopped(self.child.id());
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's peak resident memory since it (re)started.
    pub fn peak_rss(&self) -> Option<u64> {
        rss::peak_rss(self.child.id())
    }

    /// The last lines the server logged, for error messages.
    pub fn log_tail(&self) -> String {
        self.log.lock().map(|l| l.join("\n")).unwrap_or_default()
    }
}

impl Drop for DepotServer {
    fn drop(&mut self) {
        self.stop();
    }
}

const LISTENING: &str = "listening on http://";
const LOG_LINES_KEPT: usize = 20;

type Spawned = (Child, SocketAddr, Arc<Mutex<Vec<String>>>);

/// Settings that may carry a password (the engine's URL, the S3 keys):
/// given to the servers in their environment, since every user of the
/// machine can read a process's flags.
const SECRET_FLAGS: [(&str, &str); 3] = [
    ("--engine-url", "DEPOT_ENGINE_URL"),
    ("--s3-access-key", "DEPOT_S3_ACCESS_KEY"),
    ("--s3-secret-key", "DEPOT_S3_SECRET_KEY"),
];

/// The settings file of every depot the bench runs, in a child or in
/// process: an empty one, so that a `depot.toml` where the bench is started
/// changes nothing measured.
pub(crate) const NO_SETTINGS_FILE: &str = "/dev/null";

/// This executable, with `args`, `--data DIR` and no settings file, and
/// none of the caller's `DEPOT_*` settings.
fn depot_command(args: &[String], data: &Path) -> Command {
    // When the executable was replaced on disk while running (a rebuild),
    // the kernel still has the running one.
    let exe = std::env::current_exe().ok().filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("/proc/self/exe"));
    let mut cmd = Command::new(exe);
    for (k, _) in std::env::vars() {
        if k.starts_with("DEPOT_") {
            cmd.env_remove(k);
        }
    }
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match SECRET_FLAGS.iter().find(|(flag, _)| flag == arg) {
            Some((_, var)) => {
                cmd.env(var, args.next().map_or("", String::as_str));
            }
            None => {
                cmd.arg(arg);
            }
        }
    }
    cmd.arg("--data").arg(data).arg("--config").arg(NO_SETTINGS_FILE);
    cmd
}

/// Whether an engine keeps its blobs on a server of its own rather than in
/// the data directory.
pub fn stores_on_a_server(engine: &str) -> bool {
    matches!(engine, "postgres" | "gridfs" | "s3")
}

/// What an engine occupies on its own server now (`disk_bytes` of
/// `/_/stats`); 0 for a local engine.
pub async fn remote_usage(server: &DepotServer, engine: &str) -> anyhow::Result<u64> {
    match stores_on_a_server(engine) {
        true => remote_disk_bytes(server.addr).await,
        false => Ok(0),
    }
}

/// Bytes an engine's blobs and the catalog take: the whole data directory,
/// plus, for an engine storing on a server, what its usage there grew by
/// since `start` (its [`remote_usage`] when the server started: earlier
/// experiments of the run may have left bytes there, as PostgreSQL keeps
/// deleted rows until a vacuum).
pub async fn stored_bytes(server: &DepotServer, engine: &str, start: &anyhow::Result<u64>) -> anyhow::Result<u64> {
    let start = start.as_ref().map_err(|e| anyhow::anyhow!("the engine's usage at start is unknown: {e:#}"))?;
    Ok(disk_usage(&server.data) + remote_usage(server, engine).await?.saturating_sub(*start))
}

/// A depot server's `/_/stats` answer.
pub async fn server_stats(addr: SocketAddr) -> anyhow::Result<serde_json::Value> {
    let answer = load::Connection::open(addr)
        .await?
        .expect_ok(load::request(::http::Method::GET, addr, "/_/stats", bytes::Bytes::new()))
        .await?;
    serde_json::from_slice(&answer).context("the /_/stats answer")
}

/// What a depot server's engine says it occupies (`disk_bytes` of `/_/stats`).
pub async fn remote_disk_bytes(addr: SocketAddr) -> anyhow::Result<u64> {
    server_stats(addr).await?["disk_bytes"].as_u64().context("no disk_bytes in /_/stats")
}

/// Leaves an engine's server as it was found: deletes `keys` of `bucket`
/// through the running depot, stops it and runs `depot gc` with no grace
/// period, so the blobs written leave the engine's server too. Local
/// engines need none of this: their data directory is simply removed.
pub async fn purge(
    server: DepotServer,
    engine: &EngineChoice,
    bucket: &str,
    keys: impl Iterator<Item = String>,
) -> anyhow::Result<()> {
    const PER_REQUEST: usize = 1000;
    let flags = engine.serve_flags.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut conn = load::Connection::open(server.addr).await?;
    let path = format!("/_/batch/delete?bucket={bucket}");
    let mut keys = keys.peekable();
    while keys.peek().is_some() {
        let body: String = keys.by_ref().take(PER_REQUEST).map(|k| k + "\n").collect();
        conn.expect_ok(load::request(::http::Method::POST, server.addr, &path, body.into())).await?;
    }
    drop(conn);
    let data = server.data.clone();
    drop(server);
    let mut args: Vec<String> = vec!["gc".into(), "--engine".into(), engine.name.clone()];
    args.extend(["--gc-grace", "0"].map(String::from));
    args.extend(flags.iter().cloned());
    let mut cmd = depot_command(&args, &data);
    cmd.env("DEPOT_LOG", "warn").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let out = tokio::process::Command::from(cmd).kill_on_drop(true).output().await.context("running depot gc")?;
    if !out.status.success() {
        bail!("depot gc: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn spawn_depot(args: &[String], data: &Path) -> anyhow::Result<Spawned> {
    let mut cmd = depot_command(args, data);
    cmd.env("DEPOT_LOG", "info").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().context("starting depot serve")?;
    running::started(child.id())?;
    let stderr = child.stderr.take().context("no stderr from depot serve")?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = std::sync::mpsc::channel();
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find(LISTENING) {
                let addr = line[at + LISTENING.len()..].split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(Some(addr));
            }
            if let Ok(mut l) = sink.lock() {
                l.push(line);
                if l.len() > LOG_LINES_KEPT {
                    l.remove(0);
                }
            }
        }
        let _ = tx.send(None);
    });
    let refused = |child: &mut Child, log: &Mutex<Vec<String>>| {
        let _ = child.kill();
        let _ = child.wait();
        running::stopped(child.id());
        let lines = log.lock().map(|l| l.clone()).unwrap_or_default();
        // The binary reports a failed start as `error: ...` on its last line.
        match lines.iter().rev().find_map(|l| l.strip_prefix("error: ")) {
            Some(e) => anyhow::anyhow!("{e}"),
            None => anyhow::anyhow!("depot serve did not start: {}", lines.join(" / ")),
        }
    };
    match rx.recv_timeout(Duration::from_secs(120)) {
        Ok(Some(announced)) => match announced.parse() {
            Ok(addr) => Ok((child, addr, log)),
            Err(e) => {
                refused(&mut child, &log);
                Err(anyhow::anyhow!("depot serve announced {announced:?}: {e}"))
            }
        },
        Ok(None) | Err(_) => {
            // Give the reader a moment to collect the last lines.
            std::thread::sleep(Duration::from_millis(100));
            Err(refused(&mut child, &log))
        }
    }
}

/// The servers the bench has started and not stopped yet, so that an
/// interrupted bench stops them rather than leave them running.
pub(crate) mod running {
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    use rustix::process::{Pid, Signal, kill_process};

    static CHILDREN: Children = Children::new();

    /// Time the children get to stop on SIGTERM before they are killed.
    const GRACE: Duration = Duration::from_secs(5);

    /// Child processes still running, and whether the bench is stopping.
    struct Children {
        pids: Mutex<Vec<u32>>,
        stopping: AtomicBool,
    }

    impl Children {
        const fn new() -> Children {
            Children { pids: Mutex::new(Vec::new()), stopping: AtomicBool::new(false) }
        }

        fn pids(&self) -> MutexGuard<'_, Vec<u32>> {
            self.pids.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Records a child just started. Experiments keep running while
        /// the bench stops: a child started then is asked to stop at once,
        /// and stopped with the others, and its experiment fails.
        fn started(&self, pid: u32) -> anyhow::Result<()> {
            let mut pids = self.pids();
            pids.push(pid);
            if self.stopping.load(Ordering::SeqCst) {
                terminate(pid);
                anyhow::bail!("the bench is stopping");
            }
            Ok(())
        }

        fn stopped(&self, pid: u32) {
            self.pids().retain(|p| *p != pid);
        }

        /// Asks every child to stop (nginx's master stops its workers),
        /// waits up to `grace` for them, and kills those still running.
        async fn stop_all(&self, grace: Duration) {
            let pids = {
                // Under the lock: a child is either seen here or sees the flag.
                let pids = self.pids();
                self.stopping.store(true, Ordering::SeqCst);
                pids.clone()
            };
            pids.into_iter().for_each(terminate);
            let deadline = Instant::now() + grace;
            while self.pids().iter().any(alive) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for pid in self.pids().iter().filter(|pid| alive(pid)) {
                signal(*pid, Signal::KILL);
            }
        }
    }

    /// Whether a process is running: a child that has exited stays a
    /// zombie until this process ends.
    fn alive(pid: &u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
    }

    pub(crate) fn started(pid: u32) -> anyhow::Result<()> {
        CHILDREN.started(pid)
    }

    pub(crate) fn stopped(pid: u32) {
        CHILDREN.stopped(pid)
    }

    /// Asks a process to stop (SIGTERM).
    pub(crate) fn terminate(pid: u32) {
        signal(pid, Signal::TERM);
    }

    fn signal(pid: u32, signal: Signal) {
        if let Some(pid) = Pid::from_raw(pid as i32) {
            let _ = kill_process(pid, signal);
        }
    }

    /// Removes the scratch directory; what became of it, for the last
    /// words of an interrupted bench.
    fn remove_scratch(dir: &Path) -> String {
        match std::fs::remove_dir_all(dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                format!("{} could not be removed: {e}", dir.display())
            }
            _ => format!("{} is removed", dir.display()),
        }
    }

    /// Waits for SIGINT or SIGTERM; then stops every child, removes the
    /// scratch directory and what the run made on the engines' servers,
    /// and exits.
    pub(crate) async fn stop_all_on_signal(settings: super::Settings) {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut interrupt), Ok(mut termination)) =
            (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
        else {
            return;
        };
        let code = tokio::select! {
            _ = interrupt.recv() => 130,
            _ = termination.recv() => 143,
        };
        CHILDREN.stop_all(GRACE).await;
        let removed = remove_scratch(&settings.scratch);
        if tokio::time::timeout(Duration::from_secs(10), super::remove_remote_scratch(&settings)).await.is_err() {
            eprintln!("\nthe engines' servers did not answer within 10 s: what the run made there is left");
        }
        eprintln!("\ninterrupted: the servers started are stopped and {removed}");
        std::process::exit(code);
    }

    #[cfg(test)]
    mod tests {
        use std::os::unix::process::ExitStatusExt;
        use std::process::Command;

        use super::*;

        #[tokio::test]
        async fn a_child_deaf_to_sigterm_is_killed_after_the_grace_period() {
            let children = Children::new();
            // Deaf to SIGTERM, as a wedged server is.
            let mut child = Command::new("sh").args(["-c", "trap '' TERM; exec sleep 30"]).spawn().unwrap();
            children.started(child.id()).unwrap();
            // Signalled before its trap is set, the shell would stop at once.
            let comm = format!("/proc/{}/comm", child.id());
            while std::fs::read_to_string(&comm).unwrap() != "sleep\n" {
                std::thread::sleep(Duration::from_millis(10));
            }
            children.stop_all(Duration::from_millis(300)).await;
            let status = child.wait().unwrap();
            assert_eq!(status.signal(), Some(Signal::KILL.as_raw()), "{status}");
        }

        #[tokio::test]
        async fn a_child_started_while_stopping_is_stopped_and_its_start_fails() {
            let children = Children::new();
            children.stop_all(Duration::ZERO).await;
            let mut child = Command::new("sleep").arg("30").spawn().unwrap();
            assert!(children.started(child.id()).is_err());
            assert_eq!(child.wait().unwrap().signal(), Some(Signal::TERM.as_raw()));
            assert_eq!(*children.pids(), [child.id()], "left for the stopping bench to see to");
        }

        #[test]
        fn a_scratch_directory_left_behind_is_not_reported_removed() {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("not-a-directory");
            std::fs::write(&file, "x").unwrap();
            assert!(remove_scratch(&file).contains("could not be removed"), "{}", remove_scratch(&file));
            let scratch = dir.path().join("scratch");
            std::fs::create_dir_all(scratch.join("data")).unwrap();
            assert!(remove_scratch(&scratch).ends_with("is removed"));
            assert!(!scratch.exists());
        }
    }
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").ok().is_some_and(|s| {
        s.lines().find_map(|l| l.strip_prefix("Uid:")).and_then(|l| l.split_whitespace().nth(1)) == Some("0")
    })
}

/// Writes dirty pages out and empties the page cache, so the next reads
/// come from the disk; the reason when that is not possible here.
pub fn drop_caches() -> Result<(), String> {
    if !is_root() {
        return Err("needs root".into());
    }
    let synced = Command::new("sync").status().map_err(|e| format!("sync: {e}"))?;
    if !synced.success() {
        return Err(format!("sync: {synced}"));
    }
    std::fs::write("/proc/sys/vm/drop_caches", "3\n").map_err(|e| format!("cannot drop the page cache: {e}"))
}

/// A program on the PATH, or in the sbin directories Debian puts servers in.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Groups of digits for big counts: 1000000 -> "1,000,000".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A data directory of the bench's, removed when dropped, whether its step
/// succeeded or failed: the larger runs write gigabytes per step.
pub struct DataDir(PathBuf);

impl DataDir {
    pub fn new(path: PathBuf) -> DataDir {
        DataDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Progress shown while an experiment runs: one bar of known length,
/// optionally run through in parts.
pub struct Progress {
    bar: indicatif::ProgressBar,
    /// Where the part now running ends, once parts are used.
    part_end: Mutex<Option<u64>>,
}

impl Progress {
    pub fn new(experiment: &str, steps: u64) -> Progress {
        let bar = indicatif::ProgressBar::new(steps);
        let style = indicatif::ProgressStyle::with_template("{prefix:>6} [{bar:30}] {pos}/{len} {elapsed:>4} {msg}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_prefix(experiment.to_string());
        bar.enable_steady_tick(Duration::from_millis(200));
        Progress { bar, part_end: Mutex::new(None) }
    }

    fn part_end(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.part_end.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts the next part of the bar, `steps` long, at the end of the
    /// part before however many steps that one marked done: a subject
    /// skipped, or failed midway, marks fewer than it has.
    pub fn part(&self, steps: u64) {
        let mut end = self.part_end();
        let start = end.unwrap_or_else(|| self.bar.position());
        self.bar.set_position(start);
        *end = Some(start + steps);
    }

    /// Lengthens the bar by `steps` not foreseen when it was made.
    pub fn grow(&self, steps: u64) {
        self.bar.inc_length(steps);
    }

    /// Announces the step now running.
    pub fn doing(&self, what: &str) {
        self.bar.set_message(what.to_string());
    }

    /// Marks `n` steps done, up to the end of the part running.
    pub fn done(&self, n: u64) {
        let end = self.part_end();
        let to = self.bar.position() + n;
        self.bar.set_position(end.map_or(to, |end| to.min(end)));
    }

    pub fn finish(&self) {
        self.bar.finish_with_message("done");
    }
}

/// `depot bench`.
pub fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let out = match &args.out {
        Some(dir) => dir.clone(),
        None => PathBuf::from("bench-results").join(report::timestamp_for_path(std::time::SystemTime::now())),
    };
    let mut settings = Settings::resolve(args)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix(".scratch-")
        .tempdir_in(&out)
        .with_context(|| format!("a scratch directory in {}", out.display()))?;
    settings.scratch = scratch.path().to_path_buf();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // First: interrupted while the engines' servers are being set up, the
    // run removes what it may have made there (each removal of something
    // never made fails harmlessly).
    runtime.spawn(running::stop_all_on_signal(settings.clone()));
    if let Some((endpoint, config)) = &settings.s3_bucket
        && let Err(e) = runtime.block_on(crate::engine::s3::create_bucket(Some(endpoint), config))
    {
        for engine in settings.engines.iter_mut().filter(|e| e.name == "s3") {
            engine.serve_flags = Err(format!("cannot create a bucket at {endpoint}: {e}"));
        }
        settings.s3_bucket = None;
    }
    runtime.block_on(make_remote_scratch(&mut settings));
    let ran = run_experiments(args, &out, &settings, &runtime);
    runtime.block_on(remove_remote_scratch(&settings));
    drop(runtime);
    drop(scratch);
    let (machine, experiments) = ran?;
    let markdown = report::write_all(&out, &machine, &experiments)?;
    say!("{markdown}")?;
    say!("written to {}", out.display())?;
    Ok(())
}

/// The machine's facts and each experiment's report, or the first
/// experiment's failure.
fn run_experiments(
    args: &BenchArgs,
    out: &Path,
    settings: &Settings,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(machine::Facts, Vec<ExperimentReport>)> {
    let machine = machine::facts(out, settings);
    let mut experiments = Vec::new();
    for experiment in args.experiment.expand() {
        let report = runtime.block_on(async {
            match experiment {
                Experiment::Files => files::run(settings).await,
                Experiment::Http => http::run(settings).await,
                Experiment::Mget => mget::run(settings).await,
                Experiment::Chunks => chunks::run(settings).await,
                Experiment::Smallfiles => smallfiles::run(settings).await,
                Experiment::Scale => scale::run(settings).await,
                Experiment::All => unreachable!("expanded above"),
            }
        })?;
        experiments.push(report);
    }
    Ok((machine, experiments))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked_before_anything_is_made() {
        #[derive(clap::Parser)]
        struct Command {
            #[command(flatten)]
            bench: BenchArgs,
        }
        use clap::Parser as _;
        let out = tempfile::tempdir().unwrap();
        let report = out.path().join("report");
        for engines in ["", "foo"] {
            let argv = ["depot", "http", "--quick", "--engines", engines, "--out", report.to_str().unwrap()];
            let e = bench(&Command::try_parse_from(argv).unwrap().bench).unwrap_err().to_string();
            assert!(e.contains("engine"), "{e}");
            assert!(!report.exists(), "the report's directory was made for --engines {engines:?}");
        }
    }

    fn hidden_progress(steps: u64) -> Progress {
        let progress = Progress::new("test", steps);
        progress.bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
        progress
    }

    #[test]
    fn parts_end_where_they_should_whatever_they_marked_done() {
        let progress = hidden_progress(10);
        progress.part(4);
        progress.done(1); // failed midway
        progress.part(3); // skipped
        assert_eq!(progress.bar.position(), 4);
        progress.part(3);
        progress.done(3);
        progress.done(3); // counted twice
        assert_eq!(progress.bar.position(), 10);
        progress.grow(2);
        progress.part(2);
        progress.done(2);
        assert_eq!(progress.bar.position(), 12);
        assert_eq!(progress.bar.length(), Some(12));
    }

    #[test]
    fn without_parts_steps_add_up() {
        let progress = hidden_progress(5);
        progress.done(2);
        progress.done(2);
        assert_eq!(progress.bar.position(), 4);
    }

    #[test]
    fn a_data_directory_is_removed_when_dropped() {
        let scratch = tempfile::tempdir().unwrap();
        let data = DataDir::new(scratch.path().join("data"));
        std::fs::create_dir_all(data.path().join("blobs")).unwrap();
        let path = data.path().to_path_buf();
        drop(data);
        assert!(!path.exists());
    }

    #[test]
    fn servers_read_an_empty_settings_file() {
        let args = crate::config::ServeArgs { config: Some(NO_SETTINGS_FILE.into()), ..Default::default() };
        crate::config::Settings::resolve(&args).expect("an empty settings file");
        let cmd = depot_command(&["gc".to_string()], Path::new("/d"));
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["gc", "--data", "/d", "--config", NO_SETTINGS_FILE]);
    }

    #[test]
    fn secrets_reach_the_servers_in_their_environment_not_their_flags() {
        let flags = ["serve", "--engine", "s3", "--engine-url", "http://k:pw@host", "--s3-secret-key", "s3cret"];
        let cmd = depot_command(&flags.map(String::from), Path::new("/d"));
        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["serve", "--engine", "s3", "--data", "/d", "--config", NO_SETTINGS_FILE]);
        let env: Vec<_> = cmd.get_envs().filter_map(|(k, v)| Some((k.to_str()?, v?.to_str()?))).collect();
        assert!(env.contains(&("DEPOT_ENGINE_URL", "http://k:pw@host")), "{env:?}");
        assert!(env.contains(&("DEPOT_S3_SECRET_KEY", "s3cret")), "{env:?}");
    }
}
