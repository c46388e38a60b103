//! `depot bench mget`, after the seed "RocksServer microbenchmark": many
//! keys with values of 50 ± 5 bytes, loaded through `/_/batch/put`, then
//! `/_/batch/get` of 50, 300, 1000, 10,000 and 100,000 random keys, one
//! request at a time over a keep-alive connection. Each batch size is timed
//! warm (right after every key has been read once, and one untimed request)
//! and cold (page cache dropped and the server restarted before each
//! request; needs root). The floors are RocksDB's own in-process
//! `multi_get` of the same keys in a fresh database, one with RocksDB's
//! default options and one with those of depot's catalog, warm and cold the
//! same way, each right after depot's request for the same keys (and the
//! floors before it). Every answer is checked to hold every key asked for.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use http::Method;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::load::{self, Connection};
use super::{
    DataDir, DepotServer, EngineChoice, ExperimentReport, Progress, Ratio, Row, Settings, drop_caches, thousands,
};
use crate::bench::stats::Summary;

const NAME: &str = "mget";
const MS: &str = "ms/request";
const RATIO: &str = "× multi_get";
const BUCKET: &str = "files";
/// Entries per `/_/batch/put` while loading.
const LOAD_BATCH: usize = 1000;
/// Batch puts in flight while loading: every entry is made durable on its
/// own, and concurrent writers share syncs.
const LOADERS: usize = 8;
/// Keys per request, with the seed's time on SSD (cold: machine rebooted).
const SIZES: [(usize, f64); 5] = [(50, 4.7), (300, 12.6), (1000, 29.5), (10_000, 124.6), (100_000, 2346.6)];
const SEED_SOURCE: &str = "RocksServer SSD, cold";

/// How much data and how many timed requests.
#[derive(Clone, Copy, Debug)]
struct Scale {
    keys: usize,
    largest_batch: usize,
    rounds: usize,
}

fn scale(settings: &Settings) -> Scale {
    if settings.quick {
        Scale { keys: 10_000, largest_batch: 10_000, rounds: 3 }
    } else {
        Scale { keys: 1_000_000, largest_batch: 100_000, rounds: 5 }
    }
}

fn key(i: usize) -> String {
    format!("mget/{i:08}")
}

/// The value of key `i`: 45 to 55 printable bytes, the same on every run.
fn value(i: usize) -> Vec<u8> {
    let mut rng = SmallRng::seed_from_u64(0x6d67_6574 ^ i as u64);
    let len = rng.random_range(45..=55);
    (0..len).map(|_| rng.random_range(b'!'..=b'~')).collect()
}

fn case(size: usize) -> String {
    format!("{} keys", thousands(size as u64))
}

/// The random key sets: per batch size, one untimed set then one per round.
#[derive(Clone)]
struct KeySets {
    /// Keys stored, from which each set is drawn.
    keys: usize,
    sizes: Vec<(usize, f64)>,
    sets: Vec<Vec<Vec<usize>>>,
}

impl KeySets {
    fn new(scale: Scale) -> KeySets {
        let mut rng = SmallRng::seed_from_u64(7);
        let sizes: Vec<_> = SIZES.into_iter().filter(|(n, _)| *n <= scale.largest_batch && *n <= scale.keys).collect();
        let sets = sizes
            .iter()
            .map(|(n, _)| {
                (0..=scale.rounds).map(|_| rand::seq::index::sample(&mut rng, scale.keys, *n).into_vec()).collect()
            })
            .collect();
        KeySets { keys: scale.keys, sizes, sets }
    }

    /// Every stored key, in runs of the largest batch size.
    fn all_in_batches(&self) -> Vec<Vec<usize>> {
        let largest = self.sizes.last().map_or(self.keys, |(n, _)| *n).max(1);
        (0..self.keys).step_by(largest).map(|first| (first..(first + largest).min(self.keys)).collect()).collect()
    }
}

/// Warm and cold timings of every batch size, in milliseconds.
struct Timings {
    warm: Vec<Vec<f64>>,
    cold: Result<Vec<Vec<f64>>, String>,
}

pub async fn run(settings: &Settings) -> anyhow::Result<ExperimentReport> {
    let scale = scale(settings);
    let sets = KeySets::new(scale);
    let steps_per_subject = 1 + 2 * sets.sizes.len() as u64;
    let progress = Progress::new(NAME, (settings.engines.len() + FLOORS.len()) as u64 * steps_per_subject);
    let cold_possible = drop_caches();
    let mut rows = Vec::new();
    let load_case = format!("load {} keys", thousands(scale.keys as u64));
    // The floors' steps: their loading first, the rest last.
    let mut floors = Vec::new();
    let mut floor_dirs = Vec::new();
    for (i, kind) in FLOORS.iter().enumerate() {
        progress.part(1);
        progress.doing(&format!("{}: loading", kind.subject));
        let floor_dir = DataDir::new(settings.scratch.join(format!("mget-rocksdb-{i}")));
        let dir = floor_dir.path().to_path_buf();
        floors.push(tokio::task::spawn_blocking(move || Floor::load(kind, &dir, scale)).await?.map(Arc::new));
        floor_dirs.push(floor_dir);
        progress.done(1);
    }
    let ready: Vec<&Arc<Floor>> = floors.iter().filter_map(|f| f.as_ref().ok()).collect();
    // Each timed request to depot is followed by each floor's of the same
    // keys, so all see the machine in the same state. A floor's times are
    // those taken beside some engine, if any were.
    let mut floor_times: Vec<Option<Timings>> = ready.iter().map(|_| None).collect();
    for (i, engine) in settings.engines.iter().enumerate() {
        progress.part(steps_per_subject);
        let subject = engine.subject();
        progress.doing(&format!("{subject}: starting"));
        let measured = match skip_reason(engine, settings) {
            Some(why) => Err(why),
            None => measure_depot(engine, i, &sets, &cold_possible, &ready, settings, &progress)
                .await
                .map_err(|e| format!("{e:#}")),
        };
        match measured {
            Ok((rate, timings, beside)) => {
                rows.push(Row::single(NAME, &load_case, &subject, "keys/s", rate));
                rows.extend(timing_rows(&subject, &sets, &timings, true));
                for ((floor, beside), times) in ready.iter().zip(beside).zip(&mut floor_times) {
                    match beside {
                        Ok(beside) => {
                            rows.extend(ratio_rows(&subject, &sets, &timings, &beside, floor.kind.ratio));
                            times.get_or_insert_with(|| Timings::empty(sets.sizes.len())).add(&beside);
                        }
                        Err(why) => {
                            let why = format!("{} failed beside this engine: {why}", floor.kind.subject);
                            for (n, _) in &sets.sizes {
                                rows.push(Row::skipped(NAME, &case(*n), &subject, floor.kind.ratio, &why));
                            }
                        }
                    }
                }
            }
            Err(why) => {
                rows.push(Row::skipped(NAME, &load_case, &subject, "keys/s", &why));
                for (n, _) in &sets.sizes {
                    rows.push(Row::skipped(NAME, &case(*n), &subject, MS, &why));
                }
            }
        }
    }
    // In `ready`'s order: one for each floor that loaded.
    let mut paired_times = floor_times.into_iter();
    for (kind, floor) in FLOORS.iter().zip(floors) {
        progress.part(steps_per_subject - 1);
        let floor_times = match floor.map(|f| (paired_times.next().flatten(), f)) {
            Ok((Some(times), _)) => Ok(times),
            Ok((None, floor)) => {
                // No engine ran beside it: the floor alone.
                progress.doing(kind.subject);
                let (sets, cold) = (sets.clone(), cold_possible.clone());
                tokio::task::spawn_blocking(move || floor.alone(&sets, cold)).await?
            }
            Err(e) => Err(e),
        };
        match floor_times {
            Ok(timings) => rows.extend(timing_rows(kind.subject, &sets, &timings, false)),
            Err(e) => {
                for (n, _) in &sets.sizes {
                    rows.push(Row::skipped(NAME, &case(*n), kind.subject, MS, &format!("{e:#}")));
                }
            }
        }
    }
    drop(floor_dirs);
    progress.finish();
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "Batch get of random keys (seed: RocksServer microbenchmark)".into(),
        method: vec![
            format!(
                "{} keys with values of 50 ± 5 bytes, loaded with /_/batch/put ({} entries per request, {} at a time); \
                 then /_/batch/get of random keys, one request at a time: one untimed request, then {} timed \
                 ones per batch size, each with its own keys; median and spread (min..max).",
                thousands(scale.keys as u64),
                thousands(LOAD_BATCH as u64),
                LOADERS,
                scale.rounds
            ),
            "cold: dirty pages synced, page cache dropped and the server restarted before each timed request; \
             warm: the server kept running, and right before each batch size every key was read once, \
             through depot and through each floor (some kernels page out file pages left untouched for a \
             minute, free memory or not; without the pass, warm requests would find part of the data on \
             disk). rocksdb multi_get: the same keys and values in a fresh RocksDB with default options, \
             read in-process (no HTTP) in one call on one thread. rocksdb multi_get, depot's options: the \
             same with the options of depot's catalog (uncompressed tables read through a memory map, a \
             hash index in each block, bloom filters), still one call on one thread, where depot looks a \
             batch up in windows on every core. Like the floors, depot makes one lookup a key, values of \
             64 bytes or less being kept in their object records. Each timed request to depot is followed \
             by each floor's of the same keys in turn (warm, or cold after the same steps); × multi_get: depot's \
             time over the default floor's beside it (the target's ratio), median and spread; × multi_get, \
             depot's options: over the other floor's."
                .into(),
            "The seed column is RocksServer's figure on SSD, caches cleared by a reboot, 1,000,000 keys; its \
             client was a PHP driver."
                .into(),
        ],
        chart_metric: MS.into(),
        ratio: Some(Ratio { metric: RATIO.into(), of_rates: false }),
        also_charted: Vec::new(),
        rows,
    })
}

/// Why an engine is left out of this experiment, when it is.
fn skip_reason(engine: &EngineChoice, settings: &Settings) -> Option<String> {
    match &engine.serve_flags {
        Err(why) => Some(why.clone()),
        Ok(_) if engine.name == "fs" && !settings.engines_named => {
            Some("one file per 50-byte value; not run unless named (--engines fs)".into())
        }
        Ok(_) if matches!(engine.name.as_str(), "gridfs" | "s3") && !settings.engines_named => Some(format!(
            "one {} per 50-byte value on its server; not run unless named (--engines {})",
            if engine.name == "s3" { "object" } else { "GridFS file" },
            engine.name
        )),
        Ok(_) => None,
    }
}

fn timing_rows(subject: &str, sets: &KeySets, t: &Timings, seeded: bool) -> Vec<Row> {
    let mut rows = Vec::new();
    for (i, (n, seed)) in sets.sizes.iter().enumerate() {
        let case = case(*n);
        let seed = seeded.then_some((*seed, SEED_SOURCE));
        let warm = format!("{subject} (warm)");
        if let Some(s) = t.warm.get(i).and_then(|v| Summary::of(v)) {
            rows.push(Row::measured(NAME, &case, &warm, MS, s));
        }
        let cold = format!("{subject} (cold)");
        rows.push(match &t.cold {
            Ok(times) => match times.get(i).and_then(|v| Summary::of(v)) {
                Some(s) => Row::measured(NAME, &case, &cold, MS, s).with_seed(seed),
                None => Row::skipped(NAME, &case, &cold, MS, "no timing").with_seed(seed),
            },
            Err(why) => Row::skipped(NAME, &case, &cold, MS, why).with_seed(seed),
        });
    }
    rows
}

/// Loads the keys into a depot with `engine` and times every batch size;
/// returns the load rate (keys/s), the timings, and each floor's timings
/// beside them or its failure (depot's timings are kept either way).
async fn measure_depot(
    engine: &EngineChoice,
    index: usize,
    sets: &KeySets,
    cold_possible: &Result<(), String>,
    floors: &[&Arc<Floor>],
    settings: &Settings,
    progress: &Progress,
) -> anyhow::Result<(f64, Timings, Vec<Result<Timings, String>>)> {
    let subject = engine.subject();
    let flags = engine.serve_flags.as_ref().map_err(|e| anyhow::anyhow!("{e}"))?;
    let data = DataDir::new(settings.scratch.join(format!("mget-{index}-{}", engine.name)));
    let mut server = DepotServer::start(&engine.name, flags, data.path(), settings.threads)?;
    progress.doing(&format!("{subject}: loading {} keys", thousands(sets.keys as u64)));
    let started = Instant::now();
    let addr = server.addr;
    futures::stream::iter((0..sets.keys).step_by(LOAD_BATCH))
        .map(|first| async move {
            let mut body = Vec::new();
            for i in first..(first + LOAD_BATCH).min(sets.keys) {
                let v = value(i);
                body.extend_from_slice(format!("{}\n{}\n", key(i), v.len()).as_bytes());
                body.extend_from_slice(&v);
                body.push(b'\n');
            }
            let path = format!("/_/batch/put?bucket={BUCKET}");
            Connection::open(addr).await?.expect_ok(load::request(Method::POST, addr, &path, body.into())).await
        })
        .buffer_unordered(LOADERS)
        .try_collect::<Vec<_>>()
        .await?;
    let rate = sets.keys as f64 / started.elapsed().as_secs_f64();
    let mut conn = Connection::open(server.addr).await?;
    progress.done(1);
    let mut depot = Timings::empty(sets.sizes.len());
    let mut beside: Vec<Beside> = floors.iter().map(|f| Beside::new(f, sets.sizes.len())).collect();
    for (size, ((n, _), rounds)) in sets.sizes.iter().zip(&sets.sets).enumerate() {
        progress.doing(&format!("{subject}: {} warm", case(*n)));
        for keys in sets.all_in_batches() {
            timed_get(&mut conn, server.addr, &keys).await?;
            for b in &mut beside {
                b.get(keys.clone(), false).await;
            }
        }
        for (r, keys) in rounds.iter().enumerate() {
            let ms = timed_get(&mut conn, server.addr, keys).await?;
            // The first request of a size warms up.
            if r > 0 {
                depot.warm[size].push(ms);
            }
            for b in &mut beside {
                let floor_ms = b.get(keys.clone(), false).await;
                if r > 0 {
                    b.timings.warm[size].extend(floor_ms);
                }
            }
        }
        progress.done(1);
    }
    if let Err(why) = cold_possible {
        depot.cold = Err(why.clone());
        beside.iter_mut().for_each(|b| b.timings.cold = Err(why.clone()));
    }
    for (size, ((n, _), rounds)) in sets.sizes.iter().zip(&sets.sets).enumerate() {
        let Ok(cold) = &mut depot.cold else { break };
        progress.doing(&format!("{subject}: {} cold", case(*n)));
        for keys in &rounds[1..] {
            server.restart_cold()?;
            let mut conn = Connection::open(server.addr).await?;
            cold[size].push(timed_get(&mut conn, server.addr, keys).await?);
            for b in &mut beside {
                if let Some(ms) = b.get(keys.clone(), true).await
                    && let Ok(floor_cold) = &mut b.timings.cold
                {
                    floor_cold[size].push(ms);
                }
            }
        }
        progress.done(1);
    }
    Ok((rate, depot, beside.into_iter().map(Beside::finish).collect()))
}

/// A floor's requests beside one engine's: its timings, until it fails;
/// then depot's requests go on without it, and the pair is dropped.
struct Beside<'a> {
    floor: &'a Arc<Floor>,
    timings: Timings,
    failed: Option<String>,
}

impl<'a> Beside<'a> {
    fn new(floor: &'a Arc<Floor>, sizes: usize) -> Beside<'a> {
        Beside { floor, timings: Timings::empty(sizes), failed: None }
    }

    /// The floor's time for `keys`, unless it has failed (now or before).
    async fn get(&mut self, keys: Vec<usize>, cold: bool) -> Option<f64> {
        if self.failed.is_some() {
            return None;
        }
        match self.floor.get_blocking(keys, cold).await {
            Ok(ms) => Some(ms),
            Err(e) => {
                self.failed = Some(format!("{e:#}"));
                None
            }
        }
    }

    /// The floor's timings, or why it failed.
    fn finish(self) -> Result<Timings, String> {
        self.failed.map_or(Ok(self.timings), Err)
    }
}

/// Depot's times as multiples of a floor's beside them, request by request,
/// under `metric`.
fn ratio_rows(subject: &str, sets: &KeySets, depot: &Timings, floor: &Timings, metric: &str) -> Vec<Row> {
    let ratios = |d: &[f64], f: &[f64]| d.iter().zip(f).map(|(d, f)| d / f).collect::<Vec<_>>();
    let mut rows = Vec::new();
    for (i, (n, _)) in sets.sizes.iter().enumerate() {
        if let Some(s) = Summary::of(&ratios(&depot.warm[i], &floor.warm[i])) {
            rows.push(Row::measured(NAME, &case(*n), &format!("{subject} (warm)"), metric, s));
        }
        if let (Ok(d), Ok(f)) = (&depot.cold, &floor.cold)
            && let Some(s) = Summary::of(&ratios(&d[i], &f[i]))
        {
            rows.push(Row::measured(NAME, &case(*n), &format!("{subject} (cold)"), metric, s));
        }
    }
    rows
}

/// Times one `/_/batch/get` of `keys`, in milliseconds, and checks that
/// every key came back with its value's length.
async fn timed_get(conn: &mut Connection, addr: std::net::SocketAddr, keys: &[usize]) -> anyhow::Result<f64> {
    let mut body = String::new();
    for i in keys {
        body.push_str(&key(*i));
        body.push('\n');
    }
    let req = load::request(Method::POST, addr, &format!("/_/batch/get?bucket={BUCKET}"), Bytes::from(body));
    let started = Instant::now();
    let answer = conn.expect_ok(req).await?;
    let elapsed = started.elapsed();
    let lengths = batch_lengths(&answer)?;
    let expected: Vec<Option<usize>> = keys.iter().map(|i| Some(value(*i).len())).collect();
    if lengths != expected {
        bail!("the batch answer does not match the {} keys asked for", keys.len());
    }
    Ok(ms(elapsed))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The value lengths in a `/_/batch/get` answer (`None` for an absent key).
fn batch_lengths(mut body: &[u8]) -> anyhow::Result<Vec<Option<usize>>> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let nl = body.iter().position(|b| *b == b'\n').context("a length line without newline")?;
        let line = std::str::from_utf8(&body[..nl])?;
        body = &body[nl + 1..];
        if line == "-1" {
            out.push(None);
            continue;
        }
        let len: usize = line.parse().with_context(|| format!("length {line:?}"))?;
        if body.len() < len + 1 || body[len] != b'\n' {
            bail!("a value of {len} bytes is cut short");
        }
        body = &body[len + 1..];
        out.push(Some(len));
    }
    Ok(out)
}

/// A floor: RocksDB's in-process `multi_get` of the same keys, in a
/// database of its own opened with some options.
struct FloorKind {
    subject: &'static str,
    /// The metric of depot's times over this floor's.
    ratio: &'static str,
    options: fn() -> rocksdb::Options,
}

/// RocksDB with its default options, which the target names, and with the
/// options of depot's catalog.
const FLOORS: [FloorKind; 2] = [
    FloorKind { subject: "rocksdb multi_get", ratio: RATIO, options: default_options },
    FloorKind {
        subject: "rocksdb multi_get, depot's options",
        ratio: "× multi_get, depot's options",
        options: crate::catalog::rocks::lookup_options,
    },
];

fn default_options() -> rocksdb::Options {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    opts
}

struct Floor {
    kind: &'static FloorKind,
    dir: std::path::PathBuf,
    db: std::sync::Mutex<Option<rocksdb::DB>>,
}

impl Floor {
    /// Loads every key into a fresh database at `dir`.
    fn load(kind: &'static FloorKind, dir: &std::path::Path, scale: Scale) -> anyhow::Result<Floor> {
        let _ = std::fs::remove_dir_all(dir);
        let db = kind.open(dir)?;
        for first in (0..scale.keys).step_by(LOAD_BATCH) {
            let mut batch = rocksdb::WriteBatch::default();
            for i in first..(first + LOAD_BATCH).min(scale.keys) {
                batch.put(key(i), value(i));
            }
            db.write(batch)?;
        }
        db.flush()?;
        Ok(Floor { kind, dir: dir.to_path_buf(), db: std::sync::Mutex::new(Some(db)) })
    }

    /// Times one `multi_get` of `keys` in milliseconds, checking every
    /// value; `cold` first closes the database, drops the page cache and
    /// opens it again.
    fn get(&self, keys: &[usize], cold: bool) -> anyhow::Result<f64> {
        let mut db = self.db.lock().map_err(|_| anyhow::anyhow!("the floor's lock is poisoned"))?;
        if cold || db.is_none() {
            *db = None;
            if cold {
                drop_caches().map_err(anyhow::Error::msg)?;
            }
            *db = Some(self.kind.open(&self.dir)?);
        }
        let db = db.as_ref().context("the floor is open")?;
        let names: Vec<String> = keys.iter().map(|i| key(*i)).collect();
        let started = Instant::now();
        let values = db.multi_get(&names);
        let elapsed = started.elapsed();
        for (i, v) in keys.iter().zip(values) {
            if v?.map(|v| v.len()) != Some(value(*i).len()) {
                bail!("{} lost {}", self.kind.subject, key(*i));
            }
        }
        Ok(ms(elapsed))
    }

    async fn get_blocking(self: &Arc<Self>, keys: Vec<usize>, cold: bool) -> anyhow::Result<f64> {
        let floor = self.clone();
        tokio::task::spawn_blocking(move || floor.get(&keys, cold)).await?
    }

    /// Every batch size timed warm, then cold, with no server beside it.
    fn alone(&self, sets: &KeySets, cold: Result<(), String>) -> anyhow::Result<Timings> {
        let mut warm = Vec::new();
        for rounds in &sets.sets {
            for keys in sets.all_in_batches() {
                self.get(&keys, false)?;
            }
            let mut times = Vec::new();
            for (r, keys) in rounds.iter().enumerate() {
                let t = self.get(keys, false)?;
                if r > 0 {
                    times.push(t);
                }
            }
            warm.push(times);
        }
        let cold = match cold {
            Err(why) => Err(why),
            Ok(()) => sets
                .sets
                .iter()
                .map(|rounds| rounds[1..].iter().map(|keys| self.get(keys, true)).collect())
                .collect::<anyhow::Result<_>>()
                .map_err(|e| format!("{e:#}")),
        };
        Ok(Timings { warm, cold })
    }
}

impl FloorKind {
    fn open(&self, dir: &std::path::Path) -> anyhow::Result<rocksdb::DB> {
        rocksdb::DB::open(&(self.options)(), dir).with_context(|| format!("opening the database of {}", self.subject))
    }
}

impl Timings {
    /// No runs yet, for `sizes` batch sizes.
    fn empty(sizes: usize) -> Timings {
        Timings { warm: vec![Vec::new(); sizes], cold: Ok(vec![Vec::new(); sizes]) }
    }

    /// Adds the runs of `other`, size by size.
    fn add(&mut self, other: &Timings) {
        let extend_each = |mine: &mut Vec<Vec<f64>>, theirs: &[Vec<f64>]| {
            mine.iter_mut().zip(theirs).for_each(|(m, t)| m.extend(t));
        };
        extend_each(&mut self.warm, &other.warm);
        match (&mut self.cold, &other.cold) {
            (Ok(mine), Ok(theirs)) => extend_each(mine, theirs),
            (Ok(_), Err(why)) => self.cold = Err(why.clone()),
            (Err(_), _) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_pass_reads_every_key_once_in_batches_no_larger_than_the_largest() {
        let sets = KeySets::new(Scale { keys: 2_500, largest_batch: 1000, rounds: 1 });
        let batches = sets.all_in_batches();
        assert!(batches.iter().all(|b| !b.is_empty() && b.len() <= 1000), "{:?}", batches.iter().map(Vec::len));
        let keys: Vec<usize> = batches.concat();
        assert_eq!(keys, (0..2_500).collect::<Vec<_>>());
    }

    #[test]
    fn values_are_fifty_bytes_give_or_take_five_and_stable() {
        for i in 0..1000 {
            let v = value(i);
            assert!((45..=55).contains(&v.len()), "{}", v.len());
            assert!(!v.contains(&b'\n'));
        }
        assert_eq!(value(42), value(42));
        assert_ne!(value(1), value(2));
    }

    #[test]
    fn batch_answers_are_parsed() {
        assert_eq!(batch_lengths(b"5\nfirst\n-1\n6\nsecond\n").unwrap(), vec![Some(5), None, Some(6)]);
        assert_eq!(batch_lengths(b"").unwrap(), vec![]);
        assert!(batch_lengths(b"9\nshort\n").is_err());
        assert!(batch_lengths(b"x\n").is_err());
    }

    #[tokio::test]
    async fn a_failing_floor_drops_the_pair_and_is_asked_no_more() {
        let dir = tempfile::tempdir().unwrap();
        let floor =
            Arc::new(Floor::load(&FLOORS[0], dir.path(), Scale { keys: 10, largest_batch: 10, rounds: 1 }).unwrap());
        let mut beside = Beside::new(&floor, 1);
        assert!(beside.get(vec![1, 2], false).await.is_some());
        assert!(beside.get(vec![10], false).await.is_none(), "a key never stored");
        assert!(beside.get(vec![1], false).await.is_none(), "asked again after failing");
        match beside.finish() {
            Err(why) => assert!(why.contains("lost"), "{why}"),
            Ok(_) => panic!("the floor's failure is not reported"),
        }
    }

    /// Both floors hold every key, and the second is opened with the
    /// catalog's options (RocksDB records them in the database's options
    /// file).
    #[test]
    fn each_floor_answers_with_its_own_options() {
        let scale = Scale { keys: 100, largest_batch: 100, rounds: 1 };
        for (kind, mapped) in FLOORS.iter().zip([false, true]) {
            let dir = tempfile::tempdir().unwrap();
            let floor = Floor::load(kind, dir.path(), scale).unwrap();
            assert!(floor.get(&(0..100).collect::<Vec<_>>(), false).is_ok(), "{}", kind.subject);
            let options: String = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("OPTIONS-"))
                .map(|p| std::fs::read_to_string(p).unwrap())
                .collect();
            assert!(options.contains(&format!("allow_mmap_reads={mapped}")), "{}: {options}", kind.subject);
        }
    }

    #[test]
    fn key_sets_are_distinct_and_sized() {
        let sets = KeySets::new(Scale { keys: 20_000, largest_batch: 10_000, rounds: 3 });
        assert_eq!(sets.sizes.iter().map(|s| s.0).collect::<Vec<_>>(), vec![50, 300, 1000, 10_000]);
        for (rounds, (n, _)) in sets.sets.iter().zip(&sets.sizes) {
            assert_eq!(rounds.len(), 4);
            let mut keys = rounds[0].clone();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), *n);
        }
    }
}
