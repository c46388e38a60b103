//! `depot bench http`, after the seed "nginx vs GridFS serving": files of
//! 1 KB, 100 KB and 1 MB fetched at concurrency 100 over keep-alive
//! connections, from depot with each engine and from nginx serving the same
//! files from disk; then PUTs of new 1 KB keys at the same concurrency,
//! depot against nginx's WebDAV, with the disk space each used per byte
//! written. Reported: requests per second (median and spread of the
//! rounds), milliseconds per request as the seed's `ab` counted them
//! (elapsed time / requests, i.e. 1000 / req/s), and p50/p99 latency.
//! When `wrk` is installed, its request rate for the same GET is shown
//! beside ours as a cross-check of the built-in load generator (not in
//! quick runs, whose rounds are too short for it).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::Method;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::load::{self, Connection, Plan};
use super::nginx::{Nginx, Reads};
use super::rss;
use super::stats::Summary;
use super::{
    DataDir, DepotServer, ExperimentReport, Progress, Ratio, Row, Settings, disk_usage, find_program,
    remote_disk_bytes, stores_on_a_server, thousands,
};

const NAME: &str = "http";
const CONCURRENCY: usize = 100;
const PUT_SIZE: usize = 1024;
const PUT_CASE: &str = "PUT 1 KB, new keys";
const MS: &str = "ms/request";
const RATIO: &str = "× nginx";
const CPU: &str = "CPU µs/request";

/// The files served: label, size, and the seed's ms/request for nginx from
/// disk and for nginx-gridfs.
const FILES: [(&str, usize, f64, f64); 3] =
    [("1 KB", 1024, 0.174, 1.124), ("100 KB", 100 * 1024, 1.014, 1.572), ("1 MB", 1024 * 1024, 9.582, 9.567)];

fn get_case(label: &str) -> String {
    format!("GET {label}")
}

fn plan(settings: &Settings) -> Plan {
    if settings.quick {
        Plan {
            concurrency: CONCURRENCY,
            warmup: Duration::from_millis(300),
            rounds: 3,
            round: Duration::from_millis(500),
        }
    } else {
        Plan { concurrency: CONCURRENCY, warmup: Duration::from_secs(2), rounds: 5, round: Duration::from_secs(3) }
    }
}

/// A server under test, as the load generator sees it (the server itself
/// is kept running by the caller).
struct Target {
    subject: String,
    addr: SocketAddr,
    /// The processes that serve it, each with its descendants: depot and
    /// the engine's own server when it runs on this machine, or nginx's
    /// master and its workers.
    pids: Vec<u32>,
    /// Prefix of the URLs of the published files.
    get_prefix: &'static str,
    /// Prefix of the URLs new keys are PUT to.
    put_prefix: &'static str,
    /// What grows on disk when it takes writes.
    written: PathBuf,
    /// Whether the bytes go to the engine's own server, which then reports
    /// what it occupies (`disk_bytes` of `/_/stats`).
    on_a_server: bool,
    /// Whether the seed compares it with nginx from disk (true) or with
    /// nginx-gridfs, the database-backed server.
    from_disk: bool,
}

pub async fn run(settings: &Settings) -> anyhow::Result<ExperimentReport> {
    let plan = plan(settings);
    // The cross-check needs runs of seconds: not in a quick run.
    let wrk = find_program("wrk").filter(|_| !settings.quick);
    let files: Vec<(String, Bytes)> = {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        FILES
            .iter()
            .map(|(label, size, ..)| {
                let mut b = vec![0u8; *size];
                rng.fill(&mut b[..]);
                (label.replace(' ', ""), Bytes::from(b))
            })
            .collect()
    };
    let subjects = settings.engines.len() + 1;
    let progress = Progress::new(NAME, (subjects * (FILES.len() + 1)) as u64);
    let mut rows = Vec::new();
    let skip_all = |rows: &mut Vec<Row>, subject: &str, why: &str| {
        for (label, ..) in FILES {
            rows.push(Row::skipped(NAME, &get_case(label), subject, MS, why));
        }
        rows.push(Row::skipped(NAME, PUT_CASE, subject, MS, why));
        progress.done((FILES.len() + 1) as u64);
    };
    // Every server runs for the whole experiment: the rounds of a case
    // alternate between them, so a slow spell of the machine falls on all.
    // Their data goes once they are stopped.
    let mut data_dirs = Vec::new();
    let mut servers = Vec::new();
    let mut targets = Vec::new();
    for (i, engine) in settings.engines.iter().enumerate() {
        let subject = engine.subject();
        progress.doing(&format!("{subject}: starting"));
        let flags = match &engine.serve_flags {
            Ok(flags) => flags,
            Err(why) => {
                skip_all(&mut rows, &subject, why);
                continue;
            }
        };
        let data = DataDir::new(settings.scratch.join(format!("http-{i}-{}", engine.name)));
        let server = match DepotServer::start(&engine.name, flags, data.path(), settings.threads) {
            Ok(s) => s,
            Err(e) => {
                skip_all(&mut rows, &subject, &format!("{e:#}"));
                continue;
            }
        };
        let addr = server.addr;
        let pids = std::iter::once(server.pid()).chain(engine.backend_port.and_then(rss::listener_pid)).collect();
        let published = async {
            let mut c = Connection::open(addr).await?;
            for (name, bytes) in &files {
                c.expect_ok(load::request(Method::PUT, addr, &format!("/files/bench/{name}"), bytes.clone())).await?;
            }
            anyhow::Ok(())
        };
        if let Err(e) = published.await {
            skip_all(&mut rows, &subject, &format!("{e:#}"));
            continue;
        }
        servers.push(server);
        targets.push(Target {
            subject,
            addr,
            pids,
            get_prefix: "/files/bench/",
            put_prefix: "/files/bench/put/",
            written: data.path().to_path_buf(),
            on_a_server: stores_on_a_server(&engine.name),
            from_disk: false,
        });
        data_dirs.push(data);
    }
    progress.doing("nginx: starting");
    let nginx_dir = DataDir::new(settings.scratch.join("nginx"));
    let nginx = Nginx::start(nginx_dir.path(), settings.threads, Reads::Hot)
        .and_then(|n| files.iter().try_for_each(|(name, bytes)| n.publish(name, bytes)).map(|()| n));
    match &nginx {
        Ok(nginx) => targets.push(Target {
            subject: "nginx".into(),
            addr: nginx.addr,
            pids: vec![nginx.pid()],
            get_prefix: "/",
            put_prefix: "/dav/",
            written: nginx.dav.clone(),
            on_a_server: false,
            from_disk: true,
        }),
        Err(e) => skip_all(&mut rows, "nginx", &format!("{e:#}")),
    }
    for ((name, _), (label, size, seed_disk, seed_gridfs)) in files.iter().zip(FILES) {
        let case = get_case(label);
        let (outcomes, cpu) = measure(&targets, &case, plan, &progress, |target, _| {
            let (addr, path) = (target.addr, format!("{}{name}", target.get_prefix));
            Arc::new(move |_, _| load::expecting(load::request(Method::GET, addr, &path, Bytes::new()), size))
        })
        .await;
        for (target, outcome) in targets.iter().zip(&outcomes) {
            let seed = if target.from_disk { (seed_disk, "nginx+disk") } else { (seed_gridfs, "nginx-gridfs") };
            rows.extend(rate_rows(&case, &target.subject, outcome, Some(seed)));
        }
        rows.extend(ratio_rows(&case, &targets, &outcomes));
        rows.extend(cpu_rows(&case, &targets, &cpu));
        if let Some(wrk) = &wrk {
            let secs = (plan.round * plan.rounds as u32).as_secs().max(1);
            let metric = "req/s (wrk)";
            for target in &targets {
                let path = format!("{}{name}", target.get_prefix);
                match run_wrk(wrk, target.addr, &path, settings.threads, secs).await {
                    Ok(rate) => rows.push(Row::single(NAME, &case, &target.subject, metric, rate)),
                    Err(e) => rows.push(Row::skipped(NAME, &case, &target.subject, metric, &format!("{e:#}"))),
                }
            }
        }
        progress.done(targets.len() as u64);
    }
    let mut before = Vec::new();
    for target in &targets {
        before.push(occupied(target).await);
    }
    let (outcomes, cpu) = measure(&targets, PUT_CASE, plan, &progress, |target, round| {
        let (addr, prefix) = (target.addr, target.put_prefix);
        Arc::new(move |w, seq| {
            // Random content per request: no write is a dedup hit, and no
            // engine's compression finds anything to squeeze.
            let mut body = vec![0u8; PUT_SIZE];
            SmallRng::seed_from_u64(((round as u64) << 56) ^ ((w as u64) << 40) ^ seq).fill(&mut body[..]);
            load::request(Method::PUT, addr, &format!("{prefix}{round}-{w}-{seq}"), body.into())
        })
    })
    .await;
    for ((target, outcome), before) in targets.iter().zip(&outcomes).zip(before) {
        rows.extend(rate_rows(PUT_CASE, &target.subject, outcome, None));
        if let Ok(outcome) = outcome {
            let logical = outcome.ok_total * PUT_SIZE as u64;
            let metric = "disk bytes per byte";
            match (occupied(target).await, before) {
                _ if logical == 0 => {}
                (Ok(after), Ok(before)) => {
                    let grown = after.saturating_sub(before);
                    rows.push(Row::single(NAME, PUT_CASE, &target.subject, metric, grown as f64 / logical as f64));
                }
                (Err(e), _) | (_, Err(e)) => {
                    rows.push(Row::skipped(NAME, PUT_CASE, &target.subject, metric, &format!("{e:#}")))
                }
            }
        }
    }
    rows.extend(ratio_rows(PUT_CASE, &targets, &outcomes));
    rows.extend(cpu_rows(PUT_CASE, &targets, &cpu));
    let uneven = nginx_outcome(&targets, &outcomes).and_then(|o| uneven_rounds(&o.per_round));
    progress.done(targets.len() as u64);
    drop(servers);
    drop(nginx);
    drop(data_dirs);
    drop(nginx_dir);
    progress.finish();
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "Serving files over HTTP (seed: nginx vs GridFS serving)".into(),
        method: vec![
            format!(
                "{CONCURRENCY} keep-alive connections, each sending its next request when the last answer is read; \
                 {} rounds of {} s per server, the rounds of the servers taking turns, each after a warm-up \
                 ({:.1} s before the first, {:.1} s before the others); median and spread (min..max) of the \
                 rounds' rates, p50/p99 over every request measured. \"× nginx\": the ratio of each round's rate to \
                 the rate of nginx's round that followed it, median and spread.",
                plan.rounds,
                plan.round.as_secs_f64(),
                plan.warmup.as_secs_f64(),
                rewarm(plan).as_secs_f64(),
            ),
            "ms/request is the seed's unit (ab's time per request across all concurrent requests): 1000 / req/s. \
             The seed column gives nginx from disk for nginx, nginx-gridfs (a database-backed server) for depot; \
             the seed ran ab -c 100 -n 500 from another machine (EC2 m1.medium)."
                .into(),
            format!(
                "nginx: sendfile on, open_file_cache off, {} worker processes; depot: --threads {}. \
                 PUTs write new 1 KB keys with distinct content (depot: every answer durable; nginx WebDAV: \
                 not synced). Disk bytes per byte: growth of the data directory (and of what the engine's \
                 server reports it occupies, for server engines) / bytes written.",
                settings.threads, settings.threads
            ),
            "CPU µs/request: CPU time (user and system, from /proc) over a round and its warm-up, divided by \
             the requests answered in it; \"server\": the server's (nginx: master and workers; depot: with \
             its engine's own server when that runs on this machine), \"load generator\": this process's, \
             which shares the machine's cores with the server."
                .into(),
        ]
        .into_iter()
        .chain(uneven.map(|(slowest, fastest)| {
            format!(
                "**Warning:** nginx's WebDAV PUT rounds ranged from {} to {} req/s, so the PUT ratio says more \
                 about the file system than about depot. One cause seen: ext4 without a journal does not reuse \
                 inodes freed in the last five minutes, and creating files slows to a crawl soon after many were \
                 deleted (another run's clean-up included). Run again five minutes later.",
                thousands(slowest as u64),
                thousands(fastest as u64)
            )
        }))
        .collect(),
        chart_metric: MS.into(),
        ratio: Some(Ratio { metric: RATIO.into(), of_rates: true }),
        also_charted: vec![("cpu".into(), CPU.into())],
        rows,
    })
}

/// The slowest and fastest of a subject's rounds, when they differ by more
/// than 3×: more than this machine's drift, something outside the subject.
fn uneven_rounds(rates: &[f64]) -> Option<(f64, f64)> {
    let slowest = rates.iter().copied().reduce(f64::min)?;
    let fastest = rates.iter().copied().reduce(f64::max)?;
    (fastest > 3.0 * slowest).then_some((slowest, fastest))
}

/// The warm-up before every round but the first: the connections are new.
fn rewarm(plan: Plan) -> Duration {
    plan.warmup.min(Duration::from_millis(500))
}

/// CPU time per request answered in each round, in microseconds: the
/// server's and the load generator's.
#[derive(Default)]
struct CpuPerRequest {
    server: Vec<f64>,
    client: Vec<f64>,
}

/// Runs one case against every target, their rounds taking turns; `make`
/// builds the requests of a target's round.
async fn measure(
    targets: &[Target],
    case: &str,
    plan: Plan,
    progress: &Progress,
    make: impl Fn(&Target, usize) -> load::MakeRequest,
) -> (Vec<Result<load::Outcome, String>>, Vec<CpuPerRequest>) {
    let mut outcomes: Vec<Result<Option<load::Outcome>, String>> = targets.iter().map(|_| Ok(None)).collect();
    let mut cpu: Vec<CpuPerRequest> = targets.iter().map(|_| CpuPerRequest::default()).collect();
    let client = std::process::id();
    for round in 0..plan.rounds {
        let warmup = if round == 0 { plan.warmup } else { rewarm(plan) };
        let one = Plan { rounds: 1, warmup, ..plan };
        for ((target, outcome), cpu) in targets.iter().zip(&mut outcomes).zip(&mut cpu) {
            let Ok(so_far) = outcome else { continue };
            progress.doing(&format!("{}: {case}, round {} of {}", target.subject, round + 1, plan.rounds));
            let before = (serving_cpu(&target.pids), rss::cpu_seconds(client));
            match load::run(target.addr, one, make(target, round)).await {
                Ok(o) => {
                    let after = (serving_cpu(&target.pids), rss::cpu_seconds(client));
                    cpu.server.extend(micros_per_request(before.0, after.0, o.ok_total));
                    cpu.client.extend(micros_per_request(before.1, after.1, o.ok_total));
                    match so_far {
                        Some(all) => all.extend(o),
                        None => *so_far = Some(o),
                    }
                }
                Err(e) => {
                    // A failed target's case is reported failed, CPU included.
                    *cpu = CpuPerRequest::default();
                    *outcome = Err(format!("failed: {e:#}"));
                }
            }
        }
    }
    let outcomes = outcomes.into_iter().map(|o| o.and_then(|o| o.ok_or_else(|| "no round ran".to_string()))).collect();
    (outcomes, cpu)
}

/// CPU seconds the processes serving a target have used so far.
fn serving_cpu(pids: &[u32]) -> Option<f64> {
    pids.iter().map(|pid| rss::tree_cpu_seconds(*pid)).sum()
}

/// Microseconds of CPU per request between two readings in seconds;
/// `None` when a reading is missing or nothing was answered.
fn micros_per_request(before: Option<f64>, after: Option<f64>, requests: u64) -> Option<f64> {
    let spent = after? - before?;
    (requests > 0).then(|| spent * 1e6 / requests as f64)
}

/// Each target's CPU time per request, server and load generator, over
/// the rounds it ran.
fn cpu_rows(case: &str, targets: &[Target], cpu: &[CpuPerRequest]) -> Vec<Row> {
    let mut rows = Vec::new();
    for (target, cpu) in targets.iter().zip(cpu) {
        for (whose, values) in [("server", &cpu.server), ("load generator", &cpu.client)] {
            if let Some(s) = Summary::of(values) {
                rows.push(Row::measured(NAME, case, &format!("{}: {whose}", target.subject), CPU, s));
            }
        }
    }
    rows
}

/// nginx's rounds of a case, when it ran them.
fn nginx_outcome<'a>(targets: &[Target], outcomes: &'a [Result<load::Outcome, String>]) -> Option<&'a load::Outcome> {
    targets.iter().zip(outcomes).find(|(t, _)| t.subject == "nginx").and_then(|(_, o)| o.as_ref().ok())
}

/// Each depot target's rate as a multiple of nginx's, round by round.
fn ratio_rows(case: &str, targets: &[Target], outcomes: &[Result<load::Outcome, String>]) -> Vec<Row> {
    let Some(nginx) = nginx_outcome(targets, outcomes) else {
        return Vec::new();
    };
    let mut rows = Vec::new();
    for (target, outcome) in targets.iter().zip(outcomes) {
        let Ok(outcome) = outcome else { continue };
        if target.subject == "nginx" {
            continue;
        }
        let ratios: Vec<f64> = outcome.per_round.iter().zip(&nginx.per_round).map(|(d, n)| d / n).collect();
        if let Some(s) = Summary::of(&ratios).filter(|s| s.max.is_finite()) {
            rows.push(Row::measured(NAME, case, &target.subject, RATIO, s));
        }
    }
    rows
}

/// Bytes a target's writes occupy: its directory, plus what the engine's
/// server reports for server engines.
async fn occupied(target: &Target) -> anyhow::Result<u64> {
    let mut total = disk_usage(&target.written);
    if target.on_a_server {
        total += remote_disk_bytes(target.addr).await?;
    }
    Ok(total)
}

/// The rows of one load run: rate, ms/request, p50 and p99.
fn rate_rows(
    case: &str,
    subject: &str,
    outcome: &Result<load::Outcome, String>,
    seed: Option<(f64, &str)>,
) -> Vec<Row> {
    let outcome = match outcome {
        Ok(o) => o,
        Err(why) => return vec![Row::skipped(NAME, case, subject, MS, why).with_seed(seed)],
    };
    let mut rows = Vec::new();
    if let Some(rate) = outcome.rate().filter(|r| r.min > 0.0) {
        rows.push(Row::measured(NAME, case, subject, "req/s", rate));
        rows.push(Row::measured(NAME, case, subject, MS, rate.map_decreasing(|r| 1000.0 / r)).with_seed(seed));
    } else {
        rows.push(Row::skipped(NAME, case, subject, MS, "no request completed in some round").with_seed(seed));
    }
    for (p, metric) in [(50.0, "p50 ms"), (99.0, "p99 ms")] {
        if let Some(ms) = outcome.latency_ms(p) {
            rows.push(Row::single(NAME, case, subject, metric, ms));
        }
    }
    rows
}

/// wrk's request rate for GETs of `path`.
async fn run_wrk(
    wrk: &std::path::Path,
    addr: SocketAddr,
    path: &str,
    threads: usize,
    secs: u64,
) -> anyhow::Result<f64> {
    let out = tokio::process::Command::new(wrk)
        .arg(format!("-t{}", threads.clamp(1, CONCURRENCY)))
        .arg(format!("-c{CONCURRENCY}"))
        .arg(format!("-d{secs}s"))
        .arg(format!("http://{addr}{path}"))
        .kill_on_drop(true)
        .output()
        .await?;
    let text = String::from_utf8_lossy(&out.stdout);
    parse_wrk(&text)
        .ok_or_else(|| anyhow::anyhow!("wrk: {} {}", text.trim(), String::from_utf8_lossy(&out.stderr).trim()))
}

/// The request rate from wrk's summary, unless some answers were not
/// 2xx/3xx or some requests failed on their socket (connect, read, write,
/// timeout).
fn parse_wrk(text: &str) -> Option<f64> {
    if text.contains("Non-2xx or 3xx responses") || text.contains("Socket errors:") {
        return None;
    }
    text.lines().find_map(|l| l.trim().strip_prefix("Requests/sec:")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each of depot's rounds is set against nginx's round of the same
    /// index: rounds 1, 2, 4 against 4, 2, 1 give the ratios 0.25, 1 and
    /// 4. Paired any other way (sorted, or medians divided) they would
    /// give 1, 1, 1, and rounds of nginx that failed would shift them.
    #[test]
    fn ratios_pair_rounds_of_the_same_index() {
        let target = |subject: &str| Target {
            subject: subject.into(),
            addr: "127.0.0.1:1".parse().unwrap(),
            pids: Vec::new(),
            get_prefix: "",
            put_prefix: "",
            written: PathBuf::new(),
            on_a_server: false,
            from_disk: true,
        };
        let outcome = |per_round: &[f64]| {
            Ok(load::Outcome { per_round: per_round.to_vec(), latencies_us: Vec::new(), ok_total: 0 })
        };
        let targets = [target("depot hybrid"), target("nginx"), target("depot fs")];
        let outcomes = [outcome(&[1.0, 2.0, 4.0]), outcome(&[4.0, 2.0, 1.0]), Err("failed".to_string())];
        let rows = ratio_rows("GET 1 KB", &targets, &outcomes);
        assert_eq!(rows.len(), 1, "one ratio, for the subject that ran: {rows:?}");
        let row = &rows[0];
        assert_eq!((row.subject.as_str(), row.metric.as_str()), ("depot hybrid", RATIO));
        assert_eq!((row.value, row.min, row.max), (Some(1.0), Some(0.25), Some(4.0)));
    }

    #[test]
    fn cpu_is_counted_in_microseconds_per_request() {
        assert_eq!(micros_per_request(Some(10.0), Some(10.5), 20_000), Some(25.0));
        assert_eq!(micros_per_request(None, Some(10.5), 20_000), None, "a server gone meanwhile");
        assert_eq!(micros_per_request(Some(10.0), None, 20_000), None);
        assert_eq!(micros_per_request(Some(10.0), Some(10.5), 0), None, "nothing answered");
    }

    #[test]
    fn wrk_summaries_are_read() {
        let ok = "Running 1s test @ http://127.0.0.1:1/x\n  2 threads and 100 connections\n\
                  Requests/sec:  12345.67\nTransfer/sec:      1.00MB\n";
        assert_eq!(parse_wrk(ok), Some(12345.67));
        assert_eq!(parse_wrk("  Non-2xx or 3xx responses: 5\nRequests/sec: 10.0\n"), None);
        assert_eq!(parse_wrk("unable to connect"), None);
        assert_eq!(parse_wrk("  Socket errors: connect 0, read 0, write 0, timeout 3\nRequests/sec: 10.0\n"), None);
    }

    #[test]
    fn rounds_apart_by_more_than_three_times_are_uneven() {
        // nginx's WebDAV PUT rounds in a run soon after another's clean-up.
        assert_eq!(uneven_rounds(&[15_412.0, 2_283.0, 1_744.7, 2_100.0]), Some((1_744.7, 15_412.0)));
        // This machine's usual drift between rounds.
        assert_eq!(uneven_rounds(&[12_347.3, 14_146.7, 12_580.3]), None);
        assert_eq!(uneven_rounds(&[]), None);
    }
}
