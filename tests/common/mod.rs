//! Test harness: runs the real `depot` binary on a free loopback port with
//! its own data directory, and talks to it over real sockets.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_depot");

/// A running `depot serve`.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub addr: String,
    pub data: PathBuf,
    /// Everything the server logged so far.
    pub log: Arc<Mutex<String>>,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a server on a fresh data directory.
    pub fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let mut s = Server::start_in(&data, extra);
        s._dir = Some(dir);
        s
    }

    /// Starts a server on `data` (kept after the server stops).
    pub fn start_in(data: &Path, extra: &[&str]) -> Server {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--data"]).arg(data).args(extra);
        if !extra.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !extra.contains(&"--gc-interval") {
            cmd.args(["--gc-interval", "0"]);
        }
        without_depot_settings(&mut cmd);
        cmd.env("DEPOT_LOG", "info").stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning depot");
        let stderr = child.stderr.take().expect("stderr piped");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("listening on http://") {
                    let rest = &line[at + "listening on http://".len()..];
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                panic!("depot did not start; log:\n{}", log.lock().unwrap());
            }
        };
        Server { child, url: format!("http://{addr}"), addr, data: data.to_path_buf(), log, _dir: None }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        unsafe_kill(self.pid(), 15);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "depot did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("wait").is_none()
    }

    /// Peak resident memory so far (VmHWM), in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("proc status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    }

    pub fn object_url(&self, bucket: &str, key: &str) -> String {
        format!("{}/{bucket}/{}", self.url, encode(key))
    }

    /// Asserts the log shows no panic.
    pub fn assert_no_panic(&self) {
        let log = self.log.lock().unwrap();
        assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_kill(pid: u32, signal: i32) {
    let _ = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status();
}

/// Clears the caller's `DEPOT_*` variables, so only the given flags count.
fn without_depot_settings(cmd: &mut Command) {
    for (k, _) in std::env::vars() {
        if k.starts_with("DEPOT_") {
            cmd.env_remove(k);
        }
    }
}

/// Runs `depot ARGS` to its end, without the caller's `DEPOT_*` settings.
pub fn depot(args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    without_depot_settings(&mut cmd);
    cmd.output().expect("running depot")
}

/// Percent-encodes a key for a URL path, keeping `/`.
pub fn encode(key: &str) -> String {
    const SET: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'/').remove(b'-').remove(b'_').remove(b'.').remove(b'~');
    percent_encoding::utf8_percent_encode(key, SET).to_string()
}

/// Deterministic, incompressible bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0x2545_F491_4F6C_DD1D);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

pub fn md5_hex(bytes: &[u8]) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(bytes))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().unwrap()
}

/// Sends raw bytes over a new TCP connection and returns everything the
/// server answers until it closes or goes quiet for `quiet`.
pub fn raw(addr: &str, request: &[u8], quiet: Duration) -> String {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(quiet)).unwrap();
    s.write_all(request).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status code of the first response in a raw answer.
pub fn status_of(raw: &str) -> u16 {
    raw.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Files (not directories) under `dir`, recursively.
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// What a key may hold after a crash or an outage: the last body the
/// server acknowledged (or what it held before, until overwritten), or a
/// body in flight when it struck (SHA-256s).
#[derive(Clone, Debug, Default)]
pub struct Allowed {
    pub acked: Option<String>,
    pub in_flight: Option<String>,
}

/// Writers' record of what they sent and what was acknowledged, per key.
#[derive(Clone, Default)]
pub struct Ledger {
    keys: Arc<Mutex<std::collections::HashMap<String, Allowed>>>,
    /// What keys held before this ledger's writes (an earlier round).
    before: Arc<std::collections::HashMap<String, String>>,
    acks: Arc<std::sync::atomic::AtomicUsize>,
}

impl Ledger {
    /// A ledger for keys that held `before` (key to SHA-256) so far.
    pub fn after(before: std::collections::HashMap<String, String>) -> Ledger {
        Ledger { before: Arc::new(before), ..Ledger::default() }
    }

    pub fn sending(&self, key: &str, sha: &str) {
        let mut keys = self.keys.lock().unwrap();
        let entry = keys
            .entry(key.to_string())
            .or_insert_with(|| Allowed { acked: self.before.get(key).cloned(), in_flight: None });
        entry.in_flight = Some(sha.to_string());
    }

    pub fn acked(&self, key: &str, sha: &str) {
        self.acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut keys = self.keys.lock().unwrap();
        keys.insert(key.to_string(), Allowed { acked: Some(sha.to_string()), in_flight: None });
    }

    /// Writes acknowledged through this ledger.
    pub fn acked_count(&self) -> usize {
        self.acks.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Every acknowledged write reads back whole from `base/files/KEY`; an
    /// unacknowledged one is wholly there or absent. Returns what each key
    /// that holds an object holds (SHA-256).
    pub async fn assert_survivors(&self, base: &str) -> std::collections::HashMap<String, String> {
        let all = self.keys.lock().unwrap().clone();
        let http = client();
        let mut held = std::collections::HashMap::new();
        for (key, allowed) in &all {
            let r = http.get(format!("{base}/files/{key}")).send().await.unwrap();
            if r.status() == 404 {
                assert!(allowed.acked.is_none(), "acknowledged {key} is gone");
                continue;
            }
            assert_eq!(r.status(), 200);
            let got = sha256_hex(&r.bytes().await.unwrap());
            let ok = allowed.acked.as_ref() == Some(&got) || allowed.in_flight.as_ref() == Some(&got);
            assert!(ok, "{key} holds bytes never acknowledged nor in flight");
            held.insert(key.clone(), got);
        }
        held
    }
}

/// The one number a query on the sqlite engine's database returns, read
/// beside the running server.
pub fn sqlite_count(db: &Path, query: &str) -> i64 {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    c.query_row(query, [], |r| r.get(0)).unwrap()
}

/// A device of its own for one test (a tmpfs of `size`), unmounted when
/// dropped, however the test ends.
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    /// Mounts it at `at`. Where that is not allowed (not root, no
    /// CAP_SYS_ADMIN) the test fails saying so, unless
    /// DEPOT_TEST_NO_MOUNT is set: then `None`, and the test is skipped.
    pub fn mount(at: &std::path::Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("running mount");
        if out.status.success() {
            return Some(Tmpfs(at.to_path_buf()));
        }
        let why = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::env::var_os("DEPOT_TEST_NO_MOUNT").is_some(),
            "this test fills a tmpfs and must mount one (run as root), or set DEPOT_TEST_NO_MOUNT=1 to skip it: {why}"
        );
        eprintln!("skipped (DEPOT_TEST_NO_MOUNT): cannot mount a tmpfs here: {why}");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}
