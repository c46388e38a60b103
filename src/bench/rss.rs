//! Memory and CPU time of the processes under test, from `/proc`: a depot
//! server's own peak (the kernel's high-water mark, which can be started
//! over between phases) and CPU seconds; the CPU seconds of a tree of
//! processes (nginx's master and workers, PostgreSQL's postmaster and
//! backends); and the peak of a backend server (PostgreSQL with its
//! per-connection children, a Java server) found by the loopback port it
//! listens on and sampled while an experiment runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// A field of `/proc/PID/status` in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    status_fields(pid, [field]).map(|[bytes]| bytes)
}

/// Fields of `/proc/PID/status` in bytes, from one read of it.
fn status_fields<const N: usize>(pid: u32, fields: [&str; N]) -> Option<[u64; N]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let bytes = |field: &str| -> Option<u64> {
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb * 1024)
    };
    let mut out = [0; N];
    for (slot, field) in out.iter_mut().zip(fields) {
        *slot = bytes(field)?;
    }
    Some(out)
}

/// The most memory a process has held resident since it started.
pub fn peak_rss(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM")
}

/// Starts a process's high-water mark of resident memory over from what it
/// holds now (`clear_refs` 5), so that [`peak_rss`] then gives the peak of
/// what follows, however brief: sampling can miss a peak between samples.
pub fn reset_peak_rss(pid: u32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// Of a process's resident memory, the part that maps files (`RssFile`:
/// pages of the page cache, shared with it and reclaimable, such as the
/// catalog's tables read through a memory map).
pub fn file_rss(pid: u32) -> Option<u64> {
    status_bytes(pid, "RssFile")
}

/// Clock ticks per second in `/proc/PID/stat` (`USER_HZ`, fixed at 100 in
/// the kernel's ABI on every architecture).
const USER_HZ: f64 = 100.0;

/// CPU time a process has used so far, user plus system, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count from the `)` after it.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // Fields 14 and 15 of the man page; the state (field 3) is first here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) as f64 / USER_HZ)
}

/// CPU time a process and its descendants have used so far (nginx's master
/// and its workers), in seconds; `None` when the process is gone.
pub fn tree_cpu_seconds(pid: u32) -> Option<f64> {
    let own = cpu_seconds(pid)?;
    Some(own + children(pid).into_iter().filter_map(tree_cpu_seconds).sum::<f64>())
}

/// The children of a process (of its main thread: a server's processes
/// are started from it); none once it is gone.
fn children(pid: u32) -> Vec<u32> {
    let listed = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    listed.split_whitespace().filter_map(|c| c.parse().ok()).collect()
}

/// The port of a server URL (`postgres://u:p@127.0.0.1:5432/db`,
/// `mongodb://localhost/x`) when it is on this machine, with the scheme's
/// default port when none is given; why not otherwise.
pub fn loopback_port(url: &str) -> Result<u16, String> {
    let (scheme, rest) = url.split_once("://").ok_or("not a URL")?;
    let default = match scheme {
        "postgres" | "postgresql" => 5432,
        "mongodb" => 27017,
        "http" => 80,
        "https" => 443,
        other => return Err(format!("no default port known for {other}://")),
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    // The first of several hosts (a replica set) is the one measured.
    let hostport = hostport.split(',').next().unwrap_or("");
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or("an unclosed [ in the host")?;
            (host, after.strip_prefix(':'))
        }
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    if !matches!(host, "localhost" | "::1") && !host.starts_with("127.") {
        return Err(format!("the server ({host}) is not on this machine"));
    }
    match port {
        None | Some("") => Ok(default),
        Some(p) => p.parse().map_err(|_| format!("port {p:?}")),
    }
}

/// Memory resident now in a process and all its descendants. Shared
/// memory, which every process that touched it counts in its own resident
/// set (PostgreSQL's buffers, mapped by each backend), counts once: as the
/// most that any one of them has resident.
pub fn tree_rss(pid: u32) -> u64 {
    let (own, shared) = tree_memory(pid);
    own + shared
}

/// The private and file-backed memory resident in a process and its
/// descendants, and the most shared memory resident in any one of them.
fn tree_memory(pid: u32) -> (u64, u64) {
    let [anon, file, shmem] = status_fields(pid, ["RssAnon", "RssFile", "RssShmem"]).unwrap_or_default();
    let (mut own, mut shared) = (anon + file, shmem);
    for child in children(pid) {
        let (o, s) = tree_memory(child);
        own += o;
        shared = shared.max(s);
    }
    (own, shared)
}

/// The process listening on a TCP port (IPv4 or IPv6), found through the
/// socket's inode; `None` when nothing listens or the process is not ours
/// to inspect.
pub fn listener_pid(port: u16) -> Option<u32> {
    const LISTEN: &str = "0A";
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (fields.get(1), fields.get(3), fields.get(9)) else {
                continue;
            };
            let local_port = local.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
            if *state == LISTEN && local_port == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && inodes.iter().any(|i| target.as_os_str() == i.as_str())
            {
                return Some(pid);
            }
        }
    }
    None
}

/// Samples a process tree's resident memory every 50 ms on a thread of its
/// own until stopped, keeping the peak: for a tree of processes, whose
/// high-water marks are each their own.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(tree_rss(pid)));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(tree_rss(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Sampler { stop, peak, thread: Some(thread) }
    }

    /// Stops sampling; the peak seen.
    pub fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};

    /// Runs a Python script until it prints `said`.
    fn python_until(script: &str, said: &str) -> Child {
        let mut child =
            Command::new("python3").args(["-c", script]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), said);
        child
    }

    /// Stops a process and its children.
    fn stop(mut child: Child) {
        for c in children(child.id()) {
            let _ = Command::new("kill").arg(c.to_string()).status();
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn finds_the_listener_of_a_port_and_its_memory() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(listener_pid(port), Some(std::process::id()));
        let peak = peak_rss(std::process::id()).unwrap();
        assert!(peak > 1 << 20, "a test process holds more than a megabyte: {peak}");
        let sampler = Sampler::start(std::process::id());
        std::thread::sleep(Duration::from_millis(120));
        let sampled = sampler.finish();
        assert!(sampled > 1 << 20 && sampled <= peak_rss(std::process::id()).unwrap(), "{sampled}");
        drop(listener);
        assert_eq!(listener_pid(port), None);
    }

    /// Two processes that both touched 64 MiB of shared memory, as
    /// PostgreSQL's backends touch its buffers, hold it once.
    #[test]
    fn shared_memory_counts_once_in_a_tree() {
        const SHARED: u64 = 64 << 20;
        let script = format!(
            "import mmap, os, sys, time\n\
             m = mmap.mmap(-1, {SHARED})\n\
             m.write(b'x' * {SHARED})\n\
             r, w = os.pipe()\n\
             if os.fork() == 0:\n    sum(m[i] for i in range(0, {SHARED}, 4096)); os.write(w, b'.'); time.sleep(60); os._exit(0)\n\
             os.read(r, 1)\n\
             print('ready', flush=True)\n\
             time.sleep(60)\n"
        );
        let child = python_until(&script, "ready");
        let pid = child.id();
        let shared_in = |p: u32| status_bytes(p, "RssShmem").unwrap();
        let grandchildren = children(pid);
        let total = tree_rss(pid);
        let shared = (shared_in(pid), grandchildren.first().map(|g| shared_in(*g)));
        stop(child);
        assert!(shared.0 >= SHARED && shared.1 >= Some(SHARED), "both touched it all: {shared:?}");
        assert!((SHARED..SHARED * 3 / 2).contains(&total), "{total} bytes for {SHARED} shared and two interpreters");
    }

    /// A peak of 64 MiB held for a moment and freed is in the high-water
    /// mark until it is reset, and out of it after.
    #[test]
    fn the_peak_starts_over_when_reset() {
        const HELD: u64 = 64 << 20;
        let script = format!(
            "import sys\n\
             b = bytearray({HELD}); b[::4096] = b'x' * ({HELD} // 4096); del b\n\
             print('freed', flush=True)\n\
             sys.stdin.readline()\n"
        );
        let child = python_until(&script, "freed");
        let pid = child.id();
        let before = peak_rss(pid).unwrap();
        reset_peak_rss(pid).unwrap();
        let after = peak_rss(pid).unwrap();
        stop(child);
        assert!(before >= HELD, "the peak holds what was touched: {before}");
        assert!(after + HELD / 2 < before, "and starts over when reset: {before} -> {after}");
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let before = cpu_seconds(std::process::id()).unwrap();
        let started = std::time::Instant::now();
        let mut x = 1u64;
        while started.elapsed() < Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = cpu_seconds(std::process::id()).unwrap();
        assert!(after - before >= 0.1, "{before} -> {after}");
    }

    /// A parent at rest whose child worked: the tree's CPU time is the
    /// child's, which the parent's own does not count while it runs.
    #[test]
    fn cpu_time_of_a_tree_counts_the_children() {
        let script = "import os, sys, time\n\
             r, w = os.pipe()\n\
             if os.fork() == 0:\n    t = time.process_time()\n    while time.process_time() - t < 0.4: pass\n    \
             os.write(w, b'.'); time.sleep(60); os._exit(0)\n\
             os.read(r, 1)\n\
             print('worked', flush=True)\n\
             sys.stdin.readline()\n";
        let child = python_until(script, "worked");
        let pid = child.id();
        let (own, tree) = (cpu_seconds(pid).unwrap(), tree_cpu_seconds(pid).unwrap());
        stop(child);
        assert!(tree - own >= 0.3, "the child's 0.4 s: own {own} s, tree {tree} s");
    }

    #[test]
    fn ports_of_local_servers_are_read_from_urls() {
        assert_eq!(loopback_port("postgres://depot:depot@127.0.0.1:5433/depot"), Ok(5433));
        assert_eq!(loopback_port("postgresql://localhost/db?sslmode=disable"), Ok(5432));
        assert_eq!(loopback_port("mongodb://u:p@[::1]:27018/x"), Ok(27018));
        assert_eq!(loopback_port("mongodb://127.0.0.1"), Ok(27017));
        assert!(loopback_port("postgres://db.example.com:5432/x").unwrap_err().contains("not on this machine"));
        assert!(loopback_port("localhost:5432").is_err());
    }
}
