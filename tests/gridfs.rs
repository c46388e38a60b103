//! The gridfs engine behind the real binary: a PUT lands in MongoDB as a
//! GridFS file, a ranged GET is served from its chunks, and a restarted node
//! still serves it.

mod common;

use common::{Server, client, pattern, sha256_hex};
use mongodb::bson::{Bson, Document, doc};

#[tokio::test(flavor = "multi_thread")]
async fn a_blob_in_gridfs_is_served_in_ranges_and_after_a_restart() {
    let url = depot::engine::gridfs::fresh_test_url();
    let args = ["--engine", "gridfs", "--engine-url", &url, "--gridfs-chunk-size", "1000", "--gridfs-bucket", "media"];
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = Server::start_in(&data, &args);
    let http = client();
    let body = pattern(25_500, 1);
    let r = http.put(server.object_url("files", "a/b.bin")).body(body.clone()).send().await.unwrap();
    assert_eq!(r.status(), 201);

    // One GridFS file in bucket `media`, named by its SHA-256, in 26 chunks.
    let db = mongodb::Client::with_uri_str(&url).await.unwrap().default_database().unwrap();
    let file = db.collection::<Document>("media.files").find_one(doc! {}).await.unwrap().expect("a files document");
    assert_eq!(file.get_str("filename").unwrap(), sha256_hex(&body));
    assert_eq!(file.get("chunkSize"), Some(&Bson::Int32(1000)));
    assert_eq!(file.get("length"), Some(&Bson::Int64(25_500)));
    let chunks = db.collection::<Document>("media.chunks").count_documents(doc! {}).await.unwrap();
    assert_eq!(chunks, 26);

    let ranged = |server_url: String| {
        let http = http.clone();
        async move { http.get(server_url).header("range", "bytes=1999-12000").send().await.unwrap() }
    };
    let r = ranged(server.object_url("files", "a/b.bin")).await;
    assert_eq!(r.status(), 206);
    assert_eq!(r.headers()["content-range"], "bytes 1999-12000/25500");
    assert_eq!(r.bytes().await.unwrap(), body[1999..12_001]);

    assert!(server.stop().success());
    let restarted = Server::start_in(&data, &args);
    let r = http.get(restarted.object_url("files", "a/b.bin")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), body);
    let r = ranged(restarted.object_url("files", "a/b.bin")).await;
    assert_eq!(r.status(), 206);
    assert_eq!(r.bytes().await.unwrap(), body[1999..12_001]);
    restarted.assert_no_panic();
    drop(restarted);

    // Pointed at another bucket or database, the store would list objects
    // whose bytes are elsewhere: refused, naming both places.
    let other_db = depot::engine::gridfs::fresh_test_url();
    for (url, bucket) in [(url.as_str(), "other"), (other_db.as_str(), "media")] {
        let out = common::depot(&[
            "serve",
            "--data",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--engine",
            "gridfs",
            "--engine-url",
            url,
            "--gridfs-bucket",
            bucket,
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "started on {url} {bucket}: {err}");
        assert!(
            err.contains("keeps its bytes in the gridfs engine's database") && err.contains("bucket media"),
            "{err}"
        );
    }
    db.drop().await.unwrap();
}
