//! The web UI end to end: a real Chromium (Debian's) driven by
//! playwright-core (tests/ui/ui.mjs) against real servers, one without
//! credentials and one with. Screenshots of every page are kept under the
//! target directory (the path is printed).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{Server, client};

const BIG: usize = 10_000;
const AK: &str = "ui-access";
const SK: &str = "ui-secret-key-123";

#[tokio::test(flavor = "multi_thread")]
async fn web_ui_in_chromium() {
    let Some(playwright) = std::env::var_os("DEPOT_TEST_UI") else {
        eprintln!("skipped: DEPOT_TEST_UI is unset (scripts/test.sh installs playwright-core and sets it)");
        return;
    };
    let open = Server::start(&[]);
    let auth = Server::start(&["--access-key", AK, "--secret-key", SK]);
    let http = client();

    // A bucket of BIG small objects, for paging and time to first listing.
    let status = http.put(format!("{}/big", open.url)).send().await.unwrap().status();
    assert_eq!(status, 201);
    let mut body = Vec::new();
    for i in 0..BIG {
        let value = format!("object {i}");
        body.extend_from_slice(format!("{i:06}.txt\n{}\n{value}\n", value.len()).as_bytes());
    }
    let r = http.post(format!("{}/_/batch/put?bucket=big", open.url)).body(body).send().await.unwrap();
    assert!(r.status().is_success(), "batch put: {}", r.text().await.unwrap());
    let listed: serde_json::Value =
        http.get(format!("{}/big/?format=json&limit=1", open.url)).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed["entries"][0]["key"], "000000.txt");

    let artifacts = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui-artifacts");
    let _ = std::fs::remove_dir_all(&artifacts);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/ui/ui.mjs");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("node")
            .arg(script)
            .env("DEPOT_TEST_UI", playwright)
            .env("UI_OPEN_URL", &open.url)
            .env("UI_AUTH_URL", &auth.url)
            .env("UI_AK", AK)
            .env("UI_SK", SK)
            .env("UI_BIG_OBJECTS", BIG.to_string())
            .env("UI_ARTIFACTS", &artifacts)
            .output()
            .map(|o| (o, open, auth))
    })
    .await
    .unwrap()
    .expect("running node");
    let (out, open, auth) = out;
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser test failed: {}", out.status);
    assert!(stdout.contains("time to first listing"));
    open.assert_no_panic();
    auth.assert_no_panic();
}
