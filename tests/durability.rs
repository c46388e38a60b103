//! Durability and resource promises, checked against the real binary
//! (crashes under load are tests/crash.rs): interrupted uploads leave nothing,
//! garbage collection honours its grace period, memory stays bounded while
//! streaming large bodies.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Server, Tmpfs, client, depot, files_under, pattern, sha256_hex, sqlite_count};
use futures::StreamExt;

fn generated_body(len: u64, seed: u64) -> reqwest::Body {
    let chunk = 1 << 20;
    let chunks = len.div_ceil(chunk);
    let stream = futures::stream::iter(0..chunks).map(move |i| {
        let n = chunk.min(len - i * chunk) as usize;
        Ok::<_, std::io::Error>(bytes::Bytes::from(pattern(n, seed + i)))
    });
    reqwest::Body::wrap_stream(stream)
}

fn generated_sha(len: u64, seed: u64) -> String {
    use sha2::Digest;
    let chunk = 1u64 << 20;
    let mut h = sha2::Sha256::new();
    for i in 0..len.div_ceil(chunk) {
        h.update(pattern(chunk.min(len - i * chunk) as usize, seed + i));
    }
    hex::encode(h.finalize())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_bodies_stream_in_bounded_memory() {
    const LEN: u64 = 384 << 20;
    const LIMIT: u64 = 100 << 20;
    let server = Server::start(&[]);
    let http = client();
    let url = server.object_url("files", "big.bin");
    let r = http.put(&url).header("content-length", LEN).body(generated_body(LEN, 7)).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let json: serde_json::Value = r.json().await.unwrap();
    assert_eq!(json["sha256"], generated_sha(LEN, 7));
    let after_upload = server.peak_rss();
    let mut body = http.get(&url).send().await.unwrap().bytes_stream();
    let mut h = <sha2::Sha256 as sha2::Digest>::new();
    let mut got = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        got += chunk.len() as u64;
        sha2::Digest::update(&mut h, &chunk);
    }
    assert_eq!(got, LEN);
    assert_eq!(hex::encode(sha2::Digest::finalize(h)), json["sha256"]);
    let peak = server.peak_rss();
    eprintln!(
        "peak RSS after a {} MiB upload: {} MiB; after download: {} MiB",
        LEN >> 20,
        after_upload >> 20,
        peak >> 20
    );
    assert!(peak < LIMIT, "peak RSS {} MiB is over {} MiB", peak >> 20, LIMIT >> 20);
}

/// Sends a request head and part of its body, then vanishes.
fn abandon_upload(addr: &str, key: &str, declared: usize, sent: usize) {
    let mut s = TcpStream::connect(addr).unwrap();
    let head = format!("PUT /files/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {declared}\r\n\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(&pattern(sent, 3)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(s);
}

async fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_disconnects_mid_upload_leaves_nothing() {
    for engine in ["fs", "hybrid", "rocksdb", "sqlite"] {
        let server = Server::start(&["--engine", engine]);
        let before = files_under(&server.data).len();
        abandon_upload(&server.addr, "gone.bin", 10 << 20, 3 << 20);
        let r = client().get(server.object_url("files", "gone.bin")).send().await.unwrap();
        assert_eq!(r.status(), 404, "{engine}: a cut-off upload became an object");
        let engine_dir = server.data.join(engine);
        let staged = || {
            if engine == "sqlite" {
                return sqlite_count(&engine_dir.join("blobs.sqlite"), "SELECT count(*) FROM chunks") > 0;
            }
            files_under(&engine_dir)
                .iter()
                .any(|p| p.strip_prefix(&engine_dir).unwrap().to_string_lossy().contains("tmp/"))
        };
        wait_for(|| !staged(), "staging removed").await;
        let stats = client().get(format!("{}/_/metrics", server.url)).send().await.unwrap().text().await.unwrap();
        assert!(stats.contains("depot_blobs 0\n"), "{engine}: a blob was registered:\n{stats}");
        assert!(files_under(&server.data).len() <= before + 8, "{engine}: stray files after an abandoned upload");
        server.assert_no_panic();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gc_removes_unreferenced_blobs_only_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    let body = pattern(500_000, 11);
    let sha = sha256_hex(&body);
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    let http = client();
    http.put(server.object_url("files", "a")).body(body.clone()).send().await.unwrap();
    http.put(server.object_url("files", "b")).body(body.clone()).send().await.unwrap();
    http.delete(server.object_url("files", "a")).send().await.unwrap();
    http.delete(server.object_url("files", "b")).send().await.unwrap();
    assert!(server.stop().success(), "SIGTERM ends the server cleanly");
    let blob = data.join("fs/blobs").join(&sha[..2]).join(&sha[2..4]).join(&sha);
    assert!(blob.is_file());

    let gc = |grace: &str| {
        let out = depot(&["gc", "--data", data_arg, "--engine", "fs", "--gc-grace", grace]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(gc("3600").contains("removed 0 unreferenced blob(s) and 0 orphan(s)"));
    assert!(blob.is_file(), "a blob inside its grace period was removed");

    // An orphan: bytes no record points at, as a crash between the blob's
    // rename and the catalog commit leaves them.
    let orphan_bytes = pattern(1234, 12);
    let orphan_sha = sha256_hex(&orphan_bytes);
    let orphan = data.join("fs/blobs").join(&orphan_sha[..2]).join(&orphan_sha[2..4]);
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join(&orphan_sha), &orphan_bytes).unwrap();

    let said = gc("0");
    assert!(said.contains("removed 1 unreferenced blob(s) and 1 orphan(s)"), "{said}");
    assert!(!blob.exists() && !orphan.join(&orphan_sha).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn background_gc_runs_on_its_own() {
    let server = Server::start(&["--gc-grace", "0", "--gc-interval", "1"]);
    let http = client();
    let r = http.put(server.object_url("files", "x")).body(pattern(1000, 5)).send().await.unwrap();
    let sha = r.json::<serde_json::Value>().await.unwrap()["sha256"].as_str().unwrap().to_string();
    let blob_url = format!("{}/_/blobs/{sha}", server.url);
    assert_eq!(http.get(&blob_url).send().await.unwrap().status(), 200);
    http.delete(server.object_url("files", "x")).send().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if http.get(&blob_url).send().await.unwrap().status() == 404 {
            break;
        }
        assert!(Instant::now() < deadline, "the background pass never collected the blob");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_data_directory_keeps_its_engine_once_it_holds_something() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let serve = |engine: &str| {
        depot(&["serve", "--data", data.to_str().unwrap(), "--engine", engine, "--listen", "127.0.0.1:0"])
    };
    // A first start that fails (the postgres engine needs a server) leaves
    // an empty store, which another engine may take.
    let failed = serve("postgres");
    assert!(!failed.status.success());
    let mut first = Server::start_in(&data, &["--engine", "fs"]);
    first.stop();
    let mut first = Server::start_in(&data, &["--engine", "hybrid"]);
    let r = client().put(first.object_url("files", "k")).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201);
    first.stop();
    let out = serve("fs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("holds a store of the hybrid engine"), "{err}");
    let out = serve("sqlite");
    assert!(!out.status.success());
    assert!(!data.join("sqlite").exists(), "the refused engine's directory was made");
    let again = Server::start_in(&data, &["--engine", "hybrid"]);
    let r = client().get(again.object_url("files", "k")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "kept");
}

/// The memory engine keeps nothing, its catalog included: after a restart
/// no object is listed whose bytes are gone.
#[tokio::test]
async fn the_memory_engine_forgets_everything_at_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut first = Server::start_in(&data, &["--engine", "memory"]);
    let r = client().put(first.object_url("files", "k")).body("gone").send().await.unwrap();
    assert_eq!(r.status(), 201);
    first.stop();
    let again = Server::start_in(&data, &["--engine", "memory"]);
    let r = client().get(again.object_url("files", "k")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let listing = client().get(format!("{}/files/?format=json", again.url)).send().await.unwrap();
    assert!(!listing.text().await.unwrap().contains("\"k\""));
}

/// Filling the device answers 507 (or, once the catalog cannot write its
/// log, 503), never a bare 500, and every acknowledged object reads back.
/// No space is kept free here: the device fills to its last byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_device_is_507_and_keeps_what_was_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_device) = Tmpfs::mount(dir.path(), "24m") else {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    };
    let server = Server::start_in(&dir.path().join("data"), &["--min-free-space", "0"]);
    let http = client();
    let (mut stored, mut refused) = (Vec::new(), Vec::new());
    for i in 0..2000u64 {
        // Small ones go to RocksDB, large ones to files.
        let len = if i % 2 == 0 { 60_000 } else { 700_000 };
        let sent = http.put(server.object_url("files", &format!("k{i}"))).body(pattern(len, i)).send().await;
        // A refusal that comes while the client still sends closes the
        // connection (the rest of the body is not read), and the reset can
        // overtake the answer: counted as 0, a refusal whose status was lost.
        match sent.map(|r| r.status().as_u16()) {
            Ok(200 | 201) => stored.push((i, len)),
            Ok(status) => refused.push(status),
            Err(e) if e.is_request() => refused.push(0),
            Err(e) => panic!("k{i}: {e}"),
        }
        if refused.len() >= 20 {
            break;
        }
    }
    assert!(!stored.is_empty() && refused.len() >= 20, "the device filled: {} stored", stored.len());
    assert!(refused.iter().all(|s| [0, 503, 507].contains(s)), "{refused:?}");
    assert_eq!(refused.iter().find(|s| **s != 0), Some(&507), "the first answered refusal: {refused:?}");
    // Read back on new connections: those the refusals closed stay out.
    let http = client();
    for (i, len) in stored {
        let r = http.get(server.object_url("files", &format!("k{i}"))).send().await.unwrap();
        assert_eq!(r.status(), 200, "k{i}");
        assert!(r.bytes().await.unwrap() == pattern(len, i), "k{i} reads back");
    }
    server.assert_no_panic();
}

/// With space kept free, a device nearly full refuses uploads with 507 and
/// says why, while deletes go on; once the collector has freed their
/// bytes, uploads are accepted again, and the server starts again. A disk
/// filled to its last byte would stop the catalog from recording deletes,
/// and from starting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nearly_full_device_refuses_uploads_and_deletes_free_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(_device) = Tmpfs::mount(dir.path(), "128m") else {
        eprintln!("skipped: cannot mount a tmpfs here");
        return;
    };
    let data = dir.path().join("data");
    let args = ["--min-free-space", "67108864", "--gc-grace", "0", "--gc-interval", "1"];
    let mut server = Server::start_in(&data, &args);
    let http = client();
    let put = |i: u64| http.put(server.object_url("files", &format!("k{i}"))).body(pattern(700_000, i)).send();
    let mut stored = Vec::new();
    let refusal = loop {
        let r = put(stored.len() as u64).await.unwrap();
        match r.status().as_u16() {
            201 => stored.push(stored.len() as u64),
            _ => break r,
        }
        assert!(stored.len() < 200, "never refused");
    };
    assert_eq!(refusal.status(), 507);
    let message = refusal.text().await.unwrap();
    assert!(message.contains("--min-free-space"), "{message}");
    assert!(stored.len() >= 40, "refused after {} uploads", stored.len());
    for i in &stored[..stored.len() / 2] {
        let r = http.delete(server.object_url("files", &format!("k{i}"))).send().await.unwrap();
        assert_eq!(r.status(), 204, "k{i}");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match put(1000).await.unwrap().status().as_u16() {
            201 => break,
            507 if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(200)).await,
            status => panic!("an upload after the deletes: {status}"),
        }
    }
    server.stop();
    let server = Server::start_in(&data, &args);
    for i in &stored[stored.len() / 2..] {
        let r = client().get(server.object_url("files", &format!("k{i}"))).send().await.unwrap();
        assert!(r.bytes().await.unwrap() == pattern(700_000, *i), "k{i} reads back");
    }
    server.assert_no_panic();
}
