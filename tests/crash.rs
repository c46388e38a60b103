//! Crash test: for each embedded engine, start the server, run a mixed
//! concurrent load (new keys, overwrites, deletes, batch puts, multipart
//! uploads through the S3 API), SIGKILL the server at a random moment,
//! restart it and check every key against a model of what was acknowledged:
//!
//! - an acknowledged write reads back byte-identical (SHA-256);
//! - an acknowledged delete stays deleted;
//! - an unacknowledged operation is wholly there or wholly absent, and an
//!   unacknowledged batch is all there or all absent;
//! - every few rounds, and at the end, `depot gc --gc-grace 0` then
//!   `depot verify` finds nothing wrong.
//!
//! `DEPOT_CRASH_ITERATIONS` sets the rounds per engine (default 50);
//! `DEPOT_CRASH_SEED` replays a run.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Server, client, depot, files_under, sha256_hex, sqlite_count};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const ACCESS_KEY: &str = "crash";
const SECRET_KEY: &str = "crash-test-secret";
const WRITERS: usize = 4;
/// Keys each writer overwrites and deletes; new keys come on top.
const KEYS_PER_WRITER: u64 = 12;
/// Sizes on both sides of the hybrid engine's inline threshold and across
/// engines' chunk boundaries.
const SIZES: [usize; 7] = [0, 1, 700, 30_000, 70_000, 300_000, 1_500_000];
/// S3's smallest part but the last.
const PART: usize = 5 * 1024 * 1024;

/// What a key may hold after the crash (SHA-256s; `None`: absent).
#[derive(Clone, Debug, Default)]
struct KeyState {
    acked: Option<String>,
    /// An operation sent but not acknowledged when the server died: its
    /// outcome, and the batch it belongs to.
    in_flight: Option<(Option<String>, Option<u64>)>,
}

#[derive(Clone, Default)]
struct Model {
    keys: Arc<Mutex<HashMap<String, KeyState>>>,
    acks: Arc<Mutex<u64>>,
}

impl Model {
    fn sending(&self, key: &str, outcome: Option<String>, batch: Option<u64>) {
        self.keys.lock().unwrap().entry(key.to_string()).or_default().in_flight = Some((outcome, batch));
    }

    fn acked(&self, key: &str, outcome: Option<String>) {
        self.keys.lock().unwrap().insert(key.to_string(), KeyState { acked: outcome, in_flight: None });
        *self.acks.lock().unwrap() += 1;
    }

    /// What a key holds as far as the model is sure.
    fn held(&self, key: &str) -> Option<String> {
        self.keys.lock().unwrap().get(key).and_then(|s| s.acked.clone())
    }

    /// Reads every key back and checks it; then takes what was read as
    /// acknowledged for the next round.
    async fn check(&self, base: &str, round: usize) {
        let keys = self.keys.lock().unwrap().clone();
        let http = client();
        let mut seen = HashMap::new();
        for (key, state) in &keys {
            let r = http.get(format!("{base}/files/{key}")).bearer_auth(SECRET_KEY).send().await.unwrap();
            let got = match r.status().as_u16() {
                404 => None,
                200 => Some(sha256_hex(&r.bytes().await.unwrap())),
                s => panic!("round {round}: {key} answered {s}"),
            };
            let in_flight = state.in_flight.as_ref().map(|(outcome, _)| outcome);
            assert!(
                got == state.acked || in_flight == Some(&got),
                "round {round}: {key} holds {got:?}; acknowledged {:?}, in flight {in_flight:?}",
                state.acked
            );
            seen.insert(key.clone(), got);
        }
        // A batch not acknowledged is all there or not at all.
        let mut batches: HashMap<u64, Vec<bool>> = HashMap::new();
        for (key, state) in &keys {
            if let Some((outcome, Some(batch))) = &state.in_flight {
                batches.entry(*batch).or_default().push(seen[key] == *outcome && *outcome != state.acked);
            }
        }
        for (batch, landed) in batches {
            assert!(landed.iter().all(|l| *l) || !landed.iter().any(|l| *l), "round {round}: batch {batch} half there");
        }
        let mut model = self.keys.lock().unwrap();
        for (key, got) in seen {
            model.insert(key, KeyState { acked: got, in_flight: None });
        }
    }
}

fn body(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

fn s3_client(base: &str) -> impl ObjectStore {
    let retry = RetryConfig { max_retries: 0, ..RetryConfig::default() };
    AmazonS3Builder::new()
        .with_endpoint(base)
        .with_allow_http(true)
        .with_bucket_name("files")
        .with_region("us-east-1")
        .with_access_key_id(ACCESS_KEY)
        .with_secret_access_key(SECRET_KEY)
        .with_virtual_hosted_style_request(false)
        .with_retry(retry)
        .with_client_options(ClientOptions::new().with_timeout(Duration::from_secs(30)))
        .build()
        .unwrap()
}

/// One writer's operations on its own keys, until the server dies.
async fn writer(base: String, w: usize, seed: u64, model: Model) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = client();
    let s3 = s3_client(&base);
    for op in 0u64.. {
        let pick: u32 = rng.random_range(0..100);
        let ok = if pick < 55 {
            // A put, to a new key or over an old one.
            let key = if pick < 25 {
                format!("w{w}/new-{seed}-{op}")
            } else {
                format!("w{w}/k{}", rng.random_range(0..KEYS_PER_WRITER))
            };
            let len = SIZES[rng.random_range(0..SIZES.len())];
            let data = body(&mut rng, len);
            let sha = sha256_hex(&data);
            model.sending(&key, Some(sha.clone()), None);
            let r = http.put(format!("{base}/files/{key}")).bearer_auth(SECRET_KEY).body(data).send().await;
            r.is_ok_and(|r| r.status().is_success()).then(|| model.acked(&key, Some(sha))).is_some()
        } else if pick < 75 {
            let key = format!("w{w}/k{}", rng.random_range(0..KEYS_PER_WRITER));
            model.sending(&key, None, None);
            let r = http.delete(format!("{base}/files/{key}")).bearer_auth(SECRET_KEY).send().await;
            match r.map(|r| r.status().as_u16()) {
                Ok(204) => {
                    model.acked(&key, None);
                    true
                }
                // Absent already: the model must agree.
                Ok(404) => {
                    assert_eq!(model.held(&key), None, "{key}: delete answered 404 for a key the model holds");
                    model.acked(&key, None);
                    true
                }
                _ => false,
            }
        } else if pick < 92 {
            // A batch of new keys, all or nothing.
            let batch = seed.wrapping_add(op);
            let mut payload = Vec::new();
            let mut entries = Vec::new();
            for i in 0..rng.random_range(2..8) {
                let key = format!("w{w}/batch-{batch}-{i}");
                let len = SIZES[rng.random_range(0..5)];
                let data = body(&mut rng, len);
                payload.extend_from_slice(format!("{key}\n{}\n", data.len()).as_bytes());
                payload.extend_from_slice(&data);
                payload.push(b'\n');
                let sha = sha256_hex(&data);
                model.sending(&key, Some(sha.clone()), Some(batch));
                entries.push((key, sha));
            }
            let r = http
                .post(format!("{base}/_/batch/put?bucket=files"))
                .bearer_auth(SECRET_KEY)
                .body(payload)
                .send()
                .await;
            let ok = r.is_ok_and(|r| r.status().is_success());
            if ok {
                for (key, sha) in entries {
                    model.acked(&key, Some(sha));
                }
            }
            ok
        } else {
            // A multipart upload of two parts through the S3 API.
            let key = format!("w{w}/k{}", rng.random_range(0..KEYS_PER_WRITER));
            let len = PART + rng.random_range(1..200_000);
            let data = body(&mut rng, len);
            let sha = sha256_hex(&data);
            model.sending(&key, Some(sha.clone()), None);
            let upload = async {
                let mut upload = s3.put_multipart(&ObjectPath::from(key.as_str())).await?;
                upload.put_part(PutPayload::from(data[..PART].to_vec())).await?;
                upload.put_part(PutPayload::from(data[PART..].to_vec())).await?;
                upload.complete().await
            };
            upload.await.is_ok().then(|| model.acked(&key, Some(sha))).is_some()
        };
        if !ok {
            return;
        }
    }
}

/// `depot gc --gc-grace 0` then `depot verify` on the stopped store: both
/// succeed and verification finds nothing.
fn gc_then_verify(data: &std::path::Path, engine: &str, round: usize) {
    let data = data.to_str().unwrap();
    let gc = depot(&["gc", "--data", data, "--engine", engine, "--gc-grace", "0"]);
    assert!(gc.status.success(), "round {round}: gc failed: {}", String::from_utf8_lossy(&gc.stderr));
    let verify = depot(&["verify", "--data", data, "--engine", engine]);
    assert!(
        verify.status.success(),
        "round {round}: verify found problems:\n{}{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}

async fn crash_test(engine: &str) {
    let iterations: usize = std::env::var("DEPOT_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let seed: u64 = std::env::var("DEPOT_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(rand::random);
    println!("{engine}: {iterations} rounds, DEPOT_CRASH_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = ["--engine", engine, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY];
    let model = Model::default();
    for round in 0..iterations {
        let mut server = Server::start_in(&data, &flags);
        let writers: Vec<_> =
            (0..WRITERS).map(|w| tokio::spawn(writer(server.url.clone(), w, rng.random(), model.clone()))).collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(150..900))).await;
        server.kill9();
        for w in writers {
            w.await.unwrap();
        }
        if round % 10 == 9 {
            gc_then_verify(&data, engine, round);
        }
        let restarted = Server::start_in(&data, &flags);
        model.check(&restarted.url, round).await;
        restarted.assert_no_panic();
        drop(restarted);
    }
    // Staging space is empty after a restart: sqlite stages chunks in its
    // database, the others files in a directory.
    let restarted = Server::start_in(&data, &flags);
    if engine == "sqlite" {
        let stray = "SELECT count(*) FROM chunks WHERE id NOT IN (SELECT id FROM blobs)";
        assert_eq!(sqlite_count(&data.join("sqlite/blobs.sqlite"), stray), 0, "sqlite: staged chunks survived");
    } else {
        let tmp = data.join(engine).join(if engine == "hybrid" { "files/tmp" } else { "tmp" });
        assert!(files_under(&tmp).is_empty(), "{engine}: staging files survived a restart");
    }
    drop(restarted);
    gc_then_verify(&data, engine, iterations);
    let acks = *model.acks.lock().unwrap();
    assert!(acks as usize >= 2 * iterations, "{engine}: only {acks} operations acknowledged in {iterations} rounds");
    println!("{engine}: {iterations} kills, {acks} acknowledged operations checked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_hybrid() {
    crash_test("hybrid").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_fs() {
    crash_test("fs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_rocksdb() {
    crash_test("rocksdb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn crash_sqlite() {
    crash_test("sqlite").await;
}
