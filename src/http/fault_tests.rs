//! Injected faults seen through HTTP: a store over fault-injecting engine
//! and catalog wrappers, served on a local port by [`serve`] as `depot
//! serve` does, and asked over real connections.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::{App, Limits, serve};
use crate::catalog::faulty::CatalogFaults;
use crate::config::Credential;
use crate::engine::EngineKind;
use crate::engine::faulty::{EngineFaults, Trigger};
use crate::store::StoreConfig;
use crate::store::model_tests::open_faulty;

/// A node serving a faulty store on a local port.
struct Node {
    url: String,
    engine: Arc<EngineFaults>,
    catalog: Arc<CatalogFaults>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Node {
    async fn start(data: &Path) -> Node {
        Node::start_with(data, &[]).await
    }

    async fn start_with(data: &Path, credentials: &[Credential]) -> Node {
        let (store, engine, catalog) = open_faulty(data, EngineKind::Hybrid, 7, StoreConfig::default()).await;
        let listen = "0.0.0.0:0".parse().unwrap();
        let app = Arc::new(App::new(store, Limits::default(), credentials, None, listen, &[]).unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(serve(
            listener,
            app,
            2,
            async move {
                let _ = stopped.await;
            },
            Duration::from_secs(5),
        ));
        Node { url, engine, catalog, stop, task }
    }

    /// Stops serving and lets go of the store: with [`Node::start`] on the
    /// same directory, a restart.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }

    fn object(&self, key: &str) -> String {
        format!("{}/files/{key}", self.url)
    }
}

/// A fresh client per call: no pooled connection outlives a node.
async fn put(url: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new().put(url).body(body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

async fn get(url: &str) -> (u16, Vec<u8>) {
    let r = reqwest::Client::new().get(url).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.bytes().await.unwrap().to_vec())
}

fn big(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect()
}

/// Files of the hybrid engine's file tier under `dir`, staging included.
fn files(dir: &Path) -> usize {
    walk(&dir.join("engine").join("files"))
}

fn walk(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| if e.path().is_dir() { walk(&e.path()) } else { 1 }).sum::<usize>())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_device_is_507_with_no_partial_object_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let old = big(300_000, 1);
    assert_eq!(put(&node.object("old"), old.clone()).await.0, 201);
    assert_eq!(put(&node.object("small"), b"tiny".to_vec()).await.0, 201);
    let before = files(dir.path());
    assert!(before > 0, "the large object is a file");

    // Out of space at the first byte, then in the middle of a large body.
    for trigger in [Trigger::Always, Trigger::After(2)] {
        node.engine.writes.set(trigger);
        let (status, body) = put(&node.object("new"), big(2_000_000, 2)).await;
        assert_eq!(status, 507, "{trigger:?}: {body}");
        assert_eq!(body["error"], "InsufficientStorage");
        assert!(body["message"].as_str().unwrap().contains("no space"), "{body}");
        assert_eq!(get(&node.object("new")).await.0, 404, "{trigger:?}: a partial object is visible");
        assert_eq!(get(&node.object("old")).await, (200, old.clone()));
        assert_eq!(get(&node.object("small")).await, (200, b"tiny".to_vec()));
    }
    // Overwriting fails the same way and keeps the old body.
    node.engine.writes.set(Trigger::After(1));
    assert_eq!(put(&node.object("old"), big(500_000, 3)).await.0, 507);
    assert_eq!(get(&node.object("old")).await, (200, old));
    assert_eq!(files(dir.path()), before, "a failed upload left bytes behind");

    node.engine.writes.set(Trigger::Never);
    assert_eq!(put(&node.object("new"), big(2_000_000, 2)).await.0, 201);
    assert_eq!(get(&node.object("new")).await, (200, big(2_000_000, 2)));
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_fsync_is_503_and_writes_stay_refused_until_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    assert_eq!(put(&node.object("kept"), b"kept".to_vec()).await.0, 201);
    node.engine.syncs.set(Trigger::Always);
    let (status, body) = put(&node.object("lost"), big(100_000, 1)).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"], "ServiceUnavailable");
    assert!(body["message"].as_str().unwrap().contains("fsync"), "{body}");

    // The device works again, but the store does not retry: every write
    // is refused, reads go on.
    node.engine.syncs.set(Trigger::Never);
    let (status, body) = put(&node.object("after"), b"x".to_vec()).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["message"].as_str().unwrap().contains("restart"), "{body}");
    let deleted = reqwest::Client::new().delete(node.object("kept")).send().await.unwrap();
    assert_eq!(deleted.status(), 503);
    assert_eq!(get(&node.object("kept")).await, (200, b"kept".to_vec()));
    assert_eq!(get(&node.object("lost")).await.0, 404);

    node.stop().await;
    let node = Node::start(dir.path()).await;
    assert_eq!(put(&node.object("after"), b"x".to_vec()).await.0, 201);
    assert_eq!(get(&node.object("kept")).await, (200, b"kept".to_vec()));
    assert_eq!(get(&node.object("lost")).await.0, 404);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn io_errors_fail_the_request_with_a_500_and_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path()).await;
    let body = big(400_000, 5);
    assert_eq!(put(&node.object("k"), body.clone()).await.0, 201);

    node.engine.reads.set(Trigger::Always);
    let r = reqwest::Client::new().get(node.object("k")).send().await.unwrap();
    assert_eq!(r.status(), 500);
    let json: serde_json::Value = r.json().await.unwrap();
    assert_eq!(json["error"], "InternalError");
    assert!(json["message"].as_str().unwrap().contains("injected read failure"), "{json}");

    // Failing after the status went out: the connection is cut, the body
    // never ends as if it were whole.
    node.engine.reads.set(Trigger::After(2));
    let r = reqwest::Client::new().get(node.object("k")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.is_err(), "a body cut by a read failure looked complete");
    node.engine.reads.set(Trigger::Never);

    node.catalog.reads.set(Trigger::Always);
    let r = reqwest::Client::new().get(node.object("k")).send().await.unwrap();
    assert_eq!(r.status(), 500);
    let json: serde_json::Value = r.json().await.unwrap();
    assert!(json["message"].as_str().unwrap().contains("injected catalog read failure"), "{json}");
    node.catalog.reads.set(Trigger::Never);

    node.catalog.commits.set(Trigger::Always);
    let (status, json) = put(&node.object("k"), big(1000, 6)).await;
    assert_eq!(status, 500, "{json}");
    assert!(json["message"].as_str().unwrap().contains("injected catalog commit failure"), "{json}");
    let deleted = reqwest::Client::new().delete(node.object("k")).send().await.unwrap();
    assert_eq!(deleted.status(), 500);
    node.catalog.commits.set(Trigger::Never);
    assert_eq!(get(&node.object("k")).await, (200, body), "a failed write changed the object");

    // A batch get answers a failure of its first window with its status,
    // not with a 200 cut short.
    assert_eq!(put(&node.object("small"), b"never read".to_vec()).await.0, 201);
    let batch = format!("{}/_/batch/get?bucket=files", node.url);
    for faults in [&node.engine.reads, &node.catalog.reads] {
        faults.set(Trigger::Always);
        let r = reqwest::Client::new().post(&batch).body("small\n").send().await.unwrap();
        assert_eq!(r.status(), 500);
        let json: serde_json::Value = r.json().await.unwrap();
        assert!(json["message"].as_str().unwrap().contains("injected"), "{json}");
        faults.set(Trigger::Never);
    }
    let r = reqwest::Client::new().post(&batch).body("small\n").send().await.unwrap();
    assert_eq!(r.bytes().await.unwrap(), &b"10\nnever read\n"[..]);
    node.stop().await;
}

/// A bucket whose owner cannot be looked up is no one's to use: a caller
/// is refused while the catalog cannot say whose it is, rather than let
/// through to a write that the catalog may take by then.
#[tokio::test(flavor = "multi_thread")]
async fn a_bucket_whose_owner_cannot_be_read_refuses_other_accounts() {
    let dir = tempfile::tempdir().unwrap();
    let account = |name: &str| Credential { access_key: name.into(), secret_key: format!("{name}-secret") };
    let (alice, bob) = (account("alice"), account("bob"));
    let node = Node::start_with(dir.path(), &[KEY.clone(), alice.clone(), bob.clone()]).await;
    let http = reqwest::Client::new();
    let bearer = |c: &Credential| format!("Bearer {}", c.secret_key);
    let url = format!("{}/alices", node.url);
    let r = http.put(&url).header("authorization", bearer(&alice)).send().await.unwrap();
    assert_eq!(r.status(), 201);
    let r = http.put(format!("{url}/k")).header("authorization", bearer(&alice)).body("kept").send().await.unwrap();
    assert_eq!(r.status(), 201);

    // Lookups fail; the batch delete itself, one commit, would not.
    node.catalog.reads.set(Trigger::Always);
    let r = http
        .post(format!("{}/_/batch/delete?bucket=alices", node.url))
        .header("authorization", bearer(&bob))
        .body("k\n")
        .send()
        .await
        .unwrap();
    let status = r.status();
    assert!(status.is_server_error(), "{status}: {}", r.text().await.unwrap());
    node.catalog.reads.set(Trigger::Never);
    let r = http.get(format!("{url}/k")).header("authorization", bearer(&alice)).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.text().await.unwrap()), (200, "kept".to_string()));
    node.stop().await;
}

static KEY: std::sync::LazyLock<Credential> =
    std::sync::LazyLock::new(|| Credential { access_key: "tester".into(), secret_key: "tester-secret".into() });

/// HMAC-SHA256 (RFC 2104), for [`signed`].
fn hmac(key: &[u8], message: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    block[..key.len()].copy_from_slice(key);
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

/// A request signed with SigV4 by [`KEY`], its payload unsigned, as an
/// SDK signs it.
fn signed(http: &reqwest::Client, method: &str, url: &str) -> reqwest::RequestBuilder {
    use sha2::{Digest, Sha256};
    let url = reqwest::Url::parse(url).unwrap();
    let encode = |s: &str| percent_encoding::utf8_percent_encode(s, SIGV4_SET).to_string();
    let mut query: Vec<String> = url.query_pairs().map(|(n, v)| format!("{}={}", encode(&n), encode(&v))).collect();
    query.sort();
    let host = format!("{}:{}", url.host_str().unwrap(), url.port().unwrap());
    let date: String = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect();
    let scope = format!("{}/us-east-1/s3/aws4_request", &date[..8]);
    let headers = "host;x-amz-content-sha256;x-amz-date";
    let canonical = format!(
        "{method}\n{}\n{}\nhost:{host}\nx-amz-content-sha256:UNSIGNED-PAYLOAD\nx-amz-date:{date}\n\n{headers}\nUNSIGNED-PAYLOAD",
        url.path(),
        query.join("&")
    );
    let to_sign = format!("AWS4-HMAC-SHA256\n{date}\n{scope}\n{}", hex::encode(Sha256::digest(&canonical)));
    let mut key = hmac(format!("AWS4{}", KEY.secret_key).as_bytes(), &date.as_bytes()[..8]);
    for part in ["us-east-1", "s3", "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let signature = hex::encode(hmac(&key, to_sign.as_bytes()));
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={headers}, Signature={signature}",
        KEY.access_key
    );
    http.request(method.parse().unwrap(), url)
        .header("x-amz-content-sha256", "UNSIGNED-PAYLOAD")
        .header("x-amz-date", date)
        .header("authorization", authorization)
}

/// What SigV4 leaves unencoded: letters, digits and `-._~`.
const SIGV4_SET: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// A CompleteMultipartUpload that works longer than S3's clients wait on a
/// silent socket (parts read back from a slow device) begins its 200
/// answer before it ends, then sends its result; an error found after the
/// 200 comes as S3's error document within it, as S3 sends it. (The spaces
/// sent meanwhile: `kept_alive_sends_spaces_until_the_document`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_slow_completion_is_kept_alive_until_its_document() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start_with(dir.path(), std::slice::from_ref(&KEY)).await;
    let http = reqwest::Client::new();
    let part = big(300_000, 5);
    let mut uploads = Vec::new();
    for key in ["slow", "failing"] {
        let r = signed(&http, "POST", &format!("{}?uploads", node.object(key))).send().await.unwrap();
        let text = r.text().await.unwrap();
        let id = text
            .split_once("<UploadId>")
            .unwrap_or_else(|| panic!("{text}"))
            .1
            .split_once("</UploadId>")
            .unwrap()
            .0
            .to_string();
        let url = format!("{}?partNumber=1&uploadId={id}", node.object(key));
        let r = signed(&http, "PUT", &url).body(part.clone()).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let tag = r.headers()["etag"].to_str().unwrap().to_string();
        let document = format!(
            "<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{tag}</ETag></Part></CompleteMultipartUpload>"
        );
        uploads.push((format!("{}?uploadId={id}", node.object(key)), document));
    }
    let delay = Duration::from_secs(8);
    *node.engine.read_delay.lock() = delay;
    let complete = |(url, document): (String, String)| {
        let http = http.clone();
        async move {
            let started = std::time::Instant::now();
            let r = signed(&http, "POST", &url).body(document).send().await.unwrap();
            let head = started.elapsed();
            (r.status().as_u16(), head, r.text().await.unwrap(), started.elapsed())
        }
    };
    let (slow_status, slow_head, slow, slow_took) = complete(uploads.remove(0)).await;
    node.engine.reads.set(Trigger::Always);
    let (failing_status, failing_head, failing, failing_took) = complete(uploads.remove(0)).await;
    node.engine.off();

    let declaration = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    for (status, head, body, took) in
        [(slow_status, slow_head, &slow, slow_took), (failing_status, failing_head, &failing, failing_took)]
    {
        assert_eq!(status, 200, "{body}");
        assert!(took >= delay && head < delay, "the answer began after {head:?}, ended after {took:?}");
        let rest = body.strip_prefix(declaration).unwrap_or_else(|| panic!("no declaration first: {body:?}"));
        assert!(rest.trim_start().starts_with('<') && !rest.contains("<?xml"), "{body:?}");
    }
    assert!(
        slow.contains("<CompleteMultipartUploadResult") && slow.contains("<ETag>") && slow.contains("-1"),
        "{slow}"
    );
    assert!(failing.contains("<Error><Code>") && !failing.contains("Result"), "{failing}");
    let r = signed(&http, "GET", &node.object("slow")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.bytes().await.unwrap().to_vec()), (200, part));
    let r = signed(&http, "GET", &node.object("failing")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    node.stop().await;
}
