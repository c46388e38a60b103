//! PostgreSQL going away under a depot node: requests fail fast with 503
//! while it is down, nothing acknowledged is lost, and the node recovers by
//! itself. It restarts the test cluster, so it lives in a test binary of
//! its own (test binaries run one at a time).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Ledger, Server, client, pattern, sha256_hex};

/// `pg_ctlcluster VERSION main ACTION` on the test cluster.
fn cluster(action: &str) {
    let name = std::env::var("DEPOT_TEST_POSTGRES_CLUSTER")
        .expect("DEPOT_TEST_POSTGRES_CLUSTER is not set: run scripts/test.sh, which starts PostgreSQL and sets it");
    let mut parts = name.split_whitespace();
    let (version, cluster_name) = (parts.next().unwrap(), parts.next().unwrap());
    let ok = std::process::Command::new("pg_ctlcluster").args([version, cluster_name, action]).status().unwrap();
    assert!(ok.success(), "pg_ctlcluster {action} failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_restart_under_load_loses_nothing_and_the_node_recovers() {
    let url = depot::pg::fresh_test_database().await;
    let server = Server::start(&["--catalog", &url, "--engine", "fs"]);
    let ledger = Ledger::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..4u64 {
        let (base, ledger, stop) = (server.url.clone(), ledger.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let http = client();
            let mut unavailable = 0;
            for i in 0u64.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let key = format!("w{w}/k{}", i % 40);
                let body = pattern(1000 + (i as usize % 7) * 10_000, w * 1000 + i);
                let sha = sha256_hex(&body);
                ledger.sending(&key, &sha);
                match http.put(format!("{base}/files/{key}")).body(body).send().await {
                    Ok(r) if r.status().is_success() => ledger.acked(&key, &sha),
                    Ok(r) => {
                        assert_eq!(r.status(), 503, "only 503 while the catalog is away");
                        let body: serde_json::Value = r.json().await.unwrap();
                        assert_eq!(body["error"], "ServiceUnavailable");
                        unavailable += 1;
                    }
                    Err(e) => panic!("request failed outright: {e}"),
                }
            }
            unavailable
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    tokio::task::spawn_blocking(|| cluster("restart")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }

    assert!(ledger.acked_count() > 20, "too few writes to mean anything");
    let present = ledger.assert_survivors(&server.url).await.len();
    let http = client();
    let metrics = http.get(format!("{}/_/metrics", server.url)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("depot_objects {present}\n")), "totals disagree with the objects:\n{metrics}");

    // Down for good: fail fast with 503, then recover without a restart.
    tokio::task::spawn_blocking(|| cluster("stop")).await.unwrap();
    let started = Instant::now();
    let r = http.put(server.object_url("files", "while-down")).body("x").send().await.unwrap();
    let waited = started.elapsed();
    tokio::task::spawn_blocking(|| cluster("start")).await.unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("unavailable"), "{body}");
    assert!(waited < Duration::from_secs(15), "a dead catalog took {waited:?} to report");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = http.put(server.object_url("files", "after")).body("back").send().await.unwrap();
        if r.status().is_success() {
            break;
        }
        assert!(Instant::now() < deadline, "the node did not recover after PostgreSQL returned");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(http.get(server.object_url("files", "while-down")).send().await.unwrap().status(), 404);
    server.assert_no_panic();
}
