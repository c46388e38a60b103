//! `depot serve` and the offline maintenance commands that open a data
//! directory directly.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::catalog::postgres::PostgresCatalog;
use crate::catalog::rocks::RocksCatalog;
use crate::catalog::{Catalog, CatalogKind, NODE_HEARTBEAT, NODE_LIFE};
use crate::config::{FreeSpace, ServeArgs, Settings};
use crate::engine::{self, DynEngine, ENGINE_MARKER, EngineKind};
use crate::http::{self, App};
use crate::store::maintenance::{BACKUP_CLAIM, BackupReport};
use crate::store::{Store, StoreConfig};

/// The data directory's [`ENGINE_MARKER`], or `None` for a new store.
fn read_engine_marker(data: &Path) -> anyhow::Result<Option<String>> {
    let marker = data.join(ENGINE_MARKER);
    match std::fs::read_to_string(&marker) {
        Ok(found) => Ok(Some(found)),
        // A store writes its marker before anything else, and a backup
        // after everything else: a catalog without one is a backup that
        // did not finish.
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && ["catalog", "catalog.tmp", BACKUP_CLAIM].iter().any(|f| data.join(f).exists()) =>
        {
            bail!(
                "{} holds a catalog, or part of one, but no {ENGINE_MARKER} file: a backup that did not finish; \
                 make the backup again",
                data.display()
            )
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", marker.display())),
    }
}

/// Refuses to tie a catalog that knows no blob to an engine's database or
/// bucket that holds some: they are another store's, and this store's
/// collector would take them for leftovers of its own crashed writes and
/// delete them. (Nodes sharing a PostgreSQL catalog share its engine too;
/// their catalog is not empty.)
async fn check_engine_unclaimed(engine: &DynEngine, catalog: Option<&dyn Catalog>) -> anyhow::Result<()> {
    if let Some(catalog) = catalog
        && catalog.stats().await?.blobs > 0
    {
        return Ok(());
    }
    let held = engine.list().await?.len();
    if held > 0 {
        bail!(
            "the {} engine holds {held} blob(s) this store does not know: another store's? This store's \
             collector would delete them. Give each store a database or bucket of its own",
            engine.name()
        );
    }
    Ok(())
}

/// Refuses a catalog a migration is switching over (its engine marker, see
/// [`engine::switching_marker`]): only the node that began it holds its
/// journal, and can finish it.
pub(crate) fn refuse_catalog_switching(claimed: Option<&str>) -> anyhow::Result<()> {
    if let Some(to) = claimed.and_then(engine::switching_to) {
        bail!(
            "a migration to {} stopped while it switched the catalog over: run `depot migrate` again on the node \
             that began it, whose data directory holds its journal",
            engine::describe_marker(to)
        );
    }
    Ok(())
}

/// Records in a shared catalog the engine its nodes must open, in place of
/// `claimed`, what it was found to say.
pub(crate) async fn record_engine(catalog: &dyn Catalog, claimed: Option<&str>, marker: &str) -> anyhow::Result<()> {
    if !catalog.set_engine_marker(claimed, marker).await? && catalog.engine_marker().await?.as_deref() != Some(marker) {
        bail!("another node tied this catalog to another engine while this one started: start it again");
    }
    Ok(())
}

fn write_engine_marker(data: &Path, marker: &str) -> anyhow::Result<()> {
    let path = data.join(ENGINE_MARKER);
    engine::write_engine_marker(data, marker).with_context(|| format!("writing {}", path.display()))
}

/// Whether RocksDB's error says another process holds the database: its
/// lock file's words, not a "lock" anywhere (a path may hold one).
fn held_elsewhere(error: &str) -> bool {
    error.contains("While lock file") || error.contains("lock hold by current process")
}

/// Opens the catalog of a store that exists. A store with its marker and
/// no embedded catalog had its catalog elsewhere (PostgreSQL) or lost it:
/// it is refused, for a new, empty catalog would take every blob stored
/// for a leftover, which the collector, repairs and migrations remove.
pub(crate) async fn open_catalog(settings: &Settings) -> anyhow::Result<Arc<dyn Catalog>> {
    let (data, path) = (&settings.data, settings.data.join("catalog"));
    if settings.catalog == CatalogKind::Rocksdb && data.join(ENGINE_MARKER).exists() && !path.join("CURRENT").exists() {
        bail!(
            "{} holds a store (it has an {ENGINE_MARKER} file) but no catalog in {}: give --catalog if the \
             store's catalog is in PostgreSQL; if it was lost, restore a backup (`depot backup`) rather than \
             start the store over, which would remove every file it holds (a first start cut short before it \
             stored anything leaves such a directory too: remove it)",
            data.display(),
            path.display()
        );
    }
    open_or_make_catalog(settings).await
}

/// Opens the catalog the settings name, making an embedded one if missing.
async fn open_or_make_catalog(settings: &Settings) -> anyhow::Result<Arc<dyn Catalog>> {
    let data = &settings.data;
    Ok(match &settings.catalog {
        CatalogKind::Rocksdb => Arc::new(RocksCatalog::open(&data.join("catalog")).map_err(|e| {
            let e = e.to_string();
            let hint = if held_elsewhere(&e) { " (is another depot using it?)" } else { "" };
            anyhow::anyhow!("opening the catalog in {}{hint}: {e}", data.display())
        })?),
        CatalogKind::Postgres(url) => Arc::new(
            PostgresCatalog::connect(url).await.map_err(|e| anyhow::anyhow!("opening the PostgreSQL catalog: {e}"))?,
        ),
    })
}

/// Opens the store in a data directory as the settings describe.
pub async fn open_store(settings: &Settings) -> anyhow::Result<Store> {
    let data = &settings.data;
    if data.exists() && !data.is_dir() {
        bail!("--data {} is a file: it must name a directory (it is made if missing)", data.display());
    }
    engine::create_dir_durably(data).with_context(|| format!("creating the data directory {}", data.display()))?;
    super::migrate::refuse_while_switching(data)?;
    let wanted = engine::marker(settings.engine, &settings.engine_config);
    let found = read_engine_marker(data)?;
    // A new data directory's own catalog is made only once the start is
    // accepted; a shared one may know many blobs, and names the engine
    // that holds them for every node.
    let shared = matches!(settings.catalog, CatalogKind::Postgres(_));
    let catalog = if found.is_some() || shared { Some(open_catalog(settings).await?) } else { None };
    let claimed = match &catalog {
        Some(catalog) => catalog.engine_marker().await?,
        None => None,
    };
    refuse_catalog_switching(claimed.as_deref())?;
    // Checked before the engine opens, which would make its directory.
    let tie_engine = match (&claimed, &found) {
        (None, None) => true,
        (Some(marker), _) | (None, Some(marker)) => match engine::marker_mismatch(data, marker, &wanted) {
            None => false,
            Some(why) => {
                let stats = match &catalog {
                    Some(catalog) => catalog.stats().await?,
                    None => Default::default(),
                };
                if stats.objects > 0 || stats.blobs > 0 {
                    match claimed {
                        Some(_) => bail!(
                            "the catalog's store keeps its bytes in {}, not in {}: every node sharing a catalog \
                             must be started with the same --engine and engine settings",
                            engine::describe_marker(marker),
                            engine::describe_marker(&wanted)
                        ),
                        None => bail!(why),
                    }
                }
                // Nor while other nodes serve it, writing into the engine
                // the catalog names: tied to another, the catalog would
                // send each node's readers where the other's bytes are not.
                if let (Some(catalog), Some(_)) = (&catalog, &claimed) {
                    let live = catalog.live_nodes(NODE_LIFE).await?;
                    if !live.is_empty() {
                        bail!(
                            "the catalog's store keeps its bytes in {}, not in {}, and {} node(s) serve it ({}): \
                             start every node with the same --engine and engine settings",
                            engine::describe_marker(marker),
                            engine::describe_marker(&wanted),
                            live.len(),
                            live.join("; ")
                        );
                    }
                }
                // A store that holds nothing may otherwise take any engine
                // (a first start that failed leaves such a store).
                true
            }
        },
    };
    let engine = engine::open(settings.engine, &data.join(settings.engine.name()), &settings.engine_config).await?;
    if tie_engine {
        check_engine_unclaimed(&engine, catalog.as_deref()).await?;
        if found.is_some() {
            tracing::info!("{} held an empty store; it now keeps its bytes as this start says", data.display());
        }
    }
    if found.as_ref() != Some(&wanted) {
        // New, taken by another engine while empty, or written before
        // markers named their places.
        write_engine_marker(data, &wanted)?;
    }
    let catalog = match catalog {
        Some(catalog) => catalog,
        None => open_or_make_catalog(settings).await?,
    };
    if claimed.as_ref() != Some(&wanted) {
        record_engine(catalog.as_ref(), claimed.as_deref(), &wanted).await?;
    }
    let config = StoreConfig {
        gc_grace: settings.gc_grace,
        upload_expiry: settings.upload_expiry,
        engine: Some((settings.engine, settings.engine_config.clone())),
        max_key_bytes: settings.max_key_bytes,
        data: Some(std::path::absolute(data)?),
        // Nothing grows in the data directory of a node whose catalog is
        // PostgreSQL and whose bytes go to a server.
        min_free_space: match rustix::fs::statvfs(data.as_path()) {
            Ok(fs) if !shared || settings.engine.is_embedded() => {
                let total = fs.f_blocks.saturating_mul(fs.f_frsize);
                let keep = FreeSpace::bytes(settings.min_free_space, total);
                if settings.min_free_space.is_some() && keep >= total {
                    bail!(
                        "--min-free-space {} is more than the file system of {} holds ({}): no upload could go",
                        indicatif::HumanBytes(keep),
                        data.display(),
                        indicatif::HumanBytes(total)
                    );
                }
                // RocksDB writes what it takes twice (its log, then its
                // tables as it flushes the memory tables, up to two of 16
                // MiB), and recovers from a full disk only with 16 MiB
                // free; with less kept, a full disk stops its writes, and
                // the next start, which flushes the log, fails.
                let rocksdb = !shared || matches!(settings.engine, EngineKind::Rocksdb | EngineKind::Hybrid);
                if rocksdb && keep > 0 && keep < FreeSpace::DEFAULT_FLOOR {
                    bail!(
                        "--min-free-space {} is too little for RocksDB, which needs {} free to flush its memory \
                         tables and to recover from a full disk: keep at least that, or 0 to fill the disk",
                        indicatif::HumanBytes(keep),
                        indicatif::HumanBytes(FreeSpace::DEFAULT_FLOOR)
                    );
                }
                keep
            }
            _ => 0,
        },
    };
    Ok(Store::open(catalog, engine, config).await?)
}

/// Opens a store that must exist already: maintenance of a mistyped
/// `--data` would otherwise check a new, empty store and call it sound.
async fn open_existing_store(settings: &Settings) -> anyhow::Result<Store> {
    if !settings.data.join(ENGINE_MARKER).exists() {
        bail!("{} holds no depot store (it has no {ENGINE_MARKER} file): check --data", settings.data.display());
    }
    open_store(settings).await
}

pub(crate) fn runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build()?)
}

/// `depot serve`.
pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let mut settings = Settings::resolve(args)?;
    // The client commands' secret, exported in this shell, may be meant
    // for this server too: starting it open would be the wrong guess.
    if settings.credentials.is_empty() && args.secret_key_env.is_some() {
        anyhow::bail!(
            "DEPOT_SECRET_KEY is set without an access key, so this server would start without credentials: \
             give DEPOT_ACCESS_KEY or --access-key to make it one, or unset it to serve without"
        );
    }
    // The memory engine keeps nothing across restarts, so neither does its
    // catalog: one kept in --data would list objects whose bytes are gone.
    let _scratch = match settings.engine {
        EngineKind::Memory => {
            let scratch = tempfile::Builder::new().prefix("depot-memory-").tempdir()?;
            settings.data = scratch.path().to_path_buf();
            Some(scratch)
        }
        _ => None,
    };
    runtime(settings.threads)?.block_on(run(settings))
}

/// Raises the soft limit of open files to the hard one, as much as a
/// server with `connections` open needs (Debian's soft limit is 1024,
/// under the 4096 connections depot takes): each connection is a file, and
/// a store out of files fails its writes. Warns when the hard limit is too
/// low for it.
fn raise_open_files(connections: usize) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let raised = Rlimit { current: limit.maximum, maximum: limit.maximum };
    let now = match limit.current < limit.maximum && setrlimit(Resource::Nofile, raised).is_ok() {
        true => limit.maximum,
        false => limit.current,
    };
    // Files beside the connections: the store's own, the engines', logs.
    let wanted = connections as u64 + 1024;
    if now.is_some_and(|n| n < wanted) {
        tracing::warn!(
            "this process may open {} files, fewer than --max-connections {connections} and the store's own \
             files need ({wanted}): raise `ulimit -n`, or lower --max-connections",
            now.unwrap_or_default()
        );
    }
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    raise_open_files(settings.limits.max_connections);
    let store = open_store(&settings).await?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    let app = Arc::new(App::new(
        store,
        settings.limits.clone(),
        &settings.credentials,
        settings.s3_domain.as_deref(),
        addr,
        &settings.allowed_hosts,
    )?);
    if settings.credentials.is_empty() {
        tracing::warn!("no credentials configured: anyone who can reach {addr} can read and write");
    }
    tracing::info!(
        "depot listening on http://{addr} (engine {}, data {})",
        settings.engine.name(),
        settings.data.display()
    );
    let node = node_name(addr);
    let mut heartbeats = None;
    if matches!(settings.catalog, CatalogKind::Postgres(_)) {
        let sent = crate::store::lease_clock();
        app.store.catalog().node_seen(&node).await.context("noting this node in the catalog")?;
        refuse_to_join(app.store.catalog(), &node).await?;
        app.store.lease_writes(sent);
        let (app, node) = (app.clone(), node.clone());
        heartbeats = Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(NODE_HEARTBEAT).await;
                heartbeat(&app.store, &node).await;
            }
        }));
    }
    let lister = app.clone();
    tokio::spawn(async move {
        match lister.store.list_unlisted_uploads().await {
            Ok(0) => {}
            Ok(n) => tracing::info!("listed {n} multipart upload(s) begun by an earlier version"),
            Err(e) => tracing::warn!("could not list the multipart uploads begun by an earlier version: {e}"),
        }
    });
    if !settings.gc_interval.is_zero() {
        let (app, every) = (app.clone(), settings.gc_interval);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                // A pass of its own: one that panics is said, and the next
                // still runs, rather than collection ending unsaid.
                let app = app.clone();
                match tokio::spawn(async move { app.store.gc().await }).await {
                    Ok(Ok(r)) if r.dead_blobs + r.orphans > 0 => {
                        tracing::info!(?r, "garbage collected")
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!("garbage collection failed: {e}"),
                    Err(e) => tracing::error!("garbage collection failed: {e}"),
                }
            }
        });
    }
    http::serve(listener, app.clone(), settings.threads, shutdown_signal(), Duration::from_secs(30)).await?;
    // Stopped first: a heartbeat landing after the note below would note
    // this node live again, and hold maintenance off until it lapsed.
    if let Some(heartbeats) = heartbeats {
        heartbeats.abort();
        let _ = heartbeats.await;
    }
    // Bounded: a catalog that is down must not hold the exit up; the note
    // then lapses by itself.
    match tokio::time::timeout(Duration::from_secs(2), app.store.catalog().node_gone(&node)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("could not note in the catalog that this node stopped: {e}"),
        Err(_) => tracing::warn!("could not note in the catalog that this node stopped: no answer in 2 s"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Notes this node live in the shared catalog, then looks for maintenance
/// that needs the store to itself. Such maintenance looks for live nodes
/// once, as it starts: a node the catalog did not hear from then (cut off,
/// paused) may be back while it runs. Its writes could then be counted
/// out by `verify --repair` or left in the old engine by `migrate`, so it
/// takes none.
///
/// A round renews the lease on writes (see
/// [`crate::store::Store::lease_writes`]) when it finds no maintenance
/// running. Maintenance still starting (looking for nodes) is no reason
/// not to while the lease held as the round began: the node was noted
/// within the lease then, so the maintenance saw it whenever it looked,
/// and gives way. With the lease lapsed, the maintenance may have looked
/// while the node was silent: its lease waits for the next round.
async fn heartbeat(store: &crate::store::Store, node: &str) {
    let (sent, held) = (crate::store::lease_clock(), store.lease_holds());
    if let Err(e) = store.catalog().node_seen(node).await {
        tracing::warn!("could not note this node in the catalog: {e}");
        return;
    }
    match maintenance_notes(store.catalog()).await {
        Ok(notes) => {
            let running: Vec<&str> = notes.iter().map(String::as_str).filter(|n| n.starts_with(MAINTENANCE)).collect();
            if !running.is_empty() {
                store.refuse_writes(format!(
                    "{} began while this node was not heard from: restart this node once it has ended",
                    running.join("; ")
                ));
            } else if notes.is_empty() || held {
                store.lease_writes(sent);
            }
        }
        Err(e) => tracing::warn!("could not look for maintenance in the catalog: {e}"),
    }
}

/// How this node appears to maintenance run against a shared catalog.
fn node_name(addr: std::net::SocketAddr) -> String {
    format!("{} {addr} (pid {}) {NODE_GENERATION}", crate::engine::fs::hostname(), std::process::id())
}

/// Ends the note of a serving node of this version. Nodes of earlier
/// versions lock the catalog's keys and digests another way, so the two
/// would not keep each other's writes apart: a node does not start beside
/// one whose note lacks it.
const NODE_GENERATION: &str = "[catalog locks 2]";

/// How the note of maintenance in a shared catalog's list of nodes begins
/// (see [`alone`]).
const MAINTENANCE: &str = "maintenance: ";
/// The note of maintenance that has not yet found the store to itself:
/// starting nodes wait for it, serving ones do not (it may yet give way
/// to them).
const MAINTENANCE_STARTING: &str = "maintenance starting: ";

/// Runs `work`, maintenance that needs the store to itself (`what`:
/// "verifying", "migrating"), only while no node serves a shared catalog:
/// counts it reads, and bytes it deletes as no record's, could change
/// under it. It notes itself in the catalog's list of nodes for as long
/// as it runs, so that a node starting meanwhile refuses to (see
/// [`run`]); each notes itself before it looks for the other, so of two
/// starting at once at least one sees the other. The first note says the
/// maintenance is starting; only once it has found no node does the note
/// that serving nodes heed (they then refuse writes) replace it, so that
/// maintenance refused for the nodes it found stops none of them.
pub(crate) async fn alone<T>(
    catalog: &dyn Catalog,
    what: &str,
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    let about = format!("{what} on {} (pid {})", crate::engine::fs::hostname(), std::process::id());
    let (starting, note) = (format!("{MAINTENANCE_STARTING}{about}"), format!("{MAINTENANCE}{about}"));
    catalog.node_seen(&starting).await.context("noting the maintenance in the catalog")?;
    let looked = async {
        let live: Vec<String> = catalog.live_nodes(NODE_LIFE).await?.into_iter().filter(|n| *n != starting).collect();
        // Only maintenance that goes ahead tells serving nodes to stop
        // writing.
        if live.is_empty() {
            catalog.node_seen(&note).await.context("noting the maintenance in the catalog")?;
        }
        anyhow::Ok(live)
    };
    let live = looked.await;
    // Whatever the look found, the first note goes: left, it would keep
    // nodes from starting until it lapsed.
    if let Err(e) = catalog.node_gone(&starting).await {
        tracing::warn!("could not clear the maintenance's first note in the catalog (it lapses by itself): {e}");
    }
    let live = live?;
    let out = if live.is_empty() {
        let heartbeat = async {
            loop {
                tokio::time::sleep(NODE_HEARTBEAT).await;
                if let Err(e) = catalog.node_seen(&note).await {
                    tracing::warn!("could not note the maintenance in the catalog: {e}");
                }
            }
        };
        tokio::select! {
            out = work => out,
            never = heartbeat => never,
        }
    } else {
        Err(anyhow::anyhow!(
            "{} node(s) serve this catalog ({}, heard from in the last {} s): stop them before {what}",
            live.len(),
            live.join("; "),
            NODE_LIFE.as_secs()
        ))
    };
    if let Err(e) = catalog.node_gone(&note).await {
        tracing::warn!("could not note in the catalog that the maintenance ended (it lapses by itself): {e}");
    }
    out
}

/// The notes of maintenance that needs the store to itself, running or
/// still looking for nodes.
async fn maintenance_notes(catalog: &dyn Catalog) -> anyhow::Result<Vec<String>> {
    let nodes = catalog.live_nodes(NODE_LIFE).await?;
    Ok(nodes.into_iter().filter(|n| is_maintenance(n)).collect())
}

fn is_maintenance(note: &str) -> bool {
    note.starts_with(MAINTENANCE) || note.starts_with(MAINTENANCE_STARTING)
}

/// Refuses to serve while maintenance that needs the store to itself
/// runs on the shared catalog (see [`alone`]), or beside nodes of an
/// earlier version, once this node is noted.
async fn refuse_to_join(catalog: &dyn Catalog, node: &str) -> anyhow::Result<()> {
    let (running, serving): (Vec<String>, Vec<String>) =
        catalog.live_nodes(NODE_LIFE).await?.into_iter().partition(|n| is_maintenance(n));
    let older: Vec<String> = serving.into_iter().filter(|n| !n.ends_with(NODE_GENERATION)).collect();
    let why = if !older.is_empty() {
        format!(
            "nodes of an earlier version serve this catalog ({}), and lock its keys another way: stop them all, \
             then start this version",
            older.join("; ")
        )
    } else if !running.is_empty() {
        format!(
            "{} (heard from in the last {} s): start this node once it has ended",
            running.join("; "),
            NODE_LIFE.as_secs()
        )
    } else {
        return Ok(());
    };
    let _ = catalog.node_gone(node).await;
    bail!(why)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down: finishing requests in flight");
}

/// `depot gc`: one collection pass over a data directory the server is not
/// using.
pub fn gc(args: &ServeArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(args)?;
    runtime(1)?.block_on(async {
        let store = open_existing_store(&settings).await?;
        let report = store.gc().await?;
        say!(
            "removed {} unreferenced blob(s) and {} orphan(s), {} freed",
            report.dead_blobs,
            report.orphans,
            indicatif::HumanBytes(report.bytes_freed)
        )?;
        Ok(())
    })
}

/// `depot verify`: checks a data directory the server is not using.
pub fn verify(args: &ServeArgs, repair: bool) -> anyhow::Result<()> {
    let mut settings = Settings::resolve(args)?;
    settings.engine_config.without_compactions = true;
    runtime(1)?.block_on(async {
        let store = open_existing_store(&settings).await?;
        let report = alone(store.catalog(), "verifying", async {
            let total = store.stats().await?.blob_bytes.max(0) as u64;
            let progress = super::progress_bar(total, super::BYTES_BAR);
            progress.set_message("verifying");
            let report = store.verify(repair, &progress).await?;
            progress.finish_and_clear();
            Ok(report)
        })
        .await?;
        // Keys are the uploaders' to choose: escaped, as every command
        // prints them, so that none acts on the terminal.
        let printable = |line: String| super::client::printable(&line).into_owned();
        for problem in &report.problems {
            say!("{}", printable(problem.to_string()))?;
        }
        // The fs engine takes a new upload's bytes in place of damaged
        // ones; the others (the hybrid engine's small blobs, in RocksDB,
        // among them) keep the first copy of a content, until `--repair`
        // removes the damaged bytes.
        let remedy = match settings.engine {
            EngineKind::Fs => "upload it again",
            _ if repair => "its damaged bytes are removed: upload it again",
            _ => "run `depot verify --repair`, which removes damaged bytes, then upload it again",
        };
        for damaged in &report.damaged_objects {
            say!("lost or damaged: {} ({remedy})", printable(damaged.to_string()))?;
        }
        for b in &report.leftovers {
            say!("leftover: blob {}: {} bytes in the engine that no record points at", b.digest, b.size)?;
        }
        let leftover_bytes: u64 = report.leftovers.iter().map(|b| b.size).sum();
        let unlisted = report.problems.iter().any(|p| matches!(p, crate::store::maintenance::Problem::Unlisted { .. }));
        let leftovers = match unlisted {
            true => "leftovers not looked for".to_string(),
            false => format!("{} leftover blob(s), {}", report.leftovers.len(), indicatif::HumanBytes(leftover_bytes)),
        };
        say!(
            "{} objects, {} blobs, {} read and hashed: {} problem(s){}; {leftovers}{}",
            report.objects,
            report.blobs,
            indicatif::HumanBytes(report.bytes_read),
            report.problems.len(),
            if repair { format!(", {} repaired", report.repaired) } else { String::new() },
            if repair {
                format!(
                    "; removed {} leftover and unreferenced blob(s) and the damaged bytes of {} blob(s){}",
                    report.removed,
                    report.cleared,
                    match report.relinked {
                        0 => String::new(),
                        n => format!("; pointed {n} blob record(s) at whole copies found elsewhere in the engine"),
                    }
                )
            } else if !report.leftovers.is_empty() {
                " (from writes a crash cut short: the collector removes them after --gc-grace, --repair now)".into()
            } else {
                String::new()
            }
        )?;
        match report.unresolved() {
            0 => Ok(()),
            _ if unlisted => bail!(
                "the engine could not list its blobs (see above), so verification is incomplete: run it again once \
                 the engine reads"
            ),
            n if repair && report.damaged_objects.is_empty() => {
                bail!("{n} problem(s) remain (see above), which `--repair` does not fix")
            }
            n if repair => bail!(
                "{n} problem(s) remain, which `--repair` does not fix; {} object(s) lost or damaged bytes, which \
                 only uploading them again restores",
                report.damaged_objects.len()
            ),
            n if report.damaged_objects.is_empty() => match report.problems.iter().filter(|p| p.repairable()).count() {
                0 => bail!("{n} problem(s) (see above), which `depot verify --repair` does not fix"),
                fixed if fixed == n => bail!("{n} problem(s); `depot verify --repair` fixes counts and totals"),
                fixed => bail!("{n} problem(s); `depot verify --repair` fixes {fixed} of them, counts and totals"),
            },
            n => bail!(
                "{n} problem(s); {} object(s) lost or damaged bytes, which only uploading them again restores \
                 (`--repair` fixes counts and totals and removes damaged bytes; see above how)",
                report.damaged_objects.len()
            ),
        }
    })
}

/// `depot backup DIR`: copies the store itself when no server holds it,
/// else asks the server on `--listen` to write the copy.
pub fn backup(args: &ServeArgs, dir: &Path) -> anyhow::Result<()> {
    let settings = Settings::resolve(args)?;
    let dir = std::path::absolute(dir).with_context(|| format!("resolving {}", dir.display()))?;
    runtime(1)?.block_on(async {
        let report = match open_existing_store(&settings).await {
            Ok(store) => {
                let progress = super::progress_bar(0, super::BYTES_BAR);
                progress.set_message("copying");
                let report = store.backup(&dir, &progress).await?;
                progress.finish_and_clear();
                report
            }
            Err(e) if settings.catalog == CatalogKind::Rocksdb && held_elsewhere(&format!("{e:#}")) => {
                backup_through_server(&settings, args.secret_key_env.as_deref(), &dir).await?
            }
            Err(e) => return Err(e),
        };
        say!(
            "backed up {} objects in {} blobs ({}) to {}",
            report.objects,
            report.blobs,
            indicatif::HumanBytes(report.bytes),
            dir.display()
        )?;
        Ok(())
    })
}

/// Whether `ip` is an address of this machine: one a socket can be bound
/// to here.
fn this_machine(ip: std::net::IpAddr) -> bool {
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Asks the server that holds the data directory to write the backup,
/// with the first credential's secret, else with `client_secret`
/// (DEPOT_SECRET_KEY alone, as the client commands send it).
async fn backup_through_server(
    settings: &Settings,
    client_secret: Option<&str>,
    dir: &Path,
) -> anyhow::Result<BackupReport> {
    let dir = dir.to_str().context("the backup directory's path is not UTF-8")?;
    let url = format!("http://{}/_/backup", settings.listen);
    let data = std::path::absolute(&settings.data)?;
    let data = data.to_str().context("the data directory's path is not UTF-8")?;
    // Straight to the server: a proxy of the environment's would see the
    // token.
    let mut request = reqwest::Client::builder().no_proxy().build()?.post(&url).query(&[("dir", dir), ("data", data)]);
    // A server with credentials takes a secret. One without takes the data
    // directory's token, which says the request comes from someone who may
    // read the directory: sent to an address of this machine only, and
    // whether a secret is known or not (one exported for the client
    // commands says nothing of the server's). Why it was not sent, if the
    // server wants it.
    if let Some(secret) = settings.credentials.first().map(|c| c.secret_key.as_str()).or(client_secret) {
        request = request.bearer_auth(secret);
    }
    let mut unsent = None;
    if this_machine(settings.listen.ip()) {
        let path = settings.data.join(crate::http::LOCAL_TOKEN_FILE);
        match std::fs::read_to_string(&path) {
            Ok(token) => request = request.header(crate::http::LOCAL_TOKEN_HEADER, token.trim()),
            Err(e) => unsent = Some(format!("reading {}: {e}", path.display())),
        }
    } else {
        unsent = Some(format!("--listen {} is not an address of this machine", settings.listen));
    }
    say!("a server holds {}: asking it at {url}", settings.data.display())?;
    let response = request.send().await.with_context(|| format!("asking {url} for a backup"))?;
    if !response.status().is_success() {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let hint = match (status, unsent) {
            (reqwest::StatusCode::FORBIDDEN, Some(why)) => format!(" (the local token was not sent: {why})"),
            (reqwest::StatusCode::CONFLICT | reqwest::StatusCode::FORBIDDEN, _) => {
                " (give the --listen address of the server that holds the data directory)".to_string()
            }
            _ => String::new(),
        };
        bail!("the server refused the backup: {status} {text}{hint}");
    }
    Ok(response.json().await?)
}
