//! The command-line client against a real server: put, ls, get, rm, and
//! the errors a person sees.

mod common;

use std::process::Command;

use common::{BIN, Server, pattern};

fn depot(server: &Server, args: &[&str], dir: &std::path::Path) -> std::process::Output {
    Command::new(BIN).current_dir(dir).args(args).args(["--server", &server.url]).output().unwrap()
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// No temporary file of a download is left in `dir`.
fn assert_no_partial_download(dir: &std::path::Path) {
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("depot-part"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn put_ls_get_rm_round_trip() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let big = pattern(3 << 20, 1);
    let small = b"small file\n".to_vec();
    std::fs::write(dir.path().join("big.bin"), &big).unwrap();
    std::fs::write(dir.path().join("note.txt"), &small).unwrap();

    let said = ok(&depot(&server, &["put", "big.bin", "note.txt", "files/trip/"], dir.path()));
    assert!(said.contains("files/trip/big.bin") && said.contains("files/trip/note.txt"), "{said}");
    let said = ok(&depot(&server, &["put", "note.txt", "files/again.txt"], dir.path()));
    assert!(said.contains("deduplicated"), "the same bytes again are a dedup hit: {said}");

    let listing = ok(&depot(&server, &["ls", "files"], dir.path()));
    assert!(listing.contains("trip/") && listing.contains("again.txt"), "{listing}");
    let listing = ok(&depot(&server, &["ls", "files/trip"], dir.path()));
    assert!(listing.contains("trip/big.bin") && listing.contains("3.00 MiB"), "{listing}");
    // No folder of that name: what starts with it.
    let listing = ok(&depot(&server, &["ls", "files/trip/no"], dir.path()));
    assert!(listing.contains("trip/note.txt") && !listing.contains("big.bin"), "{listing}");
    let listing = ok(&depot(&server, &["ls", "files/tr"], dir.path()));
    assert!(listing.contains("trip/") && !listing.contains("again.txt"), "{listing}");
    assert!(ok(&depot(&server, &["ls"], dir.path())).contains("files/"));

    ok(&depot(&server, &["get", "files/trip/big.bin", "back.bin"], dir.path()));
    assert!(std::fs::read(dir.path().join("back.bin")).unwrap() == big);
    ok(&depot(&server, &["get", "files/trip/note.txt"], dir.path()));
    assert_eq!(std::fs::read(dir.path().join("note.txt")).unwrap(), small);
    let stdout = depot(&server, &["get", "files/again.txt", "-"], dir.path());
    assert_eq!(ok(&stdout).as_bytes(), small);

    ok(&depot(&server, &["rm", "files/trip/big.bin"], dir.path()));
    let missing = depot(&server, &["get", "files/trip/big.bin", "gone.bin"], dir.path());
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(err.contains("NoSuchKey") && err.contains("404"), "{err}");
    assert!(!dir.path().join("gone.bin").exists(), "a failed download leaves no file");
    assert_no_partial_download(dir.path());
}

/// A local directory named like the target does not make the target a
/// file to upload: a directory could not be uploaded anyway.
#[test]
fn a_target_named_like_a_local_directory_is_the_target() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("note.txt"), b"note").unwrap();
    std::fs::create_dir(dir.path().join("files")).unwrap();
    let said = ok(&depot(&server, &["put", "note.txt", "files"], dir.path()));
    assert!(said.contains("files/note.txt"), "{said}");
}

/// What `get` writes is checked against the SHA-256 the server stored:
/// bytes damaged on the server's disk fail the download and replace
/// nothing.
#[test]
fn get_refuses_bytes_that_are_not_the_objects() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_in(&data, &["--engine", "fs"]);
    let body = pattern(300_000, 4);
    std::fs::write(dir.path().join("up.bin"), &body).unwrap();
    ok(&depot(&server, &["put", "up.bin", "files/damaged.bin"], dir.path()));
    let sha = common::sha256_hex(&body);
    let blob = data.join("fs/blobs").join(&sha[..2]).join(&sha[2..4]).join(&sha);
    let mut damaged = std::fs::read(&blob).unwrap();
    damaged[1000] ^= 1;
    std::fs::write(&blob, damaged).unwrap();
    std::fs::write(dir.path().join("kept.bin"), b"the good copy").unwrap();
    let out = depot(&server, &["get", "files/damaged.bin", "kept.bin"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SHA-256") && err.contains(&sha), "{err}");
    assert_eq!(std::fs::read(dir.path().join("kept.bin")).unwrap(), b"the good copy", "the file was replaced");
    assert_no_partial_download(dir.path());
}

#[test]
fn unreachable_server_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .current_dir(dir.path())
        .args(["ls", "files", "--server", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach the depot server"));
}

/// Without the secret a server needs, the refusal is said as the server
/// wrote it, its XML escapes undone.
#[test]
fn a_refusal_for_want_of_credentials_reads_plainly() {
    let s = Server::start(&["--access-key", "app", "--secret-key", "a-long-random-secret"]);
    let dir = tempfile::tempdir().unwrap();
    let out = depot(&s, &["ls", "files"], dir.path());
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("AccessDenied (403)") && said.contains("Authorization: Bearer <secret>"), "{said}");
}

/// A `--server` with a bucket in its path reaches a server, but what comes
/// back is not what was asked for: the error says to check `--server`.
#[test]
fn a_server_address_with_a_path_is_a_clear_error() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.txt");
    std::fs::write(&file, "a").unwrap();
    ok(&depot(&server, &["put", file.to_str().unwrap(), "files/a.txt"], dir.path()));
    let out = Command::new(BIN).args(["ls", "--server", &format!("{}/files", server.url)]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("did not answer with a list of buckets: is --server"), "{stderr}");
}

/// Keys are keys: `a/../b` is not `b`, though URL libraries would make it
/// so; a folder is not a file; a pipe is uploaded whole.
#[test]
fn odd_keys_folders_and_pipes() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dotted"), b"dotted").unwrap();
    std::fs::write(dir.path().join("plain"), b"plain").unwrap();
    ok(&depot(&server, &["put", "plain", "files/b"], dir.path()));
    for key in ["a/../b", "../up", "./here"] {
        let said = ok(&depot(&server, &["put", "dotted", &format!("files/{key}")], dir.path()));
        assert!(said.contains(key), "{said}");
        let got = depot(&server, &["get", &format!("files/{key}"), "-"], dir.path());
        assert_eq!(ok(&got), "dotted", "{key}");
    }
    ok(&depot(&server, &["rm", "files/a/../b"], dir.path()));
    assert_eq!(ok(&depot(&server, &["get", "files/b", "-"], dir.path())), "plain", "rm took the key it was given");
    assert_eq!(depot(&server, &["get", "files/a/../b", "-"], dir.path()).status.code(), Some(1));
    let out = depot(&server, &["put", "plain", "files/.."], dir.path());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be put in a URL"), "{out:?}");
    // Nor are buckets: `.` and `..` are refused, not dropped from the URL
    // (`put plain .` was a PUT of /plain, creating a bucket of that name).
    for args in [&["put", "plain", "."][..], &["put", "plain", "./b"], &["rm", "../files/b"]] {
        let out = depot(&server, args, dir.path());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("bucket name"), "{args:?}: {err}");
    }
    assert_eq!(ok(&depot(&server, &["get", "files/b", "-"], dir.path())), "plain");
    let out = depot(&server, &["ls", "plain/"], dir.path());
    assert!(!out.status.success(), "no bucket named after the file: {out:?}");

    let out = depot(&server, &["get", "files/folder/"], dir.path());
    assert!(String::from_utf8_lossy(&out.stderr).contains("names a folder"), "{out:?}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "nothing written");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let out = depot(&server, &["put", "sub", "files/dir"], dir.path());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"), "{out:?}");

    let mut child = Command::new(BIN)
        .current_dir(dir.path())
        .args(["put", "/dev/stdin", "files/piped", "--server", &server.url])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let body = pattern(300_000, 9);
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(ok(&out).contains("292.97 KiB"), "the pipe's size: {out:?}");
    let got = Command::new(BIN).args(["get", "files/piped", "-", "--server", &server.url]).output().unwrap();
    assert!(got.stdout == body, "the pipe's bytes");

    std::fs::write(dir.path().join("plain"), b"x").unwrap();
    ok(&depot(&server, &["put", "plain", "files/line\nbreak\u{1b}[31m"], dir.path()));
    let listing = ok(&depot(&server, &["ls", "files"], dir.path()));
    assert!(listing.contains("line\\nbreak\\u{1b}[31m") && !listing.contains('\u{1b}'), "{listing}");
}

/// `get` writes where a person means: into a directory under the object's
/// name, through a symbolic link to its target, into a FIFO or device
/// rather than over it; a replaced file keeps its permissions, and a long
/// file name works.
#[test]
fn get_writes_into_directories_links_and_special_files() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let long = "n".repeat(255);
    std::fs::write(dir.path().join("note.txt"), b"the note").unwrap();
    std::fs::write(dir.path().join(&long), b"long").unwrap();
    ok(&depot(&server, &["put", "note.txt", &long, "files/"], dir.path()));

    std::fs::create_dir(dir.path().join("into")).unwrap();
    ok(&depot(&server, &["get", "files/note.txt", "into"], dir.path()));
    assert_eq!(std::fs::read(dir.path().join("into/note.txt")).unwrap(), b"the note");

    std::fs::write(dir.path().join("target"), b"old").unwrap();
    std::fs::set_permissions(dir.path().join("target"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("target", dir.path().join("link")).unwrap();
    ok(&depot(&server, &["get", "files/note.txt", "link"], dir.path()));
    assert!(std::fs::symlink_metadata(dir.path().join("link")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read(dir.path().join("target")).unwrap(), b"the note");
    let mode = std::fs::metadata(dir.path().join("target")).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a replaced file keeps its permissions");

    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let reader = std::thread::spawn({
        let fifo = fifo.clone();
        move || std::fs::read(fifo).unwrap()
    });
    ok(&depot(&server, &["get", "files/note.txt", "fifo"], dir.path()));
    assert_eq!(reader.join().unwrap(), b"the note", "the FIFO's reader gets the bytes");
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is still one");

    ok(&depot(&server, &["get", &format!("files/{long}")], &dir.path().join("into")));
    assert_eq!(std::fs::read(dir.path().join("into").join(&long)).unwrap(), b"long");
    assert_no_partial_download(dir.path());
}

/// With several arguments a failure is told and the others go on, as with
/// cp and rm; the command still fails.
#[test]
fn several_arguments_go_on_past_a_failure() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("there"), b"there").unwrap();
    let out = depot(&server, &["put", "missing", "there", "files/several/"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing") && err.contains("1 of 2"), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("files/several/there"), "the second file went up");

    let out = depot(&server, &["rm", "files/several/absent", "files/several/there"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 of 2"));
    let gone = depot(&server, &["get", "files/several/there", "back"], dir.path());
    assert!(String::from_utf8_lossy(&gone.stderr).contains("404"), "the second key was removed");
}

/// Unclear uploads are refused before anything goes up: two files for one
/// key, and a last argument that is a file here and a key on the server.
#[test]
fn uploads_that_are_unclear_are_refused() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    for (path, body) in [("a/x.txt", "a"), ("b/x.txt", "b"), ("report.txt", "new"), ("files/report.txt", "old")] {
        std::fs::create_dir_all(dir.path().join(path).parent().unwrap()).unwrap();
        std::fs::write(dir.path().join(path), body).unwrap();
    }
    let out = depot(&server, &["put", "a/x.txt", "b/x.txt", "files/d/"], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("would both be uploaded to files/d/x.txt"), "{err}");
    let out = depot(&server, &["put", "report.txt", "files/report.txt"], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("write ./files/report.txt"), "{err}");
    let listed = ok(&depot(&server, &["ls", "files/"], dir.path()));
    assert!(!listed.contains("x.txt") && !listed.contains("report.txt"), "{listed}");
    // Spelled as a local path, it is one.
    ok(&depot(&server, &["put", "a/x.txt", "./files/report.txt"], dir.path()));
    assert_eq!(ok(&depot(&server, &["get", "files/report.txt", "-"], dir.path())), "old");
}

/// A reader of the output that goes away ends the output, not the work.
#[test]
fn a_closed_output_stops_no_work() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    for k in ["k1", "k2", "k3"] {
        std::fs::write(dir.path().join(k), k).unwrap();
    }
    let run = |args: &[&str]| {
        let mut child = Command::new(BIN)
            .current_dir(dir.path())
            .args(args)
            .args(["--server", &server.url])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        child.wait_with_output().unwrap()
    };
    let out = run(&["put", "k1", "k2", "k3", "files/closed/"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = ok(&depot(&server, &["ls", "files/closed/"], dir.path()));
    assert_eq!(listed.lines().count(), 3, "{listed}");
    let out = run(&["rm", "files/closed/k1", "files/closed/k2", "files/closed/k3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(ok(&depot(&server, &["ls", "files/closed/"], dir.path())), "");
}

const SECRET: &str = "a-long-random-secret";

/// `depot ARGS` in `dir` with only the given `DEPOT_*` variables.
fn depot_env(args: &[&str], env: &[(&str, &str)], dir: &std::path::Path) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir).args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("DEPOT_")) {
        cmd.env_remove(k);
    }
    cmd.envs(env.iter().copied()).output().unwrap()
}

/// Starts `depot serve ARGS` in `dir` with only the given `DEPOT_*`
/// variables; its address once it listens.
fn serve_env(args: &[&str], env: &[(&str, &str)], dir: &std::path::Path) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut cmd = Command::new(BIN);
    cmd.current_dir(dir).arg("serve").args(args).args(["--listen", "127.0.0.1:0", "--gc-interval", "0"]);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("DEPOT_")) {
        cmd.env_remove(k);
    }
    let mut child = cmd.envs(env.iter().copied()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Read to the end, so that the server never writes into a closed pipe.
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut said = String::new();
    while let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(60)) {
        if let Some((_, rest)) = line.split_once("listening on http://") {
            return (child, rest.split_whitespace().next().unwrap().to_string());
        }
        said.push_str(&line);
        said.push('\n');
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("depot serve did not start:\n{said}");
}

/// DEPOT_SECRET_KEY, exported for the client commands, leaves `serve`,
/// `gc`, `verify` and `backup` working: alone it makes no credential
/// (`backup` sends it to the server it asks). Beside DEPOT_ACCESS_KEY it is
/// still the server's credential.
#[test]
fn the_client_secret_variable_leaves_the_server_commands_working() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let client_env = [("DEPOT_SECRET_KEY", SECRET)];
    let mut server =
        Server::start_in(dir.path().join("data").as_path(), &["--access-key", "app", "--secret-key", SECRET]);
    let client = [&client_env[..], &[("DEPOT_SERVER", server.url.as_str())]].concat();
    std::fs::write(dir.path().join("note.txt"), b"note").unwrap();
    ok(&depot_env(&["put", "note.txt", "files/note.txt"], &client, dir.path()));
    let bk = dir.path().join("bk");
    let out =
        depot_env(&["backup", "--data", data, "--listen", &server.addr, bk.to_str().unwrap()], &client_env, dir.path());
    assert!(ok(&out).contains("backed up 1 objects"), "{out:?}");
    assert!(server.stop().success());

    for command in [&["verify", "--data", data][..], &["gc", "--data", data]] {
        ok(&depot_env(command, &client_env, dir.path()));
    }
    // A server is not started open on a guess: the variable alone may have
    // been meant for it.
    let out = depot_env(&["serve", "--data", data, "--listen", "127.0.0.1:0"], &client_env, dir.path());
    assert!(!out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("without an access key"), "{out:?}");

    let pair = [("DEPOT_ACCESS_KEY", "app"), ("DEPOT_SECRET_KEY", SECRET)];
    let (mut child, addr) = serve_env(&["--data", data], &pair, dir.path());
    let server = format!("http://{addr}");
    let anyone = depot_env(&["get", "files/note.txt", "-", "--server", &server], &[], dir.path());
    assert!(String::from_utf8_lossy(&anyone.stderr).contains("AccessDenied (403)"), "{anyone:?}");
    let keyed = depot_env(&["get", "files/note.txt", "-", "--server", &server], &client_env, dir.path());
    assert_eq!(ok(&keyed), "note");
    child.kill().unwrap();
    child.wait().unwrap();

    // A secret flag without its access key is still a mistake, named as such.
    let out = depot_env(&["verify", "--data", data, "--secret-key", SECRET], &[], dir.path());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--secret-key needs its access key"), "{out:?}");

    // A server without credentials takes the data directory's token, which
    // goes with the secret exported for other servers.
    let open = dir.path().join("open");
    let mut server = Server::start_in(&open, &[]);
    let bk = dir.path().join("bk-open");
    let args = ["backup", "--data", open.to_str().unwrap(), "--listen", &server.addr, bk.to_str().unwrap()];
    let out = depot_env(&args, &client_env, dir.path());
    assert!(ok(&out).contains("backed up 0 objects"), "{out:?}");
    assert!(server.stop().success());
}

/// A download cut short by Ctrl-C or by SIGTERM (kill, timeout, systemd)
/// removes its partial file.
#[test]
fn an_interrupted_download_leaves_no_partial_file() {
    // A server that sends the start of a large answer, then nothing more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut conn in listener.incoming().map_while(Result::ok) {
            let _ = std::io::Read::read(&mut conn, &mut [0; 4096]);
            let _ = std::io::Write::write_all(&mut conn, b"HTTP/1.1 200 OK\r\ncontent-length: 100000000\r\n\r\nstart");
            held.push(conn);
        }
    });
    for signal in ["INT", "TERM"] {
        let dir = tempfile::tempdir().unwrap();
        let child = Command::new(BIN)
            .current_dir(dir.path())
            .args(["get", "files/big.bin", "--server", &url])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while std::fs::read_dir(dir.path()).unwrap().count() == 0 {
            assert!(started.elapsed() < std::time::Duration::from_secs(30), "no download began");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(Command::new("kill").arg(format!("-{signal}")).arg(child.id().to_string()).status().unwrap().success());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(1), "SIG{signal}: {out:?}");
        assert_no_partial_download(dir.path());
    }
}

/// Makes the bucket `name` public-read through the S3 API, as the web
/// UI's "New bucket" dialog does.
async fn create_public_bucket(server: &Server, name: &str) {
    let config = depot::engine::S3Config {
        bucket: Some(name.into()),
        region: None,
        access_key: Some("app".into()),
        secret_key: Some(SECRET.into()),
    };
    let builder = depot::engine::s3::builder(Some(&server.url), &config);
    let resolved = depot::engine::s3::resolve(&builder).unwrap();
    let store = builder.build().unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert("x-amz-acl", http::HeaderValue::from_static("public-read"));
    let signed =
        depot::engine::s3::sign(&store, &resolved.region, &http::Method::PUT, &resolved.bucket_url, &headers).await;
    let resp = reqwest::Client::new().put(&resolved.bucket_url).headers(signed.unwrap()).send().await.unwrap();
    assert!(resp.status().is_success(), "{}", resp.text().await.unwrap());
}

/// Without a secret, a server with credentials answers in S3's form and
/// only for public-read buckets: `ls` lists such a bucket all the same,
/// folders, prefixes, escaped keys and pages of it.
#[tokio::test]
async fn a_public_bucket_is_listed_without_a_secret() {
    let server = Server::start(&["--access-key", "app", "--secret-key", SECRET]);
    create_public_bucket(&server, "pub").await;
    let mut batch = Vec::new();
    for i in 0..1001 {
        batch.extend(format!("many/k{i:04}\n1\nx\n").into_bytes());
    }
    for (key, body) in
        [("top.txt", &b"top"[..]), ("a/b.txt", b"b"), ("a/line\nbreak\u{1b}[31m", b"odd"), ("sp ace+plus", b"s")]
    {
        let url = server.object_url("pub", key);
        let resp = reqwest::Client::new().put(url).bearer_auth(SECRET).body(body.to_vec()).send().await.unwrap();
        assert!(resp.status().is_success(), "{key:?}");
    }
    let url = format!("{}/_/batch/put?bucket=pub", server.url);
    let resp = reqwest::Client::new().post(url).bearer_auth(SECRET).body(batch).send().await.unwrap();
    assert!(resp.status().is_success());

    let dir = tempfile::tempdir().unwrap();
    let listing = ok(&depot(&server, &["ls", "pub"], dir.path()));
    let names: Vec<&str> = listing.lines().map(|l| l.rsplit("  ").next().unwrap()).collect();
    assert_eq!(names, ["a/", "many/", "sp ace+plus", "top.txt"], "{listing}");
    assert!(listing.contains("3 B") && listing.contains("Z  top.txt"), "sizes and dates: {listing}");
    let listing = ok(&depot(&server, &["ls", "pub/a"], dir.path()));
    assert!(listing.contains("a/b.txt") && listing.contains("a/line\\nbreak\\u{1b}[31m"), "{listing}");
    assert!(!listing.contains('\u{1b}'), "{listing}");
    let listing = ok(&depot(&server, &["ls", "pub/to"], dir.path()));
    assert!(listing.ends_with("top.txt\n") && listing.lines().count() == 1, "what starts with it: {listing}");
    let listing = ok(&depot(&server, &["ls", "pub/many/"], dir.path()));
    assert_eq!(listing.lines().count(), 1001, "every page");
    assert!(listing.lines().last().unwrap().ends_with("many/k1000"));

    // A bucket that is not public is refused, as the server says.
    let out = depot(&server, &["ls", "files"], dir.path());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AccessDenied (403)"), "{out:?}");
}

/// File names and keys are shown escaped wherever they are printed: a
/// name cannot move the cursor or recolour the terminal.
#[test]
fn names_are_printed_escaped() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let name = "evil\u{1b}[31mRED\u{1b}[0m.txt";
    let shown = "evil\\u{1b}[31mRED\\u{1b}[0m.txt";
    std::fs::write(dir.path().join(name), b"x").unwrap();
    let out = depot(&server, &["put", name, "files/"], dir.path());
    let said = ok(&out);
    assert!(said.contains(&format!("files/{shown}")) && !said.contains('\u{1b}'), "{said}");
    std::fs::create_dir(dir.path().join("into")).unwrap();
    let said = ok(&depot(&server, &["get", &format!("files/{name}"), "into"], dir.path()));
    assert!(said.contains(&format!("into/{shown}")) && !said.contains('\u{1b}'), "{said}");
    let out = depot(&server, &["get", &format!("files/{name}/")], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(shown) && !err.contains('\u{1b}'), "{err}");
    let out = depot(&server, &["put", &format!("missing-{name}"), "files/"], dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("opening missing-{shown}")) && !err.contains('\u{1b}'), "{err}");
}
