//! `depot migrate` on a real data directory: every object reads back the
//! same from the new engine, a migration done in slices resumes where it
//! stopped, and a blob whose bytes went bad stops the switch.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{BIN, Server, files_under, pattern, sha256_hex};

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
}

#[tokio::test]
async fn a_corrupt_blob_stops_the_switch_and_cancel_undoes_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    fill(&server).await;
    server.stop();
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

/// A copy made by an earlier slice that went bad in the new engine is read
/// back before the switch: the run stops, names it and drops it, and the
/// next run copies it anew; the old engine is never emptied over it.
#[tokio::test]
async fn a_copy_that_went_bad_between_slices_is_copied_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &[]);
    fill(&server).await;
    server.stop();
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
    let mut server = Server::start_in(&data, &[]);
    let http = common::client();
    for i in 0..6u8 {
        let body = pattern(50_000 + usize::from(i), u64::from(i));
        let resp = http.put(server.object_url("files", &format!("k{i}"))).body(body).send().await.unwrap();
        assert!(resp.status().is_success());
    }
    server.stop();
    ok(&migrate(&data, &["--to-engine", "fs", "--max-blobs", "3"]));

    // Five of six blobs go, so at least two of the three copied.
    let mut server = Server::start_in(&data, &["--gc-grace", "0", "--gc-interval", "1"]);
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

    ok(&migrate(&data, &["--to-engine", "fs"]));
    let verify = Command::new(BIN).args(["verify", "--engine", "fs", "--data"]).arg(&data).output().unwrap();
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stdout));
    assert_eq!(files_under(&data.join("fs")).iter().filter(|p| p.is_file()).count(), 1, "one blob, one file");
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
