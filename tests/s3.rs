//! The s3 engine behind a running depot: objects survive a restart, ranges
//! are served, collected blobs leave the bucket, and a store that is down
//! turns requests into 503s while the node itself stays up.

mod common;

use std::time::{Duration, Instant};

use common::{Server, client, pattern, sha256_hex};
use depot::engine::s3::{S3Engine, fresh_test_bucket, test_server};
use depot::engine::{BlobEngine, BlobRef, Digest};

fn s3_args<'a>(endpoint: &'a str, bucket: &'a str, keys: &'a (String, String)) -> Vec<&'a str> {
    vec![
        "--engine",
        "s3",
        "--engine-url",
        endpoint,
        "--s3-bucket",
        bucket,
        "--s3-access-key",
        &keys.0,
        "--s3-secret-key",
        &keys.1,
    ]
}

fn keys_of(config: &depot::engine::S3Config) -> (String, String) {
    (config.access_key.clone().unwrap_or_default(), config.secret_key.clone().unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn objects_in_s3_are_served_ranged_survive_a_restart_and_are_collected() {
    let bucket = fresh_test_bucket().await;
    let (endpoint, config) = test_server(&bucket);
    let keys = keys_of(&config);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut args = s3_args(&endpoint, &bucket, &keys);
    args.extend(["--gc-grace", "0", "--gc-interval", "1"]);
    let http = client();

    // One blob of a single PUT, one large enough for a multipart upload.
    let small = pattern(300_000, 1);
    let large = pattern(9 * 1024 * 1024 + 5, 2);
    let mut server = Server::start_in(&data, &args);
    for (key, body) in [("small", &small), ("large", &large)] {
        let r = http.put(server.object_url("files", key)).body(body.clone()).send().await.unwrap();
        assert!(r.status().is_success(), "PUT {key}: {}", r.status());
    }
    let r =
        http.get(server.object_url("files", "large")).header("Range", "bytes=8388600-8388707").send().await.unwrap();
    assert_eq!(r.status(), 206);
    assert!(r.bytes().await.unwrap() == large[8_388_600..8_388_708]);
    assert!(server.stop().success());

    let server = Server::start_in(&data, &args);
    for (key, body) in [("small", &small), ("large", &large)] {
        let r = http.get(server.object_url("files", key)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.bytes().await.unwrap() == body[..], "{key} after a restart");
    }

    // Deleted, then collected: the object leaves the bucket.
    let engine = S3Engine::connect(Some(&endpoint), &config).await.unwrap();
    let digest = Digest::from_hex(&sha256_hex(&small)).unwrap();
    let blob = BlobRef { digest, size: small.len() as u64, locator: Vec::new() };
    assert_eq!(engine.stat(&blob).await.unwrap(), Some(small.len() as u64));
    assert_eq!(http.delete(server.object_url("files", "small")).send().await.unwrap().status(), 204);
    let deadline = Instant::now() + Duration::from_secs(15);
    while engine.stat(&blob).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the deleted blob stayed in the bucket");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let listed = engine.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].digest, Digest::from_hex(&sha256_hex(&large)).unwrap());
    server.assert_no_panic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_that_is_down_answers_503_and_the_node_stays_up() {
    let bucket = fresh_test_bucket().await;
    let (endpoint, config) = test_server(&bucket);
    let keys = keys_of(&config);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let http = client();
    // An object the catalog knows, so that reading it needs the store.
    let mut server = Server::start_in(&data, &s3_args(&endpoint, &bucket, &keys));
    let r = http.put(server.object_url("files", "kept")).body(pattern(1000, 3)).send().await.unwrap();
    assert!(r.status().is_success());
    assert!(server.stop().success());

    // Nothing listens on port 1.
    let server = Server::start_in(&data, &s3_args("http://127.0.0.1:1", &bucket, &keys));
    let started = Instant::now();
    let put = http.put(server.object_url("files", "new")).body(pattern(1000, 4)).send().await.unwrap();
    let get = http.get(server.object_url("files", "kept")).send().await.unwrap();
    for (what, r) in [("PUT", put), ("GET", get)] {
        assert_eq!(r.status(), 503, "{what}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["error"], "ServiceUnavailable", "{what}: {body}");
        assert!(body["message"].as_str().unwrap().contains("unavailable"), "{what}: {body}");
    }
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    let health = http.get(format!("{}/_/health", server.url)).send().await.unwrap();
    assert_eq!(health.status(), 200);
    server.assert_no_panic();
}
