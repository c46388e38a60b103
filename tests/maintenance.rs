//! `depot verify` and `depot backup` against the real binary: damage is
//! found and named, repairs leave a clean store, and a backup taken while
//! the server takes writes serves every object acknowledged before it.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Server, Tmpfs, client, depot, files_under, pattern, sha256_hex};

fn text(out: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Writes `bytes` where the fs engine of `data` keeps a blob, with no
/// record pointing at them: what a crash between a blob's sync and its
/// record leaves. Returns the file.
fn plant_leftover(data: &std::path::Path, bytes: &[u8]) -> std::path::PathBuf {
    let sha = sha256_hex(bytes);
    let at = data.join("fs/blobs").join(&sha[..2]).join(&sha[2..4]).join(&sha);
    std::fs::create_dir_all(at.parent().unwrap()).unwrap();
    std::fs::write(&at, bytes).unwrap();
    at
}

async fn put(server: &Server, key: &str, body: Vec<u8>) {
    let r = client().put(server.object_url("files", key)).body(body).send().await.unwrap();
    assert!(r.status().is_success(), "{key}: {}", r.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_damaged_blobs_and_repair_removes_orphans() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    let (damaged, lost, kept) = (pattern(50_000, 1), pattern(60_000, 2), pattern(70_000, 3));
    let (cut, grown) = (pattern(80_000, 5), pattern(90_000, 6));
    put(&server, "damaged", damaged.clone()).await;
    put(&server, "lost", lost.clone()).await;
    put(&server, "kept", kept.clone()).await;
    put(&server, "cut", cut.clone()).await;
    put(&server, "grown", grown.clone()).await;
    // A key is the uploader's to choose: one that would act on a terminal.
    let hostile = pattern(40_000, 8);
    put(&server, "esc\u{1b}]0;pwned\u{7}\nleftover: all fine", hostile.clone()).await;
    server.stop();
    let d = data.to_str().unwrap();
    let clean = depot(&["verify", "--data", d, "--engine", "fs"]);
    assert!(clean.status.success(), "{}", text(&clean));
    assert!(text(&clean).contains("6 objects, 6 blobs"), "{}", text(&clean));

    let blob_file = |bytes: &[u8]| {
        let sha = sha256_hex(bytes);
        files_under(&data.join("fs")).into_iter().find(|p| p.ends_with(&sha)).expect("the blob's file")
    };
    let mut bytes = std::fs::read(blob_file(&damaged)).unwrap();
    bytes[100] ^= 1;
    std::fs::write(blob_file(&damaged), bytes).unwrap();
    std::fs::remove_file(blob_file(&lost)).unwrap();
    std::fs::remove_file(blob_file(&hostile)).unwrap();
    std::fs::OpenOptions::new().write(true).open(blob_file(&cut)).unwrap().set_len(1000).unwrap();
    let mut longer = std::fs::OpenOptions::new().append(true).open(blob_file(&grown)).unwrap();
    std::io::Write::write_all(&mut longer, b"0123456789").unwrap();
    let stray = pattern(1234, 4);
    let stray_at = plant_leftover(&data, &stray);

    let found = depot(&["verify", "--data", d, "--engine", "fs"]);
    let report = text(&found);
    assert_eq!(found.status.code(), Some(1), "{report}");
    assert!(report.contains(&format!("blob {}: its bytes hash to", sha256_hex(&damaged))), "{report}");
    assert!(report.contains(&format!("blob {}: its bytes are missing", sha256_hex(&lost))), "{report}");
    assert!(report.contains(&format!("leftover: blob {}: 1234 bytes in the engine", sha256_hex(&stray))), "{report}");
    assert!(report.contains("lost or damaged: files/damaged"), "{report}");
    assert!(report.contains("lost or damaged: files/lost"), "{report}");
    assert!(report.contains(r"lost or damaged: files/esc\u{1b}]0;pwned\u{7}\nleftover: all fine"), "{report}");
    assert!(!report.contains('\u{1b}') && !report.contains("\nleftover: all fine"), "{report}");
    // Every damaged blob is named, a cut one among them: it does not end the check.
    assert!(report.contains(&format!("blob {}: fs engine: damaged blob: ", sha256_hex(&cut))), "{report}");
    let longer =
        format!("blob {}: 90010 bytes stored, more than were written (the content is whole; kept)", sha256_hex(&grown));
    assert!(report.contains(&longer), "{report}");
    assert!(report.contains("lost or damaged: files/cut"), "{report}");
    assert!(!report.contains("lost or damaged: files/grown"), "its content is whole: {report}");

    let repair = depot(&["verify", "--data", d, "--engine", "fs", "--repair"]);
    assert_eq!(repair.status.code(), Some(1), "lost bytes cannot be repaired: {}", text(&repair));
    assert!(text(&repair).contains("removed 1 leftover"), "{}", text(&repair));
    assert!(!stray_at.exists(), "the orphan is still there");

    let server = Server::start_in(&data, &["--engine", "fs"]);
    for (key, body) in [("kept", &kept), ("grown", &grown)] {
        let r = client().get(server.object_url("files", key)).send().await.unwrap();
        assert_eq!(r.bytes().await.unwrap(), body, "{key}");
    }
    let r = client().get(server.object_url("files", "lost")).send().await.unwrap();
    assert_eq!(r.status(), 500, "lost bytes are a server error, not an empty body");
    // In ranges too, one or several: a status, not a body cut after a 206.
    for range in ["bytes=0-9", "bytes=0-9,20-29"] {
        let r = client().get(server.object_url("files", "lost")).header("range", range).send().await.unwrap();
        assert_eq!(r.status(), 500, "{range}");
    }
    server.assert_no_panic();
}

/// One acknowledged write: the body's SHA-256, when it was sent and when
/// its acknowledgement arrived (microseconds since the epoch).
struct Version {
    sha: String,
    sent: u64,
    acked: u64,
}

fn micros_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}

/// Overwrites keys from `writers` clients (one writer per key) until
/// `stop`; returns each key's versions in order.
async fn write_until(url: String, writers: usize, stop: Arc<AtomicBool>) -> HashMap<String, Vec<Version>> {
    let history = Arc::new(Mutex::new(HashMap::<String, Vec<Version>>::new()));
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (url, stop, history) = (url.clone(), stop.clone(), history.clone());
        tasks.push(tokio::spawn(async move {
            let http = client();
            for i in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let body = pattern([300, 90_000, 700_000][i as usize % 3], w as u64 * 1_000_000 + i);
                let key = format!("w{w}/{}", i % 40);
                let sha = sha256_hex(&body);
                let sent = micros_now();
                let r = http.put(format!("{url}/files/{key}")).body(body).send().await.unwrap();
                assert!(r.status().is_success());
                let version = Version { sha, sent, acked: micros_now() };
                history.lock().unwrap().entry(key).or_default().push(version);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    Arc::try_unwrap(history).ok().unwrap().into_inner().unwrap()
}

/// The CLI asks the server at `--listen` for the backup of the store it
/// holds; a server that serves another data directory refuses rather than
/// copying its own store.
#[tokio::test]
async fn a_backup_is_never_taken_from_a_server_of_another_store() {
    let dir = tempfile::tempdir().unwrap();
    let (mine, other) = (dir.path().join("mine"), dir.path().join("other"));
    let _holder = Server::start_in(&mine, &[]);
    let stranger = Server::start_in(&other, &[]);
    let backup = dir.path().join("backup");
    let out =
        depot(&["backup", "--data", mine.to_str().unwrap(), "--listen", &stranger.addr, backup.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    // Refused for want of the token of its own data directory (a server
    // with credentials would say it serves another: 409).
    let said = text(&out);
    assert!(said.contains("403") && said.contains("the server that holds the data directory"), "{said}");
    assert!(!backup.join("ENGINE").exists(), "nothing was backed up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_taken_under_load_serves_what_was_acknowledged_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_in(&data, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let writers = tokio::spawn(write_until(server.url.clone(), 3, stop.clone()));
    tokio::time::sleep(Duration::from_millis(700)).await;

    let backup = dir.path().join("backup");
    let args = ["backup", "--data", data.to_str().unwrap(), "--listen", &server.addr, backup.to_str().unwrap()];
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let started = micros_now();
    let out =
        tokio::task::spawn_blocking(move || depot(&args.iter().map(String::as_str).collect::<Vec<_>>())).await.unwrap();
    let finished = micros_now();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("asking it at"), "the CLI should have asked the server: {}", text(&out));
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    let history = writers.await.unwrap();
    server.assert_no_panic();

    // The backup is the store at one moment between `started` and
    // `finished`: each key holds the last version acknowledged before
    // `started`, or a later one sent before `finished`.
    let copy = Server::start_in(&backup, &[]);
    let http = client();
    let (mut checked, mut later) = (0, 0);
    for (key, versions) in &history {
        let r = http.get(copy.object_url("files", key)).send().await.unwrap();
        let got = match r.status().as_u16() {
            200 => Some(sha256_hex(&r.bytes().await.unwrap())),
            404 => None,
            s => panic!("{key}: {s}"),
        };
        let floor = versions.iter().rposition(|v| v.acked < started);
        let allowed: Vec<&str> =
            versions[floor.unwrap_or(0)..].iter().filter(|v| v.sent < finished).map(|v| v.sha.as_str()).collect();
        match got {
            None => assert!(floor.is_none(), "{key}, acknowledged before the backup began, is not in it"),
            Some(sha) => assert!(allowed.contains(&sha.as_str()), "{key} holds a version outside the backup's window"),
        }
        checked += floor.is_some() as usize;
        later += versions.iter().filter(|v| v.sent > finished).count();
    }
    assert!(
        checked > 0 && later > 0,
        "the load must run across the backup ({checked} keys before, {later} writes after)"
    );
    drop(copy);
    let verify = depot(&["verify", "--data", backup.to_str().unwrap()]);
    assert!(verify.status.success(), "{}", text(&verify));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_a_stopped_store_needs_no_server_and_refuses_a_used_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "sqlite"]);
    put(&server, "a/b.bin", pattern(300_000, 9)).await;
    server.stop();
    let backup = dir.path().join("backup");
    let (d, b) = (data.to_str().unwrap(), backup.to_str().unwrap());
    let out = depot(&["backup", "--data", d, "--engine", "sqlite", b]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(!text(&out).contains("asking"), "{}", text(&out));
    let again = depot(&["backup", "--data", d, "--engine", "sqlite", b]);
    assert!(!again.status.success());
    assert!(text(&again).contains("not empty"), "{}", text(&again));
    let inside = data.join("backup");
    let nested = depot(&["backup", "--data", d, "--engine", "sqlite", inside.to_str().unwrap()]);
    assert!(text(&nested).contains("inside the data directory") && !inside.exists(), "{}", text(&nested));
    // However the path is spelled.
    let roundabout = dir.path().join("elsewhere/../data/sqlite-backup");
    std::fs::create_dir(dir.path().join("elsewhere")).unwrap();
    let nested = depot(&["backup", "--data", d, "--engine", "sqlite", roundabout.to_str().unwrap()]);
    assert!(text(&nested).contains("inside the data directory"), "{}", text(&nested));
    assert!(!data.join("sqlite-backup").exists(), "{}", text(&nested));
    // A backup cut short has no engine marker yet: it is not served,
    // whether its catalog is whole or still being checkpointed.
    for (i, left) in ["catalog", "catalog.tmp", ".depot-backup-in-progress"].iter().enumerate() {
        let cut = dir.path().join(format!("cut{i}"));
        std::fs::create_dir_all(&cut).unwrap();
        match left.starts_with("catalog") {
            true => std::fs::create_dir(cut.join(left)).unwrap(),
            false => std::fs::write(cut.join(left), b"").unwrap(),
        }
        let serve = std::process::Command::new(common::BIN)
            .args(["serve", "--listen", "127.0.0.1:0", "--data"])
            .arg(&cut)
            .output()
            .unwrap();
        assert!(text(&serve).contains("a backup that did not finish"), "{left}: {}", text(&serve));
    }
    let copy = Server::start_in(&backup, &["--engine", "sqlite"]);
    let r = client().get(copy.object_url("files", "a/b.bin")).send().await.unwrap();
    assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha256_hex(&pattern(300_000, 9)));
}

/// A store whose embedded catalog is gone (it was in PostgreSQL, or was
/// lost) is refused, not given a new, empty catalog that would take every
/// stored file for a leftover, which repairs, the collector and a migration
/// would then remove.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_without_its_catalog_is_refused_and_keeps_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    put(&server, "kept", pattern(70_000, 7)).await;
    server.stop();
    std::fs::remove_dir_all(data.join("catalog")).unwrap();
    let stored = files_under(&data.join("fs/blobs"));
    assert_eq!(stored.len(), 1);
    let d = data.to_str().unwrap();
    for args in [
        vec!["verify", "--data", d, "--engine", "fs", "--repair"],
        vec!["gc", "--data", d, "--engine", "fs", "--gc-grace", "0"],
        vec!["migrate", "--data", d, "--engine", "fs", "--to-engine", "sqlite"],
        vec!["serve", "--data", d, "--engine", "fs", "--listen", "127.0.0.1:0"],
    ] {
        let out = depot(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("but no catalog in"), "{args:?}: {}", text(&out));
        assert_eq!(files_under(&data.join("fs/blobs")), stored, "{args:?} touched the stored files");
        assert!(!data.join("catalog").exists(), "{args:?} made a catalog");
    }
}

/// A mistyped `--data` is an error, not a fresh store checked and found
/// sound: nothing is created there.
#[test]
fn maintenance_of_a_directory_without_a_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // "lock" in the path once made `backup` take the error for a server
    // holding the store, and ask one.
    let missing = dir.path().join("blocks-typo");
    let d = missing.to_str().unwrap();
    let backup_dir = dir.path().join("backup");
    for args in [
        vec!["verify", "--data", d],
        vec!["gc", "--data", d],
        vec!["backup", "--data", d, backup_dir.to_str().unwrap()],
    ] {
        let out = depot(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        assert!(text(&out).contains("holds no depot store"), "{args:?}: {}", text(&out));
        assert!(!missing.exists(), "{args:?} created the directory");
    }
    let file = dir.path().join("a-file");
    std::fs::write(&file, "kept").unwrap();
    let out = depot(&["serve", "--listen", "127.0.0.1:0", "--data", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("is a file: it must name a directory"), "{}", text(&out));
    assert_eq!(std::fs::read(&file).unwrap(), b"kept");
    // Nor does a server start that could take no upload.
    let data = dir.path().join("data");
    let out = depot(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data",
        data.to_str().unwrap(),
        "--min-free-space",
        "1000000000000000000",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("more than the file system"), "{}", text(&out));
    // Nor one that keeps less than RocksDB needs to flush and recover.
    let serve = ["serve", "--listen", "127.0.0.1:0", "--data", data.to_str().unwrap(), "--min-free-space"];
    let out = depot(&[&serve[..], &["8388608"]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("too little for RocksDB"), "{}", text(&out));
}

/// Writers that lose a race for `If-None-Match: *` leave no bytes behind:
/// the store verifies clean as soon as the server stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_that_lose_a_race_leave_no_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    let url = server.object_url("files", "once");
    let racers = (0..8u64).map(|i| {
        let request = client().put(&url).header("if-none-match", "*").body(pattern(400_000, 100 + i));
        async move { request.send().await.unwrap().status().as_u16() }
    });
    let mut statuses = futures::future::join_all(racers).await;
    statuses.sort_unstable();
    assert_eq!(statuses, [201, 412, 412, 412, 412, 412, 412, 412]);
    server.stop();
    let out = depot(&["verify", "--data", data.to_str().unwrap(), "--engine", "fs"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(files_under(&data.join("fs")).iter().filter(|p| p.is_file()).count(), 1, "the winner's bytes alone");
}

/// Bytes a crash left without a record waste space but damage nothing:
/// verify names them and passes; --repair removes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftover_bytes_are_named_but_do_not_fail_verify() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &["--engine", "fs"]);
    put(&server, "kept", pattern(10_000, 1)).await;
    server.stop();
    let stray = pattern(4321, 2);
    let (sha, at) = (sha256_hex(&stray), plant_leftover(&data, &stray));
    let d = data.to_str().unwrap();
    let out = depot(&["verify", "--data", d, "--engine", "fs"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("leftover: blob {sha}: 4321 bytes")), "{}", text(&out));
    assert!(text(&out).contains("0 problem(s); 1 leftover blob(s)"), "{}", text(&out));
    let out = depot(&["verify", "--data", d, "--engine", "fs", "--repair"]);
    assert!(out.status.success() && !at.exists(), "{}", text(&out));
}

/// The RocksDB blob files (`*.blob`) of a hybrid store's small-blob tier,
/// by name.
fn rocksdb_blob_files(data: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = files_under(&data.join("hybrid/rocksdb"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "blob"))
        .collect();
    files.sort();
    files
}

/// Puts `objects` through a new server on `data`, then stops it and runs
/// `depot verify`, which must find the store sound. Opening the store
/// flushes RocksDB's memtable: the small blobs written here land in one
/// new blob file, whose path is returned.
async fn put_and_flush(data: &std::path::Path, objects: &[(String, Vec<u8>)]) -> std::path::PathBuf {
    let before = rocksdb_blob_files(data);
    let mut server = Server::start_in(data, &["--engine", "hybrid"]);
    for (key, body) in objects {
        put(&server, key, body.clone()).await;
    }
    server.stop();
    let clean = depot(&["verify", "--data", data.to_str().unwrap(), "--engine", "hybrid"]);
    assert!(clean.status.success(), "{}", text(&clean));
    let new: Vec<_> = rocksdb_blob_files(data).into_iter().filter(|f| !before.contains(f)).collect();
    // Fewer than 16 MiB of small blobs fill no memtable while the server
    // runs: one flush, one blob file, and no compaction (which would read
    // the blob files) before the test damages them.
    assert_eq!(new.len(), 1, "one new blob file: {new:?}");
    new.into_iter().next().unwrap()
}

/// Damage inside the hybrid engine's RocksDB tier (bytes overwritten in a
/// blob file, a blob file deleted) is named blob by blob, as damage to
/// files is. `verify` used to stop at the first such blob with "internal
/// error: rocksdb engine: Corruption: Blob CRC mismatch", naming neither
/// the blob nor its object, and `--repair` did the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_to_rocksdb_blob_files_is_named_and_repair_clears_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // Small blobs (to RocksDB's blob files), a tiny one (carried in the
    // catalog's record) and large ones (files), in two rounds: two blob files.
    let round = |name: &str, seed: u64| -> Vec<(String, Vec<u8>)> {
        let mut objects: Vec<_> =
            (0..50).map(|i| (format!("{name}/small{i}"), pattern(150_000 + i * 1000, seed + i as u64))).collect();
        objects.push((format!("{name}/tiny"), pattern(100, seed + 100)));
        objects.push((format!("{name}/large"), pattern(400_000, seed + 101)));
        objects
    };
    let (first, second) = (round("first", 1000), round("second", 2000));
    let overwritten = put_and_flush(&data, &first).await;
    let deleted = put_and_flush(&data, &second).await;
    let len = std::fs::metadata(&overwritten).unwrap().len();
    let mut file = std::fs::OpenOptions::new().write(true).open(&overwritten).unwrap();
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(len / 2)).unwrap();
    std::io::Write::write_all(&mut file, &[0, 1, 2]).unwrap();
    drop(file);
    std::fs::remove_file(&deleted).unwrap();

    let d = data.to_str().unwrap();
    let found = depot(&["verify", "--data", d, "--engine", "hybrid"]);
    let report = text(&found);
    assert_eq!(found.status.code(), Some(1), "{report}");
    assert!(!report.contains("internal error"), "{report}");
    let damaged: Vec<&str> = report.lines().filter_map(|l| l.strip_prefix("lost or damaged: files/")).collect();
    let damaged: Vec<&str> = damaged.iter().map(|l| l.split(' ').next().unwrap()).collect();
    // Every small blob of the deleted file, and the one (or two) the
    // overwritten bytes fell in; nothing of the other tiers.
    for (key, body) in second.iter().filter(|(k, _)| k.contains("small")) {
        let line =
            format!("blob {}: rocksdb engine: damaged blob: the blob file that held it is gone", sha256_hex(body));
        assert!(report.contains(&line), "{key}: {report}");
        assert!(damaged.contains(&key.as_str()), "{key}: {report}");
    }
    let hit: Vec<&str> = damaged.iter().copied().filter(|k| k.starts_with("first/")).collect();
    assert!(matches!(hit.len(), 1 | 2) && hit.iter().all(|k| k.contains("small")), "{hit:?}: {report}");
    assert!(report.contains("rocksdb engine: damaged blob: Corruption"), "{report}");
    assert_eq!(damaged.len(), 50 + hit.len(), "{report}");

    // The server answers 500 for a damaged object, saying so, and serves
    // the rest.
    let mut server = Server::start_in(&data, &["--engine", "hybrid"]);
    let r = client().get(server.object_url("files", hit[0])).send().await.unwrap();
    assert_eq!(r.status(), 500);
    assert!(r.text().await.unwrap().contains("damaged blob"));
    for (key, body) in first.iter().filter(|(k, _)| !hit.contains(&k.as_str())) {
        let r = client().get(server.object_url("files", key)).send().await.unwrap();
        assert!(r.status() == 200 && r.bytes().await.unwrap() == *body, "{key}");
    }
    server.stop();
    server.assert_no_panic();

    // --repair removes the damaged bytes (RocksDB keeps the first copy of
    // a content, so an upload would not replace them); the objects then
    // stored again, the store verifies clean.
    let repair = depot(&["verify", "--data", d, "--engine", "hybrid", "--repair"]);
    assert_eq!(repair.status.code(), Some(1), "{}", text(&repair));
    let cleared = format!("the damaged bytes of {} blob(s)", damaged.len());
    assert!(text(&repair).contains(&cleared), "{}", text(&repair));
    let server = Server::start_in(&data, &["--engine", "hybrid"]);
    for (key, body) in first.iter().chain(&second).filter(|(k, _)| damaged.contains(&k.as_str())) {
        put(&server, key, body.clone()).await;
    }
    drop(server);
    let after = depot(&["verify", "--data", d, "--engine", "hybrid"]);
    assert!(after.status.success(), "{}", text(&after));
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
}

/// A backup that fails, here on a device too small for it, removes what
/// it wrote (and the directory, when it made it), so that trying again on
/// the same directory is not refused as "not empty", and a copy cut short
/// is not left to be mistaken for a backup. The message says that the
/// backup's directory is full, not the store's. Through a running server
/// (`POST /_/backup`) and without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_that_fills_its_device_leaves_nothing_and_says_where() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let small = dir.path().join("small");
    let Some(_device) = Tmpfs::mount(&small, "4m") else { return };
    let mut server = Server::start_in(&data, &[]);
    for i in 0..20u64 {
        put(&server, &format!("large{i}"), pattern(500_000, i)).await;
        put(&server, &format!("small{i}"), pattern(50_000, 100 + i)).await;
    }
    let d = data.to_str().unwrap();
    let target = small.join("bk");
    let t = target.to_str().unwrap();
    let full = format!("no space left on the device of the backup directory {t}, not the store's");

    let asked = depot(&["backup", "--data", d, "--listen", &server.addr, t]);
    assert!(!asked.status.success(), "{}", text(&asked));
    assert!(text(&asked).contains("asking it at") && text(&asked).contains("507"), "{}", text(&asked));
    assert!(text(&asked).contains(&full), "{}", text(&asked));
    assert_eq!(entries(&small), Vec::<String>::new(), "the backup left {:?}", files_under(&small));
    server.stop();
    server.assert_no_panic();

    // Again without a server, on the same directory: the same answer,
    // not "is not empty".
    let again = depot(&["backup", "--data", d, t]);
    assert!(!again.status.success(), "{}", text(&again));
    assert!(text(&again).contains(&full), "{}", text(&again));
    assert!(!target.exists(), "{:?}", files_under(&small));

    // A directory that was there before stays, empty.
    let made = small.join("made-before");
    std::fs::create_dir(&made).unwrap();
    let into_made = depot(&["backup", "--data", d, made.to_str().unwrap()]);
    assert!(text(&into_made).contains("no space left on the device of the backup directory"), "{}", text(&into_made));
    assert_eq!(entries(&small), ["made-before"]);
    assert_eq!(entries(&made), Vec::<String>::new());

    // The store itself is untouched, and backs up where there is room.
    let verify = depot(&["verify", "--data", d]);
    assert!(verify.status.success(), "{}", text(&verify));
    let roomy = dir.path().join("roomy");
    let out = depot(&["backup", "--data", d, roomy.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
}
