//! Several depot nodes over one PostgreSQL catalog and one shared engine
//! (a directory, PostgreSQL, or an S3 bucket) form one store.

mod common;

use common::{Server, client, pattern, sha256_hex};

/// Two nodes on one catalog (a fresh database) and one shared engine:
/// `fs` on one directory, `postgres` in the catalog's database, or `s3` in
/// a fresh bucket of the S3 test server.
async fn two_nodes(engine: &str) -> (Server, Server, tempfile::TempDir) {
    two_nodes_with(engine, &[]).await
}

/// [`two_nodes`], with more settings for both.
async fn two_nodes_with(engine: &str, settings: &[&str]) -> (Server, Server, tempfile::TempDir) {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = ["--catalog", url.as_str(), "--engine", engine].map(String::from).to_vec();
    args.extend(settings.iter().map(|s| s.to_string()));
    match engine {
        "postgres" => args.extend(["--engine-url".into(), url.clone()]),
        "s3" => {
            let bucket = depot::engine::s3::fresh_test_bucket().await;
            let (endpoint, config) = depot::engine::s3::test_server(&bucket);
            args.extend(["--engine-url".into(), endpoint, "--s3-bucket".into(), bucket]);
            args.extend(["--s3-access-key".into(), config.access_key.unwrap()]);
            args.extend(["--s3-secret-key".into(), config.secret_key.unwrap()]);
        }
        _ => {}
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = Server::start_in(&dir.path().join("shared"), &args);
    let b = Server::start_in(&dir.path().join(if engine == "fs" { "shared" } else { "node-b" }), &args);
    (a, b, dir)
}

/// A node of a shared catalog cannot copy that catalog: a backup it is
/// asked for is refused as the caller's mistake, before it writes anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_of_a_shared_catalog_refuses_a_backup_up_front() {
    let (a, _b, dir) = two_nodes("fs").await;
    let token = std::fs::read_to_string(a.data.join(depot::http::LOCAL_TOKEN_FILE)).unwrap();
    let target = dir.path().join("backup");
    let r = client()
        .post(format!("{}/_/backup", a.url))
        .query(&[("dir", target.to_str().unwrap())])
        .header(depot::http::LOCAL_TOKEN_HEADER, token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("the catalog lives in its own server"));
    assert!(!target.exists());
}

async fn metric(server: &Server, name: &str) -> i64 {
    let text = client().get(format!("{}/_/metrics", server.url)).send().await.unwrap().text().await.unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("no {name}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_a_shared_directory_are_one_store() {
    one_store(two_nodes("fs").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_the_postgres_engine_are_one_store() {
    one_store(two_nodes("postgres").await).await;
}

/// An object written through one node is read, listed and deleted through
/// the other.
async fn one_store((a, b, _dir): (Server, Server, tempfile::TempDir)) {
    let http = client();
    let body = pattern(700_000, 1);
    let r = http.put(a.object_url("files", "docs/report.pdf")).body(body.clone()).send().await.unwrap();
    assert_eq!(r.status(), 201);

    let r = http.get(b.object_url("files", "docs/report.pdf")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), body);
    let ranged =
        http.get(b.object_url("files", "docs/report.pdf")).header("range", "bytes=10-19").send().await.unwrap();
    assert_eq!(ranged.status(), 206);
    assert_eq!(ranged.bytes().await.unwrap(), body[10..20]);

    let listing: serde_json::Value = http
        .get(format!("{}/files/docs/", b.url))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(listing["entries"][0]["key"], "docs/report.pdf");

    // A bucket made on one node exists on the other.
    assert_eq!(http.put(format!("{}/photos", b.url)).send().await.unwrap().status(), 201);
    assert_eq!(http.put(format!("{}/photos", a.url)).send().await.unwrap().status(), 409);

    assert_eq!(http.delete(b.object_url("files", "docs/report.pdf")).send().await.unwrap().status(), 204);
    assert_eq!(http.get(a.object_url("files", "docs/report.pdf")).send().await.unwrap().status(), 404);
    a.assert_no_panic();
    b.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_on_one_s3_bucket_are_one_store() {
    one_store(two_nodes("s3").await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dedup_holds_across_nodes_under_concurrency() {
    dedup_across_nodes("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dedup_holds_across_nodes_on_s3() {
    dedup_across_nodes("s3").await;
}

/// Twenty concurrent uploads of one content through two nodes: one blob.
async fn dedup_across_nodes(engine: &str) {
    let (a, b, _dir) = two_nodes(engine).await;
    let body = pattern(300_000, 2);
    let puts = (0..20).map(|i| {
        let node = if i % 2 == 0 { &a } else { &b };
        let (url, body) = (node.object_url("files", &format!("copy-{i}")), body.clone());
        async move { client().put(url).body(body).send().await.unwrap().status() }
    });
    let statuses = futures::future::join_all(puts).await;
    assert!(statuses.iter().all(|s| *s == 201), "{statuses:?}");
    assert_eq!(metric(&a, "depot_blobs").await, 1, "twenty copies over two nodes are one blob");
    assert_eq!(metric(&b, "depot_objects").await, 20);
    let blob = client().head(format!("{}/_/blobs/{}", a.url, sha256_hex(&body))).send().await.unwrap();
    assert_eq!(blob.status(), 200);
    for i in 0..20 {
        let r = client().get(b.object_url("files", &format!("copy-{i}"))).send().await.unwrap();
        assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha256_hex(&body));
    }
}

/// Both nodes collect every second, with no grace period, while four
/// clients keep replacing their objects with the same three contents
/// through either node: contents die and are uploaded again all the time,
/// on one node while the other collects. Every acknowledged object reads
/// back whole through the other node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn collection_on_every_node_never_loses_a_new_upload() {
    use std::time::{Duration, Instant};
    let (a, b, _dir) = two_nodes_with("fs", &["--gc-grace", "0", "--gc-interval", "1"]).await;
    let contents: Vec<Vec<u8>> = (0..3).map(|i| pattern(40_000, 10 + i)).collect();
    let deadline = Instant::now() + Duration::from_secs(4);
    let client_loop = |w: usize| {
        let (a, b, contents) = (&a, &b, &contents);
        async move {
            let http = client();
            let mut rounds = 0;
            while Instant::now() < deadline {
                let (writer, reader) = if (rounds + w).is_multiple_of(2) { (a, b) } else { (b, a) };
                let body = &contents[(rounds + w) % contents.len()];
                let key = format!("churn-{w}");
                let r = http.put(writer.object_url("files", &key)).body(body.clone()).send().await.unwrap();
                assert!(r.status().is_success(), "round {rounds} of client {w}: {}", r.status());
                let r = http.get(reader.object_url("files", &key)).send().await.unwrap();
                assert_eq!(r.status(), 200, "round {rounds} of client {w}: {}", r.text().await.unwrap());
                assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha256_hex(body), "round {rounds} of client {w}");
                rounds += 1;
            }
            rounds
        }
    };
    let rounds: usize = futures::future::join_all((0..4).map(client_loop)).await.into_iter().sum();
    assert!(rounds > 20, "only {rounds} rounds");
    assert!(metric(&a, "depot_blobs").await <= 3);
    a.assert_no_panic();
    b.assert_no_panic();
}

/// `depot verify` and `depot migrate` need the store to themselves: while a
/// node serves the shared catalog they refuse, naming it; once it stopped
/// they run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn maintenance_that_needs_the_store_alone_waits_for_every_node_to_stop() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shared");
    let args = ["--catalog", url.as_str(), "--engine", "fs"];
    let mut node = Server::start_in(&data, &args);
    let r = client().put(node.object_url("files", "k")).body(pattern(10_000, 3)).send().await.unwrap();
    assert_eq!(r.status(), 201);

    let data_arg = data.to_str().unwrap();
    let verify = common::depot(&[&["verify", "--data", data_arg][..], &args].concat());
    let said = String::from_utf8_lossy(&verify.stderr);
    assert!(!verify.status.success(), "verify ran beside a node: {said}");
    assert!(said.contains("1 node(s) serve this catalog") && said.contains(&node.url["http://".len()..]), "{said}");
    let migrate = common::depot(&[&["migrate", "--data", data_arg, "--to-engine", "hybrid"][..], &args].concat());
    let said = String::from_utf8_lossy(&migrate.stderr);
    assert!(!migrate.status.success() && said.contains("stop them before migrating"), "{said}");

    // `gc` is one more collector, and may run beside the nodes.
    let gc = common::depot(&[&["gc", "--data", data_arg][..], &args].concat());
    assert!(gc.status.success(), "{}", String::from_utf8_lossy(&gc.stderr));

    assert!(node.stop().success());
    let verify = common::depot(&[&["verify", "--data", data_arg][..], &args].concat());
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
}

/// The catalog names the engine for every node: a node started with
/// another engine, or another bucket of the same one, is refused before it
/// makes anything, where it used to acknowledge writes no other node could
/// read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_with_another_engine_is_refused_by_the_shared_catalog() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let store = ["--catalog", &url, "--engine", "postgres", "--engine-url", &url];
    let a = Server::start_in(&dir.path().join("node-a"), &store);
    let r = client().put(a.object_url("files", "k")).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201);
    let data = dir.path().join("node-c");
    let said = refused_start(&data, &["--catalog", &url, "--engine", "fs"]);
    assert!(
        said.contains("keeps its bytes in the postgres engine's database") && said.contains("the fs engine"),
        "{said}"
    );
    assert!(!data.join("fs").exists(), "the refused engine's directory was made");

    // S3 in a bucket other than the store's: refused too.
    let bucket = depot::engine::s3::fresh_test_bucket().await;
    let (endpoint, config) = depot::engine::s3::test_server(&bucket);
    let (key, secret) = (config.access_key.unwrap(), config.secret_key.unwrap());
    let s3 = ["--engine", "s3", "--engine-url", &endpoint, "--s3-bucket", &bucket];
    let said = refused_start(
        &data,
        &[&["--catalog", &url][..], &s3, &["--s3-access-key", &key, "--s3-secret-key", &secret]].concat(),
    );
    assert!(said.contains("every node sharing a catalog"), "{said}");

    // The store's own settings start a third node, which reads what the
    // first wrote.
    let c = Server::start_in(&data, &store);
    let r = client().get(c.object_url("files", "k")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "kept");
}

/// While the shared catalog is empty, a node may tie it to another engine
/// than the one a stopped node left named; but not while another node
/// serves it, writing where the catalog says: each would then send its
/// readers where the other's bytes are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_empty_shared_catalog_keeps_the_engine_its_nodes_serve() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let mut a = Server::start_in(
        &dir.path().join("node-a"),
        &["--catalog", &url, "--engine", "postgres", "--engine-url", &url],
    );
    let data = dir.path().join("node-b");
    let other = ["--catalog", &url, "--engine", "fs"];
    let said = refused_start(&data, &other);
    assert!(said.contains("1 node(s) serve it") && said.contains(&a.url["http://".len()..]), "{said}");
    assert!(a.stop().success());
    let b = Server::start_in(&data, &other);
    let r = client().put(b.object_url("files", "k")).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201, "once no node serves the empty store, it may take another engine");
}

/// While maintenance that needs the store to itself runs, it is noted in
/// the catalog's list of nodes, and a node starting then refuses to serve,
/// saying what runs; the note goes when the maintenance ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_does_not_start_while_maintenance_runs() {
    use depot::catalog::Catalog;
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shared");
    let args = ["--catalog", url.as_str(), "--engine", "fs"];
    let catalog = depot::catalog::postgres::PostgresCatalog::connect(&url).await.unwrap();
    let note = "maintenance: verifying on elsewhere (pid 1)";
    catalog.node_seen(note).await.unwrap();
    let said = refused_start(&data, &args);
    assert!(said.contains(note) && said.contains("once it has ended"), "{said}");
    assert_eq!(catalog.live_nodes(depot::catalog::NODE_LIFE).await.unwrap(), [note], "the refused node left no note");
    catalog.node_gone(note).await.unwrap();

    let data_arg = data.to_str().unwrap();
    let verify = common::depot(&[&["verify", "--data", data_arg][..], &args].concat());
    assert!(verify.status.success(), "{}", String::from_utf8_lossy(&verify.stderr));
    assert_eq!(
        catalog.live_nodes(depot::catalog::NODE_LIFE).await.unwrap(),
        Vec::<String>::new(),
        "verify left its note"
    );
    let node = Server::start_in(&data, &args);
    assert!(client().get(format!("{}/_/health", node.url)).send().await.unwrap().status().is_success());
}

/// Nodes of an earlier version lock the catalog's keys another way: a
/// node does not start beside one, and says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_does_not_start_beside_an_earlier_version() {
    use depot::catalog::Catalog;
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--catalog", url.as_str(), "--engine", "fs"];
    let catalog = depot::catalog::postgres::PostgresCatalog::connect(&url).await.unwrap();
    let older = "elsewhere 127.0.0.1:8080 (pid 1)";
    catalog.node_seen(older).await.unwrap();
    let said = refused_start(&dir.path().join("shared"), &args);
    assert!(said.contains(older) && said.contains("earlier version"), "{said}");
    catalog.node_gone(older).await.unwrap();
    let a = Server::start_in(&dir.path().join("shared"), &args);
    let b = Server::start_in(&dir.path().join("shared"), &args);
    for node in [&a, &b] {
        assert!(client().get(format!("{}/_/health", node.url)).send().await.unwrap().status().is_success());
    }
}

/// A node that finds maintenance running on the shared catalog (begun
/// while the node was cut off, so the maintenance did not see it) takes
/// no more writes, and goes on serving reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_finds_maintenance_running_takes_no_writes() {
    use depot::catalog::Catalog;
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--catalog", url.as_str(), "--engine", "fs"];
    let node = Server::start_in(&dir.path().join("shared"), &args);
    let r = client().put(node.object_url("files", "before")).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201);
    let catalog = depot::catalog::postgres::PostgresCatalog::connect(&url).await.unwrap();
    // Maintenance still looking for nodes keeps new ones from starting, and
    // stops none that serve: it gives way to them.
    let starting = "maintenance starting: verifying on elsewhere (pid 1)";
    catalog.node_seen(starting).await.unwrap();
    let said = refused_start(&dir.path().join("shared"), &args);
    assert!(said.contains(starting), "{said}");
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    let r = client().put(node.object_url("files", "meanwhile")).body("x").send().await.unwrap();
    assert_eq!(r.status(), 201, "a node stopped writing for maintenance that had not begun");
    catalog.node_gone(starting).await.unwrap();
    catalog.node_seen("maintenance: verifying on elsewhere (pid 1)").await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let refused = loop {
        let r = client().put(node.object_url("files", "during")).body("x").send().await.unwrap();
        if r.status() == 503 {
            break r.text().await.unwrap();
        }
        assert_eq!(r.status().as_u16() / 100, 2);
        assert!(std::time::Instant::now() < deadline, "the node still takes writes");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert!(refused.contains("maintenance: verifying on elsewhere"), "{refused}");
    let r = client().get(node.object_url("files", "before")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.text().await.unwrap()), (200, "kept".to_string()));
    node.assert_no_panic();
}

/// `verify --repair` removes unreferenced blobs, but not one a claim holds
/// (here one a node that crashed while writing the content left, within
/// its life): that blob stays, and stays in the totals, where the repair
/// used to take it out of them and count it removed, and the next
/// `verify` found the totals wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_repair_leaves_a_claimed_blob_counted() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shared");
    let args = ["--catalog", url.as_str(), "--engine", "fs"];
    let mut node = Server::start_in(&data, &args);
    let (claimed, free) = (pattern(10_000, 41), pattern(10_000, 42));
    for (key, body) in [("claimed", &claimed), ("free", &free)] {
        let r = client().put(node.object_url("files", key)).body(body.clone()).send().await.unwrap();
        assert_eq!(r.status(), 201);
        let r = client().delete(node.object_url("files", key)).send().await.unwrap();
        assert_eq!(r.status(), 204);
    }
    assert!(node.stop().success());
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let digest = hex::decode(sha256_hex(&claimed)).unwrap();
    db.execute("INSERT INTO depot_catalog_claims (id, digest) VALUES (-7, $1)", &[&digest]).await.unwrap();

    let data_arg = data.to_str().unwrap();
    let repair = common::depot(&[&["verify", "--data", data_arg, "--repair"][..], &args].concat());
    let said = String::from_utf8_lossy(&repair.stdout);
    assert!(repair.status.success(), "{said}{}", String::from_utf8_lossy(&repair.stderr));
    assert!(said.contains("removed 1 leftover and unreferenced blob(s)"), "{said}");
    assert_eq!(rows(&url, "depot_catalog_blobs").await, 1, "the claimed blob stays");
    let verify = common::depot(&[&["verify", "--data", data_arg][..], &args].concat());
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(verify.status.success() && said.contains("1 blobs") && said.contains("0 problem(s)"), "{said}");
}

/// What `depot serve` said when it refused to start on `data` with `args`.
fn refused_start(data: &std::path::Path, args: &[&str]) -> String {
    let serve = ["serve", "--data", data.to_str().unwrap(), "--listen", "127.0.0.1:0"];
    let out = common::depot(&[&serve[..], args].concat());
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "it started: {said}");
    said
}

/// A migration of a shared store moves the catalog's engine with it: a
/// node then starts on the new engine, and not on the old.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_migrated_shared_store_names_its_new_engine_to_every_node() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("shared");
    let args = ["--catalog", url.as_str(), "--engine", "fs"];
    let mut node = Server::start_in(&data, &args);
    let body = pattern(50_000, 4);
    assert_eq!(client().put(node.object_url("files", "k")).body(body.clone()).send().await.unwrap().status(), 201);
    assert!(node.stop().success());

    let to = ["--to-engine", "postgres", "--to-engine-url", &url];
    let migrate = common::depot(&[&["migrate", "--data", data.to_str().unwrap()][..], &args, &to].concat());
    assert!(migrate.status.success(), "{}", String::from_utf8_lossy(&migrate.stderr));

    // Another node, with a data directory of its own.
    let other = dir.path().join("other");
    let said = refused_start(&other, &args);
    assert!(said.contains("keeps its bytes in the postgres engine"), "{said}");
    let moved = Server::start_in(&other, &["--catalog", &url, "--engine", "postgres", "--engine-url", &url]);
    let r = client().get(moved.object_url("files", "k")).send().await.unwrap();
    assert_eq!(sha256_hex(&r.bytes().await.unwrap()), sha256_hex(&body));
}

/// A proxy in front of PostgreSQL that, once armed with a piece of SQL,
/// forwards the COMMIT of the next transaction that sends it, then drops
/// the connection before the server's answer reaches the client: the
/// commit is applied, and the client cannot know. Held, it forwards
/// nothing either way until let go, as a network cut off would.
struct CommitCutter {
    addr: std::net::SocketAddr,
    armed: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    held: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl CommitCutter {
    fn start(upstream: std::net::SocketAddr) -> CommitCutter {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let armed: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>> = Default::default();
        let held: std::sync::Arc<AtomicBool> = Default::default();
        let (shared, holding) = (armed.clone(), held.clone());
        let wait_while = |held: &AtomicBool| {
            while held.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                let server = std::net::TcpStream::connect(upstream).unwrap();
                let cut = std::sync::Arc::new(AtomicBool::new(false));
                let (mut from_client, mut to_server) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let (armed, cut_up, held_up, held_down) =
                    (shared.clone(), cut.clone(), holding.clone(), holding.clone());
                std::thread::spawn(move || {
                    let (mut buf, mut saw) = ([0u8; 65536], false);
                    while let Ok(n) = from_client.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        let chunk = &buf[..n];
                        let mut armed = armed.lock().unwrap();
                        if let Some(sql) = armed.as_ref() {
                            saw |= chunk.windows(sql.len()).any(|w| w == sql.as_slice());
                            if saw && chunk.windows(6).any(|w| w == b"COMMIT") {
                                *armed = None;
                                cut_up.store(true, Ordering::SeqCst);
                            }
                        }
                        drop(armed);
                        wait_while(&held_up);
                        if to_server.write_all(chunk).is_err() {
                            break;
                        }
                    }
                    let _ = to_server.shutdown(std::net::Shutdown::Both);
                });
                let (mut from_server, mut to_client) = (server, client);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n) = from_server.read(&mut buf) {
                        if n == 0 || cut.load(Ordering::SeqCst) {
                            break;
                        }
                        wait_while(&held_down);
                        if to_client.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = to_client.shutdown(std::net::Shutdown::Both);
                    let _ = from_server.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        CommitCutter { addr, armed, held }
    }

    fn hold(&self, held: bool) {
        self.held.store(held, std::sync::atomic::Ordering::SeqCst);
    }

    fn arm(&self, sql: &str) {
        *self.armed.lock().unwrap() = Some(sql.as_bytes().to_vec());
    }

    fn disarmed(&self) -> bool {
        self.armed.lock().unwrap().is_none()
    }
}

/// A node on the fs engine and a fresh catalog reached through a
/// [`CommitCutter`], with `extra` settings; the catalog's own URL.
async fn behind_a_cutter(extra: &[&str]) -> (Server, CommitCutter, String) {
    let url = depot::pg::fresh_test_database().await;
    let (head, database) = url.rsplit_once('/').unwrap();
    let (credentials, upstream) = head.rsplit_once('@').unwrap();
    let cutter = CommitCutter::start(upstream.parse().unwrap());
    let proxied = format!("{credentials}@{}/{database}", cutter.addr);
    let mut args = vec!["--catalog", proxied.as_str(), "--engine", "fs"];
    args.extend_from_slice(extra);
    (Server::start(&args), cutter, url)
}

/// The rows of `table` in the catalog at `url`.
async fn rows(url: &str, table: &str) -> i64 {
    let (db, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    db.query_one(&format!("SELECT count(*) FROM {table}"), &[]).await.unwrap().get(0)
}

/// A write whose COMMIT was applied but whose answer was lost is replayed;
/// the replay then finds the first attempt's work (its `If-None-Match: *`
/// no longer holds, its key is gone) and answers 503, outcome unknown,
/// not the 412 or 404 it would be for another client's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_write_whose_commit_answer_was_lost_is_not_answered_as_refused() {
    let (server, cutter, _) = behind_a_cutter(&[]).await;
    let http = client();

    cutter.arm("INSERT INTO depot_catalog_objects");
    let r =
        http.put(server.object_url("files", "new")).header("if-none-match", "*").body("first").send().await.unwrap();
    assert!(cutter.disarmed(), "no COMMIT was cut");
    assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
    let r = http.get(server.object_url("files", "new")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "first", "the first attempt's commit was applied");

    cutter.arm("DELETE FROM depot_catalog_objects");
    let r = http.delete(server.object_url("files", "new")).send().await.unwrap();
    assert!(cutter.disarmed(), "no COMMIT was cut");
    assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
    let r = http.get(server.object_url("files", "new")).send().await.unwrap();
    assert_eq!(r.status(), 404, "the first attempt's delete was applied");

    // Buckets: the one the first attempt made is this request's; a delete
    // that finds its bucket gone cannot tell who took it.
    cutter.arm("INSERT INTO depot_catalog_buckets");
    let r = http.put(format!("{}/made", server.url)).send().await.unwrap();
    assert!(cutter.disarmed(), "no COMMIT was cut");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    cutter.arm("DELETE FROM depot_catalog_buckets");
    let r = http.delete(format!("{}/made", server.url)).send().await.unwrap();
    assert!(cutter.disarmed(), "no COMMIT was cut");
    assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
    let r = http.get(format!("{}/made/?format=json", server.url)).send().await.unwrap();
    assert_eq!(r.status(), 404, "the first attempt's delete was applied");

    // A plain write's replay finds its claim ended by the first attempt's
    // commit, and its record there as it would write it: applied.
    cutter.arm("INSERT INTO depot_catalog_objects");
    let r = http.put(server.object_url("files", "replayed")).body("new bytes").send().await.unwrap();
    assert!(cutter.disarmed(), "no COMMIT was cut");
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let r = http.get(server.object_url("files", "replayed")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "new bytes");

    let r = http.put(server.object_url("files", "plain")).body("x").send().await.unwrap();
    assert_eq!(r.status(), 201, "unarmed, writes go on");
}

/// A node the shared catalog has not answered for longer than its lease on
/// writes takes none (503 at once, saying why): maintenance may by now
/// have taken it for stopped. Once the catalog answers again, with no
/// maintenance running, it takes writes again. Before the lease, such a
/// node waited on the catalog, and took writes as soon as it answered,
/// until its next heartbeat looked for maintenance.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_the_catalog_has_not_answered_takes_no_writes_past_its_lease() {
    use std::time::{Duration, Instant};
    let (server, cutter, _) = behind_a_cutter(&[]).await;
    let http = client();
    let r = http.put(server.object_url("files", "before")).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201);
    cutter.hold(true);
    tokio::time::sleep(depot::catalog::NODE_LEASE + Duration::from_secs(1)).await;
    let r = http.put(server.object_url("files", "cut-off")).body("x").timeout(Duration::from_secs(5)).send();
    let r = r.await.expect("a write past the lease waited on the catalog");
    assert_eq!(r.status(), 503);
    let said = r.text().await.unwrap();
    assert!(said.contains("has not answered this node"), "{said}");
    cutter.hold(false);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = http.put(server.object_url("files", "back")).body("y").send().await.unwrap();
        if r.status() == 201 {
            break;
        }
        assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
        assert!(Instant::now() < deadline, "the node takes no writes once the catalog answers");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = http.get(server.object_url("files", "before")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "kept");
    server.assert_no_panic();
}

/// A claim on a content whose COMMIT was applied but whose answer was lost:
/// the replay finds the claim made, and the write releases it when done.
/// A second claim would be nobody's to release, and would hold the
/// content from the collectors for ten minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_commit_answer_was_lost_is_released_once_written() {
    let (server, cutter, url) = behind_a_cutter(&[]).await;
    let http = client();
    cutter.arm("INSERT INTO depot_catalog_claims");
    let r = http.put(server.object_url("files", "claimed")).body(pattern(50_000, 4)).send().await.unwrap();
    assert!(cutter.disarmed(), "no claim's COMMIT was cut");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let claims = rows(&url, "depot_catalog_claims").await;
    assert_eq!(claims, 0, "a claim outlived its write");
    let r = http.get(server.object_url("files", "claimed")).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), pattern(50_000, 4));
    server.assert_no_panic();
}

/// A NUL character, which no key holds and a PostgreSQL text cannot, in a
/// listing's prefix or marker or in a batch's keys: a clear 400, and the
/// node goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_nul_in_a_listing_or_a_batch_is_refused_with_the_shared_catalog() {
    let (a, _b, _dir) = two_nodes("fs").await;
    let http = client();
    http.put(a.object_url("files", "k")).body("v").send().await.unwrap().error_for_status().unwrap();
    // The S3 API's listings go the same way: the boto3 suite sends them.
    for query in ["files/?prefix=k%00&format=json", "files/?after=k%00&format=json"] {
        let r = http.get(format!("{}/{query}", a.url)).send().await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body.contains("NUL"), "{query}: {body}");
    }
    let r = http.post(format!("{}/_/batch/get?bucket=files", a.url)).body("k\nx\0y\n").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.unwrap().contains("NUL"));
    let listed = http.get(format!("{}/files/?format=json", a.url)).send().await.unwrap().text().await.unwrap();
    assert!(listed.contains("\"k\""), "{listed}");
    a.assert_no_panic();
}

/// A collection whose COMMIT was applied but whose answer was lost: the
/// replay finds the mark its first attempt left, so the bytes go and the
/// mark with them. Given up instead, the blob waits for the sweep of bytes
/// nothing records (an hour, by default: here the grace is 0, and the
/// report says which of the two took it), while its mark keeps every
/// writer of the content waiting for minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_collection_whose_commit_answer_was_lost_deletes_the_bytes_and_its_mark() {
    let (server, cutter, url) = behind_a_cutter(&["--gc-interval", "1", "--gc-grace", "0"]).await;
    let http = client();
    let body = pattern(100_000, 3);
    http.put(server.object_url("files", "k")).body(body.clone()).send().await.unwrap().error_for_status().unwrap();
    let blob_files = || common::files_under(&server.data.join("fs")).len();
    let stored = blob_files();
    assert!(stored > 0);
    cutter.arm("DELETE FROM depot_catalog_blobs");
    http.delete(server.object_url("files", "k")).send().await.unwrap().error_for_status().unwrap();
    let collected = || server.log.lock().unwrap().lines().find(|l| l.contains("garbage collected")).map(str::to_string);
    for _ in 0..300 {
        if cutter.disarmed() && blob_files() < stored && collected().is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(cutter.disarmed(), "no collection's COMMIT was cut");
    assert!(blob_files() < stored, "the collected blob's bytes are still there");
    let report = collected().expect("a collection was reported");
    assert!(report.contains("dead_blobs: 1") && report.contains("orphans: 0"), "{report}");
    let marks = rows(&url, "depot_catalog_deleting").await;
    assert_eq!(marks, 0, "a delete mark outlived its delete");
    server.assert_no_panic();
}

/// A batch of the most entries allowed by default commits on a shared
/// catalog, and one node sees what the other wrote. A lock per key once ran
/// PostgreSQL out of its lock table at a few thousand entries ("out of
/// shared memory"), and a round trip per statement took half a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_ten_thousand_entries_commits_on_a_shared_catalog() {
    let (a, b, _dir) = two_nodes("fs").await;
    let http = client();
    let body: String = (0..10_000).map(|i| format!("k{i}\n{}\n{i}\n", i.to_string().len())).collect();
    let r = http.post(format!("{}/_/batch/put?bucket=files", a.url)).body(body).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = http.get(b.object_url("files", "k9999")).send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), "9999".as_bytes());
    assert_eq!(metric(&b, "depot_objects").await, 10_000);

    let keys: String = (0..10_000).map(|i| format!("k{i}\n")).collect();
    let r = http.post(format!("{}/_/batch/delete?bucket=files", b.url)).body(keys).send().await.unwrap();
    let text = r.text().await.unwrap();
    assert!(text.contains(r#""deleted":10000"#), "{text}");
    assert_eq!(http.get(a.object_url("files", "k0")).send().await.unwrap().status(), 404);
    assert_eq!(metric(&a, "depot_objects").await, 0);
}

/// A migration stopped while it switched a shared catalog over leaves the
/// catalog saying so: no node starts on it, not only the one whose data
/// directory holds the migration's journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_node_starts_on_a_catalog_a_migration_is_switching() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--catalog", url.as_str(), "--engine", "postgres", "--engine-url", url.as_str()];
    let mut a = Server::start_in(&dir.path().join("a"), &args);
    let r = client().put(a.object_url("files", "k")).body("kept").send().await.unwrap();
    assert!(r.status().is_success());
    a.stop();
    let (db, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let switching =
        "UPDATE depot_catalog_settings SET value = 'switching to' || chr(10) || value WHERE name = 'engine'";
    assert_eq!(db.execute(switching, &[]).await.unwrap(), 1);

    let refused = std::process::Command::new(common::BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("b"))
        .args(args)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("stopped while it switched the catalog over"), "{said}");
}
