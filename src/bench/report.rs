//! The report of a bench run, in one directory: `report.md` (machine facts,
//! then per experiment how it was measured, one table and its charts),
//! `results.json` and `results.csv` (every row, raw), and per experiment a
//! chart as `<name>.svg` and `<name>.png` (and `<name>-ratio.*` for the
//! ratios to a peer measured beside depot, `<name>-<stem>.*` for further
//! metrics an experiment charts).

use std::fmt::Write as _;
use std::path::Path;
use std::time::SystemTime;

use anyhow::Context;

use super::machine::Facts;
use super::{ExperimentReport, Row, chart};

/// A UTC time usable as a directory name: `2025-01-31T12-00-00Z`.
pub fn timestamp_for_path(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string().replace(':', "-")
}

/// Writes every file of the report into `out`; returns the Markdown.
pub fn write_all(out: &Path, machine: &Facts, experiments: &[ExperimentReport]) -> anyhow::Result<String> {
    let mut charts = Vec::new();
    for e in experiments {
        charts.push(chart::draw(out, e).map_err(|err| format!("{err:#}")));
    }
    let generated = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
    let md = markdown(&generated, machine, experiments, &charts);
    let write = |name: &str, text: &str| {
        let path = out.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    write("report.md", &md)?;
    write("results.json", &json(&generated, machine, experiments)?)?;
    write("results.csv", &csv(experiments))?;
    Ok(md)
}

/// A figure as people read it: 12,345 / 123.4 / 12.35 / 0.174.
pub fn number(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        v.to_string()
    } else if a >= 1000.0 {
        let s = super::thousands(a.round() as u64);
        if v < 0.0 { format!("-{s}") } else { s }
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 || a == 0.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.5}")
    }
}

/// Rows grouped by case, cases in the order they first appear; within a
/// case, rows keep their order.
pub fn by_case(rows: &[Row]) -> Vec<&Row> {
    let mut cases: Vec<&str> = Vec::new();
    for r in rows {
        if !cases.contains(&r.case.as_str()) {
            cases.push(&r.case);
        }
    }
    let mut sorted: Vec<&Row> = rows.iter().collect();
    sorted.sort_by_key(|r| cases.iter().position(|c| *c == r.case));
    sorted
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

/// One experiment's table.
pub fn table(rows: &[Row]) -> String {
    let mut t = String::from(
        "| case | engine / peer | metric | median | spread (min..max) | seed |\n|---|---|---|--:|--:|--:|\n",
    );
    for r in by_case(rows) {
        let (value, spread) = match (&r.skipped, r.value) {
            (Some(why), _) => (format!("skipped: {}", cell(why)), String::new()),
            (None, Some(v)) => {
                let spread = match (r.min, r.max) {
                    (Some(lo), Some(hi)) => format!("{}..{}", number(lo), number(hi)),
                    _ => String::new(),
                };
                (number(v), spread)
            }
            (None, None) => ("no value".into(), String::new()),
        };
        let seed = match (r.seed, &r.seed_source) {
            // As published, digit for digit.
            (Some(v), Some(src)) => format!("{v} ({})", cell(src)),
            (Some(v), None) => v.to_string(),
            _ => String::new(),
        };
        let _ = writeln!(
            t,
            "| {} | {} | {} | {value} | {spread} | {seed} |",
            cell(&r.case),
            cell(&r.subject),
            cell(&r.metric)
        );
    }
    t
}

fn markdown(
    generated: &str,
    machine: &Facts,
    experiments: &[ExperimentReport],
    charts: &[Result<Vec<(String, String)>, String>],
) -> String {
    let mut md = format!("# depot bench, {generated}\n\n## Machine\n\n| | |\n|---|---|\n");
    for (k, v) in machine {
        let _ = writeln!(md, "| {} | {} |", cell(k), cell(v));
    }
    for (e, chart) in experiments.iter().zip(charts) {
        let _ = write!(md, "\n## {}: {}\n\n", e.name, e.title);
        for m in &e.method {
            let _ = write!(md, "{m}\n\n");
        }
        md.push_str(&table(&e.rows));
        match chart {
            Ok(files) => {
                for (svg, metric) in files.iter().filter(|(f, _)| f.ends_with(".svg")) {
                    let _ = write!(md, "\n![{}: {metric}]({svg})\n", e.name);
                }
            }
            Err(why) => {
                let _ = write!(md, "\nChart not drawn: {why}\n");
            }
        }
    }
    md
}

fn json(generated: &str, machine: &Facts, experiments: &[ExperimentReport]) -> anyhow::Result<String> {
    let machine: serde_json::Map<String, serde_json::Value> =
        machine.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
    let doc = serde_json::json!({ "generated": generated, "machine": machine, "experiments": experiments });
    Ok(serde_json::to_string_pretty(&doc)? + "\n")
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

/// Every row of every experiment, one line each.
pub fn csv(experiments: &[ExperimentReport]) -> String {
    let mut out = String::from("experiment,case,subject,metric,value,min,max,seed,seed_source,skipped\n");
    let num = |v: Option<f64>| v.map(|v| v.to_string()).unwrap_or_default();
    for r in experiments.iter().flat_map(|e| &e.rows) {
        let fields = [
            csv_field(&r.experiment),
            csv_field(&r.case),
            csv_field(&r.subject),
            csv_field(&r.metric),
            num(r.value),
            num(r.min),
            num(r.max),
            num(r.seed),
            csv_field(r.seed_source.as_deref().unwrap_or("")),
            csv_field(r.skipped.as_deref().unwrap_or("")),
        ];
        out.push_str(&fields.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Summary;

    fn rows() -> Vec<Row> {
        vec![
            Row::measured(
                "http",
                "GET 1 KB",
                "depot hybrid",
                "ms/request",
                Summary { median: 0.5, min: 0.4, max: 0.6 },
            )
            .with_seed(Some((1.124, "nginx-gridfs"))),
            Row::single("http", "PUT 1 KB", "depot hybrid", "disk bytes per byte", 2.5),
            Row::skipped("http", "GET 1 KB", "depot s3", "ms/request", "no MongoDB given"),
            Row::skipped("http", "GET 1 KB", "odd, \"name\"", "ms/request", "a | b"),
        ]
    }

    #[test]
    fn numbers_read_well() {
        assert_eq!(number(1234567.8), "1,234,568");
        assert_eq!(number(123.45), "123.5");
        assert_eq!(number(12.345), "12.35");
        assert_eq!(number(0.174), "0.174");
        assert_eq!(number(0.0012), "0.00120");
        assert_eq!(number(0.0), "0.000");
    }

    #[test]
    fn tables_group_by_case_and_show_skips_and_seeds() {
        let t = table(&rows());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2 + 4);
        assert_eq!(lines[2], "| GET 1 KB | depot hybrid | ms/request | 0.500 | 0.400..0.600 | 1.124 (nginx-gridfs) |");
        assert_eq!(lines[3], "| GET 1 KB | depot s3 | ms/request | skipped: no MongoDB given |  |  |");
        assert!(lines[4].contains("skipped: a \\| b"), "{}", lines[4]);
        assert_eq!(lines[5], "| PUT 1 KB | depot hybrid | disk bytes per byte | 2.50 |  |  |");
    }

    #[test]
    fn csv_quotes_what_needs_quoting() {
        let e = ExperimentReport {
            name: "http".into(),
            title: "t".into(),
            method: vec![],
            chart_metric: "ms/request".into(),
            ratio: None,
            also_charted: Vec::new(),
            rows: rows(),
        };
        let text = csv(&[e]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "experiment,case,subject,metric,value,min,max,seed,seed_source,skipped");
        assert_eq!(lines[1], "http,GET 1 KB,depot hybrid,ms/request,0.5,0.4,0.6,1.124,nginx-gridfs,");
        assert_eq!(lines[3], "http,GET 1 KB,depot s3,ms/request,,,,,,no MongoDB given");
        assert_eq!(lines[4], "http,GET 1 KB,\"odd, \"\"name\"\"\",ms/request,,,,,,a | b");
    }

    #[test]
    fn directory_timestamps_have_no_colons() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(86_400 + 3_723);
        assert_eq!(timestamp_for_path(t), "1970-01-02T01-02-03Z");
    }
}
