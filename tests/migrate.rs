//! `depot migrate` on a real data directory: every object reads back the
//! same from the new engine, a migration done in slices resumes where it
//! stopped, and a blob whose bytes went bad stops the switch.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{BIN, Server, files_under, pattern, sha256_hex};
use depot::engine::{BlobEngineExt, DynEngine, EngineConfig, EngineKind, s3};
use futures::StreamExt;
use mongodb::bson::oid::ObjectId;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Binary, Document, doc};
use object_store::{ObjectStore, ObjectStoreExt};

fn migrate(data: &Path, args: &[&str]) -> Output {
    Command::new(BIN).arg("migrate").arg("--data").arg(data).args(args).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "migrate failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn objects() -> Vec<(String, Vec<u8>)> {
    vec![
        ("small.txt".into(), b"a small object".to_vec()),
        ("large.bin".into(), pattern(1_500_000, 1)),
        ("again.bin".into(), pattern(1_500_000, 1)),
        ("empty".into(), Vec::new()),
        ("medium.bin".into(), pattern(200_000, 2)),
    ]
}

async fn fill(server: &Server) {
    let http = common::client();
    for (key, bytes) in objects() {
        let resp = http.put(server.object_url("files", &key)).body(bytes).send().await.unwrap();
        assert!(resp.status().is_success());
    }
}

/// A store in a data directory of its own, filled with [`objects`] by a
/// server started with `args`, which is stopped again.
async fn filled(args: &[&str]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, args);
    fill(&server).await;
    server.stop();
    (dir, data)
}

async fn check(server: &Server) {
    for (key, bytes) in objects() {
        let resp = reqwest::get(server.object_url("files", &key)).await.unwrap();
        assert_eq!(resp.status(), 200, "{key}");
        assert!(resp.bytes().await.unwrap() == bytes, "{key} reads back the same");
    }
}

#[tokio::test]
async fn hybrid_to_sqlite_in_slices() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &[]);
    fill(&server).await;
    let refused = migrate(&data, &["--to-engine", "fs"]);
    assert!(!refused.status.success(), "the server holds the store");
    assert!(!data.join("MIGRATING").exists(), "a refused migration records nothing");
    server.stop();
    let memory = migrate(&data, &["--to-engine", "memory"]);
    let err = String::from_utf8_lossy(&memory.stderr);
    assert!(!memory.status.success() && err.contains("memory engine keeps nothing"), "{err}");
    // A target setting the target engine does not read is refused, not ignored.
    let stray = migrate(&data, &["--to-engine", "sqlite", "--to-s3-bucket", "x"]);
    let err = String::from_utf8_lossy(&stray.stderr);
    assert!(!stray.status.success() && err.contains("--to-s3-bucket is a setting of the s3 engine"), "{err}");
    assert!(!data.join("MIGRATING").exists(), "a refused migration records nothing");

    // Four distinct blobs; two per run.
    let said = ok(&migrate(&data, &["--to-engine", "sqlite", "--max-blobs", "2"]));
    assert!(said.contains("copied 2 blobs") && said.contains("2 blobs left"), "{said}");
    // Between slices the store still serves from the old engine.
    let mut server = Server::start_in(&data, &[]);
    check(&server).await;
    server.stop();
    let other = migrate(&data, &["--to-engine", "fs"]);
    assert!(!other.status.success(), "one migration at a time");

    // A run stopped while it switched the catalog over (here: recorded so
    // before its last slice) leaves a catalog pointing into both engines:
    // nothing opens the store, nothing cancels it, and a run finishes it.
    std::fs::write(data.join("MIGRATING"), "switch hybrid sqlite\n").unwrap();
    let serve = Command::new(BIN).arg("serve").arg("--data").arg(&data).args(["--listen", "127.0.0.1:0"]).output();
    let err = String::from_utf8_lossy(&serve.unwrap().stderr).into_owned();
    assert!(err.contains("stopped while it switched") && err.contains("--to-engine sqlite"), "{err}");
    let cancel = migrate(&data, &["--to-engine", "sqlite", "--cancel"]);
    assert!(!cancel.status.success(), "a switch half done is not undone");

    let said = ok(&migrate(&data, &["--to-engine", "sqlite"]));
    assert!(said.contains("copied 2 blobs") && said.contains("2 were there already"), "{said}");
    assert!(said.contains("now lives in the sqlite engine"), "{said}");
    assert!(!data.join("MIGRATING").exists() && !data.join("migrate.journal").exists());
    assert!(!data.join("hybrid").exists(), "the old engine's files are gone, and their space with them");

    let wrong = Command::new(BIN).arg("serve").arg("--data").arg(&data).args(["--listen", "127.0.0.1:0"]).output();
    let err = String::from_utf8_lossy(&wrong.unwrap().stderr).into_owned();
    assert!(err.contains("start it with --engine sqlite"), "the old engine no longer opens this store: {err}");
    let mut server = Server::start_in(&data, &["--engine", "sqlite"]);
    check(&server).await;
    server.stop();

    // A run killed while it removed the old engine's directory may leave
    // one that no longer opens (here, a log pointing at a lost manifest):
    // the next run removes the rest rather than stopping on it.
    std::fs::create_dir_all(data.join("hybrid/rocksdb")).unwrap();
    std::fs::write(data.join("hybrid/rocksdb/CURRENT"), "MANIFEST-000099\n").unwrap();
    std::fs::write(data.join("MIGRATING"), "cleanup hybrid sqlite\n").unwrap();
    let said = ok(&migrate(&data, &["--to-engine", "sqlite"]));
    assert!(said.contains("now lives in the sqlite engine"), "{said}");
    assert!(!data.join("MIGRATING").exists() && !data.join("hybrid").exists());
    let mut server = Server::start_in(&data, &["--engine", "sqlite"]);
    check(&server).await;
    server.stop();
}

#[tokio::test]
async fn a_corrupt_blob_stops_the_switch_and_cancel_undoes_it() {
    let (_dir, data) = filled(&["--engine", "fs"]).await;
    let large = sha256_hex(&objects()[1].1);
    let blob = files_under(&data.join("fs")).into_iter().find(|p| p.ends_with(&large)).expect("the large blob's file");
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();

    let out = migrate(&data, &["--engine", "fs", "--to-engine", "rocksdb"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(err.contains("could not be copied") && err.contains(&large[..12]), "{said}\n{err}");
    assert_eq!(std::fs::read_to_string(data.join("ENGINE")).unwrap().trim(), "fs", "nothing switched");

    assert!(data.join("rocksdb").exists(), "the copies made before the bad blob");
    ok(&migrate(&data, &["--engine", "fs", "--to-engine", "rocksdb", "--cancel"]));
    assert!(!data.join("MIGRATING").exists());
    assert!(!data.join("rocksdb").exists(), "the abandoned copies are gone");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    let resp = reqwest::get(server.object_url("files", "small.txt")).await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "a small object");
    server.stop();
}

/// Bytes that went missing after nothing referred to them any more (a
/// deleted object's, before the collector's grace period ended) do not
/// stop a migration: their record goes instead, as in a backup.
#[tokio::test]
async fn lost_bytes_of_a_dead_blob_do_not_stop_the_migration() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    fill(&server).await;
    let r = common::client().delete(server.object_url("files", "medium.bin")).send().await.unwrap();
    assert!(r.status().is_success());
    server.stop();
    let medium = sha256_hex(&objects()[4].1);
    let blob = files_under(&data.join("fs")).into_iter().find(|p| p.ends_with(&medium)).expect("the dead blob's file");
    std::fs::remove_file(blob).unwrap();

    let out = migrate(&data, &["--engine", "fs", "--to-engine", "sqlite"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains(&medium[..12]) && err.contains("record removed"), "{err}");
    let verified = Command::new(BIN).args(["verify", "--engine", "sqlite", "--data"]).arg(&data).output().unwrap();
    assert!(verified.status.success(), "{}", String::from_utf8_lossy(&verified.stdout));
}

/// A copy made by an earlier slice that went bad in the new engine is read
/// back before the switch: the run stops, names it and drops it, and the
/// next run copies it anew; the old engine is never emptied over it.
#[tokio::test]
async fn a_copy_that_went_bad_between_slices_is_copied_again() {
    let (_dir, data) = filled(&[]).await;
    let said = ok(&migrate(&data, &["--to-engine", "fs", "--max-blobs", "3"]));
    assert!(said.contains("copied 3 blobs"), "{said}");
    let copy = files_under(&data.join("fs"))
        .into_iter()
        .find(|p| p.file_name().unwrap().len() == 64 && std::fs::metadata(p).unwrap().len() > 0)
        .expect("a copy in the new engine");
    let mut bytes = std::fs::read(&copy).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&copy, bytes).unwrap();

    let out = migrate(&data, &["--to-engine", "fs"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("no longer match"), "{err}");
    let name = copy.file_name().unwrap().to_str().unwrap();
    assert!(err.contains(&name[..12]), "the bad copy is named: {err}");
    assert_eq!(std::fs::read_to_string(data.join("ENGINE")).unwrap().trim(), "hybrid", "nothing switched");
    assert!(data.join("hybrid").exists(), "the old engine is kept");

    let said = ok(&migrate(&data, &["--to-engine", "fs"]));
    assert!(said.contains("copied 1 blobs") && said.contains("now lives in the fs engine"), "{said}");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    check(&server).await;
    server.stop();
    let verify = Command::new(BIN).args(["verify", "--engine", "fs", "--data"]).arg(&data).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
}

/// Blobs collected while the store served between slices leave no copy
/// behind in the new engine: the store verifies clean after the switch.
#[tokio::test]
async fn blobs_collected_between_slices_leave_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    collected_between_slices(&data, "hybrid", "fs", 50_000).await;
    assert_eq!(files_under(&data.join("fs")).iter().filter(|p| p.is_file()).count(), 1, "one blob, one file");
}

/// The same into the `hybrid` engine, whose small copies live in their
/// catalog records: the copy of a collected blob goes with nothing to
/// delete, and the switch ends.
#[tokio::test]
async fn small_blobs_collected_between_slices_leave_no_copy_in_hybrid() {
    let dir = tempfile::tempdir().unwrap();
    collected_between_slices(&dir.path().join("data"), "fs", "hybrid", 1_000).await;
}

/// Stores six blobs of about `size` bytes in `from`, migrates three to
/// `to`, collects five of the six while serving, then finishes the
/// migration and verifies the store.
async fn collected_between_slices(data: &Path, from: &str, to: &str, size: usize) {
    let mut server = Server::start_in(data, &["--engine", from]);
    let http = common::client();
    for i in 0..6u8 {
        let body = pattern(size + usize::from(i), u64::from(i));
        let resp = http.put(server.object_url("files", &format!("k{i}"))).body(body).send().await.unwrap();
        assert!(resp.status().is_success());
    }
    server.stop();
    ok(&migrate(data, &["--engine", from, "--to-engine", to, "--max-blobs", "3"]));

    // Five of six blobs go, so at least two of the three copied.
    let mut server = Server::start_in(data, &["--engine", from, "--gc-grace", "0", "--gc-interval", "1"]);
    for i in 1..6 {
        let resp = http.delete(server.object_url("files", &format!("k{i}"))).send().await.unwrap();
        assert_eq!(resp.status(), 204);
    }
    let stats = format!("{}/_/stats", server.url);
    for _ in 0..100 {
        let s: serde_json::Value = http.get(&stats).send().await.unwrap().json().await.unwrap();
        if s["blobs"] == 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    server.stop();

    ok(&migrate(data, &["--engine", from, "--to-engine", to]));
    let verify = Command::new(BIN).args(["verify", "--engine", to, "--data"]).arg(data).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    let server = Server::start_in(data, &["--engine", to]);
    let kept = http.get(server.object_url("files", "k0")).send().await.unwrap();
    assert_eq!(kept.bytes().await.unwrap(), pattern(size, 0));
}

/// An engine's database that another store's blobs are in is refused as a
/// migration's target and as a new store's engine: each store's collector
/// deletes the blobs its catalog does not know. A cancelled migration
/// removes the copies it made in a server's engine.
#[tokio::test(flavor = "multi_thread")]
async fn an_engine_database_another_store_uses_is_refused() {
    let (taken, free) = (depot::pg::fresh_test_database().await, depot::pg::fresh_test_database().await);
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    let mut first = Server::start_in(&a, &["--engine", "postgres", "--engine-url", &taken]);
    fill(&first).await;
    first.stop();

    let refused = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--engine", "postgres", "--engine-url", &taken, "--data"])
        .arg(&b)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("blob(s) this store does not know"), "{said}");

    let mut other = Server::start_in(&c, &[]);
    fill(&other).await;
    other.stop();
    let refused = migrate(&c, &["--to-engine", "postgres", "--to-engine-url", &taken]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("holds 4 blob(s) already"), "{said}");
    assert!(!c.join("MIGRATING").exists(), "a refused migration is not under way");

    let into_free = ["--to-engine", "postgres", "--to-engine-url", &free];
    assert!(ok(&migrate(&c, &[&into_free[..], &["--max-blobs", "2"]].concat())).contains("copied 2 blobs"));
    ok(&migrate(&c, &[&into_free[..], &["--cancel"]].concat()));
    // Nothing of the store is left in that database: a new store takes it.
    let mut fresh = Server::start_in(&b, &["--engine", "postgres", "--engine-url", &free]);
    fresh.stop();
    let server = Server::start_in(&c, &[]);
    check(&server).await;
}

/// A run resumed with the new engine's settings given for the old one (a
/// configuration updated too early) is refused: its cleanup would empty
/// the store's only copies.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_resumed_with_the_new_engine_as_the_old_is_refused() {
    let (old, new) = (depot::pg::fresh_test_database().await, depot::pg::fresh_test_database().await);
    let (_dir, data) = filled(&["--engine", "postgres", "--engine-url", &old]).await;
    let into = ["--to-engine", "postgres", "--to-engine-url", &new];
    let from = |url: &str| ["--engine".to_string(), "postgres".into(), "--engine-url".into(), url.to_string()];
    let said = ok(&migrate(&data, &[&strings(&from(&old))[..], &into[..], &["--max-blobs", "2"]].concat()));
    assert!(said.contains("2 blobs left"), "{said}");
    // Spelled otherwise too (more spellings in `src/cli/migrate.rs`).
    let with_option = format!("{new}{}connect_timeout=10", if new.contains('?') { '&' } else { '?' });
    for respelled in [&new, &with_option] {
        let refused = migrate(&data, &[&strings(&from(respelled))[..], &into[..]].concat());
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && err.contains("is the one this migration copies into"), "{err}");
    }
    ok(&migrate(&data, &[&strings(&from(&old))[..], &into[..]].concat()));
    let server = Server::start_in(&data, &["--engine", "postgres", "--engine-url", &new]);
    check(&server).await;
}

/// A run killed mid-append leaves a torn last line in the journal: the
/// next run cuts it and copies its blob again, so no blob is switched
/// without its copy (a hybrid engine keeps small blobs in the locator
/// itself, so a lost line lost them).
#[tokio::test]
async fn a_torn_journal_line_is_copied_again() {
    let (_dir, data) = filled(&["--engine", "fs"]).await;
    ok(&migrate(&data, &["--engine", "fs", "--to-engine", "hybrid", "--max-blobs", "1"]));
    let journal = data.join("migrate.journal");
    let line = std::fs::read(&journal).unwrap();
    assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
    // Torn after the digest's 64 hex digits and two of its locator's.
    std::fs::write(&journal, &line[..67]).unwrap();
    ok(&migrate(&data, &["--engine", "fs", "--to-engine", "hybrid"]));
    let server = Server::start_in(&data, &[]);
    check(&server).await;
}

/// A server's engine a migration moves to or from, with the means to look
/// past what the engine lists: rows, documents and objects it staged.
enum Place {
    Postgres(String),
    Gridfs(String),
    S3 { endpoint: String, config: depot::engine::S3Config },
}

impl Place {
    async fn fresh(kind: EngineKind) -> Place {
        match kind {
            EngineKind::Postgres => Place::Postgres(depot::pg::fresh_test_database().await),
            EngineKind::Gridfs => Place::Gridfs(depot::engine::gridfs::fresh_test_url()),
            EngineKind::S3 => {
                let (endpoint, config) = s3::test_server(&s3::fresh_test_bucket().await);
                Place::S3 { endpoint, config }
            }
            other => panic!("{other:?} has no server"),
        }
    }

    fn kind(&self) -> EngineKind {
        match self {
            Place::Postgres(_) => EngineKind::Postgres,
            Place::Gridfs(_) => EngineKind::Gridfs,
            Place::S3 { .. } => EngineKind::S3,
        }
    }

    /// The flags naming it, as the source (`prefix` "") or the target ("to-").
    fn args(&self, prefix: &str) -> Vec<String> {
        let flag = |name: &str| format!("--{prefix}{name}");
        let mut args = vec![flag("engine"), self.kind().name().to_string()];
        match self {
            Place::Postgres(url) | Place::Gridfs(url) => args.extend([flag("engine-url"), url.clone()]),
            Place::S3 { endpoint, config } => args.extend([
                flag("engine-url"),
                endpoint.clone(),
                flag("s3-bucket"),
                config.bucket.clone().unwrap(),
                flag("s3-access-key"),
                config.access_key.clone().unwrap(),
                flag("s3-secret-key"),
                config.secret_key.clone().unwrap(),
            ]),
        }
        args
    }

    async fn engine(&self) -> DynEngine {
        let config = match self {
            Place::Postgres(url) | Place::Gridfs(url) => EngineConfig { url: Some(url.clone()), ..Default::default() },
            Place::S3 { endpoint, config } => {
                EngineConfig { url: Some(endpoint.clone()), s3: config.clone(), ..Default::default() }
            }
        };
        depot::engine::open(self.kind(), Path::new("/nonexistent"), &config).await.unwrap()
    }

    /// Leaves what a writer killed mid-upload leaves behind, just now: the
    /// staged parts of a blob that was never finished.
    async fn stage_unfinished(&self) {
        match self {
            Place::Postgres(url) => {
                let client = pg_client(url).await;
                client
                    .batch_execute(
                        "INSERT INTO depot_engine_pending VALUES (900001, now());
                         INSERT INTO depot_engine_chunks VALUES (900001, 0, 'staged'), (900001, 1, 'parts');",
                    )
                    .await
                    .unwrap();
            }
            Place::Gridfs(url) => {
                let chunks = mongo_db(url).await.collection::<Document>("fs.chunks");
                let file = ObjectId::new();
                let data = |b: &[u8]| Binary { subtype: BinarySubtype::Generic, bytes: b.to_vec() };
                chunks
                    .insert_many([
                        doc! { "files_id": file, "n": 0, "data": data(b"staged") },
                        doc! { "files_id": file, "n": 1, "data": data(b"parts") },
                    ])
                    .await
                    .unwrap();
            }
            Place::S3 { endpoint, config } => {
                let store = s3::builder(Some(endpoint), config).build().unwrap();
                // Named as the engine names them: it leaves others alone.
                let staged = object_store::path::Path::from(format!("tmp/{}", "5a".repeat(16)));
                store.put(&staged, b"staged".to_vec().into()).await.unwrap();
            }
        }
    }

    /// Everything stored: blobs, chunks, pending writes, staged objects.
    async fn leftovers(&self) -> u64 {
        match self {
            Place::Postgres(url) => {
                let client = pg_client(url).await;
                let row = client
                    .query_one(
                        "SELECT (SELECT count(*) FROM depot_engine_blobs) + (SELECT count(*) FROM depot_engine_chunks) \
                         + (SELECT count(*) FROM depot_engine_pending)",
                        &[],
                    )
                    .await
                    .unwrap();
                u64::try_from(row.get::<_, i64>(0)).unwrap()
            }
            Place::Gridfs(url) => {
                let db = mongo_db(url).await;
                let files = db.collection::<Document>("fs.files").count_documents(doc! {}).await.unwrap();
                let chunks = db.collection::<Document>("fs.chunks").count_documents(doc! {}).await.unwrap();
                files + chunks
            }
            Place::S3 { endpoint, config } => {
                let store = s3::builder(Some(endpoint), config).build().unwrap();
                store.list(None).count().await as u64
            }
        }
    }
}

async fn pg_client(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

async fn mongo_db(url: &str) -> mongodb::Database {
    mongodb::Client::with_uri_str(url).await.unwrap().default_database().unwrap()
}

fn journaled(data: &Path) -> usize {
    std::fs::read_to_string(data.join("migrate.journal")).unwrap_or_default().lines().count()
}

fn strings(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// A run killed mid-copy leaves copies in the new engine that it finished
/// but had not journaled yet, and the staged parts of those it was still
/// writing. `--cancel` removes them all, so the migration can start again
/// (it used to delete the journaled copies only, and the next migration was
/// refused for the blobs left).
async fn cancel_leaves_nothing_in(kind: EngineKind) {
    let place = Place::fresh(kind).await;
    let to = place.args("to-");
    let (_dir, data) = filled(&[]).await;
    let said = ok(&migrate(&data, &[&strings(&to)[..], &["--max-blobs", "2"]].concat()));
    assert!(said.contains("copied 2 blobs"), "{said}");

    // The killed run: every blob copied, two of them journaled; and one
    // upload cut short.
    let target = place.engine().await;
    for (_, bytes) in objects() {
        target.put_bytes(bytes.into()).await.unwrap();
    }
    place.stage_unfinished().await;
    assert_eq!(journaled(&data), 2);
    assert_eq!(target.list().await.unwrap().len(), 4, "two copies the journal does not name");

    // Given another database or bucket, `--cancel` (which deletes all it
    // holds) and a run that would go on are both refused.
    let elsewhere = Place::fresh(kind).await.args("to-");
    for extra in [&["--cancel"][..], &[]] {
        let out = migrate(&data, &[&strings(&elsewhere)[..], extra].concat());
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("give the --to-* settings it began with"), "{said}");
    }
    assert_eq!(target.list().await.unwrap().len(), 4, "a refused cancel deleted copies");
    // Bytes of a content the store has no record of are another store's
    // (one of the same name on another server): nothing is deleted.
    let foreign = target.put_bytes(b"another store's".to_vec().into()).await.unwrap();
    let out = migrate(&data, &[&strings(&to)[..], &["--cancel"]].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("which this store has no record of"), "{said}");
    assert_eq!(target.list().await.unwrap().len(), 5, "a refused cancel deleted copies");
    target.delete(&foreign).await.unwrap();
    drop(target);

    let said = ok(&migrate(&data, &[&strings(&to)[..], &["--cancel"]].concat()));
    assert_eq!(place.leftovers().await, 0, "nothing of the cancelled migration is left in the {kind:?} engine");
    assert!(said.contains("removed 4 copies") && said.contains("cancelled"), "{said}");
    assert!(!data.join("MIGRATING").exists() && !data.join("migrate.journal").exists());

    let said = ok(&migrate(&data, &strings(&to)));
    assert!(said.contains("copied 4 blobs") && said.contains("now lives in"), "{said}");
    let mut server = Server::start_in(&data, &strings(&place.args("")));
    check(&server).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_removes_unjournaled_copies_and_staged_parts_from_postgres() {
    cancel_leaves_nothing_in(EngineKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_removes_unjournaled_copies_and_staged_parts_from_gridfs() {
    cancel_leaves_nothing_in(EngineKind::Gridfs).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cancel_removes_unjournaled_copies_and_staged_parts_from_s3() {
    cancel_leaves_nothing_in(EngineKind::S3).await;
}

/// The staged parts of uploads that crashed, or that a migration into this
/// engine lost when interrupted, are younger than the engine's cleanup age,
/// and an engine migrated away from is never opened again to remove them:
/// the migration removes them with the blobs. A run that goes on given
/// another database or bucket is refused.
async fn migrating_away_leaves_nothing_in(kind: EngineKind) {
    let place = Place::fresh(kind).await;
    let from = place.args("");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &strings(&from));
    fill(&server).await;
    server.stop();
    place.stage_unfinished().await;
    let before = place.leftovers().await;
    let blobs = place.engine().await.list().await.unwrap().len() as u64;
    assert!(before > blobs, "staged parts beside the {blobs} blobs: {before}");

    // A run that goes on must be given the old engine's place: the cleanup
    // empties what it names.
    ok(&migrate(&data, &[&strings(&from)[..], &["--to-engine", "fs", "--max-blobs", "1"]].concat()));
    let elsewhere = Place::fresh(kind).await.args("");
    let out = migrate(&data, &[&strings(&elsewhere)[..], &["--to-engine", "fs"]].concat());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("the settings the store had before it"), "{said}");

    let said = ok(&migrate(&data, &[&strings(&from)[..], &["--to-engine", "fs"]].concat()));
    assert!(said.contains("now lives in the fs engine"), "{said}");
    assert_eq!(place.leftovers().await, 0, "nothing is left in the {kind:?} engine migrated away from");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    check(&server).await;
    server.stop();
}

#[tokio::test(flavor = "multi_thread")]
async fn migrating_away_from_postgres_removes_staged_chunks() {
    migrating_away_leaves_nothing_in(EngineKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migrating_away_from_gridfs_removes_orphan_chunks() {
    migrating_away_leaves_nothing_in(EngineKind::Gridfs).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn migrating_away_from_s3_removes_staging_objects() {
    migrating_away_leaves_nothing_in(EngineKind::S3).await;
}

/// Ctrl-C while blobs are copied lets the copies under way finish and
/// journals them: the new engine then holds the journaled copies and
/// nothing else, not even staged chunks, and the run says how to go on. (It
/// used to die mid-copy as from a kill, leaving copies the journal did not
/// name.)
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_stops_a_migration_with_every_copy_journaled() {
    const BLOBS: usize = 400;
    let place = Place::fresh(EngineKind::Postgres).await;
    // Four chunks a blob: each copy stages chunks under a pending row.
    let to = [place.args("to-"), vec!["--to-chunk-size".into(), "16384".into()]].concat();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &[]);
    let http = common::client();
    let puts = futures::stream::iter(0..BLOBS)
        .map(|i| {
            let (http, url) = (&http, server.object_url("files", &format!("k{i}")));
            async move { http.put(url).body(pattern(64 * 1024, i as u64)).send().await.unwrap().status() }
        })
        .buffer_unordered(8);
    assert!(puts.all(|status| async move { status.is_success() }).await);
    server.stop();

    let child = Command::new(BIN)
        .args(["migrate", "--data"])
        .arg(&data)
        .args(&to)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while journaled(&data) == 0 {
        assert!(Instant::now() < deadline, "no copy journaled within a minute");
        std::thread::sleep(Duration::from_millis(5));
    }
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code().is_some(), "Ctrl-C killed the run instead of stopping it: {err}");
    assert!(!out.status.success() && err.contains("interrupted") && err.contains("the same command again"), "{err}");
    let copied = journaled(&data);
    assert!(copied < BLOBS, "the run stopped before the end: {copied}");

    let target = place.engine().await;
    assert_eq!(target.list().await.unwrap().len(), copied, "every copy in the new engine is journaled");
    let Place::Postgres(url) = &place else { unreachable!() };
    let row = pg_client(url).await.query_one("SELECT count(*) FROM depot_engine_pending", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 0, "no copy was left half written");
    drop(target);

    let said = ok(&migrate(&data, &strings(&to)));
    assert!(said.contains(&format!("{copied} were there already")) && said.contains("now lives in"), "{said}");
    let verify = Command::new(BIN).args(["verify", "--data"]).arg(&data).args(place.args("")).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
}
