//! nginx as the outside peer: files served from disk the way the seed did
//! (`sendfile on`, `open_file_cache` off), and WebDAV PUT for the write
//! half. Runs as a child of the bench with its configuration, pid file,
//! logs and temporary paths in a scratch directory of its own, and as many
//! worker processes as depot has worker threads.
//!
//! For files read cold, nginx reads in a pool of threads (`aio threads`),
//! as an operator serving large files from disk would set it up: its
//! workers then go on serving while a `sendfile` waits for the disk. By
//! hand (40 cold files of 10 MiB, 20 curl clients at random), that read
//! 1,441–1,548 MB/s against 1,028–1,483 without; served from the page
//! cache, the hand-off cost nginx 43–45 µs of CPU per 100 KB answer
//! against 29–35, so the HTTP bench's hot files are served without it.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::find_program;

/// A running nginx.
pub struct Nginx {
    child: Child,
    pub addr: SocketAddr,
    /// The document root: a file `root/x` is served as `/x`.
    pub root: PathBuf,
    /// Where WebDAV PUTs to `/dav/...` land.
    pub dav: PathBuf,
}

/// How the files nginx serves are mostly read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reads {
    /// From the page cache: `sendfile` on the worker.
    Hot,
    /// From the disk: `sendfile` in a pool of threads.
    Cold,
}

/// The configuration: everything nginx writes stays inside `dir`.
/// `as_root`: the master runs as root, whose workers would otherwise run
/// as an unprivileged user, who may not reach `dir` (a run under /root).
pub fn config(dir: &Path, port: u16, workers: usize, reads: Reads, as_root: bool) -> String {
    let d = dir.display();
    let user = if as_root { "user root;\n" } else { "" };
    let aio = if reads == Reads::Cold { "    aio threads;\n" } else { "" };
    format!(
        "daemon off;
{user}master_process on;
worker_processes {workers};
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
{aio}    open_file_cache off;
    keepalive_requests 1000000;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {d}/www;
        location /dav/ {{
            dav_methods PUT;
            create_full_put_path on;
            client_body_temp_path {d}/tmp/dav;
        }}
    }}
}}
"
    )
}

impl Nginx {
    /// Starts nginx in `dir` (created) with `workers` worker processes;
    /// fails with the reason when nginx is absent or will not start.
    pub fn start(dir: &Path, workers: usize, reads: Reads) -> anyhow::Result<Nginx> {
        let Some(program) = find_program("nginx") else { bail!("nginx not installed (Debian package nginx)") };
        let root = dir.join("www");
        let dav = root.join("dav");
        // The workers run as the bench's user, who owns everything here.
        for d in [&dav, &dir.join("tmp")] {
            std::fs::create_dir_all(d)?;
        }
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, config(dir, port, workers, reads, super::is_root()))?;
        let mut child = Command::new(&program)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf)
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", program.display()))?;
        super::running::started(child.id())?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait()? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                super::running::stopped(child.id());
                bail!("nginx exited ({status}): {} {}", err.trim(), log.trim());
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                super::running::stopped(child.id());
                bail!("nginx did not listen on {addr} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Nginx { child, addr, root, dav })
    }

    /// The master process, whose children are the workers.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Puts a file where nginx serves it as `/name`.
    pub fn publish(&self, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
        Ok(std::fs::write(self.root.join(name), bytes)?)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGKILL to the master leaves its workers behind; ask for a fast
        // shutdown (SIGTERM) through nginx itself, then make sure.
        super::running::terminate(self.child.id());
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        super::running::stopped(self.child.id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configuration_keeps_everything_in_its_directory() {
        let c = config(Path::new("/x/n"), 8123, 3, Reads::Hot, false);
        assert!(c.contains("worker_processes 3;"));
        assert!(c.contains("listen 127.0.0.1:8123;"));
        assert!(c.contains("sendfile on;") && c.contains("open_file_cache off;"));
        assert!(c.contains("dav_methods PUT;"));
        let paths = ["pid ", "error_log ", "root ", "_temp_path "];
        let lines: Vec<&str> = c.lines().filter(|l| paths.iter().any(|p| l.contains(p))).collect();
        assert_eq!(lines.len(), 9, "{lines:?}");
        for line in lines {
            assert!(line.contains("/x/n/"), "{line}");
        }
        assert!(!c.contains("user "), "a master not root keeps its own user");
        assert!(!c.contains("aio "), "hot files are sent by the workers themselves");
        let cold = config(Path::new("/x/n"), 8123, 3, Reads::Cold, false);
        assert_eq!(cold.replace("    aio threads;\n", ""), c, "cold reads change nothing but the reads' threads");
    }

    #[test]
    fn a_root_master_keeps_its_workers_root() {
        let c = config(Path::new("/root/bench/n"), 8123, 3, Reads::Hot, true);
        assert_eq!(c.lines().filter(|l| l.starts_with("user ")).collect::<Vec<_>>(), ["user root;"]);
    }
}
