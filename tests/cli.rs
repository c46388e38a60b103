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
