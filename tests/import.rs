//! `depot import` from each kind of source into a real server: a directory
//! tree, a GridFS bucket on the MongoDB wire-protocol test server, and an S3
//! bucket on the S3 test server. Every import is run twice: the second run
//! must find everything already there.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use common::{BIN, Server, pattern};

fn import(server: &Server, args: &[&str]) -> Output {
    Command::new(BIN).arg("import").args(args).args(["--server", &server.url]).output().unwrap()
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "import failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Body, Content-Type and Last-Modified of an object.
async fn fetch(server: &Server, bucket: &str, key: &str) -> (Vec<u8>, String, String) {
    let resp = reqwest::get(server.object_url(bucket, key)).await.unwrap();
    assert_eq!(resp.status(), 200, "{bucket}/{key}");
    let header = |name: &str| resp.headers()[name].to_str().unwrap().to_string();
    let (content_type, modified) = (header("content-type"), header("last-modified"));
    (resp.bytes().await.unwrap().to_vec(), content_type, modified)
}

fn http_date(t: SystemTime) -> String {
    httpdate::fmt_http_date(t)
}

#[tokio::test]
async fn a_directory_tree_becomes_keys_and_a_rerun_skips_it() {
    let server = Server::start(&[]);
    let src = tempfile::tempdir().unwrap();
    let root = src.path();
    std::fs::create_dir_all(root.join("photos/2024")).unwrap();
    let files = [
        ("photos/2024/a.jpg", pattern(300_000, 1)),
        ("photos/b.jpg", pattern(1_500_000, 2)),
        ("notes.txt", b"hello\n".to_vec()),
        ("copy-of-notes.txt", b"hello\n".to_vec()),
    ];
    let when = SystemTime::UNIX_EPOCH + Duration::from_secs(1_600_000_000);
    for (path, bytes) in &files {
        std::fs::write(root.join(path), bytes).unwrap();
        std::fs::File::options().write(true).open(root.join(path)).unwrap().set_modified(when).unwrap();
    }

    let said = ok(&import(&server, &[root.to_str().unwrap(), "archive/old/"]));
    assert!(said.contains("imported 4 files") && said.contains("1 deduplicated"), "{said}");
    for (path, bytes) in &files {
        let (body, _, modified) = fetch(&server, "archive", &format!("old/{path}")).await;
        assert!(body == *bytes, "{path} differs");
        assert_eq!(modified, http_date(when), "{path} keeps its modification time");
    }

    let said = ok(&import(&server, &[root.to_str().unwrap(), "archive/old"]));
    assert!(said.contains("imported 0 files") && said.contains("4 already there"), "{said}");

    // A changed file (same size, new time) is copied again; nothing else.
    std::fs::write(root.join("notes.txt"), b"HELLO\n").unwrap();
    let said = ok(&import(&server, &[root.to_str().unwrap(), "archive/old/"]));
    assert!(said.contains("imported 1 files") && said.contains("3 already there"), "{said}");
    assert_eq!(fetch(&server, "archive", "old/notes.txt").await.0, b"HELLO\n");

    // A file dated before 1970, which no HTTP date can name, is imported
    // with the time of its import.
    let old = root.join("1969.txt");
    std::fs::write(&old, b"old").unwrap();
    let before_1970 = SystemTime::UNIX_EPOCH - Duration::from_secs(86_400);
    std::fs::File::options().write(true).open(&old).unwrap().set_modified(before_1970).unwrap();
    let said = ok(&import(&server, &[root.to_str().unwrap(), "archive/old/"]));
    assert!(said.contains("imported 1 files") && said.contains("4 already there"), "{said}");
    let (body, _, modified) = fetch(&server, "archive", "old/1969.txt").await;
    assert_eq!(body, b"old");
    let modified = httpdate::parse_http_date(&modified).unwrap();
    assert!(modified.elapsed().unwrap_or_default() < Duration::from_secs(300), "{modified:?}");
}

#[tokio::test]
async fn a_source_that_is_not_there_is_a_clear_error() {
    let server = Server::start(&[]);
    let out = import(&server, &["/no/such/dir", "files"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a directory"), "{err}");
    let out = import(&server, &["mongodb://127.0.0.1:1", "files"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("names no database"), "{err}");
}

#[tokio::test]
async fn a_gridfs_bucket_keeps_names_types_and_dates() {
    use futures::AsyncWriteExt;
    use mongodb::bson::doc;
    use mongodb::options::GridFsUploadOptions;

    let base = std::env::var("DEPOT_TEST_MONGO")
        .expect("DEPOT_TEST_MONGO is not set: run scripts/test.sh, which starts the MongoDB wire-protocol server");
    let db_name = format!("import_{}", std::process::id());
    let client = mongodb::Client::with_uri_str(&base).await.unwrap();
    let db = client.database(&db_name);
    let bucket = db.gridfs_bucket(None);
    let files = [
        ("reports/q1.pdf", "application/pdf", pattern(700_000, 3)),
        ("readme.txt", "text/plain", b"first revision".to_vec()),
        ("readme.txt", "text/plain", b"second revision".to_vec()),
    ];
    for (name, content_type, bytes) in &files {
        let options = GridFsUploadOptions::builder().metadata(doc! { "contentType": *content_type }).build();
        let mut upload = bucket.open_upload_stream(*name).with_options(options).await.unwrap();
        upload.write_all(bytes).await.unwrap();
        upload.close().await.unwrap();
    }
    // A name no key can be: skipped and said, and the import does not
    // claim success, as for a file it cannot read.
    let mut nameless = bucket.open_upload_stream("").await.unwrap();
    let nameless_id = nameless.id().clone();
    nameless.write_all(b"no name").await.unwrap();
    nameless.close().await.unwrap();
    let stored: Vec<_> = {
        use futures::TryStreamExt;
        bucket.find(doc! {}).await.unwrap().try_collect().await.unwrap()
    };
    let newest = stored.iter().filter(|f| f.filename.as_deref() == Some("readme.txt")).map(|f| f.upload_date).max();

    let server = Server::start(&[]);
    let url = format!("{}/{db_name}", base.trim_end_matches('/'));
    let out = import(&server, &[&url, "legacy"]);
    let (said, err) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("imported 2 files"), "the newest revision of each name: {said}");
    assert!(!out.status.success() && err.contains("has no filename"), "{err}");
    bucket.delete(nameless_id).await.unwrap();
    let (body, content_type, _) = fetch(&server, "legacy", "reports/q1.pdf").await;
    assert!(body == files[0].2);
    assert_eq!(content_type, "application/pdf");
    let (body, content_type, modified) = fetch(&server, "legacy", "readme.txt").await;
    assert_eq!(body, b"second revision");
    assert_eq!(content_type, "text/plain");
    assert_eq!(modified, http_date(newest.unwrap().to_system_time()), "uploadDate is kept");

    let said = ok(&import(&server, &[&url, "legacy"]));
    assert!(said.contains("imported 0 files") && said.contains("2 already there"), "{said}");
    let typo = import(&server, &[&url, "legacy", "--gridfs-bucket", "fls"]);
    let err = String::from_utf8_lossy(&typo.stderr);
    assert!(!typo.status.success() && err.contains("no GridFS bucket \"fls\""), "a mistyped bucket: {err}");
    db.drop().await.unwrap();
}

#[tokio::test]
async fn an_s3_bucket_keeps_keys_types_dates_headers_and_metadata() {
    use object_store::{Attribute, Attributes, ObjectStore, PutOptions, path::Path};

    let bucket = depot::engine::s3::fresh_test_bucket().await;
    let (endpoint, config) = depot::engine::s3::test_server(&bucket);
    let store = depot::engine::s3::builder(Some(&endpoint), &config).build().unwrap();
    let objects = [
        ("photos/cat.jpg", "image/jpeg", pattern(400_000, 5)),
        ("photos/2020/dog.png", "image/png", pattern(9_000_000, 6)),
        ("readme.md", "text/markdown", b"# not under the prefix\n".to_vec()),
    ];
    // What S3 serves an object with, and its user metadata, come along.
    let served = [
        (Attribute::CacheControl, "cache-control", "max-age=86400"),
        (Attribute::ContentDisposition, "content-disposition", "inline; filename=\"cat.jpg\""),
        (Attribute::ContentLanguage, "content-language", "en"),
        (Attribute::Metadata("camera".into()), "x-amz-meta-camera", "pinhole"),
    ];
    for (key, content_type, bytes) in &objects {
        let mut attributes = Attributes::from_iter([(Attribute::ContentType, content_type.to_string())]);
        for (attribute, _, value) in &served {
            attributes.insert(attribute.clone(), value.to_string().into());
        }
        let opts = PutOptions { attributes, ..Default::default() };
        store.put_opts(&Path::from(*key), bytes.clone().into(), opts).await.unwrap();
    }
    let listed: Vec<_> = {
        use futures::TryStreamExt;
        store.list(None).try_collect().await.unwrap()
    };

    let server = Server::start(&[]);
    let source = format!("s3://{bucket}/photos");
    let (access, secret) = (config.access_key.clone().unwrap(), config.secret_key.clone().unwrap());
    let flags = ["--s3-endpoint", &endpoint, "--s3-access-key", &access, "--s3-secret-key", &secret];
    let args = |target: &'static str| [&[source.as_str(), target][..], &flags[..]].concat();
    let said = ok(&import(&server, &args("media")));
    assert!(said.contains("imported 2 files"), "only the prefix: {said}");
    for (key, content_type, bytes) in &objects[..2] {
        let (body, got_type, modified) = fetch(&server, "media", key).await;
        assert!(body == *bytes, "{key}");
        assert_eq!(got_type, *content_type);
        let source_date = listed.iter().find(|m| m.location.as_ref() == *key).unwrap().last_modified;
        assert_eq!(modified, http_date(source_date.into()), "{key} keeps its date");
        let head = reqwest::Client::new().head(server.object_url("media", key)).send().await.unwrap();
        for (_, name, value) in &served {
            assert_eq!(head.headers().get(*name).map(|v| v.to_str().unwrap()), Some(*value), "{key}: {name}");
        }
    }
    let said = ok(&import(&server, &args("media")));
    assert!(said.contains("imported 0 files") && said.contains("2 already there"), "{said}");

    // A mistyped prefix reads as nothing, and says so.
    let typo = format!("s3://{bucket}/fotos");
    let out = import(&server, &[&[typo.as_str(), "media"][..], &flags[..]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nothing in the S3 bucket is under \"fotos/\""), "{err}");
}

#[tokio::test]
async fn s3_keys_no_path_can_hold_are_imported_whole() {
    let bucket = depot::engine::s3::fresh_test_bucket().await;
    let (endpoint, config) = depot::engine::s3::test_server(&bucket);
    let builder = depot::engine::s3::builder(Some(&endpoint), &config);
    let bucket_url = depot::engine::s3::resolve(&builder).unwrap().bucket_url;
    let store = builder.build().unwrap();
    // Control characters, and bytes a URL or a path must escape.
    let keys = ["odd/line\nbreak", "odd/tab\tkey", "odd/100%", "odd/#hash", "odd/sp ace+plus", "odd/ünï", "odd/q?x=1"];
    let http = reqwest::Client::new();
    for key in keys {
        let url = format!("{bucket_url}/{}", percent_encoding::utf8_percent_encode(key, depot::store::names::URL_PATH));
        let credential = store.credentials().get_credential().await.unwrap();
        let mut request = http::Request::put(&url).body(object_store::client::HttpRequestBody::empty()).unwrap();
        object_store::aws::AwsAuthorizer::new(&credential, "s3", "us-east-1")
            .with_sign_payload(false)
            .try_authorize(&mut request, None)
            .unwrap();
        let body = format!("the bytes of {key}");
        let resp = http.put(&url).headers(request.headers().clone()).body(body).send().await.unwrap();
        assert!(resp.status().is_success(), "{key:?}: {}", resp.text().await.unwrap());
    }

    let server = Server::start(&[]);
    let source = format!("s3://{bucket}/odd");
    let (access, secret) = (config.access_key.clone().unwrap(), config.secret_key.clone().unwrap());
    let flags = ["--s3-endpoint", &endpoint, "--s3-access-key", &access, "--s3-secret-key", &secret];
    let said = ok(&import(&server, &[&[source.as_str(), "odd"][..], &flags[..]].concat()));
    assert!(said.contains(&format!("imported {} files", keys.len())), "{said}");
    for key in keys {
        let (body, ..) = fetch(&server, "odd", key).await;
        assert_eq!(String::from_utf8(body).unwrap(), format!("the bytes of {key}"), "{key:?}");
    }
}

/// A symbolic link to nothing, or one that loops, holds nothing to import:
/// it is said and skipped, and does not fail this run or the next, as
/// rsync skips what is not a file.
#[test]
fn links_that_lead_nowhere_are_skipped_not_failed() {
    let server = Server::start(&[]);
    let src = tempfile::tempdir().unwrap();
    let root = src.path();
    std::fs::create_dir(root.join("d")).unwrap();
    std::fs::write(root.join("d/a.txt"), b"a").unwrap();
    std::os::unix::fs::symlink("missing", root.join("dangling\u{1b}[31m")).unwrap();
    std::os::unix::fs::symlink("circle", root.join("circle")).unwrap();
    std::os::unix::fs::symlink("..", root.join("d/up")).unwrap();
    for run in ["first", "second"] {
        let out = import(&server, &[root.to_str().unwrap(), "files/links/"]);
        let (said, err) = (ok(&out), String::from_utf8_lossy(&out.stderr).into_owned());
        assert!(said.contains("3 entries left out") && said.contains("0 failed"), "{run}: {said}");
        assert!(err.contains("dangling\\u{1b}[31m: a symbolic link to missing, which does not exist"), "{err}");
        assert!(err.contains("circle: a symbolic link to circle, which links on without end"), "{err}");
        assert!(err.contains("up: a link back to") && !err.contains('\u{1b}'), "{err}");
    }
}

/// The bucket the import creates is refused as the server says why, as
/// for `depot put`.
#[test]
fn a_refused_bucket_says_why() {
    let server = Server::start(&["--access-key", "app", "--secret-key", "a-long-random-secret"]);
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("a.txt"), b"a").unwrap();
    let out = import(&server, &[src.path().to_str().unwrap(), "files/x/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("creating bucket files: AccessDenied (403): this server"), "{err}");
    let out = import(&server, &[src.path().to_str().unwrap(), "Bad_Name", "--secret-key", "a-long-random-secret"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("creating bucket Bad_Name: InvalidBucketName (400): bucket name \"Bad_Name\""), "{err}");
}

/// A file that fails is named escaped, so its name cannot act on the
/// terminal.
#[test]
fn failures_name_files_escaped() {
    let server = Server::start(&["--max-key-bytes", "12"]);
    let src = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("evil\u{1b}[31mRED.txt"), b"x").unwrap();
    let out = import(&server, &[src.path().to_str().unwrap(), "files"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("failed: evil\\u{1b}[31mRED.txt: "), "{err}");
    assert!(!err.contains('\u{1b}') && err.contains("run the import again to retry them"), "{err}");
}
