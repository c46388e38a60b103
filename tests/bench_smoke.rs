//! `depot bench` end to end, scaled down: the report, raw results and
//! charts exist, and every row has a figure or says why it has none. No
//! timing is asserted: this machine's speed is not the test's business.
//! Passes whether or not nginx and wrk are installed (their rows are then
//! skip rows).

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_depot");

fn bench(experiment: &str, out: &Path) -> String {
    let output = Command::new(BIN)
        .args(["bench", experiment, "--quick", "--engines", "hybrid", "--out"])
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
}

#[test]
fn bench_mget_quick_writes_a_complete_report() {
    let dir = tempfile::tempdir().unwrap();
    bench("mget", dir.path());
    check_report(dir.path(), "mget", &["depot hybrid (warm)", "depot hybrid (cold)", "rocksdb multi_get (warm)"]);
}

#[test]
fn bench_files_quick_measures_every_phase_beside_plain_files() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = bench("files", dir.path());
    assert!(stdout.contains("| write, 1 client | depot hybrid | MB/s |"), "{stdout}");
    check_report(dir.path(), "files", &["depot hybrid", "plain files"]);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
    let rows = json["experiments"][0]["rows"].as_array().unwrap();
    let value = |subject: &str, case: &str, metric: &str| {
        rows.iter()
            .find(|r| {
                r["subject"].as_str().is_some_and(|s| s.starts_with(subject))
                    && r["case"] == case
                    && r["metric"] == metric
            })
            .and_then(|r| r["value"].as_f64())
            .unwrap_or_else(|| panic!("no {metric} for {subject} {case}"))
    };
    for case in ["write, 1 client", "write, 20 clients", "read, 1 client in order", "read, 20 clients at random"] {
        assert!(value("depot hybrid", case, "MB/s") > 0.0);
        assert!(value("plain files", case, "MB/s") > 0.0);
    }
    let share = value("depot hybrid", "all phases", "% of upload time in the catalog");
    assert!(share > 0.0 && share < 100.0, "{share}");
    assert!(value("depot hybrid", "all phases", "server peak RSS MB") > 1.0);
    // Every byte is stored once, plus the catalog.
    let disk = value("depot hybrid", "all phases", "disk bytes per byte");
    assert!((0.9..2.0).contains(&disk), "{disk}");
}
