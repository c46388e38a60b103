//! The facts about this machine and run that every report opens with:
//! CPU, memory, the disk holding the data, kernel, build profile, the
//! peers found and how hard they were loaded. Read from /proc and /sys;
//! whatever cannot be read says so instead of failing the run.

use std::path::Path;
use std::process::Command;

use super::{Settings, find_program, is_root};

/// Label and value, in report order.
pub type Facts = Vec<(String, String)>;

pub fn facts(out: &Path, settings: &Settings) -> Facts {
    let unknown = || "unknown".to_string();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(unknown);
    let ram = meminfo_kib("MemTotal").map_or_else(unknown, |k| format!("{:.1} GiB", k as f64 / 1024.0 / 1024.0));
    let kernel =
        std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| unknown(), |s| s.trim().to_string());
    let os = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=")).map(|v| v.trim_matches('"').to_string()))
        .unwrap_or_else(unknown);
    let build =
        if cfg!(debug_assertions) { "debug (timings are not representative: build with --release)" } else { "release" };
    let scale = if settings.quick {
        "--quick (scaled down)"
    } else if settings.full {
        "--full (the seeds' sizes)"
    } else {
        "default sizes"
    };
    vec![
        ("CPU".into(), format!("{cores} cores, {cpu}")),
        ("RAM".into(), ram),
        ("disk".into(), disk(out)),
        ("kernel".into(), format!("Linux {kernel}")),
        ("OS".into(), os),
        ("depot".into(), format!("{} {build}", env!("CARGO_PKG_VERSION"))),
        ("run".into(), format!("{scale}; {} server threads; root: {}", settings.threads, is_root())),
        ("nginx".into(), version_of("nginx", &["-v"])),
        ("wrk".into(), version_of("wrk", &["-v"])),
    ]
}

fn meminfo_kib(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    line.split_whitespace().next()?.parse().ok()
}

/// The file system holding `dir`: device, type, mount point, and whether
/// the kernel calls the device rotational.
fn disk(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let Ok(mounts) = std::fs::read_to_string("/proc/mounts") else { return "unknown".into() };
    let best = mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?, f.next()?))
        })
        .filter(|(_, at, _)| dir.starts_with(at))
        .max_by_key(|(_, at, _)| at.len());
    let Some((device, at, fstype)) = best else { return "unknown".into() };
    let kind = Path::new(device)
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| {
            // A partition's queue is its parent device's: vda1 -> vda.
            let base = n.trim_end_matches(|c: char| c.is_ascii_digit());
            let base = if base.ends_with('p') && base.starts_with("nvme") { &base[..base.len() - 1] } else { base };
            [n, base].iter().find_map(|d| std::fs::read_to_string(format!("/sys/block/{d}/queue/rotational")).ok())
        })
        .map(|r| if r.trim() == "1" { ", rotational" } else { ", non-rotational" })
        .unwrap_or("");
    format!("{device} ({fstype}{kind}) mounted at {at}")
}

/// `program -v` (both nginx and wrk print their version that way), or
/// why it is absent.
fn version_of(program: &str, args: &[&str]) -> String {
    let Some(path) = find_program(program) else { return "not installed".into() };
    match Command::new(&path).args(args).output() {
        Ok(o) => {
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            text.lines().next().unwrap_or("").trim().to_string()
        }
        Err(e) => format!("{}: {e}", path.display()),
    }
}
