//! `depot bench` end to end, scaled down: the report, raw results and
//! charts exist, and every row has a figure or says why it has none. No
//! timing is asserted: this machine's speed is not the test's business.
//! Passes whether or not nginx and wrk are installed (their rows are then
//! skip rows).

mod common;

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_depot");

fn bench(experiment: &str, out: &Path) -> String {
    bench_engines(experiment, "hybrid", out)
}

fn bench_engines(experiment: &str, engines: &str, out: &Path) -> String {
    let output = Command::new(BIN)
        .args(["bench", experiment, "--quick", "--engines", engines, "--out"])
        .arg(out)
        .env_remove("DEPOT_BENCH_POSTGRES")
        .output()
        .expect("running depot bench");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "depot bench {experiment} failed\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn check_report(out: &Path, experiment: &str, subjects: &[&str]) {
    for file in ["report.md", "results.json", "results.csv"] {
        let len = std::fs::metadata(out.join(file)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{file} missing or empty");
    }
    for ext in ["svg", "png"] {
        let len = std::fs::metadata(out.join(format!("{experiment}.{ext}"))).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "{experiment}.{ext} missing or empty");
    }
    let png = std::fs::read(out.join(format!("{experiment}.png"))).unwrap();
    assert_eq!(&png[1..4], b"PNG");

    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("## Machine") && report.contains("| kernel |"), "{report}");
    assert!(report.contains(&format!("## {experiment}:")), "{report}");

    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let experiments = json["experiments"].as_array().expect("experiments");
    assert_eq!(experiments.len(), 1);
    let rows = experiments[0]["rows"].as_array().expect("rows");
    assert!(!rows.is_empty());
    for row in rows {
        let has_value = row["value"].as_f64().is_some_and(f64::is_finite);
        let has_reason = row["skipped"].as_str().is_some_and(|s| !s.trim().is_empty());
        assert!(has_value ^ has_reason, "a row with neither a value nor a skip reason (or both): {row}");
    }
    for subject in subjects {
        assert!(
            rows.iter().any(|r| r["subject"].as_str().is_some_and(|s| s.starts_with(subject))),
            "no row for {subject}"
        );
    }
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), rows.len() + 1, "one CSV line per row, plus the header");
}

/// The chart of depot's ratios to the peer measured beside it, in the
/// report and in both formats.
fn check_ratio_chart(out: &Path, experiment: &str) {
    check_chart(out, &format!("{experiment}-ratio"));
}

/// A chart drawn as `<stem>.svg` and `.png`, and shown in the report.
fn check_chart(out: &Path, stem: &str) {
    for ext in ["svg", "png"] {
        let len = std::fs::metadata(out.join(format!("{stem}.{ext}"))).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "{stem}.{ext} missing or empty");
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains(&format!("]({stem}.svg)")), "{report}");
}

#[test]
fn bench_http_quick_writes_a_complete_report() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = bench("http", dir.path());
    assert!(stdout.contains("| GET 1 KB | depot hybrid |"), "{stdout}");
    check_report(dir.path(), "http", &["depot hybrid", "nginx"]);
    // The hybrid engine runs everywhere: its GET figures must be there.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    let measured = json["experiments"][0]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["subject"] == "depot hybrid" && r["metric"] == "ms/request" && r["value"].is_number())
        .count();
    assert_eq!(measured, 4, "GET 1 KB, 100 KB, 1 MB and PUT 1 KB for depot hybrid");
    // With nginx there, each of those cases also gives depot's rate as a
    // multiple of nginx's, round by round.
    let rows = json["experiments"][0]["rows"].as_array().unwrap();
    let nginx_measured = rows.iter().any(|r| r["subject"] == "nginx" && r["value"].is_number());
    let ratios: Vec<f64> = rows
        .iter()
        .filter(|r| r["subject"] == "depot hybrid" && r["metric"] == "× nginx")
        .filter_map(|r| r["value"].as_f64())
        .collect();
    if nginx_measured {
        assert_eq!(ratios.len(), 4, "a ratio to nginx per case");
        assert!(ratios.iter().all(|r| r.is_finite() && *r > 0.0), "{ratios:?}");
        check_ratio_chart(dir.path(), "http");
    }
    // The CPU each side spent per request, in every case, and their chart.
    for whose in ["depot hybrid: server", "depot hybrid: load generator"] {
        let cpu: Vec<f64> = rows
            .iter()
            .filter(|r| r["subject"] == whose && r["metric"] == "CPU µs/request")
            .filter_map(|r| r["value"].as_f64())
            .collect();
        assert_eq!(cpu.len(), 4, "{whose}: CPU per request in each case");
        assert!(cpu.iter().all(|us| us.is_finite() && *us > 0.0), "{whose}: {cpu:?}");
    }
    check_chart(dir.path(), "http-cpu");
}

#[test]
fn bench_mget_quick_writes_a_complete_report() {
    let dir = tempfile::tempdir().unwrap();
    bench("mget", dir.path());
    check_report(dir.path(), "mget", &["depot hybrid (warm)", "depot hybrid (cold)", "rocksdb multi_get (warm)"]);
    check_ratio_chart(dir.path(), "mget");
    // Every request to depot was paired with the floor's of the same keys:
    // a ratio per batch size, within what the two sides' extremes allow.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    let rows = json["experiments"][0]["rows"].as_array().unwrap();
    let find = |case: &str, subject: &str, metric: &str| {
        rows.iter()
            .find(|r| r["case"] == case && r["subject"] == subject && r["metric"] == metric)
            .map(|r| (r["value"].as_f64().unwrap(), r["min"].as_f64().unwrap(), r["max"].as_f64().unwrap()))
            .unwrap_or_else(|| panic!("no {metric} for {subject} {case}"))
    };
    // Both floors: RocksDB's defaults, and the catalog's own options.
    for (subject, metric) in
        [("rocksdb multi_get", "× multi_get"), ("rocksdb multi_get, depot's options", "× multi_get, depot's options")]
    {
        for case in ["50 keys", "300 keys", "1,000 keys", "10,000 keys"] {
            let (ratio, low, high) = find(case, "depot hybrid (warm)", metric);
            let (_, depot_min, depot_max) = find(case, "depot hybrid (warm)", "ms/request");
            let (_, floor_min, floor_max) = find(case, &format!("{subject} (warm)"), "ms/request");
            assert!(low <= ratio && ratio <= high, "{subject}, {case}: {ratio} outside {low}..{high}");
            let (floor, ceiling) = (depot_min / floor_max, depot_max / floor_min);
            assert!(
                floor * 0.999 <= low && high <= ceiling * 1.001,
                "{subject}, {case}: {low}..{high} outside {floor}..{ceiling}"
            );
        }
    }
}

#[test]
fn bench_files_quick_measures_every_phase_beside_plain_files() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = bench("files", dir.path());
    assert!(stdout.contains("| write, 1 client | depot hybrid | MB/s |"), "{stdout}");
    check_report(dir.path(), "files", &["depot hybrid", "plain files"]);
    check_ratio_chart(dir.path(), "files");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    let rows = json["experiments"][0]["rows"].as_array().unwrap();
    let row = |subject: &str, case: &str, metric: &str| {
        rows.iter()
            .find(|r| {
                r["subject"].as_str().is_some_and(|s| s.starts_with(subject))
                    && r["case"] == case
                    && r["metric"] == metric
            })
            .unwrap_or_else(|| panic!("no {metric} for {subject} {case}"))
    };
    let value = |subject: &str, case: &str, metric: &str| {
        row(subject, case, metric)["value"].as_f64().unwrap_or_else(|| panic!("no {metric} for {subject} {case}"))
    };
    // (median, min, max); a single figure has no spread.
    let spread = |subject: &str, case: &str, metric: &str| {
        let r = row(subject, case, metric);
        let v = r["value"].as_f64().unwrap();
        (v, r["min"].as_f64().unwrap_or(v), r["max"].as_f64().unwrap_or(v))
    };
    for case in ["write, 1 client", "write, 20 clients"] {
        let (depot, plain) = (value("depot hybrid", case, "MB/s"), value("plain files", case, "MB/s"));
        assert!(depot > 0.0 && plain > 0.0);
        // Written once, plain files right after depot.
        let ratio = value("depot hybrid", case, "× plain files");
        assert!((ratio - depot / plain).abs() < 1e-6 * ratio, "{case}: {ratio} against {depot} / {plain}");
    }
    // Read in rounds: each ratio pairs one run of each subject, so the
    // median lies within what the runs' extremes allow.
    let paired = |case: &str, subject: &str, peer: &str, metric: &str| {
        let (_, min, max) = spread(subject, case, "MB/s");
        let (_, peer_min, peer_max) = spread(peer, case, "MB/s");
        assert!(min > 0.0 && peer_min > 0.0);
        let (ratio, low, high) = spread(subject, case, metric);
        assert!(low <= ratio && ratio <= high, "{case}, {subject}: {ratio} outside {low}..{high}");
        let (floor, ceiling) = (min / peer_max, max / peer_min);
        assert!(
            floor * 0.999 <= low && high <= ceiling * 1.001,
            "{case}, {subject}: {low}..{high} outside {floor}..{ceiling}"
        );
    };
    // nginx serves the plain files over HTTP in the read phases, when it is
    // installed (it is where the tests run).
    let nginx =
        rows.iter().any(|r| r["subject"].as_str().is_some_and(|s| s.starts_with("nginx")) && r["value"].is_number());
    for case in ["read, 1 client in order", "read, 20 clients at random"] {
        paired(case, "depot hybrid", "plain files", "× plain files");
        if nginx {
            paired(case, "depot hybrid", "nginx", "× nginx");
            paired(case, "nginx", "plain files", "× plain files");
        }
    }
    if nginx {
        assert!(
            rows.iter().all(|r| !(r["subject"].as_str().unwrap().starts_with("nginx")
                && r["case"].as_str().unwrap().starts_with("write"))),
            "nginx only reads"
        );
    }
    let share = value("depot hybrid", "all phases", "% of upload time in the catalog");
    assert!(share > 0.0 && share < 100.0, "{share}");
    assert!(value("depot hybrid", "all phases", "server peak RSS MB") > 1.0);
    // Every byte is stored once, plus the catalog.
    let disk = value("depot hybrid", "all phases", "disk bytes per byte");
    assert!((0.9..2.0).contains(&disk), "{disk}");
}

/// Runs `experiment` quick on `engines`, checks its report names every
/// one of `subjects`; its rows.
fn quick_rows(experiment: &str, engines: &str, subjects: &[&str]) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    bench_engines(experiment, engines, dir.path());
    check_report(dir.path(), experiment, subjects);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    json["experiments"][0]["rows"].as_array().unwrap().clone()
}

fn positive(rows: &[serde_json::Value], subject: &str, metric: &str) -> usize {
    rows.iter()
        .filter(|r| r["subject"] == subject && r["metric"] == metric)
        .inspect(|r| assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "not a positive figure: {r}"))
        .count()
}

fn skip_reason(rows: &[serde_json::Value], subject: &str) -> String {
    let row = rows.iter().find(|r| r["subject"] == subject).unwrap_or_else(|| panic!("no row for {subject}"));
    row["skipped"].as_str().unwrap_or_else(|| panic!("{subject} was not skipped: {row}")).to_string()
}

#[test]
fn bench_chunks_quick_measures_sqlite_and_says_why_not_the_others() {
    let rows = quick_rows("chunks", "hybrid,sqlite,postgres", &["depot sqlite", "depot hybrid", "depot postgres"]);
    assert_eq!(positive(&rows, "depot sqlite", "write MB/s"), 6, "one write rate per chunk size");
    for reads in ["8 KB", "64 KB", "1 MB"] {
        assert_eq!(positive(&rows, "depot sqlite", &format!("read MB/s, {reads} reads")), 6);
    }
    assert_eq!(positive(&rows, "depot sqlite", "server CPU s, writes"), 6);
    assert_eq!(positive(&rows, "depot sqlite", "server peak RSS MB"), 6);
    assert!(skip_reason(&rows, "depot hybrid").contains("--chunk-size does not apply"));
    assert!(skip_reason(&rows, "depot postgres").contains("--postgres-url"));
}

#[test]
fn bench_smallfiles_quick_measures_depot_and_plain_files() {
    let rows = quick_rows("smallfiles", "hybrid,postgres", &["depot hybrid", "depot postgres", "plain files"]);
    for subject in ["depot hybrid", "plain files (ext4)"] {
        assert_eq!(positive(&rows, subject, "files/s"), 3, "{subject}: ingest, listing and random reads");
        assert_eq!(positive(&rows, subject, "disk bytes per byte"), 1, "{subject}");
    }
    assert_eq!(positive(&rows, "depot hybrid", "server peak RSS MB"), 1);
    assert!(skip_reason(&rows, "depot postgres").contains("--postgres-url"));
}

#[test]
fn bench_scale_quick_measures_memory_while_streaming_and_start_up() {
    let rows = quick_rows("scale", "hybrid", &["depot hybrid"]);
    let value = |case: &str, metric: &str| {
        rows.iter()
            .find(|r| r["case"].as_str().is_some_and(|c| c.starts_with(case)) && r["metric"] == metric)
            .and_then(|r| r["value"].as_f64())
            .unwrap_or_else(|| panic!("no {metric} figure for {case}: {rows:?}"))
    };
    assert!(value("idle", "MB") > 1.0);
    for phase in ["upload", "download"] {
        assert!(value(phase, "MB/s") > 0.0);
        let peak = value(phase, "MB");
        assert!(peak < 200.0, "{phase} of 200 MB held {peak} MB: a body is buffered somewhere");
    }
    assert!(value("write 50,000 objects", "objects/s") > 0.0);
    assert!(value("start-up with 50,000 objects, warm", "s") > 0.0);
    let total = value("after 10,000 GETs,", "MB");
    assert!(total > 1.0);
    // The mapped files (the binary, the catalog's tables) are part of it.
    let mapped = value("after 10,000 GETs: of which mapped files", "MB");
    assert!(mapped > 0.0 && mapped <= total, "mapped {mapped} MB of {total} MB resident");
    // Leaving the mapped pages out can only take from the growth, never add.
    let own = value("added per million objects, mapped files left out", "MB");
    let added = value("added per million objects", "MB");
    assert!((0.0..=added).contains(&own), "{own} MB per million objects without mapped pages, {added} MB with");
}

/// Runs a bench off the test's runtime threads; it must succeed.
async fn run_aside(command: &mut Command) -> std::process::Output {
    let mut command = std::mem::replace(command, Command::new(BIN));
    let output = tokio::task::spawn_blocking(move || command.output().expect("running depot bench")).await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// The gridfs engine's database and the s3 engine's bucket are made for
/// one run; the run takes them away with it.
#[tokio::test(flavor = "multi_thread")]
async fn bench_leaves_no_database_behind_on_the_engines_servers() {
    let mongo = std::env::var("DEPOT_TEST_MONGO")
        .expect("DEPOT_TEST_MONGO is not set: run scripts/test.sh, which starts a MongoDB test server and sets it");
    let (s3, config) = depot::engine::s3::test_server("unused");
    let client = mongodb::Client::with_uri_str(&mongo).await.unwrap();
    let bench_databases = || async {
        let names = client.list_database_names().await.unwrap();
        names.into_iter().filter(|n| n.starts_with("depot_bench_")).collect::<std::collections::BTreeSet<_>>()
    };
    let before = bench_databases().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_path_buf();
    let mut command = Command::new(BIN);
    command
        .args(["bench", "http", "--quick", "--engines", "gridfs,s3", "--out"])
        .arg(&out)
        .env("DEPOT_BENCH_MONGO", &mongo)
        .env("DEPOT_BENCH_S3", &s3)
        .env("DEPOT_BENCH_S3_ACCESS_KEY", config.access_key.unwrap())
        .env("DEPOT_BENCH_S3_SECRET_KEY", config.secret_key.unwrap());
    let output = run_aside(&mut command).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("| PUT 1 KB, new keys | depot gridfs | req/s |"), "gridfs was not measured: {stdout}");
    let left = bench_databases().await;
    assert!(left.is_subset(&before), "left behind: {:?}", left.difference(&before).collect::<Vec<_>>());
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("could not"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The postgres engine's tables of a run are in a schema of the run's own,
/// dropped with it: the collection after each experiment, with no grace
/// period, leaves what another store keeps in the same database alone.
/// (It used to run in the database's own tables, and removed every blob
/// the bench's catalog did not know: the other store's.)
#[tokio::test(flavor = "multi_thread")]
async fn bench_leaves_another_stores_postgres_blobs_alone() {
    let url = depot::pg::fresh_test_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("store");
    let body = common::pattern(20_000, 7);
    let flags = ["--engine", "postgres", "--engine-url", url.as_str()];
    let mut store = common::Server::start_in(&data, &flags);
    let r = common::client().put(store.object_url("files", "kept")).body(body.clone()).send().await.unwrap();
    assert_eq!(r.status(), 201);
    assert!(store.stop().success());

    let out = dir.path().join("out");
    let mut command = Command::new(BIN);
    command.args(["bench", "smallfiles", "--quick", "--engines", "postgres", "--postgres-url", &url, "--out"]);
    let output = run_aside(command.arg(&out)).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("| depot postgres | files/s |"), "postgres was not measured: {stdout}");

    let store = common::Server::start_in(&data, &flags);
    let r = common::client().get(store.object_url("files", "kept")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.bytes().await.unwrap() == body, "another store's blob changed");
    let (db, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let schemas = db.query("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'depot_bench_%'", &[]).await.unwrap();
    assert!(schemas.is_empty(), "the run's schema was left");
}
