//! Security promises against the real binary: an open server only on
//! loopback, hostile keys never become paths, backups over the network
//! only with credentials, and a request ID on every answer and every
//! logged error.

mod common;

use std::path::Path;

use common::{Server, client, depot, files_under, raw, status_of};

/// This machine's first address that is not loopback, if it has one.
fn outside_address() -> Option<String> {
    let out = std::process::Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout).split_whitespace().find(|a| !a.contains(':')).map(str::to_string)
}

#[test]
fn a_public_address_needs_credentials_or_an_explicit_opt_in() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let out = depot(&["serve", "--data", data, "--listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("without credentials"));
    let mut open = Server::start(&["--listen", "0.0.0.0:0", "--allow-anonymous-write"]);
    assert!(open.alive());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_keys_stay_inside_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_in(&data, &["--engine", "fs"]);
    // Sent byte for byte: an HTTP client library would resolve the dot
    // segments before sending.
    let hostile = [
        "../../escape-1",
        "../escape-2",
        "a/../../escape-3",
        "%2F..%2F..%2Fescape-4",
        "..%5C..%5Cescape-5",
        "./././escape-6",
        "escape-7/..",
        "....//escape-8",
        "%2e%2e/%2e%2e/escape-9",
        "escape-10%00hidden",
    ];
    let quiet = std::time::Duration::from_millis(300);
    for key in hostile {
        let body = format!("body of {key}");
        let put = format!(
            "PUT /files/{key} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let answer = raw(&server.addr, put.as_bytes(), quiet);
        match status_of(&answer) {
            // Stored as an ordinary key: it reads back under that key.
            200 | 201 => {
                let get = format!("GET /files/{key} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                let got = raw(&server.addr, get.as_bytes(), quiet);
                assert_eq!(status_of(&got), 200, "{key}: {got}");
                assert!(got.ends_with(&body), "{key}: {got}");
            }
            400 => {}
            _ => panic!("{key}: {answer}"),
        }
    }
    drop(server);
    let outside: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(outside, vec!["data"], "something was written beside the data directory");
    for file in files_under(&data) {
        let name = file.strip_prefix(&data).unwrap().to_string_lossy().to_string();
        assert!(!name.contains("escape"), "a key became a path: {name}");
    }
    for escaped in ["/etc/escape-4", "/escape-1", "/tmp/escape-1"] {
        assert!(!Path::new(escaped).exists(), "{escaped} exists");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_without_credentials_need_the_local_token() {
    let Some(ip) = outside_address() else {
        eprintln!("skipped: this machine has no address but loopback");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&["--listen", "0.0.0.0:0", "--allow-anonymous-write"]);
    let port = server.addr.rsplit(':').next().unwrap();
    let target = dir.path().join("copy");
    let http = client();
    let remote = format!("http://{ip}:{port}/_/backup");
    let token = std::fs::read_to_string(server.data.join(depot::http::LOCAL_TOKEN_FILE)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(server.data.join(depot::http::LOCAL_TOKEN_FILE)).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "the token is its owner's alone: {mode:o}");
    let ask = |url: String, token: Option<&str>| {
        let mut r = http.post(url).query(&[("dir", target.to_str().unwrap())]);
        if let Some(token) = token {
            r = r.header(depot::http::LOCAL_TOKEN_HEADER, token);
        }
        r.send()
    };
    // From this machine, at a loopback address (as through a proxy here)
    // or at its own: without the token, or with another, refused before
    // the request is looked at.
    let local = format!("http://127.0.0.1:{port}/_/backup");
    for url in [&local, &remote] {
        for wrong in [None, Some("0123"), Some(&token[1..])] {
            let r = ask(url.clone(), wrong).await.unwrap();
            assert_eq!(r.status(), 403, "{url} {wrong:?}");
            assert!(r.text().await.unwrap().contains("local token"), "{url} {wrong:?}");
        }
    }
    assert!(!target.exists());
    // With it, at its own address too (`depot backup --listen` names it).
    let r = ask(remote.clone(), Some(&token)).await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    assert!(target.join("catalog").is_dir());
    let r = http.post(&local).query(&[("dir", "relative/path")]).header(depot::http::LOCAL_TOKEN_HEADER, &token);
    assert_eq!(r.send().await.unwrap().status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_and_every_logged_error_has_a_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_in(&data, &["--engine", "fs"]);
    let http = client();
    let id = |r: &reqwest::Response| r.headers().get("x-request-id").unwrap().to_str().unwrap().to_string();

    let missing = http.get(server.object_url("files", "nothing")).send().await.unwrap();
    assert_eq!(missing.status(), 404);
    let generated = id(&missing);
    assert!(generated.len() == 16 && generated.bytes().all(|b| b.is_ascii_hexdigit()), "{generated}");
    assert_eq!(missing.headers()["x-amz-request-id"], generated.as_str());

    let given =
        http.get(format!("{}/_/health", server.url)).header("x-request-id", "proxy-7f3a.1").send().await.unwrap();
    assert_eq!(id(&given), "proxy-7f3a.1");
    let hostile = http.get(format!("{}/_/health", server.url)).header("x-request-id", "a b\"<c>").send().await.unwrap();
    assert_ne!(id(&hostile), "a b\"<c>");

    // A server error: the object's bytes vanished from under the server.
    let put = http.put(server.object_url("files", "doomed")).body(vec![7u8; 5000]).send().await.unwrap();
    assert!(put.status().is_success());
    for file in files_under(&data.join("fs/blobs")) {
        std::fs::remove_file(file).unwrap();
    }
    let failed = http.get(server.object_url("files", "doomed")).send().await.unwrap();
    assert_eq!(failed.status(), 500);
    let failed_id = id(&failed);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let log = server.log.lock().unwrap().clone();
    let line = log.lines().find(|l| l.contains(&failed_id) && l.contains("request failed"));
    assert!(
        line.is_some_and(|l| l.contains("status=500") && l.contains("doomed")),
        "no log line for {failed_id}:\n{log}"
    );
    assert!(log.lines().any(|l| l.contains(&failed_id) && l.contains("bytes are missing")), "{log}");
}

/// With several credentials the native API keeps bucket owners apart, as
/// the S3 API does; the routes that see every account's data are the
/// operator's (the first credential).
#[tokio::test]
async fn native_requests_keep_to_their_own_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let settings = dir.path().join("depot.toml");
    std::fs::write(&settings, "[[credentials]]\naccess_key = \"bob\"\nsecret_key = \"bob-secret-2\"\n").unwrap();
    let flags = ["--access-key", "alice", "--secret-key", "alice-secret-1", "--config", settings.to_str().unwrap()];
    let server = Server::start(&flags);
    let http = client();
    let (alice, bob) = ("Bearer alice-secret-1", "Bearer bob-secret-2");
    let send = |method: reqwest::Method, url: String, who: &'static str| {
        http.request(method, url).header("authorization", who).header("accept", "application/json").send()
    };
    use reqwest::Method;
    assert_eq!(send(Method::PUT, format!("{}/alices", server.url), alice).await.unwrap().status(), 201);
    let put = send(Method::PUT, server.object_url("alices", "secret.txt"), alice).await.unwrap();
    assert_eq!(put.status(), 201);
    let sha: serde_json::Value = put.json().await.unwrap();
    assert!(sha.get("deduplicated").is_none(), "with several accounts, a PUT does not tell what others store");
    let sha = sha["sha256"].as_str().unwrap().to_string();
    assert_eq!(send(Method::PUT, format!("{}/bobs", server.url), bob).await.unwrap().status(), 201);

    let theirs = [
        (Method::GET, server.object_url("alices", "secret.txt")),
        (Method::HEAD, server.object_url("alices", "secret.txt")),
        (Method::PUT, server.object_url("alices", "secret.txt")),
        (Method::DELETE, server.object_url("alices", "secret.txt")),
        (Method::GET, format!("{}/alices/", server.url)),
        (Method::DELETE, format!("{}/alices", server.url)),
        (Method::POST, format!("{}/_/batch/get?bucket=alices", server.url)),
        (Method::POST, format!("{}/_/batch/delete?bucket=alices", server.url)),
        (Method::GET, format!("{}/_/blobs/{sha}", server.url)),
        (Method::GET, format!("{}/_/stats", server.url)),
        (Method::GET, format!("{}/_/metrics", server.url)),
        (Method::POST, format!("{}/_/backup?dir={}", server.url, dir.path().join("copy").display())),
    ];
    for (method, url) in theirs {
        let r = send(method.clone(), url.clone(), bob).await.unwrap();
        assert_eq!(r.status(), 403, "bob: {method} {url}");
    }
    assert_eq!(send(Method::GET, server.object_url("alices", "secret.txt"), alice).await.unwrap().status(), 200);
    assert_eq!(send(Method::GET, format!("{}/_/blobs/{sha}", server.url), alice).await.unwrap().status(), 200);
    assert_eq!(send(Method::GET, format!("{}/bobs/", server.url), alice).await.unwrap().status(), 403);
    let taken = send(Method::PUT, format!("{}/bobs", server.url), alice).await.unwrap();
    assert_eq!(taken.status(), 409);
    assert_eq!(taken.json::<serde_json::Value>().await.unwrap()["error"], "BucketAlreadyExists");
    let again = send(Method::PUT, format!("{}/bobs", server.url), bob).await.unwrap();
    assert_eq!(again.json::<serde_json::Value>().await.unwrap()["error"], "BucketAlreadyOwnedByYou");
    for (who, theirs) in [(bob, ["bobs", "files"]), (alice, ["alices", "files"])] {
        let v: serde_json::Value =
            send(Method::GET, format!("{}/", server.url), who).await.unwrap().json().await.unwrap();
        let names: Vec<&str> = v["buckets"].as_array().unwrap().iter().map(|b| b["name"].as_str().unwrap()).collect();
        assert_eq!(names, theirs, "each sees its own buckets and the shared one");
    }
    assert!(!dir.path().join("copy").exists());

    for route in ["/_/stats", "/_/metrics", &format!("/_/blobs/{sha}")] {
        let r = http.get(format!("{}{route}", server.url)).send().await.unwrap();
        assert_eq!(r.status(), 403, "anonymous {route}");
        assert!(r.text().await.unwrap().contains("needs credentials"), "{route}: the native API's answer");
    }
    let stranger = send(Method::GET, server.object_url("alices", "secret.txt"), "Bearer not-a-secret").await.unwrap();
    assert_eq!(stranger.status(), 403, "a wrong token is refused as such");
    let said: serde_json::Value = stranger.json().await.unwrap();
    assert!(said["message"].as_str().unwrap().contains("not a configured secret"), "{said}");
    // The scheme's case is the client's to choose (RFC 9110, section 11.1).
    for who in ["bearer alice-secret-1", "BEARER  alice-secret-1"] {
        assert_eq!(
            send(Method::GET, server.object_url("alices", "secret.txt"), who).await.unwrap().status(),
            200,
            "{who}"
        );
    }
    let stranger = send(Method::GET, server.object_url("alices", "secret.txt"), "bearer not-a-secret").await.unwrap();
    assert_eq!(stranger.status(), 403);
    let said: serde_json::Value = stranger.json().await.unwrap();
    assert!(said["message"].as_str().unwrap().contains("not a configured secret"), "{said}");

    // A public-read bucket is for everyone to read, as S3's AllUsers:
    // callers of other accounts too, signed or with a token. Writes stay
    // its owner's.
    let alice_s3 = ("alice", "alice-secret-1");
    let bob_s3 = ("bob", "bob-secret-2");
    let mut acl = http::HeaderMap::new();
    acl.insert("x-amz-acl", http::HeaderValue::from_static("public-read"));
    let bucket_url = format!("{}/alices", server.url);
    let url = server.object_url("alices", "secret.txt");
    assert_eq!(s3_signed(alice_s3, Method::PUT, &format!("{bucket_url}?acl"), acl).await.status(), 200);
    assert_eq!(s3_signed(bob_s3, Method::GET, &url, http::HeaderMap::new()).await.status(), 200);
    assert_eq!(
        s3_signed(bob_s3, Method::GET, &format!("{bucket_url}?list-type=2"), http::HeaderMap::new()).await.status(),
        200
    );
    assert_eq!(s3_signed(bob_s3, Method::DELETE, &url, http::HeaderMap::new()).await.status(), 403);
    assert_eq!(send(Method::GET, url.clone(), bob).await.unwrap().status(), 200);
    assert_eq!(send(Method::GET, format!("{bucket_url}/"), bob).await.unwrap().status(), 200);
    let batch = |route: &str| {
        let url = format!("{}/_/batch/{route}?bucket=alices", server.url);
        http.post(url).header("authorization", bob).body("secret.txt\n").send()
    };
    let got = batch("get").await.unwrap();
    assert_eq!(got.status(), 200, "a batch reads a public-read bucket as a GET does");
    assert!(got.bytes().await.unwrap().starts_with(b"0\n"), "the object, empty");
    assert_eq!(batch("delete").await.unwrap().status(), 403);
    // An answer given for a Bearer token (the web UI's) is kept by a
    // browser only to ask again, so a sign-out is not passed over by its
    // cache; S3 answers carry what S3's do (SDKs report and copy it), the
    // public read of the same object stays cacheable, and an object's own
    // Cache-Control stands.
    let cache = |r: &reqwest::Response| r.headers().get("cache-control").map(|v| v.to_str().unwrap().to_string());
    let private = send(Method::GET, url.clone(), bob).await.unwrap();
    assert_eq!(cache(&private).as_deref(), Some("private, no-cache"));
    let signed = s3_signed(bob_s3, Method::GET, &url, http::HeaderMap::new()).await;
    assert_eq!(cache(&signed), None, "S3");
    assert_eq!(cache(&http.get(url.clone()).send().await.unwrap()), None, "anonymous");
    // A browser asking for the bucket gets the web UI's page, S3 clients
    // its listing: a cache is told that the answer depends on Accept.
    let listing = http.get(format!("{bucket_url}/")).header("accept", "*/*").send().await.unwrap();
    assert_eq!(listing.status(), 200);
    assert_eq!(listing.headers().get("vary").map(|v| v.to_str().unwrap()), Some("Accept"));
    let own = server.object_url("alices", "kept.txt");
    let put = http.put(&own).header("authorization", alice).header("cache-control", "max-age=60").body("k");
    assert_eq!(put.send().await.unwrap().status(), 201);
    assert_eq!(cache(&send(Method::GET, own, bob).await.unwrap()).as_deref(), Some("max-age=60"));
    assert_eq!(send(Method::PUT, url.clone(), bob).await.unwrap().status(), 403);
    assert_eq!(send(Method::DELETE, url, bob).await.unwrap().status(), 403);
}

/// `method` on `url`, signed for the S3 API by the credential given.
async fn s3_signed(
    (access_key, secret): (&str, &str),
    method: reqwest::Method,
    url: &str,
    headers: http::HeaderMap,
) -> reqwest::Response {
    let config = depot::engine::S3Config {
        bucket: Some("any".into()),
        region: None,
        access_key: Some(access_key.into()),
        secret_key: Some(secret.into()),
    };
    let builder = depot::engine::s3::builder(Some(url), &config);
    let region = depot::engine::s3::resolve(&builder).unwrap().region;
    let store = builder.build().unwrap();
    let signed = depot::engine::s3::sign(&store, &region, &method, url, &headers).await.unwrap();
    reqwest::Client::new().request(method, url).headers(signed).send().await.unwrap()
}

/// A page of another web site may send simple POSTs through its visitors'
/// browsers without asking first: on a server without credentials, changes
/// that name another origin are refused; the server's own pages and
/// clients that are not browsers go on.
#[tokio::test]
async fn pages_of_other_origins_cannot_change_the_store() {
    let server = Server::start(&[]);
    let http = client();
    let batch = format!("{}/_/batch/put?bucket=files", server.url);
    let body = "csrf/owned.txt\n6\npwned!\n";
    for origin in ["http://evil.example", "null"] {
        let r = http.post(&batch).header("origin", origin).body(body).send().await.unwrap();
        assert_eq!(r.status(), 403, "{origin}");
        let r = http.delete(server.object_url("files", "x")).header("origin", origin).send().await.unwrap();
        assert_eq!(r.status(), 403, "{origin}");
    }
    let r = http.get(server.object_url("files", "csrf/owned.txt")).send().await.unwrap();
    assert_eq!(r.status(), 404, "nothing was written");
    let own = format!("http://{}", server.addr);
    let r = http.post(&batch).header("origin", own).body(body).send().await.unwrap();
    assert!(r.status().is_success(), "the server's own pages may");
    let r = http.post(&batch).body(body).send().await.unwrap();
    assert!(r.status().is_success(), "clients that send no Origin may");
}

/// A page of another site can point its own name at 127.0.0.1 (DNS
/// rebinding) and then send its visitors' requests to a server on their
/// machine as its own, Origin and Host both its name. A server without
/// credentials on loopback answers only the names such a page cannot
/// have; one with credentials or the S3 domain's names are not affected.
#[test]
fn a_server_without_credentials_answers_only_to_local_names() {
    let port_of = |s: &Server| s.addr.rsplit(':').next().unwrap().to_string();
    let ask = |s: &Server, host: &str| {
        let request = format!("GET /_/health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        raw(&s.addr, request.as_bytes(), std::time::Duration::from_secs(5))
    };
    let open = Server::start(&["--s3-domain", "s3.depot.test", "--allowed-host", "files.example.com,proxy.test"]);
    let port = port_of(&open);
    for host in [
        format!("rebind.attacker.example:{port}"),
        "attacker.example".to_string(),
        format!("depot.s3.depot.test.attacker.example:{port}"),
    ] {
        let answer = ask(&open, &host);
        assert_eq!(status_of(&answer), 403, "{host}: {answer}");
        assert!(answer.contains("loopback"), "{answer}");
    }
    for host in [
        format!("localhost:{port}"),
        "localhost.".to_string(),
        format!("app.localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        "depot".to_string(),
        format!("s3.depot.test:{port}"),
        format!("files.s3.depot.test:{port}"),
        "files.example.com".to_string(),
        "PROXY.test:443".to_string(),
    ] {
        assert_eq!(status_of(&ask(&open, &host)), 200, "{host}");
    }
    let guarded = Server::start(&["--access-key", "k", "--secret-key", "a-secret-of-some-length"]);
    let answer = ask(&guarded, &format!("rebind.attacker.example:{}", port_of(&guarded)));
    assert_eq!(status_of(&answer), 200, "credentials guard that server: {answer}");
}

/// The web UI may not be shown in another site's frame, where that site
/// could lay its page over the UI's buttons, and runs only its own script.
#[tokio::test]
async fn the_web_ui_refuses_to_be_framed() {
    let server = Server::start(&[]);
    let r = client().get(format!("{}/", server.url)).header("accept", "text/html").send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-frame-options"], "DENY");
    let policy = r.headers()["content-security-policy"].to_str().unwrap();
    let directives: Vec<&str> = policy.split(';').map(str::trim).collect();
    for wanted in ["frame-ancestors 'none'", "script-src 'self'", "object-src 'none'"] {
        assert!(directives.contains(&wanted), "{wanted} missing from {policy}");
    }
}

/// Requests that could never be allowed are refused before their bodies
/// are read: an unsigned form upload (however its fields are dressed up
/// as signed), or a DeleteObjects document, from someone without
/// credentials. Each declares far more than it sends, so
/// a server that read the body first would still be waiting when the
/// client stops listening.
#[test]
fn anonymous_requests_are_refused_before_their_bodies_are_read() {
    let server = Server::start(&["--access-key", "k", "--secret-key", "a-secret-of-some-length"]);
    let quiet = std::time::Duration::from_secs(5);
    let declared = 100 << 20;
    let document = format!(
        "POST /files?delete HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/xml\r\n\
         Content-Length: {declared}\r\n\r\n<Delete><Object><Key>a</Key></Object>"
    );
    let form = |target: &str, file_headers: &str| {
        format!(
            "POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: multipart/form-data; boundary=XyZ\r\n\
             Content-Length: {declared}\r\n\r\n\
             --XyZ\r\nContent-Disposition: form-data; name=\"key\"\r\n\r\nposted\r\n\
             --XyZ\r\n{file_headers}\r\n\r\n{}",
            "x".repeat(4096)
        )
    };
    let file = "Content-Disposition: form-data; name=\"file\"; filename=\"f\"";
    // The protocol layer reads a part's last Content-Disposition.
    let hidden = format!("Content-Disposition: form-data; name=\"signature\"\r\n{file}");
    for (what, request) in [
        ("a DeleteObjects document", document),
        ("an unsigned form", form("/files", file)),
        ("an unsigned form with a query", form("/files?x", file)),
        ("a form whose file part is first named a signature", form("/files", &hidden)),
        (
            "a form whose key's value holds a signature field's delimiter",
            form("/files", file).replacen(
                "posted",
                "posted--XyZ\r\nContent-Disposition: form-data; name=\"signature\"\r\n\r\nz",
                1,
            ),
        ),
    ] {
        let answer = raw(&server.addr, request.as_bytes(), quiet);
        assert_eq!(status_of(&answer), 403, "{what}: {answer:?}");
        assert!(answer.contains("AccessDenied"), "{what}: {answer}");
    }
}
