//! The engine's server going away under a depot node: the MongoDB wire
//! server (gridfs engine) and S3Proxy (s3 engine), each a private instance
//! on a port of its own, stopped under load and started again on the same
//! port and data. Clients get 503 with a message while it is down, nothing
//! acknowledged is lost, and the node recovers without a restart.
//! (PostgreSQL stopped, as catalog, is tests/postgres_outage.rs; made
//! silent through a proxy, it is here.)
//!
//! The MongoDB stand-in keeps its data in an H2 file, which it commits about
//! once a second and when stopped cleanly: it is stopped with SIGTERM (as
//! `pg_ctlcluster restart` stops PostgreSQL), because a SIGKILL could lose
//! its last second of writes, which would be the stand-in's loss, not
//! depot's. S3Proxy writes each object to a file before answering, so it is
//! killed with SIGKILL.

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Ledger, Server, client, pattern, sha256_hex};

/// A private backend server on a fixed port, stopped and started again on it.
struct Backend {
    name: &'static str,
    command: Vec<String>,
    port: u16,
    /// Readiness is an HTTP answer, not just an open port.
    http: bool,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run scripts/test.sh, which starts the test services and sets it")
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Backend {
    /// mongo-java-server with its data in an H2 file.
    fn mongo() -> Backend {
        let build = env("DEPOT_MONGO_BUILD");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let command = vec![
            "java".into(),
            "-Xmx512m".into(),
            "-cp".into(),
            format!("{build}/classes:{build}/lib/*"),
            "MongoLauncher".into(),
            port.to_string(),
            dir.path().join("mongo.h2").display().to_string(),
        ];
        Backend { name: "mongo", command, port, http: false, child: None, dir }
    }

    /// S3Proxy over a directory, with the shared instance's credentials.
    fn s3proxy() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let properties = dir.path().join("s3proxy.properties");
        std::fs::write(
            &properties,
            format!(
                "s3proxy.endpoint=http://127.0.0.1:{port}\ns3proxy.authorization=aws-v2-or-v4\n\
                 s3proxy.identity={}\ns3proxy.credential={}\njclouds.provider=filesystem\n\
                 jclouds.filesystem.basedir={}\n",
                env("DEPOT_TEST_S3_ACCESS_KEY"),
                env("DEPOT_TEST_S3_SECRET_KEY"),
                data.display()
            ),
        )
        .unwrap();
        let command = vec![
            "java".into(),
            "-Xmx512m".into(),
            "-jar".into(),
            env("DEPOT_S3PROXY_JAR"),
            "--properties".into(),
            properties.display().to_string(),
        ];
        Backend { name: "s3proxy", command, port, http: true, child: None, dir }
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn ready(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        if !self.http {
            return true;
        }
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut head = [0u8; 8];
        s.write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").is_ok()
            && s.read_exact(&mut head).is_ok()
            && head.starts_with(b"HTTP/1.")
    }

    /// Starts the server and waits until it answers.
    fn start(&mut self) {
        assert!(self.child.is_none());
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log()).unwrap();
        let child = Command::new(&self.command[0])
            .args(&self.command[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !self.ready() {
            let exited = self.child.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                panic!(
                    "{} did not start ({exited:?}); log:\n{}",
                    self.name,
                    std::fs::read_to_string(self.log()).unwrap()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `signal` (`TERM`, `STOP`, ...).
    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id().to_string();
        let ok = Command::new("kill").arg(format!("-{signal}")).arg(pid).status().unwrap();
        assert!(ok.success());
    }

    /// Sends `signal` (`TERM`, `KILL`) and waits for the process to end.
    fn stop(&mut self, signal: &str) {
        self.signal(signal);
        self.child.take().expect("running").wait().unwrap();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What one writer saw: acknowledged writes and when the 503s came.
#[derive(Default)]
struct Seen {
    acked: usize,
    unavailable: Vec<Instant>,
    acked_at: Vec<Instant>,
}

/// Four writers overwriting keys until `stop`: only 2xx and 503 allowed.
fn writers(base: &str, ledger: &Ledger, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Seen>> {
    (0..4u64)
        .map(|w| {
            let (base, ledger, stop) = (base.to_string(), ledger.clone(), stop.clone());
            tokio::spawn(async move {
                let http = client();
                let mut seen = Seen::default();
                for i in 0u64.. {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let key = format!("w{w}/k{}", i % 30);
                    let body = pattern(500 + (i as usize % 5) * 40_000, w * 1000 + i);
                    let sha = sha256_hex(&body);
                    ledger.sending(&key, &sha);
                    let r = http.put(format!("{base}/files/{key}")).body(body).send().await.unwrap();
                    if r.status().is_success() {
                        ledger.acked(&key, &sha);
                        seen.acked += 1;
                        seen.acked_at.push(Instant::now());
                    } else {
                        assert_eq!(r.status(), 503, "only 503 while the engine's server is away");
                        let body: serde_json::Value = r.json().await.unwrap();
                        assert_eq!(body["error"], "ServiceUnavailable");
                        assert!(body["message"].as_str().unwrap().contains("unavailable"), "{body}");
                        seen.unavailable.push(Instant::now());
                    }
                }
                seen
            })
        })
        .collect()
}

/// PUTs until one is accepted: the node recovered by itself.
async fn put_until_accepted(server: &Server, name: &str) {
    let started = Instant::now();
    loop {
        let r = client().put(server.object_url("files", "after")).body("back").send().await.unwrap();
        if r.status().is_success() {
            return;
        }
        assert_eq!(r.status(), 503);
        assert!(started.elapsed() < Duration::from_secs(30), "the node did not recover after {name} returned");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the node over `backend` with `args`, stops the backend with
/// `signal` under load, then down for good, and checks everything.
async fn outage(mut backend: Backend, args: &[&str], signal: &'static str) {
    let name = backend.name;
    let server = Server::start(args);
    let http = client();
    let ledger = Ledger::default();
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = writers(&server.url, &ledger, &stop);

    tokio::time::sleep(Duration::from_secs(1)).await;
    let down = Instant::now();
    let mut backend = tokio::task::spawn_blocking(move || {
        backend.stop(signal);
        std::thread::sleep(Duration::from_secs(3));
        backend.start();
        backend
    })
    .await
    .unwrap();
    let up = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    let mut seen = Seen::default();
    for t in tasks {
        let s = t.await.unwrap();
        seen.acked += s.acked;
        seen.unavailable.extend(s.unavailable);
        seen.acked_at.extend(s.acked_at);
    }
    let first_ack_after = seen.acked_at.iter().filter(|t| **t > up).min().map(|t| *t - up);
    let span = match (seen.unavailable.iter().min(), seen.unavailable.iter().max()) {
        (Some(a), Some(b)) => format!("503s from {:?} to {:?} after the stop", *a - down, *b - down),
        _ => "no 503".into(),
    };
    eprintln!(
        "{name}: {} writes acknowledged, {} answered 503 ({span}); down for {:?} (stop, 3 s, start); \
         first write acknowledged {first_ack_after:?} after it was back",
        seen.acked,
        seen.unavailable.len(),
        up - down
    );
    assert!(ledger.acked_count() > 20, "too few writes to mean anything");
    let first_ack_after = first_ack_after.expect("no write was acknowledged after the server came back");
    assert!(first_ack_after < Duration::from_secs(3));
    let present = ledger.assert_survivors(&server.url).await;
    let (some_key, some_digest) = present.into_iter().next().expect("a key holds an object");
    let doomed = server.object_url("files", "doomed");
    assert!(http.put(&doomed).body("bytes").send().await.unwrap().status().is_success());
    // Written and never read: its bytes are in the backend alone.
    let unread = server.object_url("files", "unread");
    assert!(http.put(&unread).body(pattern(70_000, 11)).send().await.unwrap().status().is_success());

    // Down for good: writes and reads fail fast with 503 and a message.
    backend = tokio::task::spawn_blocking(move || {
        backend.stop(signal);
        backend
    })
    .await
    .unwrap();
    for (what, request) in [
        ("a write", http.put(server.object_url("files", "while-down")).body(pattern(70_000, 9))),
        ("a read", http.get(&unread)),
    ] {
        let started = Instant::now();
        let r = request.send().await.unwrap();
        let waited = started.elapsed();
        assert_eq!(r.status(), 503, "{what} while {name} is down");
        let body: serde_json::Value = r.json().await.unwrap();
        assert!(body["message"].as_str().unwrap().contains("unavailable"), "{body}");
        eprintln!("{name} down: {what} answered 503 in {waited:?}: {}", body["message"]);
        assert!(waited < Duration::from_secs(20), "a dead {name} took {waited:?} to report");
    }
    // A small object read lately is answered from memory, where its digest
    // names its bytes.
    let hot = http.get(server.object_url("files", &some_key)).send().await.unwrap();
    assert_eq!(hot.status(), 200, "a read of a hot object while {name} is down");
    assert_eq!(sha256_hex(&hot.bytes().await.unwrap()), some_digest);
    // What needs the catalog only goes on: unlike a catalog outage
    // (tests/postgres_outage.rs), an engine outage leaves names readable,
    // and deletes take effect (the bytes go at the next collection).
    let head = http.head(server.object_url("files", &some_key)).send().await.unwrap();
    assert_eq!(head.status(), 200, "a HEAD while {name} is down");
    assert_eq!(http.get(format!("{}/files", server.url)).send().await.unwrap().status(), 200, "a listing");
    assert!(http.delete(&doomed).send().await.unwrap().status().is_success(), "a delete while {name} is down");
    backend = tokio::task::spawn_blocking(move || {
        backend.start();
        backend
    })
    .await
    .unwrap();
    let back = Instant::now();
    put_until_accepted(&server, name).await;
    eprintln!("{name} back: the first write succeeded {:?} after it answered again", back.elapsed());
    ledger.assert_survivors(&server.url).await;
    assert_eq!(http.get(server.object_url("files", "while-down")).send().await.unwrap().status(), 404);
    assert_eq!(http.get(&doomed).send().await.unwrap().status(), 404);

    // A hang: the process stopped (SIGSTOP), its connections open and
    // silent. Requests wait for it a bounded time, then answer 503.
    backend.signal("STOP");
    let started = Instant::now();
    let write = tokio::spawn(http.put(server.object_url("files", "hung")).body(pattern(70_000, 10)).send());
    let read = tokio::spawn(http.get(&unread).send());
    let (write, read) = (write.await.unwrap().unwrap(), read.await.unwrap().unwrap());
    let waited = started.elapsed();
    eprintln!("{name} hung: the write answered {}, the read {}, after {waited:?}", write.status(), read.status());
    assert_eq!((write.status().as_u16(), read.status().as_u16()), (503, 503), "while {name} hangs");
    assert!(waited < Duration::from_secs(45), "a hung {name} held requests for {waited:?}");
    // The connections that did not answer are gone: the next request waits
    // no longer than the first, though every new connection hangs too.
    let started = Instant::now();
    let again = http.get(&unread).send().await.unwrap();
    let waited_again = started.elapsed();
    eprintln!("{name} hung: the next read answered {} after {waited_again:?}", again.status());
    assert_eq!(again.status(), 503, "the next read while {name} hangs");
    assert!(waited_again < waited + Duration::from_secs(5), "the next read waited {waited_again:?}");
    backend.signal("CONT");
    let resumed = Instant::now();
    put_until_accepted(&server, name).await;
    eprintln!("{name} resumed: the first write succeeded {:?} after", resumed.elapsed());
    ledger.assert_survivors(&server.url).await;
    server.assert_no_panic();
    backend.stop("TERM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mongodb_restart_under_load_loses_nothing_and_the_node_recovers() {
    let mut backend = Backend::mongo();
    backend.start();
    let url = format!("mongodb://127.0.0.1:{}/depot_outage", backend.port);
    outage(backend, &["--engine", "gridfs", "--engine-url", &url], "TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_s3_restart_under_load_loses_nothing_and_the_node_recovers() {
    let mut backend = Backend::s3proxy();
    backend.start();
    let endpoint = format!("http://127.0.0.1:{}", backend.port);
    let config = depot::engine::S3Config {
        bucket: Some("outage".into()),
        region: None,
        access_key: Some(env("DEPOT_TEST_S3_ACCESS_KEY")),
        secret_key: Some(env("DEPOT_TEST_S3_SECRET_KEY")),
    };
    depot::engine::s3::create_bucket(Some(&endpoint), &config).await.unwrap();
    let (access, secret) = (config.access_key.unwrap(), config.secret_key.unwrap());
    let args = [
        "--engine",
        "s3",
        "--engine-url",
        &endpoint,
        "--s3-bucket",
        "outage",
        "--s3-access-key",
        &access,
        "--s3-secret-key",
        &secret,
    ];
    outage(backend, &args, "KILL").await;
}

/// A TCP proxy to the PostgreSQL test server that can be made to go silent:
/// connections stay open and new ones are taken, but nothing passes. Gives
/// the proxied URL of `url`, and the switch.
async fn silenceable_proxy(url: &str) -> (String, Arc<AtomicBool>) {
    let at = url.find('@').expect("a URL with credentials") + 1;
    let end = at + url[at..].find('/').expect("a URL with a database");
    let upstream = url[at..end].to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxied = format!("{}{}{}", &url[..at], listener.local_addr().unwrap(), &url[end..]);
    let silent = Arc::new(AtomicBool::new(false));
    let quiet = silent.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { continue };
            let (client, server) = (client.into_split(), server.into_split());
            for (mut from, mut to) in [(client.0, server.1), (server.0, client.1)]
                .map(|(r, w)| (Box::new(r) as Box<dyn tokio::io::AsyncRead + Unpin + Send>, w))
            {
                let quiet = quiet.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0; 64 * 1024];
                    while let Ok(n @ 1..) = from.read(&mut buf).await {
                        while quiet.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        if to.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    });
    (proxied, silent)
}

/// A PostgreSQL catalog that takes connections but stops answering: every
/// request waits at most its limit (15 s) and gets 503, the second as the
/// first, though the connections it would make anew hang too; the node
/// recovers once the server answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_postgres_catalog_is_503_within_the_limit_every_time() {
    let url = depot::pg::fresh_test_database().await;
    let (proxied, silent) = silenceable_proxy(&url).await;
    let server = Server::start(&["--catalog", &proxied, "--engine", "fs"]);
    let http = client();
    let r = http.put(server.object_url("files", "kept")).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201);
    silent.store(true, Ordering::SeqCst);
    for round in 0..2 {
        let started = Instant::now();
        let r = http.get(server.object_url("files", &format!("unknown-{round}"))).send().await.unwrap();
        let waited = started.elapsed();
        eprintln!("silent catalog: request {round} answered {} after {waited:?}", r.status());
        assert_eq!(r.status(), 503, "request {round}");
        assert!(waited < Duration::from_secs(18), "request {round} waited {waited:?}");
    }
    silent.store(false, Ordering::SeqCst);
    put_until_accepted(&server, "PostgreSQL").await;
    let r = http.get(server.object_url("files", "kept")).send().await.unwrap();
    assert_eq!(r.text().await.unwrap(), "kept");
    server.assert_no_panic();
}

/// A postgres engine that takes connections but stops answering holds
/// `/_/stats`, which asks it for its tables' size, no longer than any
/// other request (it had a table scan's ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_postgres_engine_is_503_on_stats_within_the_limit() {
    let url = depot::pg::fresh_test_database().await;
    let (proxied, silent) = silenceable_proxy(&url).await;
    let server = Server::start(&["--engine", "postgres", "--engine-url", &proxied]);
    let http = client();
    let stats = format!("{}/_/stats", server.url);
    assert_eq!(http.get(&stats).send().await.unwrap().status(), 200);
    silent.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let r = http.get(&stats).send().await.unwrap();
    let waited = started.elapsed();
    assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
    assert!(waited < Duration::from_secs(18), "stats waited {waited:?}");
    silent.store(false, Ordering::SeqCst);
    server.assert_no_panic();
}
