//! Random operation sequences against a model, with faults injected into
//! both the engine and the catalog: the store never disagrees with the
//! model on what it acknowledged.
//!
//! What a failed operation may leave:
//! - a failure that does not say the change was applied leaves the old
//!   value (a put, copy, batch or delete that failed changed nothing);
//! - a catalog failure reported *after the commit* (a connection lost after
//!   `COMMIT`, a WAL sync that failed after the write) is ambiguous: the key
//!   holds the old value or the new one, and the next successful read
//!   settles which;
//! - after a failed sync every write is refused (`WritesDisabled`), gc
//!   included, until the store is reopened on the same data (a restart).
//!
//! Once faults are off and the store reopened, every key reads back as the
//! model says, a listing shows exactly the model's keys, and after a
//! collection every blob's reference count equals the parts that name it,
//! every referenced blob's bytes are there and the engine holds nothing
//! else. `PROPTEST_CASES` sets the number of cases (64 by default).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use proptest::prelude::*;

use super::{PutOptions, Store, StoreConfig, StoreError};
use crate::catalog::faulty::{CatalogFaults, FaultyCatalog};
use crate::catalog::rocks::RocksCatalog;
use crate::catalog::{Catalog, ListQuery, Precondition};
use crate::engine::faulty::{EngineFaults, FaultyEngine, Trigger};
use crate::engine::{self, ByteRange, EngineConfig, EngineKind};

const BUCKET: &str = "files";
/// Largest blob the hybrid engine keeps in RocksDB, in these tests.
const INLINE: u64 = 1024;
/// Bytes per chunk of a request body.
const CHUNK: usize = 700;

#[derive(Clone, Debug)]
enum Op {
    Put { key: u8, body: Body },
    Copy { from: u8, to: u8 },
    Delete { key: u8 },
    Batch(Vec<(u8, Body)>),
    Get { key: u8 },
    List,
    Gc,
    Restart,
}

/// A body: its length and which of a few contents (so bodies repeat, and
/// dedup happens).
#[derive(Clone, Copy, Debug)]
struct Body {
    len: usize,
    seed: u8,
}

impl Body {
    fn bytes(self) -> Vec<u8> {
        (0..self.len).map(|i| (i as u64).wrapping_mul(31).wrapping_add(self.seed as u64 * 101) as u8).collect()
    }
}

#[derive(Clone, Debug)]
struct Plan {
    engine: EngineKind,
    engine_reads: Trigger,
    engine_writes: Trigger,
    engine_syncs: Trigger,
    catalog_reads: Trigger,
    catalog_commits: Trigger,
    ambiguous: bool,
    seed: u64,
}

fn key_name(k: u8) -> String {
    format!("dir/k{k}")
}

fn body() -> impl Strategy<Value = Body> {
    let len = prop_oneof![0..64usize, INLINE as usize - 8..INLINE as usize + 8, INLINE as usize + 1..6 * CHUNK + 1,];
    (len, 0u8..3).prop_map(|(len, seed)| Body { len, seed })
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..6;
    prop_oneof![
        4 => (key.clone(), body()).prop_map(|(key, body)| Op::Put { key, body }),
        2 => (key.clone(), key.clone()).prop_map(|(from, to)| Op::Copy { from, to }),
        2 => key.clone().prop_map(|key| Op::Delete { key }),
        2 => prop::collection::vec((key.clone(), body()), 1..4).prop_map(Op::Batch),
        3 => key.prop_map(|key| Op::Get { key }),
        1 => Just(Op::List),
        1 => Just(Op::Gc),
        1 => Just(Op::Restart),
    ]
}

fn trigger() -> impl Strategy<Value = Trigger> {
    prop_oneof![
        2 => Just(Trigger::Never),
        4 => (0.0..0.3f64).prop_map(Trigger::Chance),
        1 => (0u64..60).prop_map(Trigger::After),
    ]
}

fn plan() -> impl Strategy<Value = Plan> {
    let engine = prop_oneof![Just(EngineKind::Hybrid), Just(EngineKind::Fs), Just(EngineKind::Sqlite)];
    (engine, trigger(), trigger(), trigger(), trigger(), trigger(), any::<bool>(), any::<u64>()).prop_map(
        |(engine, engine_reads, engine_writes, engine_syncs, catalog_reads, catalog_commits, ambiguous, seed)| Plan {
            engine,
            engine_reads,
            engine_writes,
            engine_syncs,
            catalog_reads,
            catalog_commits,
            ambiguous,
            seed,
        },
    )
}

/// What a key may hold: every value the store might show (`None`: absent).
/// One possibility once settled, more after an ambiguous failure.
#[derive(Default)]
struct Model {
    keys: BTreeMap<String, Vec<Option<Vec<u8>>>>,
}

impl Model {
    fn possible(&self, key: &str) -> Vec<Option<Vec<u8>>> {
        self.keys.get(key).cloned().unwrap_or_else(|| vec![None])
    }

    fn settle(&mut self, key: &str, value: Option<Vec<u8>>) {
        self.keys.insert(key.to_string(), vec![value]);
    }

    fn widen(&mut self, key: &str, value: Option<Vec<u8>>) {
        let mut possible = self.possible(key);
        if !possible.contains(&value) {
            possible.push(value);
        }
        self.keys.insert(key.to_string(), possible);
    }

    /// Checks an observed value against the model, then settles on it.
    fn observe(&mut self, key: &str, value: Option<Vec<u8>>, context: &str) {
        let possible = self.possible(key);
        assert!(
            possible.contains(&value),
            "{context}: {key} reads as {:?}, the model allows {:?}",
            value.as_ref().map(Vec::len),
            possible.iter().map(|v| v.as_ref().map(Vec::len)).collect::<Vec<_>>()
        );
        self.settle(key, value);
    }
}

/// A failure the injector reported as applied: the change may have landed.
fn ambiguous(e: &StoreError) -> bool {
    e.to_string().contains("after the commit")
}

fn writes_disabled(r: &Result<impl std::fmt::Debug, StoreError>) -> bool {
    matches!(r, Err(StoreError::WritesDisabled(_)))
}

fn stream(bytes: &[u8]) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + Unpin + use<> {
    let chunks: Vec<_> = bytes.chunks(CHUNK).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    futures::stream::iter(chunks)
}

/// What a write did, as far as the model is concerned.
#[derive(Clone, Copy)]
enum Outcome {
    /// Acknowledged: the new value.
    Done,
    /// Failed after the commit: the old value or the new one.
    Maybe,
    /// Failed: the old value.
    Nothing,
}

/// A store over a RocksDB catalog and an engine of `kind` under `root`, both
/// wrapped in fault injectors (all off), seeded with `seed`. Waits for a
/// previous store on the same files to let them go.
pub(crate) async fn open_faulty(
    root: &std::path::Path,
    kind: EngineKind,
    seed: u64,
    config: StoreConfig,
) -> (Store, Arc<EngineFaults>, Arc<CatalogFaults>) {
    let engine_config = EngineConfig { inline_threshold: INLINE, chunk_size: Some(1000), ..EngineConfig::default() };
    let mut tries = 0;
    let (catalog, engine) = loop {
        let opened = match RocksCatalog::open(&root.join("catalog")) {
            Ok(c) => engine::open(kind, &root.join("engine"), &engine_config).await.map(|e| (c, e)).ok(),
            Err(_) => None,
        };
        if let Some(opened) = opened {
            break opened;
        }
        tries += 1;
        assert!(tries < 200, "the store's files stayed locked after it was dropped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let engine = Arc::new(FaultyEngine::new(engine, seed));
    let catalog = Arc::new(FaultyCatalog::new(Arc::new(catalog) as Arc<dyn Catalog>, seed));
    let (ef, cf) = (engine.faults.clone(), catalog.faults.clone());
    (Store::open(catalog, engine, config).await.expect("opening the store without faults"), ef, cf)
}

struct Harness {
    dir: tempfile::TempDir,
    plan: Plan,
    store: Option<Store>,
    engine_faults: Option<Arc<EngineFaults>>,
    catalog_faults: Option<Arc<CatalogFaults>>,
    opened: u64,
    /// A failed sync was reported: writes are refused until reopened.
    poisoned: bool,
}

impl Harness {
    fn store(&self) -> &Store {
        self.store.as_ref().expect("the store is open")
    }

    /// Opens the store on the harness's directory, faults on as planned or
    /// off. Opening waits for the previous instance's files to be let go.
    async fn open(&mut self, faults: bool) {
        self.store = None;
        self.opened += 1;
        let seed = self.plan.seed.wrapping_add(self.opened.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let config = StoreConfig {
            gc_grace: Duration::ZERO,
            upload_expiry: Duration::from_secs(3600),
            ..StoreConfig::default()
        };
        let (store, ef, cf) = open_faulty(self.dir.path(), self.plan.engine, seed, config).await;
        self.store = Some(store);
        if faults {
            let p = &self.plan;
            ef.reads.set(p.engine_reads);
            ef.writes.set(p.engine_writes);
            ef.syncs.set(p.engine_syncs);
            cf.reads.set(p.catalog_reads);
            cf.commits.set(p.catalog_commits);
            cf.ambiguous.store(p.ambiguous, std::sync::atomic::Ordering::SeqCst);
        }
        self.engine_faults = Some(ef);
        self.catalog_faults = Some(cf);
        self.poisoned = false;
    }

    /// Notes a failed sync: from now on every write must be refused.
    fn note<T: std::fmt::Debug>(&mut self, r: &Result<T, StoreError>) {
        if writes_disabled(r) {
            self.poisoned = true;
        }
    }

    /// A key's whole body, `None` if absent; `Err` when a fault got in the way.
    async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let record = match self.store().head(BUCKET, key).await {
            Ok(r) => r,
            Err(StoreError::NoSuchKey(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let body: Vec<Bytes> = self.store().read(&record, ByteRange::full(record.size)).await?.try_collect().await?;
        let body = body.concat();
        assert_eq!(body.len() as u64, record.size, "{key}: a read that succeeded is short");
        Ok(Some(body))
    }

    async fn apply(&mut self, op: &Op, model: &mut Model) {
        let was_poisoned = self.poisoned;
        let context = format!("{op:?}");
        match op {
            Op::Put { key, body } => {
                let (key, bytes) = (key_name(*key), body.bytes());
                let opts = PutOptions { content_length: Some(bytes.len() as u64), ..PutOptions::default() };
                let r = self.store().put(BUCKET, &key, stream(&bytes), opts).await;
                match self.outcome(was_poisoned, &r, &context) {
                    Outcome::Done => model.settle(&key, Some(bytes)),
                    Outcome::Maybe => model.widen(&key, Some(bytes)),
                    Outcome::Nothing => {}
                }
            }
            Op::Copy { from, to } => {
                let (from, to) = (key_name(*from), key_name(*to));
                let source = match self.store().head(BUCKET, &from).await {
                    Ok(r) => r,
                    Err(StoreError::NoSuchKey(_)) => return model.observe(&from, None, &context),
                    Err(_) => return,
                };
                let value = model
                    .possible(&from)
                    .into_iter()
                    .flatten()
                    .find(|v| crate::engine::Digest(crate::engine::sha2_digest(v)) == source.sha256);
                let value = value.unwrap_or_else(|| panic!("{context}: {from} has a body the model never held"));
                model.settle(&from, Some(value.clone()));
                let r = self.store().copy(&source, BUCKET, &to, None, Precondition::default()).await;
                match self.outcome(was_poisoned, &r, &context) {
                    Outcome::Done => model.settle(&to, Some(value)),
                    Outcome::Maybe => model.widen(&to, Some(value)),
                    Outcome::Nothing => {}
                }
            }
            Op::Delete { key } => {
                let key = key_name(*key);
                let r = self.store().delete(BUCKET, &key, &Precondition::default()).await;
                if let Err(StoreError::NoSuchKey(_)) = r {
                    assert!(!was_poisoned, "{context}: a delete went through with writes disabled");
                    return model.observe(&key, None, &context);
                }
                match self.outcome(was_poisoned, &r, &context) {
                    Outcome::Done => model.settle(&key, None),
                    Outcome::Maybe => model.widen(&key, None),
                    Outcome::Nothing => {}
                }
            }
            Op::Batch(entries) => {
                // One entry per key: the last one given.
                let mut unique: BTreeMap<String, Vec<u8>> = BTreeMap::new();
                for (key, body) in entries {
                    unique.insert(key_name(*key), body.bytes());
                }
                let r = self.batch(&unique).await;
                let outcome = self.outcome(was_poisoned, &r, &context);
                for (key, value) in unique {
                    match outcome {
                        Outcome::Done => model.settle(&key, Some(value)),
                        Outcome::Maybe => model.widen(&key, Some(value)),
                        Outcome::Nothing => {}
                    }
                }
            }
            Op::Get { key } => {
                let key = key_name(*key);
                if let Ok(value) = self.get(&key).await {
                    model.observe(&key, value, &context);
                }
            }
            Op::List => {
                let query = ListQuery { limit: 1000, ..ListQuery::default() };
                if let Ok(page) = self.store().list(BUCKET, &query).await {
                    assert!(page.next.is_none());
                    for object in &page.objects {
                        let possible = model.possible(&object.key);
                        assert!(
                            possible.iter().flatten().any(|v| v.len() as u64 == object.size),
                            "{context}: {} is listed with {} bytes, the model allows {possible:?}",
                            object.key,
                            object.size
                        );
                    }
                    for (key, possible) in &model.keys {
                        if possible.iter().all(Option::is_some) {
                            assert!(page.objects.iter().any(|o| &o.key == key), "{context}: {key} is not listed");
                        }
                    }
                }
            }
            Op::Gc => {
                let r = self.store().gc().await;
                if was_poisoned {
                    assert!(writes_disabled(&r), "{context}: gc ran with writes disabled: {r:?}");
                }
            }
            Op::Restart => self.open(true).await,
        }
    }

    async fn batch(&mut self, entries: &BTreeMap<String, Vec<u8>>) -> Result<usize, StoreError> {
        let mut batch = self.store().batch(BUCKET)?;
        for (key, bytes) in entries {
            batch.add(key, bytes.len() as u64, stream(bytes)).await?;
        }
        batch.commit().await
    }

    /// Checks a write's result against the harness's state: how the
    /// model changes.
    fn outcome<T: std::fmt::Debug>(&mut self, was_poisoned: bool, r: &Result<T, StoreError>, context: &str) -> Outcome {
        if was_poisoned {
            assert!(writes_disabled(r), "{context}: a write was not refused after a failed sync: {r:?}");
            return Outcome::Nothing;
        }
        self.note(r);
        match r {
            Ok(_) => Outcome::Done,
            Err(e) if ambiguous(e) => Outcome::Maybe,
            Err(_) => Outcome::Nothing,
        }
    }

    /// With faults off and the store reopened: everything as the model
    /// says, and the reference counts right.
    async fn check_consistent(&mut self, model: &mut Model) {
        self.open(false).await;
        for key in model.keys.keys().cloned().collect::<Vec<_>>() {
            let value = self.get(&key).await.expect("reading without faults");
            model.observe(&key, value, "after reopening");
        }
        let store = self.store();
        let query = ListQuery { limit: 1000, ..ListQuery::default() };
        let listed: Vec<String> =
            store.list(BUCKET, &query).await.unwrap().objects.into_iter().map(|o| o.key).collect();
        let present: Vec<String> = model.keys.iter().filter(|(_, v)| v[0].is_some()).map(|(k, _)| k.clone()).collect();
        assert_eq!(listed, present, "the listing after reopening");

        // Every reference count, every blob's bytes, nothing else in the
        // engine, and the totals: what `depot verify` checks.
        store.gc().await.unwrap();
        let report = store.verify(false, &indicatif::ProgressBar::hidden()).await.unwrap();
        assert_eq!(report.problems, vec![], "verification after gc");
    }
}

async fn run(plan: Plan, ops: Vec<Op>) {
    let mut harness = Harness {
        dir: tempfile::tempdir().unwrap(),
        plan,
        store: None,
        engine_faults: None,
        catalog_faults: None,
        opened: 0,
        poisoned: false,
    };
    harness.open(true).await;
    let mut model = Model::default();
    for op in &ops {
        harness.apply(op, &mut model).await;
    }
    if let (Some(e), Some(c)) = (&harness.engine_faults, &harness.catalog_faults) {
        e.off();
        c.off();
    }
    harness.check_consistent(&mut model).await;
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn the_store_agrees_with_a_model_under_faults(plan in plan(), ops in prop::collection::vec(op(), 1..40)) {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        runtime.block_on(run(plan, ops));
    }
}
