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
    server.stop();

    // Four distinct blobs; two per run.
    let said = ok(&migrate(&data, &["--to-engine", "sqlite", "--max-blobs", "2"]));
    assert!(said.contains("copied 2 blobs") && said.contains("2 blobs left"), "{said}");
    // Between slices the store still serves from the old engine.
    let mut server = Server::start_in(&data, &[]);
    check(&server).await;
    server.stop();
    let other = migrate(&data, &["--to-engine", "fs"]);
    assert!(!other.status.success(), "one migration at a time");

    let said = ok(&migrate(&data, &["--to-engine", "sqlite"]));
    assert!(said.contains("copied 2 blobs") && said.contains("2 were there already"), "{said}");
    assert!(said.contains("now lives in the sqlite engine"), "{said}");
    assert!(!data.join("MIGRATING").exists() && !data.join("migrate.journal").exists());
    let large = sha256_hex(&objects()[1].1);
    assert!(
        !files_under(&data.join("hybrid")).iter().any(|p| p.to_string_lossy().contains(&large)),
        "the old engine's copy is gone"
    );

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

    ok(&migrate(&data, &["--engine", "fs", "--to-engine", "rocksdb", "--cancel"]));
    assert!(!data.join("MIGRATING").exists());
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    let resp = reqwest::get(server.object_url("files", "small.txt")).await.unwrap();
    assert_eq!(resp.text().await.unwrap(), "a small object");
    server.stop();
}
