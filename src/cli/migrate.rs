//! `depot migrate --to-engine NAME`: moves every blob of a store to another
//! engine while the server is stopped, verifying each blob's SHA-256 on the
//! way, and can be interrupted and run again at any point.
//!
//! It goes in three steps, recorded in the data directory's `MIGRATING`
//! file so a second run knows where the first one stopped:
//!
//! 1. `copy`: each blob the catalog knows is read from the old engine,
//!    hashed, and written to the new one; the new locator is appended to
//!    `migrate.journal`. Blobs already in the journal are not copied again
//!    (a journal line lost in a crash only costs a second copy, which
//!    engines take as the same blob). The catalog still points at the old
//!    engine, which stays complete: stopping here loses nothing.
//! 2. `switch`: once every blob is copied, the catalog's locators are
//!    updated from the journal and the `ENGINE` marker names the new engine.
//!    Until that ends, the catalog points into both engines: no server,
//!    collector or check opens the store (see [`refuse_while_switching`]),
//!    and a run again finishes the switch.
//! 3. `cleanup`: the old engine's blobs are deleted, and what its writers
//!    left staged, then the state files.
//!
//! Until the last run switches, the store can be served from the old engine
//! between runs: what changes meanwhile is picked up by the next run. Stop
//! every server before the run that finishes (with a PostgreSQL catalog,
//! every node). `--cancel` abandons a migration that has not switched.
//!
//! A run may be killed at any point; the next one goes on from the journal.
//! Ctrl-C during the copy step is gentler: the copies under way finish and
//! are journaled before the run stops.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use indicatif::HumanBytes;

use super::serve::{alone, open_catalog, record_engine, refuse_catalog_switching, runtime};
use super::{BYTES_BAR, progress_bar};
use crate::catalog::{BlobRecord, Catalog};
use crate::config::{ServeArgs, Settings};
use crate::engine::gridfs::{self, GridfsEngine};
use crate::engine::postgres::{self, PostgresEngine};
use crate::engine::s3::{self, S3Engine};
use crate::engine::{
    self, BlobRef, Digest, DynEngine, ENGINE_MARKER, EngineConfig, EngineError, EngineKind, Locator, S3Config,
};
use crate::store::maintenance::copy_blob;

const STATE: &str = "MIGRATING";
const JOURNAL: &str = "migrate.journal";

#[derive(Debug, clap::Args)]
pub struct MigrateArgs {
    /// The store as it is served now (`--data`, `--engine`, `--catalog`, ...).
    #[command(flatten)]
    pub from: ServeArgs,
    /// The engine to move every blob to.
    #[arg(long, value_name = "NAME")]
    pub to_engine: String,
    /// The new engine's server (postgres://, mongodb://, http://).
    #[arg(long, value_name = "URL")]
    pub to_engine_url: Option<String>,
    /// Bytes per chunk for a chunking new engine (sqlite, postgres, gridfs).
    #[arg(long, value_name = "BYTES")]
    pub to_chunk_size: Option<usize>,
    /// Largest blob a new hybrid engine keeps in RocksDB.
    #[arg(long, value_name = "BYTES")]
    pub to_inline_threshold: Option<u64>,
    #[arg(long, value_name = "NAME")]
    pub to_gridfs_bucket: Option<String>,
    #[arg(long, value_name = "NAME")]
    pub to_s3_bucket: Option<String>,
    #[arg(long, value_name = "REGION")]
    pub to_s3_region: Option<String>,
    #[arg(long, value_name = "KEY")]
    pub to_s3_access_key: Option<String>,
    #[arg(long, value_name = "SECRET")]
    pub to_s3_secret_key: Option<String>,
    /// Copy at most this many blobs in this run, then stop (run again to
    /// go on): migrate a large store a slice at a time.
    #[arg(long, value_name = "N")]
    pub max_blobs: Option<u64>,
    /// Abandon a migration that has not switched engines yet; the copies
    /// made so far are removed (give the same --to-* settings).
    #[arg(long)]
    pub cancel: bool,
    /// Blobs copied at once.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub jobs: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Copy,
    Switch,
    Cleanup,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Copy => "copy",
            Phase::Switch => "switch",
            Phase::Cleanup => "cleanup",
        }
    }
}

/// What the `MIGRATING` file records.
#[derive(Debug)]
struct State {
    phase: Phase,
    from: EngineKind,
    to: EngineKind,
    /// Which database or bucket the copies go to (the new engine's marker,
    /// see [`engine::marker`]): a run that goes on, or a `--cancel` that
    /// deletes what is there, must be given the same. Empty in the state of
    /// a migration begun before it was recorded.
    target: String,
    /// The old engine's marker: a run that goes on must be given the same,
    /// or its cleanup would empty another database or bucket. Empty in
    /// the state of a migration begun before it was recorded.
    source: String,
}

/// The line between the two markers in the `MIGRATING` file.
const SOURCE_LINE: &str = "source:\n";

impl State {
    fn read(data: &Path) -> anyhow::Result<Option<State>> {
        let text = match std::fs::read_to_string(data.join(STATE)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).context("reading the migration state"),
        };
        let (first, markers) = text.split_once('\n').unwrap_or((&text, ""));
        // Place lines start with "database " or "bucket ": a line that is
        // the separator alone is one.
        let (target, source) = match (markers.strip_prefix(SOURCE_LINE), markers.find(&format!("\n{SOURCE_LINE}"))) {
            // No target: a migration begun before it was recorded.
            (Some(source), _) => ("", source),
            (None, Some(end)) => (&markers[..=end], &markers[end + 1 + SOURCE_LINE.len()..]),
            (None, None) => (markers, ""),
        };
        let words: Vec<&str> = first.split_whitespace().collect();
        let [phase, from, to] = words[..] else { bail!("{} is damaged: {text:?}", data.join(STATE).display()) };
        let phase = match phase {
            "copy" => Phase::Copy,
            "switch" => Phase::Switch,
            "cleanup" => Phase::Cleanup,
            other => bail!("unknown migration phase {other:?}"),
        };
        Ok(Some(State {
            phase,
            from: from.parse().map_err(anyhow::Error::msg)?,
            to: to.parse().map_err(anyhow::Error::msg)?,
            target: target.to_string(),
            source: source.to_string(),
        }))
    }

    fn write(&self, data: &Path) -> anyhow::Result<()> {
        let line = format!("{} {} {}\n", self.phase.name(), self.from.name(), self.to.name());
        write_durably(data, STATE, &format!("{line}{}{SOURCE_LINE}{}", self.target, self.source))
    }

    /// Refuses new-engine settings (`config`) that name another database
    /// or bucket than the migration's.
    fn check_target(&self, config: &EngineConfig) -> anyhow::Result<()> {
        same_place_as(&self.target, self.to, config, "goes to", "give the --to-* settings it began with")
    }

    /// Refuses old-engine settings (`config`) that name another database
    /// or bucket than the migration's: its cleanup empties what they name.
    fn check_source(&self, config: &EngineConfig) -> anyhow::Result<()> {
        same_place_as(
            &self.source,
            self.from,
            config,
            "moves the store from",
            "give the settings the store had before it",
        )
    }
}

/// Refuses `config` for an engine of `kind` unless it names the place of
/// the `recorded` marker (or none was recorded).
fn same_place_as(recorded: &str, kind: EngineKind, config: &EngineConfig, goes: &str, fix: &str) -> anyhow::Result<()> {
    let given = engine::marker(kind, config);
    if !recorded.is_empty() && given != recorded {
        bail!(
            "this migration {goes} {}, not {}: {fix}",
            engine::describe_marker(recorded),
            engine::describe_marker(&given)
        );
    }
    Ok(())
}

/// Refuses to open a store whose migration stopped while switching: its
/// catalog then points into both engines, and neither serves it whole.
pub fn refuse_while_switching(data: &Path) -> anyhow::Result<()> {
    match State::read(data) {
        Ok(Some(State { phase: Phase::Switch, to, .. })) => bail!(
            "a migration to the {} engine stopped while it switched the catalog over: run `depot migrate \
             --to-engine {}` again to finish it",
            to.name(),
            to.name()
        ),
        _ => Ok(()),
    }
}

/// Replaces a small file atomically and durably.
fn write_durably(dir: &Path, name: &str, contents: &str) -> anyhow::Result<()> {
    engine::write_durably(dir, name, contents).with_context(|| format!("writing {}", dir.join(name).display()))
}

fn target_config(args: &MigrateArgs, from: &EngineConfig) -> EngineConfig {
    EngineConfig {
        inline_threshold: args.to_inline_threshold.unwrap_or(from.inline_threshold),
        url: args.to_engine_url.clone(),
        chunk_size: args.to_chunk_size,
        gridfs_bucket: args.to_gridfs_bucket.clone(),
        s3: S3Config {
            bucket: args.to_s3_bucket.clone(),
            region: args.to_s3_region.clone(),
            access_key: args.to_s3_access_key.clone(),
            secret_key: args.to_s3_secret_key.clone(),
        },
        without_compactions: false,
    }
}

/// Whether two engine settings name the same storage: moving there would
/// copy nothing and then delete everything.
/// Settings are compared as the engine reads them, not as spelled: a
/// default port written out, a role in the URL, the bucket or endpoint
/// from the `AWS_*` variables, a slash at the end of an endpoint. (A
/// resumed migration given the new engine's settings, spelled otherwise,
/// for the old one would otherwise empty the new engine, where the store
/// now lives.)
fn same_place(from: EngineKind, a: &EngineConfig, to: EngineKind, b: &EngineConfig) -> bool {
    from == to
        && match from {
            EngineKind::Gridfs => {
                let bucket = |c: &EngineConfig| c.gridfs_bucket.clone().unwrap_or_else(|| "fs".into());
                same_url(a, b, mongo_place) && bucket(a) == bucket(b)
            }
            EngineKind::S3 => match (s3_place(a), s3_place(b)) {
                (Some(x), Some(y)) => x == y,
                _ => a.url == b.url && a.s3.bucket == b.s3.bucket,
            },
            EngineKind::Postgres => same_url(a, b, postgres_place),
            // The embedded engines live in the data directory, one per kind.
            _ => true,
        }
}

/// Whether two engine URLs name one place, as `place` reads each; URLs
/// it cannot read are compared as written.
fn same_url(a: &EngineConfig, b: &EngineConfig, place: impl Fn(&str) -> Option<String>) -> bool {
    match (a.url.as_deref(), b.url.as_deref()) {
        (Some(x), Some(y)) => match (place(x), place(y)) {
            (Some(p), Some(q)) => p == q,
            _ => x == y,
        },
        (x, y) => x == y,
    }
}

/// What names a PostgreSQL engine's tables: the server (hosts, addresses,
/// ports, 5432 unless given), the database (the role's name unless
/// given) and the schemas searched, which the options may set and else
/// start with the role's own.
fn postgres_place(url: &str) -> Option<String> {
    let c = url.parse::<tokio_postgres::Config>().ok()?;
    let mut ports = c.get_ports().to_vec();
    if ports.is_empty() {
        ports.push(5432);
    }
    let database = c.get_dbname().or(c.get_user());
    let search_path = c
        .get_options()
        .and_then(|o| o.split_once("search_path="))
        .map(|(_, rest)| rest.split_whitespace().next().unwrap_or_default().to_string());
    let schemas = search_path.or_else(|| c.get_user().map(|user| format!("{user}, public")));
    Some(format!("{:?} {:?} {ports:?} {database:?} {schemas:?}", c.get_hosts(), c.get_hostaddrs()))
}

/// A MongoDB URL's hosts (27017 unless given) and default database.
fn mongo_place(url: &str) -> Option<String> {
    let c = mongodb::options::ConnectionString::parse(url).ok()?;
    let hosts = match &c.host_info {
        mongodb::options::HostInfo::HostIdentifiers(hosts) => {
            let mut hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
            hosts.sort();
            hosts.join(",")
        }
        other => format!("{other:?}"),
    };
    Some(format!("{hosts} {:?}", c.default_database))
}

/// The bucket's URL an s3 engine with these settings would use, the
/// `AWS_*` variables filling what is not given.
fn s3_place(c: &EngineConfig) -> Option<String> {
    let resolved = engine::s3::resolve(&engine::s3::builder(c.url.as_deref(), &c.s3)).ok()?;
    Some(resolved.bucket_url.trim_end_matches('/').to_string())
}

fn engine_root(data: &Path, kind: EngineKind) -> PathBuf {
    data.join(kind.name())
}

/// Opens an engine that no server uses, as [`engine::open`] does, except
/// that everything its writers left staged counts as abandoned, however
/// young: an engine otherwise keeps what is younger than its cleanup age
/// (an hour, a day), since another node may still be writing it, and an
/// engine migrated away from is never opened again to remove it later.
/// With [`BlobEngine::remove_abandoned`](engine::BlobEngine::remove_abandoned),
/// the handle removes it all again: call it once no writer of this process
/// runs either.
async fn open_alone(kind: EngineKind, root: &Path, config: &EngineConfig) -> engine::Result<DynEngine> {
    Ok(match (kind, config.url.as_deref()) {
        (EngineKind::Postgres, Some(url)) => Arc::new(
            PostgresEngine::connect_with(url, config.chunk_size.unwrap_or(postgres::DEFAULT_CHUNK), Duration::ZERO)
                .await?,
        ),
        (EngineKind::Gridfs, Some(url)) => Arc::new(
            GridfsEngine::connect_with(
                url,
                config.gridfs_bucket.as_deref().unwrap_or(gridfs::DEFAULT_BUCKET),
                config.chunk_size.unwrap_or(gridfs::DEFAULT_CHUNK),
                Duration::ZERO,
            )
            .await?,
        ),
        (EngineKind::S3, url) => {
            let tuning = s3::Tuning { stale_after: Duration::ZERO, ..s3::Tuning::default() };
            Arc::new(S3Engine::connect_tuned(url, &config.s3, tuning).await?)
        }
        // An embedded engine's staged files go with its directory, which a
        // migration removes whole; a server's engine without a URL is
        // refused by `engine::open`, in its words.
        _ => engine::open(kind, root, config).await?,
    })
}

/// Ctrl-C while blobs are copied stops the run cleanly: no new copy
/// starts, and those under way finish and are journaled, so nothing is
/// left in the new engine that the journal does not name. A second Ctrl-C,
/// or one during any other step, ends the process at once, as a kill
/// would: every step is made to survive that.
#[derive(Default)]
struct Interrupt {
    copying: AtomicBool,
    requested: AtomicBool,
}

impl Interrupt {
    /// Handles Ctrl-C from now on, for the life of the process: the
    /// handler is in place when this returns, not when the task first runs.
    fn watch() -> anyhow::Result<Arc<Interrupt>> {
        let mut signals =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).context("handling Ctrl-C")?;
        let interrupt = Arc::new(Interrupt::default());
        let watcher = Arc::clone(&interrupt);
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                if !watcher.copying.load(Ordering::SeqCst) || watcher.requested.swap(true, Ordering::SeqCst) {
                    std::process::exit(130);
                }
                eprintln!("stopping: the copies under way finish first (Ctrl-C again to stop at once)");
            }
        });
        Ok(interrupt)
    }

    fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}

/// `depot migrate`.
pub fn migrate(args: &MigrateArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(&args.from)?;
    let to: EngineKind = args.to_engine.parse().map_err(anyhow::Error::msg)?;
    crate::config::check_engine_settings(
        to,
        "to-",
        [
            args.to_inline_threshold.is_some(),
            args.to_chunk_size.is_some(),
            args.to_gridfs_bucket.is_some(),
            args.to_s3_bucket.is_some(),
            args.to_s3_region.is_some(),
            args.to_s3_access_key.is_some(),
            args.to_s3_secret_key.is_some(),
            args.to_engine_url.is_some(),
        ],
    )?;
    let from = settings.engine;
    if from == EngineKind::Memory || to == EngineKind::Memory {
        bail!("the memory engine keeps nothing once its process ends: a store cannot move into it or out of it");
    }
    let data = settings.data.clone();
    let marker = std::fs::read_to_string(data.join(ENGINE_MARKER))
        .with_context(|| format!("{} holds no depot store", data.display()))?;
    // A new migration is recorded once the catalog is open: a server
    // holding the store refuses the migration before anything is written.
    // Under the catalog's lock, as a run is: a run going on meanwhile
    // could switch to the copies a cancel would delete.
    if args.cancel {
        return runtime(2)?.block_on(async {
            let catalog = open_catalog(&settings).await?;
            alone(catalog.as_ref(), "cancelling a migration", cancel(catalog.as_ref(), &data, &settings, args)).await
        });
    }
    let (state, new) = match State::read(&data)? {
        Some(s) if (s.from, s.to) != (from, to) => bail!(
            "{} is migrating from {} to {}; finish that first (--engine {} --to-engine {})",
            data.display(),
            s.from.name(),
            s.to.name(),
            s.from.name(),
            s.to.name()
        ),
        Some(s) => {
            let to_config = target_config(args, &settings.engine_config);
            s.check_target(&to_config)?;
            // The cleanup empties the old engine: given the new one's
            // settings for it (a configuration already updated), it would
            // delete the store's only copies.
            if same_place(from, &settings.engine_config, to, &to_config) {
                bail!(
                    "the {} engine given to migrate from is the one this migration copies into: give the \
                     settings the store had before the migration",
                    from.name()
                );
            }
            s.check_source(&settings.engine_config)?;
            (s, false)
        }
        None => {
            if let Some(why) = engine::marker_mismatch(&data, &marker, &engine::marker(from, &settings.engine_config)) {
                bail!(why);
            }
            if same_place(from, &settings.engine_config, to, &target_config(args, &settings.engine_config)) {
                bail!("the store is in that {} engine already", from.name());
            }
            let target = engine::marker(to, &target_config(args, &settings.engine_config));
            let source = engine::marker(from, &settings.engine_config);
            (State { phase: Phase::Copy, from, to, target, source }, true)
        }
    };
    let to_config = target_config(args, &settings.engine_config);
    runtime(2)?.block_on(async {
        let catalog = open_catalog(&settings).await?;
        alone(catalog.as_ref(), "migrating", async {
            // A shared catalog names the engine for every node.
            let claimed = catalog.engine_marker().await?;
            if new {
                refuse_catalog_switching(claimed.as_deref())?;
            }
            if let Some(claimed) = &claimed
                && new
                && engine::marker_mismatch(&data, claimed, &engine::marker(from, &settings.engine_config)).is_some()
            {
                bail!(
                    "the catalog's store keeps its bytes in {}: migrate from there",
                    engine::describe_marker(claimed)
                );
            }
            // No server holds the store now (the catalog is open, and no node
            // is live), so neither engine has a writer but this run.
            // A switch whose blobs all have their copies needs only those:
            // the old engine is opened for its cleanup after it, so that one
            // whose server has gone does not stop a switch under way (nor
            // the store, which no server opens until it ends). Once
            // switched, an embedded engine's directory is only removed, and
            // not opened: a run killed while removing it may have left one
            // that no longer opens.
            let journal = data.join(JOURNAL);
            let source_root = engine_root(&data, from);
            let open_source = || open_alone(from, &source_root, &settings.engine_config);
            let source = match state.phase {
                Phase::Copy => Some(open_source().await?),
                Phase::Switch if uncopied(&*catalog, &read_journal(&journal)?).await? > 0 => Some(open_source().await?),
                Phase::Cleanup if !from.is_embedded() => Some(open_source().await?),
                _ => None,
            };
            // A new migration's target may yet turn out to be another store's,
            // whose writers may be at work: it is opened as any node would.
            let target = if new {
                engine::open(to, &engine_root(&data, to), &to_config).await?
            } else {
                open_alone(to, &engine_root(&data, to), &to_config).await?
            };
            if new {
                // Copies already there would be taken as this store's without
                // being read (an engine keeps the first copy of a content), and
                // another store's collector would delete the ones it does not
                // know once they are this store's only copies.
                let held = target.list().await?.len();
                if held > 0 {
                    bail!(
                        "the {} engine to migrate to holds {held} blob(s) already: another store's, or copies a \
                     migration left? Migrate into an empty database, bucket or directory",
                        to.name()
                    );
                }
                state.write(&data)?;
            }
            let mut state = state;
            if let Some(source) = source.as_ref().filter(|_| state.phase != Phase::Cleanup) {
                let interrupt = Interrupt::watch()?;
                // A run that stopped while switching had checked every copy
                // before it began, and the catalog points at some of them
                // already: none is read back again, or removed for a failed
                // read.
                let reread = state.phase == Phase::Copy;
                let copied = copy(&*catalog, source, &target, &journal, args, &interrupt, reread).await;
                // However the copy ended: a Ctrl-C from now on ends the run.
                interrupt.copying.store(false, Ordering::SeqCst);
                if !copied? {
                    return Ok(());
                }
                state.phase = Phase::Switch;
                state.write(&data)?;
            }
            if state.phase == Phase::Switch {
                let moved = engine::marker(to, &to_config);
                // Named in the catalog first: while its records point into
                // both engines, no node sharing it starts.
                let switching = engine::switching_marker(&moved);
                if claimed.as_ref() != Some(&switching) {
                    record_engine(catalog.as_ref(), claimed.as_deref(), &switching).await?;
                }
                switch(&*catalog, &target, &journal).await?;
                write_durably(&data, ENGINE_MARKER, &moved)?;
                record_engine(catalog.as_ref(), Some(&switching), &moved).await?;
                state.phase = Phase::Cleanup;
                state.write(&data)?;
            }
            if from.is_embedded() {
                // The directory goes whole: emptied blob by blob, an
                // engine's files would keep their space (SQLite's pages,
                // RocksDB's tables until compaction).
                drop(source);
                std::fs::remove_dir_all(engine_root(&data, from)).or_else(ignore_missing)?;
            } else {
                let source = match source {
                    Some(source) => source,
                    None => open_source().await?,
                };
                cleanup(&source).await?;
            }
            std::fs::remove_file(data.join(JOURNAL)).or_else(ignore_missing)?;
            std::fs::remove_file(data.join(STATE))?;
            say!("the store now lives in the {} engine: start it with --engine {}", to.name(), to.name())?;
            Ok(())
        })
        .await
    })
}

fn ignore_missing(e: std::io::Error) -> std::io::Result<()> {
    if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) }
}

/// The journal's lines: each blob copied and its locator in the new
/// engine. Only whole lines count: a torn last one (a run killed
/// mid-append) could hold part of a locator, and its blob is copied again.
fn read_journal(path: &Path) -> anyhow::Result<HashMap<Digest, Locator>> {
    let mut done = HashMap::new();
    let f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(done),
        Err(e) => return Err(e).context("reading the migration journal"),
    };
    let mut reader = std::io::BufReader::new(f);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 || line.pop() != Some(b'\n') {
            return Ok(done);
        }
        let parsed = std::str::from_utf8(&line).ok().and_then(|l| l.split_once(' '));
        if let Some((Some(d), Ok(l))) = parsed.map(|(d, l)| (Digest::from_hex(d), hex::decode(l))) {
            done.insert(d, l);
        }
    }
}

/// Cancels a migration still copying: removes its copies and its state.
async fn cancel(catalog: &dyn Catalog, data: &Path, settings: &Settings, args: &MigrateArgs) -> anyhow::Result<()> {
    // Read under the lock: a run may have switched meanwhile.
    let Some(s) = State::read(data)? else { bail!("no migration is under way in {}", data.display()) };
    if s.phase != Phase::Copy {
        bail!("the engines were switched already: run without --cancel to finish");
    }
    // The copies made so far go with an embedded engine's directory.
    // A server's engine held nothing when the migration began, so
    // all it holds now is this migration's: the journaled copies,
    // those a killed run finished but had not journaled yet, and
    // the staged parts of those it was still writing.
    let copies = engine_root(data, s.to);
    if s.to.is_embedded() && s.to != s.from {
        std::fs::remove_dir_all(&copies).or_else(ignore_missing)?;
    } else if !s.to.is_embedded() {
        let config = target_config(args, &settings.engine_config);
        // Everything there is deleted: it must be the migration's.
        if s.target.is_empty() || same_place(s.from, &settings.engine_config, s.to, &config) {
            bail!(
                "cannot tell that the {} engine given is the one this migration copied into: remove the \
                 copies there by hand, then {} and {}",
                s.to.name(),
                data.join(STATE).display(),
                data.join(JOURNAL).display()
            );
        }
        s.check_target(&config)?;
        let journal = data.join(JOURNAL);
        let removed = async {
            let target = open_alone(s.to, &copies, &config).await?;
            check_only_copies(catalog, &target, &journal).await?;
            let removed = delete_all(&target, "removing the copies").await?;
            target.remove_abandoned().await?;
            anyhow::Ok(removed)
        }
        .await
        .context("removing the copies made in the new engine (give the same --to-* settings)")?;
        say!("removed {removed} copies from the {} engine", s.to.name())?;
    }
    std::fs::remove_file(data.join(JOURNAL)).or_else(ignore_missing)?;
    std::fs::remove_file(data.join(STATE))?;
    say!("migration to {} cancelled; the store stays in the {} engine", s.to.name(), s.from.name())?;
    Ok(())
}

/// Opens the journal to append to it, cutting a torn last line first: what
/// is appended would otherwise run on from it and be lost with it.
/// Only the end is read, back to its last line break: the journal has a
/// line per blob.
fn append_to_journal(path: &Path) -> anyhow::Result<std::fs::File> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().create(true).read(true).append(true).open(path)?;
    let len = file.metadata()?.len();
    let mut whole = 0;
    let mut end = len;
    let mut tail = vec![0u8; 64 * 1024];
    while end > 0 {
        let start = end.saturating_sub(tail.len() as u64);
        let piece = &mut tail[..(end - start) as usize];
        file.read_exact_at(piece, start)?;
        if let Some(i) = piece.iter().rposition(|&b| b == b'\n') {
            whole = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    if whole < len {
        file.set_len(whole)?;
        file.sync_all()?;
    }
    Ok(file)
}

/// Copies every blob not yet journaled, then reads back the copies earlier
/// runs made if `reread`; returns whether all are done.
async fn copy(
    catalog: &dyn Catalog,
    source: &DynEngine,
    target: &DynEngine,
    journal: &Path,
    args: &MigrateArgs,
    interrupt: &Interrupt,
    reread: bool,
) -> anyhow::Result<bool> {
    let done = read_journal(journal)?;
    let stats = catalog.stats().await?;
    let progress = progress_bar(stats.blob_bytes.max(0) as u64, BYTES_BAR);
    let mut out = append_to_journal(journal)?;
    let (mut copied, mut copied_bytes, mut failed, mut left) = (0u64, 0u64, 0u64, 0u64);
    let budget = args.max_blobs.unwrap_or(u64::MAX);
    let mut after = None;
    interrupt.copying.store(true, Ordering::SeqCst);
    // Set by the first error: no copy starts after it, and those under way
    // are journaled as they end, so that the next run need not make them
    // again.
    let halted = std::cell::Cell::new(false);
    let outcome: anyhow::Result<()> = async {
        while !interrupt.requested() {
            let page = catalog.list_blobs(after, 1000).await?;
            let Some(last) = page.last() else { break };
            after = Some(last.digest);
            let (finished, todo): (Vec<BlobRecord>, Vec<BlobRecord>) =
                page.into_iter().partition(|b| done.contains_key(&b.digest));
            progress.inc(finished.iter().map(|b| b.size).sum());
            let room = budget.saturating_sub(copied + failed) as usize;
            left += todo.len().saturating_sub(room) as u64;
            let mut results = futures::stream::iter(todo.into_iter().take(room))
                .take_while(|_| futures::future::ready(!interrupt.requested() && !halted.get()))
                .map(|blob| {
                    let progress = &progress;
                    async move {
                        let moved = copy_blob(source.as_ref(), target, &blob.blob_ref(), progress).await;
                        (blob, moved)
                    }
                })
                .buffer_unordered(args.jobs.max(1));
            let mut first_error = None;
            while let Some((blob, moved)) = results.next().await {
                let step: anyhow::Result<()> = async {
                    match moved {
                        Ok(locator) => {
                            // One write a line: a run killed mid-line tears one
                            // line at most.
                            out.write_all(format!("{} {}\n", blob.digest.to_hex(), hex::encode(&locator)).as_bytes())?;
                            copied += 1;
                            copied_bytes += blob.size;
                        }
                        // As a backup does: bytes nothing refers to any more,
                        // gone before the collector removed their record, are
                        // not worth stopping for. Their record goes instead.
                        Err(e @ EngineError::NotFound(_)) if blob.refs == 0 => {
                            let removed = catalog.remove_dead_blob(&blob.digest, None).await?;
                            if removed {
                                // Its delete mark, which writers of the content wait on.
                                catalog.end_delete(&blob.digest).await?;
                            }
                            failed += u64::from(!removed);
                            progress.suspend(|| match removed {
                                true => {
                                    eprintln!(
                                        "blob {}: gone, and nothing referred to it: its record removed",
                                        blob.digest
                                    )
                                }
                                false => eprintln!("blob {}: {e:#}", blob.digest),
                            });
                        }
                        Err(e) => {
                            failed += 1;
                            progress.suspend(|| eprintln!("blob {}: {e:#}", blob.digest));
                        }
                    }
                    Ok(())
                }
                .await;
                if let Err(e) = step {
                    halted.set(true);
                    first_error.get_or_insert(e);
                }
                progress.set_message(format!("{} blobs", done.len() as u64 + copied));
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
        Ok(())
    }
    .await;
    // Whatever the outcome: the copies journaled so far count.
    out.sync_all()?;
    interrupt.copying.store(false, Ordering::SeqCst);
    progress.finish_and_clear();
    outcome?;
    say!(
        "copied {copied} blobs ({}) to the {} engine; {} were there already",
        HumanBytes(copied_bytes),
        target.name(),
        done.len()
    )?;
    if interrupt.requested() {
        bail!(
            "interrupted: nothing was switched, and the copies made are kept. Run the same command again to go \
             on, or with --cancel to abandon the migration"
        );
    }
    if failed > 0 {
        bail!("{failed} blobs could not be copied (see above); nothing was switched. Fix the cause and run again");
    }
    if left > 0 {
        say!("{left} blobs left: run the same command again to go on")?;
        return Ok(false);
    }
    if reread {
        recheck(catalog, target, journal, &done, args.jobs).await?;
    }
    Ok(true)
}

/// Before the switch, reads back the copies earlier runs made (this run's
/// were checked as they were written): bytes that changed in the new engine
/// meanwhile would otherwise become the only copy once the old engine is
/// emptied. A copy that does not match its SHA-256 is deleted and dropped
/// from the journal, and the run stops, so the next run copies it anew; one
/// that cannot be read stops the run too, and is read again by the next.
async fn recheck(
    catalog: &dyn Catalog,
    target: &DynEngine,
    journal: &Path,
    earlier: &HashMap<Digest, Locator>,
    jobs: usize,
) -> anyhow::Result<()> {
    if earlier.is_empty() {
        return Ok(());
    }
    let progress = progress_bar(0, BYTES_BAR);
    progress.set_message("re-reading earlier copies");
    let (mut bad, mut unread) = (Vec::new(), 0u64);
    let mut after = None;
    loop {
        let page = catalog.list_blobs(after, 1000).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.digest);
        let copies: Vec<BlobRef> = page
            .into_iter()
            .filter_map(|b| Some(BlobRef { locator: earlier.get(&b.digest)?.clone(), digest: b.digest, size: b.size }))
            .collect();
        progress.inc_length(copies.iter().map(|c| c.size).sum());
        let mut results = futures::stream::iter(copies)
            .map(|copy| {
                let progress = &progress;
                async move {
                    let holds = crate::store::maintenance::holds_blob(target.as_ref(), &copy, progress).await;
                    (copy, holds)
                }
            })
            .buffer_unordered(jobs.max(1));
        while let Some((copy, holds)) = results.next().await {
            match holds {
                Ok(true) => {}
                Ok(false) => {
                    progress.suspend(|| eprintln!("blob {}: its copy in the new engine does not match", copy.digest));
                    bad.push(copy);
                }
                // Gone or damaged: as wrong as bytes that do not match.
                Err(e @ (EngineError::NotFound(_) | EngineError::Damaged { .. })) => {
                    progress.suspend(|| eprintln!("blob {}: its copy in the new engine is lost: {e}", copy.digest));
                    bad.push(copy);
                }
                // Unread is not wrong: the copy stays for the next run to
                // read again.
                Err(e) => {
                    progress.suspend(|| {
                        eprintln!("blob {}: its copy in the new engine cannot be read: {e:#}", copy.digest)
                    });
                    unread += 1;
                }
            }
        }
    }
    progress.finish_and_clear();
    if bad.is_empty() && unread == 0 {
        return Ok(());
    }
    if bad.is_empty() {
        bail!("{unread} copies made by an earlier run could not be read (see above); nothing was switched. Run again");
    }
    for copy in &bad {
        target.delete(copy).await.with_context(|| format!("deleting the bad copy of {}", copy.digest))?;
    }
    let mut kept = read_journal(journal)?;
    for copy in &bad {
        kept.remove(&copy.digest);
    }
    let lines: String = kept.iter().map(|(d, l)| format!("{} {}\n", d.to_hex(), hex::encode(l))).collect();
    let dir = journal.parent().context("the journal's directory")?;
    write_durably(dir, JOURNAL, &lines)?;
    bail!(
        "{} copies made by an earlier run no longer match their SHA-256 (see above); nothing was switched. They \
         were removed: run again to copy them anew",
        bad.len()
    )
}

/// Points the catalog at the copies. A blob collected while the store
/// served between slices has no record left to point: its copy goes.
async fn switch(catalog: &dyn Catalog, target: &DynEngine, journal: &Path) -> anyhow::Result<()> {
    let journaled = read_journal(journal)?;
    // Every blob the catalog knows must have its copy: one without would
    // keep pointing into the old engine, which the cleanup empties.
    let missing = uncopied(catalog, &journaled).await?;
    if missing > 0 {
        bail!("{missing} blobs have no copy in the journal; nothing was switched. Run the same command again");
    }
    let moved: Vec<(Digest, Locator)> = journaled.into_iter().collect();
    for batch in moved.chunks(1000) {
        catalog.set_locators(batch).await?;
        let digests: Vec<Digest> = batch.iter().map(|(digest, _)| *digest).collect();
        for ((digest, locator), record) in batch.iter().zip(catalog.get_blobs(&digests).await?) {
            if record.is_none() {
                target.delete(&BlobRef { digest: *digest, size: 0, locator: locator.clone() }).await?;
            }
        }
    }
    Ok(())
}

/// How many blobs the catalog knows that have no copy in `journaled`.
async fn uncopied(catalog: &dyn Catalog, journaled: &HashMap<Digest, Locator>) -> anyhow::Result<u64> {
    let mut after = None;
    let mut missing = 0u64;
    loop {
        let page = catalog.list_blobs(after, 1000).await?;
        let Some(last) = page.last() else { break };
        after = Some(last.digest);
        missing += page.iter().filter(|b| !journaled.contains_key(&b.digest)).count() as u64;
    }
    Ok(missing)
}

/// Deletes everything the old engine holds, opened by [`open_alone`]: its
/// blobs, then whatever its writers left staged (uploads a crash or a
/// migration's own interruptions cut short, and parts of blobs whose
/// deletion a killed run did not finish), which nothing would remove later.
async fn cleanup(source: &DynEngine) -> anyhow::Result<()> {
    delete_all(source, "removing old copies").await?;
    source.remove_abandoned().await?;
    Ok(())
}

/// Deletes every blob an engine lists; returns how many.
/// Refuses a target that holds bytes of a content neither the journal nor
/// the catalog names: a copy is of a blob the store records, so those are
/// another store's, in a database or bucket of the same name on another
/// server (the marker names no server).
async fn check_only_copies(catalog: &dyn Catalog, target: &DynEngine, journal: &Path) -> anyhow::Result<()> {
    let copied = read_journal(journal)?;
    let others: Vec<Digest> =
        target.list().await?.into_iter().map(|b| b.digest).filter(|d| !copied.contains_key(d)).collect();
    for page in others.chunks(1000) {
        if let Some(at) = catalog.get_blobs(page).await?.iter().position(Option::is_none) {
            bail!(
                "the {} engine given holds {}, which this store has no record of: it holds more than this \
                 migration's copies, and nothing is deleted (give the --to-* settings it began with)",
                target.name(),
                page[at]
            );
        }
    }
    Ok(())
}

async fn delete_all(engine: &DynEngine, what: &str) -> anyhow::Result<u64> {
    let blobs = engine.list().await?;
    let count = blobs.len() as u64;
    let progress = progress_bar(count, &format!("{what} [{{bar:30}}] {{pos}}/{{len}}"));
    futures::stream::iter(blobs)
        .map(|b| async move { engine.delete(&b.blob_ref()).await })
        .buffer_unordered(8)
        .try_for_each(|()| {
            progress.inc(1);
            futures::future::ready(Ok(()))
        })
        .await?;
    progress.finish_and_clear();
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(url: &str) -> EngineConfig {
        EngineConfig { url: Some(url.to_string()), ..EngineConfig::default() }
    }

    #[test]
    fn the_state_keeps_both_places() {
        let dir = tempfile::tempdir().unwrap();
        let source = "gridfs\ndatabase d, bucket resource:\n".to_string();
        let target = "s3\nbucket source:\n".to_string();
        let state = State { phase: Phase::Switch, from: EngineKind::Gridfs, to: EngineKind::S3, target, source };
        state.write(dir.path()).unwrap();
        let read = State::read(dir.path()).unwrap().unwrap();
        assert_eq!((read.phase, read.from, read.to), (Phase::Switch, EngineKind::Gridfs, EngineKind::S3));
        assert_eq!((read.target, read.source), (state.target, state.source));
        // As a migration begun before the old place was recorded wrote it.
        std::fs::write(dir.path().join(STATE), "copy fs s3\ns3\nbucket b\n").unwrap();
        let read = State::read(dir.path()).unwrap().unwrap();
        assert_eq!((read.target.as_str(), read.source.as_str()), ("s3\nbucket b\n", ""));
        std::fs::write(dir.path().join(STATE), "copy fs s3\nsource:\nfs\n").unwrap();
        let read = State::read(dir.path()).unwrap().unwrap();
        assert_eq!((read.target.as_str(), read.source.as_str()), ("", "fs\n"));
    }

    #[test]
    fn places_are_compared_as_the_engine_reads_them() {
        let pg = |a: &str, b: &str| same_place(EngineKind::Postgres, &at(a), EngineKind::Postgres, &at(b));
        assert!(pg("postgres://u@h/d", "postgres://u@h:5432/d"));
        assert!(pg("postgres://u@h/d", "postgres://u@h/d?connect_timeout=10&options=-cstatement_timeout%3D5s"));
        assert!(pg("postgres://u@h:5432/d", "host=h user=u dbname=d"));
        assert!(pg("postgres://d@h", "postgres://d@h/d"), "the database defaults to the role's name");
        assert!(!pg("postgres://u@h/d", "postgres://admin@h/d"), "another role may search its own schema first");
        let path = "options=-c%20search_path%3Dstore";
        assert!(pg(&format!("postgres://u@h/d?{path}"), &format!("postgres://admin@h/d?{path}")));
        assert!(!pg("postgres://u@h/d", "postgres://u@h/e"));
        assert!(!pg("postgres://u@h/d", "postgres://u@other/d"));
        assert!(!pg("postgres://u@h/d", "postgres://u@h:5433/d"));
        assert!(!pg("postgres://u@h/d?options=-csearch_path%3Da", "postgres://u@h/d?options=-csearch_path%3Db"));

        let mongo = |a: &str, b: &str| same_place(EngineKind::Gridfs, &at(a), EngineKind::Gridfs, &at(b));
        assert!(mongo("mongodb://h/d", "mongodb://h:27017/d?retryWrites=true"));
        assert!(mongo("mongodb://a,b/d", "mongodb://b,a/d"));
        assert!(!mongo("mongodb://h/d", "mongodb://h/e"));
        let other_bucket = EngineConfig { gridfs_bucket: Some("other".into()), ..at("mongodb://h/d") };
        assert!(!same_place(EngineKind::Gridfs, &at("mongodb://h/d"), EngineKind::Gridfs, &other_bucket));

        let s3 = |url: &str, bucket: &str| {
            let mut c = at(url);
            c.s3.bucket = Some(bucket.to_string());
            c
        };
        let same_s3 = |a: &EngineConfig, b: &EngineConfig| same_place(EngineKind::S3, a, EngineKind::S3, b);
        assert!(same_s3(&s3("http://h:9000", "b"), &s3("http://h:9000/", "b")));
        assert!(!same_s3(&s3("http://h:9000", "b"), &s3("http://h:9000", "c")));
        assert!(!same_s3(&s3("http://h:9000", "b"), &s3("http://other:9000", "b")));

        assert!(same_place(EngineKind::Fs, &at("x"), EngineKind::Fs, &at("y")), "one per data directory");
        assert!(!same_place(EngineKind::Fs, &at("x"), EngineKind::Hybrid, &at("x")));
    }

    /// A torn last line is cut, whatever the journal's length; whole lines
    /// stay.
    #[test]
    fn the_journal_loses_only_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(JOURNAL);
        let line = format!("{} {}\n", "ab".repeat(32), "cd".repeat(20));
        let lines = line.repeat(5_000);
        for (written, kept) in [
            (String::new(), ""),
            ("torn".to_string(), ""),
            (lines.clone(), lines.as_str()),
            (format!("{lines}{}", &line[..30]), lines.as_str()),
            (format!("{}{}", &line, "x".repeat(200_000)), line.as_str()),
        ] {
            std::fs::write(&path, &written).unwrap();
            let mut file = append_to_journal(&path).unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), kept, "after {} bytes", written.len());
            file.write_all(b"next\n").unwrap();
            assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{kept}next\n"));
        }
    }

    /// A copy an earlier run made that cannot be read now (a network
    /// hiccup) is not a bad copy: it stays, and so does its journal line.
    /// One that is gone is.
    #[tokio::test(flavor = "multi_thread")]
    async fn a_copy_that_cannot_be_read_is_kept() {
        use crate::engine::faulty::{FaultyEngine, Trigger};
        use crate::store::{PutOptions, Store, StoreConfig};
        let dir = tempfile::tempdir().unwrap();
        let catalog = Arc::new(crate::catalog::rocks::RocksCatalog::open(&dir.path().join("catalog")).unwrap());
        let memory: DynEngine = Arc::new(crate::engine::memory::MemoryEngine::new());
        let store = Store::open(catalog.clone(), memory.clone(), StoreConfig::default()).await.unwrap();
        let body = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(b"copied before"))]);
        store.put("files", "k", body, PutOptions::default()).await.unwrap();
        let blob = catalog.list_blobs(None, 10).await.unwrap().remove(0);
        let journal = dir.path().join(JOURNAL);
        let line = format!("{} {}\n", blob.digest.to_hex(), hex::encode(&blob.locator));
        std::fs::write(&journal, &line).unwrap();

        let faulty = Arc::new(FaultyEngine::new(memory, 0));
        faulty.faults.reads.set(Trigger::Always);
        let target: DynEngine = faulty.clone();
        let earlier = read_journal(&journal).unwrap();
        let refused = recheck(catalog.as_ref(), &target, &journal, &earlier, 1).await.unwrap_err();
        assert!(refused.to_string().contains("could not be read"), "{refused:#}");
        faulty.faults.off();
        assert_eq!(target.stat(&blob.blob_ref()).await.unwrap(), Some(blob.size), "the copy was kept");
        assert_eq!(std::fs::read_to_string(&journal).unwrap(), line);
        recheck(catalog.as_ref(), &target, &journal, &earlier, 1).await.unwrap();
        // A copy that is gone is wrong, not unread: dropped from the journal
        // to be copied anew.
        target.delete(&blob.blob_ref()).await.unwrap();
        let refused = recheck(catalog.as_ref(), &target, &journal, &earlier, 1).await.unwrap_err();
        assert!(refused.to_string().contains("no longer match"), "{refused:#}");
        assert_eq!(std::fs::read_to_string(&journal).unwrap(), "");
    }
}
