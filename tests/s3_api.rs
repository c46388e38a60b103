//! depot's S3 API as real S3 clients see it: boto3 and the AWS CLI (from
//! PyPI), rclone and s3cmd (from Debian), the AWS SDK for JavaScript (from
//! npm) and the AWS SDK for Java (from Maven Central) each run their suite
//! in tests/s3_clients against a fresh server with two users.
//! scripts/test.sh installs the clients and names their venv in
//! DEPOT_TEST_S3_CLIENTS, the JavaScript SDK's directory in
//! DEPOT_TEST_S3_JS, and the directory it built the Java suite into in
//! DEPOT_TEST_S3_JAVA.

mod common;

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::Server;

const ACCESS_KEY: &str = "depot-s3-one";
const SECRET_KEY: &str = "secret-of-user-one";
/// The second user, from the settings file.
const ACCESS_KEY2: &str = "depot-s3-two";
const SECRET_KEY2: &str = "secret-of-user-two";

/// The longest a suite may take.
const TIMEOUT: Duration = Duration::from_secs(900);

/// The suites move hundreds of megabytes each: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The domain of virtual-host style requests, for the suite that uses it.
const DOMAIN: &str = "s3.depot.test";

/// The JVM's heap for the Java suite, which keeps what it uploaded (about
/// 110 MiB, 24 MiB at most in one piece) to read it back at the end.
const JAVA_HEAP: &str = "-Xmx512m";

/// Runs `tests/s3_clients/<suite>` (Python in the clients' venv, bash, for
/// `.mjs` Node.js with the SDK's directory in DEPOT_TEST_S3_JS, or for
/// `.java` the class scripts/deps.sh built from it into DEPOT_TEST_S3_JAVA)
/// against a fresh server started with `extra` flags too, and fails with its
/// output unless it passes.
fn run_suite(suite: &str, extra: &[&str]) {
    // Relative to the package root, where cargo runs tests: a path baked in
    // at compile time would point into whichever checkout built the test
    // first when several share one target directory.
    let script = std::env::current_dir().unwrap().join("tests/s3_clients").join(suite);
    let caller_path = std::env::var("PATH").unwrap_or_default();
    let (mut cmd, path, js_sdk, java_build) = if suite.ends_with(".java") {
        (Command::new("java"), caller_path, None, Some(java_suite_build(&script)))
    } else if suite.ends_with(".mjs") {
        let sdk = std::env::var("DEPOT_TEST_S3_JS").unwrap_or_default();
        assert!(
            !sdk.is_empty(),
            "DEPOT_TEST_S3_JS is not set: run scripts/test.sh, which installs the AWS SDK for JavaScript from npm \
             and points it at its directory"
        );
        assert!(
            Path::new(&sdk).join("node_modules/@aws-sdk/client-s3/package.json").exists(),
            "no AWS SDK for JavaScript in {sdk}: run scripts/test.sh to reinstall it"
        );
        (Command::new("node"), caller_path, Some(sdk), None)
    } else {
        let clients = std::env::var("DEPOT_TEST_S3_CLIENTS").unwrap_or_default();
        assert!(
            !clients.is_empty(),
            "DEPOT_TEST_S3_CLIENTS is not set: run scripts/test.sh, which installs boto3, the AWS CLI, rclone and \
             s3cmd, and points it at their venv"
        );
        let venv_bin = Path::new(&clients).join("bin");
        assert!(
            venv_bin.join("aws").exists(),
            "no AWS CLI in {clients}: run scripts/test.sh to reinstall the S3 clients"
        );
        let path = format!("{}:{caller_path}", venv_bin.display());
        let cmd = if suite.ends_with(".py") { Command::new(venv_bin.join("python")) } else { Command::new("bash") };
        (cmd, path, None, None)
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());

    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("depot.toml");
    let second_user = format!("[[credentials]]\naccess_key = \"{ACCESS_KEY2}\"\nsecret_key = \"{SECRET_KEY2}\"\n");
    std::fs::write(&settings, second_user).unwrap();
    let mut flags =
        vec!["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, "--config", settings.to_str().unwrap()];
    flags.extend_from_slice(extra);
    let server = Server::start(&flags);

    let (home, scratch, log) = (dir.path().join("home"), dir.path().join("tmp"), dir.path().join("output"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    let output = File::create(&log).unwrap();
    match &java_build {
        // The JVM takes its home and temporary directory from properties,
        // not from HOME and TMPDIR.
        Some(build) => cmd
            .arg(JAVA_HEAP)
            .arg(format!("-Duser.home={}", home.display()))
            .arg(format!("-Djava.io.tmpdir={}", scratch.display()))
            .arg("-cp")
            .arg(format!("{0}/classes:{0}/lib/*", build.display()))
            .arg(script.file_stem().unwrap()),
        None => cmd.arg(&script),
    };
    // Nothing from the caller's environment or home (AWS_*, ~/.aws,
    // rclone's and s3cmd's configurations): the clients' defaults only.
    cmd.env_clear()
        .env("PATH", path)
        .env("HOME", &home)
        .env("TMPDIR", &scratch)
        .env("LC_ALL", "C.UTF-8")
        .env("PYTHONUNBUFFERED", "1")
        .env("S3_ENDPOINT", &server.url)
        .env("S3_ACCESS_KEY", ACCESS_KEY)
        .env("S3_SECRET_KEY", SECRET_KEY)
        .env("S3_ACCESS_KEY2", ACCESS_KEY2)
        .env("S3_SECRET_KEY2", SECRET_KEY2)
        .env("S3_DOMAIN", DOMAIN)
        .stdin(Stdio::null())
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .process_group(0);
    if let Some(sdk) = js_sdk {
        cmd.env("DEPOT_TEST_S3_JS", sdk);
    }
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > TIMEOUT {
            // The suite and every client it started.
            let _ = Command::new("kill").args(["-9", &format!("-{}", child.id())]).status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };

    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let verdict = match status {
        Some(s) if s.success() => None,
        Some(s) => Some(format!("{suite} failed ({s})")),
        None => Some(format!("{suite} did not finish in {TIMEOUT:?}")),
    };
    if let Some(verdict) = verdict {
        let server_log = server.log.lock().unwrap().clone();
        let lines: Vec<&str> = server_log.lines().collect();
        let tail = lines[lines.len().saturating_sub(100)..].join("\n");
        panic!("{verdict}; it said:\n{said}\n--- the server's last log lines:\n{tail}");
    }
    println!("{said}");
    server.assert_no_panic();
}

/// The directory scripts/deps.sh built the Java suite `source` into, from
/// DEPOT_TEST_S3_JAVA, once it is sure the build is of this checkout's
/// suite: the build keeps a copy of each file of the suite's directory it
/// was made from.
fn java_suite_build(source: &Path) -> PathBuf {
    let build = std::env::var("DEPOT_TEST_S3_JAVA").unwrap_or_default();
    assert!(
        !build.is_empty(),
        "DEPOT_TEST_S3_JAVA is not set: run scripts/test.sh, which builds the AWS SDK for Java suite (its jars from \
         Maven Central) and points it at the build"
    );
    let build = PathBuf::from(build);
    let class = build.join("classes").join(source.file_stem().unwrap()).with_extension("class");
    assert!(class.exists(), "no {} in {}: run scripts/test.sh to build it", class.display(), build.display());
    let dir = source.parent().unwrap();
    for file in ["pom.xml", source.file_name().unwrap().to_str().unwrap()] {
        let built_from = std::fs::read(build.join("source").join(file)).ok();
        assert!(
            built_from.is_some() && built_from == std::fs::read(dir.join(file)).ok(),
            "{} was not built from this checkout's {}: run scripts/test.sh to rebuild it",
            build.display(),
            dir.join(file).display()
        );
    }
    build
}

#[test]
fn boto3_with_its_default_configuration() {
    run_suite("boto3_suite.py", &[]);
}

#[test]
fn the_aws_cli() {
    run_suite("awscli_suite.sh", &[]);
}

#[test]
fn rclone() {
    run_suite("rclone_suite.sh", &[]);
}

#[test]
fn s3cmd() {
    run_suite("s3cmd_suite.sh", &[]);
}

#[test]
fn the_javascript_sdk() {
    run_suite("js_sdk_suite.mjs", &[]);
}

#[test]
fn the_java_sdk() {
    run_suite("java/JavaSdkSuite.java", &[]);
}

#[test]
fn virtual_host_style_under_s3_domain() {
    run_suite("virtual_host.py", &["--s3-domain", DOMAIN]);
}
